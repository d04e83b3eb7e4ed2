//! XDP's IPv6 path: as `xdp.rs` for IPv4, a packet of a tracked flow, a reply of one and a
//! new flow whose route is ready are translated here (the steps shared with tc's IPv6 path)
//! and redirected out of their egress interface when it takes XDP frames (both sides), else
//! passed to the stack with their destination side translated (tc egress does the source). Everything else (ICMPv6, refusals, Packet Too Big, unresolved
//! neighbours, re-balanced flows, checksums still partial) passes untouched, for tc.

use aya_ebpf::{
    bindings::xdp_action::{XDP_PASS, XDP_REDIRECT},
    programs::XdpContext,
};
use lb_common::{
    CtValue6, IPPROTO_UDP, R_ESTABLISHED, R_MALFORMED, R_NEW_FLOW, R_PASS, R_REPLY_IN,
    R_REVERSE_NAT, R_REWRITE_FAILED, R_XDP_REDIRECT, SvcValue, filter_fold,
};

use super::{
    UNDECIDED, choose, conntrack, fib, frontend, is_loopback, keep_alive,
    maps::FlowScratch6,
    nat,
    parse::{self, IP6_L4_OFF, Parsed6, Tuple6},
    record,
};
use crate::{
    conntrack::{continues, touch},
    filter,
    maps::XLB_XDPTX_V1,
    nat::BOTH,
    packet::{Packet, at},
    parse::ETH_HLEN,
    reason::{self, Carried, Reason, Then},
    select,
    work::Work6,
    xdp::{csum_at, write_macs},
};

type XdpOutcome = reason::Outcome<u32>;

/// Offset of the hop limit in the fixed header.
const HOP_LIMIT_OFF: usize = ETH_HLEN + 7;

#[inline(always)]
fn pass(reason: u32) -> XdpOutcome {
    Ok((XDP_PASS, Reason(reason)))
}

/// An IPv6 frame at XDP. `w`: the run's IPv6 work area (the frame is parsed into it).
#[inline(never)]
pub fn xdp(ctx: &XdpContext, w: &mut Work6) -> Carried {
    match parse::parse6(ctx, &mut w.pkt) {
        Ok(Parsed6::Flow) => {}
        Ok(Parsed6::Icmp) => return Carried::done(pass(R_PASS)),
        Ok(Parsed6::Pass(r)) => return Carried::done::<u32>(Ok((XDP_PASS, r))),
        Err(r) => return Carried::done::<u32>(Err(r)),
    }
    match checksum_partial(ctx, &w.pkt) {
        Ok(false) => {}
        Ok(true) => return Carried::done(pass(R_PASS)),
        Err(r) => return Carried::done::<u32>(Err(r)),
    }
    match tracked(ctx, w).outcome::<u32>() {
        Ok((a, _)) if a == UNDECIDED as u32 => {}
        o => return Carried::done(o),
    }
    let t = &w.pkt;
    if is_loopback(&t.daddr_be) || !filter::maybe_frontend(filter_fold(&t.daddr_be)) {
        return Carried::done(pass(R_PASS));
    }
    let Some(svc) = select::lookup(&frontend(t)) else {
        return Carried::done(pass(R_PASS));
    };
    if svc.count == 0 {
        // Refused or dropped by tc, which builds the answer.
        return Carried::done(pass(R_PASS));
    }
    match choose(w, svc, R_NEW_FLOW).next::<i32>() {
        Then::Done(Ok((UNDECIDED, _))) => {}
        Then::Done(Err(r)) => return Carried::done::<u32>(Err(r)),
        _ => return Carried::done(pass(R_PASS)),
    }
    match start(ctx, w, svc).outcome::<u32>() {
        Ok((a, _)) if a == UNDECIDED as u32 => send_new(ctx, w),
        o => Carried::done(o),
    }
}

/// Sends the first packet of the flow just recorded on (the scratch's forward tuple).
#[inline(never)]
fn send_new(ctx: &XdpContext, w: &Work6) -> Carried {
    Carried::done(finish(ctx, &w.pkt, &w.flow.fwd, R_NEW_FLOW))
}

/// A packet of a tracked flow or a reply of one; else `UNDECIDED`.
#[inline(never)]
fn tracked(ctx: &XdpContext, w: &mut Work6) -> Carried {
    Carried::done(try_tracked(ctx, &w.pkt, &mut w.flow))
}

#[inline(always)]
fn try_tracked(ctx: &XdpContext, t: &Tuple6, s: &mut FlowScratch6) -> XdpOutcome {
    let frontend = filter::maybe_frontend(filter_fold(&t.daddr_be));
    if let Some(ct) = frontend.then(|| conntrack::lookup_forward(t)).flatten() {
        if !continues(ct, t) {
            // Re-balanced or started over: tc does it.
            return pass(R_PASS);
        }
        let ct = keep_alive(ct, t, s);
        return finish(ctx, t, ct, R_ESTABLISHED);
    }
    if let Some(ct) = filter::maybe_backend(filter_fold(&t.saddr_be))
        .then(|| conntrack::lookup_reply(t))
        .flatten()
    {
        touch(ct, t);
        return finish(ctx, t, ct, R_REVERSE_NAT);
    }
    Ok((UNDECIDED as u32, Reason(R_NEW_FLOW)))
}

/// A new flow to the backend `choose` put in the scratch, when its route is ready (the
/// neighbour known, the packet fits): recorded (`UNDECIDED`: [`send_new`] sends it on);
/// else left to tc.
#[inline(never)]
fn start(ctx: &XdpContext, w: &mut Work6, svc: &SvcValue) -> Carried {
    Carried::done(try_start(ctx, &w.pkt, svc, &mut w.flow))
}

#[inline(always)]
fn try_start(ctx: &XdpContext, t: &Tuple6, svc: &SvcValue, s: &mut FlowScratch6) -> XdpOutcome {
    let len = (40 + t.payload_len) as u16;
    match fib::hop(
        ctx.raw(),
        Packet::ingress_ifindex(ctx),
        t.proto,
        &t.saddr_be,
        &s.backend.addr_be,
        len,
    ) {
        Some(_) => {}
        None => return pass(R_PASS),
    }
    record(ctx, t, svc, 0, s)?;
    Ok((UNDECIDED as u32, Reason(R_NEW_FLOW)))
}

/// Sends a packet of a tracked flow on, rewritten to `v` (as IPv4's `xdp::finish`).
#[inline(always)]
fn finish(ctx: &XdpContext, t: &Tuple6, v: &CtValue6, reason: u32) -> XdpOutcome {
    let Some(hop) = fib::hop(
        ctx.raw(),
        Packet::ingress_ifindex(ctx),
        t.proto,
        &v.saddr_be,
        &v.daddr_be,
        (40 + t.payload_len) as u16,
    ) else {
        return pass(R_PASS);
    };
    let hop_limit = read_hop_limit(ctx, t)?;
    if hop_limit <= 1 {
        // The kernel answers time exceeded; XDP must not forward it.
        return pass(R_PASS);
    }
    let ifindex = hop.out_ifindex;
    if XLB_XDPTX_V1.get_ifindex(ifindex).is_none() {
        // Into the stack with the destination side only, as IPv4's `xdp::into_stack`.
        if reason == R_REVERSE_NAT {
            nat::reply_in(ctx, t, v)?;
            return pass(R_REPLY_IN);
        }
        nat::forward_in(ctx, t, v)?;
        reason::count_service(v.svc_id, v.backend_id, Packet::len(ctx));
        return pass(reason);
    }
    nat::apply::<_, { BOTH }>(ctx, t, v)?;
    reason::count_service(v.svc_id, v.backend_id, Packet::len(ctx));
    forward_l2(ctx, t, hop_limit, &hop.smac, &hop.dmac)?;
    match XLB_XDPTX_V1.redirect(ifindex, XDP_PASS as u64) {
        Ok(action) if action == XDP_REDIRECT => Ok((XDP_REDIRECT, Reason(R_XDP_REDIRECT))),
        _ => pass(reason),
    }
}

/// The hop limit: in place for the common packet, else through the load helper.
#[inline(always)]
fn read_hop_limit(ctx: &XdpContext, t: &Tuple6) -> Result<u8, Reason> {
    if t.direct != 0
        && let Some(p) = at::<_, [u8; IP6_L4_OFF]>(ctx, 0)
    {
        // SAFETY: `at` checked the bytes.
        return Ok(unsafe { *(p as *const u8).add(HOP_LIMIT_OFF) });
    }
    ctx.load(HOP_LIMIT_OFF).map_err(|_| Reason(R_MALFORMED))
}

/// Forwarded here, not by the kernel: the hop limit goes down by one (no IPv6 header
/// checksum), the frame gets the next hop's MACs; in place for the common packet.
#[inline(always)]
fn forward_l2(
    ctx: &XdpContext,
    t: &Tuple6,
    hop_limit: u8,
    smac: &[u8; 6],
    dmac: &[u8; 6],
) -> Result<(), Reason> {
    if t.direct != 0
        && let Some(p) = at::<_, [u8; IP6_L4_OFF]>(ctx, 0)
    {
        let p = p as *mut u8;
        // SAFETY: every offset written is within the IP6_L4_OFF bytes `at` checked.
        unsafe {
            *p.add(HOP_LIMIT_OFF) = hop_limit - 1;
            write_macs(p, smac, dmac);
        }
        return Ok(());
    }
    let fail = |_| Reason(R_REWRITE_FAILED);
    ctx.store(HOP_LIMIT_OFF, &(hop_limit - 1)).map_err(fail)?;
    ctx.store(0, dmac).map_err(fail)?;
    ctx.store(6, smac).map_err(fail)
}

/// The L4 checksum field as it sits in the packet (in place for the common packet).
#[inline(always)]
fn read_l4_csum(ctx: &XdpContext, t: &Tuple6) -> Result<u16, Reason> {
    if t.direct != 0 {
        let v = if t.proto == IPPROTO_UDP {
            csum_at::<{ IP6_L4_OFF + 6 }>(ctx)
        } else {
            csum_at::<{ IP6_L4_OFF + 16 }>(ctx)
        };
        if v <= u16::MAX as u32 {
            return Ok(v as u16);
        }
    }
    ctx.load(t.csum_off as usize)
        .map_err(|_| Reason(R_MALFORMED))
}

/// Whether the L4 checksum is still partial (the field holds the folded pseudo-header sum
/// for offload to complete), as IPv4's check.
#[inline(always)]
fn checksum_partial(ctx: &XdpContext, t: &Tuple6) -> Result<bool, Reason> {
    let csum = read_l4_csum(ctx, t)?;
    if t.proto == IPPROTO_UDP && csum == 0 {
        return Ok(false);
    }
    let l4_len = t.payload_len - (t.l4_off - IP6_L4_OFF as u32);
    let mut sum = super::reject::pseudo(&t.saddr_be, &t.daddr_be, l4_len, t.proto);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    Ok(u16::from_be(csum) == sum as u16)
}
