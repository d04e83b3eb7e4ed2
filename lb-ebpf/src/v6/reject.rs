//! Answers from an IPv6 frontend, built in place of the packet and sent back out of the
//! interface it came in on (as `reject.rs` does for IPv4): a TCP RST or an ICMPv6 port
//! unreachable for a service without endpoints (kube-proxy's REJECT), an ICMPv6 Packet Too
//! Big for a packet too big for the route to its backend (path-MTU discovery through the
//! service: IPv6 routers never fragment). ICMPv6 and TCP checksums cover the pseudo-header.

use aya_ebpf::{helpers::bpf_skb_change_tail, programs::TcContext};
use lb_common::{IPPROTO_TCP, R_FRAG_NEEDED, R_NO_BACKEND, R_REWRITE_FAILED};

use super::parse::{IP6_DST_OFF, IP6_L4_OFF, IP6_SRC_OFF, IPPROTO_ICMPV6, Tuple6};
use crate::{
    parse::ETH_HLEN,
    reason::Reason,
    reject::{eth_reply, fold, load_quote, rst_for, send_back, sum16},
};

const ICMPV6_DEST_UNREACH: u8 = 1;
const ICMPV6_PORT_UNREACH: u8 = 4;
const ICMPV6_PKT_TOOBIG: u8 = 2;
/// The quoted packet: its IPv6 header and the first 8 bytes of its L4 header (what the
/// client's stack needs to find the socket).
pub const QUOTE: usize = 48;

#[inline(always)]
fn failed<E>(_: E) -> Reason {
    Reason(R_REWRITE_FAILED)
}

/// One's-complement sum of an address's 16-bit words (network order words).
#[inline(always)]
pub fn sum_addr(a: &[u32; 4], mut sum: u32) -> u32 {
    for w in a {
        let b = w.to_ne_bytes();
        sum += (((b[0] as u32) << 8) | b[1] as u32) + (((b[2] as u32) << 8) | b[3] as u32);
    }
    sum
}

/// The pseudo-header's sum for `len` bytes of `proto` from `src` to `dst`.
#[inline(always)]
pub fn pseudo(src: &[u32; 4], dst: &[u32; 4], len: u32, proto: u8) -> u32 {
    sum_addr(dst, sum_addr(src, 0)) + len + proto as u32
}

/// Writes the Ethernet (addresses swapped) and IPv6 headers of an answer from the frontend
/// to the client, for `payload` bytes of `proto`, after resizing the packet to them.
#[inline(always)]
fn headers(ctx: &TcContext, t: &Tuple6, proto: u8, payload: u16) -> Result<(), Reason> {
    let eth = eth_reply(ctx)?;
    let len = (IP6_L4_OFF + payload as usize) as u32;
    // SAFETY: helper on our own skb; packet pointers are not used afterwards.
    if unsafe { bpf_skb_change_tail(ctx.skb.skb, len, 0) } != 0 {
        return Err(Reason(R_REWRITE_FAILED));
    }
    let p = payload.to_be_bytes();
    let fixed = [0x60u8, 0, 0, 0, p[0], p[1], proto, 64];
    ctx.store(0, &eth, 0).map_err(failed)?;
    ctx.store(ETH_HLEN, &fixed, 0).map_err(failed)?;
    ctx.store(IP6_SRC_OFF, &t.daddr_be, 0).map_err(failed)?;
    ctx.store(IP6_DST_OFF, &t.saddr_be, 0).map_err(failed)
}

/// Rewrites the packet into the refusal and redirects it back; returns the tc action. An
/// ICMPv6 answer's quote is built in `quote` (the scratch's: off the stack). `back`: as
/// IPv4's (`BPF_F_INGRESS` at egress).
#[inline(always)]
pub fn refuse(
    ctx: &TcContext,
    t: &Tuple6,
    quote: &mut [u8; QUOTE],
    back: u64,
) -> Result<i32, Reason> {
    if t.proto == IPPROTO_TCP {
        tcp_rst(ctx, t)?;
    } else {
        icmp_error(ctx, t, ICMPV6_DEST_UNREACH, ICMPV6_PORT_UNREACH, 0, quote)?;
    }
    send_back(ctx, back)
}

/// Answers a packet too big for its route with Packet Too Big (`mtu`) from the frontend the
/// client addressed, quoting the packet as the client sent it (built in `quote`).
#[inline(always)]
pub fn too_big(
    ctx: &TcContext,
    t: &Tuple6,
    mtu: u16,
    quote: &mut [u8; QUOTE],
) -> Result<i32, Reason> {
    if t.l4_off as usize != IP6_L4_OFF {
        // Extension headers: the quote would not reach the ports; dropped, as a router
        // without an answer would.
        return Err(Reason(R_FRAG_NEEDED));
    }
    icmp_error(ctx, t, ICMPV6_PKT_TOOBIG, 0, mtu as u32, quote)?;
    send_back(ctx, 0)
}

#[inline(always)]
fn tcp_rst(ctx: &TcContext, t: &Tuple6) -> Result<(), Reason> {
    let tcp: [u8; 20] = ctx.load(t.l4_off as usize).map_err(failed)?;
    let l4_len = t.payload_len - (t.l4_off - IP6_L4_OFF as u32);
    let (seq, ack, out_flags) = rst_for(&tcp, l4_len)?;
    // Words, written volatile: as bytes, the trailing zeros merge into a `memset` byte loop
    // the verifier refuses without CAP_PERFMON.
    let mut rst = [0u32; 5];
    let words = [
        u32::from_ne_bytes([tcp[2], tcp[3], tcp[0], tcp[1]]),
        u32::from_ne_bytes(seq),
        u32::from_ne_bytes(ack),
        u32::from_ne_bytes([0x50, out_flags, 0, 0]),
        0,
    ];
    for i in 0..5 {
        // SAFETY: in bounds.
        unsafe { core::ptr::write_volatile(&mut rst[i], words[i]) };
    }
    // SAFETY: five u32 are twenty bytes.
    let bytes = unsafe { &*(rst.as_ptr() as *const [u8; 20]) };
    let c = fold(sum16(
        bytes,
        pseudo(&t.daddr_be, &t.saddr_be, 20, IPPROTO_TCP),
    ));
    // SAFETY: in bounds.
    unsafe { core::ptr::write_volatile(&mut rst[4], u32::from_ne_bytes([c[0], c[1], 0, 0])) };
    headers(ctx, t, IPPROTO_TCP, 20)?;
    ctx.store(IP6_L4_OFF, &rst, 0).map_err(failed)
}

/// An ICMPv6 error of `kind`/`code` (`rest`: the word after the checksum) quoting the
/// packet's first [`QUOTE`] bytes (loaded into `quote`).
#[inline(always)]
fn icmp_error(
    ctx: &TcContext,
    t: &Tuple6,
    kind: u8,
    code: u8,
    rest: u32,
    quote: &mut [u8; QUOTE],
) -> Result<(), Reason> {
    if t.l4_off as usize != IP6_L4_OFF {
        return Err(Reason(R_NO_BACKEND));
    }
    load_quote(ctx, ETH_HLEN, quote)?;
    // Two words, written volatile: as bytes, the zeros of a code 0 and a small MTU merge
    // into a `memset` byte loop the verifier refuses without CAP_PERFMON.
    let mut icmp = [0u32; 2];
    // SAFETY: both indices are in bounds.
    unsafe {
        core::ptr::write_volatile(&mut icmp[0], u32::from_ne_bytes([kind, code, 0, 0]));
        core::ptr::write_volatile(&mut icmp[1], rest.to_be());
    }
    let len = (8 + QUOTE) as u32;
    let sum = pseudo(&t.daddr_be, &t.saddr_be, len, IPPROTO_ICMPV6);
    // SAFETY: two u32 are eight bytes.
    let bytes = unsafe { &*(icmp.as_ptr() as *const [u8; 8]) };
    let c = fold(sum16(quote, sum16(bytes, sum)));
    // SAFETY: as above.
    unsafe {
        core::ptr::write_volatile(&mut icmp[0], u32::from_ne_bytes([kind, code, c[0], c[1]]))
    };
    headers(ctx, t, IPPROTO_ICMPV6, len as u16)?;
    ctx.store(IP6_L4_OFF, &icmp, 0).map_err(failed)?;
    ctx.store(IP6_L4_OFF + 8, quote, 0).map_err(failed)
}
