//! The layouts this one replaces, as the previous agent pinned them: a new agent copies their
//! live entries (conntrack, affinity) into its own maps before its programs take over, then
//! removes these pins (see `lb-userspace`'s `datapath::upgrade`). Only the agent reads them.

use bytemuck::{Pod, Zeroable};

/// The previous conntrack map (40-byte keys, backend and service ids).
pub const MAP_CT: &str = "XLB_CT_V2";
/// The previous affinity map (service ids, backend ids without generation).
pub const MAP_AFFINITY: &str = "XLB_AFF_V1";
/// The previous service map (slots hold backend ids of `XLB_BE_V1`).
pub const MAP_SVC: &str = "XLB_SVC_V1";
/// The previous backend map (a hash: backend id → 24-byte `Backend`).
pub const MAP_BACKEND: &str = "XLB_BE_V1";
/// Every pin of the previous layout that the current one replaces, in removal order.
pub const REPLACED: [&str; 7] = [
    MAP_SVC,
    MAP_BACKEND,
    MAP_CT,
    "XLB_SVCSTAT_V1",
    "XLB_BESTAT_V1",
    MAP_AFFINITY,
    "XLB_SRCRNG_V1",
];

/// The service map of the layout before slot ranges (an entry per backend slot): an agent
/// that finds it pinned reads the frontends, their backend indices and service indices
/// from it, programs its own maps beside it, and removes it once its programs are attached
/// (`XLB_BE_V2`, conntrack and affinity carry over as they are).
pub const MAP_SVC_V2: &str = "XLB_SVC_V2";

/// The names map of earlier layouts: service index → [`crate::SvcName`] (a hash, 4 B →
/// 128 B), written by the agent for `xlb list`, never read by the programs. The names left
/// the kernel (a file beside the pins now): an agent that finds it pinned writes its names
/// to that file, then removes it after its first sync.
pub const MAP_SVC_NAME: &str = "XLB_SVCNAME_V1";

/// The address filters of the layouts before the two filters could differ in size (two
/// halves of one size, the same bit numbering as a V2 of that size): an agent that finds it
/// pinned (and no `XLB_ADDRFILT_V2`) creates its V2 of the same size, ORs these words into it
/// before its first sync (the bits of addresses gone less than a day stay), and removes
/// this pin once its programs are attached.
pub const MAP_ADDR_FILTER: &str = "XLB_ADDRFILT_V1";

/// `XLB_SVC_V2`'s key (and `XLB_SVC_V1`'s): a frontend and a slot (0: its entry).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct SvcKey {
    pub addr_be: [u32; 4],
    pub port_be: u16,
    pub slot: u16,
    pub proto: u8,
    pub family: u8,
    pub scope: u8,
    pub _pad: u8,
}
const _: () = assert!(core::mem::size_of::<SvcKey>() == 24);

/// The frontend of a key of `XLB_SVC_V2` (or `XLB_SVC_V1`), in this layout's key.
pub fn frontend(k: &SvcKey) -> crate::SvcKey {
    crate::SvcKey {
        addr_be: k.addr_be,
        port_be: k.port_be,
        proto: k.proto,
        family: k.family,
        scope: k.scope,
        _pad0: 0,
        _pad1: 0,
    }
}

/// `XLB_SVC_V2`'s value (and `XLB_SVC_V1`'s): slot 0 the entry (`count`, `flags`, `svc_id`,
/// `affinity_timeout_s`), slots `1..=count` a `backend_id` each.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct SvcValue {
    pub backend_id: u32,
    pub count: u16,
    pub flags: u16,
    pub svc_id: u32,
    pub affinity_timeout_s: u32,
}
const _: () = assert!(core::mem::size_of::<SvcValue>() == 16);

/// `XLB_CT_V2`'s key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct CtKey {
    pub saddr_be: [u32; 4],
    pub daddr_be: [u32; 4],
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
    pub family: u8,
    pub dir: u8,
    pub _pad: u8,
}
const _: () = assert!(core::mem::size_of::<CtKey>() == 40);

/// `XLB_CT_V2`'s value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct CtValue {
    pub saddr_be: [u32; 4],
    pub daddr_be: [u32; 4],
    pub sport_be: u16,
    pub dport_be: u16,
    /// A backend id of `XLB_BE_V1`.
    pub backend_id: u32,
    /// A service id of `XLB_SVC_V1`.
    pub svc_id: u32,
    pub flags: u16,
    pub mtu: u16,
    /// `bpf_ktime_get_ns` (CLOCK_MONOTONIC).
    pub created_ns: u64,
    pub last_seen_ns: u64,
}
const _: () = assert!(core::mem::size_of::<CtValue>() == 64);

/// `XLB_AFF_V1`'s value (its key has the current `AffinityKey` layout, with a V1 service
/// id).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct AffinityValue {
    pub backend_id: u32,
    pub slot: u16,
    pub _pad: u16,
    pub last_seen_ns: u64,
}
const _: () = assert!(core::mem::size_of::<AffinityValue>() == 16);

/// `XLB_BE_V1`'s value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct Backend {
    pub addr_be: [u32; 4],
    pub port_be: u16,
    pub proto: u8,
    pub family: u8,
    pub flags: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(core::mem::size_of::<Backend>() == 24);
