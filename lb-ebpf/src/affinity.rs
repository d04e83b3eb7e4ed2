//! Session affinity (sessionAffinity: ClientIP): a client keeps the backend of its previous
//! connection to a service until `affinity_timeout_s` passes since its last packet.

use aya_ebpf::helpers::bpf_ktime_get_ns;
use lb_common::{AffinityKey, AffinityValue, Backend, FAMILY_V4, SvcValue};

use crate::{
    maps::XLB_AFF_V1,
    parse::Tuple,
    select::{backend, slot},
};

const TOUCH_INTERVAL_NS: u64 = 1_000_000_000;

#[inline(always)]
fn key(t: &Tuple, svc: &SvcValue) -> AffinityKey {
    AffinityKey {
        svc_id: svc.svc_id,
        client_be: [t.saddr_be, 0, 0, 0],
        family: FAMILY_V4,
        _pad0: 0,
        _pad1: 0,
    }
}

#[inline(always)]
fn now() -> u64 {
    // SAFETY: helper without side effects.
    unsafe { bpf_ktime_get_ns() }
}

/// The client's remembered backend, if affinity is on, it has not expired, and the backend is
/// still in the slot it was chosen from.
#[inline(always)]
pub fn lookup(t: &Tuple, svc: &SvcValue) -> Option<(u32, u16, Backend)> {
    if svc.affinity_timeout_s == 0 {
        return None;
    }
    let a = XLB_AFF_V1.get_ptr_mut(key(t, svc))?;
    // SAFETY: the entry stays valid for this program run; only last_seen_ns is written.
    let a = unsafe { &mut *a };
    let now = now();
    if now.wrapping_sub(a.last_seen_ns) > svc.affinity_timeout_s as u64 * 1_000_000_000 {
        return None;
    }
    if slot(t, a.slot).is_none_or(|s| s.backend_id != a.backend_id) {
        return None;
    }
    let be = *backend(a.backend_id)?;
    a.last_seen_ns = now;
    Some((a.backend_id, a.slot, be))
}

/// Remembers the client's backend (affinity services only).
#[inline(always)]
pub fn remember(t: &Tuple, svc: &SvcValue, backend_id: u32, slot: u16) {
    if svc.affinity_timeout_s == 0 {
        return;
    }
    let v = AffinityValue {
        backend_id,
        slot,
        _pad: 0,
        last_seen_ns: now(),
    };
    // An LRU insert only fails under memory pressure; the flow works without affinity.
    let _ = XLB_AFF_V1.insert(key(t, svc), v, 0);
}

/// A packet of an established flow keeps the client's affinity alive (at most one write a
/// second).
#[inline(always)]
pub fn touch(t: &Tuple, svc: &SvcValue) {
    if svc.affinity_timeout_s == 0 {
        return;
    }
    if let Some(a) = XLB_AFF_V1.get_ptr_mut(key(t, svc)) {
        // SAFETY: as in `lookup`.
        let a = unsafe { &mut *a };
        let now = now();
        if now.wrapping_sub(a.last_seen_ns) > TOUCH_INTERVAL_NS {
            a.last_seen_ns = now;
        }
    }
}
