//! Address and port rewrites with incremental IPv4 and L4 checksum updates.

use lb_common::{
    CT_F_OUT_DNAT, CT_F_PORT_IN, CtValue, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP, R_REWRITE_FAILED,
    crc32c,
};

use crate::{
    family::{Ends, Family, View},
    packet::{L4Sum, Packet, at, csum_add, csum_apply, diff2, diff4, ld16, ld32, st16, st32},
    parse::{
        DIRECT_SCTP, DIRECT_TCP, DIRECT_UDP, ETH_HLEN, IP_CSUM_OFF, IP_DST_OFF, IP_SRC_OFF, L4_OFF,
        Tuple,
    },
    reason::Reason,
    shared::Shared,
};

/// The destination address: rewritten at tc ingress, before routing, as netfilter's DNAT
/// (PREROUTING) and the un-SNAT of a masqueraded reply.
pub const DADDR: u8 = 1;
/// The destination port, likewise.
pub const DPORT: u8 = 2;
/// The source address: rewritten at tc egress, after routing and netfilter, as netfilter's
/// SNAT (POSTROUTING) and the un-DNAT of a reply.
pub const SADDR: u8 = 4;
/// The source port, likewise; at ingress too for a flow whose client port is remapped there
/// (`CT_F_PORT_IN`: netfilter sees the remapped port both ways).
pub const SPORT: u8 = 8;
/// The destination side.
pub const DST: u8 = DADDR | DPORT;
/// The source side.
pub const SRC: u8 = SADDR | SPORT;
/// Both sides: XDP, when it redirects a packet past the stack; tc egress for a reply (its
/// destination is already the client's, unless the client port was remapped at ingress).
pub const BOTH: u8 = DST | SRC;

/// tc ingress (and XDP into the stack) on a packet of a tracked flow toward its backend:
/// the destination side, and the client port when it is remapped at ingress (both
/// families: the rewrite itself is the family's, [`Family::apply`]).
#[inline(always)]
pub fn forward_in<F: Family, P: L4Sum>(
    ctx: &P,
    t: &F,
    to: &Shared<'_, F::Value>,
) -> Result<(), Reason> {
    if to.flags() & CT_F_PORT_IN != 0 {
        t.apply::<P, { DST | SPORT }>(ctx, to)
    } else {
        t.apply::<P, DST>(ctx, to)
    }
}

/// tc ingress (and XDP into the stack) on a reply: the destination side (the client, when
/// the flow was SNATed), but the client port as netfilter knows it when it was remapped at
/// ingress (restored at egress).
#[inline(always)]
pub fn reply_in<F: Family, P: L4Sum>(
    ctx: &P,
    t: &F,
    to: &Shared<'_, F::Value>,
) -> Result<(), Reason> {
    if to.flags() & CT_F_OUT_DNAT != 0 {
        // The node's own flow (DNATed at egress): its reply crosses no egress.
        t.apply::<P, BOTH>(ctx, to)
    } else if to.flags() & CT_F_PORT_IN != 0 {
        t.apply::<P, DADDR>(ctx, to)
    } else {
        t.apply::<P, DST>(ctx, to)
    }
}

/// Rewrites the `PART` ([`DST`], [`SRC`] or [`BOTH`]) of the packet's tuple into the one a
/// conntrack entry holds: destination (DNAT to the backend, or back to the client) and
/// source (SNAT, or the frontend of a reply).
#[inline(always)]
pub fn apply<P: Packet, const PART: u8>(
    ctx: &P,
    t: &Tuple,
    to: &Shared<'_, CtValue>,
) -> Result<(), Reason> {
    if t.direct {
        let r = if t.proto == IPPROTO_TCP {
            in_place::<P, DIRECT_TCP, { L4_OFF + 16 }, PART>(ctx, t, to.lend())
        } else if t.proto == IPPROTO_SCTP {
            in_place::<P, DIRECT_SCTP, { L4_OFF + 8 }, PART>(ctx, t, to.lend())
        } else {
            in_place::<P, DIRECT_UDP, { L4_OFF + 6 }, PART>(ctx, t, to.lend())
        };
        return if r == 0 { Ok(()) } else { Err(Reason(r)) };
    }
    with_helpers::<P, PART>(ctx, t, to)
}

/// The direct path: addresses, ports and the IPv4 checksum written in place, the L4
/// checksum updated once per kind of field ([`Packet::l4_csum_diff`]). `N`: the bytes that
/// must be in place; `CSUM`: the L4 checksum's offset. Returns 0, or the reason it failed.
///
/// One function per protocol, out of line: inlined, LLVM merges the TCP and UDP accesses
/// into one at a register offset, which the verifier refuses without CAP_PERFMON.
#[inline(never)]
fn in_place<P: Packet, const N: usize, const CSUM: usize, const PART: u8>(
    ctx: &P,
    t: &Tuple,
    to: Shared<'_, CtValue>,
) -> u32 {
    match in_place_inner::<P, N, CSUM, PART>(ctx, t, to.lend()) {
        Ok(()) => 0,
        Err(r) => r.0,
    }
}

#[inline(always)]
fn in_place_inner<P: Packet, const N: usize, const CSUM: usize, const PART: u8>(
    ctx: &P,
    t: &Tuple,
    to: Shared<'_, CtValue>,
) -> Result<(), Reason> {
    let p = at::<_, [u8; N]>(ctx, 0).ok_or(Reason(R_REWRITE_FAILED))? as *mut u8;
    let (saddr, daddr) = (*to.saddr(), *to.daddr());
    let mut addr = 0;
    // SAFETY (every access below): `at` checked N bytes against data_end, and every offset
    // is below N.
    unsafe {
        if PART & SADDR != 0 && saddr != t.saddr_be {
            addr = diff4(t.saddr_be, saddr);
            st32(p, IP_SRC_OFF, saddr);
        }
        if PART & DADDR != 0 && daddr != t.daddr_be {
            addr = csum_add(addr, diff4(t.daddr_be, daddr));
            st32(p, IP_DST_OFF, daddr);
        }
        if addr != 0 {
            st16(p, IP_CSUM_OFF, csum_apply(ld16(p, IP_CSUM_OFF), addr));
        }
    }
    // SAFETY: as above, the L4 header's ports are within the N bytes.
    let port = unsafe { ports_in_place::<_, _, PART>(p, L4_OFF, t, &to) };
    if N == DIRECT_SCTP {
        // No pseudo-header: only the ports are covered (N bytes hold them and the checksum).
        // SAFETY: as above.
        unsafe { sctp_csum_in_place(p, L4_OFF, CSUM, t, t.tot_len as u32 - 20) };
        return Ok(());
    }
    ctx.l4_csum_diff(CSUM, addr, port, t.proto == IPPROTO_UDP)
        .map_err(|_| Reason(R_REWRITE_FAILED))
}

/// SCTP's checksum (CRC32c, stored little-endian) after the ports at `l4` changed from the
/// packet's (`t`): updated for the change in constant time (`lb_common::crc32c`), for an
/// SCTP packet of `len` bytes. Left alone when it is zero: the kernel computes it later
/// (CHECKSUM_PARTIAL, a local socket's packet on a device that offloads it), over the ports
/// as they are then, and anything written there would spoil it.
///
/// # Safety
/// `p` is the packet's start, checked against data_end for at least `csum + 4` bytes, and
/// `l4 + 4 <= csum`.
#[inline(always)]
pub(crate) unsafe fn sctp_csum_in_place<T: Ends>(
    p: *mut u8,
    l4: usize,
    csum: usize,
    t: &T,
    len: u32,
) {
    // SAFETY: the caller checked the bytes.
    unsafe {
        let old = ports_bytes(t.sport(), t.dport());
        let new = ports_bytes(ld16(p, l4), ld16(p, l4 + 2));
        let sum = ld32(p, csum);
        if old == new || sum == 0 || len < 4 {
            return;
        }
        st32(p, csum, sum ^ port_delta(old, new, len - 4).to_le());
    }
}

/// `lb_common::crc32c::port_delta`, each of its five steps a call of [`xlb_crc32c_step`].
#[inline(always)]
fn port_delta(old: [u8; 4], new: [u8; 4], tail: u32) -> u32 {
    crc32c::port_delta_by(|step, reg| xlb_crc32c_step(step, reg), old, new, tail)
}

/// One step of SCTP's checksum update (`lb_common::crc32c::step`: four table lookups) as a
/// global BPF function: the linker exports it (`--export` in `.cargo/config.toml`), so its
/// BTF linkage is global and the verifier checks it once, on its own, rather than at every
/// call site with every speculative path of its lookups (see `lb_common::crc32c`).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn xlb_crc32c_step(step: u32, reg: u32) -> u32 {
    crc32c::step(step, reg)
}

/// Two ports as they sit in the packet, as the four bytes they are there.
#[inline(always)]
fn ports_bytes(sport: u16, dport: u16) -> [u8; 4] {
    let (s, d) = (sport.to_ne_bytes(), dport.to_ne_bytes());
    [s[0], s[1], d[0], d[1]]
}

/// The direct path's port rewrite, both families' (IPv6's `v6/nat.rs` too): `to`'s ports of
/// the `PART` side(s) written where they differ from the packet's (`t`) into the L4 header
/// at the constant offset `l4`. Returns their checksum diff.
///
/// # Safety
/// `p` is the packet's start, checked against data_end for at least `l4 + 4` bytes.
#[inline(always)]
pub(crate) unsafe fn ports_in_place<T: Ends, E: Ends, const PART: u8>(
    p: *mut u8,
    l4: usize,
    t: &T,
    to: &E,
) -> u32 {
    let mut port = 0;
    // SAFETY: the caller checked both ports' bytes.
    unsafe {
        if PART & SPORT != 0 && to.sport() != t.sport() {
            port = diff2(t.sport(), to.sport());
            st16(p, l4, to.sport());
        }
        if PART & DPORT != 0 && to.dport() != t.dport() {
            port = csum_add(port, diff2(t.dport(), to.dport()));
            st16(p, l4 + 2, to.dport());
        }
    }
    port
}

/// Any packet (IP options, headers not in place), through the store and checksum helpers.
#[inline(always)]
fn with_helpers<P: Packet, const PART: u8>(
    ctx: &P,
    t: &Tuple,
    to: &Shared<'_, CtValue>,
) -> Result<(), Reason> {
    let pick = |bit: u8, from: u32, to: u32| if PART & bit != 0 { to } else { from };
    let pick16 = |bit: u8, from: u16, to: u16| if PART & bit != 0 { to } else { from };
    rewrite(
        ctx,
        t,
        IP_DST_OFF,
        t.daddr_be,
        pick(DADDR, t.daddr_be, *to.daddr()),
        t.l4_off + 2,
        t.dport_be,
        pick16(DPORT, t.dport_be, to.dport()),
    )?;
    rewrite(
        ctx,
        t,
        IP_SRC_OFF,
        t.saddr_be,
        pick(SADDR, t.saddr_be, *to.saddr()),
        t.l4_off,
        t.sport_be,
        pick16(SPORT, t.sport_be, to.sport()),
    )?;
    if t.proto == IPPROTO_SCTP {
        let ports = (
            pick16(SPORT, t.sport_be, to.sport()),
            pick16(DPORT, t.dport_be, to.dport()),
        );
        let len = t.tot_len as u32 - (t.l4_off - ETH_HLEN) as u32;
        let (old, new) = (
            ports_word(t.sport_be, t.dport_be),
            ports_word(ports.0, ports.1),
        );
        sctp_csum_with_helpers(ctx, t.csum_off, len, old, new)?;
    }
    Ok(())
}

/// [`sctp_csum_in_place`] through the load and store helpers, both families' (IPv6's
/// `v6/nat.rs` too): the checksum at `csum` of the SCTP packet of `len` bytes whose ports
/// (their four bytes as they sit, [`ports_word`]) were `old` and are `new`. Out of line:
/// rare, and its locals stay off its callers' frames (and five arguments at most, a
/// `u32` back: a BPF call passes no more in registers).
#[inline(always)]
pub(crate) fn sctp_csum_with_helpers<P: Packet>(
    ctx: &P,
    csum: usize,
    len: u32,
    old: u32,
    new: u32,
) -> Result<(), Reason> {
    match sctp_csum_out_of_line(ctx, csum, len, old, new) {
        0 => Ok(()),
        r => Err(Reason(r)),
    }
}

#[inline(never)]
fn sctp_csum_out_of_line<P: Packet>(ctx: &P, csum: usize, len: u32, old: u32, new: u32) -> u32 {
    let Ok(sum) = ctx.load::<u32>(csum) else {
        return R_REWRITE_FAILED;
    };
    if old == new || sum == 0 || len < 4 {
        return 0;
    }
    let delta = port_delta(old.to_ne_bytes(), new.to_ne_bytes(), len - 4);
    match ctx.store(csum, &(sum ^ delta.to_le())) {
        Ok(()) => 0,
        Err(_) => R_REWRITE_FAILED,
    }
}

/// Two ports as the four bytes they are in the packet, read as one native word.
#[inline(always)]
pub(crate) fn ports_word(sport: u16, dport: u16) -> u32 {
    u32::from_ne_bytes(ports_bytes(sport, dport))
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn rewrite<P: Packet>(
    ctx: &P,
    t: &Tuple,
    addr_off: usize,
    old_addr: u32,
    new_addr: u32,
    port_off: usize,
    old_port: u16,
    new_port: u16,
) -> Result<(), Reason> {
    let failed = |_| Reason(R_REWRITE_FAILED);
    let udp = t.proto == IPPROTO_UDP;
    // SCTP's checksum covers no address, and its ports through CRC32c (the caller's).
    let inet = t.proto != IPPROTO_SCTP;
    if old_addr != new_addr {
        if inet {
            ctx.l4_csum_replace(t.csum_off, old_addr, new_addr, 4, true, udp)
                .map_err(failed)?;
        }
        ctx.l3_csum_replace(IP_CSUM_OFF, old_addr, new_addr)
            .map_err(failed)?;
        ctx.store(addr_off, &new_addr).map_err(failed)?;
    }
    if old_port != new_port {
        if inet {
            ctx.l4_csum_replace(t.csum_off, old_port as u32, new_port as u32, 2, false, udp)
                .map_err(failed)?;
        }
        ctx.store(port_off, &new_port).map_err(failed)?;
    }
    Ok(())
}
