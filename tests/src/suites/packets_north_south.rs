//! Helpers shared by the `packets/north_south` test files: node1 of a two-node cluster in
//! both families ([`NorthSouth`]: one family's addresses, the dual-stack Services), the
//! dual-stack namespace the tables run in, and [`on_node1`], which runs a table once per
//! family there.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::{
    datapath::LoadedDatapath,
    netns::Netns,
    services::service_on_nodes_of,
    suites::packets::{FAMILIES, Family},
    unique_tag,
};
use lb_common::{NodeConfig, user::addr_words};
use lb_userspace::{desired::NodeContext, model::IpFamily, source::file};

pub const TC_ACT_OK: u32 = 0;
pub const TC_ACT_SHOT: u32 = 2;
pub const TC_ACT_REDIRECT: u32 = 7;

pub const SNAT_MIN: u16 = 61000;
pub const SNAT_MAX: u16 = 61099;

/// One family's node1: the NodePort address (not on an interface: as a node's address the
/// agent was given), the underlay address on `dum0` (MTU 1280; the SNAT source toward
/// node2's pods) and the next hop behind it (node2, a permanent neighbour), the pods (one
/// local, routed on `dum0`; one of node2's, routed via the next hop), an external client,
/// a client outside the source ranges, the hairpin address and a LoadBalancer IP.
#[derive(Clone, Copy, Debug)]
pub struct NorthSouth {
    pub f: Family,
    pub node: IpAddr,
    pub underlay: IpAddr,
    pub next_hop: IpAddr,
    pub ext: SocketAddr,
    pub outsider: SocketAddr,
    pub local_pod: IpAddr,
    pub remote_pod: IpAddr,
    pub hairpin: IpAddr,
    pub lb_ip: IpAddr,
}

impl NorthSouth {
    /// The table's addresses in family `f` (IPv4: 192.0.2.1 the NodePort address,
    /// 10.0.0.1 the underlay, 10.244.2.2 the local pod, 10.245.1.2 node2's pod).
    pub fn of(f: &Family) -> Self {
        let (underlay, next_hop, remote_pod, hairpin, lb_ip): (IpAddr, IpAddr, IpAddr, _, _) =
            match f.family {
                IpFamily::V4 => (
                    Ipv4Addr::new(10, 0, 0, 1).into(),
                    Ipv4Addr::new(10, 0, 0, 2).into(),
                    Ipv4Addr::new(10, 245, 1, 2).into(),
                    Ipv4Addr::new(169, 254, 42, 1).into(),
                    Ipv4Addr::new(198, 51, 100, 5).into(),
                ),
                IpFamily::V6 => (
                    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1).into(),
                    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2).into(),
                    Ipv6Addr::new(0xfd00, 0x10, 0x245, 1, 0, 0, 0, 2).into(),
                    Ipv6Addr::new(0xfd00, 0xa9fe, 0x2a, 0, 0, 0, 0, 1).into(),
                    Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 5).into(),
                ),
            };
        Self {
            f: *f,
            node: f.outside(1),
            underlay,
            next_hop,
            ext: SocketAddr::new(f.outside(10), 5000),
            outsider: SocketAddr::new(f.stranger(9), 5000),
            local_pod: f.pod(2, 2),
            remote_pod,
            hairpin,
            lb_ip,
        }
    }

    /// The NodePort `port` on the node's address.
    pub fn np(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.node, port)
    }

    /// `what`, prefixed with the family's name: how a row names itself in a failure.
    pub fn row(&self, what: &str) -> String {
        self.f.row(what)
    }

    /// This family's Services (port 80 → 8080 on `ClusterIP n`, NodePort 3000n): `far`
    /// (TCP) and `farudp` (UDP) on node2's pod, `near` on the local pod, `only-remote-local`
    /// (Local policy, node2's pod), `ranged` (the LoadBalancer IP, admitting
    /// [`Family::outside_net`]) and `self` on the local pod. IPv6's names end in 6.
    pub fn services(&self) -> String {
        let s = match self.f.family {
            IpFamily::V4 => "",
            IpFamily::V6 => "6",
        };
        let remote = [(self.remote_pod, "node2")];
        let local = [(self.local_pod, "node1")];
        let svc = |name: &str, n: u8, proto: &str, spec: &str, status: &str, eps: &[_]| {
            service_on_nodes_of(
                &format!("{name}{s}"),
                "LoadBalancer",
                &self.f.cluster_ip(n).to_string(),
                proto,
                80,
                8080,
                Some(30000 + u16::from(n)),
                spec,
                status,
                eps,
            )
        };
        let local_policy = "  externalTrafficPolicy: Local\n";
        let ranges = format!(
            "  loadBalancerSourceRanges: [\"{}\"]\n",
            self.f.outside_net()
        );
        let status = format!(
            "status:\n  loadBalancer:\n    ingress: [{{ip: \"{}\"}}]\n",
            self.lb_ip
        );
        svc("far", 1, "TCP", "", "", &remote)
            + &svc("farudp", 2, "UDP", "", "", &remote)
            + &svc("near", 3, "TCP", "", "", &local)
            + &svc("only-remote-local", 4, "TCP", local_policy, "", &remote)
            + &svc("ranged", 5, "TCP", &ranges, &status, &local)
            + &svc("self", 6, "TCP", "", "", &local)
    }

    /// node2's pods' prefix, routed via [`NorthSouth::next_hop`].
    pub fn pods(&self) -> &'static str {
        match self.f.family {
            IpFamily::V4 => "10.245.0.0/16",
            IpFamily::V6 => "fd00:10:245::/48",
        }
    }

    /// Host `k` of the underlay (`10.0.0.k`, `fd00::k`; 2 is the next hop).
    pub fn underlay_host(&self, k: u8) -> IpAddr {
        match self.f.family {
            IpFamily::V4 => Ipv4Addr::new(10, 0, 0, k).into(),
            IpFamily::V6 => Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(k)).into(),
        }
    }

    /// `ip` commands giving the namespace this family's addresses, routes and next hop
    /// (after `dum0` is up).
    fn ip_commands(&self) -> Vec<Vec<String>> {
        let (v, len, local, dad) = match self.f.family {
            IpFamily::V4 => ("-4", 24, 32, ""),
            IpFamily::V6 => ("-6", 64, 128, " nodad"),
        };
        let pods = self.pods();
        let cmd = |args: &str| -> Vec<String> {
            std::iter::once(v.to_string())
                .chain(args.split(' ').map(str::to_string))
                .collect()
        };
        let hop = self.next_hop;
        vec![
            cmd(&format!("addr add {}/{len} dev dum0{dad}", self.underlay)),
            cmd(&format!("route add {pods} via {hop}")),
            cmd(&format!("route add {}/{local} dev dum0", self.local_pod)),
            cmd(&format!("route add {} via {hop}", self.f.outside_net())),
            cmd(&format!(
                "neigh add {hop} lladdr 02:00:00:00:00:02 dev dum0 nud permanent"
            )),
        ]
    }
}

/// Both families' tables.
pub fn both() -> [NorthSouth; 2] {
    FAMILIES.map(|f| NorthSouth::of(&f))
}

/// A dual-stack node1 (see [`NorthSouth`]): `dum0` (MAC 02:00:00:00:00:01, MTU 1280, its
/// peer in the same namespace) with both families' underlay addresses, routes and next
/// hops, forwarding on in both.
fn node1_ns(tag: &str) -> Netns {
    let ns = Netns::new(&format!("{tag}-node")).expect("netns");
    ns.sysctl(&["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"])
        .expect("sysctl");
    let link = "link add dum0 mtu 1280 type veth peer name dum1 mtu 1280";
    let mut cmds: Vec<Vec<String>> = [
        link,
        "link set dum0 address 02:00:00:00:00:01",
        "link set dum1 up",
        "link set dum0 up",
        "link set lo up",
    ]
    .iter()
    .map(|c| c.split(' ').map(str::to_string).collect())
    .collect();
    for n in both() {
        cmds.extend(n.ip_commands());
    }
    for args in &cmds {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ns.ip(&args).unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
    }
    ns
}

/// node1's node configuration, as its agent writes it: SNAT ports `SNAT_MIN..=SNAT_MAX`,
/// both hairpin addresses, and the routing flags of the namespace's rules as they are now
/// (`datapath::routing`: with no rule by source, XDP keeps the way out per backend).
pub fn node1_config() -> NodeConfig {
    let [v4, v6] = both();
    NodeConfig {
        snat_port_min: SNAT_MIN,
        snat_port_max: SNAT_MAX,
        hairpin_addr_be: addr_words(v4.hairpin).0[0],
        hairpin6_addr_be: addr_words(v6.hairpin).0,
        flags: lb_userspace::datapath::routing::by_destination(),
        ..NodeConfig::default()
    }
}

/// Runs `table` once per family in a dual-stack node1 (see [`node1_ns`]), each on a
/// datapath of its own loaded there and programmed as node1's agent would
/// ([`node1_config`]), both families' Services, NodePorts on
/// both NodePort addresses, with the socket hooks' entries (loopback NodePorts, internal
/// scopes), which tc and XDP must never use. `table` gets the index of `dum0`.
pub fn on_node1(prefix: &str, table: fn(&NorthSouth, &mut LoadedDatapath, u32)) {
    let tag = unique_tag(prefix);
    let ns = node1_ns(&tag);
    ns.run(move || {
        let ifindex = lb_userspace::datapath::netif::ifindex("dum0").expect("dum0");
        let [v4, v6] = both();
        let yaml = v4.services() + &v6.services();
        let loaded = file::parse("ns.yaml", &yaml).expect("yaml");
        assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
        let ctx = NodeContext::new("node1", &[v4.node, v6.node], true);
        for n in [v4, v6] {
            let tag = format!("{tag}{}", n.f.name().to_ascii_lowercase());
            let mut dp =
                LoadedDatapath::load(&tag).unwrap_or_else(|e| panic!("{}: load: {e}", n.f.name()));
            dp.configure(&node1_config()).expect("config");
            dp.program_on(&loaded.model, &ctx).expect("program");
            table(&n, &mut dp, ifindex);
        }
    })
    .expect("table thread");
}
