//! tc ingress's one flow, for both families (`xlb_tc_ingress` parses the packet with its
//! family's leaf and runs [`flow`] monomorphised for it):
//!
//! ```text
//! tracked ──▶ established: keep alive, DNAT ─────────────────────▶ ESTABLISHED
//!    │        reply of a flow: client back as destination ────────▶ REPLY_IN
//!    │        too big for the route ──────────────────────────────▶ too_big
//!    ▼ (reason: new_flow / backend_gone / ct_miss)
//! no frontend bit ──▶ supersede (a client now talks to the backend itself) ▶ PASS
//! service lookup (no loopback frontend) ─────────────────────────▶ PASS
//! choose: source ranges, no endpoints ▶ refuse, backend into the scratch
//! start: route MTU ▶ too_big, record (SNAT, affinity, conntrack)
//! rewrite: DNAT the first packet ─────────────────────────────────▶ NEW_FLOW …
//! ```
//!
//! Each step is out of line and called from [`flow`], so their frames do not add up (512
//! bytes over the call chain); a step hands its verdict back in one register
//! ([`Carried`]). Only destinations are rewritten here, before routing and netfilter (as
//! kube-proxy's DNAT in PREROUTING): sources are tc egress's.

use core::borrow::Borrow;

use aya_ebpf::{bindings::TC_ACT_OK, programs::TcContext};
use lb_common::{
    R_BACKEND_GONE, R_CT_MISS, R_CT_SUPERSEDED, R_ESTABLISHED, R_FRAG_NEEDED, R_NEW_FLOW,
    R_NO_BACKEND, R_PASS, R_REJECT, R_REPLY_IN, SCOPE_EXTERNAL, SVC_F_DROP_EMPTY, SvcValue,
};

use crate::{
    conntrack::{self, Ct, continues, mid_stream, touch},
    dsr, egress,
    family::{Ends, Family, Mtu, View},
    filter::{self, Filters},
    flow::{self, keep_alive},
    nat::{self, DST},
    packet::Packet,
    parse::Frame,
    reason::{self, Carried, Reason, Then},
    select,
    shared::Shared,
    work::Work,
};

type Outcome = reason::Outcome<i32>;

#[inline(always)]
fn pass(reason: u32) -> Outcome {
    Ok((TC_ACT_OK, Reason(reason)))
}

/// tc ingress for a frame its family's leaf parsed (`v4::tc_in`, `v6::tc`): the one flow,
/// or the ICMP step (the destination side); a malformed frame is dropped, anything else
/// passes.
#[inline(always)]
pub fn frame<'a, F: Family>(
    ctx: &TcContext,
    f: Result<Frame<impl Borrow<F>, impl Borrow<F::Icmp>>, Reason>,
    work: impl Work<'a, F::Scratch>,
) -> Carried {
    match f {
        Ok(Frame::Flow(t)) => flow(ctx, t.borrow(), work),
        Ok(Frame::Icmp(m)) => match work() {
            Ok(s) => egress::icmp_error::<F, DST>(ctx, m.borrow(), s),
            Err(r) => Carried::done::<i32>(Err(r)),
        },
        Ok(Frame::Pass(r)) => Carried::done::<i32>(Ok((TC_ACT_OK, r))),
        Err(r) => Carried::done::<i32>(Err(r)),
    }
}

/// A parsed TCP, UDP or SCTP packet `t` at tc ingress; `work`: its family's part of the
/// run's work area, taken only once the address filters say the packet may be ours.
#[inline(always)]
pub fn flow<'a, F: Family>(ctx: &TcContext, t: &F, work: impl Work<'a, F::Scratch>) -> Carried {
    // Read once: the tracked-flow step and the new-flow step both ask it. Most packets that
    // have nothing to do with a service are known so from two bits, without a hash lookup.
    let filters = Filters::load();
    let front = filters.frontend(F::filter_word(t.daddr()));
    if !front {
        // Not to a frontend: a reply of a tracked flow, or no flow of ours. Neither takes the
        // work area; a packet from no backend and to none makes no call out of line.
        if filters.backend(F::filter_word(t.saddr()))
            && let Some(ct) = conntrack::lookup_reply(t)
        {
            return reply(ctx, t, &ct);
        }
        if !filters.backend(F::filter_word(t.daddr())) {
            return Carried::done(pass(R_PASS));
        }
        return supersede(ctx, t);
    }
    let s = match work() {
        Ok(s) => s,
        Err(r) => return Carried::done::<i32>(Err(r)),
    };
    let reason = match tracked(ctx, t, s).next::<i32>() {
        Then::Next(r) => r.0,
        Then::Done(o) => return Carried::done(o),
        Then::FragNeeded(mtu) => return too_big(ctx, t, s, mtu),
        Then::Refuse => return Carried::done::<i32>(Err(Reason(R_NO_BACKEND))),
    };
    if F::is_loopback(t.daddr()) {
        return Carried::done(pass(R_PASS));
    }
    let Some(svc) = select::lookup(&t.frontend(SCOPE_EXTERNAL)) else {
        return Carried::done(pass(R_PASS));
    };
    match choose(t, svc, reason, s).next::<i32>() {
        Then::Next(_) => {}
        Then::Done(o) => return Carried::done(o),
        Then::Refuse => return refuse(ctx, t, s, 0),
        Then::FragNeeded(mtu) => return too_big(ctx, t, s, mtu),
    }
    match start(ctx, t, svc, reason, s).next::<i32>() {
        Then::Next(_) => rewrite(ctx, t, svc.svc_id, reason, s),
        Then::Done(o) => Carried::done(o),
        Then::FragNeeded(mtu) => too_big(ctx, t, s, mtu),
        Then::Refuse => refuse(ctx, t, s, 0),
    }
}

/// A packet to a frontend (its address filter bit says it may be): of a tracked flow (to its
/// backend) or a reply of one (a client that is itself a frontend address); else
/// [`Then::Next`] with the reason a new flow of it is counted under.
///
/// As with kube-proxy's conntrack: a TCP connection stays on a backend even after it left
/// the service (graceful termination), while a UDP flow whose backend was removed is
/// re-balanced (kube-proxy flushes those). The entry holds the rewrite, the counters'
/// indices and whether the service has affinity: no service lookup.
#[inline(never)]
fn tracked<F: Family>(ctx: &TcContext, t: &F, s: &mut F::Scratch) -> Carried {
    Carried::then(try_tracked(ctx, t, s))
}

#[inline(always)]
fn try_tracked<F: Family>(ctx: &TcContext, t: &F, s: &mut F::Scratch) -> Result<Then<i32>, Reason> {
    let mut reason = R_NEW_FLOW;
    if let Some(ct) = conntrack::lookup_forward(t) {
        if continues(&ct, t) {
            match t.check_mtu(ctx, ct.daddr(), ct.mtu(), dsr::extra(ct.flags(), t)) {
                Mtu::TooBig(mtu) => return Ok(Then::FragNeeded(mtu)),
                Mtu::Fits(len) => ct.set_mtu(len),
                Mtu::Unchecked => {}
            }
            let ct = keep_alive(ct, t, s)?;
            nat::forward_in(ctx, t, &ct)?;
            conntrack::count(&ct, ctx.len());
            return Ok(Then::Done(pass(R_ESTABLISHED)));
        }
        let (id, generation) = ct.backend();
        if !select::backend_is(id, generation) {
            reason = R_BACKEND_GONE;
        }
        // Started over: a reused client port on a closed flow is simply new.
        conntrack::start_over(ct, t);
    } else if let Some(ct) = filter::maybe_backend(F::filter_word(t.saddr()))
        .then(|| conntrack::lookup_reply(t))
        .flatten()
    {
        // A reply from a backend of a tracked flow: the client (if the flow was SNATed) as
        // destination; the frontend as source at egress.
        touch(&ct, t);
        nat::reply_in(ctx, t, &ct)?;
        return Ok(Then::Done(pass(R_REPLY_IN)));
    } else if mid_stream(t) {
        reason = R_CT_MISS;
    }
    Ok(Then::Next(Reason(reason)))
}

/// A reply from a backend of a tracked flow (its entry `ct`): the client (if the flow was
/// SNATed) as destination; the frontend as source at egress. Out of line: its rewrite's
/// frame on the entry's goes over 512 bytes with the new-flow steps.
#[inline(never)]
fn reply<F: Family>(ctx: &TcContext, t: &F, ct: &Ct<F>) -> Carried {
    touch(ct, t);
    Carried::done(nat::reply_in(ctx, t, ct).map(|()| (TC_ACT_OK, Reason(R_REPLY_IN))))
}

/// A packet to no frontend: passed, after it ended the translated flow whose reply tuple it
/// takes, if any (`conntrack::supersede`; out of line, for its keys).
#[inline(never)]
fn supersede<F: Family>(ctx: &TcContext, t: &F) -> Carried {
    if filter::maybe_backend(F::filter_word(t.daddr()))
        && conntrack::supersede(t, || crate::xdp::runs_on(Packet::ingress_ifindex(ctx)))
    {
        return Carried::done(pass(R_CT_SUPERSEDED));
    }
    Carried::done(pass(R_PASS))
}

/// The first packet of a flow to a frontend (its entry `svc`, of either scope): dropped when its source is outside
/// the frontend's source ranges, refused when there are no endpoints (kube-proxy's REJECT,
/// unless the service must drop), else its backend (into the scratch, `Parts::chosen`) and
/// [`Then::Next`]. Also the node's own flows' step at tc egress (`out_dnat`).
#[inline(never)]
pub fn choose<F: Family>(t: &F, svc: &SvcValue, reason: u32, s: &mut F::Scratch) -> Carried {
    Carried::then::<i32>(try_choose(t, svc, reason, s))
}

#[inline(always)]
fn try_choose<F: Family>(
    t: &F,
    svc: &SvcValue,
    reason: u32,
    s: &mut F::Scratch,
) -> Result<Then<i32>, Reason> {
    flow::admitted(t, svc)?;
    if svc.count == 0 && svc.flags & SVC_F_DROP_EMPTY == 0 {
        return Ok(Then::Refuse);
    }
    let c = select::choose(&t.client(), svc, Some(t.flow_hash()))?;
    F::parts(s).chosen.set(&c);
    Ok(Then::Next(Reason(reason)))
}

/// Starts the flow to the backend the scratch holds (unless the packet is too big for its
/// route): source translation, affinity, conntrack; [`Then::Next`] for [`rewrite`].
#[inline(never)]
fn start<F: Family>(
    ctx: &TcContext,
    t: &F,
    svc: &SvcValue,
    reason: u32,
    s: &mut F::Scratch,
) -> Carried {
    Carried::then(try_start(ctx, t, svc, reason, s))
}

#[inline(always)]
fn try_start<F: Family>(
    ctx: &TcContext,
    t: &F,
    svc: &SvcValue,
    reason: u32,
    s: &mut F::Scratch,
) -> Result<Then<i32>, Reason> {
    let be = &F::parts(s).chosen.backend;
    let fits = match t.check_mtu(ctx, F::backend_addr(be), 0, dsr::extra_new(t, svc, be)) {
        Mtu::TooBig(mtu) => return Ok(Then::FragNeeded(mtu)),
        Mtu::Fits(len) => len,
        Mtu::Unchecked => 0,
    };
    flow::record(ctx, t, svc, fits, 0, s)?;
    Ok(Then::Next(Reason(reason)))
}

/// Rewrites the first packet of the flow just recorded (the scratch's forward tuple).
#[inline(never)]
fn rewrite<F: Family>(
    ctx: &TcContext,
    t: &F,
    svc_id: u32,
    reason: u32,
    s: &mut F::Scratch,
) -> Carried {
    let fwd = F::parts(s).fwd;
    let backend_id = fwd.backend().0;
    Carried::done(nat::forward_in(ctx, t, &Shared::local(fwd)).map(|()| {
        reason::count_service(svc_id, backend_id, ctx.len());
        (TC_ACT_OK, Reason(reason))
    }))
}

/// A new flow to a frontend without endpoints: refused (`back`: see `reject::refuse`).
#[inline(never)]
pub fn refuse<F: Family>(ctx: &TcContext, t: &F, s: &mut F::Scratch, back: u64) -> Carried {
    Carried::done(
        t.refuse(ctx, s, back)
            .map(|action| (action, Reason(R_REJECT))),
    )
}

/// A packet too big for its route: answered with fragmentation needed (Packet Too Big).
#[inline(never)]
pub fn too_big<F: Family>(ctx: &TcContext, t: &F, s: &mut F::Scratch, mtu: u16) -> Carried {
    Carried::done(
        t.too_big(ctx, s, mtu)
            .map(|action| (action, Reason(R_FRAG_NEEDED))),
    )
}
