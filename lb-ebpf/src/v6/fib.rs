//! IPv6 route lookups through `bpf_fib_lookup` (family `AF_INET6`): the route MTU a
//! translated packet is checked against, and the node's source address toward a backend.

use core::ffi::c_void;

use aya_ebpf::{bindings::bpf_fib_lookup, btf_maps::PerCpuArray, macros::btf_map};

use lb_common::filter_fold;

use super::conntrack::{copy6, eq6};
use crate::fib::{copy_mac, opts, request, run};

const AF_INET6: u8 = 10;

/// Where an IPv6 packet goes.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Route6 {
    /// The node's source address for this route (network order); asked for only without
    /// the neighbour (`lookup`), else the packet's own.
    pub src_be: [u32; 4],
    pub ifindex: u32,
    /// The egress MTU.
    pub mtu: u16,
    /// 1: the packet does not fit.
    pub too_big: u8,
    pub _pad: u8,
    /// The next hop's MAC addresses (asked for with the neighbour: XDP).
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
}

#[repr(C)]
pub struct RouteScratch6 {
    req: bpf_fib_lookup,
    route: Route6,
}

/// The last IPv6 route looked up, per CPU (off the stack; the request built in place).
/// Written and read here only: `lookup_into` writes it through the one reference made to
/// it, the route leaves it as a copy (`route`) or is read by `remember` right after.
/// index 0 → `RouteScratch6` (100 B). 1 entry, not pinned.
#[btf_map]
static XLB_ROUTE6: PerCpuArray<RouteScratch6, 1> = PerCpuArray::new();

/// The route for `saddr → daddr` entering on `ifindex`, with `len` (the IPv6 packet's
/// length, header included) checked against its MTU (0: not checked). `None`: not
/// forwardable here (no route, a local address): the stack decides. The route is a copy.
#[inline(always)]
pub fn lookup(
    ctx: *mut c_void,
    ifindex: u32,
    proto: u8,
    saddr: &[u32; 4],
    daddr: &[u32; 4],
    len: u16,
) -> Option<Route6> {
    route(ctx, ifindex, proto, saddr, daddr, len, false)
}

/// One slot of XDP's IPv6 route cache, as IPv4's `fib::CachedRoute`: a complete route
/// (neighbour known) for `saddr_be → daddr_be` entering on `in_ifindex`, looked up at
/// `stamp_ns`, known to fit packets up to `fits` bytes (the IPv6 packet, header included).
#[derive(Clone, Copy)]
#[repr(C)]
pub struct CachedRoute6 {
    pub saddr_be: [u32; 4],
    pub daddr_be: [u32; 4],
    pub in_ifindex: u32,
    pub out_ifindex: u32,
    pub stamp_ns: u64,
    pub fits: u16,
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
    pub _pad: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<CachedRoute6>() == 64);

/// Slots of the IPv6 route cache per CPU (direct-mapped).
const ROUTE6_CACHE_SLOTS: u32 = 256;

/// XDP's IPv6 route cache, per CPU, direct-mapped by (source, destination, ingress
/// interface), trusted for `fib::ROUTE_CACHE_NS` as IPv4's: a packet of a flow whose route
/// was looked up less than a second ago skips `bpf_fib_lookup` (an IPv6 lookup costs more
/// than an IPv4 one). Keyed by the source too (source policy routing). Written and read by
/// XDP only. slot → `CachedRoute6` (64 B). 256 entries per CPU, overwritten on collision;
/// not pinned.
#[btf_map]
static XLB_XDPRT6: PerCpuArray<CachedRoute6, { ROUTE6_CACHE_SLOTS as usize }> = PerCpuArray::new();

#[inline(always)]
fn route_slot(saddr: &[u32; 4], daddr: &[u32; 4], ifindex: u32) -> u32 {
    (filter_fold(saddr) ^ filter_fold(daddr).rotate_left(16) ^ ifindex).wrapping_mul(0x9e37_79b1)
        >> 24
}

/// The hop for a translated packet `saddr → daddr` of `len` bytes entering on `ifindex`,
/// when XDP can send it itself (route complete, the packet fits): from the cache, else from
/// `bpf_fib_lookup` (then cached). `None`: leave it to the stack. The route lives in this
/// CPU's cache slot until the next call. The cache's steps are leaves of their own, so the
/// call chain is no deeper than a plain lookup's (the 512-byte stack).
#[inline(always)]
pub fn hop(
    ctx: *mut c_void,
    ifindex: u32,
    proto: u8,
    saddr: &[u32; 4],
    daddr: &[u32; 4],
    len: u16,
) -> Option<&'static CachedRoute6> {
    if let Some(c) = cached(ifindex, saddr, daddr, len) {
        return Some(c);
    }
    match route(ctx, ifindex, proto, saddr, daddr, len, true) {
        Some(r) if r.too_big == 0 => remember(ifindex, saddr, daddr, len),
        _ => None,
    }
}

/// The cached route for `saddr → daddr` entering on `ifindex`, when it is fresh and known
/// to fit `len` bytes.
#[inline(never)]
fn cached(
    ifindex: u32,
    saddr: &[u32; 4],
    daddr: &[u32; 4],
    len: u16,
) -> Option<&'static CachedRoute6> {
    let c = XLB_XDPRT6.get_ptr(route_slot(saddr, daddr, ifindex))?;
    // SAFETY: this CPU's slot; nothing else runs on it while the program does.
    let c = unsafe { &*c };
    (eq6(&c.saddr_be, saddr)
        && eq6(&c.daddr_be, daddr)
        && c.in_ifindex == ifindex
        && len <= c.fits
        && crate::clock::since(crate::clock::now(), c.stamp_ns) < crate::fib::ROUTE_CACHE_NS)
        .then_some(c)
}

/// Caches the route just looked up (this CPU's `XLB_ROUTE6` slot) for `saddr → daddr`
/// entering on `ifindex`, fitting `len` bytes; returns its cache slot.
#[inline(never)]
fn remember(
    ifindex: u32,
    saddr: &[u32; 4],
    daddr: &[u32; 4],
    len: u16,
) -> Option<&'static CachedRoute6> {
    let r = XLB_ROUTE6.get_ptr(0)?;
    let c = XLB_XDPRT6.get_ptr_mut(route_slot(saddr, daddr, ifindex))?;
    // SAFETY: this CPU's slots; nothing else runs on it while the program does.
    let (r, c) = unsafe { (&(*r).route, &mut *c) };
    copy6(&mut c.saddr_be, saddr);
    copy6(&mut c.daddr_be, daddr);
    c.in_ifindex = ifindex;
    c.out_ifindex = r.ifindex;
    c.fits = len;
    copy_mac(&mut c.smac, &r.smac);
    copy_mac(&mut c.dmac, &r.dmac);
    c._pad = [0; 2];
    c.stamp_ns = crate::clock::now();
    Some(c)
}

#[inline(always)]
fn route(
    ctx: *mut c_void,
    ifindex: u32,
    proto: u8,
    saddr: &[u32; 4],
    daddr: &[u32; 4],
    len: u16,
    neigh: bool,
) -> Option<Route6> {
    if lookup_into(ctx, ifindex, saddr, daddr, opts(len, proto, neigh)) != 0 {
        return None;
    }
    let p = XLB_ROUTE6.get_ptr(0)?;
    // SAFETY: this CPU's slot, written just now by `lookup_into`, whose reference to it
    // ended with the call: read through the pointer, no reference made.
    Some(unsafe { core::ptr::addr_of!((*p).route).read() })
}

#[inline(never)]
fn lookup_into(
    ctx: *mut c_void,
    ifindex: u32,
    saddr: &[u32; 4],
    daddr: &[u32; 4],
    opts: u64,
) -> i64 {
    let Some(scratch) = XLB_ROUTE6.get_ptr_mut(0) else {
        return -1;
    };
    // SAFETY: this CPU's slot; nothing else runs on it while the program does.
    let scratch = unsafe { &mut *scratch };
    let p = &mut scratch.req;
    let flags = request(p, AF_INET6, ifindex, opts);
    // SAFETY: both unions are 16 bytes of plain words in this CPU's slot; volatile so LLVM
    // keeps the word stores (a merged memcpy may become a call the verifier refuses).
    unsafe {
        let src = p.__bindgen_anon_3.ipv6_src.as_mut_ptr();
        let dst = p.__bindgen_anon_4.ipv6_dst.as_mut_ptr();
        for i in 0..4 {
            core::ptr::write_volatile(src.add(i), saddr[i]);
            core::ptr::write_volatile(dst.add(i), daddr[i]);
        }
    }
    // A route without its neighbour (SNAT, the MTU check) is asked for its source address
    // too; XDP's hop (with the neighbour) is not: IPv6 source selection walks the
    // interface's addresses, a large part of an IPv6 lookup, and a hop never uses it.
    let flags = if opts & 1 == 0 { flags } else { 0 };
    let Some(too_big) = run(ctx, p, flags) else {
        return -1;
    };
    let out = &mut scratch.route;
    let p = &scratch.req;
    // SAFETY: on success and on FRAG_NEEDED the kernel filled the source and the MTU.
    unsafe {
        for i in 0..4 {
            core::ptr::write_volatile(
                &mut out.src_be[i],
                core::ptr::read_volatile(&p.__bindgen_anon_3.ipv6_src[i]),
            );
        }
        out.mtu = p.__bindgen_anon_1.mtu_result;
        for i in 0..6 {
            core::ptr::write_volatile(&mut out.smac[i], core::ptr::read_volatile(&p.smac[i]));
            core::ptr::write_volatile(&mut out.dmac[i], core::ptr::read_volatile(&p.dmac[i]));
        }
    }
    out.ifindex = p.ifindex;
    out.too_big = too_big as u8;
    out._pad = 0;
    0
}
