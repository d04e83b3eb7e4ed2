//! Map names, keys and values.

use bytemuck::{Pod, Zeroable};

/// Service map: written by the agent, read by the datapath.
/// (V2: a slot's `backend_id` is an index into the backend array `XLB_BE_V2`, `svc_id` a
/// dense index into the per-service arrays. V3: frontends only, each entry naming the base
/// of its range in the slot array [`MAP_SLOT`]; V2's per-slot entries are gone.)
pub const MAP_SVC: &str = "XLB_SVC_V3";
/// Slot array: written by the agent, read by the datapath. Slot `n` (`1..=count`) of a
/// frontend whose entry has `slot_base` is element `slot_base + n - 1`, a backend index
/// (into [`MAP_BACKEND`]). Each frontend's range is a power of two of elements aligned to
/// its size (the agent's `reconcile::slots`); elements outside a live range are never read.
pub const MAP_SLOT: &str = "XLB_SLOT_V1";
/// Backend map: written by the agent, read by the datapath.
/// (V2: an array indexed by backend index, each entry with its generation.)
pub const MAP_BACKEND: &str = "XLB_BE_V2";
/// Conntrack map: written by the datapath (LRU), read by `xlb list conntrack`.
/// (V2: the value holds the whole rewritten tuple, for SNAT and hairpin. V3: 16-byte IPv4
/// keys; the value names the backend by index and generation, the service by index, and
/// whether the service has affinity, so an established packet needs no other map.)
pub const MAP_CT: &str = "XLB_CT_V3";
/// Assured conntrack: flows that have been answered and then continued (a TCP handshake
/// completed, a UDP exchange followed by another datagram), moved out of the LRU map
/// [`MAP_CT`] by the datapath so that no flood of new flows can evict them, as the kernel's
/// conntrack never early-drops an assured flow. A plain hash (allocated as used, up to the
/// conntrack size): nothing evicts it; the agent deletes the entries of flows that are over
/// (`datapath::ct_gc`). Same key and value as [`MAP_CT`].
pub const MAP_CT_ASSURED: &str = "XLB_CTA_V1";
/// Per-CPU counters indexed by [`crate::counters`] reason codes (V4: 23 reasons, the socket
/// hooks' among them; V5: 24, `ct_assured_full`; V6: 26, tc egress's `reply_in` and
/// `snat_out`; V7: 27, `ct_superseded`; V8: 29, `dsr_in` and `dsr_out`).
pub const MAP_STATS: &str = "XLB_STATS_V8";

/// Pins of earlier layouts that hold no state worth carrying over (counters, and the node
/// configuration the agent writes whole at start): an agent removes them once its own
/// programs are attached, so counters start again from 0.
pub const RETIRED_PINS: [&str; 8] = [
    "XLB_STATS_V4",
    "XLB_STATS_V5",
    "XLB_STATS_V6",
    "XLB_STATS_V7",
    "XLB_CFG_V2",
    "XLB_SVCSTAT_V2",
    "XLB_BESTAT_V2",
    "XLB_MAGLEV_V1",
];
/// Per-service counters, one row per CPU (V3: a plain array laid out CPU-major, CPU `c`'s
/// counter of service index `i` at `c × stride + i`, one cache miss to reach where V2's
/// per-CPU array made two dependent ones; V1 was a hash that allocated on the sync path);
/// the agent zeroes an index when it hands it out, the datapath adds.
pub const MAP_SVC_STATS: &str = "XLB_SVCSTAT_V3";

/// Per-backend counters, one row per CPU, laid out as [`MAP_SVC_STATS`] (V3); the agent
/// zeroes an index when it hands it out, the datapath adds.
pub const MAP_BACKEND_STATS: &str = "XLB_BESTAT_V3";

/// The load-time global (a `u32`) holding [`MAP_SVC_STATS`]'s stride: the service indices
/// of one CPU's row, its entries divided by the possible CPUs. Every loader sets it.
pub const GLOBAL_SVC_STRIDE: &str = "XLB_SVC_STRIDE";

/// The load-time global holding [`MAP_BACKEND_STATS`]'s stride, as [`GLOBAL_SVC_STRIDE`].
pub const GLOBAL_BACKEND_STRIDE: &str = "XLB_BE_STRIDE";

/// Session affinity: written by the datapath (LRU), read by `xlb list`.
/// (V2: keys hold service indices, values the backend's index and generation.)
pub const MAP_AFFINITY: &str = "XLB_AFF_V2";
/// Default affinity capacity (one per client and service with affinity).
pub const AFFINITY_MAP_CAPACITY: u32 = 65_536;

/// Node configuration for the datapath: written by the agent, read by the datapath.
/// (V2: the host's network namespace cookie and socket-LB flags. V3: the IPv6 hairpin
/// address. It holds no state: every agent writes it whole at start, so V2 is retired.)
pub const MAP_CONFIG: &str = "XLB_CFG_V3";
/// IPv4 loadBalancerSourceRanges: written by the agent, read by the datapath (LPM trie).
/// (V2: keys hold service indices.) IPv6 ranges have a trie of their own
/// ([`crate::v6::MAP_SRC_RANGE6`]).
pub const MAP_SRC_RANGE: &str = "XLB_SRCRNG_V2";
/// Default capacity of the source-range trie (ranges over all LoadBalancer frontends).
pub const SRC_RANGE_MAP_CAPACITY: u32 = 16_384;

/// The interfaces XDP may redirect to (a devmap): written by the agent, read by XDP.
pub const MAP_XDP_TX: &str = "XLB_XDPTX_V1";
/// Capacity of the XDP redirect devmap (interfaces).
pub const XDP_TX_MAP_CAPACITY: u32 = 256;

/// Socket-level translations (connect-time load balancing): written by the socket hooks
/// (LRU), read by them and by the agent (which destroys connected UDP sockets of a removed
/// backend).
pub const MAP_SOCK: &str = "XLB_SOCK_V1";
/// Default capacity of the socket translation map (Cilium's socket reverse-NAT default).
pub const SOCK_MAP_CAPACITY: u32 = 262_144;

/// Maglev lookup tables (`--lb-algorithm maglev`): one per frontend flagged
/// [`SVC_F_MAGLEV`], keyed by its service index. (V2: a hash map without preallocation,
/// keyed by service index, replacing a table in one atomic update; V1, an array of rows
/// named by slot 0's `backend_id`, held no state and is retired.)
pub const MAP_MAGLEV: &str = "XLB_MAGLEV_V2";
/// The largest Maglev table (Cilium's default `maglev.tableSize`, a prime): every row has
/// room for it, a frontend's table may be smaller ([`MaglevRow::size`]).
pub const MAGLEV_MAX_SIZE: usize = 16381;
/// Entries a row has room for: the power of two above [`MAGLEV_MAX_SIZE`], so the datapath
/// bounds an index with a mask the verifier follows (it does not follow `hash % size`).
pub const MAGLEV_ROW_SLOTS: usize = 16384;
/// Default capacity of the Maglev map: tables (a 32,776-byte row each, which the kernel's
/// allocator rounds up to 64 KiB with the hash element's header: 512 MiB when full,
/// allocated only for frontends that have one); `--maglev-map-max` overrides it.
pub const MAGLEV_MAP_CAPACITY: u32 = 8192;

/// A frontend's Maglev lookup table: entry `flow_hash % size` holds the backend slot
/// (`1..=count` of the frontend's service entries) a new flow with that hash goes to. The
/// slot, not the backend index: two bytes an entry, and the same slot entries random choice
/// reads. Every node computes the same table from the same backends, so a flow hashes to
/// the same backend whichever node it reaches.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct MaglevRow {
    /// The table's size `M` (a prime ≤ [`MAGLEV_MAX_SIZE`]); 0: no table (random choice).
    pub size: u32,
    pub _pad: u32,
    /// Entries `0..size`: backend slots (0: none, random choice); the rest unused (0).
    pub slots: [u16; MAGLEV_ROW_SLOTS],
}
const _: () = assert!(core::mem::size_of::<MaglevRow>() == 32776);

/// The hash of a flow's 5-tuple that picks its Maglev entry: the same function on every
/// node (the addresses and ports as they sit in the packet, IPv4 in word 0), so a flow's
/// packets pick the same backend on whichever node they arrive (murmur3's mixing steps).
#[inline(always)]
pub const fn flow_hash(
    saddr_be: &[u32; 4],
    daddr_be: &[u32; 4],
    sport_be: u16,
    dport_be: u16,
    proto: u8,
) -> u32 {
    const fn mix(h: u32, w: u32) -> u32 {
        let k = w
            .wrapping_mul(0xcc9e_2d51)
            .rotate_left(15)
            .wrapping_mul(0x1b87_3593);
        (h ^ k)
            .rotate_left(13)
            .wrapping_mul(5)
            .wrapping_add(0xe654_6b64)
    }
    let mut h = 0x9e37_79b9 ^ proto as u32;
    let mut i = 0;
    while i < 4 {
        h = mix(h, saddr_be[i]);
        h = mix(h, daddr_be[i]);
        i += 1;
    }
    h = mix(h, ((sport_be as u32) << 16) | dport_be as u32);
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// Address filters, written by the agent, read by the datapath before any hash lookup: one
/// bit per hashed address ([`FilterSize::bit`]), words `0..words` for destinations that may
/// be frontends, the rest (as many or more) for sources that may be backends (whose packets may be
/// replies). A clear bit means "certainly not": the packet needs no conntrack or service
/// lookup on that side. Sized at load time ([`FilterSize`]). (V2: the two filters may differ
/// in size; `prev::MAP_ADDR_FILTER`, V1, had two of one size, and is taken over at
/// start.)
pub const MAP_ADDR_FILTER: &str = "XLB_ADDRFILT_V2";
/// log2 of the bits of each filter at the default map capacities (and the least any
/// capacity gets).
pub const FILTER_BITS_LOG2: u32 = 20;
/// The most bits a filter takes: 2^27 (16 MiB).
pub const FILTER_BITS_LOG2_MAX: u32 = 27;
/// 64-bit words of each filter at the default size (2^20 bits: 128 KiB).
pub const FILTER_WORDS: u32 = 1 << (FILTER_BITS_LOG2 - 6);
/// The load-time global (a `u32`) holding the filters' sizes ([`FilterSize::global`]), set
/// by every loader that sizes [`MAP_ADDR_FILTER`]; 0 (not set): the default size.
pub const GLOBAL_FILTER_LOG2: &str = "XLB_FILTER_LOG2";

/// The sizes of the two address filters: 2^`front` bits for the frontends' addresses and
/// 2^`back` bits for the backends', `front <= back`. Chosen at load time from the map
/// capacities, four bits per address each filter's maps can hold (at least the default,
/// 2^20), so a filter is at most a quarter set when the maps are full and a non-service
/// packet falls into a conntrack lookup at most one time in five, whatever the scale; the
/// frontends' filter, which every packet to a service reads, stays as small as the
/// frontends allow (a node of 100,000 services and 2 million backends: 128 KiB beside 1 MiB).
/// The datapath reads it from [`GLOBAL_FILTER_LOG2`] ([`FilterSize::global`]), the agent
/// from the map's size ([`FilterSize::from_entries`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FilterSize {
    front: u32,
    back: u32,
}

impl Default for FilterSize {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// `log2` within `FILTER_BITS_LOG2..=FILTER_BITS_LOG2_MAX` (0: the default).
const fn clamp_log2(log2: u32) -> u32 {
    if log2 < FILTER_BITS_LOG2 {
        FILTER_BITS_LOG2
    } else if log2 > FILTER_BITS_LOG2_MAX {
        FILTER_BITS_LOG2_MAX
    } else {
        log2
    }
}

/// The least `log2` with `2^log2 >= n`.
const fn ceil_log2(n: u64) -> u32 {
    let mut log2 = 0;
    while log2 < 63 && (1u64 << log2) < n {
        log2 += 1;
    }
    log2
}

impl FilterSize {
    /// The size at the default capacities (and of a map no loader sized).
    pub const DEFAULT: Self = Self {
        front: FILTER_BITS_LOG2,
        back: FILTER_BITS_LOG2,
    };

    /// Two filters of 2^`log2` bits each, kept within
    /// `FILTER_BITS_LOG2..=FILTER_BITS_LOG2_MAX` (0, a global no loader set, is the default).
    #[inline(always)]
    pub const fn from_log2(log2: u32) -> Self {
        let log2 = clamp_log2(log2);
        Self {
            front: log2,
            back: log2,
        }
    }

    /// Filters of 2^`front` and 2^`back` bits, each kept within range and the frontends'
    /// no larger than the backends'.
    pub const fn split(front: u32, back: u32) -> Self {
        let back = clamp_log2(back);
        let front = clamp_log2(front);
        Self {
            front: if front < back { front } else { back },
            back,
        }
    }

    /// The sizes a loader set (its global, [`Self::global`]: within range, the loader
    /// clamped them), taken as they are: the datapath reads them once per packet without a
    /// check.
    #[inline(always)]
    pub const fn trusted(global: u32) -> Self {
        let back = global & 0xff;
        Self {
            front: back - ((global >> 8) & 0xff),
            back,
        }
    }

    /// The load-time global's value: the backends' log2 in the low byte, how much smaller
    /// the frontends' is in the next (so a global of one log2, as every loader before the
    /// split wrote, reads as two filters of that size).
    pub const fn global(self) -> u32 {
        self.back | (self.back - self.front) << 8
    }

    /// Four bits per address for maps that hold up to `addresses` of them, both filters.
    pub const fn for_addresses(addresses: u32) -> Self {
        Self::from_log2(ceil_log2(addresses as u64) + 2)
    }

    /// Four bits per address each: the frontends' filter for up to `frontends` addresses
    /// (the service map's capacity), the backends' for the larger of that and `backends`.
    pub const fn for_maps(frontends: u32, backends: u32) -> Self {
        let most = if frontends > backends {
            frontends
        } else {
            backends
        };
        Self::split(ceil_log2(frontends as u64) + 2, ceil_log2(most as u64) + 2)
    }

    /// The sizes of a filter map of `entries` words: the frontends' words, then the
    /// backends' (a power of two: two filters of one size; two bits set: the smaller
    /// is the frontends').
    pub const fn from_entries(entries: u32) -> Self {
        if entries == 0 {
            return Self::DEFAULT;
        }
        let hi = 31 - entries.leading_zeros();
        let lo = entries.trailing_zeros();
        if hi == lo {
            return Self::from_log2(hi + 5);
        }
        Self::split(lo + 6, hi + 6)
    }

    /// log2 of the backends' filter's bits (the larger).
    #[inline(always)]
    pub const fn log2(self) -> u32 {
        self.back
    }

    /// log2 of the frontends' filter's bits.
    #[inline(always)]
    pub const fn front_log2(self) -> u32 {
        self.front
    }

    /// 64-bit words of the frontends' filter (the first): the backends' filter's first word.
    #[inline(always)]
    pub const fn words(self) -> u32 {
        1 << (self.front - 6)
    }

    /// Entries of the filter map (both filters).
    pub const fn entries(self) -> u32 {
        (1 << (self.front - 6)) + (1 << (self.back - 6))
    }

    /// The number of the second filter's first bit (the backends' filter).
    #[inline(always)]
    pub const fn backend_base(self) -> u32 {
        self.words() * 64
    }

    /// The bit of IPv4 address `addr_be` (network order) in the frontends' filter: a
    /// multiplicative hash of the address, so neighbouring addresses spread.
    #[inline(always)]
    pub const fn bit(self, addr_be: u32) -> u32 {
        u32::from_be(addr_be).wrapping_mul(0x9e37_79b1) >> (32 - self.front)
    }

    /// The bit of `addr_be` in the backends' filter (counted from its first bit).
    #[inline(always)]
    pub const fn back_bit(self, addr_be: u32) -> u32 {
        u32::from_be(addr_be).wrapping_mul(0x9e37_79b1) >> (32 - self.back)
    }

    /// The frontends' filter bit of an address of either family ([`filter_fold`], then
    /// [`Self::bit`]).
    #[inline(always)]
    pub const fn bit_of(self, addr_be: &[u32; 4]) -> u32 {
        self.bit(filter_fold(addr_be))
    }

    /// The backends' filter bit of an address of either family, counted from the map's
    /// first bit ([`Self::backend_base`] on).
    #[inline(always)]
    pub const fn backend_bit_of(self, addr_be: &[u32; 4]) -> u32 {
        self.backend_base() + self.back_bit(filter_fold(addr_be))
    }
}

/// The word an address of either family is filtered by, from its `addr_be` words (network
/// order): an IPv4 address's own (its other words are 0), an IPv6 address's four mixed
/// together, each but the first through its own odd multiplier (a bijection of the word), so
/// that addresses of one /32 do not share a bit and addresses of two prefixes that differ in
/// their low words only by the prefix (a client `fd00:244::j` and a backend `fd00:128::m`)
/// do not fall on each other's bits as a plain XOR of the words would make them.
#[inline(always)]
pub const fn filter_fold(addr_be: &[u32; 4]) -> u32 {
    let h = u32::from_be(addr_be[0])
        ^ u32::from_be(addr_be[1]).wrapping_mul(0x85eb_ca6b)
        ^ u32::from_be(addr_be[2]).wrapping_mul(0xc2b2_ae35)
        ^ u32::from_be(addr_be[3]).wrapping_mul(0x27d4_eb2f);
    h.to_be()
}

/// Default capacities; the agent may override them at load time. (V3: frontends only, one
/// entry each; as many as the per-service arrays' service indices, which a frontend's two
/// scopes share.)
pub const SVC_MAP_CAPACITY: u32 = 65_536;
/// Default backend map capacity (backend indices `1..capacity`; 0 names no backend).
pub const BACKEND_MAP_CAPACITY: u32 = 262_144;
/// Default conntrack capacity (two entries per flow: forward and reply).
pub const CT_MAP_CAPACITY: u32 = 262_144;
/// Default capacity of the per-service arrays (the counters; service indices
/// `1..capacity`, one per service port). The name is the retired names map's
/// (`prev::MAP_SVC_NAME`), which had this capacity.
pub const SVC_NAME_MAP_CAPACITY: u32 = 65_536;
/// Most backends one service port may have (slots 1..=MAX_BACKENDS_PER_SVC): the largest
/// slot range (a power of two).
pub const MAX_BACKENDS_PER_SVC: u16 = 4096;
/// Default slot array capacity (backend slots of all frontends, 4 B each: 4 MiB);
/// `--slot-map-max` overrides it.
pub const SLOT_MAP_CAPACITY: u32 = 1_048_576;

/// Key of the service map: a frontend (VIP, port, protocol, scope). (V3: V2's `slot` field
/// is gone, the key keeps its size.)
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct SvcKey {
    /// Frontend address, network order; IPv4 uses word 0 only.
    pub addr_be: [u32; 4],
    /// Frontend port, network order.
    pub port_be: u16,
    /// `IPPROTO_TCP` or `IPPROTO_UDP`.
    pub proto: u8,
    /// `FAMILY_V4` or `FAMILY_V6`.
    pub family: u8,
    /// `SCOPE_EXTERNAL` (0: every frontend has one) or `SCOPE_INTERNAL` (a second entry set
    /// for traffic from the node and its pods, see [`SVC_F_TWO_SCOPES`]).
    pub scope: u8,
    pub _pad0: u8,
    /// (Two fields, not a `[u8; 3]`: the datapath zeroes them with two stores, where an
    /// array becomes a byte loop the verifier refuses without CAP_PERFMON.)
    pub _pad1: u16,
}
const _: () = assert!(core::mem::size_of::<SvcKey>() == 24);

/// Scope of a frontend's entries as every path sees them (tc, XDP, and the socket hooks for
/// frontends with one scope).
pub const SCOPE_EXTERNAL: u8 = 0;
/// Scope of the entries the socket hooks use for a frontend flagged [`SVC_F_TWO_SCOPES`]:
/// traffic from the node itself (and its pods' sockets) to an external frontend with
/// externalTrafficPolicy Local goes to every cluster endpoint, as kube-proxy sends
/// local-origin traffic to the cluster chain.
pub const SCOPE_INTERNAL: u8 = 1;

/// Value of the service map: a frontend's entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct SvcValue {
    /// Where its slots start in the slot array ([`MAP_SLOT`]): slot `n` (`1..=count`) is
    /// element `slot_base + n - 1` (0 when it has none).
    pub slot_base: u32,
    /// Number of backend slots.
    pub count: u16,
    /// `SVC_F_*` flags.
    pub flags: u16,
    /// The service port's dense index (names map, per-service counter array, affinity and
    /// source-range keys, conntrack entries).
    pub svc_id: u32,
    /// sessionAffinity ClientIP timeout in seconds (0 = no affinity).
    pub affinity_timeout_s: u32,
}
const _: () = assert!(core::mem::size_of::<SvcValue>() == 16);

/// A backend: where a flow is DNATed to. An entry of the backend array; an index whose
/// `generation` is 0 holds no backend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct Backend {
    /// Backend address, network order; IPv4 uses word 0 only.
    pub addr_be: [u32; 4],
    /// Backend port, network order.
    pub port_be: u16,
    pub proto: u8,
    pub family: u8,
    /// `BE_F_*` flags.
    pub flags: u8,
    pub _pad0: u8,
    pub _pad1: u16,
    /// The generation of the backend at this index: never 0 for a backend, never the same for
    /// two backends while an agent runs. A conntrack or affinity entry names its backend by
    /// index and generation, so an index handed to another backend is never mistaken for the
    /// old one.
    pub generation: u32,
    pub _pad2: u32,
}
const _: () = assert!(core::mem::size_of::<Backend>() == 32);

/// Service flag: with no backends, drop instead of refusing (kube-proxy drops when
/// a Local traffic policy has no local endpoint).
pub const SVC_F_DROP_EMPTY: u16 = 1;

/// Service flag: an external frontend (NodePort, externalIP, LoadBalancer) with
/// externalTrafficPolicy Cluster: flows to a remote backend are SNATed to the node.
pub const SVC_F_SNAT_REMOTE: u16 = 2;
/// Service flag: the frontend has loadBalancerSourceRanges; a client outside
/// them (per `XLB_SRCRNG_V2`, or `XLB_SRCRNG6_V1` for an IPv6 frontend) is dropped.
pub const SVC_F_SRC_RANGES: u16 = 4;
/// Service flag (external scope): the frontend also has `SCOPE_INTERNAL` entries,
/// which the socket hooks use instead.
pub const SVC_F_TWO_SCOPES: u16 = 8;
/// Service flag (external scope): a new flow picks its backend from the frontend's
/// Maglev table (`XLB_MAGLEV_V2`, keyed by its service index) by its 5-tuple's [`flow_hash`], not at
/// random (`--lb-algorithm maglev`; external frontends only).
pub const SVC_F_MAGLEV: u16 = 16;

/// Backend flag: the endpoint is terminating (kept for established flows only).
pub const BE_F_TERMINATING: u8 = 1;
/// Backend flag: the endpoint is not on this node (its reply would not come back through
/// this node unless the flow is SNATed).
pub const BE_F_REMOTE: u8 = 2;

/// Conntrack flag: the flow's source is translated (SNAT to the node, or hairpin, or only
/// its port when its reply tuple would clash with another flow's).
pub const CT_F_SNAT: u16 = 1;
/// Conntrack flag: the client is its own backend (hairpin), SNATed to the hairpin address.
pub const CT_F_HAIRPIN: u16 = 2;
/// Conntrack flag: a FIN was seen in the entry's direction. A flow closed both ways (or
/// reset) and idle for a few seconds gives its tuple (its SNAT port) to a new flow.
pub const CT_F_CLOSING: u16 = 4;
/// Conntrack flag: a RST was seen in the entry's direction.
pub const CT_F_RESET: u16 = 8;
/// Conntrack flag (forward entries): the service had ClientIP affinity when the flow began:
/// its packets keep the client's affinity entry fresh.
pub const CT_F_AFFINITY: u16 = 16;
/// Conntrack flag (reply entries): the backend has answered. The flow's next forward packet
/// (not a SYN) makes it assured: both entries move to [`MAP_CT_ASSURED`].
pub const CT_F_REPLIED: u16 = 32;
/// Conntrack flag: the entry is in [`MAP_CT_ASSURED`] (set on the copies moved there).
pub const CT_F_ASSURED: u16 = 64;
/// Conntrack flag: the client's port is remapped at tc ingress, not egress (the flow's
/// tuple as netfilter sees it, client → backend, would be another live flow's: one client
/// port to two frontends with the same backend), so netfilter sees the remapped port both
/// ways; tc egress restores it on replies.
pub const CT_F_PORT_IN: u16 = 128;
/// Conntrack flag (set by XDP): this direction's translated packets leave by an interface
/// that takes no XDP frames (a pod's veth, a local address), so XDP hands them to the stack
/// translated as tc ingress would, without looking their route up again. Cleared with the
/// once-a-second refresh (`last_seen_ns`), so a changed route is seen within a second; an
/// entry without it (made by tc, or refreshed) gets it from XDP's next route lookup. tc
/// ignores it.
pub const CT_F_XDP_STACK: u16 = 256;
/// Conntrack flag: the flow is the node's own, DNATed at tc egress (an SCTP association:
/// no socket hook runs for SCTP) and redirected toward its backend. Its replies are
/// delivered to the node's socket and never cross a tc egress, so tc ingress gives them
/// both sides back (the frontend as source too).
pub const CT_F_OUT_DNAT: u16 = 512;
/// Conntrack flag: the flow goes by direct server return (`--lb-mode dsr|hybrid`): on the
/// node that chose its remote backend, its packets are DNATed with the client kept as
/// source, and those the backend's node learns the flow from (a TCP SYN, every UDP
/// datagram) carry the frontend in an IPv4 option ([`DSR_OPT_TYPE`]) or an IPv6
/// destination option ([`DSR6_OPT_TYPE`]); the replies never
/// come back here. On the backend's node, the flow learnt from that option.
pub const CT_F_DSR: u16 = 1024;

/// The IPv4 option a DSR packet carries to the backend's node: RFC 4727's experimental
/// option number 30, copied on fragmentation (`0x80 | 30`), 8 bytes: type, length, the
/// frontend's port and address (network order). Cilium's DSR option is the same shape
/// under its own number.
pub const DSR_OPT_TYPE: u8 = 0x9e;
/// The DSR option's length (the bytes it adds to a packet: its MTU cost).
pub const DSR_OPT_LEN: u8 = 8;

/// The IPv6 destination option a DSR packet carries to the backend's node: RFC 4727's
/// experimental option type 0x1e (its top bits 00: a node that does not know it skips it;
/// bit 2 clear: unchanged en route). In a destination-options header of its own right
/// after the fixed header, 24 bytes ([`DSR6_HDR_LEN`]): next header, length (2: three
/// 8-byte units), the option's type and length ([`DSR6_OPT_LEN`]), the frontend's address
/// and port (network order), a 2-byte PadN. Cilium's IPv6 DSR option is the same shape.
pub const DSR6_OPT_TYPE: u8 = 0x1e;
/// The IPv6 DSR option's data length: address and port.
pub const DSR6_OPT_LEN: u8 = 18;
/// The IPv6 DSR header's length (the bytes it adds to a packet: its MTU cost).
pub const DSR6_HDR_LEN: u8 = 24;

/// Conntrack direction: the original tuple (client → VIP).
pub const CT_DIR_FORWARD: u8 = 0;
/// Conntrack direction: the reply tuple as the backend sends it (backend → client). A
/// translated flow (`CT_F_SNAT`) has a second reply entry, under its reply as the node's
/// netfilter sees it once tc ingress restored the client as destination (backend → client):
/// tc egress finds the frontend to restore as source there.
pub const CT_DIR_REPLY: u8 = 1;
/// Conntrack direction of a translated flow's (`CT_F_SNAT`) egress entry: its request as the
/// node's netfilter sees it (client → backend, after tc ingress's DNAT): tc egress finds the
/// SNAT source there. A copy of the forward entry's value.
pub const CT_DIR_SNAT_OUT: u8 = 2;

/// Key of the conntrack map (IPv4; IPv6 gets a map of its own): a 5-tuple as seen on the
/// wire, and its direction.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct CtKey {
    pub saddr_be: u32,
    pub daddr_be: u32,
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
    /// `CT_DIR_FORWARD`, `CT_DIR_REPLY` or `CT_DIR_SNAT_OUT`.
    pub dir: u8,
    pub _pad: u16,
}
const _: () = assert!(core::mem::size_of::<CtKey>() == 16);

/// Value of the conntrack map: the tuple a packet of this entry's direction is rewritten to,
/// and everything the packet's counters and checks need (no other lookup for an established
/// TCP packet).
///
/// Forward (client → frontend): source = the client, or the SNAT address and port; the
/// destination = the backend. Reply (backend → client or SNAT address): source = the
/// frontend, destination = the client.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct CtValue {
    pub saddr_be: u32,
    pub daddr_be: u32,
    pub sport_be: u16,
    pub dport_be: u16,
    /// The backend the flow is pinned to: its index in the backend array…
    pub backend_id: u32,
    /// …and its generation there (a UDP flow whose backend index holds another generation,
    /// or none, lost its backend).
    pub backend_gen: u32,
    /// The service port's index (per-service counters, affinity).
    pub svc_id: u32,
    /// `CT_F_*` flags.
    pub flags: u16,
    /// Forward entries: the largest packet known to fit the route toward the backend (0 =
    /// none yet), so packets up to it skip the route lookup; forgotten once a second.
    pub mtu: u16,
    /// Assured entries: the packets and bytes of this direction not yet added to the
    /// service's and backend's counter rows ([`CT_PENDING_PACKET`]), added by the datapath
    /// (atomically: every CPU may) and moved to the rows by the packet that refreshes the
    /// entry (at most once a second), one past [`CT_PENDING_FULL`], the flow's FIN or RST,
    /// or a delete by the datapath. 0 in every other entry (counted straight into the
    /// rows), and in the entries of an agent before these counts (the field was padding:
    /// the layout, and so the map names, are unchanged).
    pub pending: u32,
    /// `bpf_ktime_get_coarse_ns` (CLOCK_MONOTONIC_COARSE) at creation.
    pub created_ns: u64,
    /// The same clock at a recent packet (refreshed at most once a second).
    pub last_seen_ns: u64,
}
const _: () = assert!(core::mem::size_of::<CtValue>() == 48);

/// One packet in a conntrack entry's `pending` counts: packets from this bit up (8 bits),
/// bytes below it (24 bits).
pub const CT_PENDING_PACKET: u32 = 1 << 24;
/// The bytes of a conntrack entry's `pending` counts.
pub const CT_PENDING_BYTES: u32 = CT_PENDING_PACKET - 1;
/// Pending counts at or past half of either part's range (128 packets, 8 MiB): the next
/// packet moves them to the rows, so neither part overflows into the other (a packet adds
/// less than 1 MiB, `CT_PENDING_MAX_LEN`).
pub const CT_PENDING_FULL: u32 = 0x8080_0000;
/// The largest packet (bytes) added to pending counts; a larger one is counted straight.
pub const CT_PENDING_MAX_LEN: u32 = 1 << 20;

/// A packet part of pending counts no sequence of packets leaves (they move to the rows at
/// 128 packets): what two CPUs' flushes of one entry at the same moment leave (each takes
/// what it read out, the entry holds the negation), worth nothing.
pub const CT_PENDING_NEGATED: u32 = 0xC0;

/// The (packets, bytes) of a conntrack entry's `pending` counts; none for the negation two
/// simultaneous flushes leave ([`CT_PENDING_NEGATED`]).
pub const fn ct_pending(pending: u32) -> (u32, u32) {
    if pending >> 24 >= CT_PENDING_NEGATED {
        return (0, 0);
    }
    (pending >> 24, pending & CT_PENDING_BYTES)
}

/// Value of the node configuration map (one entry, index 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct NodeConfig {
    /// SNAT source ports for flows to remote backends: `snat_port_min..=snat_port_max`,
    /// host order. Both 0: SNAT disabled (such flows are dropped, counted `snat_failed`).
    pub snat_port_min: u16,
    pub snat_port_max: u16,
    /// Source address a hairpin flow (a pod reaching itself through a service) is SNATed
    /// to, network order. 0: hairpin disabled.
    pub hairpin_addr_be: u32,
    /// `CFG_F_*` flags.
    pub flags: u32,
    pub _pad: u32,
    /// The network namespace cookie of the agent's (the host's) namespace: with
    /// `CFG_F_SOCK_HOST_ONLY` the socket hooks translate only sockets of this namespace.
    pub host_netns_cookie: u64,
    /// Source address an IPv6 hairpin flow is SNATed to, network order. All zero: IPv6
    /// hairpin disabled.
    pub hairpin6_addr_be: [u32; 4],
}
const _: () = assert!(core::mem::size_of::<NodeConfig>() == 40);

/// Config flag: the socket hooks translate only the host namespace's sockets
/// (`--socket-lb host`, Cilium's `socketLB.hostNamespaceOnly`); pods are left to tc.
pub const CFG_F_SOCK_HOST_ONLY: u32 = 1;
/// Config flag: the programs log their decisions with aya-log (`xlb agent --bpf-log debug`);
/// off, a program pays one lookup of this (inlined) array entry and a branch.
pub const CFG_F_BPF_LOG: u32 = 2;
/// Config flag: new TCP flows of external frontends to remote backends go by direct server
/// return (`--lb-mode dsr|hybrid`), not SNAT.
pub const CFG_F_DSR_TCP: u32 = 4;
/// Config flag: new UDP flows likewise (`--lb-mode dsr`; hybrid SNATs UDP, as Cilium).
pub const CFG_F_DSR_UDP: u32 = 8;
/// Config flag: on this node an IPv4 route depends on the destination and the ingress
/// interface alone (no `ip rule` selects by source address), so XDP may keep the way out
/// toward a backend per backend (`fib::backend_hop`), not per flow. Set by the agent from
/// the namespace's rules (`datapath::routing`), re-checked when they change; unset (the
/// default, and any older agent): every new flow's route is looked up with its source.
pub const CFG_F_ROUTES_BY_DST: u32 = 16;
/// Config flag: as [`CFG_F_ROUTES_BY_DST`] for IPv6 (no IPv6 rule selects by source and no
/// IPv6 route has a source prefix, `ip -6 route add … from …`).
pub const CFG_F_ROUTES6_BY_DST: u32 = 32;

/// `family` of an affinity key whose client is a network namespace (a socket without a
/// bound source address: `client_be[0..2]` hold the namespace cookie). A pod's namespace
/// stands for its one address, the host's for the node's.
pub const FAMILY_NETNS: u8 = 0x80;

/// Socket map direction: the key holds the backend a socket was sent to; the value the
/// frontend `recvmsg`/`getpeername` show instead.
pub const SOCK_DIR_REVERSE: u8 = 0;
/// Socket map direction: the key holds a frontend an unconnected UDP socket sends to; the
/// value the backend its datagrams keep going to (as kube-proxy's conntrack keeps one UDP
/// flow on one backend).
pub const SOCK_DIR_FORWARD: u8 = 1;

/// Key of the socket map: a socket (its cookie) and an address it talks to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct SockKey {
    /// `bpf_get_socket_cookie` of the socket.
    pub cookie: u64,
    /// Reverse: the backend; forward: the frontend. Network order, IPv4 in word 0.
    pub addr_be: [u32; 4],
    pub port_be: u16,
    pub family: u8,
    /// `SOCK_DIR_REVERSE` or `SOCK_DIR_FORWARD`.
    pub dir: u8,
    pub proto: u8,
    pub _pad0: u8,
    pub _pad1: u16,
}
const _: () = assert!(core::mem::size_of::<SockKey>() == 32);

/// Value of the socket map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct SockValue {
    /// Reverse: the frontend; forward: the backend. Network order, IPv4 in word 0.
    pub addr_be: [u32; 4],
    pub port_be: u16,
    /// Forward: the service slot the backend was chosen from (checked before reuse).
    pub slot: u16,
    /// Reverse: the service port's id; forward: the backend id.
    pub id: u32,
}
const _: () = assert!(core::mem::size_of::<SockValue>() == 24);

/// Data of a source-range trie key: a frontend's service id, then the client address. The
/// trie key's prefix length is 32 (the id) + the range's prefix length.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct SrcRangeKey {
    /// Service id in network order (so its 32 bits come first in the trie's byte order).
    pub svc_id_be: u32,
    /// Client address (IPv4), network order (IPv6: [`crate::v6::SrcRangeKey6`]).
    pub addr_be: u32,
}
const _: () = assert!(core::mem::size_of::<SrcRangeKey>() == 8);

/// Key of the affinity map: a client of a service (ClientIP affinity).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct AffinityKey {
    pub svc_id: u32,
    /// Client address, network order; IPv4 uses word 0 only.
    pub client_be: [u32; 4],
    pub family: u8,
    // Scalar padding, not an array: zeroing `[u8; 3]` compiles to a byte loop whose pointer
    // arithmetic the verifier refuses without CAP_PERFMON.
    pub _pad0: u8,
    pub _pad1: u16,
}
const _: () = assert!(core::mem::size_of::<AffinityKey>() == 24);

/// Value of the affinity map: where the client went, and when it was last seen.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct AffinityValue {
    /// The backend's index…
    pub backend_id: u32,
    /// The service slot the backend was in (checked again before reuse).
    pub slot: u16,
    pub _pad0: u16,
    /// …and generation (checked again before reuse).
    pub backend_gen: u32,
    pub _pad1: u32,
    /// `bpf_ktime_get_coarse_ns` of the client's last new connection or packet (per-second
    /// grain).
    pub last_seen_ns: u64,
}
const _: () = assert!(core::mem::size_of::<AffinityValue>() == 24);

/// One per-CPU counter slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Counter {
    pub packets: u64,
    pub bytes: u64,
}
const _: () = assert!(core::mem::size_of::<Counter>() == 16);

/// Longest service name the agent keeps (`namespace/name:port/proto`, truncated).
pub const SVC_NAME_LEN: usize = 128;

/// A service port's name as the agent holds it (the names file beside the pins, not a
/// kernel map), and the value of the retired names map (`prev::MAP_SVC_NAME`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct SvcName {
    /// UTF-8, NUL-padded.
    pub name: [u8; SVC_NAME_LEN],
}
const _: () = assert!(core::mem::size_of::<SvcName>() == SVC_NAME_LEN);

pub use crate::prev;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: every type is repr(C), has no implicit padding, and is valid for any bit pattern
    // (the same guarantee as bytemuck::Pod, which each derives).
    unsafe impl aya::Pod for super::SvcKey {}
    unsafe impl aya::Pod for super::SvcValue {}
    unsafe impl aya::Pod for super::Backend {}
    unsafe impl aya::Pod for super::CtKey {}
    unsafe impl aya::Pod for super::CtValue {}
    unsafe impl aya::Pod for super::Counter {}
    unsafe impl aya::Pod for super::SvcName {}
    unsafe impl aya::Pod for super::AffinityKey {}
    unsafe impl aya::Pod for super::AffinityValue {}
    unsafe impl aya::Pod for super::NodeConfig {}
    unsafe impl aya::Pod for super::SrcRangeKey {}
    unsafe impl aya::Pod for super::SockKey {}
    unsafe impl aya::Pod for super::SockValue {}
    unsafe impl aya::Pod for super::MaglevRow {}
    unsafe impl aya::Pod for super::prev::CtKey {}
    unsafe impl aya::Pod for super::prev::CtValue {}
    unsafe impl aya::Pod for super::prev::AffinityValue {}
    unsafe impl aya::Pod for super::prev::Backend {}
    unsafe impl aya::Pod for super::prev::SvcKey {}
    unsafe impl aya::Pod for super::prev::SvcValue {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `addr_be` words of IPv6 address `fd00:10:96::<last>` (network order in each word).
    fn v6(last: u16) -> [u32; 4] {
        let w = |hi: u16, lo: u16| {
            u32::from_ne_bytes([(hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8])
        };
        [w(0xfd00, 0x10), w(0x96, 0), w(0, 0), w(0, last)]
    }

    #[test]
    fn ipv6_addresses_of_one_prefix_get_bits_of_their_own_and_ipv4_keeps_its_bit() {
        let bits: [u32; 4] = [1, 2, 3, 0x10].map(|i| FilterSize::DEFAULT.bit_of(&v6(i)));
        for (i, a) in bits.iter().enumerate() {
            assert!(bits[i + 1..].iter().all(|b| b != a), "{bits:?}");
        }
        // Two prefixes' addresses numbered from 0 (clients and backends): a plain XOR of the
        // words maps `P1 ^ j` and `P2 ^ m` onto each other for every j = m ^ P1 ^ P2.
        let prefix = |p: u16, j: u16| {
            let mut a = v6(j);
            a[0] = u32::from_ne_bytes([0xfd, 0, (p >> 8) as u8, p as u8]);
            filter_fold(&a)
        };
        let clients: [u32; 64] = core::array::from_fn(|j| prefix(0x244, j as u16));
        for m in 0..4096u16 {
            assert!(!clients.contains(&prefix(0x128, m)), "backend {m}");
        }
        let v4 = u32::from_ne_bytes([10, 96, 0, 10]);
        let f = FilterSize::DEFAULT;
        assert_eq!(f.bit_of(&[v4, 0, 0, 0]), f.bit(v4));
    }

    #[test]
    fn filters_are_sized_four_bits_an_address() {
        // The default capacities keep the default size (pinned filters keep theirs).
        assert_eq!(
            FilterSize::for_addresses(BACKEND_MAP_CAPACITY),
            FilterSize::DEFAULT
        );
        assert_eq!(FilterSize::for_addresses(1 << 21).log2(), 23);
        assert_eq!(FilterSize::for_addresses((1 << 21) + 1).log2(), 24);
        assert_eq!(
            FilterSize::for_addresses(u32::MAX).log2(),
            FILTER_BITS_LOG2_MAX
        );
        for log2 in FILTER_BITS_LOG2..=FILTER_BITS_LOG2_MAX {
            let f = FilterSize::from_log2(log2);
            assert_eq!(FilterSize::from_entries(f.entries()), f);
            assert_eq!(FilterSize::trusted(f.global()), f);
            assert!(f.bit(u32::MAX) < f.backend_base());
            for back in log2..=FILTER_BITS_LOG2_MAX {
                let f = FilterSize::split(log2, back);
                assert_eq!(FilterSize::from_entries(f.entries()), f);
                assert_eq!(FilterSize::trusted(f.global()), f);
                assert!(f.bit(u32::MAX) < f.backend_base());
                assert!(f.back_bit(u32::MAX) < f.entries() * 64 - f.backend_base());
            }
        }
        assert_eq!(FilterSize::from_log2(0), FilterSize::DEFAULT);
        // A global of one log2 (every loader before the split) reads as two equal filters.
        assert_eq!(FilterSize::trusted(23), FilterSize::from_log2(23));
        // The frontends' filter as the service map allows, the backends' as the larger.
        let f = FilterSize::for_maps(131_072, 2_097_152);
        assert_eq!((f.front_log2(), f.log2()), (FILTER_BITS_LOG2, 23));
        assert_eq!(FilterSize::for_maps(1 << 22, 1 << 20).front_log2(), 24);
    }
}
