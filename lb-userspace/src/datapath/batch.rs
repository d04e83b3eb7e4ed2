//! `BPF_MAP_UPDATE_BATCH` and `BPF_MAP_LOOKUP_BATCH` on a map's file descriptor: many
//! entries in one syscall (kernel 5.6+ for hash and array maps). aya 0.14 has no batch API,
//! so this is the raw `bpf(2)` call; a kernel without it answers EINVAL or ENOTSUPP and the
//! caller writes (or reads) one by one.

use std::os::fd::{AsRawFd, BorrowedFd};

use bytemuck::Pod;

use super::sys_bpf::bpf;

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

/// `enum bpf_cmd`'s BPF_MAP_LOOKUP_BATCH.
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
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
        if let Err(e) = unsafe { bpf(BPF_MAP_UPDATE_BATCH, &mut attr) } {
            return Err((done + (attr.count as usize).min(n), e));
        }
        done += n;
    }
    Ok(())
}

/// Reads every entry of the map behind `fd` (keys `key_size` bytes, values `value_size`
/// bytes; for a per-CPU map that is the value rounded up to 8 bytes, times the possible
/// CPUs) with `BPF_MAP_LOOKUP_BATCH`, `chunk` entries a syscall, and hands each chunk's keys
/// and values to `each` (`each(n, keys, values)`). A hash map is read bucket by bucket, so
/// entries added or deleted meanwhile never restart the walk; each entry is read at most
/// once. Returns the entries read.
pub fn lookup(
    fd: BorrowedFd<'_>,
    key_size: usize,
    value_size: usize,
    chunk: usize,
    mut each: impl FnMut(usize, &[u8], &[u8]),
) -> std::io::Result<usize> {
    let chunk = chunk.max(1);
    let mut keys = vec![0u8; chunk * key_size];
    let mut values = vec![0u8; chunk * value_size];
    // Where the next call starts: a key for arrays, a bucket index for hash maps.
    let token = key_size.max(8);
    let (mut at, mut next) = (vec![0u8; token], vec![0u8; token]);
    let mut first = true;
    let mut total = 0;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { at.as_ptr() as u64 },
            out_batch: next.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` points at buffers for `chunk` keys and values and two position
        // tokens of at least the key's size, all outliving the call; the kernel writes at
        // most `count` entries and one token.
        let r = unsafe { bpf(BPF_MAP_LOOKUP_BATCH, &mut attr) };
        let n = (attr.count as usize).min(chunk);
        // ENOENT: the end of the map, with the last entries read.
        let end = match r {
            Ok(_) => n == 0,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
            Err(e) => return Err(e),
        };
        if n > 0 {
            each(n, &keys[..n * key_size], &values[..n * value_size]);
            total += n;
        }
        if end {
            return Ok(total);
        }
        std::mem::swap(&mut at, &mut next);
        first = false;
    }
}

/// The bytes of `values`, for [`update`].
pub fn bytes<V: Pod>(values: &[V]) -> &[u8] {
    bytemuck::cast_slice(values)
}
