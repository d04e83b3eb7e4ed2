//! Per-flow state: one forward entry (client → VIP) pins the backend, one reply entry
//! (backend → client) restores the VIP.

use aya_ebpf::helpers::bpf_ktime_get_ns;
use lb_common::{Backend, CT_DIR_FORWARD, CT_DIR_REPLY, CtKey, CtValue, FAMILY_V4, R_CT_FULL};

use crate::{maps::XLB_CT_V1, parse::Tuple, reason::Reason};

const TOUCH_INTERVAL_NS: u64 = 1_000_000_000;

#[inline(always)]
fn key(saddr: u32, daddr: u32, sport: u16, dport: u16, proto: u8, dir: u8) -> CtKey {
    CtKey {
        saddr_be: [saddr, 0, 0, 0],
        daddr_be: [daddr, 0, 0, 0],
        sport_be: sport,
        dport_be: dport,
        proto,
        family: FAMILY_V4,
        dir,
        _pad: 0,
    }
}

/// The key of the packet's own 5-tuple in direction `dir`.
#[inline(always)]
fn tuple_key(t: &Tuple, dir: u8) -> CtKey {
    key(t.saddr_be, t.daddr_be, t.sport_be, t.dport_be, t.proto, dir)
}

/// The reply entry for a packet from a backend, if its flow is tracked.
#[inline(always)]
pub fn lookup_reply(t: &Tuple) -> Option<&'static CtValue> {
    let k = tuple_key(t, CT_DIR_REPLY);
    // SAFETY: entries are replaced whole; a torn read only affects this packet's flow.
    unsafe { XLB_CT_V1.get(k) }
}

/// The forward entry for a packet to a VIP, if its flow is tracked.
#[inline(always)]
pub fn lookup_forward(t: &Tuple) -> Option<&'static mut CtValue> {
    let k = tuple_key(t, CT_DIR_FORWARD);
    // SAFETY: only `last_seen_ns` is written through this reference.
    XLB_CT_V1.get_ptr_mut(k).map(|p| unsafe { &mut *p })
}

/// Refreshes `last_seen_ns`, at most once a second to keep writes off the hot path.
#[inline(always)]
pub fn touch(ct: &mut CtValue) {
    // SAFETY: helper without side effects.
    let now = unsafe { bpf_ktime_get_ns() };
    if now.wrapping_sub(ct.last_seen_ns) > TOUCH_INTERVAL_NS {
        ct.last_seen_ns = now;
    }
}

/// Records a new flow: the reply entry first, so a reply can never beat it.
#[inline(always)]
pub fn create(t: &Tuple, backend_id: u32, be: &Backend, svc_id: u32) -> Result<(), Reason> {
    // SAFETY: helper without side effects.
    let now = unsafe { bpf_ktime_get_ns() };
    let reply_key = key(
        be.addr_be[0],
        t.saddr_be,
        be.port_be,
        t.sport_be,
        t.proto,
        CT_DIR_REPLY,
    );
    let reply = CtValue {
        nat_addr_be: [t.daddr_be, 0, 0, 0],
        nat_port_be: t.dport_be,
        backend_id,
        svc_id,
        created_ns: now,
        last_seen_ns: now,
        ..CtValue::default()
    };
    XLB_CT_V1
        .insert(reply_key, reply, 0)
        .map_err(|_| Reason(R_CT_FULL))?;
    let fwd_key = tuple_key(t, CT_DIR_FORWARD);
    let fwd = CtValue {
        nat_addr_be: be.addr_be,
        nat_port_be: be.port_be,
        ..reply
    };
    XLB_CT_V1
        .insert(fwd_key, fwd, 0)
        .map_err(|_| Reason(R_CT_FULL))
}
