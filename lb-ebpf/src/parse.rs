//! Packet parsing: the Ethernet type, read once at each program's entry ([`l3`]), which
//! dispatches to IPv4 (here: → TCP/UDP ports, with every length checked) or IPv6
//! (`v6::parse`).
//!
//! A packet without IP options whose headers are linear is read in place ([`parse_direct`]);
//! anything else through the load helper ([`parse_loaded`]), with the same checks in the
//! same order, so both give the same verdict for the same bytes.

use lb_common::{IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP, R_FRAGMENT, R_MALFORMED, R_PASS};

use crate::{
    packet::{Packet, at, ld16, ld32},
    reason::Reason,
};

pub const ETH_HLEN: usize = 14;
const ETH_P_IP_BE: u16 = 0x0800u16.to_be();
const ETH_P_IPV6_BE: u16 = 0x86ddu16.to_be();
/// Offset of the IPv4 checksum.
pub const IP_CSUM_OFF: usize = ETH_HLEN + 10;
/// Offset of the IPv4 source address.
pub const IP_SRC_OFF: usize = ETH_HLEN + 12;
/// Offset of the IPv4 destination address.
pub const IP_DST_OFF: usize = ETH_HLEN + 16;
/// Offset of the L4 header of a packet without IP options (the direct path's only layout).
pub const L4_OFF: usize = ETH_HLEN + 20;
/// Offset of the IPv4 TTL.
pub const IP_TTL_OFF: usize = ETH_HLEN + 8;
/// Bytes the direct path needs in place: Ethernet, IPv4 without options, the TCP header's
/// first 20 bytes (ports, flags, checksum) or UDP's 8.
pub const DIRECT_TCP: usize = L4_OFF + 20;
pub const DIRECT_UDP: usize = L4_OFF + 8;
/// SCTP's common header (ports, verification tag, checksum) and its first chunk's header.
pub const DIRECT_SCTP: usize = L4_OFF + 16;

/// The parts of an IPv4 TCP/UDP packet that NAT needs.
pub struct Tuple {
    pub saddr_be: u32,
    pub daddr_be: u32,
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
    /// Offset of the L4 header.
    pub l4_off: usize,
    /// Offset of the L4 checksum.
    pub csum_off: usize,
    /// IPv4 total length.
    pub tot_len: u16,
    /// Don't-fragment set: a packet too big for its route must be answered, not fragmented.
    pub df: bool,
    /// TCP flags (0 for UDP); for SCTP, what its first chunk means in TCP's terms
    /// ([`sctp_flags`]).
    pub tcp_flags: u8,
    /// The headers are in place at the fixed offsets (`l4_off == L4_OFF`, the bytes up to
    /// `DIRECT_TCP`/`DIRECT_UDP` linear): rewritten directly, not through helpers.
    pub direct: bool,
}

/// An ICMP message (not a fragment): where its header starts.
pub struct Icmp {
    pub saddr_be: u32,
    pub daddr_be: u32,
    /// Offset of the ICMP header.
    pub l4_off: usize,
    /// IPv4 total length.
    pub tot_len: u16,
}

/// A frame as its family's leaf parsed it (`T`: its TCP, UDP or SCTP tuple, `M`: its ICMP
/// message, each the family's own or a reference to it), as each hook's dispatch takes it
/// (`ingress::frame`, `egress::frame`, `out_dnat::frame`, `xdp::frame`).
pub enum Frame<T, M> {
    /// Not for us: pass untouched, counted under this reason.
    Pass(Reason),
    /// A TCP, UDP or SCTP packet with a complete header.
    Flow(T),
    /// An ICMP message (errors about translated flows are translated too).
    Icmp(M),
}

/// An IPv4 frame, parsed.
pub type Parsed = Frame<Tuple, Icmp>;

impl Frame<(), ()> {
    /// The frame of a family whose parse leaves the tuple (or the ICMP message) in `t`.
    #[inline(always)]
    pub fn of<T>(self, t: &T) -> Frame<&T, &T> {
        match self {
            Frame::Pass(r) => Frame::Pass(r),
            Frame::Flow(()) => Frame::Flow(t),
            Frame::Icmp(()) => Frame::Icmp(t),
        }
    }
}

/// A frame's network layer, by its Ethernet type: each program's entry reads it once and
/// runs the flow of that family (or passes the frame).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum L3 {
    Ipv4,
    Ipv6,
    /// Anything else: passed untouched.
    Other,
}

/// The frame's [`L3`]: in place when the Ethernet header is (always, but for a frame
/// shorter than it), else through the load helper; a frame without an Ethernet type is
/// malformed.
#[inline(always)]
pub fn l3<P: Packet>(ctx: &P) -> Result<L3, Reason> {
    let ethertype = match at::<_, [u8; ETH_HLEN]>(ctx, 0) {
        Some(h) => rd16(h as *const u8, 12),
        None => ctx.load::<u16>(12).map_err(malformed)?,
    };
    Ok(if ethertype == ETH_P_IP_BE {
        L3::Ipv4
    } else if ethertype == ETH_P_IPV6_BE {
        L3::Ipv6
    } else {
        L3::Other
    })
}

const IPPROTO_ICMP: u8 = 1;

#[inline(always)]
fn malformed<E>(_: E) -> Reason {
    Reason(R_MALFORMED)
}

/// SCTP chunk types that open, answer, end and abort an association (RFC 9260 3.2).
pub const SCTP_INIT: u8 = 1;
pub const SCTP_INIT_ACK: u8 = 2;
pub const SCTP_ABORT: u8 = 6;
pub const SCTP_SHUTDOWN: u8 = 7;
pub const SCTP_SHUTDOWN_ACK: u8 = 8;
pub const SCTP_SHUTDOWN_COMPLETE: u8 = 14;

/// An SCTP packet's first chunk in TCP's terms, so one conntrack serves both: INIT opens
/// (SYN), INIT ACK answers (SYN ACK), ABORT resets (RST), SHUTDOWN, SHUTDOWN ACK and
/// SHUTDOWN COMPLETE close one way (FIN), anything else goes on (ACK). INIT, INIT ACK and
/// SHUTDOWN COMPLETE are alone in their packet (RFC 9260 6.10); a bundled ABORT or
/// SHUTDOWN behind DATA is seen by the next packet or the idle timeout, as the kernel's
/// conntrack reads only what it must.
#[inline(always)]
pub fn sctp_flags(chunk: u8) -> u8 {
    const SYN: u8 = 0x02;
    const ACK: u8 = 0x10;
    const FIN: u8 = 0x01;
    const RST: u8 = 0x04;
    match chunk {
        SCTP_INIT => SYN,
        SCTP_INIT_ACK => SYN | ACK,
        SCTP_ABORT => RST | ACK,
        SCTP_SHUTDOWN | SCTP_SHUTDOWN_ACK | SCTP_SHUTDOWN_COMPLETE => FIN | ACK,
        _ => ACK,
    }
}

/// Parses an IPv4 TCP/UDP/SCTP/ICMP packet (the frame's [`l3`] said IPv4). Other protocols
/// and fragments pass; a truncated or inconsistent IPv4/L4 header is an error (the
/// kernel's ip_rcv would drop it too).
#[inline(always)]
pub fn parse_ipv4<P: Packet>(ctx: &P, len: u32) -> Result<Parsed, Reason> {
    match parse_direct(ctx, len)? {
        Some(p) => Ok(p),
        None => parse_loaded(ctx, len),
    }
}

/// The addresses `(saddr_be, daddr_be)` of a whole, unfragmented IPv4 TCP or UDP packet
/// without options, read in place from its IP header alone; `None` for anything else. For
/// such a packet [`parse_ipv4`] gives a flow with these addresses (its checks pass: the L4
/// header is within `tot_len`, within the frame), so a hook may judge it by its addresses
/// before the parse (XDP's early pass, `xlb_xdp`).
#[inline(always)]
pub fn plain_ends<P: Packet>(ctx: &P, len: u32) -> Option<(u32, u32)> {
    let h = at::<_, [u8; L4_OFF]>(ctx, 0)? as *const u8;
    // SAFETY: within the L4_OFF bytes checked above.
    let (vihl, proto) = unsafe { (*h.add(ETH_HLEN), *h.add(ETH_HLEN + 9)) };
    let l4_len = match proto {
        IPPROTO_TCP => 20,
        IPPROTO_UDP => 8,
        _ => return None,
    };
    let tot_len = u16::from_be(rd16(h, ETH_HLEN + 2)) as usize;
    let frag = u16::from_be(rd16(h, ETH_HLEN + 6));
    if vihl != 0x45
        || frag & 0x3fff != 0
        || tot_len < 20 + l4_len
        || (len as usize) < ETH_HLEN + tot_len
    {
        return None;
    }
    Some((rd32(h, IP_SRC_OFF), rd32(h, IP_DST_OFF)))
}

/// Reads a 16-bit field as it sits in the packet.
#[inline(always)]
fn rd16(p: *const u8, off: usize) -> u16 {
    // SAFETY: callers checked `off + 2` against data_end through `at`.
    unsafe { ld16(p, off) }
}

/// Reads a 32-bit field as it sits in the packet.
#[inline(always)]
fn rd32(p: *const u8, off: usize) -> u32 {
    // SAFETY: as in `rd16`.
    unsafe { ld32(p, off) }
}

/// The common case, read in place: `None` when it does not apply (IP options, headers not
/// linear even after a pull, a frame too short for the fixed headers), for
/// [`parse_loaded`] to judge.
#[inline(always)]
fn parse_direct<P: Packet>(ctx: &P, len: u32) -> Result<Option<Parsed>, Reason> {
    let Some(h) = at::<_, [u8; L4_OFF]>(ctx, 0) else {
        return Ok(None);
    };
    let h = h as *const u8;
    // SAFETY: within the L4_OFF bytes checked above.
    let vihl = unsafe { *h.add(ETH_HLEN) };
    if vihl != 0x45 {
        return Ok(None);
    }
    let len = len as usize;
    let tot_len = u16::from_be(rd16(h, ETH_HLEN + 2)) as usize;
    if tot_len == 0 {
        return Ok(Some(Parsed::Pass(Reason(R_PASS))));
    }
    if tot_len < 20 || len < ETH_HLEN + tot_len {
        return Err(Reason(R_MALFORMED));
    }
    let frag = u16::from_be(rd16(h, ETH_HLEN + 6));
    // SAFETY: as above.
    let proto = unsafe { *h.add(ETH_HLEN + 9) };
    let (l4_len, csum_rel, need) = match proto {
        IPPROTO_TCP => (20, 16, DIRECT_TCP),
        IPPROTO_UDP => (8, 6, DIRECT_UDP),
        IPPROTO_SCTP => (16, 8, DIRECT_SCTP),
        IPPROTO_ICMP => (8, 2, 0),
        _ => return Ok(Some(Parsed::Pass(Reason(R_PASS)))),
    };
    if frag & 0x3fff != 0 {
        return Ok(Some(Parsed::Pass(Reason(R_FRAGMENT))));
    }
    if tot_len < 20 + l4_len {
        return Err(Reason(R_MALFORMED));
    }
    let saddr_be = rd32(h, IP_SRC_OFF);
    let daddr_be = rd32(h, IP_DST_OFF);
    if proto == IPPROTO_ICMP {
        return Ok(Some(Parsed::Icmp(Icmp {
            saddr_be,
            daddr_be,
            l4_off: L4_OFF,
            tot_len: tot_len as u16,
        })));
    }
    // The L4 header is within the packet (tot_len says so): bring it in place if it is not.
    let Some((sport_be, dport_be, tcp_flags)) =
        l4_direct::<_, [u8; DIRECT_UDP], [u8; DIRECT_TCP], [u8; DIRECT_SCTP]>(
            ctx, proto, L4_OFF, need,
        )
    else {
        return Ok(None);
    };
    Ok(Some(Parsed::Flow(Tuple {
        saddr_be,
        daddr_be,
        sport_be,
        dport_be,
        proto,
        l4_off: L4_OFF,
        csum_off: L4_OFF + csum_rel,
        tot_len: tot_len as u16,
        df: frag & 0x4000 != 0,
        tcp_flags,
        direct: true,
    })))
}

/// The direct parse's L4 step, both families (IPv6's `v6/parse.rs` too): the L4 header at
/// `l4` brought in place (pulled into the linear area if the hook can; `need`: the bytes
/// the protocol needs), its ports and TCP flags (SCTP's first chunk in TCP's terms). `U`,
/// `T`, `S`: the bytes up to the end of UDP's, TCP's and SCTP's header (`[u8; N]`), UDP's
/// first and the others' on their paths only, so the bounds checks stay two constant ones
/// (merged into one at a register offset, the verifier would refuse them without
/// CAP_PERFMON). `None`: not in place even after a pull.
#[inline(always)]
pub(crate) fn l4_direct<P: Packet, U, T, S>(
    ctx: &P,
    proto: u8,
    l4: usize,
    need: usize,
) -> Option<(u16, u16, u8)> {
    let mut p = l4_in_place::<_, U>(ctx, need)?;
    let mut tcp_flags = 0;
    if proto == IPPROTO_TCP {
        let q = l4_in_place::<_, T>(ctx, need)?;
        // SAFETY: TCP's header is in place.
        tcp_flags = unsafe { *q.add(l4 + 13) };
        p = q;
    } else if proto == IPPROTO_SCTP {
        let q = l4_in_place::<_, S>(ctx, need)?;
        // SAFETY: SCTP's common header and its first chunk's header are in place.
        tcp_flags = sctp_flags(unsafe { *q.add(l4 + 12) });
        p = q;
    }
    Some((rd16(p, l4), rd16(p, l4 + 2), tcp_flags))
}

/// The bytes of `H` in place, pulled into the linear area first if the hook can.
#[inline(always)]
fn l4_in_place<P: Packet, H>(ctx: &P, need: usize) -> Option<*const u8> {
    if let Some(p) = at::<_, H>(ctx, 0) {
        return Some(p as *const u8);
    }
    if !ctx.pull(need as u32) {
        return None;
    }
    at::<_, H>(ctx, 0).map(|p| p as *const u8)
}

/// Any IPv4 packet, through the load helper.
#[inline(always)]
fn parse_loaded<P: Packet>(ctx: &P, len: u32) -> Result<Parsed, Reason> {
    let len = len as usize;
    let vihl: u8 = ctx.load(ETH_HLEN).map_err(malformed)?;
    let ihl = ((vihl & 0x0f) as usize) * 4;
    if vihl >> 4 != 4 || ihl < 20 {
        return Err(Reason(R_MALFORMED));
    }
    let tot_len = u16::from_be(ctx.load::<u16>(ETH_HLEN + 2).map_err(malformed)?) as usize;
    if tot_len == 0 {
        // BIG TCP (a GRO packet over 64 KB) has no IPv4 length: not ours to judge.
        return Ok(Parsed::Pass(Reason(R_PASS)));
    }
    if tot_len < ihl || len < ETH_HLEN + tot_len {
        return Err(Reason(R_MALFORMED));
    }
    let frag = u16::from_be(ctx.load::<u16>(ETH_HLEN + 6).map_err(malformed)?);
    let proto: u8 = ctx.load(ETH_HLEN + 9).map_err(malformed)?;
    let (l4_len, csum_rel) = match proto {
        IPPROTO_TCP => (20, 16),
        IPPROTO_UDP => (8, 6),
        IPPROTO_SCTP => (16, 8),
        IPPROTO_ICMP => (8, 2),
        _ => return Ok(Parsed::Pass(Reason(R_PASS))),
    };
    // More-fragments set or a non-zero offset: ports are not (all) visible.
    if frag & 0x3fff != 0 {
        return Ok(Parsed::Pass(Reason(R_FRAGMENT)));
    }
    if tot_len < ihl + l4_len {
        return Err(Reason(R_MALFORMED));
    }
    let l4_off = ETH_HLEN + ihl;
    if proto == IPPROTO_ICMP {
        return Ok(Parsed::Icmp(Icmp {
            saddr_be: ctx.load(IP_SRC_OFF).map_err(malformed)?,
            daddr_be: ctx.load(IP_DST_OFF).map_err(malformed)?,
            l4_off,
            tot_len: tot_len as u16,
        }));
    }
    // One load for both addresses, one for the ports (and the TCP flags): each load is a
    // helper call, and this runs for every packet.
    let addrs: [u32; 2] = ctx.load(IP_SRC_OFF).map_err(malformed)?;
    let (ports, tcp_flags) = if proto == IPPROTO_TCP {
        let h: [u8; 14] = ctx.load(l4_off).map_err(malformed)?;
        ([h[0], h[1], h[2], h[3]], h[13])
    } else if proto == IPPROTO_SCTP {
        let h: [u8; 13] = ctx.load(l4_off).map_err(malformed)?;
        ([h[0], h[1], h[2], h[3]], sctp_flags(h[12]))
    } else {
        (ctx.load::<[u8; 4]>(l4_off).map_err(malformed)?, 0)
    };
    Ok(Parsed::Flow(Tuple {
        saddr_be: addrs[0],
        daddr_be: addrs[1],
        sport_be: u16::from_ne_bytes([ports[0], ports[1]]),
        dport_be: u16::from_ne_bytes([ports[2], ports[3]]),
        proto,
        l4_off,
        csum_off: l4_off + csum_rel,
        tot_len: tot_len as u16,
        df: frag & 0x4000 != 0,
        tcp_flags,
        direct: false,
    }))
}
