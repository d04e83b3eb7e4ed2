//! The catalogue of pinned maps: every name the object defines and, for each, the kind,
//! key and value sizes kernel and agent agree on (pinning, upgrades, `xlb list`, cleanup and
//! a test of the object go by it).

use core::mem::size_of;

use crate::maps::*;

/// Every map the object defines, in the order `xlb cleanup` removes them.
pub const ALL_MAPS: [&str; 18] = [
    MAP_SVC,
    MAP_SLOT,
    MAP_BACKEND,
    MAP_CT,
    MAP_CT_ASSURED,
    MAP_STATS,
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
/// CPU for per-CPU maps), and what docs/maps.md says of it. lb-ebpf's statics must match
/// this (a test loads the object and checks every map against it); docs/maps.md's table is
/// rendered from it (a test fails when the page differs; `XLB_BLESS=1` rewrites it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapDef {
    pub name: &'static str,
    pub kind: u32,
    pub key_size: usize,
    pub value_size: usize,
    pub doc: MapDoc,
}

/// What the maps' page says of a map besides its name, kind and sizes (Markdown).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapDoc {
    /// After the kind's name, e.g. ` (new flows)`.
    pub kind_note: &'static str,
    /// Key → value, field by field, and the layout's history.
    pub what: &'static str,
    /// Who writes it (and who deletes from it).
    pub writer: &'static str,
    /// Its capacity and eviction, after the key and value sizes.
    pub capacity: &'static str,
}

const fn def(name: &'static str, kind: u32, key_size: usize, value_size: usize) -> MapDef {
    MapDef {
        name,
        kind,
        key_size,
        value_size,
        doc: MapDoc {
            kind_note: "",
            what: "",
            writer: "",
            capacity: "",
        },
    }
}

impl MapDef {
    const fn doc(
        mut self,
        kind_note: &'static str,
        what: &'static str,
        writer: &'static str,
        capacity: &'static str,
    ) -> Self {
        self.doc = MapDoc {
            kind_note,
            what,
            writer,
            capacity,
        };
        self
    }
}

/// A map kind's name as the maps' page writes it.
pub const fn kind_name(kind: u32) -> &'static str {
    match kind {
        kind::HASH => "hash",
        kind::ARRAY => "array",
        kind::PERCPU_HASH => "per-CPU hash",
        kind::PERCPU_ARRAY => "per-CPU array",
        kind::LRU_HASH => "LRU hash",
        kind::LPM_TRIE => "LPM trie",
        kind::DEVMAP_HASH => "devmap hash",
        _ => "other",
    }
}

/// Every pinned map, in [`ALL_MAPS`] order.
pub const MAP_DEFS: [MapDef; 18] = [
    def(
        MAP_SVC,
        kind::HASH,
        size_of::<SvcKey>(),
        size_of::<SvcValue>(),
    )
    .doc(r#""#, r#"`SvcKey{addr_be, port_be, proto, family, scope}` (scope 1: the internal entry of a two-scope frontend, socket hooks only) → `SvcValue{slot_base, count, flags, svc_id, affinity_timeout_s}`: a frontend's entry, its `count` backends in slots `slot_base..slot_base + count` of `XLB_SLOT_V1`, the service's dense index `svc_id`. (V3: frontends only; V2 held an entry per backend slot, V1 hash ids)"#, r#"agent"#, r#"65,536 (`--service-map-max`; a map pinned at another size keeps it unless the flag asks)"#),
    def(MAP_SLOT, kind::ARRAY, size_of::<u32>(), size_of::<u32>())
    .doc(r#""#, r#"slot → backend index (into `XLB_BE_V2`): a frontend's slot `n` (`1..=count`) is element `slot_base + n - 1`. Each frontend owns a power-of-two range aligned to its size (`reconcile::slots`, a buddy allocator); a frontend that outgrows its range gets a new one, written before its entry flips to it, and the old range is reused only after 5 minutes"#, r#"agent"#, r#"1,048,576 (`--slot-map-max`), preallocated"#),
    def(
        MAP_BACKEND,
        kind::ARRAY,
        size_of::<u32>(),
        size_of::<Backend>(),
    )
    .doc(r#""#, r#"backend index → `Backend{addr_be, port_be, proto, family, flags, generation}`; generation 0 = no backend. Indices are handed out by the agent (`desired::ids`): reused only after 5 minutes free, each time with a new generation (never reused while the agent runs), so a flow's (index, generation) never names another backend"#, r#"agent"#, r#"262,144, preallocated"#),
    def(
        MAP_CT,
        kind::LRU_HASH,
        size_of::<CtKey>(),
        size_of::<CtValue>(),
    )
    .doc(r#" (new flows)"#, r#"`CtKey{saddr_be, daddr_be, sport_be, dport_be, proto, dir}` (IPv4; IPv6 flows are in `XLB_CT6_V1`) → `CtValue{saddr_be, daddr_be, sport_be, dport_be, backend_id, backend_gen, svc_id, flags, mtu, pending, created_ns, last_seen_ns}`, the tuple the packet is rewritten to and the indices its counters and checks need (`pending`: an assured entry's packets and bytes not yet in the counter rows); two entries per flow (forward: client→frontend, reply: backend→client or SNAT address; a SNATed flow's reply key holds its port); `CT_F_AFFINITY` marks a flow whose packets refresh their client's affinity"#, r#"datapath"#, r#"262,144, LRU eviction"#),
    def(
        MAP_CT_ASSURED,
        kind::HASH,
        size_of::<CtKey>(),
        size_of::<CtValue>(),
    )
    .doc(r#" (allocated as used)"#, r#"as `XLB_CT_V3`; entries flagged `CT_F_ASSURED`: the flows that were answered and went on, moved here by the datapath (reply entry first)"#, r#"datapath (moves flows in); the agent deletes flows that are over, every 5 s"#, r#"the conntrack size, no eviction (full: flows stay in the LRU table, `ct_assured_full`)"#),
    def(
        MAP_STATS,
        kind::PERCPU_ARRAY,
        size_of::<u32>(),
        size_of::<Counter>(),
    )
    .doc(r#""#, r#"reason code → `Counter{packets, bytes}` (V5: `ct_assured_full` added; V6: `reply_in`, `snat_out` of tc egress; V7: `ct_superseded`; V8: `dsr_in`, `dsr_out`; an agent removes a pinned `XLB_STATS_V4` … `_V7`, so counters restart on that upgrade)"#, r#"datapath"#, r#"29 entries (one per reason code)"#),
    def(
        MAP_SVC_STATS,
        kind::ARRAY,
        size_of::<u32>(),
        size_of::<Counter>(),
    )
    .doc(r#", a row per CPU"#, r#"`cpu × XLB_SVC_STRIDE + service index` → `Counter{packets, bytes}` forwarded for the service, both directions (V3 as `XLB_BESTAT_V3`)"#, r#"datapath adds to its CPU's row (an assured flow's packets about once a second, from its conntrack entries' `pending`); the agent zeroes an index in every row when it hands it out"#, r#"65,536 by default (`--service-ports-max`; by default one per `--service-map-max` entry, at least 65,536) per possible CPU, preallocated"#),
    def(
        MAP_BACKEND_STATS,
        kind::ARRAY,
        size_of::<u32>(),
        size_of::<Counter>(),
    )
    .doc(r#", a row per CPU"#, r#"`cpu × XLB_BE_STRIDE + backend index` → `Counter{packets, bytes}` to and from the backend (V3: CPU-major plain array; an agent removes a pinned per-CPU `XLB_BESTAT_V2`, so these counters restart on that upgrade)"#, r#"datapath adds to its CPU's row (an assured flow's packets about once a second, from its conntrack entries' `pending`); the agent zeroes an index in every row when it hands it out"#, r#"the backend array's size (262,144) per possible CPU, preallocated"#),
    def(
        MAP_AFFINITY,
        kind::LRU_HASH,
        size_of::<AffinityKey>(),
        size_of::<AffinityValue>(),
    )
    .doc(r#""#, r#"`AffinityKey{svc_id, client_be, family}` → `AffinityValue{backend_id, slot, backend_gen, last_seen_ns}`"#, r#"datapath"#, r#"65,536, LRU eviction"#),
    def(
        MAP_CONFIG,
        kind::ARRAY,
        size_of::<u32>(),
        size_of::<NodeConfig>(),
    )
    .doc(r#""#, r#"0 → `NodeConfig{snat_port_min, snat_port_max, hairpin_addr_be, flags, host_netns_cookie, hairpin6_addr_be}` (V3: the IPv6 hairpin address; an agent removes a pinned `XLB_CFG_V2`, which it would write whole anyway)"#, r#"agent (at start)"#, r#"1"#),
    // An LPM trie key is its prefix length (u32) and the data.
    def(
        MAP_SRC_RANGE,
        kind::LPM_TRIE,
        4 + size_of::<SrcRangeKey>(),
        size_of::<u32>(),
    )
    .doc(r#""#, r#"`{32 + len, SrcRangeKey{svc_id_be, addr_be}}` → 1: the IPv4 loadBalancerSourceRanges of frontends flagged for them (V2: dense service indices)"#, r#"agent"#, r#"16,384"#),
    // A devmap value is `struct bpf_devmap_val` (ifindex, program fd).
    def(MAP_XDP_TX, kind::DEVMAP_HASH, size_of::<u32>(), 8)
    .doc(r#""#, r#"ifindex → ifindex: interfaces XDP may redirect to"#, r#"agent (as it attaches XDP)"#, r#"256"#),
    def(
        MAP_SOCK,
        kind::LRU_HASH,
        size_of::<SockKey>(),
        size_of::<SockValue>(),
    )
    .doc(r#""#, r#"`SockKey{cookie, addr_be, port_be, family, dir, proto}` → `SockValue{addr_be, port_be, slot, id}`: reverse (a socket's backend → the frontend it asked for), forward (an unconnected UDP socket's frontend → its backend, by index; reused only while that index still holds the same address and port, so entries an older layout wrote are harmless)"#, r#"socket hooks; the agent reads it and removes entries of destroyed sockets"#, r#"262,144, LRU eviction"#),
    def(
        MAP_ADDR_FILTER,
        kind::ARRAY,
        size_of::<u32>(),
        size_of::<u64>(),
    )
    .doc(r#""#, r#"word index → 64 bits: words `0..words` the (hashed, `lb_common::FilterSize::bit`) addresses that may be frontends, the rest (as many words or more, `lb_common::FilterSize::backend_bit_of`) those that may be backends; a clear bit lets the datapath skip the conntrack and service lookups on that side"#, r#"agent (bits set before the entries that need them, cleared a day after their last address went)"#, r#"sized at load, four bits per address: the frontends' filter by the service arrays' capacity, the backends' by the backend map's (or the service arrays', the larger): 32,768 words (256 KiB) at the default capacities, up to 4 Mi words (32 MiB)"#),
    def(
        crate::v6::MAP_CT6,
        kind::LRU_HASH,
        size_of::<crate::v6::CtKey6>(),
        size_of::<crate::v6::CtValue6>(),
    )
    .doc(r#" (new flows)"#, r#"`CtKey6{saddr_be[4], daddr_be[4], sport_be, dport_be, proto, dir}` → `CtValue6` (as `CtValue`, IPv6 addresses): IPv6 flows, as `XLB_CT_V3` (a new map: an IPv4-only node's pinned flows are untouched by an upgrade)"#, r#"datapath"#, r#"the conntrack size, LRU eviction"#),
    def(
        crate::v6::MAP_CT6_ASSURED,
        kind::HASH,
        size_of::<crate::v6::CtKey6>(),
        size_of::<crate::v6::CtValue6>(),
    )
    .doc(r#" (allocated as used)"#, r#"as `XLB_CT6_V1`; the IPv6 flows that were answered and went on, as `XLB_CTA_V1`"#, r#"datapath (moves flows in); the agent deletes flows that are over, every 5 s"#, r#"the conntrack size, no eviction"#),
    def(
        crate::v6::MAP_SRC_RANGE6,
        kind::LPM_TRIE,
        4 + size_of::<crate::v6::SrcRangeKey6>(),
        size_of::<u32>(),
    )
    .doc(r#""#, r#"`{32 + len, SrcRangeKey6{svc_id_be, addr_be[4]}}` → 1: the IPv6 loadBalancerSourceRanges, as `XLB_SRCRNG_V2` (a new map: an IPv4-only node's pinned ranges are untouched by an upgrade)"#, r#"agent"#, r#"16,384"#),
    def(
        MAP_MAGLEV,
        kind::HASH,
        size_of::<u32>(),
        size_of::<MaglevRow>(),
    )
    .doc(r#", not preallocated"#, r#"service index → `MaglevRow{size, slots[16384]}`: an external frontend's Maglev table (`--lb-algorithm maglev`, #24): entry `flow_hash % size` holds the backend slot a new flow goes to, for a frontend whose `SvcValue` is flagged `SVC_F_MAGLEV`. Read by `select::xlb_maglev_slot` (a global BPF function). (V1, an array of rows named by slot 0's `backend_id`, is retired.)"#, r#"agent (a table before its entry is flagged, replaced whole in one update, removed after the flag)"#, r#"8,192 tables (`--maglev-map-max`), 64 KiB each in the kernel's allocator (measured), memory only for the tables written"#),
];
