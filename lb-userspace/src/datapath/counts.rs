//! Reads for the metrics, costed by what they return: per-CPU counter arrays summed slot by
//! slot and hash maps' entries counted with batched lookups (`BPF_MAP_LOOKUP_BATCH`: one
//! syscall per chunk of about a MiB, not one or two per entry); one by one where the kernel
//! has no batch lookups (before 5.6). A count walks at most the map's capacity.

use std::os::fd::AsFd;

use aya::maps::{HashMap, Map, MapData, MapError, PerCpuArray};
use lb_common::Counter;

use super::{DatapathError, batch, pins::Pins};

/// Bytes a batched read moves per syscall (and holds at once).
const CHUNK_BYTES: usize = 1 << 20;

/// Entries and capacity of a map.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fill {
    pub entries: u64,
    pub capacity: u32,
}

fn map_err(name: &'static str, source: MapError) -> DatapathError {
    DatapathError::Map { name, source }
}

fn batch_err(name: &'static str, io_error: std::io::Error) -> DatapathError {
    map_err(
        name,
        MapError::SyscallError(aya::sys::SyscallError {
            call: "bpf_map_lookup_batch",
            io_error,
        }),
    )
}

/// The kernel has no batched lookups for this map (older than 5.6, or its map type).
fn unsupported(e: &std::io::Error) -> bool {
    // ENOTSUPP (524) is the kernel's internal "not supported", which leaks to user space.
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::EOPNOTSUPP | 524)
    )
}

fn data<'m>(map: &'m Map, name: &'static str) -> Result<&'m MapData, DatapathError> {
    match map {
        Map::PerCpuArray(d) | Map::HashMap(d) | Map::LruHashMap(d) | Map::Array(d) => Ok(d),
        _ => Err(DatapathError::MapMissing { name }),
    }
}

/// Per-CPU counter array `name` (opened as `map`): `each(index, sum over CPUs)` for every
/// slot, in index order.
pub fn counter_sums(
    map: &Map,
    name: &'static str,
    mut each: impl FnMut(u32, Counter),
) -> Result<(), DatapathError> {
    let d = data(map, name)?;
    let cpus = aya::util::nr_cpus().map_err(|(_, e)| batch_err(name, e))?;
    let size = std::mem::size_of::<Counter>();
    let stride = size * cpus;
    let chunk = (CHUNK_BYTES / stride).max(1);
    let sum = |values: &[u8]| {
        values
            .chunks_exact(size)
            .map(bytemuck::pod_read_unaligned::<Counter>)
            .fold(Counter::default(), |a, c| Counter {
                packets: a.packets + c.packets,
                bytes: a.bytes + c.bytes,
            })
    };
    let read = batch::lookup(d.fd().as_fd(), 4, stride, chunk, |n, keys, values| {
        for i in 0..n {
            let index = bytemuck::pod_read_unaligned::<u32>(&keys[4 * i..4 * i + 4]);
            each(index, sum(&values[i * stride..(i + 1) * stride]));
        }
    });
    match read {
        Ok(_) => Ok(()),
        Err(e) if unsupported(&e) => {
            let array: PerCpuArray<&MapData, Counter> =
                PerCpuArray::try_from(map).map_err(|e| map_err(name, e))?;
            for index in 0..array.len() {
                let per_cpu = array.get(&index, 0).map_err(|e| map_err(name, e))?;
                each(index, sum(bytemuck::cast_slice(&per_cpu[..])));
            }
            Ok(())
        }
        Err(e) => Err(batch_err(name, e)),
    }
}

/// Entries and capacity of hash map `name` of `pins` (keys `K`, values `V`), counted with
/// batched lookups; where the kernel has none, by walking its keys, at most its capacity
/// of them (a walk restarts when the key it stands on is deleted).
pub fn count<K: aya::Pod, V: aya::Pod>(
    pins: &Pins,
    name: &'static str,
) -> Result<Fill, DatapathError> {
    let map = pins.map(name)?;
    let d = data(&map, name)?;
    let info = d.info().map_err(|e| map_err(name, e))?;
    let capacity = info.max_entries();
    let (key_size, value_size) = (info.key_size() as usize, info.value_size() as usize);
    let chunk = (CHUNK_BYTES / (key_size + value_size).max(1)).max(1);
    match batch::lookup(d.fd().as_fd(), key_size, value_size, chunk, |_, _, _| {}) {
        Ok(n) => Ok(Fill {
            entries: n as u64,
            capacity,
        }),
        Err(e) if unsupported(&e) => {
            let m: HashMap<&MapData, K, V> =
                HashMap::try_from(&map).map_err(|e| map_err(name, e))?;
            let entries = m.keys().take(capacity as usize).count() as u64;
            Ok(Fill { entries, capacity })
        }
        Err(e) => Err(batch_err(name, e)),
    }
}

/// Every entry of hash map `name` (opened as `map`) as (key, value), read in batches (one
/// by one where the kernel has none).
pub fn entries<K: aya::Pod + bytemuck::Pod, V: aya::Pod + bytemuck::Pod>(
    map: &Map,
    name: &'static str,
) -> Result<Vec<(K, V)>, DatapathError> {
    entries_where(map, name, |_: &K, _: &V| true)
}

/// The entries of hash map `name` (opened as `map`) that `keep` keeps, read as
/// [`entries`] reads them: a map of any size costs a few syscalls and only what is kept.
pub fn entries_where<K: aya::Pod + bytemuck::Pod, V: aya::Pod + bytemuck::Pod>(
    map: &Map,
    name: &'static str,
    mut keep: impl FnMut(&K, &V) -> bool,
) -> Result<Vec<(K, V)>, DatapathError> {
    let d = data(map, name)?;
    let (ks, vs) = (std::mem::size_of::<K>(), std::mem::size_of::<V>());
    let chunk = (CHUNK_BYTES / (ks + vs)).max(1);
    let mut out = Vec::new();
    let read = batch::lookup(d.fd().as_fd(), ks, vs, chunk, |n, keys, values| {
        out.extend(
            (0..n)
                .map(|i| {
                    (
                        bytemuck::pod_read_unaligned::<K>(&keys[i * ks..(i + 1) * ks]),
                        bytemuck::pod_read_unaligned::<V>(&values[i * vs..(i + 1) * vs]),
                    )
                })
                .filter(|(k, v)| keep(k, v)),
        );
    });
    match read {
        Ok(_) => Ok(out),
        Err(e) if unsupported(&e) => {
            let m: HashMap<&MapData, K, V> =
                HashMap::try_from(map).map_err(|e| map_err(name, e))?;
            let capacity = d.info().map_or(u32::MAX, |i| i.max_entries()) as usize;
            m.iter()
                .take(capacity)
                .map(|kv| kv.map_err(|e| map_err(name, e)))
                .filter(|kv| kv.as_ref().map_or(true, |(k, v)| keep(k, v)))
                .collect()
        }
        Err(e) => Err(batch_err(name, e)),
    }
}
