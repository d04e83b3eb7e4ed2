//! Helpers shared by the `packets` test files: the IPv4 table's addresses and services, and
//! the fixture of the tables both families share ([`Family`], [`FAMILIES`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::{
    checksums::{self, Udp},
    datapath::LoadedDatapath,
    frame6::{Frame6, seen_icmp6, seen6},
    require_root,
    services::{service_yaml, service6_yaml},
    unique_tag,
};
use lb_userspace::{
    model::IpFamily,
    packet::{PacketBuilder, parse_icmp},
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
        let yaml = match self.family {
            IpFamily::V4 => {
                base_services() + &service_yaml("emptyu", EMPTY_VIP, 53, "UDP", 5353, &[])
            }
            IpFamily::V6 => services6(),
        };
        let tag = unique_tag(&format!("xlbf{}", self.name().to_ascii_lowercase()));
        let mut dp = LoadedDatapath::load(&tag).expect("load the eBPF object");
        let loaded = file::parse("families.yaml", &yaml).expect("yaml");
        assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
        dp.program(&loaded.model).expect("program maps");
        Some(dp)
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

/// An ICMP or ICMPv6 error frame of either family, its checksums (the quoted IPv4
/// header's too) checked: source, destination, type, code and the quote.
pub fn seen_icmp(frame: &[u8], what: &str) -> (IpAddr, IpAddr, (u8, u8), Vec<u8>) {
    if frame.get(12..14) == Some(&[0x08, 0x00]) {
        checksums::assert_valid(frame, Udp::Computed, what);
        let p = parse_icmp(frame).unwrap_or_else(|| panic!("{what}: no ICMP error"));
        assert!(p.checksums_ok, "{what}: checksums");
        let quote = frame[42..].to_vec();
        (p.src.into(), p.dst.into(), (p.typ, p.code), quote)
    } else {
        let m = seen_icmp6(frame, what);
        (m.src.into(), m.dst.into(), (m.kind, m.code), m.body)
    }
}
