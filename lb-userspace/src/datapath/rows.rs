//! The per-service and per-backend counters: plain arrays laid out CPU-major (CPU `c`'s row
//! starts at `c × stride`), so the datapath reaches a counter with one computed address and
//! one cache miss where a per-CPU array's lookup makes two dependent ones (its pointer
//! table, then the CPU's copy). The stride (the indices of one row) reaches the programs as
//! a load-time global; an array holds `stride × possible CPUs` entries.

use std::os::fd::AsFd;

use aya::{
    EbpfLoader,
    maps::{Array, Map, MapData, MapError},
};
use lb_common::{Counter, GLOBAL_BACKEND_STRIDE, GLOBAL_FILTER_LOG2, GLOBAL_SVC_STRIDE};

use super::{DatapathError, batch};

const POSSIBLE_CPUS: &str = "/sys/devices/system/cpu/possible";

/// The rows a counter array has: one per CPU id `bpf_get_smp_processor_id` can return, i.e.
/// the highest possible CPU's id + 1 (the kernel's `nr_cpu_ids`; more than the count of
/// possible CPUs where their list has holes, as `0-3,8-11`).
pub fn cpus() -> Result<u32, DatapathError> {
    let fail = |source| DatapathError::Cpus {
        what: POSSIBLE_CPUS,
        source,
    };
    let text = std::fs::read_to_string(POSSIBLE_CPUS).map_err(fail)?;
    highest_plus_one(&text).ok_or_else(|| {
        fail(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("cannot read the CPU list {:?}", text.trim()),
        ))
    })
}

/// The highest CPU id of a kernel CPU list (`0-3,8-11`) + 1.
fn highest_plus_one(list: &str) -> Option<u32> {
    list.trim()
        .split(',')
        .map(|range| range.rsplit('-').next()?.trim().parse::<u32>().ok())
        .try_fold(0u32, |max, id| Some(max.max(id?.checked_add(1)?)))
        .filter(|&n| n > 0)
}

/// Entries of a counter array with `stride` indices per row and `cpus` rows.
pub fn entries(stride: u32, cpus: u32) -> u32 {
    stride.saturating_mul(cpus)
}

/// The strides of the service and of the backend counter arrays, and the address filters'
/// size, as the programs get them (load-time globals).
pub struct Strides {
    pub svc: u32,
    pub backend: u32,
    /// The address filters' sizes (`lb_common::FilterSize::global`), the filter map sized
    /// to match; 0: not set (an object of a build before sized filters, which has no such global
    /// and reads the default size).
    pub filter_log2: u32,
}

impl Strides {
    /// Hands the strides to the programs `loader` loads.
    pub fn set<'a>(&'a self, loader: &mut EbpfLoader<'a>) {
        loader.override_global(GLOBAL_SVC_STRIDE, &self.svc, true);
        loader.override_global(GLOBAL_BACKEND_STRIDE, &self.backend, true);
        if self.filter_log2 != 0 {
            loader.override_global(GLOBAL_FILTER_LOG2, &self.filter_log2, true);
        }
    }
}

/// A CPU-major counter array.
pub struct CounterRows {
    map: Array<MapData, Counter>,
    name: &'static str,
    stride: u32,
    cpus: u32,
}

fn map_err(name: &'static str) -> impl Fn(MapError) -> DatapathError {
    move |source| DatapathError::Map { name, source }
}

impl CounterRows {
    /// Opens counter array `name`; refuses one that is not a whole row per possible CPU.
    pub fn open(map: Map, name: &'static str) -> Result<Self, DatapathError> {
        let map = Array::try_from(map).map_err(map_err(name))?;
        let cpus = cpus()?;
        let len = map.len();
        if cpus == 0 || len % cpus != 0 {
            return Err(DatapathError::CounterRows { name, len, cpus });
        }
        Ok(Self {
            map,
            name,
            stride: len / cpus,
            cpus,
        })
    }

    /// The stride of counter array `name` (opened as `map`).
    pub fn stride_of(map: &Map, name: &'static str) -> Result<u32, DatapathError> {
        let len = match map {
            Map::Array(d) => d.info().map_err(map_err(name))?.max_entries(),
            _ => return Err(DatapathError::MapMissing { name }),
        };
        let cpus = cpus()?;
        if cpus == 0 || len % cpus != 0 {
            return Err(DatapathError::CounterRows { name, len, cpus });
        }
        Ok(len / cpus)
    }

    /// The map's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Indices per row (the array's capacity in services or backends).
    pub fn stride(&self) -> u32 {
        self.stride
    }

    /// Where index `id` sits in each CPU's row.
    fn cells(&self, id: u32) -> impl Iterator<Item = u32> + use<> {
        let stride = self.stride;
        (0..self.cpus).map(move |c| c * stride + id)
    }

    /// Zeroes index `id` in every row (an index handed out anew starts from zero).
    pub fn zero(&mut self, id: u32) -> Result<(), MapError> {
        self.cells(id)
            .try_for_each(|cell| self.map.set(cell, Counter::default(), 0))
    }

    /// Zeroes the indices `ids` in every row in batches; `false` when the kernel cannot
    /// batch (the caller zeroes them one by one).
    pub fn zero_batch(&mut self, ids: &[u32]) -> bool {
        let cells: Vec<u32> = ids.iter().flat_map(|&id| self.cells(id)).collect();
        let size = std::mem::size_of::<Counter>();
        let zeros = vec![0u8; size * cells.len().min(batch::CHUNK)];
        let fd = aya::maps::IterableMap::map(&self.map).fd().as_fd();
        cells
            .chunks(batch::CHUNK)
            .all(|chunk| batch::update(fd, chunk, &zeros[..size * chunk.len()], size).is_ok())
    }

    /// Index `id`'s counters summed over the rows (zero where a row cannot be read).
    pub fn sum(&self, id: u32) -> Counter {
        self.cells(id)
            .filter_map(|cell| self.map.get(&cell, 0).ok())
            .fold(Counter::default(), add)
    }
}

/// Counter array `name` (opened as `map`): `each(index, sum over rows)` for every index of
/// a row, in index order; the whole array read in batches (one by one where the kernel has
/// no batched lookups).
pub fn sums(
    map: &Map,
    name: &'static str,
    mut each: impl FnMut(u32, Counter),
) -> Result<(), DatapathError> {
    let stride = CounterRows::stride_of(map, name)?;
    let Map::Array(d) = map else {
        return Err(DatapathError::MapMissing { name });
    };
    let mut total = vec![Counter::default(); stride as usize];
    let size = std::mem::size_of::<Counter>();
    let read = batch::lookup(d.fd().as_fd(), 4, size, batch::CHUNK, |n, keys, values| {
        for i in 0..n {
            let cell = bytemuck::pod_read_unaligned::<u32>(&keys[4 * i..4 * i + 4]);
            let c = bytemuck::pod_read_unaligned(&values[i * size..(i + 1) * size]);
            fold(&mut total, stride, cell, c);
        }
    });
    if read.is_err() {
        total.fill(Counter::default());
        let array: Array<&MapData, Counter> = Array::try_from(map).map_err(map_err(name))?;
        for cell in 0..array.len() {
            let c = array.get(&cell, 0).map_err(map_err(name))?;
            fold(&mut total, stride, cell, c);
        }
    }
    for (id, c) in total.into_iter().enumerate() {
        each(id as u32, c);
    }
    Ok(())
}

fn fold(total: &mut [Counter], stride: u32, cell: u32, c: Counter) {
    if let Some(t) = total.get_mut((cell % stride.max(1)) as usize) {
        *t = add(*t, c);
    }
}

fn add(a: Counter, c: Counter) -> Counter {
    Counter {
        packets: a.packets + c.packets,
        bytes: a.bytes + c.bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::highest_plus_one;

    #[test]
    fn rows_cover_the_highest_possible_cpu_id() {
        assert_eq!(highest_plus_one("0-1\n"), Some(2));
        assert_eq!(highest_plus_one("0"), Some(1));
        assert_eq!(highest_plus_one("0-3,8-11"), Some(12));
        assert_eq!(highest_plus_one(""), None);
        assert_eq!(highest_plus_one("x"), None);
    }
}
