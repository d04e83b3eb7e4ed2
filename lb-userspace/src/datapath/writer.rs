//! The `MapWriter` interface and its in-memory implementation (for golden tests).

use lb_common::{Backend, SvcKey, SvcValue};
use thiserror::Error;

use std::collections::BTreeMap;

use crate::desired::{Desired, MaglevTable, ObjectName, SrcRange};

/// A write the kernel refused, with the map, the entry and the cause.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("map {map}: cannot {op} {entry}: {cause}")]
pub struct WriteError {
    pub map: &'static str,
    pub op: &'static str,
    pub entry: String,
    pub cause: String,
}

/// Where desired state is written: the pinned kernel maps, or memory.
pub trait MapWriter {
    /// Everything currently in the maps the agent owns (a kernel writer leaves the address
    /// filter out: see `KernelMaps::read_filter`).
    fn read(&self) -> Result<Desired, WriteError>;
    fn put_backend(&mut self, id: u32, be: &Backend) -> Result<(), WriteError>;
    fn del_backend(&mut self, id: u32) -> Result<(), WriteError>;
    /// Writes a frontend's entry (its slots are written before).
    fn put_svc(&mut self, key: &SvcKey, value: &SvcValue) -> Result<(), WriteError>;
    fn del_svc(&mut self, key: &SvcKey) -> Result<(), WriteError>;
    /// Writes slot array elements `base..base + ids.len()`.
    fn put_slots(&mut self, base: u32, ids: &[u32]) -> Result<(), WriteError>;
    /// Writes a service's name; a kernel writer also creates its zeroed counters.
    fn put_name(&mut self, id: u32, name: &ObjectName) -> Result<(), WriteError>;
    /// Deletes a service's name (and its counters).
    fn del_name(&mut self, id: u32) -> Result<(), WriteError>;
    fn put_src_range(&mut self, r: &SrcRange) -> Result<(), WriteError>;
    fn del_src_range(&mut self, r: &SrcRange) -> Result<(), WriteError>;
    /// Writes word `word` of the address filters (bits `word * 64 ..`).
    fn put_filter_word(&mut self, word: u32, bits: u64) -> Result<(), WriteError>;
    /// Writes (or replaces, in one update) the Maglev table of service index `id`.
    fn put_maglev(&mut self, id: u32, table: &MaglevTable) -> Result<(), WriteError>;
    fn del_maglev(&mut self, id: u32) -> Result<(), WriteError>;

    /// Writes many backends (a cold sync); returns the ones that failed, by position in
    /// `list`. One by one unless the writer can batch.
    fn put_backends(&mut self, list: &[(u32, Backend)]) -> Vec<(usize, WriteError)> {
        one_by_one(list, |(id, be)| self.put_backend(*id, be))
    }

    /// Writes many service map entries in order, stopping at the first that fails:
    /// `Err((i, error))` when `list[i]` failed (those before it are written, none after):
    /// the caller decides what may follow a failed slot.
    fn put_svcs(&mut self, list: &[(SvcKey, SvcValue)]) -> Result<(), (usize, WriteError)> {
        in_order(list, |(k, v)| self.put_svc(k, v))
    }

    /// Writes many runs of slots (`(base, ids)`, a frontend's range each); returns the runs
    /// that failed, by position in `runs`. One by one unless the writer can batch.
    fn put_slot_runs(&mut self, runs: &[(u32, &[u32])]) -> Vec<(usize, WriteError)> {
        one_by_one(runs, |(base, ids)| self.put_slots(*base, ids))
    }

    /// Writes many address filter words (`(word, bits)`); returns the ones that failed, by
    /// position in `list`. One by one unless the writer can batch.
    fn put_filter_words(&mut self, list: &[(u32, u64)]) -> Vec<(usize, WriteError)> {
        one_by_one(list, |(word, bits)| self.put_filter_word(*word, *bits))
    }

    /// Writes many names; `fresh` ones are indices no name was programmed at (their
    /// counters start from zero). As [`MapWriter::put_backends`].
    fn put_names(&mut self, list: &[(u32, ObjectName, bool)]) -> Vec<(usize, WriteError)> {
        one_by_one(list, |(id, name, _)| self.put_name(*id, name))
    }
}

/// Calls `put` on each item in order up to the first failure.
pub fn in_order<T>(
    list: &[T],
    mut put: impl FnMut(&T) -> Result<(), WriteError>,
) -> Result<(), (usize, WriteError)> {
    for (i, x) in list.iter().enumerate() {
        put(x).map_err(|e| (i, e))?;
    }
    Ok(())
}

/// Calls `put` on each item; the failures by position.
pub fn one_by_one<T>(
    list: &[T],
    mut put: impl FnMut(&T) -> Result<(), WriteError>,
) -> Vec<(usize, WriteError)> {
    list.iter()
        .enumerate()
        .filter_map(|(i, x)| put(x).err().map(|e| (i, e)))
        .collect()
}

/// Maps in memory, with an op log; `dump()` renders them as sorted text. An entry's slots
/// in `state` are what the slot array holds in its range, as the datapath reads them.
#[derive(Debug, Default)]
pub struct MemoryMaps {
    pub state: Desired,
    /// The slot array's elements written (the rest hold 0).
    pub slot_array: BTreeMap<u32, u32>,
    /// Every write in order, e.g. `put svc 10.96.0.10:80/TCP#1`.
    pub log: Vec<String>,
    /// Fail puts to the service map once it holds this many entries (to test full maps).
    pub svc_capacity: Option<usize>,
}

impl MemoryMaps {
    pub fn dump(&self) -> String {
        self.state.dump()
    }
}

fn svc_entry(k: &SvcKey) -> String {
    lb_common::user::show_frontend(k)
}

impl MemoryMaps {
    /// The slots the array holds for an entry `v`.
    fn slots_of(&self, v: &SvcValue) -> Box<[u32]> {
        (0..v.count as u32)
            .map(|i| {
                let at = v.slot_base.wrapping_add(i);
                self.slot_array.get(&at).copied().unwrap_or(0)
            })
            .collect()
    }
}

impl MapWriter for MemoryMaps {
    fn read(&self) -> Result<Desired, WriteError> {
        Ok(self.state.clone())
    }
    fn put_backend(&mut self, id: u32, be: &Backend) -> Result<(), WriteError> {
        self.log.push(format!("put backend {id}"));
        self.state.backends.insert(id, *be);
        Ok(())
    }
    fn del_backend(&mut self, id: u32) -> Result<(), WriteError> {
        self.log.push(format!("del backend {id}"));
        self.state.backends.remove(&id);
        Ok(())
    }
    fn put_svc(&mut self, key: &SvcKey, value: &SvcValue) -> Result<(), WriteError> {
        if let Some(cap) = self.svc_capacity
            && !self.state.services.contains_key(key)
            && self.state.services.len() >= cap
        {
            return Err(WriteError {
                map: lb_common::MAP_SVC,
                op: "insert",
                entry: svc_entry(key),
                cause: format!("map is full (capacity {cap})"),
            });
        }
        self.log.push(format!("put svc {}", svc_entry(key)));
        let slots = self.slots_of(value);
        self.state
            .services
            .insert(*key, crate::desired::SvcEntry::new(*value, slots));
        Ok(())
    }
    fn put_slots(&mut self, base: u32, ids: &[u32]) -> Result<(), WriteError> {
        self.log.push(format!("put slots {base}+{}", ids.len()));
        for (i, id) in ids.iter().enumerate() {
            self.slot_array.insert(base + i as u32, *id);
        }
        // Entries whose range this wrote see it at once, as the datapath does.
        let end = base as u64 + ids.len() as u64;
        let seen: Vec<(SvcKey, SvcValue)> = self
            .state
            .services
            .iter()
            .filter(|(_, e)| {
                (e.slot_base as u64) < end && (base as u64) < e.slot_base as u64 + e.count as u64
            })
            .map(|(k, e)| (*k, e.value))
            .collect();
        for (k, v) in seen {
            let slots = self.slots_of(&v);
            self.state
                .services
                .insert(k, crate::desired::SvcEntry::new(v, slots));
        }
        Ok(())
    }
    fn del_svc(&mut self, key: &SvcKey) -> Result<(), WriteError> {
        self.log.push(format!("del svc {}", svc_entry(key)));
        self.state.services.remove(key);
        Ok(())
    }
    fn put_name(&mut self, id: u32, name: &ObjectName) -> Result<(), WriteError> {
        self.log.push(format!("put name {id}"));
        self.state.names.insert(id, name.clone());
        Ok(())
    }
    fn del_name(&mut self, id: u32) -> Result<(), WriteError> {
        self.log.push(format!("del name {id}"));
        self.state.names.remove(&id);
        Ok(())
    }
    fn put_src_range(&mut self, r: &SrcRange) -> Result<(), WriteError> {
        self.log
            .push(format!("put range {}: {}/{}", r.svc_id, r.addr, r.prefix));
        self.state.src_ranges.insert(*r);
        Ok(())
    }
    fn del_src_range(&mut self, r: &SrcRange) -> Result<(), WriteError> {
        self.log
            .push(format!("del range {}: {}/{}", r.svc_id, r.addr, r.prefix));
        self.state.src_ranges.remove(r);
        Ok(())
    }
    fn put_filter_word(&mut self, word: u32, bits: u64) -> Result<(), WriteError> {
        self.log.push(format!("put filter word {word}"));
        super::sync::set_word(&mut self.state.filter, word, bits);
        Ok(())
    }
    fn put_maglev(&mut self, id: u32, table: &MaglevTable) -> Result<(), WriteError> {
        self.log.push(format!("put maglev {id}"));
        self.state.maglev.insert(id, table.clone());
        Ok(())
    }
    fn del_maglev(&mut self, id: u32) -> Result<(), WriteError> {
        self.log.push(format!("del maglev {id}"));
        self.state.maglev.remove(&id);
        Ok(())
    }
}
