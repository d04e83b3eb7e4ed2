//! The address filters (`XLB_ADDRFILT_V1`): a packet whose destination can be no frontend
//! needs no forward conntrack or service lookup, one whose source can be no backend no
//! reply lookup. One bit per hashed address in a 128 KiB array each, instead of a miss in
//! a hash map of hundreds of thousands of entries: what keeps traffic that has nothing to do
//! with services cheap. The agent sets a bit before any entry needs it and clears it a day
//! after its last address went (a TCP flow keeps its backend after its service is gone).

use lb_common::{FILTER_WORDS, filter_bit};

use crate::maps::XLB_ADDRFILT_V1;

#[inline(always)]
fn test(base: u32, addr_be: u32) -> bool {
    let bit = filter_bit(addr_be);
    XLB_ADDRFILT_V1
        .get(base + (bit >> 6))
        .is_some_and(|w| w & (1u64 << (bit & 63)) != 0)
}

/// Whether `addr_be` may be a frontend (a flow's destination, or a service's).
#[inline(always)]
pub fn maybe_frontend(addr_be: u32) -> bool {
    test(0, addr_be)
}

/// Whether `addr_be` may be a backend (the source of a flow's replies).
#[inline(always)]
pub fn maybe_backend(addr_be: u32) -> bool {
    test(FILTER_WORDS, addr_be)
}
