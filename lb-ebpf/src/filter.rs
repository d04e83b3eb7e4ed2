//! The address filters (`XLB_ADDRFILT_V1`): a packet whose destination can be no frontend
//! needs no forward conntrack or service lookup, one whose source can be no backend no
//! reply lookup. One bit per hashed address in an array each (sized by the loader, four bits
//! per address the maps can hold: `lb_common::FilterSize`), instead of a miss in a hash map
//! of hundreds of thousands of entries: what keeps traffic that has nothing to do with
//! services cheap at any scale. The agent sets a bit before any entry needs it and clears it
//! a day after its last address went (a TCP flow keeps its backend after its service is
//! gone).

use lb_common::FilterSize;

use crate::maps::{XLB_ADDRFILT_V1, XLB_FILTER_LOG2};

/// The filters' size, as the loader set it (a constant to the verifier: frozen read-only
/// data).
#[inline(always)]
fn size() -> FilterSize {
    FilterSize::from_log2(XLB_FILTER_LOG2.load())
}

#[inline(always)]
fn test(base: u32, addr_be: u32) -> bool {
    let bit = size().bit(addr_be);
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
    test(size().words(), addr_be)
}
