//! A small packet builder and parser (Ethernet, IPv4, TCP/UDP) with real checksums, for
//! packet tests through `BPF_PROG_TEST_RUN` and for tracing a packet through the datapath.

use std::net::{Ipv4Addr, SocketAddrV4};

use crate::model::Protocol;

pub const TCP_SYN: u8 = 0x02;
pub const TCP_ACK: u8 = 0x10;

/// Builds one Ethernet/IPv4/TCP-or-UDP frame.
#[derive(Clone, Debug)]
pub struct PacketBuilder {
    src: SocketAddrV4,
    dst: SocketAddrV4,
    protocol: Protocol,
    tcp_flags: u8,
    payload: Vec<u8>,
    udp_checksum: bool,
}

impl PacketBuilder {
    pub fn tcp(src: SocketAddrV4, dst: SocketAddrV4) -> Self {
        Self {
            src,
            dst,
            protocol: Protocol::Tcp,
            tcp_flags: TCP_SYN,
            payload: Vec::new(),
            udp_checksum: true,
        }
    }

    pub fn udp(src: SocketAddrV4, dst: SocketAddrV4) -> Self {
        Self {
            protocol: Protocol::Udp,
            tcp_flags: 0,
            ..Self::tcp(src, dst)
        }
    }

    pub fn flags(mut self, flags: u8) -> Self {
        self.tcp_flags = flags;
        self
    }

    pub fn payload(mut self, payload: &[u8]) -> Self {
        self.payload = payload.to_vec();
        self
    }

    /// UDP only: send with checksum 0 ("none"), which a rewrite must keep 0.
    pub fn without_udp_checksum(mut self) -> Self {
        self.udp_checksum = false;
        self
    }

    pub fn build(&self) -> Vec<u8> {
        let l4_len = match self.protocol {
            Protocol::Udp => 8,
            _ => 20,
        } + self.payload.len();
        let mut p = Vec::with_capacity(34 + l4_len);
        p.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x08, 0x00]);
        let tot = (20 + l4_len) as u16;
        p.extend_from_slice(&[
            0x45,
            0,
            (tot >> 8) as u8,
            tot as u8,
            0x12,
            0x34,
            0x40,
            0,
            64,
        ]);
        p.push(self.protocol.number());
        p.extend_from_slice(&[0, 0]);
        p.extend_from_slice(&self.src.ip().octets());
        p.extend_from_slice(&self.dst.ip().octets());
        let ip_csum = checksum(&p[14..34], 0);
        p[24..26].copy_from_slice(&ip_csum.to_be_bytes());
        p.extend_from_slice(&self.src.port().to_be_bytes());
        p.extend_from_slice(&self.dst.port().to_be_bytes());
        match self.protocol {
            Protocol::Udp => {
                p.extend_from_slice(&(l4_len as u16).to_be_bytes());
                p.extend_from_slice(&[0, 0]);
            }
            _ => {
                p.extend_from_slice(&1u32.to_be_bytes());
                p.extend_from_slice(&0u32.to_be_bytes());
                p.extend_from_slice(&[0x50, self.tcp_flags, 0xff, 0xff, 0, 0, 0, 0]);
            }
        }
        p.extend_from_slice(&self.payload);
        if self.protocol != Protocol::Udp || self.udp_checksum {
            let mut c = l4_checksum(&p);
            if self.protocol == Protocol::Udp && c == 0 {
                c = 0xffff;
            }
            let off = 34
                + if self.protocol == Protocol::Udp {
                    6
                } else {
                    16
                };
            p[off..off + 2].copy_from_slice(&c.to_be_bytes());
        }
        p
    }
}

/// An ICMP error frame from `from` to `to` quoting `quote` (an IPv4 header and the first 8
/// bytes of its payload, e.g. `&frame[14..42]` of a built frame); `mtu` for type 3 code 4.
pub fn icmp_error(
    from: Ipv4Addr,
    to: Ipv4Addr,
    typ: u8,
    code: u8,
    mtu: u16,
    quote: &[u8],
) -> Vec<u8> {
    let tot = (20 + 8 + quote.len()) as u16;
    let mut p = vec![0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x08, 0x00];
    p.extend_from_slice(&[
        0x45,
        0xc0,
        (tot >> 8) as u8,
        tot as u8,
        0,
        0,
        0,
        0,
        64,
        1,
        0,
        0,
    ]);
    p.extend_from_slice(&from.octets());
    p.extend_from_slice(&to.octets());
    let c = checksum(&p[14..34], 0);
    p[24..26].copy_from_slice(&c.to_be_bytes());
    let m = mtu.to_be_bytes();
    p.extend_from_slice(&[typ, code, 0, 0, 0, 0, m[0], m[1]]);
    p.extend_from_slice(quote);
    let c = checksum(&p[34..], 0);
    p[36..38].copy_from_slice(&c.to_be_bytes());
    p
}

/// What an ICMP error frame says, and whether its checksums hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedIcmp {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub typ: u8,
    pub code: u8,
    /// Next-hop MTU (type 3 code 4).
    pub mtu: u16,
    /// The quoted packet's addresses and ports.
    pub inner_src: SocketAddrV4,
    pub inner_dst: SocketAddrV4,
    /// Outer IPv4, ICMP and quoted IPv4 checksums.
    pub checksums_ok: bool,
}

/// Parses an ICMP error frame (IPv4 without options, quoting TCP or UDP).
pub fn parse_icmp(p: &[u8]) -> Option<ParsedIcmp> {
    if p.len() < 34 + 8 + 28 || p[12..14] != [0x08, 0x00] || p[14] != 0x45 || p[23] != 1 {
        return None;
    }
    let ip = |o: usize| Ipv4Addr::new(p[o], p[o + 1], p[o + 2], p[o + 3]);
    let port = |o: usize| u16::from_be_bytes([p[o], p[o + 1]]);
    let inner = 42;
    Some(ParsedIcmp {
        src: ip(26),
        dst: ip(30),
        typ: p[34],
        code: p[35],
        mtu: port(40),
        inner_src: SocketAddrV4::new(ip(inner + 12), port(inner + 20)),
        inner_dst: SocketAddrV4::new(ip(inner + 16), port(inner + 22)),
        checksums_ok: checksum(&p[14..34], 0) == 0
            && checksum(&p[34..], 0) == 0
            && checksum(&p[inner..inner + 20], 0) == 0,
    })
}

/// What a frame says, and whether its checksums hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed {
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub protocol: Protocol,
    pub ip_checksum_ok: bool,
    /// True for a UDP checksum of 0 (none).
    pub l4_checksum_ok: bool,
    pub udp_checksum_zero: bool,
}

/// Parses a frame built like [`PacketBuilder`] builds them (IPv4 without options).
pub fn parse(p: &[u8]) -> Option<Parsed> {
    if p.len() < 34 || p[12..14] != [0x08, 0x00] || p[14] != 0x45 {
        return None;
    }
    let protocol = Protocol::from_number(p[23])?;
    let l4_min = if protocol == Protocol::Udp { 8 } else { 20 };
    if p.len() < 34 + l4_min {
        return None;
    }
    let ip = |o: usize| Ipv4Addr::new(p[o], p[o + 1], p[o + 2], p[o + 3]);
    let port = |o: usize| u16::from_be_bytes([p[o], p[o + 1]]);
    let udp_zero = protocol == Protocol::Udp && p[40..42] == [0, 0];
    Some(Parsed {
        src: SocketAddrV4::new(ip(26), port(34)),
        dst: SocketAddrV4::new(ip(30), port(36)),
        protocol,
        ip_checksum_ok: checksum(&p[14..34], 0) == 0,
        l4_checksum_ok: udp_zero || l4_checksum(p) == 0,
        udp_checksum_zero: udp_zero,
    })
}

/// The L4 checksum over the pseudo header and segment as the frame stands (0 when valid).
fn l4_checksum(p: &[u8]) -> u16 {
    let seg = &p[34..];
    let mut pseudo = 0u32;
    for w in p[26..34].chunks(2) {
        pseudo += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    pseudo += u32::from(p[23]) + seg.len() as u32;
    checksum(seg, pseudo)
}

/// The Internet checksum of `data`, starting from `sum`.
pub fn checksum(data: &[u8], mut sum: u32) -> u16 {
    for chunk in data.chunks(2) {
        let w = if chunk.len() == 2 {
            u16::from_be_bytes([chunk[0], chunk[1]])
        } else {
            u16::from_be_bytes([chunk[0], 0])
        };
        sum += u32::from(w);
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_packets_parse_with_valid_checksums() {
        let a = SocketAddrV4::new(Ipv4Addr::new(10, 244, 1, 2), 40000);
        let b = SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, 10), 80);
        for pkt in [
            PacketBuilder::tcp(a, b).payload(b"hello").build(),
            PacketBuilder::udp(a, b).payload(b"odd").build(),
        ] {
            let p = parse(&pkt).expect("parses");
            assert_eq!((p.src, p.dst), (a, b));
            assert!(p.ip_checksum_ok && p.l4_checksum_ok);
        }
        let mut pkt = PacketBuilder::tcp(a, b).build();
        pkt[40] ^= 1;
        assert!(!parse(&pkt).expect("parses").l4_checksum_ok);
        let p = parse(&PacketBuilder::udp(a, b).without_udp_checksum().build()).expect("parses");
        assert!(p.udp_checksum_zero);
    }
}
