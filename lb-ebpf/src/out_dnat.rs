//! The node's own SCTP associations to a frontend, at tc egress, one flow for both
//! families. No socket hook runs for SCTP (see `docs/datapath.md` § SCTP), and a packet the
//! node sends never crosses a tc ingress: its first look at one is tc egress on the
//! interface the frontend's route leaves by (a node's default route). There a packet to a
//! frontend is DNATed as at ingress (its flow's entries flagged `CT_F_OUT_DNAT`) and
//! redirected toward its backend (the route chosen for the frontend no longer applies). Its
//! replies come back to a local socket and never cross a tc egress, so tc ingress restores
//! both their sides (`nat::reply_in`). Refused without endpoints into the node's own stack,
//! as kube-proxy's REJECT in OUTPUT.
//!
//! The entry runs this from its own frame once the egress flow left the packet
//! ([`crate::reason::Then::Next`]); the family's leaf parses the packet again (`v4::node`,
//! `v6::node`): the egress flow's frame is gone.

use core::borrow::Borrow;

use aya_ebpf::{
    bindings::{BPF_F_INGRESS, TC_ACT_OK, TC_ACT_REDIRECT},
    helpers::bpf_redirect_neigh,
    programs::TcContext,
};
use lb_common::{
    CT_F_OUT_DNAT, IPPROTO_SCTP, R_BACKEND_GONE, R_ESTABLISHED, R_NEW_FLOW, R_PASS,
    R_REWRITE_FAILED, SCOPE_EXTERNAL, SCOPE_INTERNAL, SVC_F_TWO_SCOPES, SvcValue,
};

use crate::{
    conntrack::{self, continues},
    family::{Ends, Family, View},
    flow::{self, keep_alive},
    ingress, nat,
    parse::Frame,
    reason::{self, Carried, Outcome, Reason, Then},
    select,
};

#[inline(always)]
fn pass() -> Carried {
    Carried::done::<i32>(Ok((TC_ACT_OK, Reason(R_PASS))))
}

/// tc egress: the node's own packet to a frontend the egress flow left, parsed again by its
/// family's leaf (`v4::node`, `v6::node`): an SCTP one goes to [`flow`], anything else
/// passes.
#[inline(always)]
pub fn frame<F: Family>(
    ctx: &TcContext,
    f: Result<Frame<impl Borrow<F>, impl Borrow<F::Icmp>>, Reason>,
    s: &mut F::Scratch,
) -> Carried {
    match f {
        Ok(Frame::Flow(t)) if t.borrow().proto() == IPPROTO_SCTP => flow(ctx, t.borrow(), s),
        _ => pass(),
    }
}

/// The node's own SCTP packet `t` to a frontend (`s`: its family's part of the work area):
/// its tracked flow's backend, or a new flow's (the frontend's internal scope when it has
/// one, as the socket hooks take it); refused into the node's stack without endpoints.
/// Each step is out of line, as at ingress.
#[inline(always)]
pub fn flow<F: Family>(ctx: &TcContext, t: &F, s: &mut F::Scratch) -> Carried {
    let reason = match tracked(ctx, t, s).next::<i32>() {
        Then::Next(r) => r.0,
        Then::Done(o) => return Carried::done(o),
        Then::Refuse | Then::FragNeeded(_) => return pass(),
    };
    if F::is_loopback(t.daddr()) {
        return pass();
    }
    let Some(mut svc) = select::lookup(&t.frontend(SCOPE_EXTERNAL)) else {
        return pass();
    };
    if svc.flags & SVC_F_TWO_SCOPES != 0
        && let Some(inner) = select::lookup(&t.frontend(SCOPE_INTERNAL))
    {
        svc = inner;
    }
    match ingress::choose(t, svc, reason, s).next::<i32>() {
        Then::Next(_) => {}
        Then::Done(o) => return Carried::done(o),
        Then::Refuse => return ingress::refuse(ctx, t, s, BPF_F_INGRESS as u64),
        Then::FragNeeded(_) => return pass(),
    }
    start(ctx, t, svc, reason, s)
}

/// A packet of the node's tracked flow: rewritten and redirected; else [`Then::Next`] with
/// the reason its new flow is counted under.
#[inline(never)]
fn tracked<F: Family>(ctx: &TcContext, t: &F, s: &mut F::Scratch) -> Carried {
    Carried::then(try_tracked(ctx, t, s))
}

#[inline(always)]
fn try_tracked<F: Family>(ctx: &TcContext, t: &F, s: &mut F::Scratch) -> Result<Then<i32>, Reason> {
    let mut reason = R_NEW_FLOW;
    if let Some(ct) = conntrack::lookup_forward(t) {
        if continues(&ct, t) {
            let ct = keep_alive(ct, t, s)?;
            nat::forward_in(ctx, t, &ct)?;
            conntrack::count(&ct, ctx.len());
            return Ok(Then::Done(toward(ctx, t, ct.daddr(), R_ESTABLISHED)));
        }
        let (id, generation) = ct.backend();
        if !select::backend_is(id, generation) {
            reason = R_BACKEND_GONE;
        }
        conntrack::start_over(ct, t);
    }
    Ok(Then::Next(Reason(reason)))
}

/// Records the new flow to the backend `ingress::choose` put in the scratch, rewrites the
/// packet and redirects it.
#[inline(never)]
fn start<F: Family>(
    ctx: &TcContext,
    t: &F,
    svc: &SvcValue,
    reason: u32,
    s: &mut F::Scratch,
) -> Carried {
    Carried::done(try_start(ctx, t, svc, reason, s))
}

#[inline(always)]
fn try_start<F: Family>(
    ctx: &TcContext,
    t: &F,
    svc: &SvcValue,
    reason: u32,
    s: &mut F::Scratch,
) -> Outcome<i32> {
    let fwd = flow::record(ctx, t, svc, 0, CT_F_OUT_DNAT, s)?;
    nat::forward_in(ctx, t, &fwd)?;
    reason::count_service(fwd.svc_id(), fwd.backend().0, ctx.len());
    toward(ctx, t, fwd.daddr(), reason)
}

/// Redirects the translated packet toward `backend` (the route from here, its next hop
/// resolved by the kernel); counted under `reason`. No route: dropped, counted
/// `rewrite_failed` (the packet is already the backend's; the frontend's route would lose
/// it).
#[inline(always)]
fn toward<F: Family>(ctx: &TcContext, t: &F, backend: &F::Addr, reason: u32) -> Outcome<i32> {
    let ifindex = t.route_out(ctx, backend).ok_or(Reason(R_REWRITE_FAILED))?;
    // SAFETY: a helper on our own skb; no next-hop parameters.
    let action = unsafe { bpf_redirect_neigh(ifindex, core::ptr::null_mut(), 0, 0) };
    if action != TC_ACT_REDIRECT as i64 {
        return Err(Reason(R_REWRITE_FAILED));
    }
    Ok((action as i32, Reason(reason)))
}
