//! The demo and test topology: a node namespace with one veth per pod namespace.
//!
//! ```text
//!  client  10.244.1.2 ─eth0══xv-client─┐
//!  backend-1 10.244.2.2 ─eth0══xv-backend-1─┤ node (forwarding, xlb attached to xv-*)
//!  backend-N 10.244.(N+1).2 ─eth0══xv-backend-N─┘
//! ```
//! Pod k has 10.244.k.2/24 with a default route via the node side, 10.244.k.1. The node has
//! no default route: a ClusterIP xlb does not rewrite has nowhere to go.

use std::net::Ipv4Addr;

use crate::netns::Netns;

/// A pod: its namespace and address.
#[derive(Debug)]
pub struct Pod {
    pub name: String,
    pub ns: Netns,
    pub ip: Ipv4Addr,
    /// The node-side interface of its veth.
    pub host_if: String,
}

/// Node, client and backends, removed on drop.
#[derive(Debug)]
pub struct Topology {
    pub tag: String,
    pub client: Pod,
    pub backends: Vec<Pod>,
    /// Declared last so the pods go first on drop.
    pub node: Netns,
}

/// The address of pod `index` (client = 1, backend k = k + 1).
pub fn pod_ip(index: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, index, 2)
}

impl Topology {
    /// Builds node, client and `backends` backend pods, all named after `tag`.
    pub fn build(tag: &str, backends: usize) -> Result<Self, String> {
        let node = Netns::new(&format!("{tag}-node"))?;
        node.sysctl(&[
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
        ])?;
        let client = add_pod(&node, tag, "client", 1)?;
        let mut pods = Vec::new();
        for k in 1..=backends {
            pods.push(add_pod(&node, tag, &format!("backend-{k}"), (k + 1) as u8)?);
        }
        Ok(Topology {
            tag: tag.to_string(),
            client,
            backends: pods,
            node,
        })
    }

    /// Adds one more backend pod (`backend-N`, the next address) to a running topology.
    pub fn add_backend(&mut self) -> Result<&Pod, String> {
        let k = self.backends.len() + 1;
        let pod = add_pod(
            &self.node,
            &self.tag,
            &format!("backend-{k}"),
            (k + 1) as u8,
        )?;
        self.backends.push(pod);
        Ok(&self.backends[k - 1])
    }
}

fn add_pod(node: &Netns, tag: &str, name: &str, index: u8) -> Result<Pod, String> {
    let ns = Netns::new(&format!("{tag}-{name}"))?;
    let host_if = format!("xv-{name}");
    node.ip(&[
        "link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
    ])?;
    let gw = format!("10.244.{index}.1");
    node.ip(&["addr", "add", &format!("{gw}/24"), "dev", &host_if])?;
    node.ip(&["link", "set", &host_if, "up"])?;
    node.sysctl(&[&format!("net.ipv4.conf.{host_if}.rp_filter=0")])?;
    let ip = pod_ip(index);
    ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
    ns.ip(&["link", "set", "eth0", "up"])?;
    ns.ip(&["route", "add", "default", "via", &gw])?;
    Ok(Pod {
        name: name.to_string(),
        ns,
        ip,
        host_if,
    })
}
