//! Address and port rewrites with incremental checksum updates, both families (generic over
//! `Family`; the addresses and IPv4's header checksum are the family's leaf's).

use lb_common::{
    CT_F_OUT_DNAT, CT_F_PORT_IN, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP, R_REWRITE_FAILED, crc32c,
};

use crate::{
    family::{Ends, Family, View},
    packet::{L4Sum, Packet, at, csum_add, diff2, ld16, ld32, st16, st32},
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
        rewrite::<F, P, { DST | SPORT }>(ctx, t, to)
    } else {
        rewrite::<F, P, DST>(ctx, t, to)
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
        rewrite::<F, P, BOTH>(ctx, t, to)
    } else if to.flags() & CT_F_PORT_IN != 0 {
        rewrite::<F, P, DADDR>(ctx, t, to)
    } else {
        rewrite::<F, P, DST>(ctx, t, to)
    }
}

/// Rewrites the `PART` ([`DST`], [`SRC`] or [`BOTH`]) of the packet's tuple into the one a
/// conntrack entry holds: destination (DNAT to the backend, or back to the client) and
/// source (SNAT, or the frontend of a reply). Both families: in place for the common packet
/// ([`Family::direct`]), else through the store and checksum helpers (IP options or
/// extension headers: the L4 header at a variable offset); the addresses are the family's
/// ([`Family::addrs_in_place`], [`Family::addrs_with_helpers`]).
#[inline(always)]
pub fn rewrite<F: Family, P: L4Sum, const PART: u8>(
    ctx: &P,
    t: &F,
    to: &Shared<'_, F::Value>,
) -> Result<(), Reason> {
    if t.direct() {
        let r = if t.proto() == IPPROTO_TCP {
            in_place::<F, P, F::DirectTcp, 16, PART>(ctx, t, to.lend())
        } else if t.proto() == IPPROTO_SCTP {
            if !P::SCTP {
                return Err(Reason(R_REWRITE_FAILED));
            }
            in_place::<F, P, F::DirectSctp, 8, PART>(ctx, t, to.lend())
        } else {
            in_place::<F, P, F::DirectUdp, 6, PART>(ctx, t, to.lend())
        };
        return if r == 0 { Ok(()) } else { Err(Reason(r)) };
    }
    with_helpers::<F, P, PART>(ctx, t, to)
}

/// The direct path: addresses, ports (and IPv4's header checksum) written in place, the L4
/// checksum updated once per kind of field ([`Packet::l4_csum_diff`]). `H`: the bytes that
/// must be in place (`[u8; N]`); `CSUM`: the L4 checksum's offset in the L4 header (8:
/// SCTP's). Returns 0, or the reason it failed.
///
/// One function per protocol, out of line: inlined, LLVM merges the TCP and UDP accesses
/// into one at a register offset, which the verifier refuses without CAP_PERFMON.
#[inline(never)]
fn in_place<F: Family, P: Packet, H, const CSUM: usize, const PART: u8>(
    ctx: &P,
    t: &F,
    to: Shared<'_, F::Value>,
) -> u32 {
    match in_place_inner::<F, P, H, CSUM, PART>(ctx, t, to.lend()) {
        Ok(()) => 0,
        Err(r) => r.0,
    }
}

#[inline(always)]
fn in_place_inner<F: Family, P: Packet, H, const CSUM: usize, const PART: u8>(
    ctx: &P,
    t: &F,
    to: Shared<'_, F::Value>,
) -> Result<(), Reason> {
    let p = at::<_, H>(ctx, 0).ok_or(Reason(R_REWRITE_FAILED))? as *mut u8;
    // SAFETY (both): `at` checked the bytes of `H` against data_end: the IP header and the
    // L4 header's ports and checksum.
    let addr = unsafe { t.addrs_in_place::<PART>(p, &to) };
    let port = unsafe { ports_in_place::<_, _, PART>(p, F::L4_OFF, t, &to) };
    if CSUM == 8 {
        // SCTP: no pseudo-header, only the ports are covered (`H` holds them and the
        // checksum).
        // SAFETY: as above.
        unsafe { sctp_csum_in_place(p, F::L4_OFF, F::L4_OFF + CSUM, t, t.l4_len()) };
        return Ok(());
    }
    ctx.l4_csum_diff(F::L4_OFF + CSUM, addr, port, t.proto() == IPPROTO_UDP)
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

/// Any packet (IP options, extension headers, headers not in place), through the store and
/// checksum helpers: the addresses (the family's), the ports, then the L4 checksum at once
/// (SCTP's CRC32c for the ports alone).
#[inline(always)]
fn with_helpers<F: Family, P: L4Sum, const PART: u8>(
    ctx: &P,
    t: &F,
    to: &Shared<'_, F::Value>,
) -> Result<(), Reason> {
    let failed = |_| Reason(R_REWRITE_FAILED);
    let addr = t.addrs_with_helpers::<P, PART>(ctx, to)?;
    let sport = if PART & SPORT != 0 {
        to.sport()
    } else {
        t.sport()
    };
    let dport = if PART & DPORT != 0 {
        to.dport()
    } else {
        t.dport()
    };
    let mut port = 0;
    if sport != t.sport() {
        port = diff2(t.sport(), sport);
        ctx.store(t.l4_off(), &sport).map_err(failed)?;
    }
    if dport != t.dport() {
        port = csum_add(port, diff2(t.dport(), dport));
        ctx.store(t.l4_off() + 2, &dport).map_err(failed)?;
    }
    if t.proto() == IPPROTO_SCTP {
        if !P::SCTP {
            return Err(Reason(R_REWRITE_FAILED));
        }
        let (old, new) = (ports_word(t.sport(), t.dport()), ports_word(sport, dport));
        return sctp_csum_with_helpers(ctx, t.csum_off(), t.l4_len(), old, new);
    }
    ctx.l4_sum(t.csum_off(), addr, port, t.proto() == IPPROTO_UDP)
        .map_err(failed)
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
