//! Frames of either family for the packet tables: TCP, UDP and ICMP / ICMPv6 built with
//! their checksums, a family's optional headers, fragments, partial checksums and ICMP
//! errors ([`Family`]'s frame methods), and frames read back with every checksum checked by
//! etherparse (an independent implementation), never by the builders.

use std::net::{IpAddr, SocketAddr};

use crate::{
    checksums::{self, Udp},
    frame6::{Frame6, NEXTHDR_FRAGMENT, NEXTHDR_ROUTING, seen_icmp6, seen6},
    suites::packets::Family,
};
use lb_userspace::{
    model::IpFamily,
    packet::{PacketBuilder, parse_icmp},
    trace::frame::Seen,
};

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
