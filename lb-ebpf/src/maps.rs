//! The datapath's maps. Each comment says who writes it, key → value, size and eviction.

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    btf_maps::{HashMap, LruHashMap, PerCpuArray, PerCpuHashMap},
    macros::btf_map,
};
use lb_common::{
    AFFINITY_MAP_CAPACITY, AffinityKey, AffinityValue, BACKEND_MAP_CAPACITY, Backend,
    CT_MAP_CAPACITY, Counter, CtKey, CtValue, R_COUNT, SVC_MAP_CAPACITY, SVC_NAME_MAP_CAPACITY,
    SvcKey, SvcName, SvcValue,
};

/// Services. Written by the agent (make-before-break), read here.
/// `SvcKey{vip, port, proto, slot}` → `SvcValue`: slot 0 = service entry with the backend
/// count, slots 1..=count = backend ids. 24 B → 16 B, 262,144 entries, no eviction.
#[btf_map]
pub static XLB_SVC_V1: HashMap<SvcKey, SvcValue, { SVC_MAP_CAPACITY as usize }> = HashMap::new();

/// Backends. Written by the agent, read here. backend id (u32) → `Backend`.
/// 4 B → 24 B, 262,144 entries, no eviction.
#[btf_map]
pub static XLB_BE_V1: HashMap<u32, Backend, { BACKEND_MAP_CAPACITY as usize }> = HashMap::new();

/// Conntrack. Written here (two entries per flow), read by `xlb list conntrack`.
/// `CtKey{5-tuple, dir}` → `CtValue`. 40 B → 48 B, 262,144 entries, LRU eviction.
#[btf_map]
pub static XLB_CT_V1: LruHashMap<CtKey, CtValue, { CT_MAP_CAPACITY as usize }> = LruHashMap::new();

/// Counters. Written here (per CPU), read by `xlb list` and metrics.
/// reason code (u32) → `Counter{packets, bytes}`. `R_COUNT` entries, no eviction.
#[btf_map]
pub static XLB_STATS_V2: PerCpuArray<Counter, { R_COUNT as usize }> = PerCpuArray::new();

/// Service names for humans. Written by the agent, never read here.
/// svc id (u32) → `SvcName`. 4 B → 128 B, 65,536 entries, no eviction.
#[btf_map]
pub static XLB_SVCNAME_V1: HashMap<u32, SvcName, { SVC_NAME_MAP_CAPACITY as usize }> =
    HashMap::new();

/// Per-service counters. The agent creates (zeroed) and deletes an entry with each service
/// entry; the datapath only looks entries up and adds to its CPU's slot.
/// svc id (u32) → `Counter` per CPU. 65,536 entries, not preallocated, no eviction.
#[btf_map]
pub static XLB_SVCSTAT_V1: PerCpuHashMap<
    u32,
    Counter,
    { SVC_NAME_MAP_CAPACITY as usize },
    { BPF_F_NO_PREALLOC as usize },
> = PerCpuHashMap::new();

/// Session affinity (ClientIP). Written here: a new connection of a client records its
/// backend; later ones reuse it until `affinity_timeout_s` passes without a packet.
/// `AffinityKey{svc_id, client}` → `AffinityValue{backend_id, slot, last_seen_ns}`.
/// 24 B → 16 B, 65,536 entries, LRU eviction.
#[btf_map]
pub static XLB_AFF_V1: LruHashMap<AffinityKey, AffinityValue, { AFFINITY_MAP_CAPACITY as usize }> =
    LruHashMap::new();

/// Per-backend counters. The agent creates (zeroed) and deletes an entry with each backend;
/// the datapath only looks entries up and adds to its CPU's slot.
/// backend id (u32) → `Counter` per CPU. 262,144 entries, not preallocated, no eviction.
#[btf_map]
pub static XLB_BESTAT_V1: PerCpuHashMap<
    u32,
    Counter,
    { BACKEND_MAP_CAPACITY as usize },
    { BPF_F_NO_PREALLOC as usize },
> = PerCpuHashMap::new();
