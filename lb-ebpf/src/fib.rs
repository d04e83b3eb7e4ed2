//! Route lookups through `bpf_fib_lookup`, both families (generic over the address,
//! [`RouteAddr`]): the egress interface and MTU for a translated packet, the node's source
//! address toward a backend (SNAT), and next-hop MACs (XDP, with a per-CPU route cache).
//!
//! XDP keeps a new flow's way out in two per-CPU caches, each entry trusted for a second
//! (a route or neighbour change is seen within it) and only for packets up to the route's
//! MTU: per backend ([`backend_hop`], `XLB_XDPBE`: one lookup per backend, ingress
//! interface and CPU, whichever client) where the node's routes of the family depend on the
//! destination alone, which the agent says in the node config after reading the `ip rule`s
//! (a rule by source, a CNI's per-pod policy routing, would send two clients' flows to one
//! backend different ways); else per flow ([`hop`], `XLB_XDPRT`, keyed by the source too).
//! Chosen over an array beside the backend array (48 B more per backend, written by every
//! CPU at once) and over Katran's one default gateway (no route lookups at all, wrong for a
//! node with more than one way out): fixed memory (48 KiB per CPU), per-CPU writes.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::{
        BPF_FIB_LKUP_RET_FRAG_NEEDED, BPF_FIB_LKUP_RET_SUCCESS, BPF_FIB_LOOKUP_SKIP_NEIGH,
        BPF_FIB_LOOKUP_SRC, bpf_fib_lookup,
    },
    btf_maps::PerCpuArray,
    helpers::bpf_fib_lookup as fib_lookup,
    macros::btf_map,
};
use lb_common::filter_fold;

use crate::addr::Addr;

/// What a route lookup needs of an address of either family (IPv4's `u32`, IPv6's
/// `[u32; 4]`): its `bpf_fib_lookup` family, its words in a request, its route scratch and
/// XDP route cache (per CPU, one pair per family).
pub trait RouteAddr: Addr + 'static {
    /// `AF_INET`, `AF_INET6`.
    const AF: u8;
    /// A lookup with the neighbour (XDP's hop) asks for the source address too. IPv4: yes;
    /// IPv6: no (its source selection walks the interface's addresses, a large part of an
    /// IPv6 lookup, and a hop never uses it).
    const SRC_WITH_NEIGH: bool;
    /// The node config flag saying the family's routes depend on the destination and the
    /// ingress interface alone (`CFG_F_ROUTES_BY_DST`, `CFG_F_ROUTES6_BY_DST`): XDP may
    /// keep the way out per backend ([`backend_hop`]).
    const BY_DST: u32;
    /// Writes the address into a request's 16-byte address union at `p` (IPv4: word 0, the
    /// rest zero), word by word, volatile: merged, the words may become a `memset` or
    /// `memcpy` the verifier refuses without CAP_PERFMON.
    ///
    /// # Safety
    /// `p` points to four writable words.
    unsafe fn put(&self, p: *mut u32);
    /// The address the kernel filled into a request's address union at `p`.
    ///
    /// # Safety
    /// `p` points to four readable words.
    unsafe fn get(p: *const u32) -> Self;
    /// The word the route cache's slot is hashed from (IPv6: `lb_common::filter_fold`).
    fn slot_word(&self) -> u32;
    /// This CPU's route request scratch of the family.
    fn scratch() -> Option<*mut RouteScratchOf<Self>>;
    /// This CPU's XDP route cache slot `i` of the family.
    fn cache(i: u32) -> Option<*mut CachedRouteOf<Self>>;
}

impl RouteAddr for u32 {
    const AF: u8 = 2;
    const SRC_WITH_NEIGH: bool = true;
    const BY_DST: u32 = lb_common::CFG_F_ROUTES_BY_DST;
    #[inline(always)]
    unsafe fn put(&self, p: *mut u32) {
        // SAFETY: the caller's promise.
        unsafe {
            core::ptr::write_volatile(p, *self);
            for i in 1..4 {
                core::ptr::write_volatile(p.add(i), 0);
            }
        }
    }
    #[inline(always)]
    unsafe fn get(p: *const u32) -> u32 {
        // SAFETY: the caller's promise.
        unsafe { p.read() }
    }
    #[inline(always)]
    fn slot_word(&self) -> u32 {
        *self
    }
    #[inline(always)]
    fn scratch() -> Option<*mut RouteScratch> {
        XLB_ROUTE.get_ptr_mut(0)
    }
    #[inline(always)]
    fn cache(i: u32) -> Option<*mut CachedRoute> {
        XLB_XDPRT.get_ptr_mut(i)
    }
}

impl RouteAddr for [u32; 4] {
    const AF: u8 = 10;
    const SRC_WITH_NEIGH: bool = false;
    const BY_DST: u32 = lb_common::CFG_F_ROUTES6_BY_DST;
    #[inline(always)]
    unsafe fn put(&self, p: *mut u32) {
        for (i, w) in self.iter().enumerate() {
            // SAFETY: the caller's promise.
            unsafe { core::ptr::write_volatile(p.add(i), *w) };
        }
    }
    #[inline(always)]
    unsafe fn get(p: *const u32) -> [u32; 4] {
        // SAFETY: the caller's promise.
        unsafe { core::array::from_fn(|i| core::ptr::read_volatile(p.add(i))) }
    }
    #[inline(always)]
    fn slot_word(&self) -> u32 {
        filter_fold(self)
    }
    #[inline(always)]
    fn scratch() -> Option<*mut RouteScratch6> {
        XLB_ROUTE6.get_ptr_mut(0)
    }
    #[inline(always)]
    fn cache(i: u32) -> Option<*mut CachedRoute6> {
        XLB_XDPRT6.get_ptr_mut(i)
    }
}

/// Where a packet goes.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Route<A> {
    /// The node's source address for this route (network order); asked for unless IPv6's
    /// lookup with the neighbour ([`RouteAddr::SRC_WITH_NEIGH`]).
    pub src_be: A,
    pub ifindex: u32,
    /// The egress MTU (tc, no length: the egress device's).
    pub mtu: u16,
    /// 1: the packet does not fit, bigger than `mtu` (as the kernel measures it).
    pub too_big: u8,
    pub _pad: u8,
    /// The next hop's MAC addresses (asked for with the neighbour: XDP).
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
}

/// A lookup's request and result, per CPU.
#[repr(C)]
pub struct RouteScratchOf<A> {
    req: bpf_fib_lookup,
    route: Route<A>,
}
pub type RouteScratch = RouteScratchOf<u32>;
pub type RouteScratch6 = RouteScratchOf<[u32; 4]>;

/// The last IPv4 route looked up, per CPU (kept off the 512-byte stack; building the
/// request in place also avoids a zeroing loop the verifier refuses without CAP_PERFMON).
/// Written and read here only: a reference to it lives only within `lookup_into`, and the
/// route leaves it as a copy (or is read by `remember` right after). index 0 →
/// `RouteScratch` (88 B). 1 entry, not pinned.
#[btf_map]
static XLB_ROUTE: PerCpuArray<RouteScratch, 1> = PerCpuArray::new();

/// The last IPv6 route looked up, per CPU, as [`XLB_ROUTE`]. index 0 → `RouteScratch6`
/// (100 B). 1 entry, not pinned.
#[btf_map]
static XLB_ROUTE6: PerCpuArray<RouteScratch6, 1> = PerCpuArray::new();

/// The route for `saddr → daddr` entering on `ifindex`. With `len` (the IP packet's length,
/// header included) the kernel checks it against the route's MTU; with 0 a tc lookup checks
/// the skb against the egress device. `neigh`: also resolve the next hop's MAC (for a
/// redirect), else skip the neighbour table. `None`: not forwardable (no route, a local
/// address, no neighbour yet): the kernel's stack decides. The route is a copy (the caller
/// reads the fields it needs; inlined, only those are loaded).
#[inline(always)]
pub fn lookup<A: RouteAddr>(
    ctx: *mut c_void,
    ifindex: u32,
    proto: u8,
    saddr: &A,
    daddr: &A,
    len: u16,
    neigh: bool,
) -> Option<Route<A>> {
    if lookup_into(ctx, ifindex, saddr, daddr, opts(len, proto, neigh)) != 0 {
        return None;
    }
    let p = A::scratch()?;
    // SAFETY: this CPU's slot, written just now by `lookup_into`, whose reference to it
    // ended with the call: read through the pointer, no reference made.
    Some(unsafe { core::ptr::addr_of!((*p).route).read() })
}

/// Out of line (its 64-byte request stays in its own frame): 0 and the scratch route filled
/// when the packet can be forwarded (or is too big), else -1. `opts`: len << 16 | proto << 8
/// | neigh.
#[inline(never)]
fn lookup_into<A: RouteAddr>(
    ctx: *mut c_void,
    ifindex: u32,
    saddr: &A,
    daddr: &A,
    opts: u64,
) -> i64 {
    let Some(scratch) = A::scratch() else {
        return -1;
    };
    // SAFETY: this CPU's slot; nothing else runs on it while the program does.
    let scratch = unsafe { &mut *scratch };
    let p = &mut scratch.req;
    let mut flags = request(p, A::AF, ifindex, opts);
    if opts & 1 != 0 && !A::SRC_WITH_NEIGH {
        flags = 0;
    }
    // SAFETY: both unions are 16 bytes of plain words in this CPU's slot.
    unsafe {
        saddr.put(p.__bindgen_anon_3.ipv6_src.as_mut_ptr());
        daddr.put(p.__bindgen_anon_4.ipv6_dst.as_mut_ptr());
    }
    let Some(too_big) = run(ctx, p, flags) else {
        return -1;
    };
    let out = &mut scratch.route;
    let p = &scratch.req;
    // SAFETY: on success and on FRAG_NEEDED the kernel has filled the source (asked for by
    // the flags, set before the MTU check) and the MTU.
    unsafe {
        out.src_be
            .set(&A::get(p.__bindgen_anon_3.ipv6_src.as_ptr()));
        out.mtu = p.__bindgen_anon_1.mtu_result;
    }
    out.ifindex = p.ifindex;
    out.too_big = too_big as u8;
    out._pad = 0;
    copy_mac(&mut out.smac, &p.smac);
    copy_mac(&mut out.dmac, &p.dmac);
    0
}

/// A lookup's options in one argument (the out-of-line lookups take five at most): `len`
/// (the packet's length to check, 0: none) << 16 | `proto` << 8 | `neigh`.
#[inline(always)]
fn opts(len: u16, proto: u8, neigh: bool) -> u64 {
    ((len as u64) << 16) | ((proto as u64) << 8) | neigh as u64
}

/// Writes every field of request `p` but the addresses (the slot holds the previous
/// lookup) for a lookup of `family`; `opts`: len << 16 | proto << 8 | neigh. Returns the
/// lookup's flags: the source address asked for, the neighbour skipped unless `neigh`.
#[inline(always)]
fn request(p: &mut bpf_fib_lookup, family: u8, ifindex: u32, opts: u64) -> u32 {
    p.family = family;
    p.l4_protocol = (opts >> 8) as u8;
    p.sport = 0;
    p.dport = 0;
    p.ifindex = ifindex;
    p.__bindgen_anon_1.tot_len = (opts >> 16) as u16;
    // IPv6's flowinfo: the same word.
    p.__bindgen_anon_2.rt_metric = 0;
    p.__bindgen_anon_5.tbid = 0;
    let mut flags = BPF_FIB_LOOKUP_SRC;
    if opts & 1 == 0 {
        flags |= BPF_FIB_LOOKUP_SKIP_NEIGH;
    }
    flags
}

/// Runs the lookup `p`: whether the packet is too big for the route, `None` when it cannot
/// be forwarded (no route, a local address, no neighbour yet).
#[inline(always)]
fn run(ctx: *mut c_void, p: &mut bpf_fib_lookup, flags: u32) -> Option<bool> {
    // SAFETY: `p` is a valid request of the size passed.
    let rc = unsafe { fib_lookup(ctx, p, core::mem::size_of::<bpf_fib_lookup>() as i32, flags) };
    let too_big = rc == BPF_FIB_LKUP_RET_FRAG_NEEDED as i64;
    if rc != BPF_FIB_LKUP_RET_SUCCESS as i64 && !too_big {
        return None;
    }
    Some(too_big)
}

/// One slot of the XDP route cache: a complete route (neighbour known) for `saddr_be →
/// daddr_be` entering on `in_ifindex`, looked up at `stamp_ns`, known to fit packets up to
/// `fits` bytes (the IP packet, header included: the route's MTU, [`fits`]).
#[derive(Clone, Copy)]
#[repr(C)]
pub struct CachedRouteOf<A> {
    pub saddr_be: A,
    pub daddr_be: A,
    pub in_ifindex: u32,
    pub out_ifindex: u32,
    pub stamp_ns: u64,
    pub fits: u16,
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
    pub _pad: [u8; 2],
}
pub type CachedRoute = CachedRouteOf<u32>;
pub type CachedRoute6 = CachedRouteOf<[u32; 4]>;
const _: () = assert!(core::mem::size_of::<CachedRoute>() == 40);
const _: () = assert!(core::mem::size_of::<CachedRoute6>() == 64);

/// Slots of the route cache per CPU (direct-mapped).
const ROUTE_CACHE_SLOTS: u32 = 256;
/// How long a cached route is trusted: a changed route or neighbour is seen within this.
const ROUTE_CACHE_NS: u64 = 1_000_000_000;

/// XDP's IPv4 route cache, per CPU, direct-mapped by (source, destination, ingress
/// interface): a packet of a flow whose route was looked up less than a second ago skips
/// `bpf_fib_lookup` (about 130 ns of an XDP forward). Keyed by the source too, so source
/// policy routing (CNIs with per-pod rules) is honoured. Written and read by XDP only.
/// slot → `CachedRoute` (40 B). 256 entries per CPU, overwritten on collision; not pinned.
#[btf_map]
static XLB_XDPRT: PerCpuArray<CachedRoute, { ROUTE_CACHE_SLOTS as usize }> = PerCpuArray::new();

/// XDP's IPv6 route cache, as [`XLB_XDPRT`] (an IPv6 lookup costs more than an IPv4 one).
/// slot → `CachedRoute6` (64 B). 256 entries per CPU, overwritten on collision; not pinned.
#[btf_map]
static XLB_XDPRT6: PerCpuArray<CachedRoute6, { ROUTE_CACHE_SLOTS as usize }> = PerCpuArray::new();

#[inline(always)]
fn route_slot<A: RouteAddr>(saddr: &A, daddr: &A, ifindex: u32) -> u32 {
    (saddr.slot_word() ^ daddr.slot_word().rotate_left(16) ^ ifindex).wrapping_mul(0x9e37_79b1)
        >> 24
}

/// The hop for a translated packet `saddr → daddr` of `len` bytes (the IP packet, header
/// included) entering on `ifindex`, when XDP can send it itself (route complete, the packet
/// fits): from the cache, else from `bpf_fib_lookup` (then cached). `None`: leave it to the
/// stack. The route lives in this CPU's cache slot until the next call. The cache's steps
/// are leaves of their own, so the call chain is no deeper than a plain lookup's (the
/// 512-byte stack).
#[inline(always)]
pub fn hop<A: RouteAddr>(
    ctx: *mut c_void,
    ifindex: u32,
    proto: u8,
    saddr: &A,
    daddr: &A,
    len: u16,
) -> Option<&'static CachedRouteOf<A>> {
    if let Some(c) = cached(ifindex, saddr, daddr, len) {
        return Some(c);
    }
    match lookup(ctx, ifindex, proto, saddr, daddr, len, true) {
        Some(r) if r.too_big == 0 => remember(ifindex, saddr, daddr, len),
        _ => None,
    }
}

/// The cached route for `saddr → daddr` entering on `ifindex`, when it is fresh and known
/// to fit `len` bytes.
#[inline(never)]
fn cached<A: RouteAddr>(
    ifindex: u32,
    saddr: &A,
    daddr: &A,
    len: u16,
) -> Option<&'static CachedRouteOf<A>> {
    let c = A::cache(route_slot(saddr, daddr, ifindex))?;
    // SAFETY: this CPU's slot; nothing else runs on it while the program does.
    let c = unsafe { &*c };
    (c.saddr_be.same(saddr)
        && c.daddr_be.same(daddr)
        && c.in_ifindex == ifindex
        && len <= c.fits
        && crate::clock::since(crate::clock::now(), c.stamp_ns) < ROUTE_CACHE_NS)
        .then_some(c)
}

/// Caches the route just looked up (this CPU's route scratch) for `saddr → daddr` entering
/// on `ifindex`, fitting `len` bytes; returns its cache slot.
#[inline(never)]
fn remember<A: RouteAddr>(
    ifindex: u32,
    saddr: &A,
    daddr: &A,
    len: u16,
) -> Option<&'static CachedRouteOf<A>> {
    let r = A::scratch()?;
    let c = A::cache(route_slot(saddr, daddr, ifindex))?;
    // SAFETY: this CPU's slots; nothing else runs on it while the program does.
    let (r, c) = unsafe { (&(*r).route, &mut *c) };
    c.saddr_be.set(saddr);
    c.daddr_be.set(daddr);
    c.in_ifindex = ifindex;
    c.out_ifindex = r.ifindex;
    c.fits = fits(r, len);
    copy_mac(&mut c.smac, &r.smac);
    copy_mac(&mut c.dmac, &r.dmac);
    c._pad = [0; 2];
    c.stamp_ns = crate::clock::now();
    Some(c)
}

/// The largest packet a route just looked up for a packet of `len` bytes is known to take:
/// its MTU as the kernel's forwarding measures it (an XDP lookup always checks the MTU and
/// returns it in `mtu_result`, on success too), at least `len` (which it took).
#[inline(always)]
fn fits<A>(r: &Route<A>, len: u16) -> u16 {
    r.mtu.max(len)
}

/// One slot of XDP's way-out cache per backend: the way out toward backend index `backend`
/// of `generation` (its address folded, [`Addr::fold`], in `addr_fold`) for a packet
/// entering on `in_ifindex`: the egress interface and next hop's MACs, looked up at
/// `stamp_ns`, known to fit packets up to `fits` bytes (the route's MTU). Either family:
/// a backend index has one address, so the entry holds none, and one map serves both.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct BackendWay {
    pub stamp_ns: u64,
    pub backend: u32,
    pub generation: u32,
    pub addr_fold: u32,
    pub in_ifindex: u32,
    pub out_ifindex: u32,
    pub fits: u16,
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
    /// (Two fields, not a `[u8; 6]`: zeroed with two stores, where an array may become a
    /// byte loop the verifier refuses without CAP_PERFMON.)
    pub _pad0: u16,
    pub _pad1: u32,
}
const _: () = assert!(core::mem::size_of::<BackendWay>() == 48);

/// Slots of the way-out cache per CPU (direct-mapped by backend index: the agent hands
/// indices out densely, so up to this many backends never share a slot).
const BACKEND_WAY_SLOTS: u32 = 1024;

/// XDP's way out per backend, per CPU: the route toward a backend (egress interface, next
/// hop, MTU) looked up at most once a second per backend, ingress interface and CPU, where
/// [`XLB_XDPRT`] is keyed by the flow's source too and a new flow from a new client always
/// misses it. Used only while the node config says the family's routes depend on the
/// destination and ingress interface alone (`RouteAddr::BY_DST`, set by the agent from the
/// node's `ip rule`s: with a rule selecting by source the way is looked up per flow, as
/// before); a route or neighbour change is seen within the second, as with [`XLB_XDPRT`];
/// a packet bigger than `fits` is looked up. Written and read by XDP only. slot
/// (`backend_slot`) → `BackendWay` (48 B). 1,024 entries per CPU (48 KiB), whatever the
/// number of backends; overwritten on collision; not pinned.
#[btf_map]
static XLB_XDPBE: PerCpuArray<BackendWay, { BACKEND_WAY_SLOTS as usize }> = PerCpuArray::new();

/// Whether the node config says routes of `A`'s family depend on the destination and the
/// ingress interface alone ([`RouteAddr::BY_DST`]).
#[inline(always)]
pub fn by_destination<A: RouteAddr>() -> bool {
    crate::maps::XLB_CFG_V3
        .get(0)
        .is_some_and(|c| c.flags & A::BY_DST != 0)
}

/// The way-out cache's slot of backend index `backend` entering on `ifindex`: the index's
/// low bits, xor-ed with a word of the interface (one-to-one over indices per interface).
#[inline(always)]
fn backend_slot(backend: u32, ifindex: u32) -> u32 {
    (backend ^ (ifindex.wrapping_mul(0x9e37_79b1) >> 22)) & (BACKEND_WAY_SLOTS - 1)
}

/// The hop for a packet `saddr → daddr` of `len` bytes toward `backend` (its index and
/// generation; `daddr` its address) entering on `ifindex`, when XDP can send it itself: from
/// the way-out cache, else from `bpf_fib_lookup` (then cached for the backend). Only where
/// [`by_destination`] holds: the route is then the same whatever the source. `None`: leave
/// it to the stack. As [`hop`], its steps are leaves of their own.
#[inline(always)]
pub fn backend_hop<A: RouteAddr>(
    ctx: *mut c_void,
    ifindex: u32,
    proto: u8,
    saddr: &A,
    daddr: &A,
    backend: (u32, u32),
    len: u16,
) -> Option<&'static BackendWay> {
    let key = Key {
        backend: backend.0,
        generation: backend.1,
        addr_fold: daddr.fold(),
        ifindex,
    };
    if let Some(w) = backend_cached(&key, len) {
        return Some(w);
    }
    match lookup(ctx, ifindex, proto, saddr, daddr, len, true) {
        Some(r) if r.too_big == 0 => backend_remember::<A>(&key, len),
        _ => None,
    }
}

/// What names a way-out cache entry: the backend (index, generation, address folded) and
/// the ingress interface.
struct Key {
    backend: u32,
    generation: u32,
    addr_fold: u32,
    ifindex: u32,
}

/// The cached way toward `k`'s backend, when it is fresh and known to fit `len` bytes.
#[inline(never)]
fn backend_cached(k: &Key, len: u16) -> Option<&'static BackendWay> {
    let w = XLB_XDPBE.get_ptr(backend_slot(k.backend, k.ifindex))?;
    // SAFETY: this CPU's slot; nothing else runs on it while the program does.
    let w = unsafe { &*w };
    (w.backend == k.backend
        && w.generation == k.generation
        && w.addr_fold == k.addr_fold
        && w.in_ifindex == k.ifindex
        && len <= w.fits
        && crate::clock::since(crate::clock::now(), w.stamp_ns) < ROUTE_CACHE_NS)
        .then_some(w)
}

/// Caches the route just looked up (this CPU's route scratch of `A`'s family) as the way
/// toward `k`'s backend, fitting at least `len` bytes; returns its slot.
#[inline(never)]
fn backend_remember<A: RouteAddr>(k: &Key, len: u16) -> Option<&'static BackendWay> {
    let r = A::scratch()?;
    let w = XLB_XDPBE.get_ptr_mut(backend_slot(k.backend, k.ifindex))?;
    // SAFETY: this CPU's slots; nothing else runs on it while the program does.
    let (r, w) = unsafe { (&(*r).route, &mut *w) };
    w.backend = k.backend;
    w.generation = k.generation;
    w.addr_fold = k.addr_fold;
    w.in_ifindex = k.ifindex;
    w.out_ifindex = r.ifindex;
    w.fits = fits(r, len);
    copy_mac(&mut w.smac, &r.smac);
    copy_mac(&mut w.dmac, &r.dmac);
    w._pad0 = 0;
    w._pad1 = 0;
    w.stamp_ns = crate::clock::now();
    Some(w)
}

/// Copies a MAC address between two map values byte by byte: a plain array assignment
/// becomes a call to `memmove`, whose overlap check subtracts one pointer from the other,
/// which the verifier refuses without CAP_PERFMON (the agent runs with CAP_BPF and
/// CAP_NET_ADMIN only).
#[inline(always)]
fn copy_mac(dst: &mut [u8; 6], src: &[u8; 6]) {
    for i in 0..6 {
        // SAFETY: both indices are in bounds; volatile keeps LLVM from turning the loop back
        // into a memmove.
        unsafe { core::ptr::write_volatile(&mut dst[i], core::ptr::read_volatile(&src[i])) };
    }
}

/// The next hop of a packet XDP sends out itself (either family).
pub(crate) struct Hop {
    pub ifindex: u32,
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
}

/// How a packet translated to `v` leaves (either family).
pub(crate) enum Way {
    /// Untouched to tc: the route is not ready (no neighbour yet) or too small.
    Tc,
    /// Into the stack translated as tc ingress would: its way out takes no XDP frames.
    Stack,
    /// Redirected out of an interface that takes XDP frames.
    Redirect(Hop),
}

impl Way {
    /// The way out by a route's egress interface and next hop: redirected when the
    /// interface takes XDP frames, else into the stack.
    #[inline(always)]
    pub(crate) fn out(ifindex: u32, smac: &[u8; 6], dmac: &[u8; 6]) -> Way {
        if crate::maps::XLB_XDPTX_V1.get_ifindex(ifindex).is_none() {
            return Way::Stack;
        }
        Way::Redirect(Hop {
            ifindex,
            smac: *smac,
            dmac: *dmac,
        })
    }
}
