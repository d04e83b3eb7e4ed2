//! IPv6 parsing: the fixed header, then the extension headers a router may see before the
//! L4 header (hop-by-hop, routing, destination options, authentication), in a bounded walk.
//! A fragment header passes the packet untouched (its ports may not be visible, as with
//! IPv4 fragments); a truncated or inconsistent header is malformed.

use lb_common::{IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP, R_FRAGMENT, R_MALFORMED, R_PASS};

use crate::{
    packet::{Packet, at, ld16, ld32},
    parse::{ETH_HLEN, Frame, l4_direct, sctp_flags},
    reason::Reason,
};

/// The fixed IPv6 header (40 bytes) as it sits in the packet.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Ip6Hdr {
    pub vtc_flow: u32,
    pub payload_len_be: u16,
    pub nexthdr: u8,
    pub hop_limit: u8,
    pub saddr_be: [u32; 4],
    pub daddr_be: [u32; 4],
}
const _: () = assert!(core::mem::size_of::<Ip6Hdr>() == 40);

/// The fixed header's length: an IPv6 packet is this and its payload length
/// (`Family::ip_len`).
pub const IP6_HLEN: u32 = 40;

/// Offsets of the IPv6 source and destination addresses, and of the L4 header of a packet
/// without extension headers.
pub const IP6_SRC_OFF: usize = ETH_HLEN + 8;
pub const IP6_DST_OFF: usize = ETH_HLEN + 24;
pub const IP6_L4_OFF: usize = ETH_HLEN + 40;
/// Offset of the hop limit.
pub const HOP_LIMIT_OFF: usize = ETH_HLEN + 7;
/// Bytes the direct path needs in place: Ethernet, the fixed header with TCP or UDP right
/// behind it, TCP's first 20 bytes (ports, flags, checksum) or UDP's 8.
pub const DIRECT6_TCP: usize = IP6_L4_OFF + 20;
pub const DIRECT6_UDP: usize = IP6_L4_OFF + 8;
/// SCTP's common header and its first chunk's header.
pub const DIRECT6_SCTP: usize = IP6_L4_OFF + 16;

const NEXTHDR_HOP: u8 = 0;
const NEXTHDR_ROUTING: u8 = 43;
const NEXTHDR_FRAGMENT: u8 = 44;
const NEXTHDR_AUTH: u8 = 51;
const NEXTHDR_DEST: u8 = 60;
pub const IPPROTO_ICMPV6: u8 = 58;
/// Extension headers walked before giving up (Cilium walks 4; more is left to the stack).
const MAX_EXT: usize = 6;

/// The parts of an IPv6 TCP/UDP packet (or ICMPv6 message) that NAT needs. Kept in the
/// per-CPU work area (`work::Work6`), not on the 512-byte stack.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Tuple6 {
    pub saddr_be: [u32; 4],
    pub daddr_be: [u32; 4],
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
    /// TCP flags (0 for UDP).
    pub tcp_flags: u8,
    /// ICMPv6: the message type (0 otherwise).
    pub icmp_type: u8,
    /// 1: no extension header and the headers in place up to `DIRECT6_TCP`/`DIRECT6_UDP`
    /// (`l4_off == IP6_L4_OFF`): rewritten in place, not through helpers.
    pub direct: u8,
    /// IPv6 payload length (extension headers and L4).
    pub payload_len: u32,
    /// Offset of the L4 header.
    pub l4_off: u32,
    /// Offset of the L4 checksum.
    pub csum_off: u32,
}

/// What the packet is (TCP, UDP or SCTP; ICMPv6; or passed); its tuple is in the `Tuple6`
/// the parser filled ([`Frame::of`]).
pub type Parsed6 = Frame<(), ()>;

#[inline(always)]
fn malformed<E>(_: E) -> Reason {
    Reason(R_MALFORMED)
}

/// Parses an IPv6 packet (the Ethernet type said IPv6) into `t`. Out of line: its
/// header copy stays off the frames of the steps that follow. The common packet (TCP or
/// UDP right behind the fixed header, linear) is read in place ([`parse_direct`]); any
/// other through the load helper, with the same checks, so both give the same verdict.
#[inline(never)]
pub fn parse6<P: Packet>(ctx: &P, t: &mut Tuple6) -> Result<Parsed6, Reason> {
    match parse_direct(ctx, t)? {
        Some(p) => Ok(p),
        None => parse_loaded(ctx, t),
    }
}

/// The common case, read in place: `None` when it does not apply (an extension header or
/// ICMPv6 next, a bad version or a jumbogram, headers not linear even after a pull), for
/// [`parse_loaded`] to judge.
#[inline(always)]
fn parse_direct<P: Packet>(ctx: &P, t: &mut Tuple6) -> Result<Option<Parsed6>, Reason> {
    let Some(h) = at::<_, [u8; IP6_L4_OFF]>(ctx, 0) else {
        return Ok(None);
    };
    let h = h as *const u8;
    // SAFETY (every access to `h`): `at` checked IP6_L4_OFF bytes, every offset is below.
    let (version, next, payload_len) = unsafe {
        (
            *h.add(ETH_HLEN) >> 4,
            *h.add(ETH_HLEN + 6),
            u16::from_be(ld16(h, ETH_HLEN + 4)) as usize,
        )
    };
    let (l4_len, csum_rel, need) = match next {
        IPPROTO_TCP => (20, 16, DIRECT6_TCP),
        IPPROTO_UDP => (8, 6, DIRECT6_UDP),
        IPPROTO_SCTP => (16, 8, DIRECT6_SCTP),
        _ => return Ok(None),
    };
    if version != 6 || payload_len == 0 {
        return Ok(None);
    }
    if (ctx.len() as usize) < IP6_L4_OFF + payload_len || payload_len < l4_len {
        return Err(Reason(R_MALFORMED));
    }
    for i in 0..4 {
        // SAFETY: as above.
        unsafe {
            t.saddr_be[i] = ld32(h, IP6_SRC_OFF + 4 * i);
            t.daddr_be[i] = ld32(h, IP6_DST_OFF + 4 * i);
        }
    }
    // A pull invalidates `h`: it is not used below.
    let Some((sport, dport, tcp_flags)) =
        l4_direct::<_, [u8; DIRECT6_UDP], [u8; DIRECT6_TCP], [u8; DIRECT6_SCTP]>(
            ctx, next, IP6_L4_OFF, need,
        )
    else {
        return Ok(None);
    };
    (t.sport_be, t.dport_be, t.tcp_flags) = (sport, dport, tcp_flags);
    t.proto = next;
    t.icmp_type = 0;
    t.direct = 1;
    t.payload_len = payload_len as u32;
    t.l4_off = IP6_L4_OFF as u32;
    t.csum_off = (IP6_L4_OFF + csum_rel) as u32;
    Ok(Some(Parsed6::Flow(())))
}

/// Any IPv6 packet, through the load helper.
#[inline(always)]
fn parse_loaded<P: Packet>(ctx: &P, t: &mut Tuple6) -> Result<Parsed6, Reason> {
    let h: Ip6Hdr = ctx.load(ETH_HLEN).map_err(malformed)?;
    if u32::from_be(h.vtc_flow) >> 28 != 6 {
        return Err(Reason(R_MALFORMED));
    }
    let payload_len = u16::from_be(h.payload_len_be);
    if payload_len == 0 {
        // A jumbogram (or nothing): not ours to judge.
        return Ok(Parsed6::Pass(Reason(R_PASS)));
    }
    let end = IP6_L4_OFF + payload_len as usize;
    if (ctx.len() as usize) < end {
        return Err(Reason(R_MALFORMED));
    }
    let (proto, l4_off) = walk(ctx, h.nexthdr, end)?;
    let (l4_len, csum_rel) = match proto {
        IPPROTO_TCP => (20, 16),
        IPPROTO_UDP => (8, 6),
        IPPROTO_SCTP => (16, 8),
        IPPROTO_ICMPV6 => (8, 2),
        NEXTHDR_FRAGMENT => return Ok(Parsed6::Pass(Reason(R_FRAGMENT))),
        _ => return Ok(Parsed6::Pass(Reason(R_PASS))),
    };
    if l4_off + l4_len > end {
        return Err(Reason(R_MALFORMED));
    }
    let l4: [u8; 14] = if proto == IPPROTO_TCP {
        ctx.load(l4_off).map_err(malformed)?
    } else if proto == IPPROTO_SCTP {
        let h: [u8; 13] = ctx.load(l4_off).map_err(malformed)?;
        let f = sctp_flags(h[12]);
        [h[0], h[1], h[2], h[3], 0, 0, 0, 0, 0, 0, 0, 0, 0, f]
    } else {
        let h: [u8; 4] = ctx.load(l4_off).map_err(malformed)?;
        [h[0], h[1], h[2], h[3], 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    };
    for i in 0..4 {
        t.saddr_be[i] = h.saddr_be[i];
        t.daddr_be[i] = h.daddr_be[i];
    }
    t.proto = proto;
    t.payload_len = payload_len as u32;
    t.l4_off = l4_off as u32;
    t.csum_off = (l4_off + csum_rel) as u32;
    t.direct = 0;
    if proto == IPPROTO_ICMPV6 {
        t.icmp_type = l4[0];
        t.sport_be = 0;
        t.dport_be = 0;
        t.tcp_flags = 0;
        return Ok(Parsed6::Icmp(()));
    }
    t.icmp_type = 0;
    t.sport_be = u16::from_ne_bytes([l4[0], l4[1]]);
    t.dport_be = u16::from_ne_bytes([l4[2], l4[3]]);
    t.tcp_flags = l4[13];
    Ok(Parsed6::Flow(()))
}

/// Walks the extension headers from `next` (the fixed header's next header): the upper
/// protocol and its offset. A fragment header stops the walk (returned as the protocol); so
/// does a chain longer than `MAX_EXT` (returned as a hop-by-hop header: passed). Every
/// header must lie within the payload (`end`).
#[inline(always)]
fn walk<P: Packet>(ctx: &P, mut next: u8, end: usize) -> Result<(u8, usize), Reason> {
    let mut off = IP6_L4_OFF;
    for _ in 0..MAX_EXT {
        let len = match next {
            NEXTHDR_HOP | NEXTHDR_ROUTING | NEXTHDR_DEST => 8,
            NEXTHDR_AUTH => 4,
            _ => return Ok((next, off)),
        };
        if off + 8 > end {
            return Err(Reason(R_MALFORMED));
        }
        let e: [u8; 2] = ctx.load(off).map_err(malformed)?;
        next = e[0];
        // Options headers count 8-byte units beyond the first; AH 4-byte units beyond two.
        off += if len == 8 {
            (e[1] as usize + 1) * 8
        } else {
            (e[1] as usize + 2) * 4
        };
    }
    match next {
        NEXTHDR_HOP | NEXTHDR_ROUTING | NEXTHDR_DEST | NEXTHDR_AUTH => Ok((NEXTHDR_HOP, off)),
        _ => Ok((next, off)),
    }
}
