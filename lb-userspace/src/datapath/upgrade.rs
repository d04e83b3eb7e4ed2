//! Taking over the pins of the previous layout ([`lb_common::prev`]) without breaking a
//! flow.
//!
//! An agent of this layout that finds the previous one's maps pinned (its conntrack and
//! affinity, its service and backend maps, its counters) loads its own maps beside them and
//! leaves the previous programs attached, so they keep forwarding from the old maps. Then, in
//! this order (make-before-break):
//!
//! 1. it programs its own maps (its first sync);
//! 2. it copies every conntrack and affinity entry over, converted: 16-byte keys, backend ids
//!    of `XLB_BE_V1` turned into the index and generation the same backend has now, service
//!    ids into the new service indices (a backend or service that is gone leaves index 0: a
//!    TCP flow keeps its tuple, a UDP flow moves, as after any backend removal);
//! 3. it attaches its programs, which replace the previous ones link by link;
//! 4. it copies again, without overwriting, the flows the previous programs began meanwhile;
//! 5. it removes the previous pins (the kernel frees those maps with the last program that
//!    used them).
//!
//! A flow whose first packet the previous program saw in the milliseconds between steps 2 and
//! 3, and whose next packet the new program saw before step 4, is picked up mid-stream
//! (`ct_miss`), as after an eviction.
//!
//! The layout before slot ranges (`prev::MAP_SVC_V2`: a service map entry per backend slot)
//! shares everything else with this one (backend array, conntrack, affinity, names): the
//! agent adopts its service and backend indices from it ([`slotted_indices`]), so every flow
//! and affinity entry keeps naming the same service and backend; it writes its own service
//! map and slot array in its first sync while the previous programs keep forwarding from
//! `XLB_SVC_V2`, attaches its programs, then removes that pin. Nothing is copied.
//!
//! The names map (`prev::MAP_SVC_NAME`, pinned by every layout before the names left the
//! kernel) holds no state the programs read: at start the agent writes its names to the
//! names file ([`adopt_names`], so the file says what was programmed, and the indices it
//! names keep their counters), programs its maps in its first sync (writing to the file
//! what changed), attaches its programs and removes that pin, as for `XLB_SVC_V2`.
//!
//! The address filters of the layout before the two filters could differ in size
//! (`prev::MAP_ADDR_FILTER`): this layout's filter map is created of the same size (two
//! filters of one size number their bits alike in both layouts), the old words are ORed
//! into it before the agent reads it ([`adopt_filter`]: the bits of addresses gone less than
//! a day stay set), and the pin is removed with the others once the programs are attached.

use std::{collections::BTreeMap, path::Path};

use aya::maps::{Array, HashMap, MapData, MapError};
use lb_common::{
    AffinityKey, AffinityValue, Backend, CT_F_AFFINITY, CtKey, CtValue, FAMILY_V4, MAP_ADDR_FILTER,
    MAP_AFFINITY, MAP_BACKEND, MAP_CT, SCOPE_EXTERNAL, SvcKey, SvcValue, prev,
};

use super::{DatapathError, names_file, pins::Pins};
use crate::desired::{Desired, SvcEntry};

/// The previous layout's pins in a directory, and what its ids meant.
#[derive(Debug)]
pub struct Previous {
    /// This layout's maps (the previous one's are read by their pins' paths: the handle
    /// holds only this layout's, which outlive the previous ones).
    pins: Pins,
    /// `XLB_BE_V1` backend id → the backend (generation 0).
    backends: BTreeMap<u32, Backend>,
    /// `XLB_SVC_V1` service id → its frontend (slot 0, external scope).
    services: BTreeMap<u32, SvcKey>,
    /// The V1 layout's conntrack and affinity are pinned (their flows are copied); else only
    /// `XLB_SVC_V2` is, whose flows are this layout's already.
    v1: bool,
}

/// What one copy did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Copied {
    /// Conntrack entries written (two per flow).
    pub conntrack: usize,
    /// Affinity entries written.
    pub affinity: usize,
    /// Entries left out: not IPv4, of a service or backend this agent does not program
    /// (affinity), or already there (the second copy).
    pub skipped: usize,
}

/// Old ids → what this agent programs now.
pub struct Mapping {
    old_backends: BTreeMap<u32, Backend>,
    old_services: BTreeMap<u32, SvcKey>,
    /// Backend (generation 0) → (index, generation).
    backends: BTreeMap<Backend, (u32, u32)>,
    /// Frontend → (service index, has affinity).
    services: BTreeMap<SvcKey, (u32, bool)>,
}

fn identity(be: &Backend) -> Backend {
    Backend {
        generation: 0,
        ..*be
    }
}

fn from_prev(b: &prev::Backend) -> Backend {
    Backend {
        addr_be: b.addr_be,
        port_be: b.port_be,
        proto: b.proto,
        family: b.family,
        flags: b.flags,
        ..Backend::default()
    }
}

impl Mapping {
    /// The mapping from the previous layout's ids to `current`'s indices.
    pub fn new(
        old_backends: BTreeMap<u32, Backend>,
        old_services: BTreeMap<u32, SvcKey>,
        current: &Desired,
    ) -> Self {
        Self {
            old_backends,
            old_services,
            backends: current
                .backends
                .iter()
                .map(|(id, be)| (identity(be), (*id, be.generation)))
                .collect(),
            services: current
                .services
                .iter()
                .filter(|(k, _)| k.scope == SCOPE_EXTERNAL)
                .map(|(k, v)| (*k, (v.svc_id, v.affinity_timeout_s != 0)))
                .collect(),
        }
    }

    /// The index and generation the backend of old id `id` has now; (0, 0) when it is gone.
    fn backend(&self, id: u32) -> (u32, u32) {
        self.old_backends
            .get(&id)
            .and_then(|b| self.backends.get(&identity(b)))
            .copied()
            .unwrap_or((0, 0))
    }

    /// The index of the service of old id `id` now, and whether it has affinity.
    fn service(&self, id: u32) -> Option<(u32, bool)> {
        self.old_services
            .get(&id)
            .and_then(|k| self.services.get(k))
            .copied()
    }
}

/// A conntrack entry of the previous layout in this one's. `None` for what this layout does
/// not track (IPv6).
pub fn convert_ct(k: &prev::CtKey, v: &prev::CtValue, m: &Mapping) -> Option<(CtKey, CtValue)> {
    if k.family != FAMILY_V4 {
        return None;
    }
    let (backend_id, backend_gen) = m.backend(v.backend_id);
    let (svc_id, affinity) = m.service(v.svc_id).unwrap_or((0, false));
    let mut flags = v.flags;
    if affinity {
        flags |= CT_F_AFFINITY;
    }
    Some((
        CtKey {
            saddr_be: k.saddr_be[0],
            daddr_be: k.daddr_be[0],
            sport_be: k.sport_be,
            dport_be: k.dport_be,
            proto: k.proto,
            dir: k.dir,
            _pad: 0,
        },
        CtValue {
            saddr_be: v.saddr_be[0],
            daddr_be: v.daddr_be[0],
            sport_be: v.sport_be,
            dport_be: v.dport_be,
            backend_id,
            backend_gen,
            svc_id,
            flags,
            mtu: v.mtu,
            pending: 0,
            // CLOCK_MONOTONIC then, CLOCK_MONOTONIC_COARSE now: the same clock, read a tick
            // apart at most (every comparison saturates).
            created_ns: v.created_ns,
            last_seen_ns: v.last_seen_ns,
        },
    ))
}

/// An affinity entry of the previous layout in this one's; `None` when its service or its
/// backend is not programmed any more (the client simply gets a backend anew).
pub fn convert_affinity(
    k: &AffinityKey,
    v: &prev::AffinityValue,
    m: &Mapping,
) -> Option<(AffinityKey, AffinityValue)> {
    let (svc_id, _) = m.service(k.svc_id)?;
    let (backend_id, backend_gen) = m.backend(v.backend_id);
    if backend_gen == 0 {
        return None;
    }
    Some((
        AffinityKey { svc_id, ..*k },
        AffinityValue {
            backend_id,
            slot: v.slot,
            _pad0: 0,
            backend_gen,
            _pad1: 0,
            last_seen_ns: v.last_seen_ns,
        },
    ))
}

fn map_err(name: &'static str) -> impl Fn(MapError) -> DatapathError {
    move |source| DatapathError::Map { name, source }
}

/// Every entry of the previous layout's hash map `name` pinned under `dir` (none when it is
/// not pinned).
fn entries<K: aya::Pod, V: aya::Pod>(
    dir: &Path,
    name: &'static str,
) -> Result<Vec<(K, V)>, DatapathError> {
    let path = dir.join(name);
    if !path.exists() {
        return Ok(Vec::new());
    }
    let data = MapData::from_pin(path).map_err(map_err(name))?;
    let map = aya::maps::Map::from_map_data(data).map_err(map_err(name))?;
    let map: HashMap<MapData, K, V> = HashMap::try_from(map).map_err(map_err(name))?;
    // An entry evicted or deleted while we iterate is simply not copied.
    Ok(map.iter().filter_map(Result::ok).collect())
}

/// Inserts `items` into the map `name` of `pins`; with `only_new`, keeps what is there
/// already. Returns (written, already there).
fn insert_all<K: aya::Pod, V: aya::Pod>(
    pins: &Pins,
    name: &'static str,
    items: &[(K, V)],
    only_new: bool,
) -> Result<(usize, usize), DatapathError> {
    const BPF_NOEXIST: u64 = 1;
    let mut map: HashMap<MapData, K, V> =
        HashMap::try_from(pins.map(name)?).map_err(map_err(name))?;
    let (mut written, mut kept) = (0, 0);
    for (k, v) in items {
        match map.insert(k, v, if only_new { BPF_NOEXIST } else { 0 }) {
            Ok(()) => written += 1,
            Err(MapError::SyscallError(s))
                if only_new && s.io_error.raw_os_error() == Some(libc::EEXIST) =>
            {
                kept += 1
            }
            Err(e) => return Err(map_err(name)(e)),
        }
    }
    Ok((written, kept))
}

/// Adds the conntrack entries of flows another proxy began (a takeover from kube-proxy) to
/// the assured table of `pins`, keeping any entry already there (a rerun, or a flow xlb
/// itself began meanwhile). Returns how many were written.
pub fn adopt_assured(
    pins: &Pins,
    v4: &[(CtKey, CtValue)],
    v6: &[(lb_common::CtKey6, lb_common::CtValue6)],
) -> Result<usize, DatapathError> {
    let mut written = 0;
    if !v4.is_empty() {
        written += insert_all(pins, lb_common::MAP_CT_ASSURED, v4, true)?.0;
    }
    if !v6.is_empty() {
        written += insert_all(pins, lb_common::MAP_CT6_ASSURED, v6, true)?.0;
    }
    Ok(written)
}

/// Adds the affinity entries of adopted flows (a takeover) to the affinity map of `pins`,
/// keeping any entry already there. Returns how many were written.
pub fn adopt_affinity(
    pins: &Pins,
    items: &[(AffinityKey, lb_common::AffinityValue)],
) -> Result<usize, DatapathError> {
    if items.is_empty() {
        return Ok(0);
    }
    Ok(insert_all(pins, lb_common::MAP_AFFINITY, items, true)?.0)
}

impl Previous {
    /// The previous layout's pins beside this layout's `pins`, if any are there.
    pub fn find(pins: &Pins) -> Result<Option<Self>, DatapathError> {
        let dir = pins.dir();
        let v1 = prev::REPLACED.iter().any(|m| dir.join(m).exists());
        let later = [prev::MAP_SVC_V2, prev::MAP_SVC_NAME, prev::MAP_ADDR_FILTER];
        if !v1 && !later.iter().any(|m| dir.join(m).exists()) {
            return Ok(None);
        }
        let backends = entries::<u32, prev::Backend>(dir, prev::MAP_BACKEND)?
            .into_iter()
            .map(|(id, b)| (id, from_prev(&b)))
            .collect();
        let services = entries::<prev::SvcKey, prev::SvcValue>(dir, prev::MAP_SVC)?
            .into_iter()
            .filter(|(k, _)| k.slot == 0 && k.scope == SCOPE_EXTERNAL)
            .map(|(k, v)| (v.svc_id, prev::frontend(&k)))
            .collect();
        Ok(Some(Self {
            pins: pins.clone(),
            backends,
            services,
            v1,
        }))
    }

    /// Copies the previous conntrack and affinity entries into this layout's maps, converted
    /// against what is programmed now (`current`); with `only_new`, only those not there yet.
    pub fn copy(&self, current: &Desired, only_new: bool) -> Result<Copied, DatapathError> {
        if !self.v1 {
            return Ok(Copied::default());
        }
        let m = Mapping::new(self.backends.clone(), self.services.clone(), current);
        let mut c = Copied::default();
        let old_ct = entries::<prev::CtKey, prev::CtValue>(self.pins.dir(), prev::MAP_CT)?;
        let ct: Vec<(CtKey, CtValue)> = old_ct
            .iter()
            .filter_map(|(k, v)| convert_ct(k, v, &m))
            .collect();
        c.skipped += old_ct.len() - ct.len();
        let (written, kept) = insert_all(&self.pins, MAP_CT, &ct, only_new)?;
        c.conntrack = written;
        c.skipped += kept;
        let old_aff =
            entries::<AffinityKey, prev::AffinityValue>(self.pins.dir(), prev::MAP_AFFINITY)?;
        let aff: Vec<(AffinityKey, AffinityValue)> = old_aff
            .iter()
            .filter_map(|(k, v)| convert_affinity(k, v, &m))
            .collect();
        c.skipped += old_aff.len() - aff.len();
        let (written, kept) = insert_all(&self.pins, MAP_AFFINITY, &aff, only_new)?;
        c.affinity = written;
        c.skipped += kept;
        Ok(c)
    }

    /// Removes the previous layouts' pins; returns how many there were.
    pub fn finish(self) -> usize {
        prev::REPLACED
            .iter()
            .chain([
                &prev::MAP_SVC_V2,
                &prev::MAP_SVC_NAME,
                &prev::MAP_ADDR_FILTER,
            ])
            .filter(|m| std::fs::remove_file(self.pins.dir().join(m)).is_ok())
            .count()
    }
}

/// The address filters of the layout before (`prev::MAP_ADDR_FILTER`, pinned beside this
/// layout's, which was sized as it: `MapSizes::keeping_pinned_filter`): its words ORed into
/// this layout's filter map before the agent reads that map, so the bits of addresses gone
/// less than a day stay set (both layouts number the bits of two filters of one size
/// alike). Returns how many words held bits, or `None` when nothing was adopted (none
/// pinned, or of another size, where this agent programs its own bits).
pub fn adopt_filter(pins: &Pins) -> Result<Option<usize>, DatapathError> {
    let name = prev::MAP_ADDR_FILTER;
    let path = pins.dir().join(name);
    if !path.exists() {
        return Ok(None);
    }
    let data = MapData::from_pin(path).map_err(map_err(name))?;
    let map = aya::maps::Map::from_map_data(data).map_err(map_err(name))?;
    let old: Array<MapData, u64> = Array::try_from(map).map_err(map_err(name))?;
    let mut new: Array<MapData, u64> =
        Array::try_from(pins.map(MAP_ADDR_FILTER)?).map_err(map_err(MAP_ADDR_FILTER))?;
    if old.len() != new.len() {
        return Ok(None);
    }
    let mut words = 0;
    for i in 0..old.len() {
        let w = old.get(&i, 0).map_err(map_err(name))?;
        if w == 0 {
            continue;
        }
        let have = new.get(&i, 0).map_err(map_err(MAP_ADDR_FILTER))?;
        new.set(i, have | w, 0).map_err(map_err(MAP_ADDR_FILTER))?;
        words += 1;
    }
    Ok(Some(words))
}

/// The names of the retired names map (`prev::MAP_SVC_NAME`) pinned beside this layout's
/// maps, written as the names file when there is none yet (a file there is newer: an agent
/// of this layout wrote it, and stopped before it removed the pin). Returns how many names,
/// or `None` when nothing was adopted.
pub fn adopt_names(pins: &Pins) -> Result<Option<usize>, DatapathError> {
    let dir = pins.dir();
    if !dir.join(prev::MAP_SVC_NAME).exists() || names_file::path(dir).exists() {
        return Ok(None);
    }
    let old = entries::<u32, lb_common::SvcName>(dir, prev::MAP_SVC_NAME)?;
    let names: Vec<(u32, String)> = old
        .iter()
        .map(|(id, n)| (*id, lb_common::user::svc_name_str(n)))
        .collect();
    let written = names_file::replace(dir, names.iter().map(|(id, n)| (*id, n.as_str()))).map_err(
        |source| DatapathError::NamesFile {
            path: names_file::path(dir),
            source,
        },
    )?;
    Ok(Some(written))
}

/// The frontends of the layout before slot ranges (`prev::MAP_SVC_V2`, pinned beside this
/// layout's maps), each with its service index (and no slots), and the backends its slots
/// name in the backend array both layouts share: what this agent adopts its indices from.
/// `None` when it is not pinned.
pub fn slotted_indices(pins: &Pins) -> Result<Option<Desired>, DatapathError> {
    let dir = pins.dir();
    if !dir.join(prev::MAP_SVC_V2).exists() {
        return Ok(None);
    }
    let old = entries::<prev::SvcKey, prev::SvcValue>(dir, prev::MAP_SVC_V2)?;
    let backends: Array<MapData, Backend> =
        Array::try_from(pins.map(MAP_BACKEND)?).map_err(map_err(MAP_BACKEND))?;
    let mut d = Desired::default();
    for (k, v) in &old {
        if k.slot == 0 {
            let value = SvcValue {
                svc_id: v.svc_id,
                flags: v.flags,
                affinity_timeout_s: v.affinity_timeout_s,
                ..SvcValue::default()
            };
            d.services
                .insert(prev::frontend(k), SvcEntry::new(value, []));
        } else if let Ok(be) = backends.get(&v.backend_id, 0)
            && be.generation != 0
        {
            d.backends.insert(v.backend_id, be);
        }
    }
    Ok(Some(d))
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use lb_common::{CT_DIR_FORWARD, CT_F_SNAT, IPPROTO_TCP};

    use lb_common::user::{backend_value, frontend_key};

    use super::*;
    use crate::model::Protocol;

    fn be(last: u8) -> Backend {
        backend_value(Ipv4Addr::new(10, 244, 0, last), 8080, Protocol::Tcp)
    }

    /// Old ids 40 (web) and 7, 8 (two backends); now web is index 3 with affinity and backend
    /// 10.244.0.1 index 5 generation 11; 10.244.0.2 is gone.
    fn mapping() -> Mapping {
        let web = frontend_key(Ipv4Addr::new(10, 96, 0, 10), 80, Protocol::Tcp);
        let mut current = Desired::default();
        current.services.insert(
            web,
            crate::desired::SvcEntry::new(
                lb_common::SvcValue {
                    svc_id: 3,
                    count: 1,
                    affinity_timeout_s: 60,
                    ..Default::default()
                },
                [5],
            ),
        );
        current.backends.insert(
            5,
            Backend {
                generation: 11,
                ..be(1)
            },
        );
        Mapping::new(
            [(7, be(1)), (8, be(2))].into_iter().collect(),
            [(40, web)].into_iter().collect(),
            &current,
        )
    }

    fn old_entry(backend_id: u32) -> (prev::CtKey, prev::CtValue) {
        let a = |x: [u8; 4]| [u32::from_ne_bytes(x), 0, 0, 0];
        (
            prev::CtKey {
                saddr_be: a([10, 244, 9, 2]),
                daddr_be: a([10, 96, 0, 10]),
                sport_be: 40000u16.to_be(),
                dport_be: 80u16.to_be(),
                proto: IPPROTO_TCP,
                family: FAMILY_V4,
                dir: CT_DIR_FORWARD,
                _pad: 0,
            },
            prev::CtValue {
                saddr_be: a([10, 244, 9, 2]),
                daddr_be: a([10, 244, 0, 1]),
                sport_be: 40000u16.to_be(),
                dport_be: 8080u16.to_be(),
                backend_id,
                svc_id: 40,
                flags: CT_F_SNAT,
                mtu: 1400,
                created_ns: 5,
                last_seen_ns: 6,
            },
        )
    }

    #[test]
    fn a_flow_keeps_its_tuple_and_gets_the_new_indices() {
        let (k, v) = old_entry(7);
        let (nk, nv) = convert_ct(&k, &v, &mapping()).expect("converted");
        assert_eq!(
            (nk.saddr_be, nk.daddr_be, nk.sport_be, nk.dport_be, nk.dir),
            (k.saddr_be[0], k.daddr_be[0], k.sport_be, k.dport_be, k.dir)
        );
        assert_eq!((nv.daddr_be, nv.dport_be), (v.daddr_be[0], v.dport_be));
        assert_eq!((nv.backend_id, nv.backend_gen, nv.svc_id), (5, 11, 3));
        assert_eq!(
            nv.flags,
            CT_F_SNAT | CT_F_AFFINITY,
            "affinity from the service"
        );
        assert_eq!((nv.mtu, nv.created_ns, nv.last_seen_ns), (1400, 5, 6));
    }

    #[test]
    fn a_flow_whose_backend_is_gone_keeps_its_tuple_without_a_backend() {
        let (k, v) = old_entry(8);
        let (_, nv) = convert_ct(&k, &v, &mapping()).expect("converted");
        assert_eq!((nv.backend_id, nv.backend_gen), (0, 0));
        assert_eq!(nv.daddr_be, v.daddr_be[0], "the TCP flow still reaches it");
        let (mut k6, v6) = old_entry(7);
        k6.family = lb_common::FAMILY_V6;
        assert!(convert_ct(&k6, &v6, &mapping()).is_none());
    }

    #[test]
    fn affinity_moves_to_the_new_indices_or_is_dropped() {
        let k = AffinityKey {
            svc_id: 40,
            client_be: [u32::from_ne_bytes([10, 244, 9, 2]), 0, 0, 0],
            family: FAMILY_V4,
            _pad0: 0,
            _pad1: 0,
        };
        let v = prev::AffinityValue {
            backend_id: 7,
            slot: 1,
            _pad: 0,
            last_seen_ns: 9,
        };
        let (nk, nv) = convert_affinity(&k, &v, &mapping()).expect("converted");
        assert_eq!((nk.svc_id, nk.client_be), (3, k.client_be));
        assert_eq!(
            (nv.backend_id, nv.backend_gen, nv.slot, nv.last_seen_ns),
            (5, 11, 1, 9)
        );
        let gone = prev::AffinityValue { backend_id: 8, ..v };
        assert!(convert_affinity(&k, &gone, &mapping()).is_none());
        let other = AffinityKey { svc_id: 41, ..k };
        assert!(convert_affinity(&other, &v, &mapping()).is_none());
    }
}
