//! Packet parsing: Ethernet → IPv4 → TCP/UDP ports, with every length checked.

use lb_common::{IPPROTO_TCP, IPPROTO_UDP, R_FRAGMENT, R_MALFORMED, R_PASS};

use crate::{packet::Packet, reason::Reason};

pub const ETH_HLEN: usize = 14;
const ETH_P_IP_BE: u16 = 0x0800u16.to_be();
/// Offset of the IPv4 checksum.
pub const IP_CSUM_OFF: usize = ETH_HLEN + 10;
/// Offset of the IPv4 source address.
pub const IP_SRC_OFF: usize = ETH_HLEN + 12;
/// Offset of the IPv4 destination address.
pub const IP_DST_OFF: usize = ETH_HLEN + 16;

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
    /// TCP flags (0 for UDP).
    pub tcp_flags: u8,
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

pub enum Parsed {
    /// Not for us: pass untouched, counted under this reason.
    Pass(Reason),
    /// A TCP or UDP packet with a complete header.
    Flow(Tuple),
    /// An ICMP message (errors about translated flows are translated too).
    Icmp(Icmp),
}

const IPPROTO_ICMP: u8 = 1;

#[inline(always)]
fn malformed<E>(_: E) -> Reason {
    Reason(R_MALFORMED)
}

/// Parses an IPv4 TCP/UDP/ICMP packet. Non-IPv4, other protocols and fragments pass; a truncated
/// or inconsistent IPv4/L4 header is an error (the kernel's ip_rcv would drop it too).
#[inline(always)]
pub fn parse_ipv4<P: Packet>(ctx: &P) -> Result<Parsed, Reason> {
    let len = ctx.len() as usize;
    let ethertype: u16 = ctx.load(12).map_err(malformed)?;
    if ethertype != ETH_P_IP_BE {
        return Ok(Parsed::Pass(Reason(R_PASS)));
    }
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
    }))
}
