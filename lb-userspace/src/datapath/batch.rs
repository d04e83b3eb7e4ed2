//! `BPF_MAP_UPDATE_BATCH` on a map's file descriptor: many entries in one syscall (kernel
//! 5.6+ for hash and array maps). aya 0.14 has no batch API, so this is the raw `bpf(2)`
//! call; a kernel without it answers EINVAL or ENOTSUPP and the caller writes one by one.

use std::os::fd::{AsRawFd, BorrowedFd};

use bytemuck::Pod;

/// `union bpf_attr`'s `batch` member.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// `enum bpf_cmd`'s BPF_MAP_UPDATE_BATCH.
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

/// Entries per syscall: large enough that the syscall cost vanishes, small enough that the
/// kernel's copy of the keys and values stays a few hundred KiB.
pub const CHUNK: usize = 4096;

/// Writes `keys[i] → values[i]` (each value `value_size` bytes of `values`) with as few
/// syscalls as the kernel allows. `Err((done, error))`: the first `done` entries were
/// written, the next one failed (or the kernel has no batch updates: then `done` is 0).
pub fn update<K: Pod>(
    fd: BorrowedFd<'_>,
    keys: &[K],
    values: &[u8],
    value_size: usize,
) -> Result<(), (usize, std::io::Error)> {
    let mut done = 0;
    while done < keys.len() {
        let n = (keys.len() - done).min(CHUNK);
        let mut attr = BatchAttr {
            keys: keys[done..].as_ptr() as u64,
            values: values[done * value_size..].as_ptr() as u64,
            count: n as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` points at `n` keys and `n` values that outlive the call; the
        // kernel reads them and writes back only `attr.count`.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_UPDATE_BATCH,
                &mut attr as *mut BatchAttr,
                std::mem::size_of::<BatchAttr>() as u32,
            )
        };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            return Err((done + (attr.count as usize).min(n), e));
        }
        done += n;
    }
    Ok(())
}

/// The bytes of `values`, for [`update`].
pub fn bytes<V: Pod>(values: &[V]) -> &[u8] {
    bytemuck::cast_slice(values)
}
