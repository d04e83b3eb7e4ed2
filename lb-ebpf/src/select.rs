//! Service lookup and backend selection.

use aya_ebpf::helpers::bpf_get_prandom_u32;
use lb_common::{Backend, FAMILY_V4, R_NO_BACKEND, R_STALE_SLOT, SvcKey, SvcValue};

use crate::{
    maps::{XLB_BE_V1, XLB_SVC_V1},
    parse::Tuple,
    reason::Reason,
};

#[inline(always)]
fn svc_key(t: &Tuple, slot: u16) -> SvcKey {
    SvcKey {
        addr_be: [t.daddr_be, 0, 0, 0],
        port_be: t.dport_be,
        slot,
        proto: t.proto,
        family: FAMILY_V4,
        _pad: [0; 2],
    }
}

/// The service entry (slot 0) for the packet's destination, if it is a frontend.
#[inline(always)]
pub fn lookup_service(t: &Tuple) -> Option<&'static SvcValue> {
    // SAFETY: the agent replaces values whole; the datapath never writes this map.
    unsafe { XLB_SVC_V1.get(svc_key(t, 0)) }
}

/// The backend with this id, if it still exists.
#[inline(always)]
pub fn backend(id: u32) -> Option<&'static Backend> {
    // SAFETY: as above, read-only here.
    unsafe { XLB_BE_V1.get(id) }
}

/// The entry of backend slot `slot` of the packet's service.
#[inline(always)]
pub fn slot(t: &Tuple, slot: u16) -> Option<&'static SvcValue> {
    // SAFETY: read-only here.
    unsafe { XLB_SVC_V1.get(svc_key(t, slot)) }
}

/// Picks a backend uniformly at random among the service's slots (kube-proxy's iptables
/// mode picks at random too): its id, its slot and the backend.
#[inline(always)]
pub fn pick(t: &Tuple, svc: &SvcValue) -> Result<(u32, u16, Backend), Reason> {
    let count = svc.count as u32;
    if count == 0 {
        return Err(Reason(R_NO_BACKEND));
    }
    // SAFETY: helper without side effects.
    let n = ((unsafe { bpf_get_prandom_u32() } % count) + 1) as u16;
    let entry = slot(t, n).ok_or(Reason(R_STALE_SLOT))?;
    let be = backend(entry.backend_id).ok_or(Reason(R_STALE_SLOT))?;
    Ok((entry.backend_id, n, *be))
}
