//! IPv6 per-flow state, as `conntrack.rs` keeps it for IPv4 (forward entry client →
//! frontend, reply entry backend → client; an answered flow that goes on moves to the
//! assured table), in the IPv6 tables. The family-independent steps (refresh, FIN/RST,
//! whether a flow continues) are `conntrack.rs`'s, generic over the entry.

#![allow(clippy::needless_borrows_for_generic_args)]

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_prandom_u32, bpf_loop},
};
use lb_common::{
    CT_DIR_FORWARD, CT_DIR_REPLY, CT_F_ASSURED, CT_F_CLOSING, CT_F_REPLIED, CT_F_RESET, CtKey6,
    CtValue6, IPPROTO_TCP, IPPROTO_UDP, R_CT_ASSURED_FULL, R_CT_FULL, R_SNAT_FAILED,
};

use super::{
    maps::{FlowScratch6, XLB_CT6_V1, XLB_CTA6_V1, XLB_SCRATCH6},
    parse::Tuple6,
};
use crate::{
    clock,
    conntrack::{REUSE_CLOSING_NS, REUSE_TCP_NS, REUSE_UDP_NS, SNAT_TRIES, TCP_ACK, TCP_SYN},
    reason::Reason,
};

/// Whether two IPv6 addresses are equal, word by word (an array comparison may become a
/// `bcmp` call, which BPF does not have).
#[inline(always)]
pub fn eq6(a: &[u32; 4], b: &[u32; 4]) -> bool {
    (a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3]) == 0
}

/// `*dst = *src` word by word, volatile: an array copy between two map values may become a
/// `memmove`, whose pointer subtraction the verifier refuses without CAP_PERFMON.
#[inline(always)]
pub fn copy6(dst: &mut [u32; 4], src: &[u32; 4]) {
    for i in 0..4 {
        // SAFETY: both indices are in bounds.
        unsafe { core::ptr::write_volatile(&mut dst[i], core::ptr::read_volatile(&src[i])) };
    }
}

#[inline(always)]
pub fn key(s: &[u32; 4], d: &[u32; 4], sport: u16, dport: u16, proto: u8, dir: u8) -> CtKey6 {
    CtKey6 {
        saddr_be: *s,
        daddr_be: *d,
        sport_be: sport,
        dport_be: dport,
        proto,
        dir,
        _pad: 0,
    }
}

#[inline(always)]
fn tuple_key(t: &Tuple6, dir: u8) -> CtKey6 {
    key(
        &t.saddr_be,
        &t.daddr_be,
        t.sport_be,
        t.dport_be,
        t.proto,
        dir,
    )
}

/// The entry for `k`: assured or not yet.
#[inline(always)]
pub fn get(k: &CtKey6) -> Option<&'static CtValue6> {
    // SAFETY: entries are replaced whole; a torn read only affects this packet's flow.
    unsafe { XLB_CTA6_V1.get(k).or_else(|| XLB_CT6_V1.get(k)) }
}

#[inline(always)]
fn get_mut(k: &CtKey6) -> Option<&'static mut CtValue6> {
    // SAFETY: as `get`; only a flow's own fields are written through it.
    XLB_CTA6_V1
        .get_ptr_mut(k)
        .or_else(|| XLB_CT6_V1.get_ptr_mut(k))
        .map(|p| unsafe { &mut *p })
}

#[inline(always)]
fn remove(k: &CtKey6) {
    let _ = XLB_CTA6_V1.remove(k);
    let _ = XLB_CT6_V1.remove(k);
}

/// The forward entry for a packet to a frontend, if its flow is tracked.
#[inline(always)]
pub fn lookup_forward(t: &Tuple6) -> Option<&'static mut CtValue6> {
    get_mut(&tuple_key(t, CT_DIR_FORWARD))
}

/// The reply entry for a packet from a backend (marked answered), as IPv4's.
#[inline(always)]
pub fn lookup_reply(t: &Tuple6) -> Option<&'static mut CtValue6> {
    let k = tuple_key(t, CT_DIR_REPLY);
    let ct = get_mut(&k)?;
    if t.proto == IPPROTO_TCP
        && t.tcp_flags & TCP_SYN != 0
        && ct.flags & (CT_F_CLOSING | CT_F_RESET) != 0
    {
        remove(&k);
        return None;
    }
    if ct.flags & CT_F_REPLIED == 0 {
        ct.flags |= CT_F_REPLIED;
    }
    Some(ct)
}

/// The per-CPU scratch of the IPv6 path.
#[inline(always)]
pub fn scratch() -> Result<&'static mut FlowScratch6, Reason> {
    let p = XLB_SCRATCH6.get_ptr_mut(0).ok_or(Reason(R_CT_FULL))?;
    // SAFETY: this CPU's slot; nothing else runs on it while the program does.
    Ok(unsafe { &mut *p })
}

/// `*dst = *src`, field by field (see [`copy6`]).
#[inline(always)]
fn copy(dst: &mut CtValue6, src: &CtValue6) {
    copy6(&mut dst.saddr_be, &src.saddr_be);
    copy6(&mut dst.daddr_be, &src.daddr_be);
    dst.sport_be = src.sport_be;
    dst.dport_be = src.dport_be;
    dst.backend_id = src.backend_id;
    dst.backend_gen = src.backend_gen;
    dst.svc_id = src.svc_id;
    dst.flags = src.flags;
    dst.mtu = src.mtu;
    dst._pad = 0;
    dst.created_ns = src.created_ns;
    dst.last_seen_ns = src.last_seen_ns;
}

/// Makes the flow assured once answered and continued, as IPv4's `conntrack::assure`.
#[inline(always)]
pub fn assure(ct: &'static mut CtValue6, t: &Tuple6) -> &'static mut CtValue6 {
    if ct.flags & CT_F_ASSURED != 0
        || (t.proto == IPPROTO_TCP && t.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN)
    {
        return ct;
    }
    match promote(ct, t) {
        Some(assured) => assured,
        None => ct,
    }
}

#[inline(never)]
fn promote(ct: &CtValue6, t: &Tuple6) -> Option<&'static mut CtValue6> {
    let s = scratch().ok()?;
    s.reply_key = key(
        &ct.daddr_be,
        &ct.saddr_be,
        ct.dport_be,
        ct.sport_be,
        t.proto,
        CT_DIR_REPLY,
    );
    // SAFETY: as `get`.
    let reply = unsafe { XLB_CT6_V1.get(&s.reply_key) }?;
    if reply.flags & CT_F_REPLIED == 0 {
        return None;
    }
    copy(&mut s.reply, reply);
    s.reply.flags |= CT_F_ASSURED;
    copy(&mut s.fwd, ct);
    s.fwd.flags |= CT_F_ASSURED;
    s.fwd_key = tuple_key(t, CT_DIR_FORWARD);
    if XLB_CTA6_V1.insert(&s.reply_key, &s.reply, 0).is_err() {
        Reason(R_CT_ASSURED_FULL).count(0);
        return None;
    }
    if XLB_CTA6_V1.insert(&s.fwd_key, &s.fwd, 0).is_err() {
        let _ = XLB_CTA6_V1.remove(&s.reply_key);
        Reason(R_CT_ASSURED_FULL).count(0);
        return None;
    }
    let _ = XLB_CT6_V1.remove(&s.fwd_key);
    let _ = XLB_CT6_V1.remove(&s.reply_key);
    XLB_CTA6_V1
        .get_ptr_mut(&s.fwd_key)
        .map(|p| unsafe { &mut *p })
}

/// Records the new flow of `t` whose packets go to the scratch's `fwd` (filled by the
/// caller): the reply entry first, so a reply can never beat it. `snat`: the source is
/// translated (the caller set `fwd`'s address): its port is the first free one of
/// `min..=max` from a random start, so no two flows to a backend share a reply tuple.
/// Without SNAT a reply tuple held by another live flow (one client port to two frontends
/// with one backend) fails the flow (`snat_failed`), where IPv4 remaps the port.
#[inline(always)]
pub fn create(t: &Tuple6, snat: bool, min: u16, max: u16) -> Result<(), Reason> {
    let s = scratch()?;
    let now = clock::now();
    s.fwd.created_ns = now;
    s.fwd.last_seen_ns = now;
    copy(&mut s.reply, &s.fwd);
    copy6(&mut s.reply.saddr_be, &t.daddr_be);
    copy6(&mut s.reply.daddr_be, &t.saddr_be);
    s.reply.sport_be = t.dport_be;
    s.reply.dport_be = t.sport_be;
    s.reply_key = key(
        &s.fwd.daddr_be,
        &s.fwd.saddr_be,
        s.fwd.dport_be,
        s.fwd.sport_be,
        t.proto,
        CT_DIR_REPLY,
    );
    if snat {
        s.fwd.sport_be = claim_port(s, min, max)?;
    } else if !claim(s) {
        return Err(Reason(R_SNAT_FAILED));
    }
    s.fwd_key = tuple_key(t, CT_DIR_FORWARD);
    let _ = XLB_CTA6_V1.remove(&s.fwd_key);
    XLB_CT6_V1
        .insert(&s.fwd_key, &s.fwd, 0)
        .map_err(|_| Reason(R_CT_FULL))
}

/// Inserts the scratch's reply entry: under a free key, over the previous flow of this very
/// tuple, or over a flow that is over (then its forward entry goes too).
#[inline(always)]
fn claim(s: &mut FlowScratch6) -> bool {
    // SAFETY: only compared with None.
    if unsafe { XLB_CTA6_V1.get(&s.reply_key) }.is_none()
        && XLB_CT6_V1
            .insert(&s.reply_key, &s.reply, BPF_NOEXIST as u64)
            .is_ok()
    {
        return true;
    }
    let Some(old) = get(&s.reply_key) else {
        return false;
    };
    let r = &s.reply;
    let own = eq6(&old.daddr_be, &r.daddr_be)
        && old.dport_be == r.dport_be
        && eq6(&old.saddr_be, &r.saddr_be)
        && old.sport_be == r.sport_be;
    if !own && !over(s, old) {
        return false;
    }
    let _ = XLB_CTA6_V1.remove(&s.reply_key);
    XLB_CT6_V1.insert(&s.reply_key, &s.reply, 0).is_ok()
}

/// State of the SNAT port search run by `bpf_loop` (the entries stay in the scratch).
struct PortSearch {
    min: u32,
    range: u32,
    start: u32,
    /// The claimed port (network order), 0 until one is found.
    found_be: u32,
}

/// One try of the port search: the `idx`-th port from the random start.
#[inline(never)]
extern "C" fn try_port(idx: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `bpf_loop` passes back the pointer `claim_port` gave it, to a live PortSearch.
    let p = unsafe { &mut *(ctx as *mut PortSearch) };
    let Ok(s) = scratch() else {
        return 1;
    };
    if p.range == 0 {
        return 1;
    }
    let port = (p.min + (p.start + idx as u32) % p.range) as u16;
    s.reply_key.dport_be = port.to_be();
    if claim(s) {
        p.found_be = port.to_be() as u32;
        return 1;
    }
    0
}

/// Inserts the scratch's reply entry under the first free port of `min..=max` (up to
/// `SNAT_TRIES` of them) from a random start; the port, network order.
#[inline(always)]
fn claim_port(_s: &mut FlowScratch6, min: u16, max: u16) -> Result<u16, Reason> {
    if min == 0 || max < min {
        return Err(Reason(R_SNAT_FAILED));
    }
    let range = (max - min) as u32 + 1;
    let mut search = PortSearch {
        min: min as u32,
        range,
        // SAFETY: helper without side effects.
        start: unsafe { bpf_get_prandom_u32() } % range,
        found_be: 0,
    };
    let tries = if range < SNAT_TRIES {
        range
    } else {
        SNAT_TRIES
    };
    // SAFETY: the callback only touches `search`, which outlives the call, and the scratch.
    unsafe {
        bpf_loop(
            tries,
            try_port as *mut core::ffi::c_void,
            &mut search as *mut PortSearch as *mut core::ffi::c_void,
            0,
        )
    };
    if search.found_be == 0 {
        return Err(Reason(R_SNAT_FAILED));
    }
    Ok(search.found_be as u16)
}

/// Keeps the reply entry of a SNATed flow recently used (as IPv4's `keep_reply`), so LRU
/// eviction never takes it before its forward entry.
#[inline(always)]
pub fn keep_reply(ct: &CtValue6, proto: u8) {
    if ct.flags & CT_F_ASSURED != 0 {
        return;
    }
    let k = key(
        &ct.daddr_be,
        &ct.saddr_be,
        ct.dport_be,
        ct.sport_be,
        proto,
        CT_DIR_REPLY,
    );
    // SAFETY: only looked up (which marks it used).
    let _ = unsafe { XLB_CT6_V1.get(&k) };
}

/// Whether the flow owning the reply entry `old` (at the scratch's reply key) is over, with
/// IPv4's reuse times; if so its forward entry is removed.
#[inline(always)]
fn over(s: &mut FlowScratch6, old: &CtValue6) -> bool {
    let proto = s.reply_key.proto;
    s.fwd_key = key(
        &old.daddr_be,
        &old.saddr_be,
        old.dport_be,
        old.sport_be,
        proto,
        CT_DIR_FORWARD,
    );
    let k = &s.reply_key;
    let fwd = get(&s.fwd_key).filter(|f| {
        eq6(&f.saddr_be, &k.daddr_be)
            && f.sport_be == k.dport_be
            && eq6(&f.daddr_be, &k.saddr_be)
            && f.dport_be == k.sport_be
    });
    let mut last = old.last_seen_ns;
    let mut flags = old.flags;
    if let Some(f) = fwd {
        if f.last_seen_ns > last {
            last = f.last_seen_ns;
        }
        flags |= f.flags;
    }
    let closed_both =
        old.flags & CT_F_CLOSING != 0 && fwd.is_some_and(|f| f.flags & CT_F_CLOSING != 0);
    let idle = if flags & CT_F_RESET != 0 || closed_both {
        REUSE_CLOSING_NS
    } else if proto == IPPROTO_UDP {
        REUSE_UDP_NS
    } else {
        REUSE_TCP_NS
    };
    if clock::since(clock::now(), last) < idle {
        return false;
    }
    if fwd.is_some() {
        remove(&s.fwd_key);
    }
    true
}

impl crate::conntrack::Flow for Tuple6 {
    #[inline(always)]
    fn proto(&self) -> u8 {
        self.proto
    }
    #[inline(always)]
    fn tcp_flags(&self) -> u8 {
        self.tcp_flags
    }
}
