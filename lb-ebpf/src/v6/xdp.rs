//! IPv6's leaf of XDP: the frame parsed into the work area, then XDP's one flow
//! (`xdp.rs`); the hop limit, the layer-2 forward and the partial-checksum test that flow
//! asks of the family ([`crate::family::Family`], `family.rs` here).

use aya_ebpf::{bindings::xdp_action::XDP_PASS, programs::XdpContext};
use lb_common::{R_PASS, R_REWRITE_FAILED};

use super::parse::{self, IP6_L4_OFF, Parsed6, Tuple6};
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
/// XDP's one flow; anything but TCP, UDP and SCTP passes (ICMPv6: tc translates it).
#[inline(never)]
pub fn xdp(ctx: &XdpContext, w: &mut Work6, len: u32) -> Carried {
    match parse::parse6(ctx, &mut w.pkt) {
        Ok(Parsed6::Flow) => xdp::flow(ctx, &w.pkt, || Ok(&mut w.flow), len),
        Ok(Parsed6::Icmp) => Carried::done::<u32>(Ok((XDP_PASS, Reason(R_PASS)))),
        Ok(Parsed6::Pass(r)) => Carried::done::<u32>(Ok((XDP_PASS, r))),
        Err(r) => Carried::done::<u32>(Err(r)),
    }
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
