//! Refusing a connection to a service without endpoints, as kube-proxy's REJECT does: a TCP
//! segment is answered with a RST, a UDP datagram with ICMP port unreachable. The packet is
//! rewritten in place into the answer and sent back out of the interface it came in on.
//!
//! Shared with IPv6 (`v6/reject.rs`, `v6/icmp.rs`, `icmp.rs`): the RST's numbers
//! ([`rst_for`]), the Ethernet reply and the send-back, the one's-complement sums, loading a
//! quote into the scratch and its checksum diff. The headers and their checksums are each
//! family's (IPv4's header checksum; IPv6's pseudo-header of four-word addresses).

use aya_ebpf::{
    bindings::TC_ACT_REDIRECT,
    helpers::{bpf_csum_diff, bpf_redirect, bpf_skb_change_tail, bpf_skb_load_bytes},
    programs::TcContext,
};
use lb_common::{IPPROTO_TCP, R_FRAG_NEEDED, R_NO_BACKEND, R_REWRITE_FAILED};

use crate::{
    parse::{ETH_HLEN, Tuple},
    reason::Reason,
};

const IPPROTO_ICMP: u8 = 1;
/// Destination unreachable codes.
const ICMP_PORT_UNREACH: u8 = 3;
const ICMP_FRAG_NEEDED: u8 = 4;
/// Original IP header + 8 bytes of its payload, quoted in the ICMP error.
const QUOTE: usize = 28;

#[inline(always)]
fn failed<E>(_: E) -> Reason {
    Reason(R_REWRITE_FAILED)
}

/// One's-complement sum of big-endian 16-bit words.
#[inline(always)]
pub fn sum16(bytes: &[u8], mut sum: u32) -> u32 {
    let mut i = 0;
    while i + 1 < bytes.len() {
        sum += ((bytes[i] as u32) << 8) | bytes[i + 1] as u32;
        i += 2;
    }
    sum
}

/// Folds a one's-complement sum into a checksum (big-endian bytes).
#[inline(always)]
pub fn fold(mut sum: u32) -> [u8; 2] {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    (!(sum as u16)).to_be_bytes()
}

/// Copies `N` bytes of the packet from `off` into `buf` (a quote, worked on in the per-CPU
/// scratch: the stack is too small for it).
#[inline(always)]
pub(crate) fn load_quote<const N: usize>(
    ctx: &TcContext,
    off: usize,
    buf: &mut [u8; N],
) -> Result<(), Reason> {
    // SAFETY: the destination is N bytes of this CPU's scratch.
    let rc = unsafe {
        bpf_skb_load_bytes(
            ctx.skb.skb as *const core::ffi::c_void,
            off as u32,
            buf.as_mut_ptr() as *mut core::ffi::c_void,
            N as u32,
        )
    };
    if rc != 0 {
        return Err(Reason(R_REWRITE_FAILED));
    }
    Ok(())
}

/// The checksum diff of a quote going `old` → `new`, by the helper (a loop over a map value
/// at a variable index is refused without CAP_PERFMON).
#[inline(always)]
pub(crate) fn quote_diff<const N: usize>(
    old: &mut [u8; N],
    new: &mut [u8; N],
) -> Result<u32, Reason> {
    // SAFETY: both buffers are N bytes, 4-aligned in the scratch map value.
    let diff = unsafe {
        bpf_csum_diff(
            old.as_mut_ptr() as *mut u32,
            N as u32,
            new.as_mut_ptr() as *mut u32,
            N as u32,
            0,
        )
    };
    if diff < 0 {
        return Err(Reason(R_REWRITE_FAILED));
    }
    Ok(diff as u32)
}

/// The RST answering a TCP segment (`tcp`: its header; `l4_len`: its length, header
/// included), as a stack answers one to a closed port: its sequence and acknowledgement
/// numbers and its flags (RST, or RST|ACK for a segment without ACK). A RST is never
/// answered: dropped (`no_backend`).
#[inline(always)]
pub(crate) fn rst_for(tcp: &[u8; 20], l4_len: u32) -> Result<([u8; 4], [u8; 4], u8), Reason> {
    if tcp[13] & 0x04 != 0 {
        return Err(Reason(R_NO_BACKEND));
    }
    let doff = ((tcp[12] >> 4) as u32) * 4;
    let flags = tcp[13];
    let mut seg = l4_len.saturating_sub(doff);
    if flags & 0x02 != 0 {
        seg += 1; // SYN
    }
    if flags & 0x01 != 0 {
        seg += 1; // FIN
    }
    Ok(if flags & 0x10 != 0 {
        ([tcp[8], tcp[9], tcp[10], tcp[11]], [0u8; 4], 0x04u8)
    } else {
        let s = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]).wrapping_add(seg);
        ([0u8; 4], s.to_be_bytes(), 0x14u8) // RST|ACK
    })
}

/// An IPv4 header (no options) from `src` to `dst` with a valid checksum.
#[inline(always)]
fn ip_header(src: [u8; 4], dst: [u8; 4], proto: u8, total: u16) -> [u8; 20] {
    let t = total.to_be_bytes();
    let mut h = [
        0x45, 0, t[0], t[1], 0, 0, 0x40, 0, 64, proto, 0, 0, src[0], src[1], src[2], src[3],
        dst[0], dst[1], dst[2], dst[3],
    ];
    let c = fold(sum16(&h, 0));
    h[10] = c[0];
    h[11] = c[1];
    h
}

/// The Ethernet header of the answer: addresses swapped.
#[inline(always)]
pub(crate) fn eth_reply(ctx: &TcContext) -> Result<[u8; 14], Reason> {
    let e: [u8; 14] = ctx.load(0).map_err(failed)?;
    Ok([
        e[6], e[7], e[8], e[9], e[10], e[11], e[0], e[1], e[2], e[3], e[4], e[5], e[12], e[13],
    ])
}

/// Rewrites the packet into the refusal and redirects it back; returns the tc action.
/// `back`: the redirect's flags: 0 at tc ingress (back out of the interface it came in
/// on), `BPF_F_INGRESS` at tc egress (into the node's stack: the node's own packet).
#[inline(always)]
pub fn refuse(ctx: &TcContext, t: &Tuple, back: u64) -> Result<i32, Reason> {
    if t.l4_off != ETH_HLEN + 20 {
        // IP options: too rare to answer; drop, as a timeout would.
        return Err(Reason(R_NO_BACKEND));
    }
    let eth = eth_reply(ctx)?;
    let ip: [u8; 20] = ctx.load(ETH_HLEN).map_err(failed)?;
    let client = [ip[12], ip[13], ip[14], ip[15]];
    let vip = [ip[16], ip[17], ip[18], ip[19]];
    if t.proto == IPPROTO_TCP {
        tcp_rst(ctx, t, &eth, &ip, client, vip)?;
    } else {
        icmp_unreachable(ctx, &eth, client, vip, ICMP_PORT_UNREACH, 0)?;
    }
    send_back(ctx, back)
}

/// Answers a packet too big for its route (DF set) with ICMP fragmentation needed, from the
/// frontend the client addressed, quoting the packet as the client sent it: the client's
/// path-MTU discovery sees the service, not the translated flow. Returns the tc action.
#[inline(always)]
pub fn frag_needed(ctx: &TcContext, t: &Tuple, mtu: u16) -> Result<i32, Reason> {
    if t.l4_off != ETH_HLEN + 20 {
        return Err(Reason(R_FRAG_NEEDED));
    }
    let eth = eth_reply(ctx)?;
    let ip: [u8; 20] = ctx.load(ETH_HLEN).map_err(failed)?;
    let client = [ip[12], ip[13], ip[14], ip[15]];
    let vip = [ip[16], ip[17], ip[18], ip[19]];
    icmp_unreachable(ctx, &eth, client, vip, ICMP_FRAG_NEEDED, mtu)?;
    send_back(ctx, 0)
}

/// Sends the rewritten packet back out of the interface it came in on (`flags` 0), or
/// into the node's stack from it (`BPF_F_INGRESS`: an answer to the node's own packet).
#[inline(always)]
pub(crate) fn send_back(ctx: &TcContext, flags: u64) -> Result<i32, Reason> {
    // SAFETY: reading the ifindex field of the context the kernel passed us.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    // SAFETY: helper on our own skb.
    let action = unsafe { bpf_redirect(ifindex, flags) };
    if action != TC_ACT_REDIRECT as i64 {
        return Err(Reason(R_REWRITE_FAILED));
    }
    Ok(action as i32)
}

#[inline(always)]
fn tcp_rst(
    ctx: &TcContext,
    t: &Tuple,
    eth: &[u8; 14],
    ip: &[u8; 20],
    client: [u8; 4],
    vip: [u8; 4],
) -> Result<(), Reason> {
    let tcp: [u8; 20] = ctx.load(t.l4_off).map_err(failed)?;
    let total = u16::from_be_bytes([ip[2], ip[3]]) as u32;
    let (seq, ack, out_flags) = rst_for(&tcp, total.saturating_sub(20))?;
    let mut rst = [
        tcp[2], tcp[3], tcp[0], tcp[1], seq[0], seq[1], seq[2], seq[3], ack[0], ack[1], ack[2],
        ack[3], 0x50, out_flags, 0, 0, 0, 0, 0, 0,
    ];
    let pseudo = sum16(&vip, sum16(&client, 0)) + IPPROTO_TCP as u32 + 20;
    let c = fold(sum16(&rst, pseudo));
    rst[16] = c[0];
    rst[17] = c[1];
    let len = (ETH_HLEN + 40) as u32;
    // SAFETY: helper on our own skb; packet pointers are not used afterwards.
    if unsafe { bpf_skb_change_tail(ctx.skb.skb, len, 0) } != 0 {
        return Err(Reason(R_REWRITE_FAILED));
    }
    ctx.store(0, eth, 0).map_err(failed)?;
    ctx.store(ETH_HLEN, &ip_header(vip, client, IPPROTO_TCP, 40), 0)
        .map_err(failed)?;
    ctx.store(ETH_HLEN + 20, &rst, 0).map_err(failed)
}

#[inline(always)]
fn icmp_unreachable(
    ctx: &TcContext,
    eth: &[u8; 14],
    client: [u8; 4],
    vip: [u8; 4],
    code: u8,
    mtu: u16,
) -> Result<(), Reason> {
    let quote: [u8; QUOTE] = ctx.load(ETH_HLEN).map_err(failed)?;
    // Type 3 (destination unreachable); the next-hop MTU for code 4 (fragmentation needed).
    let m = mtu.to_be_bytes();
    let mut icmp = [3u8, code, 0, 0, 0, 0, m[0], m[1]];
    let c = fold(sum16(&quote, sum16(&icmp, 0)));
    icmp[2] = c[0];
    icmp[3] = c[1];
    let len = (ETH_HLEN + 20 + 8 + QUOTE) as u32;
    // SAFETY: helper on our own skb; packet pointers are not used afterwards.
    if unsafe { bpf_skb_change_tail(ctx.skb.skb, len, 0) } != 0 {
        return Err(Reason(R_REWRITE_FAILED));
    }
    ctx.store(0, eth, 0).map_err(failed)?;
    ctx.store(
        ETH_HLEN,
        &ip_header(vip, client, IPPROTO_ICMP, (20 + 8 + QUOTE) as u16),
        0,
    )
    .map_err(failed)?;
    ctx.store(ETH_HLEN + 20, &icmp, 0).map_err(failed)?;
    ctx.store(ETH_HLEN + 28, &quote, 0).map_err(failed)
}
