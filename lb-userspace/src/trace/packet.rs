//! Ethernet/IPv4 frames carrying TCP or UDP (and ICMP errors), built and read with etherparse,
//! for packet tests through `BPF_PROG_TEST_RUN` and for tracing a packet through the datapath.

use std::net::{Ipv4Addr, SocketAddrV4};

use etherparse::{
    IpDscp, IpHeaders, IpNumber, Ipv4Header, Ipv4HeaderSlice, NetSlice, PacketBuilder as Builder,
    SlicedPacket, TcpHeader, TransportSlice, checksum::Sum16BitWords,
};

use crate::model::Protocol;

pub const TCP_SYN: u8 = 0x02;
pub const TCP_ACK: u8 = 0x10;

/// The frames' Ethernet addresses: from 02:00:00:00:00:01 to 02:00:00:00:00:02.
const SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

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

    /// The frame: IPv4 without options (identification 0x1234, don't fragment, TTL 64);
    /// TCP with sequence number 1, window 65535 and the flags given; every checksum computed.
    pub fn build(&self) -> Vec<u8> {
        let mut ip = ipv4(*self.src.ip(), *self.dst.ip(), IpNumber::TCP);
        ip.identification = 0x1234;
        let b = Builder::ethernet2(SRC_MAC, DST_MAC).ip(IpHeaders::Ipv4(ip, Default::default()));
        let mut out = Vec::with_capacity(54 + self.payload.len());
        let (sport, dport) = (self.src.port(), self.dst.port());
        let written = match self.protocol {
            Protocol::Udp => b.udp(sport, dport).write(&mut out, &self.payload),
            _ => b
                .tcp_header(tcp_header(sport, dport, self.tcp_flags))
                .write(&mut out, &self.payload),
        };
        // Writing to a Vec fails only for a payload beyond IPv4's 64 KiB.
        written.expect("an IPv4 packet under 64 KiB");
        if self.protocol == Protocol::Udp && !self.udp_checksum {
            out[40..42].copy_from_slice(&[0, 0]);
        }
        out
    }
}

/// An IPv4 header without options from `src` to `dst` (don't fragment, TTL 64); the
/// builder sets its lengths and checksum.
fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, protocol: IpNumber) -> Ipv4Header {
    Ipv4Header {
        time_to_live: 64,
        protocol,
        source: src.octets(),
        destination: dst.octets(),
        dont_fragment: true,
        ..Default::default()
    }
}

/// A TCP header without options: sequence number 1, acknowledgment number 0, window 65535,
/// the flags of `flags` (FIN 0x01 … CWR 0x80).
fn tcp_header(sport: u16, dport: u16, flags: u8) -> TcpHeader {
    let mut t = TcpHeader::new(sport, dport, 1, 0xffff);
    let bit = |b: u8| flags & b != 0;
    t.fin = bit(0x01);
    t.syn = bit(0x02);
    t.rst = bit(0x04);
    t.psh = bit(0x08);
    t.ack = bit(0x10);
    t.urg = bit(0x20);
    t.ece = bit(0x40);
    t.cwr = bit(0x80);
    t
}

/// An ICMP error frame from `from` to `to` quoting `quote` (an IPv4 header and the first 8
/// bytes of its payload, e.g. `&frame[14..42]` of a built frame); `mtu` for type 3 code 4.
/// Its IPv4 header: DSCP CS6 (as the kernel sends ICMP errors), no don't-fragment.
pub fn icmp_error(
    from: Ipv4Addr,
    to: Ipv4Addr,
    typ: u8,
    code: u8,
    mtu: u16,
    quote: &[u8],
) -> Vec<u8> {
    let mut ip = ipv4(from, to, IpNumber::ICMP);
    ip.dont_fragment = false;
    ip.dscp = IpDscp::CS6;
    let m = mtu.to_be_bytes();
    let mut out = Vec::with_capacity(42 + quote.len());
    Builder::ethernet2(SRC_MAC, DST_MAC)
        .ip(IpHeaders::Ipv4(ip, Default::default()))
        .icmpv4_raw(typ, code, [0, 0, m[0], m[1]])
        .write(&mut out, quote)
        .expect("an ICMP error under 64 KiB");
    out
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

/// Parses an ICMP error frame (IPv4, quoting an IPv4 header and the ports after it).
pub fn parse_icmp(p: &[u8]) -> Option<ParsedIcmp> {
    let sliced = SlicedPacket::from_ethernet(p).ok()?;
    let (Some(NetSlice::Ipv4(ip)), Some(TransportSlice::Icmpv4(icmp))) =
        (&sliced.net, &sliced.transport)
    else {
        return None;
    };
    let quoted = Ipv4HeaderSlice::from_slice(icmp.payload()).ok()?;
    let ports = icmp.payload().get(quoted.slice().len()..)?.get(..4)?;
    let port = |o: usize| u16::from_be_bytes([ports[o], ports[o + 1]]);
    let [_, _, m0, m1] = icmp.bytes5to8();
    Some(ParsedIcmp {
        src: ip.header().source_addr(),
        dst: ip.header().destination_addr(),
        typ: icmp.type_u8(),
        code: icmp.code_u8(),
        mtu: u16::from_be_bytes([m0, m1]),
        inner_src: SocketAddrV4::new(quoted.source_addr(), port(0)),
        inner_dst: SocketAddrV4::new(quoted.destination_addr(), port(2)),
        checksums_ok: header_checksum_ok(&ip.header())
            && icmp.checksum() == icmp.icmp_type().calc_checksum(icmp.payload())
            && header_checksum_ok(&quoted),
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

/// Parses an Ethernet/IPv4 frame carrying TCP or UDP.
pub fn parse(p: &[u8]) -> Option<Parsed> {
    let sliced = SlicedPacket::from_ethernet(p).ok()?;
    let Some(NetSlice::Ipv4(ip)) = &sliced.net else {
        return None;
    };
    let header = ip.header();
    let (src, dst) = (header.source(), header.destination());
    let (sport, dport, protocol, l4_checksum_ok, udp_checksum_zero) = match &sliced.transport {
        Some(TransportSlice::Tcp(t)) => {
            let ok = t.calc_checksum_ipv4(src, dst).ok() == Some(t.checksum());
            (
                t.source_port(),
                t.destination_port(),
                Protocol::Tcp,
                ok,
                false,
            )
        }
        Some(TransportSlice::Udp(u)) => {
            let zero = u.checksum() == 0;
            let want = u.to_header().calc_checksum_ipv4_raw(src, dst, u.payload());
            let ok = zero || want.ok() == Some(u.checksum());
            (
                u.source_port(),
                u.destination_port(),
                Protocol::Udp,
                ok,
                zero,
            )
        }
        _ => return None,
    };
    Some(Parsed {
        src: SocketAddrV4::new(src.into(), sport),
        dst: SocketAddrV4::new(dst.into(), dport),
        protocol,
        ip_checksum_ok: header_checksum_ok(&header),
        l4_checksum_ok,
        udp_checksum_zero,
    })
}

/// Whether an IPv4 header (options included) carries the checksum etherparse computes.
fn header_checksum_ok(h: &Ipv4HeaderSlice<'_>) -> bool {
    h.header_checksum() == h.to_header().calc_header_checksum()
}

/// The Internet checksum of `data`, starting from `sum` (a sum of big-endian 16-bit
/// words, such as a pseudo-header's): 0 over a block that carries its right checksum.
pub fn checksum(data: &[u8], sum: u32) -> u16 {
    let folded = Sum16BitWords::new()
        .add_4bytes(sum.to_be_bytes())
        .add_slice(data)
        .ones_complement();
    u16::from_be_bytes(folded.to_ne_bytes())
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
            assert_eq!(checksum(&pkt[14..34], 0), 0, "the IPv4 header sums to 0");
        }
        let mut pkt = PacketBuilder::tcp(a, b).build();
        pkt[40] ^= 1;
        assert!(!parse(&pkt).expect("parses").l4_checksum_ok);
        let p = parse(&PacketBuilder::udp(a, b).without_udp_checksum().build()).expect("parses");
        assert!(p.udp_checksum_zero);
    }

    #[test]
    fn frames_keep_their_layout() {
        let a = SocketAddrV4::new(Ipv4Addr::new(10, 244, 1, 2), 40000);
        let b = SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, 10), 80);
        let syn = PacketBuilder::tcp(a, b).flags(TCP_SYN | TCP_ACK).build();
        assert_eq!(syn.len(), 54);
        assert_eq!(&syn[12..16], &[0x08, 0x00, 0x45, 0x00], "IPv4, IHL 5");
        assert_eq!(&syn[18..23], &[0x12, 0x34, 0x40, 0x00, 64], "id, DF, TTL");
        assert_eq!(
            &syn[38..47],
            &[0, 0, 0, 1, 0, 0, 0, 0, 0x50],
            "seq, ack, offset"
        );
        assert_eq!(syn[47], TCP_SYN | TCP_ACK);
        let icmp = icmp_error(*b.ip(), *a.ip(), 3, 4, 1400, &syn[14..42]);
        let p = parse_icmp(&icmp).expect("parses");
        assert_eq!((p.typ, p.code, p.mtu), (3, 4, 1400));
        assert_eq!((p.inner_src, p.inner_dst), (a, b));
        assert!(p.checksums_ok);
        assert_eq!(icmp[15], 0xc0, "DSCP CS6");
    }
}
