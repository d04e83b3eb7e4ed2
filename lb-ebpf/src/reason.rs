//! Reason codes and the per-CPU counters they bump.

use crate::maps::{XLB_BESTAT_V1, XLB_STATS_V3, XLB_SVCSTAT_V1};

/// A reason code from `lb_common::counters`.
#[derive(Clone, Copy)]
pub struct Reason(pub u32);

impl Reason {
    /// Adds one packet of `len` bytes to this reason's counter on the current CPU.
    #[inline(always)]
    pub fn count(self, len: u32) {
        if let Some(c) = XLB_STATS_V3.get_ptr_mut(self.0) {
            // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
            unsafe {
                (*c).packets += 1;
                (*c).bytes += len as u64;
            }
        }
    }
}

/// Adds one packet of `len` bytes to the counters of service `svc_id` and of the backend
/// `backend_id` it was forwarded to (or came from), on the current CPU.
#[inline(always)]
pub fn count_service(svc_id: u32, backend_id: u32, len: u32) {
    if let Some(c) = XLB_BESTAT_V1.get_ptr_mut(backend_id) {
        // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
        unsafe {
            (*c).packets += 1;
            (*c).bytes += len as u64;
        }
    }
    if let Some(c) = XLB_SVCSTAT_V1.get_ptr_mut(svc_id) {
        // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
        unsafe {
            (*c).packets += 1;
            (*c).bytes += len as u64;
        }
    }
}
