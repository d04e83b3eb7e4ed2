//! The node's own IPv6 SCTP associations to a frontend, at tc egress: as IPv4's
//! (`out_dnat.rs`), with the IPv6 path's steps (`choose`, `record`) and route lookup.

use aya_ebpf::{bindings::BPF_F_INGRESS, programs::TcContext};
use lb_common::{
    CT_F_OUT_DNAT, IPPROTO_SCTP, R_BACKEND_GONE, R_ESTABLISHED, R_NEW_FLOW, R_PASS,
    R_REWRITE_FAILED, SCOPE_EXTERNAL, SCOPE_INTERNAL, SVC_F_TWO_SCOPES, SvcValue,
};

use super::{
    fib,
    maps::FlowScratch6,
    parse::{Parsed6, Tuple6, parse6},
};
use crate::{
    conntrack::continues,
    family::{Ends, Family, View},
    flow::{self, keep_alive},
    ingress,
    out_dnat::redirect,
    packet::Packet,
    reason::{self, Carried, Outcome, Reason, Then},
    select,
    work::Work6,
};

/// The node's own IPv6 SCTP packet to a frontend (tc egress; the packet parsed into `w`):
/// its tracked flow's backend, or a new flow's; refused into the node's stack without
/// endpoints. Each step is out of line, as at ingress.
#[inline(never)]
pub fn flow(ctx: &TcContext, w: &mut Work6) -> Carried {
    // Parsed again: the egress steps' frame is gone.
    match parse6(ctx, &mut w.pkt) {
        Ok(Parsed6::Flow) if w.pkt.proto == IPPROTO_SCTP => {}
        _ => return Carried::done::<i32>(Ok((0, Reason(R_PASS)))),
    }
    let reason = match tracked(ctx, w).next::<i32>() {
        Then::Next(r) => r.0,
        Then::Done(o) => return Carried::done(o),
        Then::Refuse | Then::FragNeeded(_) => return Carried::done::<i32>(Ok((0, Reason(R_PASS)))),
    };
    if Tuple6::is_loopback(&w.pkt.daddr_be) {
        return Carried::done::<i32>(Ok((0, Reason(R_PASS))));
    }
    let mut front = w.pkt.frontend(SCOPE_EXTERNAL);
    let Some(mut svc) = select::lookup(&front) else {
        return Carried::done::<i32>(Ok((0, Reason(R_PASS))));
    };
    // Its internal scope when it has one, as the socket hooks take it.
    let mut scope = SCOPE_EXTERNAL;
    if svc.flags & SVC_F_TWO_SCOPES != 0 {
        front.scope = SCOPE_INTERNAL;
        if let Some(inner) = select::lookup(&front) {
            svc = inner;
            scope = SCOPE_INTERNAL;
        }
    }
    match ingress::choose(&w.pkt, svc, reason, scope, &mut w.flow).next::<i32>() {
        Then::Next(_) => {}
        Then::Done(o) => return Carried::done(o),
        Then::Refuse => return ingress::refuse(ctx, &w.pkt, &mut w.flow, BPF_F_INGRESS as u64),
        Then::FragNeeded(_) => return Carried::done::<i32>(Ok((0, Reason(R_PASS)))),
    }
    start(ctx, w, svc, reason)
}

/// A packet of the node's tracked flow: rewritten and redirected; else [`Then::Next`] with
/// the reason its new flow is counted under.
#[inline(never)]
fn tracked(ctx: &TcContext, w: &mut Work6) -> Carried {
    Carried::then(try_tracked(ctx, &w.pkt, &mut w.flow))
}

#[inline(always)]
fn try_tracked(ctx: &TcContext, t: &Tuple6, s: &mut FlowScratch6) -> Result<Then<i32>, Reason> {
    let mut reason = R_NEW_FLOW;
    if let Some(ct) = super::conntrack::lookup_forward(t) {
        if continues(&ct, t) {
            let ct = keep_alive(ct, t, s)?;
            crate::nat::forward_in(ctx, t, &ct)?;
            reason::count_service(ct.svc_id(), ct.backend().0, ctx.len());
            return Ok(Then::Done(toward(ctx, t, ct.daddr(), R_ESTABLISHED)));
        }
        let (id, generation) = ct.backend();
        if !select::backend_is(id, generation) {
            reason = R_BACKEND_GONE;
        }
        super::conntrack::start_over(ct, t);
    }
    Ok(Then::Next(Reason(reason)))
}

/// Records the new flow to the backend `choose` put in the scratch, rewrites the packet and
/// redirects it.
#[inline(never)]
fn start(ctx: &TcContext, w: &mut Work6, svc: &SvcValue, reason: u32) -> Carried {
    Carried::done(try_start(ctx, w, svc, reason))
}

#[inline(always)]
fn try_start(ctx: &TcContext, w: &mut Work6, svc: &SvcValue, reason: u32) -> Outcome<i32> {
    let fwd = flow::record(ctx, &w.pkt, svc, 0, CT_F_OUT_DNAT, &mut w.flow)?;
    crate::nat::forward_in(ctx, &w.pkt, &fwd)?;
    reason::count_service(fwd.svc_id(), fwd.backend().0, ctx.len());
    toward(ctx, &w.pkt, fwd.daddr(), reason)
}

/// Redirects the translated packet toward `backend` (the route from here); no route:
/// dropped, counted `rewrite_failed`.
#[inline(always)]
fn toward(ctx: &TcContext, t: &Tuple6, backend: &[u32; 4], reason: u32) -> Outcome<i32> {
    let here = ctx.ingress_ifindex();
    let route = fib::lookup(ctx.raw(), here, t.proto, &t.saddr_be, backend, 0)
        .ok_or(Reason(R_REWRITE_FAILED))?;
    redirect(route.ifindex, reason)
}
