//! IPv6 route lookups through `bpf_fib_lookup` (family `AF_INET6`): the route MTU a
//! translated packet is checked against, and the node's source address toward a backend.

use core::ffi::c_void;

use aya_ebpf::{bindings::bpf_fib_lookup, btf_maps::PerCpuArray, macros::btf_map};

use lb_common::IPPROTO_TCP;

use super::parse::Tuple6;
use crate::{
    fib::{opts, request, run},
    packet::Packet,
    parse::ETH_HLEN,
    translate::Mtu,
};

const AF_INET6: u8 = 10;
/// Packets up to this size are not checked against the route MTU (IPv6's minimum link MTU).
const MIN_CHECKED_LEN: u32 = 1280;

/// Checks a packet (IPv6: every packet; no router fragments it) against the route to
/// `daddr`, unless it is no bigger than `fits`, a size already known to fit (0 = none). A
/// GSO super-packet is checked by the size of its segments.
#[inline(always)]
pub fn check_mtu<P: Packet>(ctx: &P, t: &Tuple6, daddr: &[u32; 4], fits: u16) -> Mtu {
    let gso = ctx.gso_size();
    let len = if gso == 0 {
        40 + t.payload_len
    } else {
        let l4_hdr = if t.proto == IPPROTO_TCP {
            ctx.load::<u8>(t.l4_off as usize + 12)
                .map_or(20, |d| ((d >> 4) as u32) * 4)
        } else {
            8
        };
        t.l4_off - ETH_HLEN as u32 + l4_hdr + gso
    };
    if len <= MIN_CHECKED_LEN || len <= fits as u32 || len > u16::MAX as u32 {
        return Mtu::Unchecked;
    }
    let Some(route) = lookup(
        ctx.raw(),
        ctx.ingress_ifindex(),
        t.proto,
        &t.saddr_be,
        daddr,
        len as u16,
    ) else {
        return Mtu::Unchecked;
    };
    if route.too_big != 0 {
        Mtu::TooBig(route.mtu)
    } else {
        Mtu::Fits(len as u16)
    }
}

/// Where an IPv6 packet goes.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Route6 {
    /// The node's source address for this route (network order).
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
/// Written and read here only. index 0 → `RouteScratch6` (100 B). 1 entry, not pinned.
#[btf_map]
static XLB_ROUTE6: PerCpuArray<RouteScratch6, 1> = PerCpuArray::new();

/// The route for `saddr → daddr` entering on `ifindex`, with `len` (the IPv6 packet's
/// length, header included) checked against its MTU (0: not checked). `None`: not
/// forwardable here (no route, a local address): the stack decides.
#[inline(always)]
pub fn lookup(
    ctx: *mut c_void,
    ifindex: u32,
    proto: u8,
    saddr: &[u32; 4],
    daddr: &[u32; 4],
    len: u16,
) -> Option<&'static Route6> {
    route(ctx, ifindex, proto, saddr, daddr, len, false)
}

/// As [`lookup`], also resolving the next hop's MAC (for XDP's redirect): `None` too when
/// the neighbour is not known yet.
#[inline(always)]
pub fn hop(
    ctx: *mut c_void,
    ifindex: u32,
    proto: u8,
    saddr: &[u32; 4],
    daddr: &[u32; 4],
    len: u16,
) -> Option<&'static Route6> {
    route(ctx, ifindex, proto, saddr, daddr, len, true)
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
) -> Option<&'static Route6> {
    if lookup_into(ctx, ifindex, saddr, daddr, opts(len, proto, neigh)) != 0 {
        return None;
    }
    let p = XLB_ROUTE6.get_ptr(0)?;
    // SAFETY: this CPU's slot, written just now.
    Some(unsafe { &(*p).route })
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
