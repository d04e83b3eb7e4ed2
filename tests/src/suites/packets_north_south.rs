//! Helpers shared by the `packets/north_south` test files.

use std::net::{Ipv4Addr, SocketAddrV4};

use crate::{datapath::LoadedDatapath, netns::Netns, services::service_on_nodes, unique_tag};
use lb_common::NodeConfig;
use lb_userspace::{desired::NodeContext, source::file};

pub const TC_ACT_OK: u32 = 0;
pub const TC_ACT_SHOT: u32 = 2;

pub const NODE: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
pub const UNDERLAY: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
pub const EXT: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 10), 5000);
pub const OUTSIDER: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(203, 0, 113, 9), 5000);
pub const LOCAL_POD: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 2);
pub const REMOTE_POD: Ipv4Addr = Ipv4Addr::new(10, 245, 1, 2);
pub const HAIRPIN: Ipv4Addr = Ipv4Addr::new(169, 254, 42, 1);
pub const SNAT_MIN: u16 = 61000;
pub const SNAT_MAX: u16 = 61099;

/// A LoadBalancer Service (port 80 → 8080, nodePort `np`, `spec` lines, `status` block) and
/// its slice, as YAML.
pub fn svc(
    name: &str,
    vip: &str,
    proto: &str,
    np: u16,
    spec: &str,
    status: &str,
    eps: &[(Ipv4Addr, &str)],
) -> String {
    service_on_nodes(
        name,
        "LoadBalancer",
        vip,
        proto,
        80,
        8080,
        Some(np),
        spec,
        status,
        eps,
    )
}

pub fn services() -> String {
    let remote = [(REMOTE_POD, "node2")];
    let local = [(LOCAL_POD, "node1")];
    svc("far", "10.96.0.1", "TCP", 30001, "", "", &remote)
        + &svc("farudp", "10.96.0.2", "UDP", 30002, "", "", &remote)
        + &svc("near", "10.96.0.3", "TCP", 30003, "", "", &local)
        + &svc(
            "only-remote-local",
            "10.96.0.4",
            "TCP",
            30004,
            "  externalTrafficPolicy: Local\n",
            "",
            &remote,
        )
        + &svc(
            "ranged",
            "10.96.0.5",
            "TCP",
            30005,
            "  loadBalancerSourceRanges: [192.0.2.0/24]\n",
            "status:\n  loadBalancer:\n    ingress: [{ip: 198.51.100.5}]\n",
            &local,
        )
        + &svc("self", "10.96.0.6", "TCP", 30006, "", "", &local)
}

/// Loads the datapath in a namespace of its own (see the module comment), programs it as
/// node1's agent would (SNAT ports `SNAT_MIN..=SNAT_MAX`, the hairpin address) and runs
/// `table` on it there, with the index of `dum0`.
pub fn on_node1(prefix: &str, table: fn(&mut LoadedDatapath, u32)) {
    let tag = unique_tag(prefix);
    let ns = Netns::new(&format!("{tag}-node")).expect("netns");
    ns.sysctl(&["net.ipv4.ip_forward=1"]).expect("sysctl");
    for args in [
        &[
            "link", "add", "dum0", "mtu", "1280", "type", "veth", "peer", "name", "dum1", "mtu",
            "1280",
        ][..],
        &["link", "set", "dum0", "address", "02:00:00:00:00:01"],
        &["link", "set", "dum1", "up"],
        &["addr", "add", "10.0.0.1/24", "dev", "dum0"],
        &["link", "set", "dum0", "up"],
        &["link", "set", "lo", "up"],
        &["route", "add", "10.245.0.0/16", "via", "10.0.0.2"],
        &["route", "add", "10.244.2.2/32", "dev", "dum0"],
        &["route", "add", "192.0.2.0/24", "via", "10.0.0.2"],
        &[
            "neigh",
            "add",
            "10.0.0.2",
            "lladdr",
            "02:00:00:00:00:02",
            "dev",
            "dum0",
            "nud",
            "permanent",
        ],
    ] {
        ns.ip(args).unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
    }
    ns.run(move || {
        let ifindex = lb_userspace::datapath::netif::ifindex("dum0").expect("dum0");
        let mut dp = LoadedDatapath::load(&tag).expect("load");
        dp.configure(&NodeConfig {
            snat_port_min: SNAT_MIN,
            snat_port_max: SNAT_MAX,
            hairpin_addr_be: u32::from_ne_bytes(HAIRPIN.octets()),
            ..NodeConfig::default()
        })
        .expect("config");
        let loaded = file::parse("ns.yaml", &services()).expect("yaml");
        assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
        dp.program_on(
            &loaded.model,
            // With the socket hooks' entries (loopback NodePorts, internal scopes), which
            // tc and XDP must never use.
            &NodeContext::new("node1", &[NODE.into()], true),
        )
        .expect("program");
        table(&mut dp, ifindex);
    })
    .expect("table thread");
}
