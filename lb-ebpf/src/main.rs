//! xlb's datapath: tc and XDP programs that DNAT service traffic to backends and reverse-NAT
//! replies, and cgroup socket hooks that load-balance at connect time.
//!
//! Each program is `entry → try_fn → Result<Verdict, Reason>`; both arms bump one per-CPU
//! counter. Nothing logs per packet unless the agent asks for the debug log (`log.rs`).
//! The try_fn takes the per-CPU work area (`work.rs`) once, on the path that needs it, and
//! hands it down.
#![no_std]
#![no_main]

mod affinity;
mod clock;
mod conntrack;
mod dsr;
mod family;
mod fib;
mod filter;
mod flow;
mod icmp;
mod log;
mod maps;
mod nat;
mod out_dnat;
mod packet;
mod parse;
mod reason;
mod reject;
mod select;
mod shared;
mod sock;
mod srcrange;
mod translate;
mod v6;
mod work;
mod xdp;

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    macros::{cgroup_sock_addr, classifier, xdp},
    programs::{SockAddrContext, TcContext, XdpContext},
};
use lb_common::{
    R_BACKEND_GONE, R_CT_MISS, R_CT_SUPERSEDED, R_DSR_IN, R_DSR_OUT, R_ESTABLISHED, R_FRAG_NEEDED,
    R_ICMP_XLATE, R_MALFORMED, R_NEW_FLOW, R_PASS, R_REJECT, R_REPLY_IN, R_REVERSE_NAT, R_SNAT_OUT,
    SVC_F_DROP_EMPTY,
};

use lb_common::{CtValue, SvcValue};

use crate::{
    affinity::Client,
    family::{Ends, View},
    maps::FlowScratch,
    parse::{L3, Parsed, Tuple},
    reason::{Carried, Reason, Then},
    select::Frontend,
    shared::Shared,
    translate::Mtu,
};

/// tc ingress on the host side of pod veths and on the node's interfaces: service packets
/// are DNATed to a backend, replies of SNATed flows get their client back as destination,
/// ICMP errors about tracked flows have that side translated too. Only destinations are
/// rewritten here, before routing and netfilter (as kube-proxy's DNAT in PREROUTING):
/// sources are tc egress's (`xlb_tc_egress`).
#[classifier]
pub fn xlb_tc_ingress(ctx: TcContext) -> i32 {
    let (action, reason) = match try_tc_ingress(&ctx) {
        Ok(verdict) => verdict,
        Err(dropped) => (TC_ACT_SHOT, dropped),
    };
    reason.count(ctx.len());
    if log::on() {
        log::tc(&ctx, action, reason.0);
    }
    action
}

/// tc egress on the same interfaces: after routing and netfilter, a reply of a tracked flow
/// gets its frontend back as source, a request of a SNATed flow its SNAT source (as
/// kube-proxy's MASQUERADE in POSTROUTING), ICMP errors about tracked flows have that side
/// translated too. So every netfilter hook of the node sees a flow as client ⇄ backend, as
/// it would under kube-proxy, and its conntrack, a firewall's `ct state invalid drop` and a
/// CNI's policy chains agree with xlb. Every other packet passes untouched (a malformed one
/// too: egress drops nothing it does not own).
#[classifier]
pub fn xlb_tc_egress(ctx: TcContext) -> i32 {
    let outcome = match parse::l3(&ctx) {
        Ok(L3::Ipv4) => match egress(&ctx).next::<i32>() {
            Then::Done(o) => o,
            // The node's own packet to a frontend, from this frame (the frames of a call
            // chain add up, and the new-flow steps need theirs): see `out_dnat`.
            Then::Next(_) => node_flow(&ctx),
            Then::Refuse | Then::FragNeeded(_) => Ok((TC_ACT_OK, Reason(R_PASS))),
        },
        Ok(L3::Ipv6) => egress6(&ctx),
        Ok(L3::Other) => Ok((TC_ACT_OK, Reason(R_PASS))),
        Err(r) => Err(r),
    };
    let (action, reason) = match outcome {
        Ok(verdict) => verdict,
        Err(Reason(R_MALFORMED)) => (TC_ACT_OK, Reason(R_MALFORMED)),
        Err(dropped) => (TC_ACT_SHOT, dropped),
    };
    reason.count(ctx.len());
    // Only what egress did: every packet leaving an attached interface passes through it.
    if reason.0 != R_PASS && log::on() {
        log::tc(&ctx, action, reason.0);
    }
    action
}

/// XDP on the node's external interfaces (see `xdp.rs`); every verdict bumps a counter.
#[xdp]
pub fn xlb_xdp(ctx: XdpContext) -> u32 {
    // Read once: the frame's length is a helper call at XDP.
    let len = packet::Packet::len(&ctx);
    let (action, reason) = match try_xdp(&ctx, len) {
        Ok(verdict) => verdict,
        Err(dropped) => (xdp::DROP, dropped),
    };
    reason.count(len);
    if log::on() {
        log::xdp(&ctx, action, reason.0);
    }
    action
}

/// cgroup connect4: a TCP or UDP socket connecting to a frontend connects to a backend
/// (see `sock.rs`); refused at once when the frontend has no endpoints.
#[cgroup_sock_addr(connect4)]
pub fn xlb_connect4(ctx: SockAddrContext) -> i32 {
    sock::forward::<sock::V4>(&ctx, false)
}

/// cgroup sendmsg4: an unconnected UDP datagram to a frontend goes to a backend.
#[cgroup_sock_addr(sendmsg4)]
pub fn xlb_sendmsg4(ctx: SockAddrContext) -> i32 {
    sock::forward::<sock::V4>(&ctx, true)
}

/// cgroup recvmsg4: a datagram from a backend a socket was sent to shows the frontend.
#[cgroup_sock_addr(recvmsg4)]
pub fn xlb_recvmsg4(ctx: SockAddrContext) -> i32 {
    sock::reverse::<sock::V4>(&ctx)
}

/// cgroup getpeername4: a socket connected to a backend through a frontend shows the
/// frontend as its peer.
#[cgroup_sock_addr(getpeername4)]
pub fn xlb_getpeername4(ctx: SockAddrContext) -> i32 {
    sock::reverse::<sock::V4>(&ctx)
}

/// cgroup connect6: as connect4, for IPv6 frontends.
#[cgroup_sock_addr(connect6)]
pub fn xlb_connect6(ctx: SockAddrContext) -> i32 {
    sock::forward::<sock::V6>(&ctx, false)
}

/// cgroup sendmsg6: as sendmsg4, for IPv6 frontends.
#[cgroup_sock_addr(sendmsg6)]
pub fn xlb_sendmsg6(ctx: SockAddrContext) -> i32 {
    sock::forward::<sock::V6>(&ctx, true)
}

/// cgroup recvmsg6: as recvmsg4, for IPv6.
#[cgroup_sock_addr(recvmsg6)]
pub fn xlb_recvmsg6(ctx: SockAddrContext) -> i32 {
    sock::reverse::<sock::V6>(&ctx)
}

/// cgroup getpeername6: as getpeername4, for IPv6.
#[cgroup_sock_addr(getpeername6)]
pub fn xlb_getpeername6(ctx: SockAddrContext) -> i32 {
    sock::reverse::<sock::V6>(&ctx)
}

/// Bench-only floor: passes every packet untouched, reads no map and counts nothing.
/// `cargo xtask bench datapath` measures it beside `xlb_tc_ingress` (the cost of the
/// `BPF_PROG_TEST_RUN` harness itself); the agent never loads or attaches it.
#[classifier]
pub fn xlb_tc_pass(_ctx: TcContext) -> i32 {
    TC_ACT_OK
}

/// Bench-only floor of the XDP program: passes every frame untouched, reads no map. Never
/// loaded or attached by the agent.
#[xdp]
pub fn xlb_xdp_pass(_ctx: XdpContext) -> u32 {
    xdp::PASS
}

/// The tc program's outcome.
type Outcome = reason::Outcome<i32>;

/// XDP: the frame's family's flow (IPv4: `xdp.rs`, IPv6: `v6/xdp.rs`); anything else passes.
#[inline(always)]
fn try_xdp(ctx: &XdpContext, len: u32) -> xdp::XdpOutcome {
    match parse::l3(ctx)? {
        L3::Ipv4 => xdp::try_xdp(ctx, len),
        L3::Ipv6 => {
            // SAFETY: the only acquire on this path of the run.
            let w = unsafe { work::acquire() }?;
            v6::xdp::xdp(ctx, &mut w.v6, len).outcome()
        }
        L3::Other => Ok((xdp::PASS, Reason(R_PASS))),
    }
}

#[inline(always)]
fn try_tc_ingress(ctx: &TcContext) -> Outcome {
    let pass = |reason: u32| Ok((TC_ACT_OK, Reason(reason)));
    match parse::l3(ctx)? {
        L3::Ipv4 => {}
        L3::Ipv6 => {
            // SAFETY: the only acquire on this path of the run.
            let w = unsafe { work::acquire() }?;
            return v6::tc(ctx, &mut w.v6).outcome();
        }
        L3::Other => return pass(R_PASS),
    }
    let t = match parse::parse_ipv4(ctx, ctx.len())? {
        Parsed::Flow(t) => t,
        Parsed::Icmp(m) => {
            // SAFETY: the only acquire on this path of the run.
            let w = unsafe { work::acquire() }?;
            return icmp_error::<{ nat::DST }>(ctx, &m, &mut w.v4).outcome();
        }
        Parsed::Pass(reason) => return Ok((TC_ACT_OK, reason)),
    };

    // A packet of a tracked flow keeps its backend, from its conntrack entry alone (no
    // service lookup: the entry holds the rewrite, the counters' indices and whether the
    // service has affinity). As with kube-proxy's conntrack: a TCP connection stays on a
    // backend even after it left the service (graceful termination), while a UDP flow whose
    // backend was removed is re-balanced (kube-proxy flushes those).
    // The address filters first: most packets that have nothing to do with a service are
    // known so from two bits, without a hash lookup.
    let frontend = filter::maybe_frontend(t.daddr_be);
    let mut reason = R_NEW_FLOW;
    let forward = if frontend {
        conntrack::lookup_forward(&t)
    } else {
        None
    };
    if let Some(ct) = forward {
        if conntrack::continues(&ct, &t) {
            let mtu = established_mtu(ctx, &t, ct.lend());
            if mtu != 0 {
                return frag_needed(ctx, &t, mtu).outcome();
            }
            // SAFETY: the only acquire on this path of the run.
            let w = unsafe { work::acquire() }?;
            let ct = flow::keep_alive(ct, &t, &mut w.v4)?;
            nat::forward_in(ctx, &t, &ct)?;
            reason::count_service(ct.svc_id(), ct.backend().0, ctx.len());
            return pass(R_ESTABLISHED);
        }
        let (id, generation) = ct.backend();
        if !select::backend_is(id, generation) {
            reason = R_BACKEND_GONE;
        }
        // Started over: a reused client port on a closed flow is simply new.
        conntrack::start_over(ct, &t);
    } else if let Some(ct) = filter::maybe_backend(t.saddr_be)
        .then(|| conntrack::lookup_reply(&t))
        .flatten()
    {
        // A reply from a backend of a tracked flow: the client (if the flow was SNATed) as
        // destination; the frontend as source at egress.
        conntrack::touch(&ct, &t);
        nat::reply_in(ctx, &t, &ct)?;
        return pass(R_REPLY_IN);
    } else if conntrack::mid_stream(&t) {
        reason = R_CT_MISS;
    }

    if !frontend {
        if filter::maybe_backend(t.daddr_be)
            && conntrack::supersede(&t, || xdp::runs_on(packet::Packet::ingress_ifindex(ctx)))
        {
            return pass(R_CT_SUPERSEDED);
        }
        return pass(R_PASS);
    }
    let Some(svc) = select::lookup_service(&t) else {
        return pass(R_PASS);
    };
    // SAFETY: the only acquire on this path of the run.
    let w = unsafe { work::acquire() }?;
    // The answers are built out of line here, not below `tc_new_flow`: the stack frames of
    // a call chain add up (512 bytes in all).
    match tc_new_flow(ctx, &t, svc, reason, &mut w.v4).next() {
        Then::Done(o) => o,
        Then::Refuse => refuse(ctx, &t, 0).outcome(),
        Then::FragNeeded(mtu) => frag_needed(ctx, &t, mtu).outcome(),
        // Not an answer of this step (it ends every flow it starts): untouched.
        Then::Next(r) => Ok((TC_ACT_OK, r)),
    }
}

/// tc egress's steps for a tracked flow (see `xlb_tc_egress`), out of line: its verdict,
/// or [`Then::Next`] for a packet to a frontend that may be the node's own.
#[inline(never)]
fn egress(ctx: &TcContext) -> Carried {
    Carried::then(match try_tc_egress(ctx) {
        Ok(Some(verdict)) => Ok(Then::Done(Ok(verdict))),
        Ok(None) => Ok(Then::Next(Reason(R_PASS))),
        Err(r) => Err(r),
    })
}

/// The node's own IPv4 packet to a frontend: this run's one acquire of the work area.
#[inline(always)]
fn node_flow(ctx: &TcContext) -> Outcome {
    // SAFETY: the only acquire on this path of the run: `egress` found no tracked flow and
    // no ICMP error, and acquired nothing.
    let w = unsafe { work::acquire() }?;
    out_dnat::flow(ctx, &mut w.v4).outcome()
}

/// tc egress for an IPv6 packet (the packet parsed into the work area, acquired once here
/// for the run): a tracked flow's source side, else the node's own packet to a frontend.
#[inline(always)]
fn egress6(ctx: &TcContext) -> Outcome {
    // SAFETY: the only acquire of this run.
    let w = unsafe { work::acquire() }?;
    match v6::tc_egress(ctx, &mut w.v6).next::<i32>() {
        Then::Done(o) => o,
        Then::Next(_) => v6::out_dnat::flow(ctx, &mut w.v6).outcome(),
        Then::Refuse | Then::FragNeeded(_) => Ok((TC_ACT_OK, Reason(R_PASS))),
    }
}

/// tc egress: the source side of a tracked IPv4 flow's packet (see `xlb_tc_egress`);
/// `None` for a packet to a frontend, which may be the node's own (`out_dnat`).
#[inline(always)]
fn try_tc_egress(ctx: &TcContext) -> Result<Option<(i32, Reason)>, Reason> {
    let t = match parse::parse_ipv4(ctx, ctx.len())? {
        Parsed::Flow(t) => t,
        Parsed::Icmp(m) => {
            // SAFETY: the only acquire on this path of the run.
            let w = unsafe { work::acquire() }?;
            return icmp_error::<{ nat::SRC }>(ctx, &m, &mut w.v4)
                .outcome()
                .map(Some);
        }
        Parsed::Pass(reason) => return Ok(Some((TC_ACT_OK, reason))),
    };
    // A reply as netfilter saw it (backend → client): the frontend as source.
    if let Some(ct) = filter::maybe_backend(t.saddr_be)
        .then(|| conntrack::lookup_reply(&t))
        .flatten()
    {
        conntrack::touch(&ct, &t);
        nat::apply::<_, { nat::BOTH }>(ctx, &t, &ct)?;
        reason::count_service(ct.svc_id(), ct.backend().0, ctx.len());
        return Ok(Some((TC_ACT_OK, Reason(R_REVERSE_NAT))));
    }
    if filter::maybe_backend(t.daddr_be) {
        // A flow another node sends here by DSR, on its way to the backend (its option makes
        // the header longer): recorded for the backend's replies, which leave this node.
        // (Any other packet with options goes on.)
        if t.l4_off != parse::L4_OFF {
            if let Then::Done(o) = dsr_in(ctx).next::<i32>() {
                return o.map(Some);
            }
        } else if dsr::carries(&t)
            && let Some((addr_be, port_be)) = conntrack::dsr_frontend(&t)
        {
            // A packet of a DSR flow leaving for its backend's node: the option naming its
            // frontend on those that node learns the flow from.
            dsr::push(ctx, addr_be, port_be)?;
            return Ok(Some((TC_ACT_OK, Reason(R_DSR_OUT))));
        }
    }
    // A request of a SNATed flow as netfilter saw it (client → backend): the SNAT source.
    if let Some(ct) = filter::maybe_backend(t.daddr_be)
        .then(|| conntrack::lookup_snat_out(&t))
        .flatten()
    {
        conntrack::touch(&ct, &t);
        nat::apply::<_, { nat::SRC }>(ctx, &t, &ct)?;
        return Ok(Some((TC_ACT_OK, Reason(R_SNAT_OUT))));
    }
    // Maybe the node's own SCTP packet to a frontend: no socket hook saw its association.
    // (`out_dnat` checks the protocol: read here, LLVM packs the tuple's fields on ways out
    // where some were never read, which the verifier refuses.)
    if filter::maybe_frontend(t.daddr_be) {
        return Ok(None);
    }
    Ok(Some((TC_ACT_OK, Reason(R_PASS))))
}

/// An ICMP message: the `PART` side translated when it is an error about a tracked flow,
/// else passed.
#[inline(never)]
fn icmp_error<const PART: u8>(ctx: &TcContext, m: &parse::Icmp, s: &mut FlowScratch) -> Carried {
    Carried::done(match icmp::translate::<PART>(ctx, m, s) {
        Ok(Some(ct)) => {
            reason::count_service(ct.svc_id(), ct.backend().0, ctx.len());
            Ok((TC_ACT_OK, Reason(R_ICMP_XLATE)))
        }
        Ok(None) => Ok((TC_ACT_OK, Reason(R_PASS))),
        Err(r) => Err(r),
    })
}

/// tc egress: a packet with IP options to a backend: a DSR packet's flow is recorded
/// (`dsr::learn`); [`Then::Next`] for anything else. The packet is parsed again here, off
/// the egress frame (the frames of a call chain add up).
#[inline(never)]
fn dsr_in(ctx: &TcContext) -> Carried {
    let next = || Carried::then::<i32>(Ok(Then::Next(Reason(R_PASS))));
    let Ok(Parsed::Flow(mut t)) = parse::parse_ipv4(ctx, ctx.len()) else {
        return next();
    };
    let Some((addr_be, port_be)) = dsr::option_of(ctx, &t) else {
        return next();
    };
    // SAFETY: the only acquire on this path of the run.
    let w = match unsafe { work::acquire() } {
        Ok(w) => w,
        Err(r) => return Carried::done::<i32>(Err(r)),
    };
    Carried::done(match dsr::learn(&mut t, addr_be, port_be, &mut w.v4) {
        Ok(true) => Ok((TC_ACT_OK, Reason(R_DSR_IN))),
        Ok(false) => Ok((TC_ACT_OK, Reason(R_PASS))),
        Err(r) => Err(r),
    })
}

/// The route-MTU check of a tracked flow's packet (its DSR option counted, when it carries
/// one): the MTU to answer with when it is too big, else 0 (a size that fits is remembered
/// in the entry `ct`). Out of line: tc ingress's frame has no room for it.
#[inline(never)]
fn established_mtu(ctx: &TcContext, t: &Tuple, ct: Shared<'_, CtValue>) -> u16 {
    match translate::check_mtu(ctx, t, *ct.daddr(), ct.mtu(), dsr::extra(ct.flags(), t)) {
        Mtu::TooBig(mtu) => mtu.max(1),
        Mtu::Fits(len) => {
            ct.set_mtu(len);
            0
        }
        Mtu::Unchecked => 0,
    }
}

/// A packet too big for its route: answered with fragmentation needed.
#[inline(never)]
fn frag_needed(ctx: &TcContext, t: &Tuple, mtu: u16) -> Carried {
    Carried::done(reject::frag_needed(ctx, t, mtu).map(|action| (action, Reason(R_FRAG_NEEDED))))
}

/// A new flow to a frontend without endpoints: refused (`back`: see `reject::refuse`).
#[inline(never)]
pub(crate) fn refuse(ctx: &TcContext, t: &Tuple, back: u64) -> Carried {
    Carried::done(reject::refuse(ctx, t, back).map(|action| (action, Reason(R_REJECT))))
}

/// The first packet of a flow to a frontend: source ranges, refusal when there are no
/// endpoints, backend choice, source translation, conntrack (built in the scratch `s`),
/// rewrite.
#[inline(never)]
fn tc_new_flow(
    ctx: &TcContext,
    t: &Tuple,
    svc: &SvcValue,
    reason: u32,
    s: &mut FlowScratch,
) -> Carried {
    Carried::then(try_tc_new_flow(ctx, t, svc, reason, s))
}

#[inline(always)]
fn try_tc_new_flow(
    ctx: &TcContext,
    t: &Tuple,
    svc: &SvcValue,
    reason: u32,
    s: &mut FlowScratch,
) -> Result<Then<i32>, Reason> {
    flow::admitted(t, svc)?;
    // No endpoints: refuse at once (kube-proxy's REJECT), unless the service must drop.
    if svc.count == 0 && svc.flags & SVC_F_DROP_EMPTY == 0 {
        return Ok(Then::Refuse);
    }
    let client = Client::of(t);
    let chosen = select::choose(&Frontend::of(t), &client, svc, Some(select::flow_hash(t)))?;
    let fits = match translate::check_mtu(
        ctx,
        t,
        chosen.2.addr_be[0],
        0,
        dsr::extra_new(t, svc, &chosen.2),
    ) {
        Mtu::TooBig(mtu) => return Ok(Then::FragNeeded(mtu)),
        Mtu::Fits(len) => len,
        Mtu::Unchecked => 0,
    };
    let fwd = flow::record(ctx, t, svc, &client, &chosen, fits, 0, s)?;
    nat::forward_in(ctx, t, &fwd)?;
    reason::count_service(svc.svc_id, chosen.0, ctx.len());
    Ok(Then::Done(Ok((TC_ACT_OK, Reason(reason)))))
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
