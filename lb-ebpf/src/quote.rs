//! A quote: the first bytes of a packet an ICMP or ICMPv6 error carries (its IP header
//! without options or extension headers, and the first 8 bytes of its L4 header: IPv4's 28
//! bytes, IPv6's 48), worked on in the per-CPU scratch (the stack is too small for it):
//! loaded from the packet, and the checksum diff of a change to it. Used by the answers
//! (`reject.rs`) and the ICMP translation (`icmp.rs`), for either family's size.

use aya_ebpf::{
    helpers::{bpf_csum_diff, bpf_skb_load_bytes},
    programs::TcContext,
};
use lb_common::R_REWRITE_FAILED;

use crate::reason::Reason;

/// A family's quote buffer (`[u8; N]`, the scratch's `quote_old` and `quote_new`).
pub trait Quote: Copy + AsRef<[u8]> + AsMut<[u8]> {
    /// Its length in bytes.
    const LEN: usize;
    /// Loads `LEN` bytes of the packet from `off` into it.
    fn load(&mut self, ctx: &TcContext, off: usize) -> Result<(), Reason>;
    /// The checksum diff of bytes `from..from + len` (4-byte words) going `old` → `new`,
    /// by the helper (a loop over a map value at a variable index is refused without
    /// CAP_PERFMON).
    fn diff(old: &mut Self, new: &mut Self, from: usize, len: usize) -> Result<u32, Reason>;
}

impl<const N: usize> Quote for [u8; N] {
    const LEN: usize = N;
    #[inline(always)]
    fn load(&mut self, ctx: &TcContext, off: usize) -> Result<(), Reason> {
        // SAFETY: the destination is N bytes of this CPU's scratch.
        let rc = unsafe {
            bpf_skb_load_bytes(
                ctx.skb.skb as *const core::ffi::c_void,
                off as u32,
                self.as_mut_ptr() as *mut core::ffi::c_void,
                N as u32,
            )
        };
        if rc != 0 {
            return Err(Reason(R_REWRITE_FAILED));
        }
        Ok(())
    }
    #[inline(always)]
    fn diff(old: &mut Self, new: &mut Self, from: usize, len: usize) -> Result<u32, Reason> {
        if from + len > N || !len.is_multiple_of(4) {
            return Err(Reason(R_REWRITE_FAILED));
        }
        // SAFETY: `len` bytes from `from` of both N-byte buffers (checked above), in the
        // scratch map value.
        let diff = unsafe {
            bpf_csum_diff(
                old.as_mut_ptr().add(from) as *mut u32,
                len as u32,
                new.as_mut_ptr().add(from) as *mut u32,
                len as u32,
                0,
            )
        };
        if diff < 0 {
            return Err(Reason(R_REWRITE_FAILED));
        }
        Ok(diff as u32)
    }
}
