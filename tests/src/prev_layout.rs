//! The previous map layout ([`lb_common::prev`]) as an agent of that layout leaves it, built
//! from a fixture for the upgrade test: the pins an agent of this layout left with live flows
//! are rewritten into the previous layout's maps, with the previous layout's ids, while the
//! programs attached keep forwarding those flows from the maps they hold (as the previous
//! layout's programs would until an upgrade replaces them).

use std::{collections::BTreeMap, path::Path};

use aya::maps::{Array, HashMap, MapData};
use aya_obj::{
    EbpfSectionKind,
    maps::{LegacyMap, PinningType, bpf_map_def},
};
use lb_common::{
    AffinityKey, CtKey, CtValue, FAMILY_V4, MAP_AFFINITY, MAP_BACKEND, MAP_BACKEND_STATS,
    MAP_CONFIG, MAP_CT, MAP_CT_ASSURED, MAP_SLOT, MAP_SRC_RANGE, MAP_SVC, MAP_SVC_STATS, kind,
    prev,
};
use lb_userspace::datapath::{kernel::KernelMaps, names_file, writer::MapWriter};

/// The previous layout's backend ids are this layout's indices plus this…
pub const BACKEND_ID_OFFSET: u32 = 1000;
/// …and its service ids the service indices plus this (so a copy that forgot to convert
/// would name the wrong backends and services).
pub const SVC_ID_OFFSET: u32 = 100;

/// Creates and pins under `dir` a map of the previous layout.
fn create(
    dir: &Path,
    name: &str,
    map_type: u32,
    key_size: usize,
    value_size: usize,
    max_entries: u32,
    map_flags: u32,
) -> Result<MapData, String> {
    let obj = aya_obj::Map::Legacy(LegacyMap {
        def: bpf_map_def {
            map_type,
            key_size: key_size as u32,
            value_size: value_size as u32,
            max_entries,
            map_flags,
            id: 0,
            pinning: PinningType::None,
        },
        inner_def: None,
        section_index: 0,
        section_kind: EbpfSectionKind::Maps,
        symbol_index: None,
        data: Vec::new(),
    });
    let m = MapData::create(obj, name, None).map_err(|e| format!("create {name}: {e}"))?;
    m.pin(dir.join(name))
        .map_err(|e| format!("pin {name}: {e}"))?;
    Ok(m)
}

fn hash<K: aya::Pod, V: aya::Pod>(m: MapData) -> Result<HashMap<MapData, K, V>, String> {
    HashMap::try_from(aya::maps::Map::HashMap(m)).map_err(|e| e.to_string())
}

/// Rewrites the pins under `dir` (this layout's, left by a stopped agent) into the previous
/// layout: this layout's changed maps are unpinned (the attached programs keep them), and
/// the previous layout's are pinned in their place holding the same services, backends and
/// flows under the previous layout's ids. Returns the conntrack entries written.
pub fn downgrade(dir: &Path) -> Result<usize, String> {
    let pins = crate::pins(dir);
    let state = KernelMaps::open(&pins)
        .and_then(|m| Ok(m.read()?))
        .map_err(|e| e.to_string())?;
    // The previous layout had one conntrack table: the assured one's flows go into it too.
    let mut flows: Vec<(CtKey, CtValue)> = Vec::new();
    for name in [MAP_CT, MAP_CT_ASSURED] {
        let ct: HashMap<MapData, CtKey, CtValue> =
            HashMap::try_from(pins.map(name).map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
        flows.extend(ct.iter().filter_map(Result::ok));
    }
    for name in [
        MAP_SVC,
        MAP_SLOT,
        MAP_BACKEND,
        MAP_CT,
        MAP_CT_ASSURED,
        MAP_SVC_STATS,
        MAP_BACKEND_STATS,
        MAP_AFFINITY,
        MAP_SRC_RANGE,
        MAP_CONFIG,
        // Newer than the previous layout: its upgrade creates it.
        lb_common::MAP_SRC_RANGE6,
    ] {
        std::fs::remove_file(dir.join(name)).map_err(|e| format!("unpin {name}: {e}"))?;
    }
    write_services(dir, &state)?;
    write_backends(dir, &state)?;
    write_flows(dir, &flows)?;
    create_empty(dir)?;
    Ok(flows.len())
}

/// The previous layout's service map, with the previous layout's ids.
fn write_services(dir: &Path, state: &lb_userspace::desired::Desired) -> Result<(), String> {
    write_slotted(
        dir,
        prev::MAP_SVC,
        state,
        (SVC_ID_OFFSET, BACKEND_ID_OFFSET),
    )
}

/// A service map of the layouts before slot ranges (an entry per frontend at slot 0, an
/// entry per backend slot) pinned under `dir` as `name`, holding `state`'s frontends with
/// their ids plus `offsets` (service, backend).
fn write_slotted(
    dir: &Path,
    name: &str,
    state: &lb_userspace::desired::Desired,
    (svc_off, be_off): (u32, u32),
) -> Result<(), String> {
    let svc = create(
        dir,
        name,
        kind::HASH,
        std::mem::size_of::<prev::SvcKey>(),
        std::mem::size_of::<prev::SvcValue>(),
        65_536,
        0,
    )?;
    let mut svc: HashMap<MapData, prev::SvcKey, prev::SvcValue> = hash(svc)?;
    for (k, v) in &state.services {
        let key = prev::SvcKey {
            addr_be: k.addr_be,
            port_be: k.port_be,
            slot: 0,
            proto: k.proto,
            family: k.family,
            scope: k.scope,
            _pad: 0,
        };
        let entry = prev::SvcValue {
            backend_id: 0,
            count: v.count,
            flags: v.flags,
            svc_id: v.svc_id + svc_off,
            affinity_timeout_s: v.affinity_timeout_s,
        };
        for (i, id) in v.slots.iter().enumerate() {
            let slot = prev::SvcKey {
                slot: i as u16 + 1,
                ..key
            };
            let value = prev::SvcValue {
                backend_id: id + be_off,
                svc_id: entry.svc_id,
                ..prev::SvcValue::default()
            };
            svc.insert(slot, value, 0).map_err(|e| e.to_string())?;
        }
        svc.insert(key, entry, 0).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Rewrites the pins under `dir` (this layout's, left by a stopped agent) into the layout
/// before slot ranges: the service map and the slot array are unpinned (the attached
/// programs keep them) and `XLB_SVC_V2` is pinned holding the same frontends, service and
/// backend indices (the backend array, conntrack and affinity are that layout's as they
/// are). Returns the frontends written.
pub fn downgrade_slots(dir: &Path) -> Result<usize, String> {
    let pins = crate::pins(dir);
    let state = KernelMaps::open(&pins)
        .and_then(|m| Ok(m.read()?))
        .map_err(|e| e.to_string())?;
    for name in [MAP_SVC, MAP_SLOT] {
        std::fs::remove_file(dir.join(name)).map_err(|e| format!("unpin {name}: {e}"))?;
    }
    write_slotted(dir, prev::MAP_SVC_V2, &state, (0, 0))?;
    // That layout kept the names in the kernel too.
    downgrade_names(dir)?;
    Ok(state.services.len())
}

/// Moves the names of the agent's names file under `dir` into the names map of the layouts
/// before the names left the kernel (`prev::MAP_SVC_NAME`, pinned there), and removes the
/// file: the pins as such an agent leaves them. Returns the names, by service index.
pub fn downgrade_names(dir: &Path) -> Result<BTreeMap<u32, String>, String> {
    let names = names_file::read(dir)
        .map_err(|e| format!("names file: {e}"))?
        .ok_or("no names file")?;
    let map = create(
        dir,
        prev::MAP_SVC_NAME,
        kind::HASH,
        std::mem::size_of::<u32>(),
        std::mem::size_of::<lb_common::SvcName>(),
        lb_common::SVC_NAME_MAP_CAPACITY,
        0,
    )?;
    let mut map: HashMap<MapData, u32, lb_common::SvcName> = hash(map)?;
    for (id, name) in &names {
        map.insert(id, lb_common::user::svc_name(name), 0)
            .map_err(|e| e.to_string())?;
    }
    names_file::remove(dir).map_err(|e| format!("names file: {e}"))?;
    Ok(names)
}

/// Moves the address filters pinned under `dir` (`XLB_ADDRFILT_V2`, two filters of one
/// size, as at the default capacities) into the layout before (`prev::MAP_ADDR_FILTER`),
/// with the bit `extra` (numbered `word * 64 + bit`) set as well, as a bit of an address
/// gone less than a day would be: the pins as such an agent leaves them (the programs
/// attached keep the map they hold). Returns the words copied.
pub fn downgrade_filter(dir: &Path, extra: u32) -> Result<usize, String> {
    let path = dir.join(lb_common::MAP_ADDR_FILTER);
    let data = MapData::from_pin(&path).map_err(|e| format!("open the filters: {e}"))?;
    let map = aya::maps::Map::from_map_data(data).map_err(|e| e.to_string())?;
    let now: Array<MapData, u64> = Array::try_from(map).map_err(|e| e.to_string())?;
    let size = lb_common::FilterSize::from_entries(now.len());
    if size.front_log2() != size.log2() {
        return Err(format!(
            "{size:?}: the layout before had two filters of one size"
        ));
    }
    let old = create(
        dir,
        prev::MAP_ADDR_FILTER,
        kind::ARRAY,
        std::mem::size_of::<u32>(),
        std::mem::size_of::<u64>(),
        now.len(),
        0,
    )?;
    let map = aya::maps::Map::from_map_data(old).map_err(|e| e.to_string())?;
    let mut old: Array<MapData, u64> = Array::try_from(map).map_err(|e| e.to_string())?;
    let mut copied = 0;
    for i in 0..now.len() {
        let mut w = now.get(&i, 0).map_err(|e| e.to_string())?;
        if i == extra / 64 {
            w |= 1 << (extra % 64);
        }
        if w != 0 {
            old.set(i, w, 0).map_err(|e| e.to_string())?;
            copied += 1;
        }
    }
    std::fs::remove_file(&path).map_err(|e| format!("unpin the filters: {e}"))?;
    Ok(copied)
}

/// The set bits of the address filters pinned under `dir` (this layout's), numbered
/// `word * 64 + bit`.
pub fn filter_bits(dir: &Path) -> Result<std::collections::BTreeSet<u32>, String> {
    let data = MapData::from_pin(dir.join(lb_common::MAP_ADDR_FILTER))
        .map_err(|e| format!("open the filters: {e}"))?;
    let map = aya::maps::Map::from_map_data(data).map_err(|e| e.to_string())?;
    let now: Array<MapData, u64> = Array::try_from(map).map_err(|e| e.to_string())?;
    let mut bits = std::collections::BTreeSet::new();
    for i in 0..now.len() {
        let w = now.get(&i, 0).map_err(|e| e.to_string())?;
        bits.extend((0..64).filter(|b| w & (1 << b) != 0).map(|b| i * 64 + b));
    }
    Ok(bits)
}

/// The previous layout's backend map (a hash, no slots).
fn write_backends(dir: &Path, state: &lb_userspace::desired::Desired) -> Result<(), String> {
    let size = std::mem::size_of::<u32>();
    let be = create(
        dir,
        prev::MAP_BACKEND,
        kind::HASH,
        size,
        std::mem::size_of::<prev::Backend>(),
        65_536,
        0,
    )?;
    let mut be: HashMap<MapData, u32, prev::Backend> = hash(be)?;
    for (id, b) in &state.backends {
        let old = prev::Backend {
            addr_be: b.addr_be,
            port_be: b.port_be,
            proto: b.proto,
            family: b.family,
            flags: b.flags,
            _pad: [0; 3],
        };
        be.insert(id + BACKEND_ID_OFFSET, old, 0)
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The previous layout's conntrack map (IPv6-wide addresses), holding `flows`.
fn write_flows(dir: &Path, flows: &[(CtKey, CtValue)]) -> Result<(), String> {
    let old_ct = create(
        dir,
        prev::MAP_CT,
        kind::LRU_HASH,
        std::mem::size_of::<prev::CtKey>(),
        std::mem::size_of::<prev::CtValue>(),
        262_144,
        0,
    )?;
    let mut old_ct: HashMap<MapData, prev::CtKey, prev::CtValue> =
        HashMap::try_from(aya::maps::Map::LruHashMap(old_ct)).map_err(|e| e.to_string())?;
    for (k, v) in flows {
        let key = prev::CtKey {
            saddr_be: [k.saddr_be, 0, 0, 0],
            daddr_be: [k.daddr_be, 0, 0, 0],
            sport_be: k.sport_be,
            dport_be: k.dport_be,
            proto: k.proto,
            family: FAMILY_V4,
            dir: k.dir,
            _pad: 0,
        };
        let value = prev::CtValue {
            saddr_be: [v.saddr_be, 0, 0, 0],
            daddr_be: [v.daddr_be, 0, 0, 0],
            sport_be: v.sport_be,
            dport_be: v.dport_be,
            backend_id: v.backend_id + BACKEND_ID_OFFSET,
            svc_id: v.svc_id + SVC_ID_OFFSET,
            flags: v.flags,
            mtu: v.mtu,
            created_ns: v.created_ns,
            last_seen_ns: v.last_seen_ns,
        };
        old_ct.insert(key, value, 0).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The previous layout's counter, affinity and source-range maps, empty.
fn create_empty(dir: &Path) -> Result<(), String> {
    const NO_PREALLOC: u32 = 1;
    let size = std::mem::size_of::<u32>();
    for name in ["XLB_SVCSTAT_V1", "XLB_BESTAT_V1"] {
        create(dir, name, kind::PERCPU_HASH, size, 16, 65_536, NO_PREALLOC)?;
    }
    create(
        dir,
        prev::MAP_AFFINITY,
        kind::LRU_HASH,
        std::mem::size_of::<AffinityKey>(),
        std::mem::size_of::<prev::AffinityValue>(),
        65_536,
        0,
    )?;
    create(
        dir,
        "XLB_SRCRNG_V1",
        kind::LPM_TRIE,
        4 + std::mem::size_of::<lb_common::SrcRangeKey>(),
        size,
        16_384,
        NO_PREALLOC,
    )?;
    // The node configuration before the IPv6 hairpin address (24 bytes); retired, not
    // carried over: the new agent writes its own.
    create(dir, "XLB_CFG_V2", kind::ARRAY, size, 24, 1, 0)?;
    Ok(())
}
