//! Route lookups through `bpf_fib_lookup`: the egress interface and MTU for a translated
//! packet, the node's source address toward a backend (SNAT), and next-hop MACs (XDP).

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

const AF_INET: u8 = 2;

/// Where a packet goes.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Route {
    pub ifindex: u32,
    /// The node's source address for this route (network order).
    pub src_be: u32,
    /// The egress MTU (tc, `tot_len` 0: the egress device's).
    pub mtu: u16,
    /// 1: the packet does not fit, bigger than `mtu` (as the kernel measures it).
    pub too_big: u8,
    pub _pad: u8,
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
}

/// A lookup's request and result, per CPU.
#[repr(C)]
pub struct RouteScratch {
    req: bpf_fib_lookup,
    route: Route,
}

/// The last route looked up, per CPU (kept off the 512-byte stack; building the request in
/// place also avoids a zeroing loop the verifier refuses without CAP_PERFMON). Written and
/// read here only: a reference to it lives only within `lookup_into`, and the route leaves
/// it as a copy. index 0 → `RouteScratch` (88 B). 1 entry, not pinned.
#[btf_map]
static XLB_ROUTE: PerCpuArray<RouteScratch, 1> = PerCpuArray::new();

/// Looks up the route for `saddr_be → daddr_be` entering on `ifindex`. With `tot_len` (the
/// IPv4 total length) the kernel checks it against the route's MTU; with 0 a tc lookup checks
/// the skb against the egress device. `neigh`: also resolve the next hop's MAC (for a
/// redirect), else skip the neighbour table. `None`: not forwardable (no route, a local
/// address, no neighbour yet): the kernel's stack decides. The route is a copy (the caller
/// reads the fields it needs; inlined, only those are loaded).
#[inline(always)]
pub fn lookup(
    ctx: *mut c_void,
    ifindex: u32,
    proto: u8,
    saddr_be: u32,
    daddr_be: u32,
    tot_len: u16,
    neigh: bool,
) -> Option<Route> {
    if lookup_into(
        ctx,
        ifindex,
        saddr_be,
        daddr_be,
        opts(tot_len, proto, neigh),
    ) != 0
    {
        return None;
    }
    let p = XLB_ROUTE.get_ptr(0)?;
    // SAFETY: this CPU's slot, written just now by `lookup_into`, whose reference to it
    // ended with the call: read through the pointer, no reference made.
    Some(unsafe { core::ptr::addr_of!((*p).route).read() })
}

/// Out of line (its 64-byte request stays in its own frame): 0 and the scratch route filled
/// when the packet can be forwarded (or is too big), else -1. `opts`: tot_len << 16 |
/// proto << 8 | neigh.
#[inline(never)]
fn lookup_into(ctx: *mut c_void, ifindex: u32, saddr_be: u32, daddr_be: u32, opts: u64) -> i64 {
    let Some(scratch) = XLB_ROUTE.get_ptr_mut(0) else {
        return -1;
    };
    // SAFETY: this CPU's slot; nothing else runs on it while the program does.
    let scratch = unsafe { &mut *scratch };
    let p = &mut scratch.req;
    let flags = request(p, AF_INET, ifindex, opts);
    // Word by word, volatile: LLVM would merge the zeros into a `memset` byte loop, whose
    // pointer arithmetic the verifier refuses without CAP_PERFMON.
    // SAFETY: both unions are 16 bytes of plain words in this CPU's slot.
    unsafe {
        let src = p.__bindgen_anon_3.ipv6_src.as_mut_ptr();
        let dst = p.__bindgen_anon_4.ipv6_dst.as_mut_ptr();
        core::ptr::write_volatile(src, saddr_be);
        core::ptr::write_volatile(dst, daddr_be);
        for i in 1..4 {
            core::ptr::write_volatile(src.add(i), 0);
            core::ptr::write_volatile(dst.add(i), 0);
        }
    }
    let Some(too_big) = run(ctx, p, flags) else {
        return -1;
    };
    let out = &mut scratch.route;
    let p = &scratch.req;
    out.ifindex = p.ifindex;
    // SAFETY: on success and on FRAG_NEEDED the kernel has filled the source (asked for by
    // the flags, set before the MTU check) and the MTU.
    out.src_be = unsafe { p.__bindgen_anon_3.ipv4_src };
    out.mtu = unsafe { p.__bindgen_anon_1.mtu_result };
    out.too_big = too_big as u8;
    out.smac = p.smac;
    out.dmac = p.dmac;
    0
}

/// A lookup's options in one argument (the out-of-line lookups take five at most): `len`
/// (the packet's length to check, 0: none) << 16 | `proto` << 8 | `neigh`.
#[inline(always)]
pub(crate) fn opts(len: u16, proto: u8, neigh: bool) -> u64 {
    ((len as u64) << 16) | ((proto as u64) << 8) | neigh as u64
}

/// Writes every field of request `p` but the addresses (the slot holds the previous
/// lookup) for a lookup of `family`; `opts`: len << 16 | proto << 8 | neigh. Returns the
/// lookup's flags: the source address asked for, the neighbour skipped unless `neigh`.
/// Both families' requests (IPv6's `v6/fib.rs` too).
#[inline(always)]
pub(crate) fn request(p: &mut bpf_fib_lookup, family: u8, ifindex: u32, opts: u64) -> u32 {
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
pub(crate) fn run(ctx: *mut c_void, p: &mut bpf_fib_lookup, flags: u32) -> Option<bool> {
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
/// `fits` bytes (IPv4 total length).
#[derive(Clone, Copy)]
#[repr(C)]
pub struct CachedRoute {
    pub saddr_be: u32,
    pub daddr_be: u32,
    pub in_ifindex: u32,
    pub out_ifindex: u32,
    pub stamp_ns: u64,
    pub fits: u16,
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
    pub _pad: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<CachedRoute>() == 40);

/// Slots of the route cache per CPU (direct-mapped).
const ROUTE_CACHE_SLOTS: u32 = 256;
/// How long a cached route is trusted: a changed route or neighbour is seen within this.
pub(crate) const ROUTE_CACHE_NS: u64 = 1_000_000_000;

/// XDP's route cache, per CPU, direct-mapped by (source, destination, ingress interface):
/// a packet of a flow whose route was looked up less than a second ago skips
/// `bpf_fib_lookup` (about 130 ns of an XDP forward). Keyed by the source too, so source
/// policy routing (CNIs with per-pod rules) is honoured. Written and read by XDP only.
/// slot → `CachedRoute` (40 B). 256 entries per CPU, overwritten on collision; not pinned.
#[btf_map]
static XLB_XDPRT: PerCpuArray<CachedRoute, { ROUTE_CACHE_SLOTS as usize }> = PerCpuArray::new();

#[inline(always)]
fn route_slot(saddr_be: u32, daddr_be: u32, ifindex: u32) -> u32 {
    (saddr_be ^ daddr_be.rotate_left(16) ^ ifindex).wrapping_mul(0x9e37_79b1) >> 24
}

/// The hop for a translated packet `saddr_be → daddr_be` of IPv4 total length `tot_len`
/// entering on `ifindex`, when XDP can send it itself (route complete, the packet fits):
/// from the cache, else from `bpf_fib_lookup` (then cached). `None`: leave it to the stack.
/// The route lives in this CPU's cache slot until the next call.
#[inline(always)]
pub fn hop(
    ctx: *mut c_void,
    ifindex: u32,
    proto: u8,
    saddr_be: u32,
    daddr_be: u32,
    tot_len: u16,
) -> Option<&'static CachedRoute> {
    hop_from(
        ctx,
        ifindex,
        saddr_be,
        daddr_be,
        ((tot_len as u32) << 8) | proto as u32,
    )
}

/// Out of line (its frame stays off the callers'); `opts`: tot_len << 8 | proto.
#[inline(never)]
fn hop_from(
    ctx: *mut c_void,
    ifindex: u32,
    saddr_be: u32,
    daddr_be: u32,
    opts: u32,
) -> Option<&'static CachedRoute> {
    let (tot_len, proto) = ((opts >> 8) as u16, opts as u8);
    let c = XLB_XDPRT.get_ptr_mut(route_slot(saddr_be, daddr_be, ifindex))?;
    // SAFETY: this CPU's slot; nothing else runs on it while the program does.
    let c = unsafe { &mut *c };
    if c.saddr_be == saddr_be
        && c.daddr_be == daddr_be
        && c.in_ifindex == ifindex
        && tot_len <= c.fits
        && crate::clock::since(crate::clock::now(), c.stamp_ns) < ROUTE_CACHE_NS
    {
        return Some(c);
    }
    // The slot is claimed before the lookup (stale until it succeeds), so that only the
    // slot stays live across the call: the frame stays small (the 512-byte stack).
    c.saddr_be = saddr_be;
    c.daddr_be = daddr_be;
    c.in_ifindex = ifindex;
    c.fits = tot_len;
    c.stamp_ns = 0;
    match lookup(ctx, ifindex, proto, saddr_be, daddr_be, tot_len, true) {
        Some(r) if r.too_big == 0 => {
            c.out_ifindex = r.ifindex;
            copy_mac(&mut c.smac, &r.smac);
            copy_mac(&mut c.dmac, &r.dmac);
            c.stamp_ns = crate::clock::now();
            Some(c)
        }
        _ => None,
    }
}

/// Copies a MAC address between two map values byte by byte: a plain array assignment
/// becomes a call to `memmove`, whose overlap check subtracts one pointer from the other,
/// which the verifier refuses without CAP_PERFMON (the agent runs with CAP_BPF and
/// CAP_NET_ADMIN only).
#[inline(always)]
pub(crate) fn copy_mac(dst: &mut [u8; 6], src: &[u8; 6]) {
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
