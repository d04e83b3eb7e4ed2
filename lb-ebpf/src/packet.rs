//! Packet access shared by the tc and XDP programs.
//!
//! The common case (headers in the linear area, no IP options) is read and written in place
//! through `data`/`data_end` at constant offsets the verifier checks ([`at`]): no helper call
//! per field. Variable offsets are never added to a packet pointer (the verifier refuses
//! that without CAP_PERFMON, and the agent runs with CAP_BPF + CAP_NET_ADMIN only), so a
//! packet with IP options, or whose headers are not linear (tc after a failed
//! `bpf_skb_pull_data`, a multi-buffer XDP frame), goes through the load/store helpers
//! below instead.
//!
//! Checksums: XDP updates them itself and only sees packets with a complete checksum (see
//! `xdp.rs`). tc writes the IPv4 header and its checksum in place (never offloaded; the
//! header still sums to the same value, so a `CHECKSUM_COMPLETE` skb stays right) and leaves
//! the L4 checksum to `bpf_l4_csum_replace` with a combined diff, which keeps the skb's
//! offload state right: one call for the addresses (pseudo header), one for the ports.

use core::{ffi::c_void, mem::MaybeUninit};

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    helpers::{bpf_xdp_get_buff_len, bpf_xdp_load_bytes, bpf_xdp_store_bytes},
    programs::{TcContext, XdpContext},
};

/// What the datapath needs from a packet, whatever the hook.
pub trait Packet {
    fn len(&self) -> u32;
    /// Start and end of the directly accessible bytes.
    fn data(&self) -> usize;
    fn data_end(&self) -> usize;
    /// Makes the first `n` bytes directly accessible where the hook can (tc:
    /// `bpf_skb_pull_data`). Packet pointers taken before are invalid afterwards.
    fn pull(&self, n: u32) -> bool;
    /// Applies `addr_diff` (a one's-complement sum of changed pseudo-header words) and
    /// `port_diff` (changed words of the L4 header itself) to the L4 checksum at the
    /// constant offset `csum_off`; `udp`: a 0 checksum stays 0. `Err` when the packet is
    /// too short for the field.
    fn l4_csum_diff(
        &self,
        csum_off: usize,
        addr_diff: u32,
        port_diff: u32,
        udp: bool,
    ) -> Result<(), ()>;
    fn load<T>(&self, off: usize) -> Result<T, ()>;
    fn store<T>(&self, off: usize, v: &T) -> Result<(), ()>;
    /// The IPv4 header checksum at `csum_off` after a 4-byte field went `from` → `to`.
    fn l3_csum_replace(&self, csum_off: usize, from: u32, to: u32) -> Result<(), ()>;
    /// The context pointer, for helpers such as `bpf_fib_lookup`.
    fn raw(&self) -> *mut c_void;
    fn ingress_ifindex(&self) -> u32;
    /// The segment payload size of a segmentation-offload super-packet; 0 for a packet.
    fn gso_size(&self) -> u32;
}

impl Packet for TcContext {
    #[inline(always)]
    fn len(&self) -> u32 {
        TcContext::len(self)
    }
    // Volatile reads of the context: otherwise LLVM hoists them out of an out-of-line
    // function into its callers (argument promotion) and passes the packet pointers as
    // 32-bit integers, which the verifier refuses.
    #[inline(always)]
    fn data(&self) -> usize {
        // SAFETY: reading a field of the context the kernel passed us.
        unsafe { core::ptr::read_volatile(&(*self.skb.skb).data) as usize }
    }
    #[inline(always)]
    fn data_end(&self) -> usize {
        // SAFETY: as above.
        unsafe { core::ptr::read_volatile(&(*self.skb.skb).data_end) as usize }
    }
    #[inline(always)]
    fn pull(&self, n: u32) -> bool {
        self.len() >= n && self.skb.pull_data(n).is_ok()
    }
    #[inline(always)]
    fn l4_csum_diff(
        &self,
        csum_off: usize,
        addr_diff: u32,
        port_diff: u32,
        udp: bool,
    ) -> Result<(), ()> {
        // Two calls, not one: for a CHECKSUM_PARTIAL skb only the pseudo-header part may be
        // applied (the ports are summed later by the offload), for CHECKSUM_COMPLETE only
        // that part moves skb->csum.
        let mangled = if udp { BPF_F_MARK_MANGLED_0 as u64 } else { 0 };
        if addr_diff != 0 {
            TcContext::l4_csum_replace(
                self,
                csum_off,
                0,
                addr_diff as u64,
                BPF_F_PSEUDO_HDR as u64 | mangled,
            )
            .map_err(|_| ())?;
        }
        if port_diff != 0 {
            TcContext::l4_csum_replace(self, csum_off, 0, port_diff as u64, mangled)
                .map_err(|_| ())?;
        }
        Ok(())
    }
    #[inline(always)]
    fn load<T>(&self, off: usize) -> Result<T, ()> {
        TcContext::load(self, off).map_err(|_| ())
    }
    #[inline(always)]
    fn store<T>(&self, off: usize, v: &T) -> Result<(), ()> {
        TcContext::store(self, off, v, 0).map_err(|_| ())
    }
    #[inline(always)]
    fn l3_csum_replace(&self, csum_off: usize, from: u32, to: u32) -> Result<(), ()> {
        TcContext::l3_csum_replace(self, csum_off, from as u64, to as u64, 4).map_err(|_| ())
    }
    #[inline(always)]
    fn raw(&self) -> *mut c_void {
        self.skb.skb as *mut c_void
    }
    // `ifindex`, the device the program runs on: at tc ingress it is the ingress device, and
    // unlike `ingress_ifindex` it is also set for BPF_PROG_TEST_RUN (loopback).
    #[allow(clippy::misnamed_getters)]
    #[inline(always)]
    fn ingress_ifindex(&self) -> u32 {
        // SAFETY: reading a field of the context the kernel passed us.
        unsafe { (*self.skb.skb).ifindex }
    }
    #[inline(always)]
    fn gso_size(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.skb.skb).gso_size }
    }
}

/// A pointer to a `T` at the constant offset `off` of the packet, if the directly accessible
/// bytes hold all of it (the bounds check the verifier wants before any access).
#[inline(always)]
pub fn at<P: Packet, T>(ctx: &P, off: usize) -> Option<*mut T> {
    let start = ctx.data();
    if start + off + core::mem::size_of::<T>() > ctx.data_end() {
        return None;
    }
    Some((start + off) as *mut T)
}

/// A 16-bit field as it sits in the packet, at `p + off` (checked by [`at`]).
///
/// Plain typed accesses, not `read_unaligned`: the BPF backend splits an unaligned access
/// into single bytes, while the JIT's loads and stores take any alignment (an IPv4 address
/// sits at offset 26 of the frame).
#[inline(always)]
pub unsafe fn ld16(p: *const u8, off: usize) -> u16 {
    // SAFETY: the caller checked the bytes; see above on alignment.
    unsafe { core::ptr::read(p.add(off) as *const u16) }
}

/// A 32-bit field, likewise.
#[inline(always)]
pub unsafe fn ld32(p: *const u8, off: usize) -> u32 {
    // SAFETY: as in `ld16`.
    unsafe { core::ptr::read(p.add(off) as *const u32) }
}

/// Writes a 16-bit field, likewise.
#[inline(always)]
pub unsafe fn st16(p: *mut u8, off: usize, v: u16) {
    // SAFETY: as in `ld16`.
    unsafe { core::ptr::write(p.add(off) as *mut u16, v) }
}

/// Writes a 32-bit field, likewise.
#[inline(always)]
pub unsafe fn st32(p: *mut u8, off: usize, v: u32) {
    // SAFETY: as in `ld16`.
    unsafe { core::ptr::write(p.add(off) as *mut u32, v) }
}

/// One's-complement sum of two 32-bit partial sums (a `__wsum`).
#[inline(always)]
pub fn csum_add(a: u32, b: u32) -> u32 {
    let (s, carry) = a.overflowing_add(b);
    s.wrapping_add(carry as u32)
}

/// The partial-sum change of a 4-byte field going `from` → `to` (both as they sit in the
/// packet): what `bpf_csum_diff` would return, without the call.
#[inline(always)]
pub fn diff4(from: u32, to: u32) -> u32 {
    csum_add(!from, to)
}

/// The same for a 2-byte field.
#[inline(always)]
pub fn diff2(from: u16, to: u16) -> u32 {
    csum_add((!from) as u32, to as u32)
}

/// A checksum field (as it sits in the packet) after the covered data changed by `diff`.
#[inline(always)]
pub fn csum_apply(old: u16, diff: u32) -> u16 {
    let s = csum_add(diff, (!old) as u32);
    let s = (s & 0xffff) + (s >> 16);
    let s = (s & 0xffff) + (s >> 16);
    !(s as u16)
}

/// `old` with `from` replaced by `to` in its one's-complement sum (RFC 1624), all in network
/// order; `size` 2 or 4 bytes.
#[inline(always)]
pub fn csum_replace(old_be: u16, from: u32, to: u32, size: u8) -> u16 {
    let old = u16::from_be(old_be) as u32;
    let (f, t) = if size == 4 {
        let f = u32::from_be(from);
        let t = u32::from_be(to);
        ((!f >> 16) + (!f & 0xffff), (t >> 16) + (t & 0xffff))
    } else {
        let f = u16::from_be(from as u16) as u32;
        let t = u16::from_be(to as u16) as u32;
        ((!f) & 0xffff, t)
    };
    let mut sum = (!old & 0xffff) + f + t;
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    (!(sum as u16)).to_be()
}

impl Packet for XdpContext {
    #[inline(always)]
    fn len(&self) -> u32 {
        // A helper, not data_end - data: pointer subtraction needs CAP_PERFMON.
        // SAFETY: helper on our own context.
        unsafe { bpf_xdp_get_buff_len(self.ctx) as u32 }
    }
    // Volatile, as for tc.
    #[inline(always)]
    fn data(&self) -> usize {
        // SAFETY: reading a field of the context the kernel passed us.
        unsafe { core::ptr::read_volatile(&(*self.ctx).data) as usize }
    }
    #[inline(always)]
    fn data_end(&self) -> usize {
        // SAFETY: as above.
        unsafe { core::ptr::read_volatile(&(*self.ctx).data_end) as usize }
    }
    #[inline(always)]
    fn pull(&self, _n: u32) -> bool {
        false
    }
    #[inline(always)]
    fn l4_csum_diff(
        &self,
        csum_off: usize,
        addr_diff: u32,
        port_diff: u32,
        udp: bool,
    ) -> Result<(), ()> {
        // Only complete checksums reach here: both parts go into the field at once.
        let p = at::<_, u16>(self, csum_off).ok_or(())? as *mut u8;
        // SAFETY: `at` checked the two bytes against data_end.
        let old = unsafe { ld16(p, 0) };
        if udp && old == 0 {
            return Ok(());
        }
        let mut new = csum_apply(old, csum_add(addr_diff, port_diff));
        if udp && new == 0 {
            new = 0xffff;
        }
        // SAFETY: as above.
        unsafe { st16(p, 0, new) };
        Ok(())
    }
    #[inline(always)]
    fn load<T>(&self, off: usize) -> Result<T, ()> {
        let mut v = MaybeUninit::<T>::uninit();
        // SAFETY: the helper writes exactly size_of::<T>() bytes into `v`, or fails.
        let rc = unsafe {
            bpf_xdp_load_bytes(
                self.ctx,
                off as u32,
                v.as_mut_ptr() as *mut c_void,
                core::mem::size_of::<T>() as u32,
            )
        };
        if rc == 0 {
            // SAFETY: initialised by the helper.
            Ok(unsafe { v.assume_init() })
        } else {
            Err(())
        }
    }
    #[inline(always)]
    fn store<T>(&self, off: usize, v: &T) -> Result<(), ()> {
        // SAFETY: the helper reads size_of::<T>() bytes from `v`.
        let rc = unsafe {
            bpf_xdp_store_bytes(
                self.ctx,
                off as u32,
                v as *const T as *mut c_void,
                core::mem::size_of::<T>() as u32,
            )
        };
        if rc == 0 { Ok(()) } else { Err(()) }
    }
    #[inline(always)]
    fn l3_csum_replace(&self, csum_off: usize, from: u32, to: u32) -> Result<(), ()> {
        let old: u16 = self.load(csum_off)?;
        self.store(csum_off, &csum_replace(old, from, to, 4))
    }
    #[inline(always)]
    fn raw(&self) -> *mut c_void {
        self.ctx as *mut c_void
    }
    #[inline(always)]
    fn ingress_ifindex(&self) -> u32 {
        XdpContext::ingress_ifindex(self) as u32
    }
    #[inline(always)]
    fn gso_size(&self) -> u32 {
        0
    }
}

/// The L4 checksum update at a variable offset (behind extension headers), per hook.
pub trait L4Sum: Packet {
    /// The hook rewrites SCTP packets (tc); XDP passes them to tc untranslated, so its
    /// rewrites carry no SCTP step (nor its calls, whose frames would count in XDP's chain).
    const SCTP: bool;
    /// Applies `addr` (pseudo-header words) and `port` (L4 header words) diffs to the
    /// checksum at `off`; `udp`: a 0 checksum stays 0 and a computed 0 is sent as 0xffff.
    fn l4_sum(&self, off: usize, addr: u32, port: u32, udp: bool) -> Result<(), ()>;
}

impl L4Sum for TcContext {
    const SCTP: bool = true;
    #[inline(always)]
    fn l4_sum(&self, off: usize, addr: u32, port: u32, udp: bool) -> Result<(), ()> {
        self.l4_csum_diff(off, addr, port, udp)
    }
}

impl L4Sum for XdpContext {
    const SCTP: bool = false;
    /// Through the load and store helpers: XDP's own `l4_csum_diff` reads in place, at
    /// constant offsets only.
    #[inline(always)]
    fn l4_sum(&self, off: usize, addr: u32, port: u32, udp: bool) -> Result<(), ()> {
        let old: u16 = self.load(off)?;
        if udp && old == 0 {
            return Ok(());
        }
        let mut new = csum_apply(old, csum_add(addr, port));
        if udp && new == 0 {
            new = 0xffff;
        }
        self.store(off, &new)
    }
}
