//! The datapath's maps. Each comment says who writes it, key → value, size and eviction.

use aya_ebpf::{
    Global,
    bindings::BPF_F_NO_PREALLOC,
    btf_maps::{Array, DevMapHash, HashMap, LpmTrie, LruHashMap, PerCpuArray, lpm_trie::Key},
    macros::btf_map,
};
use lb_common::{
    AFFINITY_MAP_CAPACITY, AffinityKey, AffinityValue, BACKEND_MAP_CAPACITY, Backend,
    CT_MAP_CAPACITY, Counter, CtKey, CtValue, FILTER_WORDS, MAGLEV_MAP_CAPACITY, MaglevRow,
    NodeConfig, R_COUNT, SLOT_MAP_CAPACITY, SOCK_MAP_CAPACITY, SRC_RANGE_MAP_CAPACITY,
    SRC_RANGE6_MAP_CAPACITY, SVC_MAP_CAPACITY, SVC_NAME_MAP_CAPACITY, SockKey, SockValue,
    SrcRangeKey, SrcRangeKey6, SvcKey, SvcValue, XDP_TX_MAP_CAPACITY,
};

/// Services. Written by the agent (make-before-break: a frontend's slots before its entry),
/// read here for packets that match no flow (new flows) and by the socket hooks.
/// `SvcKey{vip, port, proto, family, scope}` → `SvcValue{slot_base, count, flags, svc
/// index, affinity timeout}`: frontends only. 24 B → 16 B, 262,144 entries (the agent sizes
/// it), no eviction.
#[btf_map]
pub static XLB_SVC_V3: HashMap<SvcKey, SvcValue, { SVC_MAP_CAPACITY as usize }> = HashMap::new();

/// Backend slots. Written by the agent (a frontend's range before the entry that names it;
/// a range it left is reused only after a quarantine), read here by new flows: slot `n` of
/// a frontend is element `slot_base + n - 1`. slot (u32) → backend index (u32). 4 B → 4 B,
/// 1,048,576 entries (the agent sizes it), an array: preallocated, nothing to evict.
#[btf_map]
pub static XLB_SLOT_V1: Array<u32, { SLOT_MAP_CAPACITY as usize }> = Array::new();

/// Maglev lookup tables. Written by the agent (a frontend's table before its entry is
/// flagged `SVC_F_MAGLEV`, a new table replacing the old in one update, removed after the
/// flag), read here by a new flow to a flagged frontend. service index (u32) →
/// `MaglevRow{size, slots}`. 4 B → 32,776 B (64 KiB in the kernel's allocator), 8,192
/// tables by default (the agent sizes it),
/// not preallocated (memory only for the tables written), no eviction.
#[btf_map]
pub static XLB_MAGLEV_V2: HashMap<
    u32,
    MaglevRow,
    { MAGLEV_MAP_CAPACITY as usize },
    { BPF_F_NO_PREALLOC as usize },
> = HashMap::new();

/// Backends. Written by the agent, read here for new flows and UDP flows. backend index
/// (u32) → `Backend{…, generation}` (0: no backend). 4 B → 32 B, 262,144 entries, an array:
/// preallocated, nothing to evict (the agent hands out indices, see `desired::ids`).
#[btf_map]
pub static XLB_BE_V2: Array<Backend, { BACKEND_MAP_CAPACITY as usize }> = Array::new();

/// Conntrack. Written here (two entries per flow), read by `xlb list conntrack`.
/// `CtKey{IPv4 5-tuple, dir}` → `CtValue{rewritten tuple, backend index and generation,
/// service index, flags, times}`. 16 B → 48 B, 262,144 entries, LRU eviction. A SNATed
/// flow's reply key holds the SNAT address and port, inserted with `BPF_NOEXIST`: that is
/// what keeps two flows from sharing a port.
#[btf_map]
pub static XLB_CT_V3: LruHashMap<CtKey, CtValue, { CT_MAP_CAPACITY as usize }> = LruHashMap::new();

/// Assured conntrack. Written here: a flow answered by its backend and continued by its
/// client moves both its entries out of `XLB_CT_V3` into this map, where no flood of new
/// flows evicts them. Deleted from by the agent (flows that are over: closed, reset or idle,
/// with kube-proxy's conntrack timeouts), read by `xlb list conntrack`. Same key and value
/// as `XLB_CT_V3`; a hash allocated as used, up to the conntrack size; no eviction: when
/// full, a flow stays in `XLB_CT_V3` (`ct_assured_full`).
#[btf_map]
pub static XLB_CTA_V1: HashMap<
    CtKey,
    CtValue,
    { CT_MAP_CAPACITY as usize },
    { BPF_F_NO_PREALLOC as usize },
> = HashMap::new();

/// Counters. Written here (per CPU), read by `xlb list` and metrics.
/// reason code (u32) → `Counter{packets, bytes}`. `R_COUNT` entries, no eviction.
#[btf_map]
pub static XLB_STATS_V8: PerCpuArray<Counter, { R_COUNT as usize }> = PerCpuArray::new();

/// Node configuration. Written by the agent at start, read here.
/// index 0 → `NodeConfig{SNAT port range, hairpin addresses (IPv4, IPv6), host netns cookie, flags}`.
/// 1 entry.
#[btf_map]
pub static XLB_CFG_V3: Array<NodeConfig, 1> = Array::new();

/// IPv4 loadBalancerSourceRanges. Written by the agent, read here for new flows to
/// frontends flagged `SVC_F_SRC_RANGES`. LPM `{32 + len, SrcRangeKey{svc index, range}}` → 1
/// (allowed). 12 B → 4 B, 16,384 entries, no eviction.
#[btf_map]
pub static XLB_SRCRNG_V2: LpmTrie<SrcRangeKey, u32, { SRC_RANGE_MAP_CAPACITY as usize }> =
    LpmTrie::new();

/// IPv6 loadBalancerSourceRanges, as `XLB_SRCRNG_V2` for IPv6 frontends. Written by the
/// agent, read here (tc, XDP, the IPv6 socket hooks) for new flows to frontends flagged
/// `SVC_F_SRC_RANGES`. LPM `{32 + len, SrcRangeKey6{svc index, range}}` → 1 (allowed).
/// 24 B → 4 B, 16,384 entries, no eviction.
#[btf_map]
pub static XLB_SRCRNG6_V1: LpmTrie<SrcRangeKey6, u32, { SRC_RANGE6_MAP_CAPACITY as usize }> =
    LpmTrie::new();

/// Interfaces XDP may redirect a translated packet to (XDP attached there, so the driver can
/// transmit XDP frames). Written by the agent as it attaches XDP, read by XDP. ifindex →
/// `bpf_devmap_val{ifindex}`. 4 B → 8 B, 256 entries, no eviction. A packet routed anywhere
/// else is translated and passed to the kernel's stack.
#[btf_map]
pub static XLB_XDPTX_V1: DevMapHash<{ XDP_TX_MAP_CAPACITY as usize }> = DevMapHash::new();

/// Where a new flow's conntrack entries are built (the stack is only 512 bytes): the IPv4
/// part of the per-CPU work area (`work::WorkArea`, 224 B). Kernel-only: never pinned, never
/// read by the agent.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct FlowScratch {
    pub fwd: CtValue,
    pub reply: CtValue,
    pub fwd_key: CtKey,
    pub reply_key: CtKey,
    /// An ICMP error's quoted header as received and as translated.
    pub quote_old: [u8; 28],
    pub quote_new: [u8; 28],
    /// A new flow's backend (chosen by one step, recorded by the next).
    pub chosen: Chosen,
}

/// The backend a new flow (or a socket) goes to: its index, the frontend's slot it was
/// chosen from, and the backend.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Chosen {
    pub id: u32,
    pub slot: u16,
    pub _pad: u16,
    pub backend: Backend,
}

impl Chosen {
    /// `*self = *from` field by field (`self` may be map memory, the work area: a struct
    /// copy there may become a `memmove`).
    #[inline(always)]
    pub fn set(&mut self, from: &Chosen) {
        self.id = from.id;
        self.slot = from.slot;
        self._pad = 0;
        let (d, s) = (&mut self.backend, &from.backend);
        copy_words(&mut d.addr_be, &s.addr_be);
        d.port_be = s.port_be;
        d.proto = s.proto;
        d.family = s.family;
        d.flags = s.flags;
        d._pad0 = 0;
        d._pad1 = 0;
        d.generation = s.generation;
        d._pad2 = 0;
    }
}

/// `*dst = *src` word by word, volatile (either may be map memory: an array copy could
/// become a `memmove`).
#[inline(always)]
pub fn copy_words(dst: &mut [u32; 4], src: &[u32; 4]) {
    for i in 0..4 {
        // SAFETY: both indices are in bounds.
        unsafe { core::ptr::write_volatile(&mut dst[i], core::ptr::read_volatile(&src[i])) };
    }
}

/// The trie key for a client of a frontend (full length: the most specific match).
#[inline(always)]
pub fn src_range_key(svc_id: u32, addr_be: u32) -> Key<SrcRangeKey> {
    Key::new(
        64,
        SrcRangeKey {
            svc_id_be: svc_id.to_be(),
            addr_be,
        },
    )
}

/// The IPv6 trie key for a client of a frontend (full length: the most specific match).
/// Word by word: `addr_be` may be map memory (an array copy could become a `memmove`).
#[inline(always)]
pub fn src_range6_key(svc_id: u32, addr_be: &[u32; 4]) -> Key<SrcRangeKey6> {
    Key::new(
        160,
        SrcRangeKey6 {
            svc_id_be: svc_id.to_be(),
            addr_be: [addr_be[0], addr_be[1], addr_be[2], addr_be[3]],
        },
    )
}

/// Per-service counters. Written here (each CPU adds to its own row), zeroed by the agent
/// when it hands a service index out, read by `xlb list` and metrics.
/// `cpu × XLB_SVC_STRIDE + service index` (u32) → `Counter`: a plain array, one row of
/// `XLB_SVC_STRIDE` (65,536 by default) per possible CPU, sized by the loader; preallocated,
/// no allocation on the sync path, no eviction.
#[btf_map]
pub static XLB_SVCSTAT_V3: Array<Counter, { SVC_NAME_MAP_CAPACITY as usize }> = Array::new();

/// The service indices in one CPU's row of [`XLB_SVCSTAT_V3`]: set by every loader
/// (`GLOBAL_SVC_STRIDE`); 0 (not set) counts nothing.
#[unsafe(no_mangle)]
pub static XLB_SVC_STRIDE: Global<u32> = Global::new(0);

/// Session affinity (ClientIP). Written here: a new connection of a client records its
/// backend; later ones reuse it until `affinity_timeout_s` passes without a packet.
/// `AffinityKey{svc index, client}` → `AffinityValue{backend index and generation, slot,
/// last_seen_ns}`. 24 B → 24 B, 65,536 entries, LRU eviction.
#[btf_map]
pub static XLB_AFF_V2: LruHashMap<AffinityKey, AffinityValue, { AFFINITY_MAP_CAPACITY as usize }> =
    LruHashMap::new();

/// Per-backend counters. Written here (each CPU adds to its own row), zeroed by the agent
/// when it hands a backend index out, read by `xlb list` and metrics.
/// `cpu × XLB_BE_STRIDE + backend index` (u32) → `Counter`, laid out as [`XLB_SVCSTAT_V3`]
/// (a row of 262,144 by default per possible CPU).
#[btf_map]
pub static XLB_BESTAT_V3: Array<Counter, { BACKEND_MAP_CAPACITY as usize }> = Array::new();

/// The backend indices in one CPU's row of [`XLB_BESTAT_V3`] (`GLOBAL_BACKEND_STRIDE`).
#[unsafe(no_mangle)]
pub static XLB_BE_STRIDE: Global<u32> = Global::new(0);

/// Socket-level translations. Written by the socket hooks, read by them and by the agent.
/// Reverse `SockKey{cookie, backend}` → `SockValue{frontend, svc id}`: what recvmsg() and
/// getpeername() show a socket that was sent to a backend. Forward `SockKey{cookie,
/// frontend}` → `SockValue{backend, slot, backend id}`: the backend an unconnected UDP
/// socket's datagrams to a frontend keep going to. 32 B → 24 B, 262,144 entries, LRU
/// eviction (an entry outlives its socket until evicted; a cookie is never reused).
#[btf_map]
pub static XLB_SOCK_V1: LruHashMap<SockKey, SockValue, { SOCK_MAP_CAPACITY as usize }> =
    LruHashMap::new();

/// Address filters. Written by the agent (bits set before the entries that need them,
/// cleared a day after their last address went), read here before any hash lookup.
/// word index (u32) → 64 bits: `0..words` destinations that may be frontends, `words..`
/// sources that may be backends. 4 B → 8 B, an array sized by the loader with
/// [`XLB_FILTER_LOG2`] (32,768 entries, 256 KiB, at the default capacities).
#[btf_map]
pub static XLB_ADDRFILT_V2: Array<u64, { 2 * FILTER_WORDS as usize }> = Array::new();

/// The address filters' sizes (`GLOBAL_FILTER_LOG2`, `lb_common::FilterSize::global`), set
/// by the loader that sizes [`XLB_ADDRFILT_V2`]; the object's own value: the default size.
#[unsafe(no_mangle)]
pub static XLB_FILTER_LOG2: Global<u32> = Global::new(lb_common::FILTER_BITS_LOG2);

/// The node's configuration (`XLB_CFG_V3`), zero until the agent writes it.
#[inline(always)]
pub(crate) fn config() -> NodeConfig {
    XLB_CFG_V3.get(0).copied().unwrap_or_default()
}
