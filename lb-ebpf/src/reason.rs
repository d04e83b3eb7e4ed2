//! Reason codes and the per-CPU counters they bump.

use crate::maps::{XLB_BESTAT_V1, XLB_STATS_V4, XLB_SVCSTAT_V1};

/// A reason code from `lb_common::counters`.
#[derive(Clone, Copy)]
pub struct Reason(pub u32);

impl Reason {
    /// Adds one packet of `len` bytes to this reason's counter on the current CPU.
    #[inline(always)]
    pub fn count(self, len: u32) {
        if let Some(c) = XLB_STATS_V4.get_ptr_mut(self.0) {
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

/// A program's verdict type: tc's `i32` actions, XDP's `u32` ones.
pub trait Action: Copy {
    fn to_bits(self) -> u32;
    fn from_bits(bits: u32) -> Self;
}

impl Action for i32 {
    #[inline(always)]
    fn to_bits(self) -> u32 {
        self as u32
    }
    #[inline(always)]
    fn from_bits(bits: u32) -> Self {
        bits as i32
    }
}

impl Action for u32 {
    #[inline(always)]
    fn to_bits(self) -> u32 {
        self
    }
    #[inline(always)]
    fn from_bits(bits: u32) -> Self {
        bits
    }
}

/// A program's outcome: `Ok((action, reason))`, the packet goes on (possibly rewritten) or is
/// sent back as an answer; `Err(reason)`, it is dropped. Either way `reason` is counted.
pub type Outcome<A> = Result<(A, Reason), Reason>;

/// An [`Outcome`] as one register, for the paths kept out of line (each has its own stack
/// frame, so the big rare paths do not add up in the main one).
#[inline(always)]
pub fn pack<A: Action>(o: Outcome<A>) -> u64 {
    match o {
        Ok((action, reason)) => ((action.to_bits() as u64) << 32) | reason.0 as u64,
        Err(reason) => (1 << 63) | reason.0 as u64,
    }
}

/// The [`Outcome`] [`pack`] made (flags in bits 61–62 are the caller's and ignored here).
#[inline(always)]
pub fn unpack<A: Action>(v: u64) -> Outcome<A> {
    let reason = Reason(v as u32);
    if v >> 63 != 0 {
        Err(reason)
    } else {
        Ok((A::from_bits(((v >> 32) & 0x1fff_ffff) as u32), reason))
    }
}
