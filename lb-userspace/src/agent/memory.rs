//! The heap after a full sync: large temporaries mapped on their own, freed pages given
//! back to the kernel.

/// Allocations of 128 KiB and more are mapped on their own and unmapped when freed, for the
/// agent's life: glibc otherwise raises that threshold each time such a block is freed, so
/// a full sync's large temporaries (sorted vectors, the parsed file) come from the heap and
/// leave it larger (at 10,000 × 10 the peak was 11 MiB higher).
pub(super) fn fixed_mmap_threshold() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes an allocator setting.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// Gives the heap's free memory back to the kernel (a full sync's temporaries: the
/// replaced desired state, the candidates); glibc keeps it otherwise.
pub(super) fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free heap pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
        let m = libc::mallinfo2();
        tracing::info!(
            heap_in_use_kib = (m.uordblks + m.hblkhd) / 1024,
            heap_free_kib = m.fordblks / 1024,
            "memory given back"
        );
    }
}
