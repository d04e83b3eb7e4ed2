//! The datapath's clock: CLOCK_MONOTONIC_COARSE (`bpf_ktime_get_coarse_ns`), a few
//! nanoseconds a read instead of a clocksource read per packet. Its tick (a few
//! milliseconds) is far below the grain of anything timed here (a second for refreshes,
//! seconds for idle flows and affinity). Every stored time comes from this one clock, and
//! every comparison saturates, so a time read by another CPU a tick ahead never makes a
//! flow look idle.

use aya_ebpf::helpers::bpf_ktime_get_coarse_ns;

/// Now, in nanoseconds of CLOCK_MONOTONIC_COARSE.
#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: helper without arguments or side effects.
    unsafe { bpf_ktime_get_coarse_ns() }
}

/// Nanoseconds from `then` to `now`, 0 if `then` is later.
#[inline(always)]
pub fn since(now: u64, then: u64) -> u64 {
    now.saturating_sub(then)
}
