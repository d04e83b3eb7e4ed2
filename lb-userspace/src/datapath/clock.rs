//! The datapath's clock: `CLOCK_MONOTONIC_COARSE`, which `bpf_ktime_get_coarse_ns` reads and
//! the conntrack and affinity entries' timestamps are on.

/// Now on the datapath's clock, in ns.
pub fn monotonic_coarse_ns() -> u64 {
    use nix::time::{ClockId, clock_gettime};
    // CLOCK_MONOTONIC_COARSE is what bpf_ktime_get_coarse_ns reads; it cannot fail.
    clock_gettime(ClockId::CLOCK_MONOTONIC_COARSE).map_or(0, |ts| {
        ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
    })
}
