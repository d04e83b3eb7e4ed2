//! Address and port rewrites with incremental IPv4 and L4 checksum updates.

use lb_common::{CtValue, IPPROTO_UDP, R_REWRITE_FAILED};

use crate::{
    packet::Packet,
    parse::{IP_CSUM_OFF, IP_DST_OFF, IP_SRC_OFF, Tuple},
    reason::Reason,
};

/// Rewrites the packet's tuple into the one a conntrack entry holds: destination (DNAT to
/// the backend, or back to the client) and source (SNAT, or the frontend of a reply).
#[inline(always)]
pub fn apply<P: Packet>(ctx: &P, t: &Tuple, to: &CtValue) -> Result<(), Reason> {
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
    if old_addr != new_addr {
        ctx.l4_csum_replace(t.csum_off, old_addr, new_addr, 4, true, udp)
            .map_err(failed)?;
        ctx.l3_csum_replace(IP_CSUM_OFF, old_addr, new_addr)
            .map_err(failed)?;
        ctx.store(addr_off, &new_addr).map_err(failed)?;
    }
    if old_port != new_port {
        ctx.l4_csum_replace(t.csum_off, old_port as u32, new_port as u32, 2, false, udp)
            .map_err(failed)?;
        ctx.store(port_off, &new_port).map_err(failed)?;
    }
    Ok(())
}
