//! `MapWriter` over the kernel's maps (owned by a loaded object, or opened from pins).

use lb_common::user::show_frontend;
use std::{net::IpAddr, os::fd::AsFd};

use aya::maps::{
    Array, HashMap, Map, MapData, MapError,
    lpm_trie::{Key, LpmTrie},
};
use lb_common::{
    Backend, Counter, MAGLEV_ROW_SLOTS, MAP_ADDR_FILTER, MAP_BACKEND, MAP_BACKEND_STATS,
    MAP_CONFIG, MAP_MAGLEV, MAP_SLOT, MAP_SRC_RANGE, MAP_SRC_RANGE6, MAP_SVC, MAP_SVC_STATS,
    MaglevRow, NodeConfig, SrcRangeKey, SrcRangeKey6, SvcKey, SvcValue,
};

use super::{
    DatapathError, batch,
    names_file::{NamesLog, ServiceNames},
    pins::Pins,
    rows::CounterRows,
    writer::{MapWriter, WriteError, in_order, one_by_one},
};
use crate::desired::{Desired, MaglevTable, ObjectName, SrcRange, SvcEntry, object_name};

/// The maps the agent writes, and the service ports' names (in a file beside the pins:
/// `datapath::names_file`). A service index's counters are zeroed when its name is first written,
/// a backend index's when the backend is written (a new index or a new generation there).
pub struct KernelMaps {
    svc: HashMap<MapData, SvcKey, SvcValue>,
    slots: Array<MapData, u32>,
    backends: Array<MapData, Backend>,
    names: NamesLog,
    svc_stats: Counters,
    backend_stats: Counters,
    src_ranges: LpmTrie<MapData, SrcRangeKey, u32>,
    src_ranges6: LpmTrie<MapData, SrcRangeKey6, u32>,
    filter: Array<MapData, u64>,
    maglev: HashMap<MapData, u32, MaglevRow>,
    svc_capacity: u32,
    slot_capacity: u32,
    backend_capacity: u32,
    src_range_capacity: u32,
    src_range6_capacity: u32,
    service_ports_capacity: u32,
    maglev_capacity: u32,
    filter_size: lb_common::FilterSize,
}

/// Elements `0..len` of `array`: batched reads (`BPF_MAP_LOOKUP_BATCH`, a few syscalls for
/// the whole array), else one lookup per element (a kernel without batched lookups).
fn read_array<V: aya::Pod + bytemuck::Pod>(
    array: &Array<MapData, V>,
    len: usize,
) -> Result<Vec<V>, MapError> {
    let mut out = vec![<V as bytemuck::Zeroable>::zeroed(); len];
    if len == 0 {
        return Ok(out);
    }
    let fd = aya::maps::IterableMap::map(array).fd().as_fd();
    let size = std::mem::size_of::<V>();
    let batched = batch::lookup(fd, 4, size, batch::CHUNK, |n, keys, values| {
        for i in 0..n {
            let key: [u8; 4] = keys[i * 4..i * 4 + 4].try_into().unwrap_or_default();
            if let Some(slot) = out.get_mut(u32::from_ne_bytes(key) as usize) {
                *slot = bytemuck::pod_read_unaligned(&values[i * size..(i + 1) * size]);
            }
        }
    });
    if batched.is_err() {
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = array.get(&(i as u32), 0)?;
        }
    }
    Ok(out)
}

/// A source range's trie key: the IPv4 trie's, or the IPv6 trie's.
pub enum RangeKey {
    V4(Key<SrcRangeKey>),
    V6(Key<SrcRangeKey6>),
}

/// The trie key of a source range: 32 bits of service id (network order, so they come first
/// in the trie's byte order), then the network's `prefix` bits.
pub fn range_key(r: &SrcRange) -> RangeKey {
    let svc_id_be = r.svc_id.to_be();
    let len = 32 + r.prefix as u32;
    match r.addr {
        IpAddr::V4(a) => RangeKey::V4(Key::new(
            len,
            SrcRangeKey {
                svc_id_be,
                addr_be: u32::from_ne_bytes(a.octets()),
            },
        )),
        IpAddr::V6(a) => RangeKey::V6(Key::new(
            len,
            SrcRangeKey6 {
                svc_id_be,
                addr_be: lb_common::user::addr_words(IpAddr::V6(a)).0,
            },
        )),
    }
}

/// The source range a trie key holds (the inverse of [`range_key`]).
pub fn range_of(k: &RangeKey) -> SrcRange {
    let (svc_id_be, addr, len) = match k {
        RangeKey::V4(k) => {
            let d = k.data();
            let addr = IpAddr::from(d.addr_be.to_ne_bytes());
            (d.svc_id_be, addr, k.prefix_len())
        }
        RangeKey::V6(k) => {
            let d = k.data();
            let addr = lb_common::user::words_addr(d.addr_be, lb_common::FAMILY_V6);
            (d.svc_id_be, addr, k.prefix_len())
        }
    };
    SrcRange {
        svc_id: u32::from_be(svc_id_be),
        addr,
        prefix: len.saturating_sub(32) as u8,
    }
}

/// Writes the node configuration (SNAT port range, hairpin address) the datapath reads.
pub fn write_config(ebpf: &mut aya::Ebpf, cfg: &NodeConfig) -> Result<(), DatapathError> {
    let map = ebpf
        .map_mut(MAP_CONFIG)
        .ok_or(DatapathError::MapMissing { name: MAP_CONFIG })?;
    let mut array: Array<&mut MapData, NodeConfig> =
        Array::try_from(map).map_err(|source| DatapathError::Map {
            name: MAP_CONFIG,
            source,
        })?;
    array.set(0, cfg, 0).map_err(|source| DatapathError::Map {
        name: MAP_CONFIG,
        source,
    })
}

/// A counter array indexed by service or backend index, a row per CPU: preallocated, so
/// writing it never allocates (a burst of new services cannot fail on memory).
struct Counters {
    rows: CounterRows,
    zero: KnownZero,
}

/// The indices of a counter array known to hold zero: those from `from` up (not used since
/// the array was created). `u32::MAX`: none known (an array adopted from its pin).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct KnownZero {
    from: u32,
}

impl KnownZero {
    const NONE: Self = Self { from: u32::MAX };

    /// Whether index `id`'s counters must be zeroed before it is used anew.
    fn needs_zero(&self, id: u32) -> bool {
        id < self.from
    }

    /// The indices `ids` are in use: the datapath may count on them from now on.
    fn used(&mut self, ids: &[u32]) {
        if let Some(top) = ids.iter().max().filter(|_| *self != Self::NONE) {
            self.from = self.from.max(top.saturating_add(1));
        }
    }
}

impl Counters {
    fn open(map: Map, name: &'static str) -> Result<Self, DatapathError> {
        CounterRows::open(map, name).map(|rows| Self {
            rows,
            zero: KnownZero::NONE,
        })
    }

    /// Zeroes the indices `ids` (but those known to hold zero) in batches; `false` when the
    /// kernel cannot batch (the caller zeroes them one by one).
    fn zero_batch(&mut self, ids: &[u32]) -> bool {
        let used: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&id| self.zero.needs_zero(id))
            .collect();
        let zeroed = used.is_empty() || self.rows.zero_batch(&used);
        if zeroed {
            self.zero.used(ids);
        }
        zeroed
    }

    /// Zeroes index `id` (an index handed out anew starts from zero) unless it is known to
    /// hold zero.
    fn zero(&mut self, id: u32) -> Result<(), WriteError> {
        let name = self.rows.name();
        if self.zero.needs_zero(id) {
            self.rows
                .zero(id)
                .map_err(|e| err(name, "update", format!("counters of {id}"), &e, 0))?;
        }
        self.zero.used(&[id]);
        Ok(())
    }

    /// The index's counters summed over CPUs.
    fn sum(&self, id: u32) -> Counter {
        self.rows.sum(id)
    }
}

fn capacity(map: &Map) -> u32 {
    let data = match map {
        Map::HashMap(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::Array(d)
        | Map::LpmTrie(d) => d,
        _ => return 0,
    };
    data.info().map(|i| i.max_entries()).unwrap_or(0)
}

impl KernelMaps {
    /// Takes the maps out of a loaded object pinned in `dir`.
    pub fn from_ebpf(ebpf: &mut aya::Ebpf, dir: &std::path::Path) -> Result<Self, DatapathError> {
        let mut take = |name: &'static str| {
            ebpf.take_map(name)
                .ok_or(DatapathError::MapMissing { name })
        };
        Self::from_maps(
            [take(MAP_SVC)?, take(MAP_SLOT)?],
            take(MAP_BACKEND)?,
            NamesLog::new(dir),
            take(MAP_SVC_STATS)?,
            take(MAP_BACKEND_STATS)?,
            [take(MAP_SRC_RANGE)?, take(MAP_SRC_RANGE6)?],
            [take(MAP_ADDR_FILTER)?, take(MAP_MAGLEV)?],
        )
    }

    /// The maps as opened in `pins`.
    pub fn open(pins: &Pins) -> Result<Self, DatapathError> {
        Self::from_maps(
            [pins.map(MAP_SVC)?, pins.map(MAP_SLOT)?],
            pins.map(MAP_BACKEND)?,
            NamesLog::new(pins.dir()),
            pins.map(MAP_SVC_STATS)?,
            pins.map(MAP_BACKEND_STATS)?,
            [pins.map(MAP_SRC_RANGE)?, pins.map(MAP_SRC_RANGE6)?],
            [pins.map(MAP_ADDR_FILTER)?, pins.map(MAP_MAGLEV)?],
        )
    }

    fn from_maps(
        [svc, slots]: [Map; 2],
        backends: Map,
        names: NamesLog,
        stats: Map,
        backend_stats: Map,
        [src_ranges, src_ranges6]: [Map; 2],
        [filter, maglev]: [Map; 2],
    ) -> Result<Self, DatapathError> {
        let maglev_capacity = capacity(&maglev);
        let filter_size = lb_common::FilterSize::from_entries(capacity(&filter));
        let svc_capacity = capacity(&svc);
        let slot_capacity = capacity(&slots);
        let svc_stats = Counters::open(stats, MAP_SVC_STATS)?;
        let backend_stats = Counters::open(backend_stats, MAP_BACKEND_STATS)?;
        let backend_capacity = capacity(&backends).min(backend_stats.rows.stride());
        let src_range_capacity = capacity(&src_ranges);
        let src_range6_capacity = capacity(&src_ranges6);
        // Service indices: as many as the per-service counter array has a row for.
        let service_ports_capacity = svc_stats.rows.stride();
        Ok(Self {
            svc: HashMap::try_from(svc).map_err(|source| DatapathError::Map {
                name: MAP_SVC,
                source,
            })?,
            slots: Array::try_from(slots).map_err(|source| DatapathError::Map {
                name: MAP_SLOT,
                source,
            })?,
            backends: Array::try_from(backends).map_err(|source| DatapathError::Map {
                name: MAP_BACKEND,
                source,
            })?,
            names,
            svc_stats,
            backend_stats,
            src_ranges: LpmTrie::try_from(src_ranges).map_err(|source| DatapathError::Map {
                name: MAP_SRC_RANGE,
                source,
            })?,
            src_ranges6: LpmTrie::try_from(src_ranges6).map_err(|source| DatapathError::Map {
                name: MAP_SRC_RANGE6,
                source,
            })?,
            filter: Array::try_from(filter).map_err(|source| DatapathError::Map {
                name: MAP_ADDR_FILTER,
                source,
            })?,
            maglev: HashMap::try_from(maglev).map_err(|source| DatapathError::Map {
                name: MAP_MAGLEV,
                source,
            })?,
            svc_capacity,
            slot_capacity,
            backend_capacity,
            src_range_capacity,
            src_range6_capacity,
            service_ports_capacity,
            maglev_capacity,
            filter_size,
        })
    }

    /// The counter arrays were created by the load these maps come from (their pins did
    /// not exist: [`super::loader::counters_pinned`]), so every counter holds zero: an index
    /// is not zeroed before its first use (at 10,000 × 10 a cold sync zeroed 220,000
    /// counters, a third of its writes).
    pub fn counters_created(&mut self) {
        self.svc_stats.zero = KnownZero { from: 0 };
        self.backend_stats.zero = KnownZero { from: 0 };
    }

    /// A service index's counters summed over CPUs: the rows, without the counts assured
    /// flows hold yet (up to a second's, `datapath::pending`, which `xlb list` adds).
    pub fn service_counter(&self, svc_id: u32) -> Counter {
        self.svc_stats.sum(svc_id)
    }

    /// A backend index's counters summed over CPUs: the rows, as `service_counter`.
    pub fn backend_counter(&self, backend_id: u32) -> Counter {
        self.backend_stats.sum(backend_id)
    }

    /// The set bits of the address filters (numbered as in `Desired::filter`). Not part of
    /// [`MapWriter::read`]: it is a read per word (32,768 of them at the default size), which only the agent's
    /// start needs (it keeps the bits of addresses an earlier agent programmed).
    pub fn read_filter(&self) -> Result<std::collections::BTreeSet<u32>, WriteError> {
        let mut bits = std::collections::BTreeSet::new();
        for word in 0..self.filter_size.entries() {
            let w = self
                .filter
                .get(&word, 0)
                .map_err(|e| err(MAP_ADDR_FILTER, "read", "entries".into(), &e, 0))?;
            bits.extend(
                (0..64)
                    .filter(|i| w & (1u64 << i) != 0)
                    .map(|i| word * 64 + i),
            );
        }
        Ok(bits)
    }

    /// The names as written from now on, in memory, starting from `programmed`'s: what the
    /// metrics' per-service series read.
    pub fn share_names(&mut self, programmed: &Desired) -> ServiceNames {
        self.names
            .share(programmed.names.iter().map(|(id, n)| (*id, &**n)))
    }

    /// Capacities of the service and backend maps as the kernel reports them.
    pub fn limits(&self) -> crate::desired::Limits {
        crate::desired::Limits {
            svc_entries: self.svc_capacity,
            slots: self.slot_capacity,
            backends: self.backend_capacity,
            src_ranges: self.src_range_capacity,
            src_ranges6: self.src_range6_capacity,
            services: self.service_ports_capacity,
            maglev: self.maglev_capacity,
            filter: self.filter_size,
        }
    }
}

fn cause(e: &MapError, capacity: u32) -> String {
    let text = e.to_string();
    let full =
        matches!(e, MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::E2BIG));
    if full {
        format!("map is full (capacity {capacity})")
    } else {
        text
    }
}

fn err(
    map: &'static str,
    op: &'static str,
    entry: String,
    e: &MapError,
    capacity: u32,
) -> WriteError {
    WriteError {
        map,
        op,
        entry,
        cause: cause(e, capacity),
    }
}

impl MapWriter for KernelMaps {
    fn read(&self) -> Result<Desired, WriteError> {
        let read_err = |map, e: MapError| err(map, "read", "entries".into(), &e, 0);
        let mut d = Desired::default();
        let mut frontends = Vec::new();
        for kv in self.svc.iter() {
            frontends.push(kv.map_err(|e| read_err(MAP_SVC, e))?);
        }
        // The slot array up to the highest slot a frontend names, in a few batched reads.
        let top = frontends
            .iter()
            .map(|(_, v)| v.slot_base as usize + v.count as usize)
            .max()
            .unwrap_or(0);
        let slots = read_array(&self.slots, top).map_err(|e| read_err(MAP_SLOT, e))?;
        for (k, v) in frontends {
            let at = v.slot_base as usize;
            let named = slots.get(at..at + v.count as usize).unwrap_or_default();
            d.services.insert(k, SvcEntry::new(v, named));
        }
        // The backends the slots name (an array has no notion of "present": a backend in
        // use has a generation).
        let top = d
            .services
            .values()
            .flat_map(|v| v.slots.iter())
            .max()
            .map_or(0, |id| *id as usize + 1);
        let backends = read_array(&self.backends, top).map_err(|e| read_err(MAP_BACKEND, e))?;
        let used: std::collections::BTreeSet<u32> = d
            .services
            .values()
            .flat_map(|v| v.slots.iter().copied())
            .collect();
        for id in used {
            if let Some(be) = backends.get(id as usize).filter(|b| b.generation != 0) {
                d.backends.insert(id, *be);
            }
        }
        let names = self
            .names
            .read()
            .map_err(|e| names_err("read", "names".into(), &e))?;
        for (id, name) in names.into_iter().flatten() {
            d.names.insert(id, object_name(&name));
        }
        for k in self.src_ranges.keys() {
            let k = k.map_err(|e| read_err(MAP_SRC_RANGE, e))?;
            d.src_ranges.insert(range_of(&RangeKey::V4(k)));
        }
        for k in self.src_ranges6.keys() {
            let k = k.map_err(|e| read_err(MAP_SRC_RANGE6, e))?;
            d.src_ranges.insert(range_of(&RangeKey::V6(k)));
        }
        for kv in self.maglev.iter() {
            let (id, row) = kv.map_err(|e| read_err(MAP_MAGLEV, e))?;
            let size = (row.size as usize).min(MAGLEV_ROW_SLOTS);
            d.maglev.insert(
                id,
                MaglevTable {
                    slots: row.slots[..size].into(),
                },
            );
        }
        Ok(d)
    }

    fn put_maglev(&mut self, id: u32, table: &MaglevTable) -> Result<(), WriteError> {
        let mut row: Box<MaglevRow> = Box::new(bytemuck::Zeroable::zeroed());
        let n = table.slots.len().min(MAGLEV_ROW_SLOTS);
        row.size = n as u32;
        row.slots[..n].copy_from_slice(&table.slots[..n]);
        self.maglev.insert(id, *row, 0).map_err(|e| {
            err(
                MAP_MAGLEV,
                "update",
                format!("table of service {id}"),
                &e,
                self.maglev_capacity,
            )
        })
    }

    fn del_maglev(&mut self, id: u32) -> Result<(), WriteError> {
        self.maglev.remove(&id).map_err(|e| {
            err(
                MAP_MAGLEV,
                "delete",
                format!("table of service {id}"),
                &e,
                0,
            )
        })
    }

    fn put_backend(&mut self, id: u32, be: &Backend) -> Result<(), WriteError> {
        // Written only for an index handed out anew (or a new generation at it): its
        // counters start from zero, before any slot can send a packet its way.
        self.backend_stats.zero(id)?;
        let cap = self.backend_capacity;
        self.backends
            .set(id, be, 0)
            .map_err(|e| err(MAP_BACKEND, "update", format!("backend {id}"), &e, cap))
    }

    fn del_backend(&mut self, id: u32) -> Result<(), WriteError> {
        // Generation 0: the index holds no backend (a flow that named it sees it gone).
        self.backends
            .set(id, Backend::default(), 0)
            .map_err(|e| err(MAP_BACKEND, "delete", format!("backend {id}"), &e, 0))
    }

    fn put_svc(&mut self, key: &SvcKey, value: &SvcValue) -> Result<(), WriteError> {
        let cap = self.svc_capacity;
        self.svc
            .insert(key, value, 0)
            .map_err(|e| err(MAP_SVC, "insert", show_frontend(key), &e, cap))
    }

    fn del_svc(&mut self, key: &SvcKey) -> Result<(), WriteError> {
        self.svc
            .remove(key)
            .map_err(|e| err(MAP_SVC, "delete", show_frontend(key), &e, 0))
    }

    fn put_slots(&mut self, base: u32, ids: &[u32]) -> Result<(), WriteError> {
        let cap = self.slot_capacity;
        for (i, id) in ids.iter().enumerate() {
            let at = base.wrapping_add(i as u32);
            self.slots
                .set(at, id, 0)
                .map_err(|e| err(MAP_SLOT, "update", format!("slot {at}"), &e, cap))?;
        }
        Ok(())
    }

    fn put_name(&mut self, id: u32, name: &ObjectName) -> Result<(), WriteError> {
        // A service index without a name is handed out anew: its counters start from zero.
        let named = self
            .names
            .named(id)
            .map_err(|e| names_err("read", format!("name {id}"), &e))?;
        if !named {
            self.svc_stats.zero(id)?;
        }
        self.write_names(&[(id, name)])
            .map_err(|e| names_err("append", format!("name {id}"), &e))
    }

    fn del_name(&mut self, id: u32) -> Result<(), WriteError> {
        self.names
            .write(&[(id, None)])
            .map_err(|e| names_err("append", format!("removal of name {id}"), &e))
    }

    fn put_src_range(&mut self, r: &SrcRange) -> Result<(), WriteError> {
        let entry = format!("service {}: {}/{}", r.svc_id, r.addr, r.prefix);
        match range_key(r) {
            RangeKey::V4(k) => self.src_ranges.insert(&k, 1, 0).map_err(|e| {
                let cap = self.src_range_capacity;
                err(MAP_SRC_RANGE, "insert", entry, &e, cap)
            }),
            RangeKey::V6(k) => self.src_ranges6.insert(&k, 1, 0).map_err(|e| {
                let cap = self.src_range6_capacity;
                err(MAP_SRC_RANGE6, "insert", entry, &e, cap)
            }),
        }
    }

    fn put_filter_word(&mut self, word: u32, bits: u64) -> Result<(), WriteError> {
        self.filter.set(word, bits, 0).map_err(|e| {
            err(
                MAP_ADDR_FILTER,
                "update",
                format!("filter word {word}"),
                &e,
                0,
            )
        })
    }

    fn del_src_range(&mut self, r: &SrcRange) -> Result<(), WriteError> {
        let entry = format!("service {}: {}/{}", r.svc_id, r.addr, r.prefix);
        let removed = match range_key(r) {
            RangeKey::V4(k) => self.src_ranges.remove(&k),
            RangeKey::V6(k) => self.src_ranges6.remove(&k),
        };
        match removed {
            Err(MapError::KeyNotFound) | Ok(()) => Ok(()),
            Err(e) => Err(err(r.map(), "delete", entry, &e, 0)),
        }
    }

    fn put_backends(&mut self, list: &[(u32, Backend)]) -> Vec<(usize, WriteError)> {
        let ids: Vec<u32> = list.iter().map(|(id, _)| *id).collect();
        if list.len() < BATCH_MIN || !self.backend_stats.zero_batch(&ids) {
            return one_by_one(list, |(id, be)| self.put_backend(*id, be));
        }
        let values: Vec<Backend> = list.iter().map(|(_, be)| *be).collect();
        let fd = aya::maps::IterableMap::map(&self.backends).fd().as_fd();
        let size = std::mem::size_of::<Backend>();
        let r = batch::update(fd, &ids, batch::bytes(&values), size);
        rest_one_by_one(list, r, |(id, be)| self.put_backend(*id, be))
    }

    fn put_filter_words(&mut self, list: &[(u32, u64)]) -> Vec<(usize, WriteError)> {
        if list.len() < BATCH_MIN {
            return one_by_one(list, |(word, bits)| self.put_filter_word(*word, *bits));
        }
        let (words, bits): (Vec<u32>, Vec<u64>) = list.iter().copied().unzip();
        let fd = aya::maps::IterableMap::map(&self.filter).fd().as_fd();
        let r = batch::update(fd, &words, batch::bytes(&bits), std::mem::size_of::<u64>());
        rest_one_by_one(list, r, |(word, bits)| self.put_filter_word(*word, *bits))
    }

    fn put_svcs(&mut self, list: &[(SvcKey, SvcValue)]) -> Result<(), (usize, WriteError)> {
        let mut done = 0;
        if list.len() >= BATCH_MIN {
            let keys: Vec<SvcKey> = list.iter().map(|(k, _)| *k).collect();
            let values: Vec<SvcValue> = list.iter().map(|(_, v)| *v).collect();
            let fd = aya::maps::IterableMap::map(&self.svc).fd().as_fd();
            let size = std::mem::size_of::<SvcValue>();
            match batch::update(fd, &keys, batch::bytes(&values), size) {
                Ok(()) => return Ok(()),
                Err((n, _)) => done = n,
            }
        }
        // The rest one by one (the kernel refused the batch there): the failure named.
        in_order(&list[done..], |(k, v)| self.put_svc(k, v)).map_err(|(i, e)| (i + done, e))
    }

    fn put_slot_runs(&mut self, runs: &[(u32, &[u32])]) -> Vec<(usize, WriteError)> {
        let n: usize = runs.iter().map(|(_, ids)| ids.len()).sum();
        if n < BATCH_MIN {
            return one_by_one(runs, |(base, ids)| self.put_slots(*base, ids));
        }
        // Every run's elements in one batch (an array: an element's update cannot fail
        // for room, only for an index past the end).
        let keys: Vec<u32> = runs
            .iter()
            .flat_map(|(base, ids)| (0..ids.len() as u32).map(move |i| base.wrapping_add(i)))
            .collect();
        let values: Vec<u32> = runs
            .iter()
            .flat_map(|(_, ids)| ids.iter().copied())
            .collect();
        let fd = aya::maps::IterableMap::map(&self.slots).fd().as_fd();
        match batch::update(fd, &keys, batch::bytes(&values), std::mem::size_of::<u32>()) {
            Ok(()) => Vec::new(),
            // One by one: each failure named by its run.
            Err(_) => one_by_one(runs, |(base, ids)| self.put_slots(*base, ids)),
        }
    }

    fn put_names(&mut self, list: &[(u32, ObjectName, bool)]) -> Vec<(usize, WriteError)> {
        let fresh: Vec<u32> = list.iter().filter(|x| x.2).map(|x| x.0).collect();
        if list.len() < BATCH_MIN || !self.svc_stats.zero_batch(&fresh) {
            return one_by_one(list, |(id, name, _)| self.put_name(*id, name));
        }
        // The counters zeroed: the names in one append.
        let names: Vec<(u32, &ObjectName)> = list.iter().map(|(id, n, _)| (*id, n)).collect();
        match self.write_names(&names) {
            Ok(()) => Vec::new(),
            Err(e) => (0..list.len())
                .map(|i| (i, names_err("append", format!("name {}", list[i].0), &e)))
                .collect(),
        }
    }
}

impl KernelMaps {
    /// Appends `names` to the names file.
    fn write_names(&mut self, names: &[(u32, &ObjectName)]) -> std::io::Result<()> {
        let changes: Vec<(u32, Option<&str>)> =
            names.iter().map(|(id, n)| (*id, Some(&***n))).collect();
        self.names.write(&changes)
    }
}

/// A names file write (or read) that failed, as a map write's error.
fn names_err(op: &'static str, entry: String, e: &std::io::Error) -> WriteError {
    WriteError {
        map: "names file",
        op,
        entry,
        cause: e.to_string(),
    }
}

/// After a batch: nothing when it was written whole, else the entries from the one the
/// kernel refused on written one by one (each failure named, by position in `list`).
fn rest_one_by_one<T>(
    list: &[T],
    batch: Result<(), (usize, std::io::Error)>,
    put: impl FnMut(&T) -> Result<(), WriteError>,
) -> Vec<(usize, WriteError)> {
    let Err((done, _)) = batch else {
        return Vec::new();
    };
    one_by_one(&list[done..], put)
        .into_iter()
        .map(|(i, e)| (i + done, e))
        .collect()
}

/// Fewer entries than this are written one by one (a batch saves nothing there).
const BATCH_MIN: usize = 32;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_known_zero_above_every_index_used_since_the_array_was_created() {
        let mut created = KnownZero { from: 0 };
        assert!(!created.needs_zero(0) && !created.needs_zero(7));
        created.used(&[3, 1, 2]);
        assert!(
            (0..=3).all(|id| created.needs_zero(id)),
            "used: zeroed again"
        );
        assert!(!created.needs_zero(4));
        created.used(&[]);
        created.used(&[2]);
        assert_eq!(
            created,
            KnownZero { from: 4 },
            "an index below does not lower it"
        );
        let mut adopted = KnownZero::NONE;
        adopted.used(&[5]);
        assert_eq!(adopted, KnownZero::NONE);
        assert!(adopted.needs_zero(u32::MAX - 1) && adopted.needs_zero(0));
    }

    #[test]
    fn a_range_key_is_the_service_id_then_the_network_in_trie_byte_order() {
        let r4 = SrcRange {
            svc_id: 0x0102_0304,
            addr: "10.0.0.0".parse().expect("ip"),
            prefix: 8,
        };
        let RangeKey::V4(k) = range_key(&r4) else {
            panic!("an IPv4 range goes into the IPv4 trie");
        };
        assert_eq!(k.prefix_len(), 40);
        assert_eq!(bytemuck::bytes_of(&k.data()), [1, 2, 3, 4, 10, 0, 0, 0]);
        assert_eq!(range_of(&RangeKey::V4(k)), r4);
        let r6 = SrcRange {
            svc_id: 7,
            addr: "2001:db8:1::".parse().expect("ip"),
            prefix: 48,
        };
        let RangeKey::V6(k) = range_key(&r6) else {
            panic!("an IPv6 range goes into the IPv6 trie");
        };
        assert_eq!(k.prefix_len(), 80);
        let mut want = vec![0, 0, 0, 7];
        want.extend(
            "2001:db8:1::"
                .parse::<std::net::Ipv6Addr>()
                .expect("ip")
                .octets(),
        );
        assert_eq!(bytemuck::bytes_of(&k.data()), want.as_slice());
        assert_eq!(range_of(&RangeKey::V6(k)), r6);
        assert_eq!(r6.map(), MAP_SRC_RANGE6);
        assert_eq!(r4.map(), MAP_SRC_RANGE);
        // A host range: all 160 bits.
        let host = SrcRange {
            svc_id: 7,
            addr: "2001:db8::1".parse().expect("ip"),
            prefix: 128,
        };
        let RangeKey::V6(k) = range_key(&host) else {
            panic!("IPv6");
        };
        assert_eq!(k.prefix_len(), 160);
        assert_eq!(range_of(&RangeKey::V6(k)), host);
    }
}
