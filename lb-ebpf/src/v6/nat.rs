//! IPv6 address and port rewrites: no IP header checksum, the L4 checksum updated for the
//! pseudo-header's addresses and the ports (one combined diff each, as IPv4's rewrites).

use lb_common::{CtValue6, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP, R_REWRITE_FAILED};

use super::parse::{
    DIRECT6_SCTP, DIRECT6_TCP, DIRECT6_UDP, IP6_DST_OFF, IP6_L4_OFF, IP6_SRC_OFF, Tuple6,
};
use crate::{
    addr::eq6,
    family::Ends,
    nat::{
        DADDR, DPORT, SADDR, SPORT, ports_in_place, ports_word, sctp_csum_in_place,
        sctp_csum_with_helpers,
    },
    packet::{L4Sum, Packet, at, csum_add, diff2, diff4, st32},
    reason::Reason,
    shared::Shared,
};

/// The partial-sum change of an IPv6 address going `from` → `to`.
#[inline(always)]
pub fn diff16(from: &[u32; 4], to: &[u32; 4]) -> u32 {
    let mut d = 0;
    for i in 0..4 {
        d = csum_add(d, diff4(from[i], to[i]));
    }
    d
}

#[inline(always)]
fn failed<E>(_: E) -> Reason {
    Reason(R_REWRITE_FAILED)
}

/// Rewrites the packet's tuple into the one a conntrack entry holds (as IPv4's
/// `nat::apply`): in place for the common packet ([`Tuple6::direct`]), else through the
/// store and checksum helpers (the L4 header sits behind extension headers, at a variable
/// offset).
#[inline(always)]
pub fn apply<P: L4Sum, const PART: u8>(
    ctx: &P,
    t: &Tuple6,
    to: &Shared<'_, CtValue6>,
) -> Result<(), Reason> {
    if t.direct != 0 {
        let r = if t.proto == IPPROTO_TCP {
            in_place::<P, DIRECT6_TCP, { IP6_L4_OFF + 16 }, PART>(ctx, t, to.lend())
        } else if t.proto == IPPROTO_SCTP {
            in_place::<P, DIRECT6_SCTP, { IP6_L4_OFF + 8 }, PART>(ctx, t, to.lend())
        } else {
            in_place::<P, DIRECT6_UDP, { IP6_L4_OFF + 6 }, PART>(ctx, t, to.lend())
        };
        return if r == 0 { Ok(()) } else { Err(Reason(r)) };
    }
    with_helpers::<P, PART>(ctx, t, to)
}

/// The direct path: addresses and ports written in place, the L4 checksum updated once
/// per kind of field at the constant offset `CSUM` ([`Packet::l4_csum_diff`]); `N`: the
/// bytes that must be in place. Returns 0, or the reason it failed. One function per
/// protocol, out of line, as IPv4's (merged, the accesses would be at a register offset).
#[inline(never)]
fn in_place<P: Packet, const N: usize, const CSUM: usize, const PART: u8>(
    ctx: &P,
    t: &Tuple6,
    to: Shared<'_, CtValue6>,
) -> u32 {
    match in_place_inner::<P, N, CSUM, PART>(ctx, t, to.lend()) {
        Ok(()) => 0,
        Err(r) => r.0,
    }
}

#[inline(always)]
fn in_place_inner<P: Packet, const N: usize, const CSUM: usize, const PART: u8>(
    ctx: &P,
    t: &Tuple6,
    to: Shared<'_, CtValue6>,
) -> Result<(), Reason> {
    let p = at::<_, [u8; N]>(ctx, 0).ok_or(Reason(R_REWRITE_FAILED))? as *mut u8;
    let mut addr = 0;
    // SAFETY (every access below): `at` checked N bytes against data_end, and every offset
    // is below N.
    unsafe {
        if PART & SADDR != 0 && !eq6(&t.saddr_be, to.saddr()) {
            addr = diff16(&t.saddr_be, to.saddr());
            for i in 0..4 {
                st32(p, IP6_SRC_OFF + 4 * i, to.saddr()[i]);
            }
        }
        if PART & DADDR != 0 && !eq6(&t.daddr_be, to.daddr()) {
            addr = csum_add(addr, diff16(&t.daddr_be, to.daddr()));
            for i in 0..4 {
                st32(p, IP6_DST_OFF + 4 * i, to.daddr()[i]);
            }
        }
    }
    // SAFETY: as above.
    let port = unsafe { ports_in_place::<_, _, PART>(p, IP6_L4_OFF, t, &to) };
    if N == DIRECT6_SCTP {
        // SAFETY: as above (N bytes hold the ports and the checksum).
        unsafe { sctp_csum_in_place(p, IP6_L4_OFF, CSUM, t, t.payload_len) };
        return Ok(());
    }
    ctx.l4_csum_diff(CSUM, addr, port, t.proto == IPPROTO_UDP)
        .map_err(failed)
}

/// Any packet (extension headers, headers not in place), through the store and checksum
/// helpers.
#[inline(always)]
fn with_helpers<P: L4Sum, const PART: u8>(
    ctx: &P,
    t: &Tuple6,
    to: &Shared<'_, CtValue6>,
) -> Result<(), Reason> {
    let mut addr = 0;
    if PART & SADDR != 0 && !eq6(&t.saddr_be, to.saddr()) {
        addr = diff16(&t.saddr_be, to.saddr());
        ctx.store(IP6_SRC_OFF, to.saddr()).map_err(failed)?;
    }
    if PART & DADDR != 0 && !eq6(&t.daddr_be, to.daddr()) {
        addr = csum_add(addr, diff16(&t.daddr_be, to.daddr()));
        ctx.store(IP6_DST_OFF, to.daddr()).map_err(failed)?;
    }
    let mut port = 0;
    if PART & SPORT != 0 && to.sport() != t.sport_be {
        port = diff2(t.sport_be, to.sport());
        ctx.store(t.l4_off as usize, &to.sport()).map_err(failed)?;
    }
    if PART & DPORT != 0 && to.dport() != t.dport_be {
        port = csum_add(port, diff2(t.dport_be, to.dport()));
        ctx.store(t.l4_off as usize + 2, &to.dport())
            .map_err(failed)?;
    }
    if t.proto == IPPROTO_SCTP {
        // No pseudo-header: the ports only, through CRC32c (behind extension headers).
        let now = (
            if PART & SPORT != 0 {
                to.sport()
            } else {
                t.sport_be
            },
            if PART & DPORT != 0 {
                to.dport()
            } else {
                t.dport_be
            },
        );
        let len = t.payload_len - (t.l4_off - IP6_L4_OFF as u32);
        let (old, new) = (ports_word(t.sport_be, t.dport_be), ports_word(now.0, now.1));
        return sctp_csum_with_helpers(ctx, t.csum_off as usize, len, old, new);
    }
    ctx.l4_sum(t.csum_off as usize, addr, port, t.proto == IPPROTO_UDP)
        .map_err(failed)
}
