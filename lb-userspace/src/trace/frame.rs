//! The traced packet of either family: an IPv4 frame from [`super::packet`] (as before),
//! an IPv6 one built with etherparse; and the addresses of a frame of either family read
//! back (with etherparse) after the test run.

use std::net::SocketAddr;

use etherparse::{
    EtherType, Ethernet2Header, IpNumber, Ipv4Header, Ipv6Header, NetSlice,
    PacketBuilder as Builder, SlicedPacket, TransportSlice,
};

use super::packet::{PacketBuilder, TCP_SYN};
use crate::model::Protocol;

/// The payload every traced packet carries.
pub const PAYLOAD: &[u8] = b"xlb trace";

/// A TCP SYN (or a UDP datagram) from `src` to `dst`, both of one family, with valid
/// checksums; `None` for mixed families.
pub fn first_packet(src: SocketAddr, dst: SocketAddr, protocol: Protocol) -> Option<Vec<u8>> {
    if protocol == Protocol::Sctp {
        return sctp_init(src, dst);
    }
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

/// An SCTP packet with one INIT chunk (an association's first packet) from `src` to
/// `dst` in Ethernet and IP, its CRC32c computed; `None` for mixed families.
fn sctp_init(src: SocketAddr, dst: SocketAddr) -> Option<Vec<u8>> {
    let mut sctp = Vec::with_capacity(32);
    sctp.extend(src.port().to_be_bytes());
    sctp.extend(dst.port().to_be_bytes());
    sctp.extend([0u8; 8]); // verification tag 0 (an INIT's), checksum below
    sctp.extend([1, 0, 0, 20]); // INIT, no flags, 20 bytes
    sctp.extend(0x7872_6c62u32.to_be_bytes()); // initiate tag
    sctp.extend(65535u32.to_be_bytes()); // a_rwnd
    sctp.extend([0, 1, 0, 1]); // one stream each way
    sctp.extend(1u32.to_be_bytes()); // initial TSN
    let crc = lb_common::crc32c::checksum(&sctp);
    sctp[8..12].copy_from_slice(&crc.to_le_bytes());
    let mut out = Vec::with_capacity(14 + 40 + sctp.len());
    let eth = |ether_type| Ethernet2Header {
        source: [2, 0, 0, 0, 0, 2],
        destination: [2, 0, 0, 0, 0, 1],
        ether_type,
    };
    match (src, dst) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => {
            eth(EtherType::IPV4).write(&mut out).ok()?;
            let mut ip = Ipv4Header::new(
                sctp.len() as u16,
                64,
                IpNumber::SCTP,
                s.ip().octets(),
                d.ip().octets(),
            )
            .ok()?;
            ip.header_checksum = ip.calc_header_checksum();
            ip.write(&mut out).ok()?;
        }
        (SocketAddr::V6(s), SocketAddr::V6(d)) => {
            eth(EtherType::IPV6).write(&mut out).ok()?;
            Ipv6Header {
                payload_length: sctp.len() as u16,
                next_header: IpNumber::SCTP,
                hop_limit: 64,
                source: s.ip().octets(),
                destination: d.ip().octets(),
                ..Default::default()
            }
            .write(&mut out)
            .ok()?;
        }
        _ => return None,
    }
    out.extend(sctp);
    Some(out)
}

/// What a frame says: its addresses and ports, and its transport protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub protocol: Protocol,
}

/// Reads an Ethernet frame of either family carrying TCP, UDP or SCTP (etherparse has no
/// SCTP: its ports are the IP payload's first four bytes).
pub fn seen(frame: &[u8]) -> Option<Seen> {
    let p = SlicedPacket::from_ethernet(frame).ok()?;
    let (src, dst, payload) = match p.net? {
        NetSlice::Ipv4(ip) => (
            ip.header().source_addr().into(),
            ip.header().destination_addr().into(),
            ip.payload().clone(),
        ),
        NetSlice::Ipv6(ip) => (
            ip.header().source_addr().into(),
            ip.header().destination_addr().into(),
            ip.payload().clone(),
        ),
        _ => return None,
    };
    let (sport, dport, protocol) = match p.transport {
        Some(TransportSlice::Tcp(t)) => (t.source_port(), t.destination_port(), Protocol::Tcp),
        Some(TransportSlice::Udp(u)) => (u.source_port(), u.destination_port(), Protocol::Udp),
        _ if payload.ip_number == IpNumber::SCTP && !payload.fragmented => {
            let b = payload.payload.get(..4)?;
            (
                u16::from_be_bytes([b[0], b[1]]),
                u16::from_be_bytes([b[2], b[3]]),
                Protocol::Sctp,
            )
        }
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
            for protocol in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
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
