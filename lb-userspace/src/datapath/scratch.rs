//! A second instance of the datapath for `xlb trace`: the same object loaded again with the
//! agent's service state reused from its pins (services, backends, node config,
//! source ranges, address filters) and fresh, unpinned copies of every map the programs
//! write (conntrack of both families, affinity, socket translations, counters). The live
//! flow (IPv4 and IPv6) and affinity entries are copied into the fresh maps first, so a
//! traced packet meets the same state a real one would, and whatever the program writes
//! stays in the copies.

use std::{collections::BTreeMap, path::PathBuf};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuArray},
    programs::{TestRun, TestRunOptions},
};
use lb_common::{
    AffinityKey, AffinityValue, Counter, CtKey, CtKey6, CtValue, CtValue6, MAP_ADDR_FILTER,
    MAP_AFFINITY, MAP_BACKEND, MAP_BACKEND_STATS, MAP_CONFIG, MAP_CT, MAP_CT_ASSURED, MAP_CT6,
    MAP_CT6_ASSURED, MAP_SOCK, MAP_SRC_RANGE, MAP_STATS, MAP_SVC, MAP_SVC_STATS, MAP_XDP_TX,
    R_COUNT,
};

use super::{
    DatapathError, loader,
    pins::Pins,
    rows::{self, Strides},
};

/// The maps a trace reads from the agent's pins and never writes (the programs only read
/// them).
pub const SHARED_MAPS: [&str; 9] = [
    MAP_SVC,
    lb_common::MAP_SLOT,
    MAP_BACKEND,
    MAP_CONFIG,
    MAP_SRC_RANGE,
    lb_common::MAP_SRC_RANGE6,
    MAP_XDP_TX,
    MAP_ADDR_FILTER,
    lb_common::MAP_MAGLEV,
];

/// The maps the programs write: fresh in a trace instance (sized as the pinned ones).
pub const WRITTEN_MAPS: [&str; 9] = [
    MAP_CT,
    MAP_CT_ASSURED,
    MAP_CT6,
    MAP_CT6_ASSURED,
    MAP_AFFINITY,
    MAP_SOCK,
    MAP_STATS,
    MAP_SVC_STATS,
    MAP_BACKEND_STATS,
];

/// A map key or value: plain bytes to both aya and bytemuck.
pub trait Pod: aya::Pod + bytemuck::Pod {}
impl<T: aya::Pod + bytemuck::Pod> Pod for T {}

/// Entries of a hash map, key to value.
pub type Entries<K, V> = BTreeMap<Vec<u8>, (K, V)>;

/// What one test run of the tc program did.
#[derive(Debug)]
pub struct Run {
    /// The tc action (`TC_ACT_*`): egress's when ingress passed the packet, else ingress's.
    pub verdict: i32,
    /// The packet as the programs left it.
    pub packet: Vec<u8>,
    /// The packet as tc ingress left it (what routing and netfilter see).
    pub ingress_packet: Vec<u8>,
    /// tc egress's verdict and the reason counters it bumped, when ingress passed the packet.
    pub egress: Option<(i32, Vec<(u32, u64)>)>,
    /// Reason counters the run bumped (reason code, packets).
    pub reasons: Vec<(u32, u64)>,
    /// IPv4 conntrack entries (of either table) the run created or changed, with their
    /// value before (none: new).
    pub conntrack: Vec<Change<CtKey, CtValue>>,
    /// IPv6 conntrack entries likewise.
    pub conntrack6: Vec<Change<CtKey6, CtValue6>>,
    /// Affinity entries likewise.
    pub affinity: Vec<Change<AffinityKey, AffinityValue>>,
}

/// An entry a run wrote.
#[derive(Debug, Clone, Copy)]
pub struct Change<K, V> {
    pub key: K,
    pub before: Option<V>,
    pub after: V,
}

/// A loaded trace instance (its programs and fresh maps go when it is dropped; it pins
/// nothing).
pub struct Scratch {
    ebpf: Ebpf,
    /// Both conntrack tables' live entries (a key is in one table at a time), of each family.
    ct_before: Entries<CtKey, CtValue>,
    cta_before: Entries<CtKey, CtValue>,
    ct6_before: Entries<CtKey6, CtValue6>,
    cta6_before: Entries<CtKey6, CtValue6>,
    aff_before: Entries<AffinityKey, AffinityValue>,
}

fn map_err(name: &'static str) -> impl Fn(aya::maps::MapError) -> DatapathError {
    move |source| DatapathError::Map { name, source }
}

/// `max_entries` of the map pinned as `name`.
fn pinned_size(pins: &Pins, name: &'static str) -> Result<u32, DatapathError> {
    let info = pins.data(name)?.info().map_err(map_err(name))?;
    Ok(info.max_entries())
}

/// Every entry of a pinned hash map.
fn read_pinned<K: Pod, V: Pod>(
    pins: &Pins,
    name: &'static str,
) -> Result<Entries<K, V>, DatapathError> {
    let map: HashMap<MapData, K, V> = HashMap::try_from(pins.map(name)?).map_err(map_err(name))?;
    let mut out = Entries::new();
    for kv in map.iter() {
        let (k, v) = kv.map_err(map_err(name))?;
        out.insert(bytemuck::bytes_of(&k).to_vec(), (k, v));
    }
    Ok(out)
}

/// Inserts `entries` into the instance's map `name`.
fn copy<K: Pod, V: Pod>(
    ebpf: &mut Ebpf,
    name: &'static str,
    entries: &Entries<K, V>,
) -> Result<(), DatapathError> {
    let map = ebpf
        .map_mut(name)
        .ok_or(DatapathError::MapMissing { name })?;
    let mut m: HashMap<&mut MapData, K, V> = HashMap::try_from(map).map_err(map_err(name))?;
    for (k, v) in entries.values() {
        m.insert(k, v, 0).map_err(map_err(name))?;
    }
    Ok(())
}

impl Scratch {
    /// Loads `object` again beside the agent whose maps `pins` holds (see the module docs)
    /// and copies its conntrack and affinity entries into the instance's own maps.
    pub fn load(object: &[u8], pins: &Pins) -> Result<Self, DatapathError> {
        if object.is_empty() {
            return Err(DatapathError::ObjectMissing);
        }
        for name in SHARED_MAPS {
            if !pins.has(name) {
                return Err(DatapathError::MapMissing { name });
            }
        }
        // The loader reuses the shared maps by their pins' paths.
        let paths: Vec<(&'static str, PathBuf)> = SHARED_MAPS
            .iter()
            .map(|m| (*m, pins.dir().join(m)))
            .collect();
        let mut sizes = Vec::new();
        for name in SHARED_MAPS.iter().chain(WRITTEN_MAPS.iter()) {
            sizes.push((*name, pinned_size(pins, name)?));
        }
        let cpus = rows::cpus()?;
        let stride = |name| {
            let (_, size) = sizes
                .iter()
                .find(|(n, _)| *n == name)
                .copied()
                .unwrap_or_default();
            size / cpus.max(1)
        };
        let filter_entries = sizes
            .iter()
            .find(|(n, _)| *n == MAP_ADDR_FILTER)
            .map_or(0, |(_, size)| *size);
        let strides = Strides {
            svc: stride(MAP_SVC_STATS),
            backend: stride(MAP_BACKEND_STATS),
            filter_log2: lb_common::FilterSize::from_entries(filter_entries).global(),
        };
        let mut l = EbpfLoader::new();
        for (name, path) in &paths {
            l.map_pin_path(name, path.as_path());
        }
        for (name, size) in &sizes {
            l.map_max_entries(name, *size);
        }
        strides.set(&mut l);
        let mut ebpf = l.load(object)?;
        loader::tc_program(&mut ebpf)?
            .load()
            .map_err(|source| DatapathError::Program {
                name: loader::TC_INGRESS,
                source,
            })?;
        loader::tc_egress_program(&mut ebpf)?
            .load()
            .map_err(|source| DatapathError::Program {
                name: loader::TC_EGRESS,
                source,
            })?;
        let ct_before = read_pinned::<CtKey, CtValue>(pins, MAP_CT)?;
        let cta_before = read_pinned::<CtKey, CtValue>(pins, MAP_CT_ASSURED)?;
        let ct6_before = read_pinned::<CtKey6, CtValue6>(pins, MAP_CT6)?;
        let cta6_before = read_pinned::<CtKey6, CtValue6>(pins, MAP_CT6_ASSURED)?;
        let aff_before = read_pinned::<AffinityKey, AffinityValue>(pins, MAP_AFFINITY)?;
        let mut s = Self {
            ebpf,
            ct_before,
            cta_before,
            ct6_before,
            cta6_before,
            aff_before,
        };
        s.copy_in()?;
        Ok(s)
    }

    fn copy_in(&mut self) -> Result<(), DatapathError> {
        copy(&mut self.ebpf, MAP_CT, &self.ct_before)?;
        copy(&mut self.ebpf, MAP_CT_ASSURED, &self.cta_before)?;
        copy(&mut self.ebpf, MAP_CT6, &self.ct6_before)?;
        copy(&mut self.ebpf, MAP_CT6_ASSURED, &self.cta6_before)?;
        copy(&mut self.ebpf, MAP_AFFINITY, &self.aff_before)
    }

    fn hash<K: Pod, V: Pod>(
        &self,
        name: &'static str,
    ) -> Result<HashMap<&MapData, K, V>, DatapathError> {
        let map = self
            .ebpf
            .map(name)
            .ok_or(DatapathError::MapMissing { name })?;
        HashMap::try_from(map).map_err(map_err(name))
    }

    /// The live conntrack entry of `key`, from either table (as copied in).
    pub fn conntrack_entry(&self, key: &CtKey) -> Option<CtValue> {
        let k = bytemuck::bytes_of(key);
        self.ct_before
            .get(k)
            .or_else(|| self.cta_before.get(k))
            .map(|(_, v)| *v)
    }

    /// The live IPv6 conntrack entry of `key`, from either table (as copied in).
    pub fn conntrack6_entry(&self, key: &CtKey6) -> Option<CtValue6> {
        let k = bytemuck::bytes_of(key);
        self.ct6_before
            .get(k)
            .or_else(|| self.cta6_before.get(k))
            .map(|(_, v)| *v)
    }

    /// How many live conntrack entries were copied in (both tables of both families).
    pub fn conntrack_len(&self) -> usize {
        self.ct_before.len()
            + self.cta_before.len()
            + self.ct6_before.len()
            + self.cta6_before.len()
    }

    /// The live affinity entries (as copied in).
    pub fn affinity_before(&self) -> &Entries<AffinityKey, AffinityValue> {
        &self.aff_before
    }

    fn counters(&self) -> Result<Vec<u64>, DatapathError> {
        let map = self
            .ebpf
            .map(MAP_STATS)
            .ok_or(DatapathError::MapMissing { name: MAP_STATS })?;
        let stats: PerCpuArray<&MapData, Counter> =
            PerCpuArray::try_from(map).map_err(map_err(MAP_STATS))?;
        (0..R_COUNT)
            .map(|r| {
                let per_cpu = stats.get(&r, 0).map_err(map_err(MAP_STATS))?;
                Ok(per_cpu.iter().map(|c| c.packets).sum())
            })
            .collect()
    }

    fn changes<K: Pod, V: Pod + PartialEq>(
        &self,
        name: &'static str,
        before: &Entries<K, V>,
    ) -> Result<Vec<Change<K, V>>, DatapathError> {
        let mut out = Vec::new();
        for kv in self.hash::<K, V>(name)?.iter() {
            let (key, after) = kv.map_err(map_err(name))?;
            let old = before.get(bytemuck::bytes_of(&key)).map(|(_, v)| *v);
            if old != Some(after) {
                out.push(Change {
                    key,
                    before: old,
                    after,
                });
            }
        }
        Ok(out)
    }

    /// Runs the packet through the node as tc sees it (in the calling thread's network
    /// namespace): tc ingress once, then, when ingress passed it, tc egress on what ingress
    /// left (the interface it leaves by: the same program on every interface).
    pub fn run_tc(&mut self, packet: &[u8]) -> Result<Run, DatapathError> {
        let counted = self.counters()?;
        let (verdict, ingress_packet) = test_run(loader::tc_program(&mut self.ebpf)?, packet)
            .map_err(|source| DatapathError::Program {
                name: loader::TC_INGRESS,
                source,
            })?;
        let (verdict, out, egress) = if verdict == TC_ACT_OK_CODE {
            let before = self.counters()?;
            let (v, out) = test_run(loader::tc_egress_program(&mut self.ebpf)?, &ingress_packet)
                .map_err(|source| DatapathError::Program {
                    name: loader::TC_EGRESS,
                    source,
                })?;
            (v, out, Some((v, bumped(&self.counters()?, &before))))
        } else {
            (verdict, ingress_packet.clone(), None)
        };
        let reasons = bumped(&self.counters()?, &counted);
        Ok(Run {
            verdict,
            packet: out,
            ingress_packet,
            egress,
            reasons,
            conntrack: {
                let mut c = self.changes(MAP_CT, &self.ct_before)?;
                c.extend(self.changes(MAP_CT_ASSURED, &self.cta_before)?);
                c
            },
            conntrack6: {
                let mut c = self.changes(MAP_CT6, &self.ct6_before)?;
                c.extend(self.changes(MAP_CT6_ASSURED, &self.cta6_before)?);
                c
            },
            affinity: self.changes(MAP_AFFINITY, &self.aff_before)?,
        })
    }
}

/// `TC_ACT_OK`: the packet goes on.
const TC_ACT_OK_CODE: i32 = 0;

/// `BPF_PROG_TEST_RUN` of `prog` on `packet`: its verdict and the packet it left.
fn test_run(
    prog: &mut aya::programs::SchedClassifier,
    packet: &[u8],
) -> Result<(i32, Vec<u8>), aya::programs::ProgramError> {
    let mut out = vec![0u8; packet.len() + 256];
    let opts = TestRunOptions {
        data_in: Some(packet),
        data_out: Some(&mut out),
        ..TestRunOptions::default()
    };
    let r = prog.test_run(opts)?;
    out.truncate(r.data_size_out as usize);
    Ok((r.return_value as i32, out))
}

/// The reason counters that went up from `was` to `now`, and by how much.
fn bumped(now: &[u64], was: &[u64]) -> Vec<(u32, u64)> {
    now.iter()
        .zip(was)
        .enumerate()
        .filter(|(_, (now, was))| now > was)
        .map(|(i, (now, was))| (i as u32, now - was))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_map_is_shared_or_fresh_in_a_trace() {
        for name in lb_common::ALL_MAPS {
            let shared = SHARED_MAPS.contains(&name);
            let written = WRITTEN_MAPS.contains(&name);
            assert!(
                shared != written,
                "{name}: a trace must either share it (read-only to the programs) or give it a fresh copy (written by them)"
            );
        }
        assert_eq!(
            SHARED_MAPS.len() + WRITTEN_MAPS.len(),
            lb_common::ALL_MAPS.len()
        );
    }
}
