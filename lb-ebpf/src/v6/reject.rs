//! IPv6's part of the answers built in place of the packet (`reject.rs`, one code for both
//! families): the IPv6 header of an answer.

use aya_ebpf::programs::TcContext;
use lb_common::R_REWRITE_FAILED;

use super::parse::{IP6_DST_OFF, IP6_SRC_OFF, Tuple6};
use crate::{parse::ETH_HLEN, reason::Reason};

/// Writes the IPv6 header of an answer from the frontend to the client, for `payload`
/// bytes of `proto`.
#[inline(always)]
pub fn header(ctx: &TcContext, t: &Tuple6, proto: u8, payload: u16) -> Result<(), Reason> {
    let failed = |_| Reason(R_REWRITE_FAILED);
    let p = payload.to_be_bytes();
    let fixed = [0x60u8, 0, 0, 0, p[0], p[1], proto, 64];
    ctx.store(ETH_HLEN, &fixed, 0).map_err(failed)?;
    ctx.store(IP6_SRC_OFF, &t.daddr_be, 0).map_err(failed)?;
    ctx.store(IP6_DST_OFF, &t.saddr_be, 0).map_err(failed)
}
