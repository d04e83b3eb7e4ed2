//! Per-flow state: one forward entry (client → frontend) holds the tuple the flow's packets
//! are rewritten to (backend, and SNAT source if any), one reply entry (backend → client or
//! SNAT address) holds the tuple its replies are restored to (frontend → client).

// Map entries are passed by reference on purpose: a copy would go through the 512-byte stack.
#![allow(clippy::needless_borrows_for_generic_args)]

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_prandom_u32, bpf_loop},
};
use lb_common::{
    CT_DIR_FORWARD, CT_DIR_REPLY, CT_F_ASSURED, CT_F_CLOSING, CT_F_REPLIED, CT_F_RESET, CT_F_SNAT,
    CtKey, CtValue, IPPROTO_TCP, IPPROTO_UDP, R_CT_ASSURED_FULL, R_CT_FULL, R_SNAT_FAILED,
};

use crate::{
    clock,
    maps::{FlowScratch, XLB_CT_V3, XLB_CTA_V1, XLB_SCRATCH},
    parse::Tuple,
    reason::Reason,
    select::backend_is,
};

pub(crate) const TOUCH_INTERVAL_NS: u64 = 1_000_000_000;
/// Ports tried from the SNAT range (one after another from a random start) before a new
/// flow is given up: the whole of a range up to this size, so a range is usable to its last
/// port; a full range shows as `snat_failed`, never as a collision. `bpf_loop` keeps the
/// verifier's cost independent of it.
pub(crate) const SNAT_TRIES: u32 = 1024;

#[inline(always)]
pub fn key(saddr: u32, daddr: u32, sport: u16, dport: u16, proto: u8, dir: u8) -> CtKey {
    CtKey {
        saddr_be: saddr,
        daddr_be: daddr,
        sport_be: sport,
        dport_be: dport,
        proto,
        dir,
        _pad: 0,
    }
}

/// The key of the packet's own 5-tuple in direction `dir`.
#[inline(always)]
fn tuple_key(t: &Tuple, dir: u8) -> CtKey {
    key(t.saddr_be, t.daddr_be, t.sport_be, t.dport_be, t.proto, dir)
}

/// The entry for `k`, if its flow is tracked: assured (`XLB_CTA_V1`) or not yet
/// (`XLB_CT_V3`).
#[inline(always)]
pub fn get(k: &CtKey) -> Option<&'static CtValue> {
    // SAFETY: entries are replaced whole; a torn read only affects this packet's flow.
    unsafe { XLB_CTA_V1.get(k).or_else(|| XLB_CT_V3.get(k)) }
}

/// The entry for `k`, writable (only `last_seen_ns`, `mtu` and `flags` are written through
/// it).
#[inline(always)]
fn get_mut(k: &CtKey) -> Option<&'static mut CtValue> {
    // SAFETY: as `get`; the fields written are a flow's own.
    XLB_CTA_V1
        .get_ptr_mut(k)
        .or_else(|| XLB_CT_V3.get_ptr_mut(k))
        .map(|p| unsafe { &mut *p })
}

/// Forgets `k` in both tables.
#[inline(always)]
fn remove(k: &CtKey) {
    let _ = XLB_CTA_V1.remove(k);
    let _ = XLB_CT_V3.remove(k);
}

/// The reply entry for a packet from a backend, if its flow is tracked. The first reply
/// marks it answered (`CT_F_REPLIED`): the client's next packet makes the flow assured.
#[inline(always)]
pub fn lookup_reply(t: &Tuple) -> Option<&'static mut CtValue> {
    let k = tuple_key(t, CT_DIR_REPLY);
    let ct = get_mut(&k)?;
    // A SYN-ACK never belongs to a flow that has closed: the client reused its port for a
    // connection straight to the backend, which the closed flow's entry must leave alone
    // (it goes, so the connection's later packets do not match it either).
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

/// The forward entry for a packet to a frontend, if its flow is tracked.
#[inline(always)]
pub fn lookup_forward(t: &Tuple) -> Option<&'static mut CtValue> {
    get_mut(&tuple_key(t, CT_DIR_FORWARD))
}

/// The reply key of the flow whose forward entry is `fwd`.
#[inline(always)]
fn reply_key_of(fwd: &CtValue, proto: u8) -> CtKey {
    key(
        fwd.daddr_be,
        fwd.saddr_be,
        fwd.dport_be,
        fwd.sport_be,
        proto,
        CT_DIR_REPLY,
    )
}

/// Makes the flow of `t` (forward entry `ct`, not yet assured) assured once its backend has
/// answered and the client goes on (any packet but a SYN): both entries move from the LRU
/// table to `XLB_CTA_V1`, reply first (a reply always finds its entry), where no flood of
/// new flows can evict them. Returns the forward entry now in use: the assured copy, or `ct`
/// while the flow is not answered yet or the assured table is full (`ct_assured_full`).
#[inline(always)]
pub fn assure(ct: &'static mut CtValue, t: &Tuple) -> &'static mut CtValue {
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

/// `*dst = *src`, field by field: a struct copy between two map values compiles to a
/// `memmove` whose overlap check subtracts pointers, which the verifier refuses without
/// CAP_PERFMON.
#[inline(always)]
fn copy(dst: &mut CtValue, src: &CtValue) {
    dst.saddr_be = src.saddr_be;
    dst.daddr_be = src.daddr_be;
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

/// The move itself (out of line: rare, and its keys stay off the caller's frame).
#[inline(never)]
fn promote(ct: &CtValue, t: &Tuple) -> Option<&'static mut CtValue> {
    let s = scratch().ok()?;
    s.reply_key = reply_key_of(ct, t.proto);
    // SAFETY: as `get`.
    let reply = unsafe { XLB_CT_V3.get(&s.reply_key) }?;
    if reply.flags & CT_F_REPLIED == 0 {
        return None;
    }
    copy(&mut s.reply, reply);
    s.reply.flags |= CT_F_ASSURED;
    copy(&mut s.fwd, ct);
    s.fwd.flags |= CT_F_ASSURED;
    s.fwd_key = tuple_key(t, CT_DIR_FORWARD);
    if XLB_CTA_V1.insert(&s.reply_key, &s.reply, 0).is_err() {
        Reason(R_CT_ASSURED_FULL).count(0);
        return None;
    }
    if XLB_CTA_V1.insert(&s.fwd_key, &s.fwd, 0).is_err() {
        let _ = XLB_CTA_V1.remove(&s.reply_key);
        Reason(R_CT_ASSURED_FULL).count(0);
        return None;
    }
    let _ = XLB_CT_V3.remove(&s.fwd_key);
    let _ = XLB_CT_V3.remove(&s.reply_key);
    XLB_CTA_V1
        .get_ptr_mut(&s.fwd_key)
        .map(|p| unsafe { &mut *p })
}

/// What the family-independent flow steps read of a packet's tuple (IPv4's [`Tuple`],
/// IPv6's `Tuple6`).
pub trait Flow {
    fn proto(&self) -> u8;
    fn tcp_flags(&self) -> u8;
}

impl Flow for Tuple {
    #[inline(always)]
    fn proto(&self) -> u8 {
        self.proto
    }
    #[inline(always)]
    fn tcp_flags(&self) -> u8 {
        self.tcp_flags
    }
}

/// What they read and write of a conntrack entry (IPv4's `CtValue`, IPv6's `CtValue6`):
/// the fields both layouts share.
pub trait Entry {
    fn flags(&self) -> u16;
    fn flags_mut(&mut self) -> &mut u16;
    fn last_seen(&mut self) -> &mut u64;
    fn mtu(&mut self) -> &mut u16;
    /// The backend's index and generation.
    fn backend(&self) -> (u32, u32);
}

macro_rules! entry {
    ($t:ty) => {
        impl Entry for $t {
            #[inline(always)]
            fn flags(&self) -> u16 {
                self.flags
            }
            #[inline(always)]
            fn flags_mut(&mut self) -> &mut u16 {
                &mut self.flags
            }
            #[inline(always)]
            fn last_seen(&mut self) -> &mut u64 {
                &mut self.last_seen_ns
            }
            #[inline(always)]
            fn mtu(&mut self) -> &mut u16 {
                &mut self.mtu
            }
            #[inline(always)]
            fn backend(&self) -> (u32, u32) {
                (self.backend_id, self.backend_gen)
            }
        }
    };
}
entry!(CtValue);
entry!(lb_common::CtValue6);

/// Refreshes `last_seen_ns` for a packet of `t` (at most once a second, to keep writes off
/// the hot path; returns whether it did), and records a TCP FIN or RST in its direction.
#[inline(always)]
pub fn touch<E: Entry, F: Flow>(ct: &mut E, t: &F) -> bool {
    let now = clock::now();
    let mut refreshed = false;
    if clock::since(now, *ct.last_seen()) > TOUCH_INTERVAL_NS {
        *ct.last_seen() = now;
        // Forget the fitting packet size once a second: a route that shrank is seen again.
        *ct.mtu() = 0;
        refreshed = true;
    }
    let flags = t.tcp_flags();
    let seen = if flags & TCP_RST != 0 {
        CT_F_RESET
    } else if flags & TCP_FIN != 0 {
        CT_F_CLOSING
    } else {
        0
    };
    if seen != 0 && ct.flags() & seen == 0 {
        *ct.flags_mut() |= seen;
        *ct.last_seen() = now;
    }
    refreshed
}

/// Whether a packet of a tracked flow stays on it. As with kube-proxy's conntrack, a TCP
/// connection keeps a backend that left the service (graceful termination), while a UDP
/// flow whose backend was removed is re-balanced (kube-proxy flushes those). A new TCP
/// connection (SYN without ACK) on a tuple whose flow is closing or whose backend is gone
/// starts over: the client reused its port (as conntrack reopens a TIME_WAIT connection).
#[inline(always)]
pub fn continues<E: Entry, F: Flow>(ct: &E, t: &F) -> bool {
    if t.proto() == IPPROTO_TCP {
        if t.tcp_flags() & (TCP_SYN | TCP_ACK) != TCP_SYN {
            return true;
        }
        if ct.flags() & (CT_F_CLOSING | CT_F_RESET) != 0 {
            return false;
        }
    }
    let (id, generation) = ct.backend();
    backend_is(id, generation)
}

/// A TCP packet that cannot open a connection (not a bare SYN): matching no flow, it was
/// picked up mid-stream.
#[inline(always)]
pub fn mid_stream<F: Flow>(t: &F) -> bool {
    t.proto() == IPPROTO_TCP && t.tcp_flags() & (TCP_SYN | TCP_ACK) != TCP_SYN
}

/// Keeps the reply entry of a SNATed flow recently used, so LRU eviction never takes it
/// before its forward entry (its port would go to a new flow while this one still uses it).
#[inline(always)]
pub fn keep_reply(ct: &CtValue, proto: u8) {
    if ct.flags & CT_F_ASSURED != 0 {
        return;
    }
    // SAFETY: only looked up (which marks it used).
    let _ = unsafe { XLB_CT_V3.get(&reply_key_of(ct, proto)) };
}

pub(crate) const TCP_FIN: u8 = 0x01;
pub(crate) const TCP_SYN: u8 = 0x02;
pub(crate) const TCP_RST: u8 = 0x04;
pub(crate) const TCP_ACK: u8 = 0x10;
/// Idle time after which a flow's SNAT port may go to a new flow: a closing TCP flow (FIN or
/// RST seen), a UDP flow, a TCP flow without either (kube-proxy's conntrack settings: UDP
/// 30 s, TCP established 24 h; closing is shorter than TIME_WAIT's 120 s because the client
/// that holds TIME_WAIT is not the one that reuses the tuple).
pub(crate) const REUSE_CLOSING_NS: u64 = 10_000_000_000;
pub(crate) const REUSE_UDP_NS: u64 = 30_000_000_000;
pub(crate) const REUSE_TCP_NS: u64 = 24 * 3600 * 1_000_000_000;

/// Whether the flow owning reply entry `key` → `old` is over, so its SNAT port may be reused;
/// if so its forward entry is removed (a late packet of it must not take the new flow's
/// tuple).
#[inline(always)]
fn reclaim(key: &CtKey, old: &CtValue) -> bool {
    // The forward key is built in the scratch (free until `create` sets it after the claim):
    // this runs inside the `bpf_loop` callback, whose frame counts toward the 512 bytes.
    let Ok(s) = scratch() else {
        return false;
    };
    s.fwd_key = self::key(
        old.daddr_be,
        old.saddr_be,
        old.dport_be,
        old.sport_be,
        key.proto,
        CT_DIR_FORWARD,
    );
    let fwd_key = &s.fwd_key;
    // The forward entry is this flow's only if it still translates to this reply tuple (the
    // client may have reused its port for a newer flow, which keeps its entry).
    let fwd = get(fwd_key).filter(|f| {
        f.saddr_be == key.daddr_be
            && f.sport_be == key.dport_be
            && f.daddr_be == key.saddr_be
            && f.dport_be == key.sport_be
    });
    let mut last = old.last_seen_ns;
    let mut flags = old.flags;
    if let Some(f) = fwd {
        if f.last_seen_ns > last {
            last = f.last_seen_ns;
        }
        flags |= f.flags;
    }
    // Over: reset, or closed both ways (a half-closed flow may still stream the other way).
    let closed_both =
        old.flags & CT_F_CLOSING != 0 && fwd.is_some_and(|f| f.flags & CT_F_CLOSING != 0);
    let idle = if flags & CT_F_RESET != 0 || closed_both {
        REUSE_CLOSING_NS
    } else if key.proto == IPPROTO_UDP {
        REUSE_UDP_NS
    } else {
        REUSE_TCP_NS
    };
    if clock::since(clock::now(), last) < idle {
        return false;
    }
    if fwd.is_some() {
        remove(fwd_key);
    }
    true
}

/// Inserts `value` under `key` if the key is free, or taken by a flow that is over (then the
/// old entry is deleted, if it is still the one judged, and the new one inserted with
/// `BPF_NOEXIST`: two CPUs reclaiming the same key at once almost never both get it).
#[inline(always)]
fn claim(key: &CtKey, value: &CtValue) -> bool {
    // SAFETY: only compared with None.
    if unsafe { XLB_CTA_V1.get(key) }.is_none()
        && XLB_CT_V3.insert(key, value, BPF_NOEXIST as u64).is_ok()
    {
        return true;
    }
    let Some(old) = get(key) else {
        return false;
    };
    // An entry is known by its creation time and the client it answers (the coarse clock
    // gives two entries of one tick the same time).
    let judged = (old.created_ns, old.daddr_be, old.dport_be);
    if !reclaim(key, old) {
        return false;
    }
    // Still the entry judged over (another CPU may have reclaimed it meanwhile)? Then it
    // goes, and of two CPUs inserting with BPF_NOEXIST only one wins. A window of a few
    // instructions between this check and the delete remains.
    if get(key).map(|e| (e.created_ns, e.daddr_be, e.dport_be)) != Some(judged) {
        return false;
    }
    remove(key);
    XLB_CT_V3.insert(key, value, BPF_NOEXIST as u64).is_ok()
}

/// How a new flow's source is translated: `addr_be` 0 keeps it (the backend replies to the
/// client through this node); else SNAT to `addr_be`, with the first free port among
/// `first_be` (if non-zero) and then `min..=max` from a random start, so no two flows to a
/// backend share a reply tuple. (A plain struct, not an enum: every field is always
/// initialised, which the verifier insists on.)
#[derive(Clone, Copy, Default)]
pub struct Source {
    pub addr_be: u32,
    pub first_be: u16,
    pub min: u16,
    pub max: u16,
}

/// The forward entry under construction (in the per-CPU scratch map, off the stack): the
/// caller fills it with the translated tuple, [`create`] records it.
#[inline(always)]
pub fn scratch() -> Result<&'static mut FlowScratch, Reason> {
    let p = XLB_SCRATCH.get_ptr_mut(0).ok_or(Reason(R_CT_FULL))?;
    // SAFETY: this CPU's slot; nothing else runs on it while the program does.
    Ok(unsafe { &mut *p })
}

/// Records the new flow of `t` whose packets go to the scratch's `fwd` (destination =
/// backend, source as `src` translates it): the reply entry first, so a reply can never beat
/// it. Afterwards `fwd` holds the SNAT port chosen.
#[inline(always)]
pub fn create(t: &Tuple, src: &Source) -> Result<(), Reason> {
    let s = scratch()?;
    let now = clock::now();
    s.fwd.created_ns = now;
    s.fwd.last_seen_ns = now;
    s.reply = CtValue {
        saddr_be: t.daddr_be,
        sport_be: t.dport_be,
        daddr_be: t.saddr_be,
        dport_be: t.sport_be,
        ..s.fwd
    };
    s.reply_key = key(
        s.fwd.daddr_be,
        t.saddr_be,
        s.fwd.dport_be,
        t.sport_be,
        t.proto,
        CT_DIR_REPLY,
    );
    if src.addr_be == 0 {
        if !claim(&s.reply_key, &s.reply) && !replace_own(&s.reply_key, &s.reply, t) {
            // The reply tuple is another live flow's (one client port to two frontends with
            // the same backend): remap only the source port, as conntrack's NAT does.
            s.fwd.flags |= CT_F_SNAT;
            s.reply.flags |= CT_F_SNAT;
            s.fwd.sport_be = claim_port(s, 0, src.min, src.max)?;
        }
    } else {
        s.reply_key.daddr_be = src.addr_be;
        s.fwd.saddr_be = src.addr_be;
        s.fwd.sport_be = claim_port(s, src.first_be, src.min, src.max)?;
    }
    s.fwd_key = tuple_key(t, CT_DIR_FORWARD);
    // A flow started over (a reused TCP port, a UDP flow whose backend left) may have been
    // assured: its old forward entry must not shadow the new one.
    let _ = XLB_CTA_V1.remove(&s.fwd_key);
    XLB_CT_V3
        .insert(&s.fwd_key, &s.fwd, 0)
        .map_err(|_| Reason(R_CT_FULL))
}

/// Replaces the reply entry at `key` when it is the previous flow of this very tuple (the
/// client reused its port to the same frontend and backend: one forward key has one flow at a
/// time), instead of taking it for another live flow's and remapping the port.
#[inline(always)]
fn replace_own(key: &CtKey, value: &CtValue, t: &Tuple) -> bool {
    let Some(old) = get(key) else {
        return false;
    };
    if old.daddr_be != t.saddr_be
        || old.dport_be != t.sport_be
        || old.saddr_be != t.daddr_be
        || old.sport_be != t.dport_be
    {
        return false;
    }
    let _ = XLB_CTA_V1.remove(key);
    XLB_CT_V3.insert(key, value, 0).is_ok()
}

/// State of the SNAT port search run by `bpf_loop` (small: the entries stay in the scratch).
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
    if claim(&s.reply_key, &s.reply) {
        p.found_be = port.to_be() as u32;
        return 1;
    }
    0
}

/// Inserts the scratch's reply entry under the first free port: `first_be`, then up to
/// `SNAT_TRIES` ports of `min..=max` from a random start. Returns the port (network order).
#[inline(always)]
fn claim_port(s: &mut FlowScratch, first_be: u16, min: u16, max: u16) -> Result<u16, Reason> {
    if first_be != 0 {
        s.reply_key.dport_be = first_be;
        if claim(&s.reply_key, &s.reply) {
            return Ok(first_be);
        }
    }
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
