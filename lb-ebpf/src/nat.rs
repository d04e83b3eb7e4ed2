//! Address and port rewrites with incremental IPv4 and L4 checksum updates.

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    programs::TcContext,
};
use lb_common::{CtValue, IPPROTO_UDP, R_REWRITE_FAILED};

use crate::{
    parse::{IP_CSUM_OFF, IP_DST_OFF, IP_SRC_OFF, Tuple},
    reason::Reason,
};

/// Rewrites the packet's tuple into the one a conntrack entry holds: destination (DNAT to
/// the backend, or back to the client) and source (SNAT, or the frontend of a reply).
#[inline(always)]
pub fn apply(ctx: &TcContext, t: &Tuple, to: &CtValue) -> Result<(), Reason> {
    rewrite(
        ctx,
        t,
        IP_DST_OFF,
        t.daddr_be,
        to.daddr_be[0],
        t.l4_off + 2,
        t.dport_be,
        to.dport_be,
    )?;
    rewrite(
        ctx,
        t,
        IP_SRC_OFF,
        t.saddr_be,
        to.saddr_be[0],
        t.l4_off,
        t.sport_be,
        to.sport_be,
    )
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn rewrite(
    ctx: &TcContext,
    t: &Tuple,
    addr_off: usize,
    old_addr: u32,
    new_addr: u32,
    port_off: usize,
    old_port: u16,
    new_port: u16,
) -> Result<(), Reason> {
    let failed = |_| Reason(R_REWRITE_FAILED);
    // A UDP checksum of 0 means "none": keep it 0.
    let l4_flags = if t.proto == IPPROTO_UDP {
        BPF_F_MARK_MANGLED_0 as u64
    } else {
        0
    };
    if old_addr != new_addr {
        ctx.l4_csum_replace(
            t.csum_off,
            old_addr as u64,
            new_addr as u64,
            l4_flags | BPF_F_PSEUDO_HDR as u64 | 4,
        )
        .map_err(failed)?;
        ctx.l3_csum_replace(IP_CSUM_OFF, old_addr as u64, new_addr as u64, 4)
            .map_err(failed)?;
        ctx.store(addr_off, &new_addr, 0).map_err(failed)?;
    }
    if old_port != new_port {
        ctx.l4_csum_replace(t.csum_off, old_port as u64, new_port as u64, l4_flags | 2)
            .map_err(failed)?;
        ctx.store(port_off, &new_port, 0).map_err(failed)?;
    }
    Ok(())
}
