//! The address filters (`XLB_ADDRFILT_V2`): a packet whose destination can be no frontend
//! needs no forward conntrack or service lookup, one whose source can be no backend no
//! reply lookup. One bit per hashed address in an array each (sized by the loader, four bits
//! per address the maps can hold: `lb_common::FilterSize`), instead of a miss in a hash map
//! of hundreds of thousands of entries: what keeps traffic that has nothing to do with
//! services cheap at any scale. The agent sets a bit before any entry needs it and clears it
//! a day after its last address went (a TCP flow keeps its backend after its service is
//! gone).

use lb_common::FilterSize;

use crate::maps::{XLB_ADDRFILT_V2, XLB_FILTER_LOG2};

/// The filters as the loader sized them, read once for a packet's tests (the size is a
/// load-time global: each read is a load and a shift the compiler cannot fold).
#[derive(Clone, Copy)]
pub struct Filters {
    size: FilterSize,
}

impl Filters {
    /// The filters' size, as the loader set it (frozen read-only data).
    #[inline(always)]
    pub fn load() -> Self {
        Self {
            size: FilterSize::trusted(XLB_FILTER_LOG2.load()),
        }
    }

    #[inline(always)]
    fn test(self, base: u32, bit: u32) -> bool {
        XLB_ADDRFILT_V2
            .get(base + (bit >> 6))
            .is_some_and(|w| w & (1u64 << (bit & 63)) != 0)
    }

    /// Whether the address of filter word `word` may be a frontend (a flow's destination,
    /// or a service's).
    #[inline(always)]
    pub fn frontend(self, word: u32) -> bool {
        self.test(0, self.size.bit(word))
    }

    /// Whether the address of filter word `word` may be a backend (the source of a flow's
    /// replies).
    #[inline(always)]
    pub fn backend(self, word: u32) -> bool {
        self.test(self.size.words(), self.size.back_bit(word))
    }
}

/// Whether `addr_be` may be a backend (one test: [`Filters`] for several).
#[inline(always)]
pub fn maybe_backend(addr_be: u32) -> bool {
    Filters::load().backend(addr_be)
}
