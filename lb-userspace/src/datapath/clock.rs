//! The datapath's clock: `CLOCK_MONOTONIC_COARSE`, which `bpf_ktime_get_coarse_ns` reads and
//! the conntrack and affinity entries' timestamps are on.

/// Now on the datapath's clock, in ns.
pub fn monotonic_coarse_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; CLOCK_MONOTONIC_COARSE is what bpf_ktime_get_coarse_ns
    // reads.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
