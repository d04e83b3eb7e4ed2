//! xlb's datapath: tc and XDP programs that DNAT service traffic to backends and reverse-NAT
//! replies, and cgroup socket hooks that load-balance at connect time.
//!
//! Each program is `entry → try_fn → Result<Verdict, Reason>`; both arms bump one per-CPU
//! counter. Nothing logs per packet unless the agent asks for the debug log (`log.rs`).
//! The try_fn takes the per-CPU work area (`work.rs`) once, on the path that needs it, and
//! hands it down.
#![no_std]
#![no_main]
// `atomic_xadd`: the only atomic add this target has (no `AtomicU32`), for the pending
// counts a conntrack entry accumulates (`conntrack::count`).
#![feature(core_intrinsics)]
#![allow(internal_features)]

mod addr;
mod affinity;
mod clock;
mod conntrack;
mod dsr;
mod egress;
mod family;
mod fib;
mod filter;
mod flow;
mod icmp;
mod ingress;
mod log;
mod maps;
mod nat;
mod out_dnat;
mod packet;
mod parse;
mod quote;
mod reason;
mod reject;
mod select;
mod shared;
mod sock;
mod srcrange;
mod translate;
mod v4;
mod v6;
mod work;
mod xdp;

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    macros::{cgroup_sock_addr, classifier, xdp},
    programs::{SockAddrContext, TcContext, XdpContext},
};
use lb_common::{R_MALFORMED, R_PASS};

use crate::{
    parse::L3,
    reason::{Reason, Then},
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
        Ok(L3::Other) => Ok((TC_ACT_OK, Reason(R_PASS))),
        Ok(l3) => try_tc_egress(&ctx, l3),
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

/// XDP: the frame's family's leaf parses it (`v4::xdp`, `v6::xdp::xdp`), then XDP's one
/// flow (`xdp.rs`) runs, monomorphised for the family; anything else passes.
#[inline(always)]
fn try_xdp(ctx: &XdpContext, len: u32) -> xdp::XdpOutcome {
    let l3 = parse::l3(ctx)?;
    if l3 == L3::Other {
        return Ok((xdp::PASS, Reason(R_PASS)));
    }
    if l3 == L3::Ipv6 {
        // SAFETY: the only acquire of this run.
        let w = unsafe { work::acquire() }?;
        return v6::xdp::xdp(ctx, &mut w.v6, len).outcome();
    }
    // Neither to a frontend nor from a backend: passed here, as XDP's flow would pass it,
    // without the out-of-line call to its IPv4 leaf.
    let mut front = None;
    if let Some((saddr_be, daddr_be)) = parse::plain_ends(ctx, len) {
        let filters = filter::Filters::load();
        let to_frontend = filters.frontend(daddr_be);
        if !to_frontend && !filters.backend(saddr_be) {
            return Ok((xdp::PASS, Reason(R_PASS)));
        }
        front = Some(to_frontend);
    }
    // SAFETY: the only acquire of this run (a closure called at most once), taken only once
    // the address filters say the frame may be a service's.
    v4::xdp(
        ctx,
        || unsafe { work::acquire() }.map(|w| &mut w.v4),
        len,
        front,
    )
    .outcome()
}

/// tc ingress: the frame's family's leaf parses the packet (`v4::tc_in`, `v6::tc`), then the
/// one flow (`ingress.rs`) runs, monomorphised for the family.
#[inline(always)]
fn try_tc_ingress(ctx: &TcContext) -> Outcome {
    let l3 = parse::l3(ctx)?;
    if l3 == L3::Other {
        return Ok((TC_ACT_OK, Reason(R_PASS)));
    }
    if l3 == L3::Ipv6 {
        // SAFETY: the only acquire of this run.
        let w = unsafe { work::acquire() }?;
        return v6::tc::<{ nat::DST }>(ctx, &mut w.v6).outcome();
    }
    // SAFETY: the only acquire of this run (a closure called at most once), taken only once
    // the address filters say the packet may be a service's.
    v4::tc_in(ctx, || unsafe { work::acquire() }.map(|w| &mut w.v4)).outcome()
}

/// tc egress: the family's leaf parses the packet, then the one flow (`egress.rs`); a packet
/// to a frontend that flow leaves ([`Then::Next`]) may be the node's own (`out_dnat`), run
/// from this frame (the frames of a call chain add up, and the new-flow steps need theirs).
#[inline(always)]
fn try_tc_egress(ctx: &TcContext, l3: L3) -> Outcome {
    // SAFETY: the only acquire of this run.
    let w = unsafe { work::acquire() }?;
    let then = if l3 == L3::Ipv6 {
        v6::tc::<{ nat::SRC }>(ctx, &mut w.v6).next::<i32>()
    } else {
        v4::tc_out(ctx, &mut w.v4).next::<i32>()
    };
    match then {
        Then::Done(o) => o,
        Then::Next(_) if l3 == L3::Ipv6 => v6::node(ctx, &mut w.v6).outcome(),
        Then::Next(_) => v4::node(ctx, &mut w.v4).outcome(),
        Then::Refuse | Then::FragNeeded(_) => Ok((TC_ACT_OK, Reason(R_PASS))),
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
