//! The raw `bpf(2)` call, for the commands aya 0.14 does not offer (batch map operations,
//! link detach, the link id list).

/// `bpf(cmd, attr, sizeof attr)`: the kernel's answer (a new descriptor for some commands),
/// or the error it set.
///
/// `A` must be `#[repr(C)]` with every byte defined (explicit padding fields): the kernel
/// refuses a nonzero byte past the fields it knows for the command.
///
/// # Safety
/// Every pointer inside `attr` must be valid for what `cmd` does with it (read or written,
/// for the sizes `attr` gives) for the duration of the call.
pub unsafe fn bpf<A>(cmd: libc::c_long, attr: &mut A) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, exclusively borrowed value of the size passed; the kernel
    // reads it and writes back only within it; the pointers inside it are the caller's.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut A,
            std::mem::size_of::<A>() as u32,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r)
}
