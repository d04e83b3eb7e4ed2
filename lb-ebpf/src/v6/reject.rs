//! IPv6's part of the answers built in place of the packet (`reject.rs`, one code for both
//! families): the IPv6 header of an answer and the pseudo-header sum its ICMPv6 and TCP
//! checksums start from.

use aya_ebpf::programs::TcContext;
use lb_common::R_REWRITE_FAILED;

use super::parse::{IP6_DST_OFF, IP6_SRC_OFF, Tuple6};
use crate::{parse::ETH_HLEN, reason::Reason};

/// One's-complement sum of an address's 16-bit words (network order words).
#[inline(always)]
pub fn sum_addr(a: &[u32; 4], mut sum: u32) -> u32 {
    for w in a {
        let b = w.to_ne_bytes();
        sum += (((b[0] as u32) << 8) | b[1] as u32) + (((b[2] as u32) << 8) | b[3] as u32);
    }
    sum
}

/// The pseudo-header's sum for `len` bytes of `proto` from `src` to `dst`.
#[inline(always)]
pub fn pseudo(src: &[u32; 4], dst: &[u32; 4], len: u32, proto: u8) -> u32 {
    sum_addr(dst, sum_addr(src, 0)) + len + proto as u32
}

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
