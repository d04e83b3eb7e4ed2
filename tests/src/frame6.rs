//! IPv6 frames for the packet tables: Ethernet, the fixed header, any extension headers,
//! then TCP, UDP or ICMPv6 with the checksum over the pseudo-header. Outputs are checked
//! with etherparse (an independent implementation), not with this builder.

use std::net::{Ipv6Addr, SocketAddrV6};

pub const ETH_P_IPV6: [u8; 2] = [0x86, 0xdd];
pub const NEXTHDR_HOP: u8 = 0;
pub const NEXTHDR_ROUTING: u8 = 43;
pub const NEXTHDR_FRAGMENT: u8 = 44;
pub const NEXTHDR_DEST: u8 = 60;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_ICMPV6: u8 = 58;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_ACK: u8 = 0x10;

/// One's-complement sum of big-endian 16-bit words (an odd tail padded with 0).
pub fn sum16(data: &[u8], mut sum: u32) -> u32 {
    for c in data.chunks(2) {
        sum += (u32::from(c[0]) << 8) | u32::from(*c.get(1).unwrap_or(&0));
    }
    sum
}

/// The checksum of `l4` (with its checksum field zeroed) over the IPv6 pseudo-header.
pub fn l4_checksum(src: &Ipv6Addr, dst: &Ipv6Addr, proto: u8, l4: &[u8]) -> u16 {
    let mut s = sum16(&src.octets(), 0);
    s = sum16(&dst.octets(), s);
    s += l4.len() as u32 + u32::from(proto);
    s = sum16(l4, s);
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// An extension header: its type and its body after the two-byte (next, length) prefix,
/// padded to a multiple of 8 bytes.
#[derive(Clone, Debug)]
pub struct Ext {
    pub kind: u8,
    pub body: Vec<u8>,
}

impl Ext {
    /// Hop-by-hop or destination options with one PadN option (8 bytes in all).
    pub fn options(kind: u8) -> Self {
        Self {
            kind,
            body: vec![1, 4, 0, 0, 0, 0],
        }
    }
    /// A routing header (type 253, experimental) with no segments left.
    pub fn routing() -> Self {
        Self {
            kind: NEXTHDR_ROUTING,
            body: vec![253, 0, 0, 0, 0, 0],
        }
    }
    /// A fragment header: offset in 8-byte units, more-fragments.
    pub fn fragment(offset: u16, more: bool) -> Self {
        let o = (offset << 3) | u16::from(more);
        let b = o.to_be_bytes();
        Self {
            kind: NEXTHDR_FRAGMENT,
            body: vec![b[0], b[1], 0, 0, 0x12, 0x34],
        }
    }
}

/// An IPv6 frame under construction.
#[derive(Clone, Debug)]
pub struct Frame6 {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub proto: u8,
    pub ext: Vec<Ext>,
    /// The L4 header and payload, checksum field zero (filled by `build`).
    pub l4: Vec<u8>,
    /// Offset of the checksum within `l4`.
    csum: usize,
}

impl Frame6 {
    pub fn tcp(src: SocketAddrV6, dst: SocketAddrV6, flags: u8, payload: &[u8]) -> Self {
        let mut l4 = Vec::new();
        l4.extend(src.port().to_be_bytes());
        l4.extend(dst.port().to_be_bytes());
        l4.extend(1000u32.to_be_bytes());
        l4.extend(if flags & TCP_ACK != 0 { 1u32 } else { 0 }.to_be_bytes());
        l4.extend([0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
        l4.extend(payload);
        Self {
            src: *src.ip(),
            dst: *dst.ip(),
            proto: IPPROTO_TCP,
            ext: Vec::new(),
            l4,
            csum: 16,
        }
    }

    pub fn udp(src: SocketAddrV6, dst: SocketAddrV6, payload: &[u8]) -> Self {
        let mut l4 = Vec::new();
        l4.extend(src.port().to_be_bytes());
        l4.extend(dst.port().to_be_bytes());
        l4.extend(((8 + payload.len()) as u16).to_be_bytes());
        l4.extend([0, 0]);
        l4.extend(payload);
        Self {
            src: *src.ip(),
            dst: *dst.ip(),
            proto: IPPROTO_UDP,
            ext: Vec::new(),
            l4,
            csum: 6,
        }
    }

    /// An ICMPv6 message: type, code, the four bytes after the checksum, the body.
    pub fn icmp(
        src: Ipv6Addr,
        dst: Ipv6Addr,
        kind: u8,
        code: u8,
        rest: [u8; 4],
        body: &[u8],
    ) -> Self {
        let mut l4 = vec![kind, code, 0, 0];
        l4.extend(rest);
        l4.extend(body);
        Self {
            src,
            dst,
            proto: IPPROTO_ICMPV6,
            ext: Vec::new(),
            l4,
            csum: 2,
        }
    }

    pub fn with_ext(mut self, ext: Ext) -> Self {
        self.ext.push(ext);
        self
    }

    /// The IPv6 packet (no Ethernet header).
    pub fn ip(&self) -> Vec<u8> {
        let mut l4 = self.l4.clone();
        let c = l4_checksum(&self.src, &self.dst, self.proto, &l4);
        l4[self.csum..self.csum + 2].copy_from_slice(&c.to_be_bytes());
        let mut exts = Vec::new();
        for (i, e) in self.ext.iter().enumerate() {
            let next = self.ext.get(i + 1).map_or(self.proto, |n| n.kind);
            let mut h = vec![next, 0];
            h.extend(&e.body);
            while h.len() % 8 != 0 {
                h.push(0);
            }
            if e.kind != NEXTHDR_FRAGMENT {
                h[1] = (h.len() / 8 - 1) as u8;
            }
            exts.extend(h);
        }
        let first = self.ext.first().map_or(self.proto, |e| e.kind);
        let payload_len = (exts.len() + l4.len()) as u16;
        let mut p = vec![0x60, 0, 0, 0];
        p.extend(payload_len.to_be_bytes());
        p.extend([first, 64]);
        p.extend(self.src.octets());
        p.extend(self.dst.octets());
        p.extend(exts);
        p.extend(l4);
        p
    }

    /// The Ethernet frame.
    pub fn build(&self) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
        f.extend(ETH_P_IPV6);
        f.extend(self.ip());
        f
    }
}

/// What an IPv6 frame holds, as etherparse reads it, with every checksum checked.
#[derive(Debug, PartialEq, Eq)]
pub struct Seen6 {
    pub src: SocketAddrV6,
    pub dst: SocketAddrV6,
    pub proto: u8,
    pub tcp_flags: u8,
}

/// Reads `frame` with etherparse; panics (naming `what`) when it does not parse as IPv6
/// TCP/UDP or when its L4 checksum is wrong.
pub fn seen6(frame: &[u8], what: &str) -> Seen6 {
    use etherparse::{NetSlice, SlicedPacket, TransportSlice};
    let sliced = SlicedPacket::from_ethernet(frame)
        .unwrap_or_else(|e| panic!("{what}: etherparse cannot read the frame: {e}"));
    let Some(NetSlice::Ipv6(ip)) = &sliced.net else {
        panic!("{what}: not IPv6 for etherparse");
    };
    let h = ip.header();
    let (src, dst) = (h.source_addr(), h.destination_addr());
    match &sliced.transport {
        Some(TransportSlice::Tcp(t)) => {
            let want = t
                .calc_checksum_ipv6(src.octets(), dst.octets())
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(t.checksum(), want, "{what}: TCP checksum (etherparse)");
            let flags = u8::from(t.fin())
                | u8::from(t.syn()) << 1
                | u8::from(t.rst()) << 2
                | u8::from(t.ack()) << 4;
            Seen6 {
                src: SocketAddrV6::new(src, t.source_port(), 0, 0),
                dst: SocketAddrV6::new(dst, t.destination_port(), 0, 0),
                proto: IPPROTO_TCP,
                tcp_flags: flags,
            }
        }
        Some(TransportSlice::Udp(u)) => {
            let want = u
                .to_header()
                .calc_checksum_ipv6_raw(src.octets(), dst.octets(), u.payload())
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(u.checksum(), want, "{what}: UDP checksum (etherparse)");
            Seen6 {
                src: SocketAddrV6::new(src, u.source_port(), 0, 0),
                dst: SocketAddrV6::new(dst, u.destination_port(), 0, 0),
                proto: IPPROTO_UDP,
                tcp_flags: 0,
            }
        }
        other => panic!("{what}: no TCP or UDP for etherparse: {other:?}"),
    }
}

/// An ICMPv6 message as etherparse reads it (its checksum checked over the pseudo-header).
#[derive(Debug)]
pub struct SeenIcmp6 {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub kind: u8,
    pub code: u8,
    pub rest: [u8; 4],
    /// The message body after the first 8 bytes (an error's quote).
    pub body: Vec<u8>,
}

pub fn seen_icmp6(frame: &[u8], what: &str) -> SeenIcmp6 {
    use etherparse::{NetSlice, SlicedPacket, TransportSlice};
    let sliced = SlicedPacket::from_ethernet(frame)
        .unwrap_or_else(|e| panic!("{what}: etherparse cannot read the frame: {e}"));
    let Some(NetSlice::Ipv6(ip)) = &sliced.net else {
        panic!("{what}: not IPv6 for etherparse");
    };
    let h = ip.header();
    let (src, dst) = (h.source_addr(), h.destination_addr());
    let Some(TransportSlice::Icmpv6(m)) = &sliced.transport else {
        panic!("{what}: not ICMPv6: {:?}", sliced.transport);
    };
    assert!(
        m.is_checksum_valid(src.octets(), dst.octets()),
        "{what}: ICMPv6 checksum (etherparse)"
    );
    SeenIcmp6 {
        src,
        dst,
        kind: m.type_u8(),
        code: m.code_u8(),
        rest: m.bytes5to8(),
        body: m.payload().to_vec(),
    }
}
