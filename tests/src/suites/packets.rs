//! Helpers shared by the `packets` test files: each family's addresses and services, and
//! the fixture through which a table's rows are written once and run in both families
//! ([`Family`], [`FAMILIES`], [`in_both_families`]); the family's frames are built and
//! read in `crate::frames`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::{
    datapath::LoadedDatapath,
    require_root,
    services::{service_yaml, service6_yaml},
    unique_tag,
};
use lb_userspace::{
    model::IpFamily,
    packet::{TCP_ACK, TCP_SYN},
    source::file,
    trace::frame::Seen,
};

/// The frames the tables build and read, with the family's own (`crate::frames`).
pub use crate::frames::{IcmpError, SeenIcmp, frame, icmp, seen, seen_icmp};
/// The Service YAML of either family.
pub use crate::services::service_of;

pub const TC_ACT_OK: u32 = 0;
pub const TC_ACT_SHOT: u32 = 2;
pub const TC_ACT_REDIRECT: u32 = 7;

pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
pub const EMPTY_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 99);
pub const CLIENT: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 244, 1, 2), 40000);
pub const BACKENDS: [Ipv4Addr; 3] = [
    Ipv4Addr::new(10, 244, 2, 2),
    Ipv4Addr::new(10, 244, 3, 2),
    Ipv4Addr::new(10, 244, 4, 2),
];

pub const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x10);
pub const EMPTY6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x99);
pub const CLIENT6: SocketAddrV6 = SocketAddrV6::new(
    Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 2),
    40000,
    0,
    0,
);
pub const BACKENDS6: [Ipv6Addr; 3] = [
    Ipv6Addr::new(0xfd00, 0x10, 0x244, 2, 0, 0, 0, 2),
    Ipv6Addr::new(0xfd00, 0x10, 0x244, 3, 0, 0, 0, 2),
    Ipv6Addr::new(0xfd00, 0x10, 0x244, 4, 0, 0, 0, 2),
];

pub fn setup() -> Option<LoadedDatapath> {
    if !require_root() {
        return None;
    }
    let mut dp = LoadedDatapath::load(&unique_tag("xlbp"))
        .unwrap_or_else(|e| panic!("load the eBPF object: {e}"));
    let loaded = file::parse("packets.yaml", &base_services()).expect("yaml");
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    dp.program(&loaded.model).expect("program maps");
    Some(dp)
}

/// The table's services: web (VIP:80/TCP) and dns (VIP:53/UDP) on three backends, empty
/// (EMPTY_VIP:80/TCP) on none.
pub fn base_services() -> String {
    service_yaml("web", VIP, 80, "TCP", 8080, &BACKENDS)
        + &service_yaml("dns", VIP, 53, "UDP", 5353, &BACKENDS)
        + &service_yaml("empty", EMPTY_VIP, 80, "TCP", 8080, &[])
}

/// The IPv6 table's services: web6 (VIP6:80/TCP) and dns6 (VIP6:53/UDP) on three backends,
/// empty6 (EMPTY6:80/TCP) and emptyu6 (EMPTY6:53/UDP) on none.
pub fn services6() -> String {
    service6_yaml("web6", VIP6, 80, "TCP", 8080, &BACKENDS6)
        + &service6_yaml("dns6", VIP6, 53, "UDP", 5353, &BACKENDS6)
        + &service6_yaml("empty6", EMPTY6, 80, "TCP", 8080, &[])
        + &service6_yaml("emptyu6", EMPTY6, 53, "UDP", 5353, &[])
}

/// One family's fixture for the tables both families share: the frontends with and without
/// endpoints, the client, the backends, and how that family answers a datagram to a port
/// without endpoints.
#[derive(Clone, Copy, Debug)]
pub struct Family {
    pub family: IpFamily,
    pub vip: IpAddr,
    pub empty: IpAddr,
    pub client: IpAddr,
    pub backends: [IpAddr; 3],
    /// ICMP type and code of "port unreachable".
    pub port_unreachable: (u8, u8),
}

const fn v4(a: Ipv4Addr) -> IpAddr {
    IpAddr::V4(a)
}

const fn v6(a: Ipv6Addr) -> IpAddr {
    IpAddr::V6(a)
}

/// IPv4 and IPv6, each with its table's addresses.
pub const FAMILIES: [Family; 2] = [
    Family {
        family: IpFamily::V4,
        vip: v4(VIP),
        empty: v4(EMPTY_VIP),
        client: v4(*CLIENT.ip()),
        backends: [v4(BACKENDS[0]), v4(BACKENDS[1]), v4(BACKENDS[2])],
        port_unreachable: (3, 3),
    },
    Family {
        family: IpFamily::V6,
        vip: v6(VIP6),
        empty: v6(EMPTY6),
        client: v6(*CLIENT6.ip()),
        backends: [v6(BACKENDS6[0]), v6(BACKENDS6[1]), v6(BACKENDS6[2])],
        port_unreachable: (1, 4),
    },
];

impl Family {
    /// The datapath with this family's services (`None`, skipped, without root): web and
    /// dns on the three backends, TCP 80 and UDP 53 on `empty` without endpoints.
    pub fn setup(&self) -> Option<LoadedDatapath> {
        if !require_root() {
            return None;
        }
        let tag = unique_tag(&format!("xlbf{}", self.name().to_ascii_lowercase()));
        Some(self.setup_tagged(&tag))
    }

    /// [`Family::setup`] under pins named `tag` (the caller has checked for root).
    pub fn setup_tagged(&self, tag: &str) -> LoadedDatapath {
        self.load_with(tag, &self.services(&self.backends))
    }

    /// The datapath under pins named `tag`, programmed with the Services of `yaml`.
    pub fn load_with(&self, tag: &str, yaml: &str) -> LoadedDatapath {
        let mut dp = LoadedDatapath::load(tag).unwrap_or_else(|e| {
            panic!("{}: load the eBPF object: {e}", self.name());
        });
        self.program(&mut dp, yaml);
        dp
    }

    /// Programs `dp` with the Services of `yaml` (which must parse without errors).
    pub fn program(&self, dp: &mut LoadedDatapath, yaml: &str) {
        let loaded = file::parse("families.yaml", yaml).expect("yaml");
        assert!(
            loaded.errors.is_empty(),
            "{}: {:?}",
            self.name(),
            loaded.errors
        );
        dp.program(&loaded.model)
            .unwrap_or_else(|e| panic!("{}: program maps: {e}", self.name()));
    }

    /// This family's table Services with `web` as web's backends: web (`vip`:80/TCP) on
    /// `web`, dns (`vip`:53/UDP) on the three backends, TCP 80 and UDP 53 on `empty`
    /// without endpoints (IPv6's names end in 6).
    pub fn services(&self, web: &[IpAddr]) -> String {
        let s = match self.family {
            IpFamily::V4 => "",
            IpFamily::V6 => "6",
        };
        service_of(&format!("web{s}"), self.vip, 80, "TCP", 8080, web)
            + &service_of(
                &format!("dns{s}"),
                self.vip,
                53,
                "UDP",
                5353,
                &self.backends,
            )
            + &service_of(&format!("empty{s}"), self.empty, 80, "TCP", 8080, &[])
            + &service_of(&format!("emptyu{s}"), self.empty, 53, "UDP", 5353, &[])
    }

    /// The node's address in [`Family::routed_ns`] (on `dum0`) and the next hop behind it.
    pub fn routed_node(&self) -> (IpAddr, IpAddr) {
        match self.family {
            IpFamily::V4 => (
                v4(Ipv4Addr::new(10, 245, 0, 1)),
                v4(Ipv4Addr::new(10, 245, 0, 2)),
            ),
            IpFamily::V6 => (
                v6(Ipv6Addr::new(0xfd00, 0x10, 0x245, 0, 0, 0, 0, 1)),
                v6(Ipv6Addr::new(0xfd00, 0x10, 0x245, 0, 0, 0, 0, 2)),
            ),
        }
    }

    /// A namespace that routes this family's pods (`10.244.0.0/16`, `fd00:10:244::/48`) and
    /// `more` prefixes via the next hop of [`Family::routed_node`], on `dum0` (a veth, the
    /// node's address on it, forwarding on); with `neighbour`, dum0 has the MAC
    /// `02:00:00:00:00:01` and the next hop is a permanent neighbour at `02:00:00:00:00:02`
    /// (XDP's route lookups then resolve); with `mtu`, the veth has that MTU.
    pub fn routed_ns(
        &self,
        tag: &str,
        more: &[&str],
        neighbour: bool,
        mtu: Option<&str>,
    ) -> crate::netns::Netns {
        let ns = crate::netns::Netns::new(&format!("{tag}-n")).expect("netns");
        let (v, forwarding, pods, node) = match self.family {
            IpFamily::V4 => ("-4", "net.ipv4.ip_forward=1", "10.244.0.0/16", "24"),
            IpFamily::V6 => (
                "-6",
                "net.ipv6.conf.all.forwarding=1",
                "fd00:10:244::/48",
                "64",
            ),
        };
        ns.sysctl(&[forwarding]).expect("sysctl");
        let (addr, hop) = self.routed_node();
        let (addr, hop) = (format!("{addr}/{node}"), hop.to_string());
        let mut cmds: Vec<Vec<&str>> = vec![vec![
            "link", "add", "dum0", "type", "veth", "peer", "name", "dum1",
        ]];
        if let Some(mtu) = mtu {
            cmds.push(vec!["link", "set", "dum0", "mtu", mtu]);
        }
        if neighbour {
            cmds.push(vec!["link", "set", "dum0", "address", "02:00:00:00:00:01"]);
        }
        cmds.push(vec!["link", "set", "dum1", "up"]);
        cmds.push(vec!["link", "set", "dum0", "up"]);
        cmds.push(vec!["link", "set", "lo", "up"]);
        let mut add = vec![v, "addr", "add", &addr, "dev", "dum0"];
        if self.family == IpFamily::V6 {
            add.push("nodad");
        }
        cmds.push(add);
        for p in std::iter::once(&pods).chain(more) {
            cmds.push(vec![v, "route", "add", p, "via", &hop, "dev", "dum0"]);
        }
        if neighbour {
            let mac = "02:00:00:00:00:02";
            let n = [v, "neigh", "add", &hop, "lladdr", mac, "dev", "dum0"];
            cmds.push(n.into_iter().chain(["nud", "permanent"]).collect());
        }
        for args in &cmds {
            ns.ip(args).unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
        }
        ns
    }

    /// `IPv4` or `IPv6`, for messages.
    pub fn name(&self) -> &'static str {
        self.family.name()
    }

    /// The client's address on `port`.
    pub fn client(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.client, port)
    }

    /// Where the L4 header starts in a frame built by [`frame`] (Ethernet, then the IP
    /// header without options or extension headers).
    pub fn l4_at(&self) -> usize {
        14 + match self.family {
            IpFamily::V4 => 20,
            IpFamily::V6 => 40,
        }
    }
}

/// Runs `case` over each family, on a datapath of its own with that family's services
/// ([`Family::setup`]; nothing, after the notice, without root).
pub fn in_both_families(case: fn(&Family, &mut LoadedDatapath)) {
    for f in FAMILIES {
        let Some(mut dp) = f.setup() else {
            return;
        };
        case(&f, &mut dp);
    }
}

impl Family {
    /// An address of this family that no table uses: no frontend, backend or client
    /// (documentation ranges: 203.0.113.0/24, 2001:db8::/32).
    pub fn stranger(&self, n: u8) -> IpAddr {
        match self.family {
            IpFamily::V4 => v4(Ipv4Addr::new(203, 0, 113, n)),
            IpFamily::V6 => v6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, u16::from(n))),
        }
    }

    /// This family's loopback address.
    pub fn loopback(&self) -> IpAddr {
        match self.family {
            IpFamily::V4 => v4(Ipv4Addr::LOCALHOST),
            IpFamily::V6 => v6(Ipv6Addr::LOCALHOST),
        }
    }

    /// Runs `pkt` (`what` names the row): passed on (TC_ACT_OK), every checksum valid;
    /// what it says.
    pub fn through(&self, dp: &mut LoadedDatapath, pkt: &[u8], what: &str) -> Seen {
        let r = dp.run(pkt).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            r.verdict,
            TC_ACT_OK,
            "{what}: {:?}",
            crate::datapath::reason_counts(&dp.pins)
        );
        seen(&r.packet, what)
    }

    /// A TCP flow from `client` to `frontend` whose source is translated (hairpin, SNAT to
    /// the node): its SYN DNATed to `backend` with a new source, the reply to that source
    /// back from the frontend to the client, the next packet with the same source, and
    /// `xlb list conntrack` naming it. The new source.
    pub fn snated_flow(
        &self,
        dp: &mut LoadedDatapath,
        client: SocketAddr,
        frontend: SocketAddr,
        backend: SocketAddr,
    ) -> SocketAddr {
        let what = self.row("SNATed SYN");
        let syn = frame(false, client, frontend, TCP_SYN, b"");
        let out = self.through(dp, &syn, &what);
        assert_eq!(out.dst, backend, "{what}: DNAT");
        assert_ne!(out.src, client, "{what}: the source translated");
        let what = self.row("its reply");
        let reply = frame(false, out.dst, out.src, TCP_SYN | TCP_ACK, b"");
        let back = self.through(dp, &reply, &what);
        assert_eq!(
            (back.src, back.dst),
            (frontend, client),
            "{what}: back from the frontend"
        );
        let what = self.row("established");
        let ack = frame(false, client, frontend, TCP_ACK, b"x");
        assert_eq!(self.through(dp, &ack, &what).src, out.src, "{what}");
        let flows = lb_userspace::list::conntrack(&crate::pins(&dp.pins)).expect("ct");
        let snat = out.src.to_string();
        assert!(
            flows.iter().any(|r| r.snat == snat),
            "{what}: listed SNATed to {snat}: {flows:?}"
        );
        out.src
    }

    /// `a` as the map types hold an address: network-order words, IPv4 in the first.
    pub fn words(a: IpAddr) -> [u32; 4] {
        match a {
            IpAddr::V4(a) => [u32::from_ne_bytes(a.octets()), 0, 0, 0],
            IpAddr::V6(a) => bytemuck::cast(a.octets()),
        }
    }

    /// The `i`-th of more clients of this family (10.244.9.i, fd00:10:244:9::i).
    pub fn other_client(&self, i: u8) -> IpAddr {
        self.pod(9, i)
    }

    /// Pod `host` of the pod network's `subnet` (10.244.subnet.host,
    /// fd00:10:244:subnet::host): the table's backends are hosts 2 of subnets 2 to 4.
    pub fn pod(&self, subnet: u8, host: u8) -> IpAddr {
        match self.family {
            IpFamily::V4 => v4(Ipv4Addr::new(10, 244, subnet, host)),
            IpFamily::V6 => v6(Ipv6Addr::new(
                0xfd00,
                0x10,
                0x244,
                u16::from(subnet),
                0,
                0,
                0,
                u16::from(host),
            )),
        }
    }

    /// ClusterIP `n` of the service network (10.96.0.n, fd00:10:96::n).
    pub fn cluster_ip(&self, n: u8) -> IpAddr {
        match self.family {
            IpFamily::V4 => v4(Ipv4Addr::new(10, 96, 0, n)),
            IpFamily::V6 => v6(Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, u16::from(n))),
        }
    }

    /// Host `n` outside the cluster, beside the node's NodePort address (documentation
    /// ranges: 192.0.2.n, 2001:db8:2::n), in [`Family::outside_net`].
    pub fn outside(&self, n: u8) -> IpAddr {
        match self.family {
            IpFamily::V4 => v4(Ipv4Addr::new(192, 0, 2, n)),
            IpFamily::V6 => v6(Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, u16::from(n))),
        }
    }

    /// The prefix of [`Family::outside`]'s hosts.
    pub fn outside_net(&self) -> &'static str {
        match self.family {
            IpFamily::V4 => "192.0.2.0/24",
            IpFamily::V6 => "2001:db8:2::/64",
        }
    }

    /// How `xlb list services` names the frontend `ip`:`port`/TCP.
    pub fn tcp_frontend(ip: IpAddr, port: u16) -> String {
        format!("{}/TCP", SocketAddr::new(ip, port))
    }

    /// `what`, prefixed with this family's name: how a row names itself in a failure.
    pub fn row(&self, what: &str) -> String {
        format!("{}: {what}", self.name())
    }
}
