//! Session affinity (sessionAffinity: ClientIP): a client keeps the backend of its previous
//! connection to a service until `affinity_timeout_s` passes since its last packet.

use lb_common::{AffinityKey, AffinityValue, FAMILY_NETNS, FAMILY_V4, FAMILY_V6, SvcValue};

use crate::{
    clock,
    maps::{Chosen, XLB_AFF_V2},
    shared::{Shared, load, store},
};

const TOUCH_INTERVAL_NS: u64 = 1_000_000_000;

/// Who a client is for affinity: a packet's source address, a socket's bound source
/// address, or (a socket without one) its network namespace.
#[derive(Clone, Copy)]
pub struct Client {
    words: [u32; 2],
    family: u8,
}

/// A parsed packet, as the client its source is (each family's tuple).
pub trait ClientOf {
    fn client(&self) -> Client;
}

impl Client {
    /// An IPv4 address (network order).
    #[inline(always)]
    pub fn addr(addr_be: u32) -> Self {
        Self {
            words: [addr_be, 0],
            family: FAMILY_V4,
        }
    }

    /// An IPv6 address (network order), folded to two words: two clients that fold alike
    /// share an affinity entry (they keep one backend between them), nothing worse.
    #[inline(always)]
    pub fn addr6(addr_be: [u32; 4]) -> Self {
        Self {
            words: [addr_be[0] ^ addr_be[2], addr_be[1] ^ addr_be[3]],
            family: FAMILY_V6,
        }
    }

    /// A network namespace, by its cookie.
    #[inline(always)]
    pub fn netns(cookie: u64) -> Self {
        Self {
            words: [cookie as u32, (cookie >> 32) as u32],
            family: FAMILY_NETNS,
        }
    }
}

#[inline(always)]
fn key(client: &Client, svc_id: u32) -> AffinityKey {
    AffinityKey {
        svc_id,
        client_be: [client.words[0], client.words[1], 0, 0],
        family: client.family,
        _pad0: 0,
        _pad1: 0,
    }
}

/// The client's remembered backend, if affinity is on, it has not expired, and `still` (the
/// caller's check of the entry against the service: `select::choose`'s, whether the backend
/// is still in the slot it was chosen from) gives it back.
#[inline(always)]
pub fn lookup(
    client: &Client,
    svc: &SvcValue,
    still: impl FnOnce(&Shared<'_, AffinityValue>) -> Option<Chosen>,
) -> Option<Chosen> {
    if svc.affinity_timeout_s == 0 {
        return None;
    }
    // Shared with the other CPUs (only last_seen_ns is written in place): read through the
    // pointer (`shared.rs`).
    let a = Shared::of(XLB_AFF_V2.get_ptr_mut(key(client, svc.svc_id)))?;
    let now = clock::now();
    if clock::since(now, load!(a, last_seen_ns)) > svc.affinity_timeout_s as u64 * 1_000_000_000 {
        return None;
    }
    let remembered = still(&a)?;
    store!(a, last_seen_ns, now);
    Some(remembered)
}

/// Remembers the client's backend (affinity services only): index, slot, generation.
#[inline(always)]
pub fn remember(client: &Client, svc: &SvcValue, backend_id: u32, slot: u16, generation: u32) {
    if svc.affinity_timeout_s == 0 {
        return;
    }
    let v = AffinityValue {
        backend_id,
        slot,
        _pad0: 0,
        backend_gen: generation,
        _pad1: 0,
        last_seen_ns: clock::now(),
    };
    // An LRU insert only fails under memory pressure; the flow works without affinity.
    let _ = XLB_AFF_V2.insert(key(client, svc.svc_id), v, 0);
}

/// A packet of an established flow of service index `svc_id` (one with affinity) keeps the
/// affinity of its client (the packet's source) alive, at most one write a second.
#[inline(always)]
pub fn touch(client: &Client, svc_id: u32) {
    if let Some(a) = Shared::of(XLB_AFF_V2.get_ptr_mut(key(client, svc_id))) {
        let now = clock::now();
        if clock::since(now, load!(a, last_seen_ns)) > TOUCH_INTERVAL_NS {
            store!(a, last_seen_ns, now);
        }
    }
}
