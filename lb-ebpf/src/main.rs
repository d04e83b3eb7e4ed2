//! xlb's datapath: tc programs that DNAT service traffic to backends and reverse-NAT replies.
//!
//! Each program is `entry → try_fn → Result<Verdict, Reason>`; both arms bump one per-CPU
//! counter. Nothing here logs per packet.
#![no_std]
#![no_main]

mod affinity;
mod conntrack;
mod maps;
mod nat;
mod parse;
mod reason;
mod reject;
mod select;

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    macros::classifier,
    programs::TcContext,
};
use lb_common::{
    IPPROTO_TCP, R_BACKEND_GONE, R_ESTABLISHED, R_NEW_FLOW, R_PASS, R_REJECT, R_REVERSE_NAT,
    SVC_F_DROP_EMPTY,
};

use crate::{parse::Parsed, reason::Reason};

/// tc ingress on the host side of pod veths (and node interfaces that carry replies):
/// service packets are DNATed to a backend, replies of tracked flows get the VIP back.
#[classifier]
pub fn xlb_tc_ingress(ctx: TcContext) -> i32 {
    let (action, reason) = match try_tc_ingress(&ctx) {
        Ok(verdict) => verdict,
        Err(dropped) => (TC_ACT_SHOT, dropped),
    };
    reason.count(ctx.len());
    action
}

/// Bench-only floor: passes every packet untouched, reads no map and counts nothing.
/// `cargo xtask bench datapath` measures it beside `xlb_tc_ingress` (the cost of the
/// `BPF_PROG_TEST_RUN` harness itself); the agent never loads or attaches it.
#[classifier]
pub fn xlb_tc_pass(_ctx: TcContext) -> i32 {
    TC_ACT_OK
}

/// `Ok((action, reason))`: the packet continues (possibly rewritten) or is sent back as a
/// refusal; `Err(reason)`: it is dropped.
#[inline(always)]
fn try_tc_ingress(ctx: &TcContext) -> Result<(i32, Reason), Reason> {
    let pass = |reason: u32| Ok((TC_ACT_OK, Reason(reason)));
    let t = match parse::parse_ipv4(ctx)? {
        Parsed::Flow(t) => t,
        Parsed::Pass(reason) => return Ok((TC_ACT_OK, reason)),
    };

    // A reply from a backend of a tracked flow: restore the VIP as source.
    if let Some(ct) = conntrack::lookup_reply(&t) {
        nat::rewrite_src(ctx, &t, ct.nat_addr_be[0], ct.nat_port_be)?;
        reason::count_service(ct.svc_id, ct.backend_id, ctx.len());
        return pass(R_REVERSE_NAT);
    }

    let Some(svc) = select::lookup_service(&t) else {
        return pass(R_PASS);
    };

    // A packet of a tracked flow keeps its backend. As with kube-proxy's conntrack: a TCP
    // connection stays on a backend even after it left the service (graceful termination),
    // while a UDP flow whose backend was removed is re-balanced (kube-proxy flushes those).
    let mut reason = R_NEW_FLOW;
    if let Some(ct) = conntrack::lookup_forward(&t) {
        if t.proto == IPPROTO_TCP || select::backend(ct.backend_id).is_some() {
            conntrack::touch(ct);
            affinity::touch(&t, svc);
            nat::rewrite_dst(ctx, &t, ct.nat_addr_be[0], ct.nat_port_be)?;
            reason::count_service(svc.svc_id, ct.backend_id, ctx.len());
            return pass(R_ESTABLISHED);
        }
        reason = R_BACKEND_GONE;
    }

    // No endpoints: refuse at once (kube-proxy's REJECT), unless the service must drop.
    if svc.count == 0 && svc.flags & SVC_F_DROP_EMPTY == 0 {
        return Ok((reject::refuse(ctx, &t)?, Reason(R_REJECT)));
    }
    let (backend_id, slot, be) = match affinity::lookup(&t, svc) {
        Some(remembered) => remembered,
        None => select::pick(&t, svc)?,
    };
    affinity::remember(&t, svc, backend_id, slot);
    conntrack::create(&t, backend_id, &be, svc.svc_id)?;
    nat::rewrite_dst(ctx, &t, be.addr_be[0], be.port_be)?;
    reason::count_service(svc.svc_id, backend_id, ctx.len());
    pass(reason)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
