//! IPv6's leaf of XDP: the frame parsed into the work area, then XDP's dispatch and one
//! flow (`xdp.rs`, written once for both families).

use aya_ebpf::programs::XdpContext;

use super::parse::{self, Tuple6};
use crate::{reason::Carried, work::Work6, xdp};

/// An IPv6 frame of `len` bytes at XDP: parsed into the run's IPv6 work area `w`, then
/// XDP's dispatch (`xdp::frame`).
#[inline(never)]
pub fn xdp(ctx: &XdpContext, w: &mut Work6, len: u32) -> Carried {
    let f = parse::parse6(ctx, &mut w.pkt).map(|p| p.of(&w.pkt));
    xdp::frame::<Tuple6>(ctx, f, || Ok(&mut w.flow), len, None)
}
