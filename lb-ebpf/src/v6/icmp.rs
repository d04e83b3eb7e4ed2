//! ICMPv6 errors about translated flows (destination unreachable, Packet Too Big, time
//! exceeded): the quoted inner packet is restored to what the flow's peer sent, the outer
//! header readdressed to that peer, the ICMPv6 checksum (pseudo-header included) updated:
//! refusals and path-MTU discovery work through an IPv6 service, as `icmp.rs` for IPv4.

use aya_ebpf::{helpers::bpf_csum_diff, programs::TcContext};
use lb_common::{IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP, R_REWRITE_FAILED};

use super::{
    maps::FlowScratch6,
    parse::{IP6_DST_OFF, IP6_L4_OFF, IP6_SRC_OFF, Tuple6},
    reject::QUOTE,
};
use crate::{
    addr::eq6,
    conntrack::{self, Ct},
    family::Ends,
    nat::{DST, SRC},
    packet::{Packet, csum_add, csum_apply, diff4},
    reason::Reason,
    reject::{load_quote, quote_diff},
};

const ICMPV6_DEST_UNREACH: u8 = 1;
const ICMPV6_TIME_EXCEED: u8 = 3;

#[inline(always)]
fn failed<E>(_: E) -> Reason {
    Reason(R_REWRITE_FAILED)
}

#[inline(always)]
fn words(b: &[u8; QUOTE], at: usize) -> [u32; 4] {
    let w = |i: usize| u32::from_ne_bytes([b[at + i], b[at + i + 1], b[at + i + 2], b[at + i + 3]]);
    [w(0), w(4), w(8), w(12)]
}

#[inline(always)]
fn put(b: &mut [u8; QUOTE], at: usize, a: &[u32; 4]) {
    for (i, w) in a.iter().enumerate() {
        let x = w.to_ne_bytes();
        b[at + 4 * i] = x[0];
        b[at + 4 * i + 1] = x[1];
        b[at + 4 * i + 2] = x[2];
        b[at + 4 * i + 3] = x[3];
    }
}

/// Translates the `PART` side (as IPv4's: [`DST`] at ingress, [`SRC`] at egress) of an
/// ICMPv6 error (`t`: its outer addresses, type and offset) whose quoted packet belongs to
/// a tracked flow. Returns the flow's entry when it did; `None` leaves
/// the message alone (other types, NDP and echo among them). The quote is worked on in the
/// scratch `s`.
#[inline(always)]
pub fn translate<const PART: u8>(
    ctx: &TcContext,
    t: &Tuple6,
    s: &mut FlowScratch6,
) -> Result<Option<Ct<Tuple6>>, Reason> {
    if t.icmp_type < ICMPV6_DEST_UNREACH || t.icmp_type > ICMPV6_TIME_EXCEED {
        return Ok(None);
    }
    let inner_off = t.l4_off as usize + 8;
    if IP6_L4_OFF + (t.payload_len as usize) < inner_off + QUOTE {
        return Ok(None);
    }
    load_quote(ctx, inner_off, &mut s.quote_old)?;
    let b = &s.quote_old;
    // A quoted packet with extension headers is left alone (its ports are further in).
    let proto = b[6];
    if b[0] >> 4 != 6 || (proto != IPPROTO_TCP && proto != IPPROTO_UDP && proto != IPPROTO_SCTP) {
        return Ok(None);
    }
    let isrc = words(b, 8);
    let idst = words(b, 24);
    let isport = u16::from_ne_bytes([b[40], b[41]]);
    let idport = u16::from_ne_bytes([b[42], b[43]]);
    // The entry of the other way tells how to restore it (as IPv4's).
    let Some(v) =
        conntrack::quoted::<Tuple6, PART>(&mut s.fwd_key, &isrc, &idst, isport, idport, proto)
    else {
        return Ok(None);
    };
    s.quote_new = s.quote_old;
    let n = &mut s.quote_new;
    if PART & DST != 0 {
        put(n, 8, v.daddr());
        n[40..42].copy_from_slice(&v.dport().to_ne_bytes());
    }
    if PART & SRC != 0 {
        put(n, 24, v.saddr());
        n[42..44].copy_from_slice(&v.sport().to_ne_bytes());
    }
    if proto == IPPROTO_UDP {
        quoted_udp_checksum(s)?;
    }
    let quote_diff = quote_diff(&mut s.quote_old, &mut s.quote_new)?;
    // Outer: to the flow's peer; from the frontend where the error came from the translated
    // end itself, as Linux's conntrack does.
    let from_end = PART & SRC != 0 && eq6(&t.saddr_be, &idst);
    let out_src = if from_end { v.saddr() } else { &t.saddr_be };
    let out_dst = if PART & DST != 0 {
        v.daddr()
    } else {
        &t.daddr_be
    };
    let addr_diff = csum_add(diff16(&t.saddr_be, out_src), diff16(&t.daddr_be, out_dst));
    ctx.l4_csum_diff(t.csum_off as usize, addr_diff, quote_diff, false)
        .map_err(failed)?;
    ctx.store(inner_off, &s.quote_new, 0).map_err(failed)?;
    if from_end {
        ctx.store(IP6_SRC_OFF, v.saddr(), 0).map_err(failed)?;
    }
    if PART & DST != 0 {
        ctx.store(IP6_DST_OFF, v.daddr(), 0).map_err(failed)?;
    }
    Ok(Some(v))
}

/// The quoted UDP header's checksum (unless 0: none), updated for the quote's new
/// addresses and ports (`quote_old` → `quote_new` of the scratch).
#[inline(always)]
fn quoted_udp_checksum(s: &mut FlowScratch6) -> Result<(), Reason> {
    let b = &s.quote_old;
    if b[46] == 0 && b[47] == 0 {
        return Ok(());
    }
    // The quoted UDP checksum covers its pseudo-header's addresses and its ports (bytes
    // 8..44 of the quote): their diff, by the helper (a loop over a map value at a
    // variable index is refused without CAP_PERFMON).
    // SAFETY: 36 bytes from offset 8 of both QUOTE-byte buffers, 4-aligned.
    let d = unsafe {
        bpf_csum_diff(
            s.quote_old.as_mut_ptr().add(8) as *mut u32,
            36,
            s.quote_new.as_mut_ptr().add(8) as *mut u32,
            36,
            0,
        )
    };
    if d < 0 {
        return Err(Reason(R_REWRITE_FAILED));
    }
    let b = &s.quote_old;
    let mut u = csum_apply(u16::from_ne_bytes([b[46], b[47]]), d as u32);
    if u == 0 {
        u = 0xffff;
    }
    let u = u.to_ne_bytes();
    s.quote_new[46] = u[0];
    s.quote_new[47] = u[1];
    Ok(())
}

/// The partial-sum change of an IPv6 address going `from` → `to`.
#[inline(always)]
pub(super) fn diff16(from: &[u32; 4], to: &[u32; 4]) -> u32 {
    let mut d = 0;
    for i in 0..4 {
        d = csum_add(d, diff4(from[i], to[i]));
    }
    d
}
