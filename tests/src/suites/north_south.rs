//! Helpers shared by the `north_south` test files.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::Duration,
};

use crate::{
    client::Answer,
    services::service_on_nodes,
    topology::{pod_ip, remote_pod_ip},
};

pub const TIMEOUT: Duration = Duration::from_secs(2);
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);

/// A backend endpoint: its address and node.
pub type Ep = (Ipv4Addr, &'static str);

pub fn local() -> Ep {
    (pod_ip(2), "node1")
}

pub fn remote() -> Ep {
    (remote_pod_ip(1), "node2")
}

/// A Service of `kind` with one port and its EndpointSlice, as YAML (`node_port` 0: none).
#[allow(clippy::too_many_arguments)]
pub fn service(
    name: &str,
    kind: &str,
    cluster_ip: &str,
    proto: &str,
    port: u16,
    target: u16,
    node_port: u16,
    spec: &str,
    status: &str,
    eps: &[Ep],
) -> String {
    service_on_nodes(
        name,
        kind,
        cluster_ip,
        proto,
        port,
        target,
        (node_port != 0).then_some(node_port),
        spec,
        status,
        eps,
    )
}

pub fn seen_ip(a: &Answer) -> IpAddr {
    a.seen_client
        .parse::<SocketAddr>()
        .map(|s| s.ip())
        .unwrap_or_else(|e| panic!("bad seen address {:?}: {e}", a.seen_client))
}
