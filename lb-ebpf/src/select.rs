//! Frontend lookup and backend choice: the one place tc, XDP and the socket hooks pick a
//! backend (ClientIP affinity first, else the frontend's Maglev table for a flow's hash,
//! else uniformly at random among the service's slots).
//! Which endpoints are eligible (traffic policies, serving-terminating fallback, topology)
//! the agent decided when it wrote the slots.

use aya_ebpf::helpers::bpf_get_prandom_u32;
use lb_common::{
    AffinityValue, Backend, FAMILY_V4, FAMILY_V6, MAGLEV_ROW_SLOTS, R_NO_BACKEND, R_STALE_SLOT,
    SVC_F_MAGLEV, SvcKey, SvcValue,
};

use crate::{
    affinity::{self, Client},
    maps::{Chosen, XLB_BE_V2, XLB_MAGLEV_V2, XLB_SLOT_V1, XLB_SVC_V3},
    reason::Reason,
    shared::{Shared, get},
};

/// A frontend as the service map keys it.
#[derive(Clone, Copy)]
pub struct Frontend {
    pub addr_be: u32,
    pub port_be: u16,
    pub proto: u8,
    /// `SCOPE_EXTERNAL` or `SCOPE_INTERNAL`.
    pub scope: u8,
}

/// A frontend's service-map key: IPv4 ([`Frontend`]) and IPv6 ([`Frontend6`]) frontends
/// share the map, the lookups and the backend choice.
pub trait Keyed {
    fn key(&self) -> SvcKey;
}

impl Keyed for Frontend {
    #[inline(always)]
    fn key(&self) -> SvcKey {
        SvcKey {
            addr_be: [self.addr_be, 0, 0, 0],
            port_be: self.port_be,
            proto: self.proto,
            family: FAMILY_V4,
            scope: self.scope,
            _pad0: 0,
            _pad1: 0,
        }
    }
}

/// An IPv6 frontend (the socket hooks').
#[derive(Clone, Copy)]
pub struct Frontend6 {
    pub addr_be: [u32; 4],
    pub port_be: u16,
    pub proto: u8,
    pub scope: u8,
}

impl Keyed for Frontend6 {
    #[inline(always)]
    fn key(&self) -> SvcKey {
        SvcKey {
            addr_be: self.addr_be,
            port_be: self.port_be,
            proto: self.proto,
            family: FAMILY_V6,
            scope: self.scope,
            _pad0: 0,
            _pad1: 0,
        }
    }
}

/// True for 127.0.0.0/8 (network order): loopback frontends (NodePorts on 127.0.0.1) exist
/// for the node's own sockets only, never for a packet that arrived on an interface.
#[inline(always)]
pub fn is_loopback(addr_be: u32) -> bool {
    addr_be.to_ne_bytes()[0] == 127
}

/// The service entry of `f`, if it is a frontend.
#[inline(always)]
pub fn lookup<F: Keyed>(f: &F) -> Option<&'static SvcValue> {
    // SAFETY: the agent replaces values whole; the datapath never writes this map.
    unsafe { XLB_SVC_V3.get(f.key()) }
}

/// The backend at index `id`, if the index holds one.
#[inline(always)]
pub fn backend(id: u32) -> Option<&'static Backend> {
    XLB_BE_V2.get(id).filter(|b| b.generation != 0)
}

/// Whether index `id` still holds the backend of `generation` (a flow's, an affinity's).
#[inline(always)]
pub fn backend_is(id: u32, generation: u32) -> bool {
    generation != 0
        && XLB_BE_V2
            .get(id)
            .is_some_and(|b| b.generation == generation)
}

/// The backend index in slot `n` (`1..=count`) of the frontend whose entry is `svc`: element
/// `slot_base + n - 1` of the slot array (the array's lookup bounds the index; a slot past
/// the entry's count is none of the frontend's).
#[inline(always)]
pub fn slot(svc: &SvcValue, n: u16) -> Option<u32> {
    if n == 0 || n > svc.count {
        return None;
    }
    let i = svc.slot_base.wrapping_add(n as u32 - 1);
    XLB_SLOT_V1.get(i).copied()
}

/// The backend `client` gets from the frontend whose entry is `svc`: the one it is bound to by ClientIP affinity, else
/// the one the frontend's Maglev table gives the flow's `hash` (a frontend flagged
/// `SVC_F_MAGLEV`; `None`: a socket's connect, which has no flow yet), else one picked at
/// random.
#[inline(always)]
pub fn choose(client: &Client, svc: &SvcValue, hash: Option<u32>) -> Result<Chosen, Reason> {
    // Each field of the entry read where it is used (kept across the lookups, they would be
    // spilled).
    let still = |a: &Shared<'_, AffinityValue>| {
        if slot(svc, get!(a, slot)) != Some(get!(a, backend_id)) {
            return None;
        }
        let be = *backend(get!(a, backend_id)).filter(|b| b.generation == get!(a, backend_gen))?;
        Some(Chosen {
            id: get!(a, backend_id),
            slot: get!(a, slot),
            _pad: 0,
            backend: be,
        })
    };
    if let Some(remembered) = affinity::lookup(client, svc, still) {
        return Ok(remembered);
    }
    let n = match hash {
        Some(h) if svc.flags & SVC_F_MAGLEV != 0 => {
            xlb_maglev_slot(svc.svc_id, h, svc.count as u32) as u16
        }
        _ => 0,
    };
    pick(svc, n)
}

/// The slot the Maglev table of service index `svc_id` holds for `hash`, if it is one of the frontend's
/// `count` slots; else 0 (random choice). A global BPF function (exported by the linker,
/// see `nat::xlb_crc32c_step`): verified once, not at each of the call sites, where its
/// table read (a map value plus a variable offset) would multiply the verifier's
/// speculative paths without CAP_PERFMON.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn xlb_maglev_slot(svc_id: u32, hash: u32, count: u32) -> u32 {
    // SAFETY: read-only here; the agent replaces a table in one update (a hash map's
    // element is swapped whole, never written in place).
    let Some(row) = (unsafe { XLB_MAGLEV_V2.get(svc_id) }) else {
        return 0;
    };
    let size = row.size;
    if size == 0 {
        return 0;
    }
    // Masked (a row has a power of two of entries): the verifier follows a mask, not a
    // modulo; for a table of `size` ≤ that, the mask changes nothing.
    let i = (hash % size) as usize & (MAGLEV_ROW_SLOTS - 1);
    let n = row.slots.get(i).copied().unwrap_or(0) as u32;
    if n <= count { n } else { 0 }
}

/// The backend in slot `n` (1..=count, the Maglev table's choice), or when `n` is 0 one
/// picked uniformly at random among the service's slots (kube-proxy's iptables mode picks
/// at random too).
#[inline(always)]
pub fn pick(svc: &SvcValue, n: u16) -> Result<Chosen, Reason> {
    let count = svc.count as u32;
    if count == 0 {
        return Err(Reason(R_NO_BACKEND));
    }
    let n = if n != 0 {
        n
    } else {
        // SAFETY: helper without side effects.
        ((unsafe { bpf_get_prandom_u32() } % count) + 1) as u16
    };
    let id = slot(svc, n).ok_or(Reason(R_STALE_SLOT))?;
    let be = backend(id).ok_or(Reason(R_STALE_SLOT))?;
    Ok(Chosen {
        id,
        slot: n,
        _pad: 0,
        backend: *be,
    })
}
