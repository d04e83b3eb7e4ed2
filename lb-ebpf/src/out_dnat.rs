//! The node's own SCTP associations to a frontend, at tc egress. No socket hook runs for
//! SCTP (see `docs/datapath.md` § SCTP), and a packet the node sends never crosses a tc
//! ingress: its first look at one is tc egress on the interface the frontend's route leaves
//! by (a node's default route). There a packet to a frontend is DNATed as at ingress (its
//! flow's entries flagged `CT_F_OUT_DNAT`) and redirected toward its backend (the route
//! chosen for the frontend no longer applies). Its replies come back to a local socket and
//! never cross a tc egress, so tc ingress restores both their sides (`nat::reply_in`).
//! Refused without endpoints into the node's own stack, as kube-proxy's REJECT in OUTPUT.

use aya_ebpf::{
    bindings::{BPF_F_INGRESS, TC_ACT_OK, TC_ACT_REDIRECT},
    helpers::bpf_redirect_neigh,
    programs::TcContext,
};
use lb_common::{
    CT_F_OUT_DNAT, IPPROTO_SCTP, R_BACKEND_GONE, R_ESTABLISHED, R_NEW_FLOW, R_PASS,
    R_REWRITE_FAILED, SCOPE_INTERNAL, SVC_F_DROP_EMPTY, SVC_F_TWO_SCOPES,
};

use crate::{
    affinity::Client,
    conntrack,
    family::{Ends, View},
    fib, flow,
    maps::FlowScratch,
    nat,
    packet::Packet,
    parse::{self, Parsed, Tuple},
    reason::{self, Carried, Outcome, Reason, Then},
    select::{self, Frontend},
};

/// The node's own IPv4 SCTP packet to a frontend (tc egress): its tracked flow's backend,
/// or a new flow's; refused into the node's stack without endpoints. The packet is parsed
/// again in each step: the egress path's frame keeps only the few fields it reads (and
/// the frames of a call chain add up, 512 bytes in all).
#[inline(never)]
pub fn flow(ctx: &TcContext, s: &mut FlowScratch) -> Carried {
    match step(ctx, s).next::<i32>() {
        Then::Refuse => refuse(ctx, s),
        Then::Done(o) => Carried::done(o),
        Then::Next(r) => Carried::done::<i32>(Ok((TC_ACT_OK, r))),
        Then::FragNeeded(_) => Carried::done::<i32>(Ok((TC_ACT_OK, Reason(R_PASS)))),
    }
}

/// The packet as a node's SCTP packet, else `None` (passed).
#[inline(always)]
fn parsed(ctx: &TcContext) -> Option<Tuple> {
    match parse::parse_ipv4(ctx, ctx.len()) {
        Ok(Parsed::Flow(t)) if t.proto == IPPROTO_SCTP => Some(t),
        _ => None,
    }
}

/// The flow's step, in a frame of its own.
#[inline(never)]
fn step(ctx: &TcContext, s: &mut FlowScratch) -> Carried {
    let Some(t) = parsed(ctx) else {
        return Carried::done::<i32>(Ok((TC_ACT_OK, Reason(R_PASS))));
    };
    Carried::then(try_flow(ctx, &t, s))
}

/// The refusal, in a frame of its own: into the node's stack.
#[inline(never)]
fn refuse(ctx: &TcContext, s: &mut FlowScratch) -> Carried {
    let Some(t) = parsed(ctx) else {
        return Carried::done::<i32>(Ok((TC_ACT_OK, Reason(R_PASS))));
    };
    crate::ingress::refuse(ctx, &t, s, BPF_F_INGRESS as u64)
}

#[inline(always)]
fn try_flow(ctx: &TcContext, t: &Tuple, s: &mut FlowScratch) -> Result<Then<i32>, Reason> {
    let mut reason = R_NEW_FLOW;
    if let Some(ct) = conntrack::lookup_forward(t) {
        if conntrack::continues(&ct, t) {
            let ct = flow::keep_alive(ct, t, s)?;
            nat::forward_in(ctx, t, &ct)?;
            reason::count_service(ct.svc_id(), ct.backend().0, ctx.len());
            let backend = *ct.daddr();
            return Ok(Then::Done(toward(ctx, t, backend, R_ESTABLISHED)));
        }
        let (id, generation) = ct.backend();
        if !select::backend_is(id, generation) {
            reason = R_BACKEND_GONE;
        }
        conntrack::start_over(ct, t);
    }
    let Some(svc) = select::lookup_service(t) else {
        return Ok(Then::Done(Ok((TC_ACT_OK, Reason(R_PASS)))));
    };
    // The node's own traffic takes a frontend's internal scope when it has one (every
    // cluster endpoint under externalTrafficPolicy Local), as the socket hooks do.
    let mut front = Frontend::of(t);
    let mut svc = svc;
    if svc.flags & SVC_F_TWO_SCOPES != 0 {
        front.scope = SCOPE_INTERNAL;
        if let Some(inner) = select::lookup(&front) {
            svc = inner;
        }
    }
    flow::admitted(t, svc)?;
    if svc.count == 0 && svc.flags & SVC_F_DROP_EMPTY == 0 {
        return Ok(Then::Refuse);
    }
    let chosen = select::choose(&front, &Client::of(t), svc, Some(select::flow_hash(t)))?;
    s.chosen.set(&chosen);
    let fwd = flow::record(ctx, t, svc, 0, CT_F_OUT_DNAT, s)?;
    nat::forward_in(ctx, t, &fwd)?;
    let backend = *fwd.daddr();
    reason::count_service(svc.svc_id, chosen.id, ctx.len());
    Ok(Then::Done(toward(ctx, t, backend, reason)))
}

/// Redirects the translated packet toward `backend_be` (the route from here, its next hop
/// resolved by the kernel); counted under `reason`. No route: dropped, counted
/// `rewrite_failed` (the packet is already the backend's; the frontend's route would lose
/// it).
#[inline(always)]
fn toward(ctx: &TcContext, t: &Tuple, backend_be: u32, reason: u32) -> Outcome<i32> {
    let here = ctx.ingress_ifindex();
    let route = fib::lookup(ctx.raw(), here, t.proto, t.saddr_be, backend_be, 0, false)
        .ok_or(Reason(R_REWRITE_FAILED))?;
    redirect(route.ifindex, reason)
}

/// `bpf_redirect_neigh` to `ifindex`'s egress (the kernel resolves the next hop).
#[inline(always)]
pub fn redirect(ifindex: u32, reason: u32) -> Outcome<i32> {
    // SAFETY: a helper on our own skb; no next-hop parameters.
    let action = unsafe { bpf_redirect_neigh(ifindex, core::ptr::null_mut(), 0, 0) };
    if action != TC_ACT_REDIRECT as i64 {
        return Err(Reason(R_REWRITE_FAILED));
    }
    Ok((action as i32, Reason(reason)))
}
