//! XDP's IPv6 path: as `xdp.rs` for IPv4, a packet of a tracked flow, a reply of one and a
//! new flow whose route is ready are translated here (the steps shared with tc's IPv6 path)
//! and redirected out of their egress interface when it takes XDP frames (both sides), else
//! passed to the stack with their destination side translated (tc egress does the source);
//! the way out, once found, is kept in the flow's entry (`CT_F_XDP_STACK`), as IPv4's.
//! Everything else (ICMPv6, refusals, Packet Too Big, unresolved neighbours, re-balanced
//! flows, checksums still partial) passes untouched, for tc.

use aya_ebpf::{bindings::xdp_action::XDP_PASS, programs::XdpContext};
use lb_common::{
    BE_F_REMOTE, CT_F_XDP_STACK, CtValue6, IPPROTO_SCTP, IPPROTO_UDP, R_ESTABLISHED, R_MALFORMED,
    R_NEW_FLOW, R_PASS, R_REPLY_IN, R_REVERSE_NAT, R_REWRITE_FAILED, SCOPE_EXTERNAL, SvcValue,
    filter_fold,
};

use super::{
    conntrack, fib,
    maps::FlowScratch6,
    parse::{self, IP6_L4_OFF, Parsed6, Tuple6},
};
use crate::{
    conntrack::{Ct, continues, touch},
    family::{Ends, Family, Mtu, View},
    filter,
    flow::{self, keep_alive},
    ingress,
    maps::XLB_XDPTX_V1,
    nat::BOTH,
    packet::{Packet, at},
    parse::ETH_HLEN,
    reason::{self, Carried, Reason, Then},
    select,
    shared::Shared,
    work::Work6,
    xdp::{Hop, Way, csum_at, send_out, write_macs},
};

type XdpOutcome = reason::Outcome<u32>;

/// Offset of the hop limit in the fixed header.
const HOP_LIMIT_OFF: usize = ETH_HLEN + 7;

#[inline(always)]
fn pass(reason: u32) -> XdpOutcome {
    Ok((XDP_PASS, Reason(reason)))
}

/// An IPv6 frame of `len` bytes at XDP. `w`: the run's IPv6 work area (the frame is parsed
/// into it).
#[inline(never)]
pub fn xdp(ctx: &XdpContext, w: &mut Work6, len: u32) -> Carried {
    match parse::parse6(ctx, &mut w.pkt) {
        Ok(Parsed6::Flow) => {}
        Ok(Parsed6::Icmp) => return Carried::done(pass(R_PASS)),
        Ok(Parsed6::Pass(r)) => return Carried::done::<u32>(Ok((XDP_PASS, r))),
        Err(r) => return Carried::done::<u32>(Err(r)),
    }
    if w.pkt.proto == IPPROTO_SCTP {
        // Left to tc, as IPv4's (`xdp.rs`).
        return Carried::done(pass(R_PASS));
    }
    match tracked(ctx, w, len).next::<u32>() {
        Then::Next(_) => {}
        Then::Done(o) => return Carried::done(o),
        Then::Refuse | Then::FragNeeded(_) => return Carried::done(pass(R_PASS)),
    }
    let t = &w.pkt;
    if Tuple6::is_loopback(&t.daddr_be) || !filter::maybe_frontend(filter_fold(&t.daddr_be)) {
        return Carried::done(pass(R_PASS));
    }
    let Some(svc) = select::lookup(&t.frontend(SCOPE_EXTERNAL)) else {
        return Carried::done(pass(R_PASS));
    };
    if svc.count == 0 {
        // Refused or dropped by tc, which builds the answer.
        return Carried::done(pass(R_PASS));
    }
    match checksum_partial(ctx, t) {
        Ok(false) => {}
        Ok(true) => return Carried::done(pass(R_PASS)),
        Err(r) => return Carried::done::<u32>(Err(r)),
    }
    match ingress::choose(&w.pkt, svc, R_NEW_FLOW, SCOPE_EXTERNAL, &mut w.flow).next::<i32>() {
        Then::Next(_) => {}
        Then::Done(Err(r)) => return Carried::done::<u32>(Err(r)),
        _ => return Carried::done(pass(R_PASS)),
    }
    match start(ctx, w, svc).next::<u32>() {
        Then::Next(_) => send_new(ctx, w, len),
        Then::Done(o) => Carried::done(o),
        Then::Refuse | Then::FragNeeded(_) => Carried::done(pass(R_PASS)),
    }
}

/// Sends the first packet of the flow just recorded on (the scratch's forward tuple): into
/// the stack when its entry says so, else by its route.
#[inline(never)]
fn send_new(ctx: &XdpContext, w: &mut Work6, len: u32) -> Carried {
    Carried::done(try_send_new(
        ctx,
        &w.pkt,
        &Shared::local(&mut w.flow.fwd),
        len,
    ))
}

#[inline(always)]
fn try_send_new(ctx: &XdpContext, t: &Tuple6, v: &Shared<'_, CtValue6>, len: u32) -> XdpOutcome {
    if v.flags() & CT_F_XDP_STACK == 0 {
        match way(ctx, t, v) {
            Way::Redirect(hop) => return redirect(ctx, t, v, &hop, R_NEW_FLOW, len),
            Way::Tc => return pass(R_PASS),
            Way::Stack => {}
        }
    }
    crate::nat::forward_in(ctx, t, v)?;
    reason::count_service(v.svc_id(), v.backend().0, len);
    pass(R_NEW_FLOW)
}

/// A packet of a tracked flow or a reply of one; else [`Then::Next`].
#[inline(never)]
fn tracked(ctx: &XdpContext, w: &mut Work6, len: u32) -> Carried {
    Carried::then(try_tracked(ctx, &w.pkt, &mut w.flow, len))
}

#[inline(always)]
fn try_tracked(
    ctx: &XdpContext,
    t: &Tuple6,
    s: &mut FlowScratch6,
    len: u32,
) -> Result<Then<u32>, Reason> {
    let forward = if filter::maybe_frontend(filter_fold(&t.daddr_be)) {
        conntrack::lookup_forward(t)
    } else {
        None
    };
    let reply = if forward.is_none() && filter::maybe_backend(filter_fold(&t.saddr_be)) {
        conntrack::lookup_reply(t)
    } else {
        None
    };
    if forward.is_none() && reply.is_none() {
        return Ok(Then::Next(Reason(R_NEW_FLOW)));
    }
    if checksum_partial(ctx, t)? {
        return Ok(Then::Done(pass(R_PASS)));
    }
    if let Some(ct) = forward {
        if !continues(&ct, t) {
            // Re-balanced or started over: tc does it.
            return Ok(Then::Done(pass(R_PASS)));
        }
        return Ok(Then::Done(try_established(ctx, t, ct, s, len)));
    }
    Ok(Then::Done(match reply {
        Some(ct) => {
            touch(&ct, t);
            try_reply_of(ctx, t, ct, len)
        }
        None => pass(R_PASS),
    }))
}

/// A packet of a tracked flow to its backend, as IPv4's `xdp::established`: tc's steps into
/// the stack when the entry says so (no route lookup), else by its route. Inline in
/// [`tracked`]: a frame of its own would make the call chain too deep for the 512 bytes.
#[inline(always)]
fn try_established(
    ctx: &XdpContext,
    t: &Tuple6,
    ct: Ct<Tuple6>,
    s: &mut FlowScratch6,
    len: u32,
) -> XdpOutcome {
    // A DSR packet that carries the frontend to the backend's node: tc adds the header.
    if ct.flags() & lb_common::CT_F_DSR != 0 && crate::dsr::carries(t) {
        return pass(R_PASS);
    }
    if ct.flags() & CT_F_XDP_STACK == 0 {
        match way(ctx, t, &ct) {
            Way::Tc => return pass(R_PASS),
            Way::Redirect(hop) => {
                let ct = keep_alive(ct, t, s)?;
                return redirect(ctx, t, &ct, &hop, R_ESTABLISHED, len);
            }
            Way::Stack => {
                ct.add_flags(CT_F_XDP_STACK);
                // The route lookup has just checked this size.
                ct.set_mtu(ct.mtu().max((40 + t.payload_len) as u16));
            }
        }
    }
    match fib::check_mtu(ctx, t, ct.daddr(), ct.mtu(), 0) {
        Mtu::TooBig(_) => return pass(R_PASS),
        Mtu::Fits(len) => ct.set_mtu(len),
        Mtu::Unchecked => {}
    }
    let ct = keep_alive(ct, t, s)?;
    crate::nat::forward_in(ctx, t, &ct)?;
    reason::count_service(ct.svc_id(), ct.backend().0, len);
    pass(R_ESTABLISHED)
}

/// A backend's reply of a tracked flow (already touched), as IPv4's `xdp::reply_of`; inline
/// in [`tracked`] too.
#[inline(always)]
fn try_reply_of(ctx: &XdpContext, t: &Tuple6, ct: Ct<Tuple6>, len: u32) -> XdpOutcome {
    if ct.flags() & CT_F_XDP_STACK == 0 {
        match way(ctx, t, &ct) {
            Way::Tc => return pass(R_PASS),
            Way::Redirect(hop) => return redirect(ctx, t, &ct, &hop, R_REVERSE_NAT, len),
            Way::Stack => ct.add_flags(CT_F_XDP_STACK),
        }
    }
    crate::nat::reply_in(ctx, t, &ct)?;
    pass(R_REPLY_IN)
}

/// A new flow to the backend `choose` put in the scratch, as IPv4's: to a backend on this
/// node into the stack (tc's MTU check, no route lookup); to a remote one by its route when
/// that is ready (the neighbour known, the packet fits). Recorded ([`Then::Next`]:
/// [`send_new`] sends it on); else left to tc.
#[inline(never)]
fn start(ctx: &XdpContext, w: &mut Work6, svc: &SvcValue) -> Carried {
    Carried::then(try_start(ctx, &w.pkt, svc, &mut w.flow))
}

#[inline(always)]
fn try_start(
    ctx: &XdpContext,
    t: &Tuple6,
    svc: &SvcValue,
    s: &mut FlowScratch6,
) -> Result<Then<u32>, Reason> {
    // Direct server return: tc adds the header (room in front of the payload).
    if crate::dsr::applies(t, svc, &s.chosen.backend) {
        return Ok(Then::Done(pass(R_PASS)));
    }
    let len = (40 + t.payload_len) as u16;
    let (mtu, flags) = if s.chosen.backend.flags & BE_F_REMOTE == 0 {
        match fib::check_mtu(ctx, t, &s.chosen.backend.addr_be, 0, 0) {
            Mtu::TooBig(_) => return Ok(Then::Done(pass(R_PASS))),
            Mtu::Fits(fits) => (fits, CT_F_XDP_STACK),
            Mtu::Unchecked => (0, CT_F_XDP_STACK),
        }
    } else {
        match fib::hop(
            ctx.raw(),
            Packet::ingress_ifindex(ctx),
            t.proto,
            &t.saddr_be,
            &s.chosen.backend.addr_be,
            len,
        ) {
            Some(hop) if XLB_XDPTX_V1.get_ifindex(hop.out_ifindex).is_none() => {
                (len, CT_F_XDP_STACK)
            }
            Some(_) => (len, 0),
            None => return Ok(Then::Done(pass(R_PASS))),
        }
    };
    flow::record(ctx, t, svc, mtu, flags, s)?;
    Ok(Then::Next(Reason(R_NEW_FLOW)))
}

/// The way out of a packet of `t` rewritten to `v`, by its route (cached per CPU).
#[inline(always)]
fn way(ctx: &XdpContext, t: &Tuple6, v: &Shared<'_, CtValue6>) -> Way {
    let Some(hop) = fib::hop(
        ctx.raw(),
        Packet::ingress_ifindex(ctx),
        t.proto,
        v.saddr(),
        v.daddr(),
        (40 + t.payload_len) as u16,
    ) else {
        return Way::Tc;
    };
    Way::out(hop.out_ifindex, &hop.smac, &hop.dmac)
}

/// Both sides translated, the hop limit down by one, the next hop's MACs, out of `hop`'s
/// interface (as IPv4's `xdp::redirect`).
#[inline(always)]
fn redirect(
    ctx: &XdpContext,
    t: &Tuple6,
    v: &Shared<'_, CtValue6>,
    hop: &Hop,
    reason: u32,
    len: u32,
) -> XdpOutcome {
    let hop_limit = read_hop_limit(ctx, t)?;
    if hop_limit <= 1 {
        // The kernel answers time exceeded; XDP must not forward it.
        return pass(R_PASS);
    }
    super::nat::apply::<_, { BOTH }>(ctx, t, v)?;
    reason::count_service(v.svc_id(), v.backend().0, len);
    forward_l2(ctx, t, hop_limit, &hop.smac, &hop.dmac)?;
    send_out(hop.ifindex, reason)
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
