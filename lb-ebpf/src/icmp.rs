//! ICMP and ICMPv6 errors about translated flows (destination unreachable, fragmentation
//! needed / Packet Too Big, time exceeded), one code for both families: the quoted inner
//! packet is restored to what the flow's peer sent, and the outer header readdressed to
//! that peer, so path-MTU discovery and refusals work through a service. As netfilter's NAT
//! of a related packet, in two halves: tc ingress restores the destination side (the outer
//! destination, the quote's source), tc egress the source side (the outer source, the
//! quote's destination), so the node's conntrack finds the quote's flow as it saw it.
//!
//! Each family's leaf gives what differs ([`Family`], [`Message`]): which types quote a
//! packet, the quote's layout (the offsets of its protocol, addresses and ports; a header
//! without options or extension headers), the quoted header's own checksum (IPv4's), the
//! outer addresses' rewrite, and whether ICMP's checksum covers the pseudo-header
//! (ICMPv6's).

use aya_ebpf::programs::TcContext;
use lb_common::{IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP, R_REWRITE_FAILED};

use crate::{
    conntrack::{self, Ct},
    family::{Addr, Ends, Family, Message},
    nat::{DST, SRC},
    packet::{Packet, csum_apply},
    quote::Quote,
    reason::Reason,
};

/// The ICMP header before the quote: type, code, checksum and one word.
const ICMP_HLEN: usize = 8;

/// Translates the `PART` side ([`DST`] at ingress, [`SRC`] at egress) of an ICMP error `m`
/// whose quoted packet belongs to a tracked flow. Returns the flow's entry when it did;
/// `None` leaves the message alone (other types, NDP and echo among them). The quote is
/// worked on in the scratch `s` (the stack is too small for it).
#[inline(always)]
pub fn translate<F: Family, const PART: u8>(
    ctx: &TcContext,
    m: &F::Icmp,
    s: &mut F::Scratch,
) -> Result<Option<Ct<F>>, Reason> {
    if !m.quotes_packet(ctx)? {
        return Ok(None);
    }
    let inner_off = m.icmp_off() + ICMP_HLEN;
    if m.end() < inner_off + F::Quote::LEN {
        return Ok(None);
    }
    let (old, new, key) = F::quotes(s);
    old.load(ctx, inner_off)?;
    let b = old.as_ref();
    // TCP, UDP and SCTP quotes: their ports lead the L4 header. (A quoted SCTP checksum,
    // beyond the quote, is left as sent: nothing checks a quote's CRC32c.)
    let proto = b[F::Q_PROTO];
    if !F::quote_plain(old)
        || (proto != IPPROTO_TCP && proto != IPPROTO_UDP && proto != IPPROTO_SCTP)
    {
        return Ok(None);
    }
    let isrc = F::Addr::read(b, F::Q_SRC);
    let idst = F::Addr::read(b, F::Q_DST);
    let isport = u16::from_ne_bytes([b[F::Q_L4], b[F::Q_L4 + 1]]);
    let idport = u16::from_ne_bytes([b[F::Q_L4 + 2], b[F::Q_L4 + 3]]);

    // The quoted packet went one way of a flow; the entry of the other way tells how to
    // restore it.
    let Some(v) = conntrack::quoted::<F, PART>(key, &isrc, &idst, isport, idport, proto) else {
        return Ok(None);
    };
    // Inner: source ← the entry's destination, destination ← the entry's source.
    *new = *old;
    let n = new.as_mut();
    if PART & DST != 0 {
        v.daddr().write(n, F::Q_SRC);
        n[F::Q_L4..F::Q_L4 + 2].copy_from_slice(&v.dport().to_ne_bytes());
    }
    if PART & SRC != 0 {
        v.saddr().write(n, F::Q_DST);
        n[F::Q_L4 + 2..F::Q_L4 + 4].copy_from_slice(&v.sport().to_ne_bytes());
    }
    F::quote_header_sum(new);
    if proto == IPPROTO_UDP {
        quoted_udp_sum::<F>(old, new)?;
    }
    let quote_diff = F::Quote::diff(old, new, 0, F::Quote::LEN)?;

    // Outer: to the flow's peer; from the frontend (or SNAT address) where the error came
    // from the translated end itself, as Linux's conntrack does.
    let (src, dst) = m.addrs();
    let to_src = if src.same(&idst) { v.saddr() } else { src };
    let addr_diff = F::readdress::<_, PART>(ctx, (src, dst), (to_src, v.daddr()))?;
    let pseudo = if F::ICMP_PSEUDO { addr_diff } else { 0 };
    ctx.l4_csum_diff(m.icmp_off() + 2, pseudo, quote_diff, false)
        .map_err(failed)?;
    ctx.store(inner_off, new, 0).map_err(failed)?;
    Ok(Some(v))
}

#[inline(always)]
fn failed<E>(_: E) -> Reason {
    Reason(R_REWRITE_FAILED)
}

/// The quoted UDP header's checksum (unless 0: none), updated for the quote's new
/// addresses and ports (`old` → `new`): they are the bytes from the source address to the
/// end of the ports.
#[inline(always)]
fn quoted_udp_sum<F: Family>(old: &mut F::Quote, new: &mut F::Quote) -> Result<(), Reason> {
    let at = F::Q_L4 + 6;
    let b = old.as_ref();
    let sum = u16::from_ne_bytes([b[at], b[at + 1]]);
    if sum == 0 {
        return Ok(());
    }
    let d = F::Quote::diff(old, new, F::Q_SRC, F::Q_L4 + 4 - F::Q_SRC)?;
    let mut u = csum_apply(sum, d);
    if u == 0 {
        u = 0xffff;
    }
    new.as_mut()[at..at + 2].copy_from_slice(&u.to_ne_bytes());
    Ok(())
}
