//! ICMP errors about translated flows (fragmentation needed, port unreachable, time
//! exceeded): the quoted inner header is restored to what the flow's peer sent, and the
//! outer header readdressed to that peer, so path-MTU discovery and refusals work through a
//! service. As netfilter's NAT of a related packet, in two halves: tc ingress restores the
//! destination side (the outer destination, the quote's source), tc egress the source side
//! (the outer source, the quote's destination), so the node's conntrack finds the quote's
//! flow as it saw it.

use aya_ebpf::programs::TcContext;
use lb_common::{IPPROTO_SCTP, IPPROTO_UDP, R_REWRITE_FAILED};

use crate::{
    conntrack::{self, Ct},
    family::Ends,
    maps::FlowScratch,
    nat::{DST, SRC},
    parse::{ETH_HLEN, IP_CSUM_OFF, IP_DST_OFF, IP_SRC_OFF, Icmp, Tuple},
    reason::Reason,
    reject::{fold, load_quote, quote_diff, sum16},
};

const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_TIME_EXCEEDED: u8 = 11;
/// The quoted IPv4 header (no options) and the first 8 bytes of its L4 header.
const INNER: usize = 28;

#[inline(always)]
fn failed<E>(_: E) -> Reason {
    Reason(R_REWRITE_FAILED)
}

/// One's-complement update of a 16-bit checksum for `from` replaced by `to` (RFC 1624);
/// both 12 bytes.
#[inline(always)]
fn csum_update(old: u16, from: &[u8], to: &[u8]) -> u16 {
    let mut acc = (!old) as u32;
    let mut i = 0;
    while i + 1 < 12 && i + 1 < from.len() && i + 1 < to.len() {
        let f = ((from[i] as u32) << 8) | from[i + 1] as u32;
        let t = ((to[i] as u32) << 8) | to[i + 1] as u32;
        acc += (!f & 0xffff) + t;
        i += 2;
    }
    u16::from_be_bytes(fold(acc))
}

/// Translates the `PART` side ([`DST`] at ingress, [`SRC`] at egress) of an ICMP error
/// whose quoted packet belongs to a tracked flow. Returns the flow's entry when it did;
/// `None` leaves the message alone. The quote is worked on in the scratch `s` (the stack is
/// too small for it).
#[inline(always)]
pub fn translate<const PART: u8>(
    ctx: &TcContext,
    m: &Icmp,
    s: &mut FlowScratch,
) -> Result<Option<Ct<Tuple>>, Reason> {
    let icmp_type: u8 = ctx.load(m.l4_off).map_err(failed)?;
    if icmp_type != ICMP_DEST_UNREACH && icmp_type != ICMP_TIME_EXCEEDED {
        return Ok(None);
    }
    let inner_off = m.l4_off + 8;
    if (m.tot_len as usize) + ETH_HLEN < inner_off + INNER {
        return Ok(None);
    }
    load_quote(ctx, inner_off, &mut s.quote_old)?;
    let b = &s.quote_old;
    // TCP, UDP and SCTP quotes: their ports lead the L4 header. (A quoted SCTP checksum,
    // beyond the 28 bytes, is left as sent: nothing checks a quote's CRC32c.)
    if b[0] != 0x45 || (b[9] != 6 && b[9] != IPPROTO_UDP && b[9] != IPPROTO_SCTP) {
        return Ok(None);
    }
    let proto = b[9];
    let isrc = u32::from_ne_bytes([b[12], b[13], b[14], b[15]]);
    let idst = u32::from_ne_bytes([b[16], b[17], b[18], b[19]]);
    let isport = u16::from_ne_bytes([b[20], b[21]]);
    let idport = u16::from_ne_bytes([b[22], b[23]]);

    // The quoted packet went one way of a flow; the entry of the other way tells how to
    // restore it.
    let Some(v) =
        conntrack::quoted::<Tuple, PART>(&mut s.fwd_key, &isrc, &idst, isport, idport, proto)
    else {
        return Ok(None);
    };
    // Inner: source ← the entry's destination, destination ← the entry's source.
    s.quote_new = s.quote_old;
    let n = &mut s.quote_new;
    if PART & DST != 0 {
        n[12..16].copy_from_slice(&v.daddr().to_ne_bytes());
        n[20..22].copy_from_slice(&v.dport().to_ne_bytes());
    }
    if PART & SRC != 0 {
        n[16..20].copy_from_slice(&v.saddr().to_ne_bytes());
        n[22..24].copy_from_slice(&v.sport().to_ne_bytes());
    }
    n[10] = 0;
    n[11] = 0;
    let c = fold(sum16(&n[..20], 0));
    n[10] = c[0];
    n[11] = c[1];
    let b = &s.quote_old;
    if proto == IPPROTO_UDP && (b[26] != 0 || b[27] != 0) {
        let mut u = csum_update(u16::from_be_bytes([b[26], b[27]]), &b[12..24], &n[12..24]);
        if u == 0 {
            u = 0xffff;
        }
        n[26..28].copy_from_slice(&u.to_be_bytes());
    }
    let diff = quote_diff(&mut s.quote_old, &mut s.quote_new)?;
    ctx.l4_csum_replace(m.l4_off + 2, 0, diff as u64, 0)
        .map_err(failed)?;
    ctx.store(inner_off, &s.quote_new, 0).map_err(failed)?;

    // Outer: to the flow's peer; from the frontend (or SNAT address) where the error came
    // from the translated end itself, as Linux's conntrack does.
    let out_dst = *v.daddr();
    let out_src = if m.saddr_be == idst {
        *v.saddr()
    } else {
        m.saddr_be
    };
    if PART & DST != 0 {
        rewrite_outer(ctx, IP_DST_OFF, m.daddr_be, out_dst)?;
    }
    if PART & SRC != 0 {
        rewrite_outer(ctx, IP_SRC_OFF, m.saddr_be, out_src)?;
    }
    Ok(Some(v))
}

#[inline(always)]
fn rewrite_outer(ctx: &TcContext, off: usize, old: u32, new: u32) -> Result<(), Reason> {
    if old != new {
        ctx.l3_csum_replace(IP_CSUM_OFF, old as u64, new as u64, 4)
            .map_err(failed)?;
        ctx.store(off, &new, 0).map_err(failed)?;
    }
    Ok(())
}
