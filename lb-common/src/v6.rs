//! IPv6 maps beside the IPv4 ones: the conntrack tables of IPv6 flows and the IPv6
//! loadBalancerSourceRanges (the IPv4 maps' compact keys stay as they are: an IPv4-only
//! node pins the same IPv4 maps as before, so an upgrade keeps its flows and ranges; these
//! maps are simply created new).

use bytemuck::{Pod, Zeroable};

/// IPv6 conntrack: written by the tc and XDP programs (LRU, two entries per flow), read by
/// `xlb list conntrack`. [`CtKey6`] → [`CtValue6`], sized as the IPv4 table ([`crate::MAP_CT`]).
pub const MAP_CT6: &str = "XLB_CT6_V1";
/// Assured IPv6 conntrack: as [`crate::MAP_CT_ASSURED`] for IPv6 flows (answered and then
/// continued, moved out of [`MAP_CT6`] by the datapath; deleted by the agent's collector
/// once over). Same key and value as [`MAP_CT6`].
pub const MAP_CT6_ASSURED: &str = "XLB_CTA6_V1";

/// IPv6 loadBalancerSourceRanges: written by the agent (before the frontends flagged
/// `SVC_F_SRC_RANGES` that need them, removed after), read by the datapath (tc, XDP and the
/// IPv6 socket hooks) for new flows. An LPM trie: `{32 + len, SrcRangeKey6{svc index,
/// range}}` → 1 (allowed); 24 B → 4 B, [`SRC_RANGE6_MAP_CAPACITY`] entries, no eviction
/// (the agent refuses a frontend whose ranges do not fit). IPv4 ranges stay in
/// [`crate::MAP_SRC_RANGE`].
pub const MAP_SRC_RANGE6: &str = "XLB_SRCRNG6_V1";
/// Capacity of the IPv6 source-range trie (ranges over all IPv6 LoadBalancer frontends).
pub const SRC_RANGE6_MAP_CAPACITY: u32 = 16_384;

/// Data of an IPv6 source-range trie key: a frontend's service id, then the client address.
/// The trie key's prefix length is 32 (the id) + the range's prefix length (0..=128).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct SrcRangeKey6 {
    /// Service id in network order (so its 32 bits come first in the trie's byte order).
    pub svc_id_be: u32,
    /// Client address (IPv6), network order, four words.
    pub addr_be: [u32; 4],
}
const _: () = assert!(core::mem::size_of::<SrcRangeKey6>() == 20);

/// Key of the IPv6 conntrack maps: a 5-tuple as seen on the wire, and its direction.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct CtKey6 {
    /// Network order, four words.
    pub saddr_be: [u32; 4],
    pub daddr_be: [u32; 4],
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
    /// `CT_DIR_FORWARD`, `CT_DIR_REPLY` or `CT_DIR_SNAT_OUT`.
    pub dir: u8,
    pub _pad: u16,
}
const _: () = assert!(core::mem::size_of::<CtKey6>() == 40);

/// Value of the IPv6 conntrack maps: as [`crate::CtValue`] (the tuple a packet of this
/// entry's direction is rewritten to, the backend by index and generation, the service
/// index, `CT_F_*` flags, the fitting packet size, times), with IPv6 addresses.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct CtValue6 {
    pub saddr_be: [u32; 4],
    pub daddr_be: [u32; 4],
    pub sport_be: u16,
    pub dport_be: u16,
    pub backend_id: u32,
    pub backend_gen: u32,
    pub svc_id: u32,
    pub flags: u16,
    /// Forward entries: the largest packet (IPv6 header and payload) known to fit the route
    /// toward the backend; 0 = none yet.
    pub mtu: u16,
    /// As [`crate::CtValue`]'s: counts not yet in the rows.
    pub pending: u32,
    pub created_ns: u64,
    pub last_seen_ns: u64,
}
const _: () = assert!(core::mem::size_of::<CtValue6>() == 72);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: repr(C), no implicit padding, valid for any bit pattern (as bytemuck::Pod).
    unsafe impl aya::Pod for super::CtKey6 {}
    unsafe impl aya::Pod for super::CtValue6 {}
    unsafe impl aya::Pod for super::SrcRangeKey6 {}
}
