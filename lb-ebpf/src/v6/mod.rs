//! The IPv6 path of the tc program: the same steps as IPv4's (`main.rs`), out of line so
//! the IPv4 path's cost stays what it was (one ethertype comparison more, for non-IPv4
//! packets only). A tracked flow keeps its backend from its entry alone, a reply of one gets
//! the frontend back, a new flow to a frontend gets a backend from the shared service map
//! (family 6) through the shared choice (`select.rs`, affinity included).
//!
//! XDP's IPv6 path (`xdp.rs`) reuses these steps. The address filters are read with an
//! address's four words folded (`lb_common::filter_fold`, as the agent sets them), so the
//! addresses of one /32 do not share a bit: a clear bit means "certainly not".
//!
//! loadBalancerSourceRanges are checked against the IPv6 trie (`XLB_SRCRNG6_V1`), as IPv4's
//! against its own: a client outside them is dropped (`src_denied`).

pub mod conntrack;
pub mod dsr;
pub mod fib;
pub mod icmp;
pub mod maps;
pub mod nat;
pub mod out_dnat;
pub mod parse;
pub mod reject;
pub mod xdp;

use aya_ebpf::{bindings::TC_ACT_OK, programs::TcContext};
use lb_common::{
    BE_F_REMOTE, Backend, CT_F_AFFINITY, CT_F_HAIRPIN, CT_F_SNAT, CtValue6, IPPROTO_SCTP,
    R_BACKEND_GONE, R_CT_MISS, R_CT_SUPERSEDED, R_DSR_IN, R_DSR_OUT, R_ESTABLISHED, R_FRAG_NEEDED,
    R_ICMP_XLATE, R_NEW_FLOW, R_NO_BACKEND, R_PASS, R_REJECT, R_REPLY_IN, R_REVERSE_NAT,
    R_SNAT_FAILED, R_SNAT_OUT, R_SRC_DENIED, SCOPE_EXTERNAL, SVC_F_DROP_EMPTY, SVC_F_SNAT_REMOTE,
    SVC_F_SRC_RANGES, SvcValue, filter_fold,
};

use self::{
    conntrack::{copy6, eq6},
    maps::FlowScratch6,
    parse::{Parsed6, Tuple6},
};
use crate::{
    affinity::{self, Client},
    conntrack::{continues, mid_stream, touch},
    family::{Ends, View},
    filter,
    flow::keep_alive,
    nat::{BOTH, DST, SRC},
    packet::Packet,
    reason::{self, Carried, Reason, Then},
    select::{self, Frontend6},
    shared::Shared,
    srcrange,
    translate::Mtu,
    work::Work6,
};

type Outcome = reason::Outcome<i32>;

#[inline(always)]
fn pass(reason: u32) -> Outcome {
    Ok((TC_ACT_OK, Reason(reason)))
}

/// An IPv6 packet at tc ingress (the Ethernet type said IPv6). Each step below is out of
/// line and called from here, so their frames do not add up (512 bytes over the call
/// chain, the IPv4 path's frame included). `w`: the run's IPv6 work area (the packet is
/// parsed into it); each step gets it whole (one argument) and splits it.
#[inline(never)]
pub fn tc(ctx: &TcContext, w: &mut Work6) -> Carried {
    match parse::parse6(ctx, &mut w.pkt) {
        Ok(Parsed6::Flow) => {}
        Ok(Parsed6::Icmp) => return icmp_error::<{ DST }>(ctx, w),
        Ok(Parsed6::Pass(r)) => return Carried::done::<i32>(Ok((TC_ACT_OK, r))),
        Err(r) => return Carried::done::<i32>(Err(r)),
    }
    // Read once: the tracked-flow step and the new-flow step both ask it.
    let front = filter::maybe_frontend(filter_fold(&w.pkt.daddr_be));
    let reason = match tracked(ctx, w, front).next::<i32>() {
        Then::Next(r) => r.0,
        Then::Done(o) => return Carried::done(o),
        Then::FragNeeded(mtu) => return too_big(ctx, w, mtu),
        Then::Refuse => return Carried::done::<i32>(Err(Reason(R_NO_BACKEND))),
    };
    if !front {
        return supersede(ctx, &w.pkt);
    }
    if is_loopback(&w.pkt.daddr_be) {
        return Carried::done(pass(R_PASS));
    }
    let Some(svc) = select::lookup(&frontend(&w.pkt)) else {
        return Carried::done(pass(R_PASS));
    };
    match choose(w, svc, reason, SCOPE_EXTERNAL).next::<i32>() {
        Then::Next(_) => {}
        Then::Done(o) => return Carried::done(o),
        Then::Refuse => return refuse(ctx, w, 0),
        Then::FragNeeded(mtu) => return too_big(ctx, w, mtu),
    }
    match start(ctx, w, svc, reason).next::<i32>() {
        Then::Next(_) => rewrite(ctx, w, svc.svc_id, reason),
        Then::Done(o) => Carried::done(o),
        Then::FragNeeded(mtu) => too_big(ctx, w, mtu),
        Then::Refuse => refuse(ctx, w, 0),
    }
}

/// A packet to no frontend: passed, after it ended the translated flow whose reply tuple it
/// takes, if any (`conntrack::supersede`; out of line, for its keys).
#[inline(never)]
fn supersede(ctx: &TcContext, t: &Tuple6) -> Carried {
    if filter::maybe_backend(filter_fold(&t.daddr_be))
        && conntrack::supersede(t, || crate::xdp::runs_on(Packet::ingress_ifindex(ctx)))
    {
        return Carried::done(pass(R_CT_SUPERSEDED));
    }
    Carried::done(pass(R_PASS))
}

/// Rewrites the first packet of the flow just recorded (the scratch's forward tuple).
#[inline(never)]
fn rewrite(ctx: &TcContext, w: &mut Work6, svc_id: u32, reason: u32) -> Carried {
    Carried::done(try_rewrite(ctx, &w.pkt, svc_id, reason, &mut w.flow))
}

#[inline(always)]
fn try_rewrite(
    ctx: &TcContext,
    t: &Tuple6,
    svc_id: u32,
    reason: u32,
    s: &mut FlowScratch6,
) -> Outcome {
    let backend_id = s.fwd.backend_id;
    nat::forward_in(ctx, t, &Shared::local(&mut s.fwd))?;
    reason::count_service(svc_id, backend_id, ctx.len());
    pass(reason)
}

/// An IPv6 packet at tc egress: the source side of a tracked flow's packet, as IPv4's
/// (`try_tc_egress` in `main.rs`): a reply as netfilter saw it gets its frontend, a request
/// of a SNATed flow its SNAT source, an ICMPv6 error about either that side of its quote
/// (worked on in the run's IPv6 work area `w`, which the packet is parsed into);
/// [`Then::Next`] for the node's own SCTP packet to a frontend (`out_dnat`).
#[inline(never)]
pub fn tc_egress(ctx: &TcContext, w: &mut Work6) -> Carried {
    match parse::parse6(ctx, &mut w.pkt) {
        Ok(Parsed6::Flow) => {}
        Ok(Parsed6::Icmp) => return icmp_error::<{ SRC }>(ctx, w),
        Ok(Parsed6::Pass(r)) => return Carried::done::<i32>(Ok((TC_ACT_OK, r))),
        Err(r) => return Carried::done::<i32>(Err(r)),
    }
    let o = try_egress(ctx, w);
    let passed = matches!(o, Ok((_, Reason(R_PASS))));
    // The node's own SCTP packet to a frontend: no socket hook saw its association. Left
    // to the program's entry ([`Then::Next`]), whose frame is the smallest.
    if passed && w.pkt.proto == IPPROTO_SCTP && filter::maybe_frontend(filter_fold(&w.pkt.daddr_be))
    {
        return Carried::then::<i32>(Ok(Then::Next(Reason(R_PASS))));
    }
    Carried::done(o)
}

#[inline(always)]
fn try_egress(ctx: &TcContext, w: &mut Work6) -> Outcome {
    let t = &w.pkt;
    if let Some(ct) = filter::maybe_backend(filter_fold(&t.saddr_be))
        .then(|| conntrack::lookup_reply(t))
        .flatten()
    {
        touch(&ct, t);
        nat::apply::<_, { BOTH }>(ctx, t, &ct)?;
        reason::count_service(ct.svc_id(), ct.backend().0, ctx.len());
        return pass(R_REVERSE_NAT);
    }
    if filter::maybe_backend(filter_fold(&t.daddr_be)) {
        // A flow another node sends here by DSR, on its way to the backend: recorded for
        // the backend's replies, which leave this node.
        // (Any other packet with extension headers goes on.)
        if t.l4_off != parse::IP6_L4_OFF as u32 {
            if let Then::Done(o) = dsr_in(ctx, w).next::<i32>() {
                return o;
            }
        } else if dsr::carries(t)
            && let Some(ct) = dsr::frontend_entry(t)
        {
            // A packet of a DSR flow leaving for its backend's node: the header naming its
            // frontend on those that node learns the flow from.
            dsr::push(ctx, ct.saddr(), ct.sport())?;
            return pass(R_DSR_OUT);
        }
    }
    let t = &w.pkt;
    if let Some(ct) = filter::maybe_backend(filter_fold(&t.daddr_be))
        .then(|| conntrack::lookup_snat_out(t))
        .flatten()
    {
        touch(&ct, t);
        nat::apply::<_, { SRC }>(ctx, t, &ct)?;
        return pass(R_SNAT_OUT);
    }
    pass(R_PASS)
}

/// tc egress: a packet with extension headers to a backend: a DSR packet's flow is recorded
/// (`dsr::learn`); [`Then::Next`] for anything else.
#[inline(never)]
fn dsr_in(ctx: &TcContext, w: &mut Work6) -> Carried {
    if !dsr::read_option(ctx, &w.pkt, &mut w.flow.reply) {
        return Carried::then::<i32>(Ok(Then::Next(Reason(R_PASS))));
    }
    Carried::done(match dsr::learn(&w.pkt, &mut w.flow) {
        Ok(true) => pass(R_DSR_IN),
        Ok(false) => pass(R_PASS),
        Err(r) => Err(r),
    })
}

/// An ICMPv6 message: the `PART` side translated when it is an error about a tracked flow,
/// else passed.
#[inline(never)]
fn icmp_error<const PART: u8>(ctx: &TcContext, w: &mut Work6) -> Carried {
    Carried::done(match icmp::translate::<PART>(ctx, &w.pkt, &mut w.flow) {
        Ok(Some(ct)) => {
            reason::count_service(ct.svc_id(), ct.backend().0, ctx.len());
            pass(R_ICMP_XLATE)
        }
        Ok(None) => pass(R_PASS),
        Err(r) => Err(r),
    })
}

/// A new flow to a frontend without endpoints: refused (`back`: see `reject::refuse`).
#[inline(never)]
pub(super) fn refuse(ctx: &TcContext, w: &mut Work6, back: u64) -> Carried {
    Carried::done(
        reject::refuse(ctx, &w.pkt, &mut w.flow.quote_old, back)
            .map(|action| (action, Reason(R_REJECT))),
    )
}

/// A packet too big for its route: answered with Packet Too Big.
#[inline(never)]
fn too_big(ctx: &TcContext, w: &mut Work6, mtu: u16) -> Carried {
    Carried::done(
        reject::too_big(ctx, &w.pkt, mtu, &mut w.flow.quote_old)
            .map(|action| (action, Reason(R_FRAG_NEEDED))),
    )
}

/// A packet of a tracked flow (to its backend) or a reply of one (back from the frontend);
/// else [`Then::Next`] with the reason a new flow of it is counted under. `front`: the
/// destination may be a frontend (its address filter bit).
#[inline(never)]
fn tracked(ctx: &TcContext, w: &mut Work6, front: bool) -> Carried {
    Carried::then(try_tracked(ctx, &w.pkt, front, &mut w.flow))
}

#[inline(always)]
fn try_tracked(
    ctx: &TcContext,
    t: &Tuple6,
    front: bool,
    s: &mut FlowScratch6,
) -> Result<Then<i32>, Reason> {
    let mut reason = R_NEW_FLOW;
    // The address filters, by the addresses' four words folded (the agent sets the bits of
    // every frontend's and backend's address the same way): a clear bit skips the lookups
    // on that side, as for IPv4.
    let forward = if front {
        conntrack::lookup_forward(t)
    } else {
        None
    };
    if let Some(ct) = forward {
        if continues(&ct, t) {
            match fib::check_mtu(ctx, t, ct.daddr(), ct.mtu(), dsr::extra(ct.flags(), t)) {
                Mtu::TooBig(mtu) => return Ok(Then::FragNeeded(mtu)),
                Mtu::Fits(len) => ct.set_mtu(len),
                Mtu::Unchecked => {}
            }
            let ct = keep_alive(ct, t, s)?;
            nat::forward_in(ctx, t, &ct)?;
            reason::count_service(ct.svc_id(), ct.backend().0, ctx.len());
            return Ok(Then::Done(pass(R_ESTABLISHED)));
        }
        let (id, generation) = ct.backend();
        if !select::backend_is(id, generation) {
            reason = R_BACKEND_GONE;
        }
        conntrack::start_over(ct, t);
    } else if let Some(ct) = filter::maybe_backend(filter_fold(&t.saddr_be))
        .then(|| conntrack::lookup_reply(t))
        .flatten()
    {
        touch(&ct, t);
        nat::reply_in(ctx, t, &ct)?;
        return Ok(Then::Done(pass(R_REPLY_IN)));
    } else if mid_stream(t) {
        reason = R_CT_MISS;
    }
    Ok(Then::Next(Reason(reason)))
}

/// ::1: loopback frontends exist for the node's own sockets only.
#[inline(always)]
pub(super) fn is_loopback(a: &[u32; 4]) -> bool {
    a[0] | a[1] | a[2] == 0 && a[3] == 1u32.to_be()
}

#[inline(always)]
pub(super) fn frontend(t: &Tuple6) -> Frontend6 {
    Frontend6 {
        addr_be: t.daddr_be,
        port_be: t.dport_be,
        proto: t.proto,
        scope: SCOPE_EXTERNAL,
    }
}

/// The first packet of a flow to an IPv6 frontend: dropped when its source is outside the
/// frontend's source ranges, refusal when there are no endpoints, else the backend (into
/// the scratch) and [`Then::Next`].
#[inline(never)]
pub(super) fn choose(w: &mut Work6, svc: &SvcValue, reason: u32, scope: u8) -> Carried {
    Carried::then(try_choose(&w.pkt, svc, reason, scope, &mut w.flow))
}

#[inline(always)]
fn try_choose(
    t: &Tuple6,
    svc: &SvcValue,
    reason: u32,
    scope: u8,
    s: &mut FlowScratch6,
) -> Result<Then<i32>, Reason> {
    // loadBalancerSourceRanges: a client outside them never gets a flow (new flows only,
    // as IPv4 and kube-proxy).
    if svc.flags & SVC_F_SRC_RANGES != 0 && !srcrange::allowed6(svc.svc_id, &t.saddr_be) {
        return Err(Reason(R_SRC_DENIED));
    }
    if svc.count == 0 && svc.flags & SVC_F_DROP_EMPTY == 0 {
        return Ok(Then::Refuse);
    }
    let mut front = frontend(t);
    front.scope = scope;
    let (id, slot, be) = select::choose(
        &front,
        &Client::addr6(t.saddr_be),
        svc,
        Some(lb_common::flow_hash(
            &t.saddr_be,
            &t.daddr_be,
            t.sport_be,
            t.dport_be,
            t.proto,
        )),
    )?;
    s.backend_id = id;
    s.slot = slot as u32;
    copy_backend(&mut s.backend, &be);
    Ok(Then::Next(Reason(reason)))
}

/// `*dst = *src` field by field (a struct copy into map memory may become a `memmove`).
#[inline(always)]
fn copy_backend(dst: &mut Backend, src: &Backend) {
    copy6(&mut dst.addr_be, &src.addr_be);
    dst.port_be = src.port_be;
    dst.proto = src.proto;
    dst.family = src.family;
    dst.flags = src.flags;
    dst._pad0 = 0;
    dst._pad1 = 0;
    dst.generation = src.generation;
    dst._pad2 = 0;
}

/// Starts the flow to the backend the scratch holds (unless the packet is too big for its
/// route): source translation, affinity, conntrack; [`Then::Next`] for [`rewrite`] to go on.
#[inline(never)]
fn start(ctx: &TcContext, w: &mut Work6, svc: &SvcValue, reason: u32) -> Carried {
    Carried::then(try_start(ctx, &w.pkt, svc, reason, &mut w.flow))
}

#[inline(always)]
fn try_start(
    ctx: &TcContext,
    t: &Tuple6,
    svc: &SvcValue,
    reason: u32,
    s: &mut FlowScratch6,
) -> Result<Then<i32>, Reason> {
    let fits = match fib::check_mtu(
        ctx,
        t,
        &s.backend.addr_be,
        0,
        dsr::extra_new(t, svc, &s.backend),
    ) {
        Mtu::TooBig(mtu) => return Ok(Then::FragNeeded(mtu)),
        Mtu::Fits(len) => len,
        Mtu::Unchecked => 0,
    };
    record(ctx, t, svc, fits, 0, s)?;
    Ok(Then::Next(Reason(reason)))
}

/// Records a new flow of `t` to the backend of the scratch `s` (its source translation, its
/// affinity, its conntrack entries, built in `s`; `mtu` the size known to fit its route,
/// `flags` more `CT_F_*` flags for the forward entry); returns the forward tuple its packets
/// are rewritten to (in `s`).
/// A remote backend of a Cluster-policy external frontend gets the flow SNATed to the
/// node's address toward it (the route's source) and a port of the SNAT range, so its
/// replies come back through this node.
#[inline(always)]
pub(super) fn record<'s, P: Packet>(
    ctx: &P,
    t: &Tuple6,
    svc: &SvcValue,
    mtu: u16,
    flags: u16,
    s: &'s mut FlowScratch6,
) -> Result<Shared<'s, CtValue6>, Reason> {
    let be = &s.backend;
    let fwd = &mut s.fwd;
    copy6(&mut fwd.saddr_be, &t.saddr_be);
    copy6(&mut fwd.daddr_be, &be.addr_be);
    fwd.sport_be = t.sport_be;
    fwd.dport_be = be.port_be;
    fwd.backend_id = s.backend_id;
    fwd.backend_gen = be.generation;
    fwd.svc_id = svc.svc_id;
    fwd.flags = if svc.affinity_timeout_s != 0 {
        CT_F_AFFINITY
    } else {
        0
    };
    fwd.flags |= flags;
    fwd.mtu = mtu;
    fwd._pad = 0;
    let cfg = crate::maps::config();
    let hairpin = eq6(&be.addr_be, &t.saddr_be);
    let snat = if hairpin {
        hairpin_source(fwd, &cfg.hairpin6_addr_be)
    } else if dsr::applies(t, svc, be) {
        // Direct server return: the client stays the source; the backend's node answers.
        fwd.flags |= lb_common::CT_F_DSR;
        false
    } else {
        svc.flags & SVC_F_SNAT_REMOTE != 0 && be.flags & BE_F_REMOTE != 0
    };
    if snat && !hairpin {
        let route = fib::lookup(
            ctx.raw(),
            ctx.ingress_ifindex(),
            t.proto,
            &t.saddr_be,
            &be.addr_be,
            0,
        )
        .ok_or(Reason(R_SNAT_FAILED))?;
        let src = route.src_be;
        if src[0] | src[1] | src[2] | src[3] == 0 {
            return Err(Reason(R_SNAT_FAILED));
        }
        fwd.saddr_be = src;
        fwd.flags |= CT_F_SNAT;
    }
    affinity::remember(
        &Client::addr6(t.saddr_be),
        svc,
        s.backend_id,
        s.slot as u16,
        be.generation,
    );
    let src = conntrack::Source {
        snat,
        // A hairpin flow keeps the client's port when its reply tuple is free, as IPv4's.
        first_be: if snat && hairpin { t.sport_be } else { 0 },
        min: cfg.snat_port_min,
        max: cfg.snat_port_max,
    };
    conntrack::create(t, &src, s)?;
    Ok(Shared::local(&mut s.fwd))
}

/// A client that is its own backend (hairpin): its flow is SNATed to the IPv6 hairpin
/// address, as IPv4's to its own, so the pod accepts a packet that is not from itself and
/// its replies come back through tc. With none configured it keeps its source (false).
#[inline(always)]
fn hairpin_source(fwd: &mut CtValue6, addr_be: &[u32; 4]) -> bool {
    if addr_be[0] | addr_be[1] | addr_be[2] | addr_be[3] == 0 {
        return false;
    }
    copy6(&mut fwd.saddr_be, addr_be);
    fwd.flags |= CT_F_SNAT | CT_F_HAIRPIN;
    true
}
