//! Per-flow state: one forward entry (client → frontend) holds the tuple the flow's packets
//! are rewritten to (backend, and SNAT source if any), one reply entry (backend → client or
//! SNAT address) holds the tuple its replies are restored to (frontend → client).
//!
//! One implementation for both families: the steps are generic over the packet's tuple
//! ([`Flow`], `family.rs`), which names its family's key, entry, tables and scratch; IPv4's
//! parts are named in `v4.rs`, IPv6's in `v6/conntrack.rs`. Each family gets its own copy of every
//! function (monomorphised), out of line where IPv4's was.
//!
//! An entry found in a table is a [`Shared`] (`shared.rs`): read and written through its
//! pointer, never a reference; whatever deletes it takes it by value.

// Map entries are passed by reference on purpose: a copy would go through the 512-byte stack.
#![allow(clippy::needless_borrows_for_generic_args)]

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_prandom_u32, bpf_loop},
};
use lb_common::{
    CT_DIR_FORWARD, CT_DIR_REPLY, CT_DIR_SNAT_OUT, CT_F_ASSURED, CT_F_CLOSING, CT_F_PORT_IN,
    CT_F_REPLIED, CT_F_RESET, CT_F_SNAT, CT_F_XDP_STACK, CT_PENDING_FULL, CT_PENDING_MAX_LEN,
    CT_PENDING_PACKET, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP, R_CT_ASSURED_FULL, R_CT_FULL,
    R_SNAT_FAILED, ct_pending,
};

pub use crate::family::{Entry, Flow};
use crate::{
    clock,
    family::{Addr, Ends, EndsMut, Key, View},
    reason::{self, Reason},
    select::backend_is,
    shared::Shared,
};

/// A family's conntrack entry in its table (see `shared.rs`).
pub type Ct<T> = Shared<'static, <T as Flow>::Value>;

/// A protocol with connections, whose packets say how they begin and end (`tcp_flags`):
/// TCP, and SCTP (its chunks in TCP's terms, `parse::sctp_flags`).
#[inline(always)]
pub(crate) fn connected(proto: u8) -> bool {
    proto == IPPROTO_TCP || proto == IPPROTO_SCTP
}

pub(crate) const TOUCH_INTERVAL_NS: u64 = 1_000_000_000;
/// Ports tried from the SNAT range (one after another from a random start) before a new
/// flow is given up: the whole of a range up to this size, so a range is usable to its last
/// port; a full range shows as `snat_failed`, never as a collision. `bpf_loop` keeps the
/// verifier's cost independent of it.
pub(crate) const SNAT_TRIES: u32 = 1024;

/// The entry of the other way of the flow a quoted packet (an ICMP error's quote, `isrc`
/// → `idst`, ports `isport` → `idport`) went one way of, as its peer sees the tuple: a
/// reply entry for a quoted forward packet (an error from beyond the backend side), a
/// forward entry for a quoted reply. At egress (`PART` = `nat::SRC`) the quote's
/// destination side is already restored, so a quoted reply is the backend's as netfilter
/// saw it, and its flow's entry is the SNAT one (only a SNATed flow has a source to
/// restore there). The key is built in `key` (the scratch's).
#[inline(always)]
pub fn quoted<T: Flow, const PART: u8>(
    key: &mut T::Key,
    isrc: &T::Addr,
    idst: &T::Addr,
    isport: u16,
    idport: u16,
    proto: u8,
) -> Option<Ct<T>> {
    *key = T::key(idst, isrc, idport, isport, proto, CT_DIR_REPLY);
    let found = entry::<T>(key);
    if found.is_some() {
        return found;
    }
    *key.dir_mut() = if PART == crate::nat::SRC {
        CT_DIR_SNAT_OUT
    } else {
        CT_DIR_FORWARD
    };
    entry::<T>(key)
}

/// The key of the packet's own 5-tuple in direction `dir`.
#[inline(always)]
fn tuple_key<T: Flow>(t: &T, dir: u8) -> T::Key {
    T::key(t.saddr(), t.daddr(), t.sport(), t.dport(), t.proto(), dir)
}

/// The key of the packet's 5-tuple turned around (destination as source) in direction `dir`:
/// a DSR packet leaving for its backend names its flow's reply entry so.
#[inline(always)]
pub fn reversed_key<T: Flow>(t: &T, dir: u8) -> T::Key {
    T::key(t.daddr(), t.saddr(), t.dport(), t.sport(), t.proto(), dir)
}

/// The entry for `k`, if its flow is tracked: assured (`XLB_CTA_V1`) or not yet
/// (`XLB_CT_V3`). Only `last_seen_ns`, `mtu` and `flags` are written through it
/// (`Shared`'s volatile stores), and `pending` (atomic adds): the other CPUs may write the
/// same fields at once.
#[inline(always)]
pub fn entry<T: Flow>(k: &T::Key) -> Option<Ct<T>> {
    Shared::of(T::cta().get_ptr_mut(k)).or_else(|| Shared::of(T::ct().get_ptr_mut(k)))
}

/// Whether `k` is in the assured table (looked up, never read).
#[inline(always)]
fn assured_has<T: Flow>(k: &T::Key) -> bool {
    T::cta().get_ptr_mut(k).is_some()
}

/// Forgets `k` in both tables.
#[inline(always)]
fn remove<T: Flow>(k: &T::Key) {
    let _ = T::cta().remove(k);
    let _ = T::ct().remove(k);
}

/// The reply entry for a packet from a backend, if its flow is tracked. The first reply
/// marks it answered (`CT_F_REPLIED`): the client's next packet makes the flow assured.
#[inline(always)]
pub fn lookup_reply<T: Flow>(t: &T) -> Option<Ct<T>> {
    let k = tuple_key(t, CT_DIR_REPLY);
    let ct = entry::<T>(&k)?;
    // A SYN-ACK never belongs to a flow that has closed: the client reused its port for a
    // connection straight to the backend, which the closed flow's entry must leave alone
    // (it goes, so the connection's later packets do not match it either).
    if connected(t.proto())
        && t.tcp_flags() & TCP_SYN != 0
        && ct.flags() & (CT_F_CLOSING | CT_F_RESET) != 0
    {
        ct.release();
        remove::<T>(&k);
        return None;
    }
    if ct.flags() & CT_F_REPLIED == 0 {
        ct.add_flags(CT_F_REPLIED);
    }
    Some(ct)
}

/// The forward entry for a packet to a frontend, if its flow is tracked.
#[inline(always)]
pub fn lookup_forward<T: Flow>(t: &T) -> Option<Ct<T>> {
    entry::<T>(&tuple_key(t, CT_DIR_FORWARD))
}

/// A flow that starts over (`ct`, its forward entry, does not go on): its assured forward
/// entry goes, so it cannot shadow the new flow's. Only here: a new flow whose forward
/// lookup found nothing has no assured entry to remove. Takes the entry: it may be gone
/// afterwards (the caller reads what it needs of it first).
#[inline(always)]
pub fn start_over<T: Flow>(ct: Ct<T>, t: &T) {
    if ct.flags() & CT_F_ASSURED != 0 {
        flush(&ct);
        ct.release();
        let _ = T::cta().remove(&tuple_key(t, CT_DIR_FORWARD));
    }
}

/// The reply key of the flow whose forward entry is `fwd`.
#[inline(always)]
fn reply_key_of<T: Flow, E: Ends<Addr = T::Addr>>(fwd: &E, proto: u8) -> T::Key {
    T::key(
        fwd.daddr(),
        fwd.saddr(),
        fwd.dport(),
        fwd.sport(),
        proto,
        CT_DIR_REPLY,
    )
}

/// The forward key of the flow whose reply entry is `reply`.
#[inline(always)]
fn forward_key_of<T: Flow>(reply: &Ct<T>, proto: u8) -> T::Key {
    T::key(
        reply.daddr(),
        reply.saddr(),
        reply.dport(),
        reply.sport(),
        proto,
        CT_DIR_FORWARD,
    )
}

/// The entry under `fwd_key` (built by [`forward_key_of`] from reply entry `key`'s value),
/// if it is still that flow's: it translates to this reply tuple (the client may have
/// reused its port for a newer flow, which keeps its entry).
#[inline(always)]
fn forward_of<T: Flow>(key: &T::Key, fwd_key: &T::Key) -> Option<Ct<T>> {
    entry::<T>(fwd_key).filter(|f| {
        f.saddr().same(key.daddr())
            && f.sport() == key.dport()
            && f.daddr().same(key.saddr())
            && f.dport() == key.sport()
    })
}

/// A packet that may begin a flow (UDP, or a bare TCP SYN) from a client straight to a
/// backend, on the very tuple whose replies a translated flow's reply entry restores to
/// its frontend: the client's socket talks to the backend itself now (the socket hooks
/// translated its connect, or it dialled the backend), so that flow is over, however
/// recent (a flow adopted from kube-proxy, a UDP request on the same port). Its entries
/// go, else the new flow's replies would reach the socket from the frontend, which it
/// refuses. A SNATed flow's reply tuple holds the node's address, never a client's.
/// `xdp_here`: whether XDP runs on the packet's interface, where a flow's own packet comes
/// up the stack already translated (asked only once an entry matched). Returns whether a
/// flow was ended.
#[inline(always)]
pub fn supersede<T: Flow>(t: &T, xdp_here: impl FnOnce() -> bool) -> bool {
    let proto = t.proto();
    if proto != IPPROTO_UDP && !(connected(proto) && t.tcp_flags() & (TCP_SYN | TCP_ACK) == TCP_SYN)
    {
        return false;
    }
    let key = T::key(
        t.daddr(),
        t.saddr(),
        t.dport(),
        t.sport(),
        proto,
        CT_DIR_REPLY,
    );
    let Some(reply) = entry::<T>(&key) else {
        return false;
    };
    // A DSR flow learnt here (a backend's node) has this very tuple: its packets arrive
    // from the node that chose the backend, the client's socket unchanged.
    if reply.flags() & (CT_F_SNAT | lb_common::CT_F_DSR) != 0 || xdp_here() {
        return false;
    }
    let fwd_key = forward_key_of::<T>(&reply, proto);
    flush(&reply);
    reply.release();
    if let Some(fwd) = forward_of::<T>(&key, &fwd_key) {
        flush(&fwd);
        fwd.release();
        remove::<T>(&fwd_key);
    }
    remove::<T>(&key);
    true
}

/// Makes the flow of `t` (forward entry `ct`, not yet assured) assured once its backend has
/// answered and the client goes on (any packet but a SYN): both entries move from the LRU
/// table to the assured one, reply first (a reply always finds its entry), where no flood
/// of new flows can evict them.
/// Returns the forward entry now in use: the assured copy, or
/// `ct` while the flow is not answered yet or the assured table is full (`ct_assured_full`);
/// `None` when the flow was moved and its assured entry is gone already (another CPU, or
/// the agent, deleted it meanwhile). The copies and keys are built in `s`.
#[inline(always)]
pub fn assure<T: Flow>(ct: Ct<T>, t: &T, s: &mut T::Scratch) -> Option<Ct<T>> {
    if ct.flags() & CT_F_ASSURED != 0
        || (connected(t.proto()) && t.tcp_flags() & (TCP_SYN | TCP_ACK) == TCP_SYN)
    {
        return Some(ct);
    }
    if !promote(&ct, t, s) {
        return Some(ct);
    }
    // Moved: `ct`'s entry is deleted, never read again.
    ct.release();
    Shared::of(T::cta().get_ptr_mut(&*T::parts(s).fwd_key))
}

/// The move itself (out of line: rare, and its keys stay off the caller's frame). Returns
/// whether it moved the flow: then `ct`'s entry is deleted (the caller drops it) and the
/// scratch's forward key is the assured entry's.
#[inline(never)]
fn promote<T: Flow>(ct: &Ct<T>, t: &T, s: &mut T::Scratch) -> bool {
    let p = T::parts(s);
    *p.reply_key = reply_key_of::<T, _>(ct, t.proto());
    let Some(reply) = Shared::of(T::ct().get_ptr_mut(&*p.reply_key)) else {
        return false;
    };
    if reply.flags() & CT_F_REPLIED == 0 {
        return false;
    }
    p.reply.copy_from(&reply);
    reply.release();
    *p.reply.flags_mut() |= CT_F_ASSURED;
    p.fwd.copy_from(ct);
    *p.fwd.flags_mut() |= CT_F_ASSURED;
    *p.fwd_key = tuple_key(t, CT_DIR_FORWARD);
    if T::cta().insert(&*p.reply_key, &*p.reply, 0).is_err() {
        Reason(R_CT_ASSURED_FULL).count(0);
        return false;
    }
    if T::cta().insert(&*p.fwd_key, &*p.fwd, 0).is_err() {
        let _ = T::cta().remove(&*p.reply_key);
        Reason(R_CT_ASSURED_FULL).count(0);
        return false;
    }
    // From here `ct`'s entry is deleted: it is not read again.
    let _ = T::ct().remove(&*p.fwd_key);
    let _ = T::ct().remove(&*p.reply_key);
    // A SNATed flow's egress entries move too (built from the copies in the scratch, which
    // hold the same tuples); the forward key is built again afterwards.
    if translated::<T>(p.fwd, p.reply) {
        let _ = egress_entries::<T>(t.proto(), CT_F_ASSURED, s);
    }
    let p = T::parts(s);
    *p.fwd_key = tuple_key(t, CT_DIR_FORWARD);
    true
}

/// Refreshes `last_seen_ns` for a packet of `t` (at most once a second, to keep writes off
/// the hot path; returns whether it did), moving the entry's pending counts to the rows
/// then, and records a TCP FIN or RST in its direction.
#[inline(always)]
pub fn touch<F: Flow>(ct: &Ct<F>, t: &F) -> bool {
    let now = clock::now();
    let mut refreshed = false;
    if clock::since(now, ct.last_seen_ns()) > TOUCH_INTERVAL_NS {
        ct.set_last_seen(now);
        // The counts of the second gone by go to the rows.
        flush(ct);
        // Forget the fitting packet size and XDP's way out once a second: a route that
        // shrank or moved is seen again.
        ct.set_mtu(0);
        ct.set_flags(ct.flags() & !CT_F_XDP_STACK);
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
        ct.add_flags(seen);
        ct.set_last_seen(now);
    }
    refreshed
}

/// Counts a packet of `len` bytes of the flow of entry `ct` for its service and backend.
/// An assured flow's packet is added to the entry's pending counts (`CtValue::pending`, in
/// the cache line the packet has read already); the counter rows (a cache miss apiece at
/// many services) get them on the entry's refresh once a second (`touch`), once they are
/// half full ([`CT_PENDING_FULL`]), or before the datapath deletes a live flow's entry
/// (`start_over`, `supersede`, `replace_own`). An entry of a flow that is over, reclaimed
/// for its SNAT port (`claim`), goes with its pending counts, as one the agent's collector
/// deletes: a flush inside the port search's `bpf_loop` callback costs tc egress's
/// verification 30% more instructions. Every other packet goes straight into the rows with
/// whatever is pending: a flow not yet assured (its first packets, whose entries LRU
/// eviction may take, a new flow's scratch values), one closing or reset (its FIN or RST,
/// and whatever follows), a packet of 1 MiB or more.
#[inline(always)]
pub fn count<V: Entry>(ct: &Shared<'_, V>, len: u32) {
    let pending = ct.pending();
    if ct.flags() & (CT_F_ASSURED | CT_F_CLOSING | CT_F_RESET) == CT_F_ASSURED
        && pending & CT_PENDING_FULL == 0
        && len < CT_PENDING_MAX_LEN
    {
        ct.add_pending(CT_PENDING_PACKET + len);
        return;
    }
    settle(ct, pending, 1, len);
}

/// Moves the pending counts of `ct` to its service's and backend's rows in the current
/// CPU's row: before the datapath deletes it (the pending counts would go with it).
#[inline(always)]
pub fn flush<V: Entry>(ct: &Shared<'_, V>) {
    let pending = ct.pending();
    if pending != 0 {
        settle(ct, pending, 0, 0);
    }
}

/// Takes `pending` (what was read) out of the entry's pending counts (an atomic add of its
/// negation: what another CPU added meanwhile stays) and adds it, with `packets` more of
/// `bytes`, to the rows. Not exact when two CPUs settle one entry in the same few
/// nanoseconds (one flow's packets in one direction on two CPUs at once, at its refresh):
/// both add what they read, and the entry is left with its negation, which the next settle
/// takes out without counting when it reads as one ([`lb_common::CT_PENDING_NEGATED`]: a
/// negation of up to about 64 packets does; a larger one counts up to 191 packets and
/// 16 MiB). An atomic exchange would make it exact; this object's BPF CPU (`generic`, no
/// ALU32) has no 32-bit one.
#[inline(always)]
fn settle<V: Entry>(ct: &Shared<'_, V>, pending: u32, packets: u32, bytes: u32) {
    if pending != 0 {
        ct.add_pending(pending.wrapping_neg());
    }
    let (p, b) = ct_pending(pending);
    reason::add_service(ct.svc_id(), ct.backend().0, p + packets, b + bytes);
}

/// Whether a packet of a tracked flow stays on it. As with kube-proxy's conntrack, a TCP
/// connection keeps a backend that left the service (graceful termination), while a UDP
/// flow whose backend was removed is re-balanced (kube-proxy flushes those). A new TCP
/// connection (SYN without ACK) on a tuple whose flow is closing or whose backend is gone
/// starts over: the client reused its port (as conntrack reopens a TIME_WAIT connection).
#[inline(always)]
pub fn continues<F: Flow>(ct: &Ct<F>, t: &F) -> bool {
    if connected(t.proto()) {
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
    connected(t.proto()) && t.tcp_flags() & (TCP_SYN | TCP_ACK) != TCP_SYN
}

/// Keeps the reply entry of a SNATed flow (forward entry `ct`, a packet `t` of it) recently
/// used, so LRU eviction never takes it before its forward entry (its port would go to a
/// new flow while this one still uses it).
#[inline(always)]
pub fn keep_reply<T: Flow>(ct: &Ct<T>, t: &T) {
    if ct.flags() & CT_F_ASSURED != 0 {
        return;
    }
    // Only looked up (which marks it used), never read.
    let _ = T::ct().get_ptr_mut(&reply_key_of::<T, _>(ct, t.proto()));
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
/// tuple). The forward key is built in `fwd_key`, the scratch's (free until `create` sets it
/// after the claim): this runs inside the `bpf_loop` callback, whose frame counts toward the
/// 512 bytes.
#[inline(always)]
fn reclaim<T: Flow>(key: &T::Key, old: &Ct<T>, fwd_key: &mut T::Key) -> bool {
    *fwd_key = forward_key_of::<T>(old, key.proto());
    let fwd = forward_of::<T>(key, fwd_key);
    let mut last = old.last_seen_ns();
    let mut flags = old.flags();
    if let Some(f) = &fwd {
        if f.last_seen_ns() > last {
            last = f.last_seen_ns();
        }
        flags |= f.flags();
    }
    // Over: reset, or closed both ways (a half-closed flow may still stream the other way).
    let closed_both = old.flags() & CT_F_CLOSING != 0
        && fwd.as_ref().is_some_and(|f| f.flags() & CT_F_CLOSING != 0);
    let idle = if flags & CT_F_RESET != 0 || closed_both {
        REUSE_CLOSING_NS
    } else if key.proto() == IPPROTO_UDP {
        REUSE_UDP_NS
    } else {
        REUSE_TCP_NS
    };
    if clock::since(clock::now(), last) < idle {
        return false;
    }
    if let Some(f) = fwd {
        f.release();
        remove::<T>(&*fwd_key);
    }
    true
}

/// Inserts `value` under `key` if the key is free, or taken by a flow that is over (then the
/// old entry is deleted, if it is still the one judged, and the new one inserted with
/// `BPF_NOEXIST`: two CPUs reclaiming the same key at once almost never both get it).
/// `spare`: the scratch's forward key, free until `create` sets it (`reclaim` builds in it).
#[inline(always)]
fn claim<T: Flow>(key: &T::Key, value: &T::Value, spare: &mut T::Key) -> bool {
    if !assured_has::<T>(key) && T::ct().insert(key, value, BPF_NOEXIST as u64).is_ok() {
        return true;
    }
    let Some(old) = entry::<T>(key) else {
        return false;
    };
    // An entry is known by its creation time and the client it answers (the coarse clock
    // gives two entries of one tick the same time); an IPv6 client by its folded words,
    // folded here (a volatile word: else LLVM keeps all four across the calls below, on the
    // stack of the `bpf_loop` callback).
    let (created, port) = (old.created_ns(), old.dport());
    let mut client = 0u32;
    // SAFETY: a local.
    unsafe { core::ptr::write_volatile(&mut client, old.daddr().fold()) };
    if !reclaim::<T>(key, &old, spare) {
        return false;
    }
    old.release();
    // Still the entry judged over (another CPU may have reclaimed it meanwhile)? Then it
    // goes, and of two CPUs inserting with BPF_NOEXIST only one wins. A window of a few
    // instructions between this check and the delete remains.
    let Some(now) = entry::<T>(key) else {
        return false;
    };
    // SAFETY: a local, written above.
    let client = unsafe { core::ptr::read_volatile(&client) };
    if now.created_ns() != created || now.daddr().fold() != client || now.dport() != port {
        return false;
    }
    now.release();
    remove::<T>(key);
    T::ct().insert(key, value, BPF_NOEXIST as u64).is_ok()
}

/// How a new flow's source is translated: `snat` false keeps it (the backend replies to the
/// client through this node); else the caller wrote the SNAT address into the forward
/// entry, and its port is the first free one among `first_be` (if non-zero) and then
/// `min..=max` from a random start, so no two flows to a backend share a reply tuple. (A
/// plain struct, not an enum: every field is always initialised, which the verifier
/// insists on.)
#[derive(Clone, Copy, Default)]
pub struct Source {
    pub snat: bool,
    pub first_be: u16,
    pub min: u16,
    pub max: u16,
}

/// Records the new flow of `t` whose packets go to the scratch's `fwd` (destination =
/// backend, source as the caller translated it, `src` says how): the reply entry first, so
/// a reply can never beat it. Afterwards `fwd` holds the SNAT port chosen. Each step below
/// gets the scratch `s` from here (the fields it works on, or all of it).
#[inline(always)]
pub fn create<T: Flow>(t: &T, src: &Source, s: &mut T::Scratch) -> Result<(), Reason> {
    let p = T::parts(s);
    let now = clock::now();
    *p.fwd.created_mut() = now;
    *p.fwd.last_seen_mut() = now;
    p.reply.copy_from_local(p.fwd);
    // XDP's way out is the forward direction's; the reply's is found by its first packet.
    *p.reply.flags_mut() &= !CT_F_XDP_STACK;
    let (saddr, daddr, sport, dport) = p.reply.ends_mut();
    saddr.set(t.daddr());
    daddr.set(t.saddr());
    *sport = t.dport();
    *dport = t.sport();
    *p.reply_key = reply_key_of::<T, _>(p.fwd, t.proto());
    if !src.snat {
        if !claim::<T>(p.reply_key, p.reply, p.fwd_key) && !replace_own::<T>(p.reply_key, p.reply) {
            // The reply tuple is another live flow's (one client port to two frontends with
            // the same backend): remap only the source port, as conntrack's NAT does, at
            // ingress (after DNAT the two flows would be one tuple to netfilter and egress).
            *p.fwd.flags_mut() |= CT_F_SNAT | CT_F_PORT_IN;
            *p.reply.flags_mut() |= CT_F_SNAT | CT_F_PORT_IN;
            let port = claim_port::<T>(s, 0, src.min, src.max)?;
            *T::parts(s).fwd.ends_mut().2 = port;
        }
    } else {
        let port = claim_port::<T>(s, src.first_be, src.min, src.max)?;
        *T::parts(s).fwd.ends_mut().2 = port;
        remap_if_taken::<T>(t.proto(), s);
    }
    // The packet's own tuple, from the reply entry (turned round) in the scratch: what the
    // packet held is not kept live across the claims.
    let p = T::parts(s);
    let r = &*p.reply;
    *p.fwd_key = T::key(
        r.daddr(),
        r.saddr(),
        r.dport(),
        r.sport(),
        t.proto(),
        CT_DIR_FORWARD,
    );
    // A flow started over (a reused TCP port, a UDP flow whose backend left) had its old
    // assured forward entry removed by `start_over`.
    T::ct()
        .insert(&*p.fwd_key, &*p.fwd, 0)
        .map_err(|_| Reason(R_CT_FULL))?;
    if translated::<T>(p.fwd, p.reply) {
        egress_entries::<T>(t.proto(), 0, s)?;
    }
    Ok(())
}

/// Writes the two entries of a DSR flow learnt here, built in the scratch `s` (its keys and
/// values), as they are (both families).
#[inline(always)]
pub fn insert_dsr<T: Flow>(s: &mut T::Scratch) -> Result<(), Reason> {
    let p = T::parts(s);
    T::ct()
        .insert(&*p.reply_key, &*p.reply, 0)
        .map_err(|_| Reason(R_CT_FULL))?;
    T::ct()
        .insert(&*p.fwd_key, &*p.fwd, 0)
        .map_err(|_| Reason(R_CT_FULL))
}

/// Whether the flow whose entries are `fwd` and `reply` has its source address translated
/// (SNAT to the node, hairpin): its egress entries exist then.
#[inline(always)]
fn translated<T: Flow>(fwd: &T::Value, reply: &T::Value) -> bool {
    fwd.flags() & CT_F_SNAT != 0 && !fwd.saddr().same(reply.daddr())
}

/// Whether the tuple netfilter will see for the SNATed flow in the scratch `s` (client →
/// backend, before its SNAT at egress) is another live flow's: the reply entry under that
/// tuple turned round (a flow's own, or a SNATed flow's egress one) answers for another
/// frontend. Then the client's port is remapped at ingress to the SNAT port (`CT_F_PORT_IN`),
/// here and in the reply entry already claimed (at `p.reply_key`). Out of line: rare
/// enough, and its frame stays off the new-flow chain's.
#[inline(never)]
fn remap_if_taken<T: Flow>(proto: u8, s: &mut T::Scratch) {
    let p = T::parts(s);
    // The key in the scratch (its forward key is set only after this), off the stack.
    *p.fwd_key = T::key(
        p.fwd.daddr(),
        p.reply.daddr(),
        p.fwd.dport(),
        p.reply.dport(),
        proto,
        CT_DIR_REPLY,
    );
    let taken = entry::<T>(&*p.fwd_key)
        .is_some_and(|e| !e.saddr().same(p.reply.saddr()) || e.sport() != p.reply.sport());
    if taken {
        *p.fwd.flags_mut() |= CT_F_PORT_IN;
        *p.reply.flags_mut() |= CT_F_PORT_IN;
        if let Some(r) = entry::<T>(&*p.reply_key) {
            r.add_flags(CT_F_PORT_IN);
        }
    }
}

/// The egress entries of the SNATed flow whose entries the scratch `s` holds (`fwd`, `reply`):
/// its request as netfilter sees it (client → backend, `CT_DIR_SNAT_OUT`: the SNAT source)
/// and its reply as netfilter sees it (backend → client, `CT_DIR_REPLY`: the frontend), into
/// the LRU table (`assured` 0: at creation) or the assured one. Uses the scratch's keys.
#[inline(always)]
fn egress_entries<T: Flow>(proto: u8, assured: u16, s: &mut T::Scratch) -> Result<(), Reason> {
    let p = T::parts(s);
    // The client, as the reply entry (frontend → client) holds it, and its port as netfilter
    // sees it (the remapped one when it was remapped at ingress).
    // Loaded in its branch (volatile): a select between the two fields' addresses would be
    // pointer arithmetic the verifier refuses without CAP_PERFMON.
    let mut port = p.reply.dport();
    if p.fwd.flags() & CT_F_PORT_IN != 0 {
        // SAFETY: a local.
        unsafe { core::ptr::write_volatile(&mut port, p.fwd.sport()) };
    }
    *p.fwd_key = T::key(
        p.reply.daddr(),
        p.fwd.daddr(),
        port,
        p.fwd.dport(),
        proto,
        CT_DIR_SNAT_OUT,
    );
    *p.reply_key = T::key(
        p.fwd.daddr(),
        p.reply.daddr(),
        p.fwd.dport(),
        port,
        proto,
        CT_DIR_REPLY,
    );
    let full = if assured != 0 {
        R_CT_ASSURED_FULL
    } else {
        R_CT_FULL
    };
    *p.fwd.flags_mut() |= assured;
    *p.reply.flags_mut() |= assured;
    let inserted = if assured != 0 {
        T::cta().insert(&*p.fwd_key, &*p.fwd, 0).is_ok()
            && T::cta().insert(&*p.reply_key, &*p.reply, 0).is_ok()
    } else {
        // A flow started over on the same tuples may have been assured: its old egress
        // entries must not shadow the new ones (as its forward entry, in `create`).
        let _ = T::cta().remove(&*p.fwd_key);
        let _ = T::cta().remove(&*p.reply_key);
        T::ct().insert(&*p.fwd_key, &*p.fwd, 0).is_ok()
            && T::ct().insert(&*p.reply_key, &*p.reply, 0).is_ok()
    };
    if !inserted {
        return Err(Reason(full));
    }
    if assured != 0 {
        let _ = T::ct().remove(&*p.fwd_key);
        let _ = T::ct().remove(&*p.reply_key);
    }
    Ok(())
}

/// The egress entry of a SNATed flow's request as netfilter saw it (client → backend, after
/// tc ingress's DNAT): the SNAT source it leaves with.
#[inline(always)]
pub fn lookup_snat_out<T: Flow>(t: &T) -> Option<Ct<T>> {
    entry::<T>(&tuple_key(t, CT_DIR_SNAT_OUT))
}

/// Replaces the reply entry at `key` when it is the previous flow of this very tuple (the
/// client reused its port to the same frontend and backend: one forward key has one flow at a
/// time), instead of taking it for another live flow's and remapping the port. Compared with
/// the new entry `value` (frontend → client, the packet's tuple turned round), read again
/// from the scratch rather than kept from the packet across the calls.
#[inline(always)]
fn replace_own<T: Flow>(key: &T::Key, value: &T::Value) -> bool {
    let Some(old) = entry::<T>(key) else {
        return false;
    };
    if !old.daddr().same(value.daddr())
        || old.dport() != value.dport()
        || !old.saddr().same(value.saddr())
        || old.sport() != value.sport()
    {
        return false;
    }
    flush(&old);
    old.release();
    let _ = T::cta().remove(key);
    T::ct().insert(key, value, 0).is_ok()
}

/// State of the SNAT port search run by `bpf_loop` (small: the entries stay in the scratch).
struct PortSearch<S> {
    min: u32,
    range: u32,
    start: u32,
    /// The claimed port (network order), 0 until one is found.
    found_be: u32,
    /// The scratch `claim_port` lends the loop: it leaves it alone until `bpf_loop` returns.
    scratch: *mut S,
}

/// One try of the port search: the `idx`-th port from the random start. One callback per
/// family (`try_port::<Tuple>`, `try_port::<Tuple6>`), each claiming in its own tables.
#[inline(never)]
extern "C" fn try_port<T: Flow>(idx: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `bpf_loop` passes back the pointer `claim_port` gave it, to a live PortSearch.
    let p = unsafe { &mut *(ctx as *mut PortSearch<T::Scratch>) };
    if p.range == 0 {
        return 1;
    }
    // SAFETY: the scratch `claim_port` holds as `&mut` and lent to the loop: it does not
    // touch it until `bpf_loop` returns, so for this call this is its only reference.
    let s = T::parts(unsafe { &mut *p.scratch });
    let port = (p.min + (p.start + idx as u32) % p.range) as u16;
    *s.reply_key.ends_mut().3 = port.to_be();
    if claim::<T>(s.reply_key, s.reply, s.fwd_key) {
        p.found_be = port.to_be() as u32;
        return 1;
    }
    0
}

/// Inserts the reply entry of scratch `s` (at its reply key) under the first free port:
/// `first_be`, then up to `SNAT_TRIES` ports of `min..=max` from a random start. Returns the
/// port (network order).
#[inline(always)]
fn claim_port<T: Flow>(
    s: &mut T::Scratch,
    first_be: u16,
    min: u16,
    max: u16,
) -> Result<u16, Reason> {
    if first_be != 0 {
        let p = T::parts(s);
        *p.reply_key.ends_mut().3 = first_be;
        if claim::<T>(p.reply_key, p.reply, p.fwd_key) {
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
        scratch: core::ptr::from_mut(s),
    };
    let tries = if range < SNAT_TRIES {
        range
    } else {
        SNAT_TRIES
    };
    // SAFETY: the callback only touches `search`, which outlives the call, and the scratch
    // it points to, which is not used here until the call returns.
    unsafe {
        bpf_loop(
            tries,
            try_port::<T> as *mut core::ffi::c_void,
            &mut search as *mut PortSearch<T::Scratch> as *mut core::ffi::c_void,
            0,
        )
    };
    // The pointer's stack slot is cleared (one full store) before LLVM reuses it: the
    // verifier refuses a narrower write over a spilled pointer without CAP_PERFMON.
    // SAFETY: a field of a local.
    unsafe { core::ptr::write_volatile(&mut search.scratch, core::ptr::null_mut()) };
    if search.found_be == 0 {
        return Err(Reason(R_SNAT_FAILED));
    }
    Ok(search.found_be as u16)
}
