//! Helpers shared by the `packets` test files: each family's addresses and services, and
//! the fixture through which a table's rows are written once and run in both families
//! ([`Family`], [`FAMILIES`], [`in_both_families`]): the family's packets (TCP, UDP,
//! ICMP errors, optional headers, fragments) built and read back with every checksum
//! checked by etherparse.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::{
    checksums::{self, Udp},
    datapath::LoadedDatapath,
    frame6::{Frame6, NEXTHDR_FRAGMENT, NEXTHDR_ROUTING, seen_icmp6, seen6},
    require_root,
    services::{service_yaml, service6_yaml},
    unique_tag,
};
use lb_userspace::{
    model::IpFamily,
    packet::{PacketBuilder, TCP_ACK, TCP_SYN, parse_icmp},
    source::file,
    trace::frame::Seen,
};

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
    let mut dp = LoadedDatapath::load(&unique_tag("xlbp")).expect("load the eBPF object");
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

/// A ClusterIP Service `name` (`vip`:`port` → `target`) and its slice with `backends`
/// ready, of the family of `vip`.
pub fn service_of(
    name: &str,
    vip: IpAddr,
    port: u16,
    proto: &str,
    target: u16,
    backends: &[IpAddr],
) -> String {
    match vip {
        IpAddr::V4(v) => {
            let b: Vec<Ipv4Addr> = backends
                .iter()
                .map(|b| match b {
                    IpAddr::V4(a) => *a,
                    IpAddr::V6(_) => panic!("{name}: backend {b} is not of the family of {vip}"),
                })
                .collect();
            service_yaml(name, v, port, proto, target, &b)
        }
        IpAddr::V6(v) => {
            let b: Vec<Ipv6Addr> = backends
                .iter()
                .map(|b| match b {
                    IpAddr::V6(a) => *a,
                    IpAddr::V4(_) => panic!("{name}: backend {b} is not of the family of {vip}"),
                })
                .collect();
            service6_yaml(name, v, port, proto, target, &b)
        }
    }
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
        let yaml = match self.family {
            IpFamily::V4 => {
                base_services() + &service_yaml("emptyu", EMPTY_VIP, 53, "UDP", 5353, &[])
            }
            IpFamily::V6 => services6(),
        };
        let mut dp = LoadedDatapath::load(tag).expect("load the eBPF object");
        let loaded = file::parse("families.yaml", &yaml).expect("yaml");
        assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
        dp.program(&loaded.model).expect("program maps");
        dp
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

/// A TCP segment with `flags` (or, `udp`, a UDP datagram) from `src` to `dst` of one family,
/// in Ethernet, its checksums computed: IPv4 by [`PacketBuilder`], IPv6 by [`Frame6`].
pub fn frame(udp: bool, src: SocketAddr, dst: SocketAddr, flags: u8, payload: &[u8]) -> Vec<u8> {
    match (src, dst) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) if udp => {
            PacketBuilder::udp(s, d).payload(payload).build()
        }
        (SocketAddr::V4(s), SocketAddr::V4(d)) => PacketBuilder::tcp(s, d)
            .flags(flags)
            .payload(payload)
            .build(),
        (SocketAddr::V6(s), SocketAddr::V6(d)) if udp => Frame6::udp(s, d, payload).build(),
        (SocketAddr::V6(s), SocketAddr::V6(d)) => Frame6::tcp(s, d, flags, payload).build(),
        _ => panic!("{src} and {dst} are of two families"),
    }
}

/// The ICMP errors the tables send and expect, by what they mean; [`Family::icmp_kind`]
/// gives each family's type, code and the four bytes after the checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IcmpError {
    /// Destination unreachable, port unreachable (ICMPv6: code 4 of type 1).
    PortUnreachable,
    /// IPv4 fragmentation needed (type 3 code 4, the MTU in the last two bytes); ICMPv6
    /// Packet Too Big (type 2, the MTU in all four).
    TooBig(u16),
    /// Time exceeded in transit.
    TimeExceeded,
}

/// An ICMP or ICMPv6 message from `src` to `dst` in Ethernet: type, code, the four bytes
/// after the checksum, the body; its checksum computed (ICMPv6: over the pseudo-header).
pub fn icmp(src: IpAddr, dst: IpAddr, kind: (u8, u8), rest: [u8; 4], body: &[u8]) -> Vec<u8> {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let ip = etherparse::Ipv4Header {
                time_to_live: 64,
                protocol: etherparse::IpNumber::ICMP,
                source: s.octets(),
                destination: d.octets(),
                ..Default::default()
            };
            let mut out = Vec::new();
            etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1])
                .ip(etherparse::IpHeaders::Ipv4(ip, Default::default()))
                .icmpv4_raw(kind.0, kind.1, rest)
                .write(&mut out, body)
                .expect("an ICMP message under 64 KiB");
            out
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => Frame6::icmp(s, d, kind.0, kind.1, rest, body).build(),
        _ => panic!("{src} and {dst} are of two families"),
    }
}

/// The addresses of a TCP or UDP frame of either family, every checksum checked by
/// etherparse; panics naming `what` when one is wrong or the frame does not read.
pub fn seen(frame: &[u8], what: &str) -> Seen {
    if frame.get(12..14) == Some(&[0x08, 0x00]) {
        checksums::assert_valid(frame, Udp::Computed, what);
    } else {
        seen6(frame, what);
    }
    lb_userspace::trace::frame::seen(frame).unwrap_or_else(|| panic!("{what}: no TCP or UDP"))
}

/// An ICMP or ICMPv6 message as etherparse reads it, its checksums checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenIcmp {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// Type and code.
    pub kind: (u8, u8),
    /// The four bytes after the checksum (the MTU of a too-big answer).
    pub rest: [u8; 4],
    /// What follows them: an error's quote.
    pub quote: Vec<u8>,
}

/// An ICMP or ICMPv6 error frame of either family, its checksums (the quoted IPv4
/// header's too) checked.
pub fn seen_icmp(frame: &[u8], what: &str) -> SeenIcmp {
    if frame.get(12..14) == Some(&[0x08, 0x00]) {
        checksums::assert_valid(frame, Udp::Computed, what);
        let p = parse_icmp(frame).unwrap_or_else(|| panic!("{what}: no ICMP error"));
        assert!(p.checksums_ok, "{what}: checksums");
        let ihl = usize::from(frame[14] & 0x0f) * 4;
        let at = 14 + ihl;
        SeenIcmp {
            src: p.src.into(),
            dst: p.dst.into(),
            kind: (p.typ, p.code),
            rest: [frame[at + 4], frame[at + 5], frame[at + 6], frame[at + 7]],
            quote: frame[at + 8..].to_vec(),
        }
    } else {
        let m = seen_icmp6(frame, what);
        SeenIcmp {
            src: m.src.into(),
            dst: m.dst.into(),
            kind: (m.kind, m.code),
            rest: m.rest,
            quote: m.body,
        }
    }
}

impl Family {
    /// `frame` with optional headers after its fixed IP header, one per entry of `exts`
    /// (each an IPv6 extension header type, `NEXTHDR_*`): IPv6 gets those extension
    /// headers, 8 bytes each (options with one PadN, a routing header with no segments
    /// left); IPv4 gets 4 option bytes per entry (NOPs, the last an EOL), its header
    /// length, total length and header checksum made to match. Neither changes the L4
    /// checksum; the datapath reads such a header through its slow path (IPv4) or its
    /// extension header walk (IPv6).
    pub fn with_options(&self, frame: &[u8], exts: &[u8]) -> Vec<u8> {
        if exts.is_empty() {
            return frame.to_vec();
        }
        let (head, l4) = frame.split_at(self.l4_at());
        let mut out = head.to_vec();
        match self.family {
            IpFamily::V4 => {
                let n = exts.len() * 4;
                let mut opts = vec![1u8; n];
                opts[n - 1] = 0;
                out.extend(opts);
                out[14] = 0x45 + (n / 4) as u8;
                let total = u16::from_be_bytes([out[16], out[17]]) + n as u16;
                out[16..18].copy_from_slice(&total.to_be_bytes());
                out[24..26].copy_from_slice(&[0, 0]);
                let sum = lb_userspace::packet::checksum(&out[14..], 0);
                out[24..26].copy_from_slice(&sum.to_be_bytes());
            }
            IpFamily::V6 => {
                let chain: Vec<(u8, [u8; 6])> = exts
                    .iter()
                    .map(|kind| match *kind {
                        NEXTHDR_ROUTING => (*kind, [253, 0, 0, 0, 0, 0]),
                        _ => (*kind, [1, 4, 0, 0, 0, 0]),
                    })
                    .collect();
                return insert_ext6(frame, &chain);
            }
        }
        out.extend(l4);
        out
    }

    /// `frame` as a fragment at `offset` (in 8-byte units), more to come or not: IPv4's
    /// flags and offset set (no don't-fragment; its header checksum made to match), an
    /// IPv6 fragment header inserted.
    pub fn fragment(&self, frame: &[u8], offset: u16, more: bool) -> Vec<u8> {
        match self.family {
            IpFamily::V4 => {
                let mut out = frame.to_vec();
                let field = offset | if more { 0x2000 } else { 0 };
                out[20..22].copy_from_slice(&field.to_be_bytes());
                out[24..26].copy_from_slice(&[0, 0]);
                let sum = lb_userspace::packet::checksum(&out[14..34], 0);
                out[24..26].copy_from_slice(&sum.to_be_bytes());
                out
            }
            IpFamily::V6 => {
                let o = ((offset << 3) | u16::from(more)).to_be_bytes();
                insert_ext6(frame, &[(NEXTHDR_FRAGMENT, [o[0], o[1], 0, 0, 0x12, 0x34])])
            }
        }
    }

    /// `frame` (TCP without options, built by [`frame`]) with its checksum field holding
    /// only the pseudo-header's sum, as a sender that offloads it leaves it
    /// (CHECKSUM_PARTIAL).
    pub fn partial_checksum(&self, frame: &[u8]) -> Vec<u8> {
        let at = self.l4_at();
        let addrs = match self.family {
            IpFamily::V4 => &frame[26..34],
            IpFamily::V6 => &frame[22..54],
        };
        let mut sum = crate::frame6::sum16(addrs, 0) + 6 + (frame.len() - at) as u32;
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        let mut out = frame.to_vec();
        out[at + 16..at + 18].copy_from_slice(&(sum as u16).to_be_bytes());
        out
    }

    /// How many bytes [`Family::with_options`] adds per entry.
    pub fn option_bytes(&self) -> usize {
        match self.family {
            IpFamily::V4 => 4,
            IpFamily::V6 => 8,
        }
    }

    /// An ICMP error of this family from `from` to `to` quoting `quote`.
    pub fn icmp_error(&self, from: IpAddr, to: IpAddr, e: IcmpError, quote: &[u8]) -> Vec<u8> {
        let (kind, rest) = self.icmp_kind(e);
        icmp(from, to, kind, rest, quote)
    }

    /// The type and code of `e` in this family, and the four bytes after the checksum.
    pub fn icmp_kind(&self, e: IcmpError) -> ((u8, u8), [u8; 4]) {
        let v4 = self.family == IpFamily::V4;
        match e {
            IcmpError::PortUnreachable => (self.port_unreachable, [0; 4]),
            IcmpError::TooBig(mtu) if v4 => ((3, 4), u32::from(mtu).to_be_bytes()),
            IcmpError::TooBig(mtu) => ((2, 0), u32::from(mtu).to_be_bytes()),
            IcmpError::TimeExceeded if v4 => ((11, 0), [0; 4]),
            IcmpError::TimeExceeded => ((3, 0), [0; 4]),
        }
    }

    /// An echo request (ping) of this family.
    pub fn echo_request(&self, from: IpAddr, to: IpAddr) -> Vec<u8> {
        let kind = if self.family == IpFamily::V4 { 8 } else { 128 };
        icmp(from, to, (kind, 0), [0, 1, 0, 1], b"ping")
    }

    /// What an ICMP error quotes of `frame` (built by [`frame`]): its IP header and the
    /// first 8 bytes after it.
    pub fn quote<'a>(&self, frame: &'a [u8]) -> &'a [u8] {
        &frame[14..self.l4_at() + 8]
    }

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
        match self.family {
            IpFamily::V4 => v4(Ipv4Addr::new(10, 244, 9, i)),
            IpFamily::V6 => v6(Ipv6Addr::new(0xfd00, 0x10, 0x244, 9, 0, 0, 0, u16::from(i))),
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

/// An IPv6 `frame` with `chain` (each an extension header's type and the 6 bytes after
/// its next-header and length bytes) between its fixed header and what followed it.
fn insert_ext6(frame: &[u8], chain: &[(u8, [u8; 6])]) -> Vec<u8> {
    let (head, rest) = frame.split_at(54);
    let mut out = head.to_vec();
    let mut next = out[20];
    let mut exts = Vec::new();
    for (kind, body) in chain.iter().rev() {
        let mut h = vec![next, 0];
        h.extend(body);
        h.extend(exts);
        exts = h;
        next = *kind;
    }
    out[20] = next;
    let len = u16::from_be_bytes([out[18], out[19]]) + exts.len() as u16;
    out[18..20].copy_from_slice(&len.to_be_bytes());
    out.extend(exts);
    out.extend(rest);
    out
}
