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
/// read here only. index 0 → `RouteScratch` (88 B). 1 entry, not pinned.
#[btf_map]
static XLB_ROUTE: PerCpuArray<RouteScratch, 1> = PerCpuArray::new();

/// Looks up the route for `saddr_be → daddr_be` entering on `ifindex`. With `tot_len` (the
/// IPv4 total length) the kernel checks it against the route's MTU; with 0 a tc lookup checks
/// the skb against the egress device. `neigh`: also resolve the next hop's MAC (for a
/// redirect), else skip the neighbour table. `None`: not forwardable (no route, a local
/// address, no neighbour yet): the kernel's stack decides. The route lives in this CPU's
/// scratch until the next lookup.
#[inline(always)]
pub fn lookup(
    ctx: *mut c_void,
    ifindex: u32,
    proto: u8,
    saddr_be: u32,
    daddr_be: u32,
    tot_len: u16,
    neigh: bool,
) -> Option<&'static Route> {
    let opts = ((tot_len as u64) << 16) | ((proto as u64) << 8) | neigh as u64;
    if lookup_into(ctx, ifindex, saddr_be, daddr_be, opts) != 0 {
        return None;
    }
    let p = XLB_ROUTE.get_ptr(0)?;
    // SAFETY: this CPU's slot, written just now by `lookup_into`.
    Some(unsafe { &(*p).route })
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
    // Every input field is written: the slot holds the previous lookup.
    p.family = AF_INET;
    p.l4_protocol = (opts >> 8) as u8;
    p.sport = 0;
    p.dport = 0;
    p.ifindex = ifindex;
    p.__bindgen_anon_1.tot_len = (opts >> 16) as u16;
    p.__bindgen_anon_2.rt_metric = 0;
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
    p.__bindgen_anon_5.tbid = 0;
    let mut flags = BPF_FIB_LOOKUP_SRC;
    if opts & 1 == 0 {
        flags |= BPF_FIB_LOOKUP_SKIP_NEIGH;
    }
    // SAFETY: `p` is a valid request of the size passed.
    let rc = unsafe { fib_lookup(ctx, p, core::mem::size_of::<bpf_fib_lookup>() as i32, flags) };
    let too_big = rc == BPF_FIB_LKUP_RET_FRAG_NEEDED as i64;
    if rc != BPF_FIB_LKUP_RET_SUCCESS as i64 && !too_big {
        return -1;
    }
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
