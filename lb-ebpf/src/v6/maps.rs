//! The IPv6 path's maps. Each comment says who writes it, key → value, size and eviction.

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    btf_maps::{HashMap, LruHashMap},
    macros::btf_map,
};
use lb_common::{CT_MAP_CAPACITY, CtKey6, CtValue6};

use crate::maps::Chosen;

/// IPv6 conntrack. Written here (two entries per flow), read by `xlb list conntrack`.
/// `CtKey6{IPv6 5-tuple, dir}` → `CtValue6{rewritten tuple, backend index and generation,
/// service index, flags, times}`. 40 B → 72 B, the IPv4 table's size, LRU eviction.
#[btf_map]
pub static XLB_CT6_V1: LruHashMap<CtKey6, CtValue6, { CT_MAP_CAPACITY as usize }> =
    LruHashMap::new();

/// Assured IPv6 conntrack: as `XLB_CTA_V1` for IPv6 flows. Written here (answered flows
/// that continued move out of `XLB_CT6_V1`), deleted from by the agent's collector, read by
/// `xlb list conntrack`. 40 B → 72 B, allocated as used up to the conntrack size, no
/// eviction (full: a flow stays in the LRU table, `ct_assured_full`).
#[btf_map]
pub static XLB_CTA6_V1: HashMap<
    CtKey6,
    CtValue6,
    { CT_MAP_CAPACITY as usize },
    { BPF_F_NO_PREALLOC as usize },
> = HashMap::new();

/// Where an IPv6 flow's entries and an ICMPv6 error's quote are built (off the 512-byte
/// stack): the IPv6 part of the per-CPU work area (`work::WorkArea`, 360 B). Kernel-only:
/// never pinned, never read by the agent.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct FlowScratch6 {
    pub fwd: CtValue6,
    pub reply: CtValue6,
    pub fwd_key: CtKey6,
    pub reply_key: CtKey6,
    /// An ICMPv6 error's quoted IPv6 header and 8 bytes of its L4 header, as received and
    /// as translated.
    pub quote_old: [u8; 48],
    pub quote_new: [u8; 48],
    /// A new flow's backend (chosen by one step, recorded by the next).
    pub chosen: Chosen,
}
