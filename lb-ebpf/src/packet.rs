//! Packet access shared by the tc and XDP programs: loads, stores and checksum updates. tc
//! uses the skb helpers (which keep the skb's checksum-offload state right); XDP updates the
//! checksums itself, and only sees packets with a complete checksum (see `xdp.rs`).

use core::{ffi::c_void, mem::MaybeUninit};

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    helpers::{bpf_xdp_get_buff_len, bpf_xdp_load_bytes, bpf_xdp_store_bytes},
    programs::{TcContext, XdpContext},
};

/// What the datapath needs from a packet, whatever the hook.
pub trait Packet {
    fn len(&self) -> u32;
    fn load<T>(&self, off: usize) -> Result<T, ()>;
    fn store<T>(&self, off: usize, v: &T) -> Result<(), ()>;
    /// The IPv4 header checksum at `csum_off` after a 4-byte field went `from` → `to`.
    fn l3_csum_replace(&self, csum_off: usize, from: u32, to: u32) -> Result<(), ()>;
    /// The L4 checksum at `csum_off` after a field of `size` (2 or 4) bytes went `from` →
    /// `to`; `pseudo`: the field is part of the pseudo header; `udp`: a 0 checksum stays 0.
    fn l4_csum_replace(
        &self,
        csum_off: usize,
        from: u32,
        to: u32,
        size: u8,
        pseudo: bool,
        udp: bool,
    ) -> Result<(), ()>;
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
    fn l4_csum_replace(
        &self,
        csum_off: usize,
        from: u32,
        to: u32,
        size: u8,
        pseudo: bool,
        udp: bool,
    ) -> Result<(), ()> {
        let mut flags = size as u64;
        if pseudo {
            flags |= BPF_F_PSEUDO_HDR as u64;
        }
        if udp {
            flags |= BPF_F_MARK_MANGLED_0 as u64;
        }
        TcContext::l4_csum_replace(self, csum_off, from as u64, to as u64, flags).map_err(|_| ())
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
    fn l4_csum_replace(
        &self,
        csum_off: usize,
        from: u32,
        to: u32,
        size: u8,
        _pseudo: bool,
        udp: bool,
    ) -> Result<(), ()> {
        let old: u16 = self.load(csum_off)?;
        if udp && old == 0 {
            return Ok(());
        }
        let mut new = csum_replace(old, from, to, size);
        if udp && new == 0 {
            new = 0xffff;
        }
        self.store(csum_off, &new)
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
