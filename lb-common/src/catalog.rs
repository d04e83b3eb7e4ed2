//! The catalogue of pinned maps: every name the object defines and, for each, the kind,
//! key and value sizes kernel and agent agree on (pinning, upgrades, `xlb list`, cleanup and
//! a test of the object go by it).

use core::mem::size_of;

use crate::maps::*;

/// Every map the object defines, in the order `xlb cleanup` removes them.
pub const ALL_MAPS: [&str; 18] = [
    MAP_SVC,
    MAP_BACKEND,
    MAP_CT,
    MAP_CT_ASSURED,
    MAP_STATS,
    MAP_SVC_NAME,
    MAP_SVC_STATS,
    MAP_BACKEND_STATS,
    MAP_AFFINITY,
    MAP_CONFIG,
    MAP_SRC_RANGE,
    MAP_XDP_TX,
    MAP_SOCK,
    MAP_ADDR_FILTER,
    crate::v6::MAP_CT6,
    crate::v6::MAP_CT6_ASSURED,
    crate::v6::MAP_SRC_RANGE6,
    MAP_MAGLEV,
];

/// Kernel map kinds (`enum bpf_map_type`) of the maps in [`MAP_DEFS`].
pub mod kind {
    pub const HASH: u32 = 1;
    pub const ARRAY: u32 = 2;
    pub const PERCPU_HASH: u32 = 5;
    pub const PERCPU_ARRAY: u32 = 6;
    pub const LRU_HASH: u32 = 9;
    pub const LPM_TRIE: u32 = 11;
    pub const DEVMAP_HASH: u32 = 25;
}

/// One map as kernel and agent agree on it: its pinned name, kind, key and value sizes (per
/// CPU for per-CPU maps). lb-ebpf's statics must match this (a test loads the object and
/// checks every map against it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapDef {
    pub name: &'static str,
    pub kind: u32,
    pub key_size: usize,
    pub value_size: usize,
}

const fn def(name: &'static str, kind: u32, key_size: usize, value_size: usize) -> MapDef {
    MapDef {
        name,
        kind,
        key_size,
        value_size,
    }
}

/// Every pinned map, in [`ALL_MAPS`] order.
pub const MAP_DEFS: [MapDef; 18] = [
    def(
        MAP_SVC,
        kind::HASH,
        size_of::<SvcKey>(),
        size_of::<SvcValue>(),
    ),
    def(
        MAP_BACKEND,
        kind::ARRAY,
        size_of::<u32>(),
        size_of::<Backend>(),
    ),
    def(
        MAP_CT,
        kind::LRU_HASH,
        size_of::<CtKey>(),
        size_of::<CtValue>(),
    ),
    def(
        MAP_CT_ASSURED,
        kind::HASH,
        size_of::<CtKey>(),
        size_of::<CtValue>(),
    ),
    def(
        MAP_STATS,
        kind::PERCPU_ARRAY,
        size_of::<u32>(),
        size_of::<Counter>(),
    ),
    def(
        MAP_SVC_NAME,
        kind::HASH,
        size_of::<u32>(),
        size_of::<SvcName>(),
    ),
    def(
        MAP_SVC_STATS,
        kind::ARRAY,
        size_of::<u32>(),
        size_of::<Counter>(),
    ),
    def(
        MAP_BACKEND_STATS,
        kind::ARRAY,
        size_of::<u32>(),
        size_of::<Counter>(),
    ),
    def(
        MAP_AFFINITY,
        kind::LRU_HASH,
        size_of::<AffinityKey>(),
        size_of::<AffinityValue>(),
    ),
    def(
        MAP_CONFIG,
        kind::ARRAY,
        size_of::<u32>(),
        size_of::<NodeConfig>(),
    ),
    // An LPM trie key is its prefix length (u32) and the data.
    def(
        MAP_SRC_RANGE,
        kind::LPM_TRIE,
        4 + size_of::<SrcRangeKey>(),
        size_of::<u32>(),
    ),
    // A devmap value is `struct bpf_devmap_val` (ifindex, program fd).
    def(MAP_XDP_TX, kind::DEVMAP_HASH, size_of::<u32>(), 8),
    def(
        MAP_SOCK,
        kind::LRU_HASH,
        size_of::<SockKey>(),
        size_of::<SockValue>(),
    ),
    def(
        MAP_ADDR_FILTER,
        kind::ARRAY,
        size_of::<u32>(),
        size_of::<u64>(),
    ),
    def(
        crate::v6::MAP_CT6,
        kind::LRU_HASH,
        size_of::<crate::v6::CtKey6>(),
        size_of::<crate::v6::CtValue6>(),
    ),
    def(
        crate::v6::MAP_CT6_ASSURED,
        kind::HASH,
        size_of::<crate::v6::CtKey6>(),
        size_of::<crate::v6::CtValue6>(),
    ),
    def(
        crate::v6::MAP_SRC_RANGE6,
        kind::LPM_TRIE,
        4 + size_of::<crate::v6::SrcRangeKey6>(),
        size_of::<u32>(),
    ),
    def(
        MAP_MAGLEV,
        kind::HASH,
        size_of::<u32>(),
        size_of::<MaglevRow>(),
    ),
];
