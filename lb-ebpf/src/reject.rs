//! Answers built in place of the packet and sent back out of the interface it came in on,
//! one code for both families: refusing a connection to a service without endpoints, as
//! kube-proxy's REJECT does (a TCP segment answered with a RST, anything else with ICMP /
//! ICMPv6 port unreachable), and fragmentation needed / Packet Too Big for a packet too big
//! for the route to its backend (path-MTU discovery through the service).
//!
//! Each family's leaf gives what differs ([`Family`]): the ICMP protocol, types and codes,
//! the IP header of the answer, the sum its checksums start from (the pseudo-header; none
//! for IPv4's ICMP). The one's-complement sums here are also IPv4's header checksums'.

use aya_ebpf::{
    bindings::TC_ACT_REDIRECT,
    helpers::{bpf_redirect, bpf_skb_change_tail},
    programs::TcContext,
};
use lb_common::{IPPROTO_TCP, R_FRAG_NEEDED, R_NO_BACKEND, R_REWRITE_FAILED};

use crate::{family::Family, parse::ETH_HLEN, quote::Quote, reason::Reason};

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

/// The Ethernet header of the answer: addresses swapped.
#[inline(always)]
pub(crate) fn eth_reply(ctx: &TcContext) -> Result<[u8; 14], Reason> {
    let e: [u8; 14] = ctx.load(0).map_err(failed)?;
    Ok([
        e[6], e[7], e[8], e[9], e[10], e[11], e[0], e[1], e[2], e[3], e[4], e[5], e[12], e[13],
    ])
}

/// Rewrites the packet into the refusal and redirects it back; returns the tc action: a TCP
/// segment answered with a RST, anything else with port unreachable quoting the packet's
/// first `Q` bytes (loaded into `quote`, the scratch's: off the stack). `back`: the
/// redirect's flags: 0 at tc ingress (back out of the interface it came in on),
/// `BPF_F_INGRESS` at tc egress (into the node's stack: the node's own packet).
#[inline(always)]
pub fn refuse<F: Family, const Q: usize>(
    ctx: &TcContext,
    t: &F,
    quote: &mut [u8; Q],
    back: u64,
) -> Result<i32, Reason> {
    if t.proto() == IPPROTO_TCP {
        tcp_rst(ctx, t)?;
    } else {
        icmp_error(ctx, t, F::PORT_UNREACH, 0, quote)?;
    }
    send_back(ctx, back)
}

/// Answers a packet too big for its route with fragmentation needed / Packet Too Big
/// (`mtu`) from the frontend the client addressed, quoting the packet as the client sent it
/// (built in `quote`): the client's path-MTU discovery sees the service, not the translated
/// flow. Returns the tc action.
#[inline(always)]
pub fn too_big<F: Family, const Q: usize>(
    ctx: &TcContext,
    t: &F,
    mtu: u16,
    quote: &mut [u8; Q],
) -> Result<i32, Reason> {
    if !t.plain() {
        // IP options or extension headers: the quote would not reach the ports; dropped, as
        // a router without an answer would.
        return Err(Reason(R_FRAG_NEEDED));
    }
    icmp_error(ctx, t, F::TOO_BIG, mtu as u32, quote)?;
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

/// Resizes the packet to the answer's `payload` bytes of `proto` and writes its Ethernet
/// (addresses swapped) and IP headers (from the frontend to the client).
#[inline(always)]
fn headers<F: Family>(ctx: &TcContext, t: &F, proto: u8, payload: u16) -> Result<(), Reason> {
    let eth = eth_reply(ctx)?;
    let len = (F::L4_OFF + payload as usize) as u32;
    // SAFETY: helper on our own skb; packet pointers are not used afterwards.
    if unsafe { bpf_skb_change_tail(ctx.skb.skb, len, 0) } != 0 {
        return Err(Reason(R_REWRITE_FAILED));
    }
    ctx.store(0, &eth, 0).map_err(failed)?;
    t.answer_header(ctx, proto, payload)
}

#[inline(always)]
fn tcp_rst<F: Family>(ctx: &TcContext, t: &F) -> Result<(), Reason> {
    let tcp: [u8; 20] = ctx.load(t.l4_off()).map_err(failed)?;
    let (seq, ack, out_flags) = rst_for(&tcp, t.l4_len())?;
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
    let c = fold(sum16(bytes, t.answer_sum(IPPROTO_TCP, 20)));
    // SAFETY: in bounds.
    unsafe { core::ptr::write_volatile(&mut rst[4], u32::from_ne_bytes([c[0], c[1], 0, 0])) };
    headers(ctx, t, IPPROTO_TCP, 20)?;
    ctx.store(F::L4_OFF, &rst, 0).map_err(failed)
}

/// An ICMP error of `kind` (type, code; `rest`: the word after the checksum) quoting the
/// packet's first `Q` bytes (loaded into `quote`).
#[inline(always)]
fn icmp_error<F: Family, const Q: usize>(
    ctx: &TcContext,
    t: &F,
    kind: (u8, u8),
    rest: u32,
    quote: &mut [u8; Q],
) -> Result<(), Reason> {
    if !t.plain() {
        return Err(Reason(R_NO_BACKEND));
    }
    quote.load(ctx, ETH_HLEN)?;
    let (kind, code) = kind;
    // Two words, written volatile: as bytes, the zeros of a code 0 and a small MTU merge
    // into a `memset` byte loop the verifier refuses without CAP_PERFMON.
    let mut icmp = [0u32; 2];
    // SAFETY: both indices are in bounds.
    unsafe {
        core::ptr::write_volatile(&mut icmp[0], u32::from_ne_bytes([kind, code, 0, 0]));
        core::ptr::write_volatile(&mut icmp[1], rest.to_be());
    }
    let len = (8 + Q) as u32;
    let sum = t.answer_sum(F::ICMP_PROTO, len);
    // SAFETY: two u32 are eight bytes.
    let bytes = unsafe { &*(icmp.as_ptr() as *const [u8; 8]) };
    let c = fold(sum16(quote, sum16(bytes, sum)));
    // SAFETY: as above.
    unsafe {
        core::ptr::write_volatile(&mut icmp[0], u32::from_ne_bytes([kind, code, c[0], c[1]]))
    };
    headers(ctx, t, F::ICMP_PROTO, len as u16)?;
    ctx.store(F::L4_OFF, &icmp, 0).map_err(failed)?;
    ctx.store(F::L4_OFF + 8, quote, 0).map_err(failed)
}
