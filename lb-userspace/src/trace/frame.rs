//! The traced packet of either family: an IPv4 frame from [`super::packet`] (as before),
//! an IPv6 one built with etherparse; and the addresses of a frame of either family read
//! back (with etherparse) after the test run.

use std::net::SocketAddr;

use etherparse::{NetSlice, PacketBuilder as Builder, SlicedPacket, TransportSlice};

use super::packet::{PacketBuilder, TCP_SYN};
use crate::model::Protocol;

/// The payload every traced packet carries.
pub const PAYLOAD: &[u8] = b"xlb trace";

/// A TCP SYN (or a UDP datagram) from `src` to `dst`, both of one family, with valid
/// checksums; `None` for mixed families.
pub fn first_packet(src: SocketAddr, dst: SocketAddr, protocol: Protocol) -> Option<Vec<u8>> {
    match (src, dst) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => Some(
            match protocol {
                Protocol::Udp => PacketBuilder::udp(s, d),
                _ => PacketBuilder::tcp(s, d).flags(TCP_SYN),
            }
            .payload(PAYLOAD)
            .build(),
        ),
        (SocketAddr::V6(s), SocketAddr::V6(d)) => {
            let b = Builder::ethernet2([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1]).ipv6(
                s.ip().octets(),
                d.ip().octets(),
                64,
            );
            let mut out = Vec::new();
            let written = match protocol {
                Protocol::Udp => b.udp(s.port(), d.port()).write(&mut out, PAYLOAD),
                _ => b
                    .tcp(s.port(), d.port(), 1, 0xffff)
                    .syn()
                    .write(&mut out, PAYLOAD),
            };
            written.ok().map(|_| out)
        }
        _ => None,
    }
}

/// What a frame says: its addresses and ports, and its transport protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub protocol: Protocol,
}

/// Reads an Ethernet frame of either family carrying TCP or UDP.
pub fn seen(frame: &[u8]) -> Option<Seen> {
    let p = SlicedPacket::from_ethernet(frame).ok()?;
    let (src, dst) = match p.net? {
        NetSlice::Ipv4(ip) => (
            ip.header().source_addr().into(),
            ip.header().destination_addr().into(),
        ),
        NetSlice::Ipv6(ip) => (
            ip.header().source_addr().into(),
            ip.header().destination_addr().into(),
        ),
        _ => return None,
    };
    let (sport, dport, protocol) = match p.transport? {
        TransportSlice::Tcp(t) => (t.source_port(), t.destination_port(), Protocol::Tcp),
        TransportSlice::Udp(u) => (u.source_port(), u.destination_port(), Protocol::Udp),
        _ => return None,
    };
    Some(Seen {
        src: SocketAddr::new(src, sport),
        dst: SocketAddr::new(dst, dport),
        protocol,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_packets_of_both_families_read_back() {
        for (src, dst) in [
            ("10.244.1.2:40000", "10.96.0.10:80"),
            ("[fd00:244:1::2]:40000", "[fd00::10]:80"),
        ] {
            let (src, dst): (SocketAddr, SocketAddr) =
                (src.parse().expect("src"), dst.parse().expect("dst"));
            for protocol in [Protocol::Tcp, Protocol::Udp] {
                let f = first_packet(src, dst, protocol).expect("one family");
                assert_eq!(seen(&f), Some(Seen { src, dst, protocol }));
            }
        }
        let v4: SocketAddr = "10.0.0.1:1".parse().expect("v4");
        let v6: SocketAddr = "[fd00::1]:1".parse().expect("v6");
        assert_eq!(first_packet(v4, v6, Protocol::Tcp), None);
    }

    #[test]
    fn ipv6_checksums_hold() {
        let f = first_packet(
            "[fd00:244:1::2]:40000".parse().expect("src"),
            "[fd00::10]:80".parse().expect("dst"),
            Protocol::Tcp,
        )
        .expect("frame");
        let p = SlicedPacket::from_ethernet(&f).expect("parses");
        let (Some(NetSlice::Ipv6(ip)), Some(TransportSlice::Tcp(t))) = (p.net, p.transport) else {
            panic!("not IPv6 TCP");
        };
        let want = t
            .to_header()
            .calc_checksum_ipv6(&ip.header().to_header(), t.payload())
            .expect("checksum");
        assert_eq!(t.checksum(), want);
        assert!(t.syn());
    }
}
