//! The heap after a full sync: large temporaries mapped on their own, freed pages given
//! back to the kernel.

/// The allocator's settings for the agent's life, set before its threads start:
///
/// - allocations of 128 KiB and more are mapped on their own and unmapped when freed: glibc
///   otherwise raises that threshold each time such a block is freed, so a full sync's large
///   temporaries (sorted vectors, the parsed file) come from the heap and leave it larger
///   (at 10,000 × 10 the peak was 11 MiB higher);
/// - one heap (arena) for every thread: the file source's thread parses the model, the loop
///   keeps it, and with a heap per thread each keeps its own free blocks among live ones (at
///   10,000 × 10, 5 MiB of RSS; the agent's threads allocate little at the same time).
pub(super) fn heap_settings() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes allocator settings.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Drops the resident pages of the embedded eBPF object once it is loaded (the loader
/// parsed it into structures of its own): they are clean pages of the binary's read-only
/// data, about 6 MB of RSS otherwise, read back from the file if anything touches them again
/// (`xlb trace` does, the agent does not).
pub(super) fn drop_object_pages(object: &'static [u8]) {
    // SAFETY: sysconf only reads a setting.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        p if p > 0 => p as usize,
        _ => return,
    };
    let (at, len) = (object.as_ptr() as usize, object.len());
    // The whole pages inside the object only: the pages at either end hold other data too.
    let start = at.div_ceil(page) * page;
    let end = (at + len) / page * page;
    if end > start {
        // SAFETY: the range is whole pages of a read-only, file-backed mapping of the
        // binary: dropping them changes nothing a reader sees (the next read faults the
        // same bytes back in from the file).
        let rc =
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        if rc != 0 {
            tracing::debug!(
                "madvise of the embedded eBPF object: {}",
                std::io::Error::last_os_error()
            );
        }
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
