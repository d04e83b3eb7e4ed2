//! `BPF_MAP_UPDATE_BATCH` and `BPF_MAP_LOOKUP_BATCH` on a map's file descriptor: many
//! entries in one syscall (kernel 5.6+ for hash and array maps). aya 0.14 has no batch API,
//! so this is the raw `bpf(2)` call ([`super::sys_bpf`]); a kernel without it answers EINVAL
//! or ENOTSUPP and the caller writes (or reads) one by one.

use std::os::fd::BorrowedFd;

use bytemuck::Pod;

use super::sys_bpf::{Batch, Bpf, Kernel, Lookup};

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
    update_on(&Kernel, fd, keys, values, value_size)
}

/// [`update`] through `sys`.
fn update_on<K: Pod>(
    sys: &impl Bpf,
    fd: BorrowedFd<'_>,
    keys: &[K],
    values: &[u8],
    value_size: usize,
) -> Result<(), (usize, std::io::Error)> {
    let mut done = 0;
    while done < keys.len() {
        let n = (keys.len() - done).min(CHUNK);
        let batch = Batch {
            keys: bytemuck::cast_slice(&keys[done..done + n]),
            values: &values[done * value_size..(done + n) * value_size],
        };
        if let Err((written, e)) = sys.update_batch(fd, batch, n as u32) {
            return Err((done + (written as usize).min(n), e));
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
    each: impl FnMut(usize, &[u8], &[u8]),
) -> std::io::Result<usize> {
    lookup_on(&Kernel, fd, (key_size, value_size), chunk, each)
}

/// [`lookup`] through `sys`.
fn lookup_on(
    sys: &impl Bpf,
    fd: BorrowedFd<'_>,
    (key_size, value_size): (usize, usize),
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
        let lookup = Lookup {
            at: (!first).then_some(at.as_slice()),
            next: &mut next,
            keys: &mut keys,
            values: &mut values,
            count: chunk as u32,
        };
        let (n, r) = sys.lookup_batch(fd, lookup);
        let n = (n as usize).min(chunk);
        // ENOENT: the end of the map, with the last entries read.
        let end = match r {
            Ok(()) => n == 0,
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

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;
    use crate::datapath::sys_bpf::fake::FakeMap;

    /// A descriptor for the fake to ignore.
    fn some_fd() -> std::fs::File {
        std::fs::File::open("/dev/null").expect("/dev/null")
    }

    fn values(keys: &[u32]) -> Vec<u8> {
        keys.iter().flat_map(|k| (k * 10).to_ne_bytes()).collect()
    }

    #[test]
    fn an_update_that_fails_half_way_says_how_many_entries_were_written() {
        let fake = FakeMap::new(4, 4, CHUNK + 10);
        let keys: Vec<u32> = (0..2 * CHUNK as u32).collect();
        let file = some_fd();
        let r = update_on(&fake, file.as_fd(), &keys, &values(&keys), 4);
        let (done, e) = r.expect_err("the map is full in the second batch");
        assert_eq!(done, CHUNK + 10, "the first batch and 10 of the second");
        assert_eq!(e.raw_os_error(), Some(libc::E2BIG));
        assert_eq!(fake.calls.get(), 2, "one syscall a batch");
        let held: Vec<Vec<u8>> = fake.entries().into_keys().collect();
        let mut first: Vec<Vec<u8>> = keys[..CHUNK + 10]
            .iter()
            .map(|k| k.to_ne_bytes().to_vec())
            .collect();
        first.sort();
        assert_eq!(held, first, "the first ones written, none after");
    }

    #[test]
    fn a_kernel_without_batches_is_told_apart_before_anything_is_written() {
        let mut fake = FakeMap::new(4, 4, 100);
        fake.batches = false;
        let keys: Vec<u32> = (0..50).collect();
        let file = some_fd();
        let (done, e) =
            update_on(&fake, file.as_fd(), &keys, &values(&keys), 4).expect_err("no batch updates");
        assert_eq!((done, e.raw_os_error()), (0, Some(libc::EINVAL)));
        let read = lookup_on(&fake, file.as_fd(), (4, 4), 8, |_, _, _| {});
        let e = read.expect_err("no batch lookups");
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        assert!(fake.entries().is_empty());
    }

    #[test]
    fn a_lookup_reads_each_entry_once_across_chunks_to_the_end() {
        let fake = FakeMap::new(4, 4, 100);
        let keys: Vec<u32> = (0..10).collect();
        let file = some_fd();
        update_on(&fake, file.as_fd(), &keys, &values(&keys), 4).expect("written");
        let (mut sizes, mut read) = (Vec::new(), Vec::new());
        let total = lookup_on(&fake, file.as_fd(), (4, 4), 3, |n, k, v| {
            sizes.push(n);
            for i in 0..n {
                let key = u32::from_ne_bytes(k[i * 4..i * 4 + 4].try_into().expect("4"));
                let value = u32::from_ne_bytes(v[i * 4..i * 4 + 4].try_into().expect("4"));
                read.push((key, value));
            }
        })
        .expect("read");
        assert_eq!(total, 10);
        assert_eq!(sizes, [3, 3, 3, 1], "chunks of 3, the last one with ENOENT");
        let want: Vec<(u32, u32)> = keys.iter().map(|k| (*k, k * 10)).collect();
        assert_eq!(read, want);
    }

    #[test]
    fn a_lookup_that_fails_mid_walk_returns_the_error() {
        let mut fake = FakeMap::new(4, 4, 100);
        let keys: Vec<u32> = (0..10).collect();
        let file = some_fd();
        update_on(&fake, file.as_fd(), &keys, &values(&keys), 4).expect("written");
        fake.fail_lookup_at = Some(7);
        let mut seen = 0;
        let r = lookup_on(&fake, file.as_fd(), (4, 4), 4, |n, _, _| seen += n);
        assert_eq!(r.expect_err("EIO").raw_os_error(), Some(libc::EIO));
        assert_eq!(seen, 4, "the chunk before the failure was handed over");
    }
}
