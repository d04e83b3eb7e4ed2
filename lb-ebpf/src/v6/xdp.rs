//! IPv6's leaf of XDP: the frame parsed into the work area, then XDP's one flow
//! (`xdp.rs`); the hop limit, the layer-2 forward and the partial-checksum test that flow
//! asks of the family ([`crate::family::Family`], `family.rs` here).

use aya_ebpf::programs::XdpContext;
use lb_common::R_REWRITE_FAILED;

use super::parse::{self, IP6_L4_OFF, Tuple6};
use crate::{
    packet::{Packet, at},
    parse::ETH_HLEN,
    reason::{Carried, Reason},
    work::Work6,
    xdp::{self, write_macs},
};

/// Offset of the hop limit in the fixed header.
pub(super) const HOP_LIMIT_OFF: usize = ETH_HLEN + 7;

/// An IPv6 frame of `len` bytes at XDP: parsed into the run's IPv6 work area `w`, then
/// XDP's dispatch (`xdp::frame`).
#[inline(never)]
pub fn xdp(ctx: &XdpContext, w: &mut Work6, len: u32) -> Carried {
    let f = parse::parse6(ctx, &mut w.pkt).map(|p| p.of(&w.pkt));
    xdp::frame::<Tuple6>(ctx, f, || Ok(&mut w.flow), len)
}

/// Forwarded here, not by the kernel: the hop limit goes down by one (no IPv6 header
/// checksum), the frame gets the next hop's MACs; in place for the common packet.
#[inline(always)]
pub(super) fn forward_l2(
    ctx: &XdpContext,
    t: &Tuple6,
    hop_limit: u8,
    smac: &[u8; 6],
    dmac: &[u8; 6],
) -> Result<(), Reason> {
    if t.direct != 0
        && let Some(p) = at::<_, [u8; IP6_L4_OFF]>(ctx, 0)
    {
        let p = p as *mut u8;
        // SAFETY: every offset written is within the IP6_L4_OFF bytes `at` checked.
        unsafe {
            *p.add(HOP_LIMIT_OFF) = hop_limit - 1;
            write_macs(p, smac, dmac);
        }
        return Ok(());
    }
    let fail = |_| Reason(R_REWRITE_FAILED);
    ctx.store(HOP_LIMIT_OFF, &(hop_limit - 1)).map_err(fail)?;
    ctx.store(0, dmac).map_err(fail)?;
    ctx.store(6, smac).map_err(fail)
}
