//! IPv4's leaf of the one flow: what [`Family`] asks of the family, answered by the IPv4
//! modules (`parse.rs`'s tuple, `nat.rs`'s rewrite, `fib.rs` and `translate.rs`'s route
//! lookups, `reject.rs`'s answers, `dsr.rs`'s option). Nothing here knows IPv6.

use aya_ebpf::{bindings::TC_ACT_OK, programs::TcContext};
use lb_common::{Backend, DSR_OPT_LEN, NodeConfig, R_DSR_IN, R_PASS, SCOPE_EXTERNAL};

use crate::{
    conntrack::Ct,
    dsr, egress,
    family::{Family, Mtu},
    fib, icmp, ingress,
    maps::FlowScratch,
    nat,
    packet::{L4Sum, Packet},
    parse::{self, Icmp, L4_OFF, Parsed, Tuple},
    reason::{Carried, Reason, Then},
    reject,
    select::{self, Frontend},
    shared::Shared,
    srcrange, translate,
};

impl Family for Tuple {
    type Front = Frontend;
    const DSR_LEN: u16 = DSR_OPT_LEN as u16;
    #[inline(always)]
    fn filter_word(a: &u32) -> u32 {
        *a
    }
    #[inline(always)]
    fn is_zero(a: &u32) -> bool {
        *a == 0
    }
    #[inline(always)]
    fn is_loopback(a: &u32) -> bool {
        select::is_loopback(*a)
    }
    #[inline(always)]
    fn frontend(&self, scope: u8) -> Frontend {
        let mut f = Frontend::of(self);
        if scope != SCOPE_EXTERNAL {
            f.scope = scope;
        }
        f
    }
    #[inline(always)]
    fn flow_hash(&self) -> u32 {
        select::flow_hash(self)
    }
    #[inline(always)]
    fn backend_addr(be: &Backend) -> &u32 {
        &be.addr_be[0]
    }
    #[inline(always)]
    fn src_allowed(&self, svc_id: u32) -> bool {
        srcrange::allowed(svc_id, self.saddr_be)
    }
    #[inline(always)]
    fn hairpin(cfg: &NodeConfig) -> u32 {
        cfg.hairpin_addr_be
    }
    #[inline(always)]
    fn plain(&self) -> bool {
        self.l4_off == L4_OFF
    }
    #[inline(always)]
    fn check_mtu<P: Packet>(&self, ctx: &P, daddr: &u32, fits: u16, extra: u16) -> Mtu {
        translate::check_mtu(ctx, self, *daddr, fits, extra)
    }
    #[inline(always)]
    fn route_src<P: Packet>(&self, ctx: &P, daddr: &u32) -> Option<u32> {
        let route = fib::lookup(
            ctx.raw(),
            ctx.ingress_ifindex(),
            self.proto,
            self.saddr_be,
            *daddr,
            0,
            false,
        )?;
        (route.src_be != 0).then_some(route.src_be)
    }
    #[inline(always)]
    fn apply<P: L4Sum, const PART: u8>(
        &self,
        ctx: &P,
        to: &Shared<'_, lb_common::CtValue>,
    ) -> Result<(), Reason> {
        nat::apply::<P, PART>(ctx, self, to)
    }
    #[inline(always)]
    fn refuse(&self, ctx: &TcContext, _: &mut FlowScratch, back: u64) -> Result<i32, Reason> {
        reject::refuse(ctx, self, back)
    }
    #[inline(always)]
    fn too_big(&self, ctx: &TcContext, _: &mut FlowScratch, mtu: u16) -> Result<i32, Reason> {
        reject::frag_needed(ctx, self, mtu)
    }
    type Icmp = Icmp;
    #[inline(always)]
    fn translate_icmp<const PART: u8>(
        ctx: &TcContext,
        m: &Icmp,
        s: &mut FlowScratch,
    ) -> Result<Option<Ct<Tuple>>, Reason> {
        icmp::translate::<PART>(ctx, m, s)
    }
    #[inline(always)]
    fn dsr_in(&self, ctx: &TcContext, s: &mut FlowScratch) -> Carried {
        dsr_in(ctx, s)
    }
    #[inline(always)]
    fn dsr_push(ctx: &TcContext, addr: &u32, port_be: u16) -> Result<(), Reason> {
        dsr::push(ctx, *addr, port_be)
    }
}

/// tc egress: a packet with IP options to a backend: a DSR packet's flow is recorded
/// (`dsr::learn`); [`Then::Next`] for anything else. The packet is parsed again here, off
/// the egress frame (the frames of a call chain add up), into a tuple `dsr::learn` may
/// turn to the frontend in place.
#[inline(never)]
fn dsr_in(ctx: &TcContext, s: &mut FlowScratch) -> Carried {
    let next = || Carried::then::<i32>(Ok(Then::Next(Reason(R_PASS))));
    let Ok(Parsed::Flow(mut t)) = parse::parse_ipv4(ctx, ctx.len()) else {
        return next();
    };
    let Some((addr_be, port_be)) = dsr::option_of(ctx, &t) else {
        return next();
    };
    Carried::done(match dsr::learn(&mut t, addr_be, port_be, s) {
        Ok(true) => Ok((TC_ACT_OK, Reason(R_DSR_IN))),
        Ok(false) => Ok((TC_ACT_OK, Reason(R_PASS))),
        Err(r) => Err(r),
    })
}

/// tc ingress and egress for an IPv4 packet: parsed here (its tuple on this frame), then
/// the hook's one flow, or the ICMP step. `PART`: `nat::DST` at ingress, `nat::SRC` at
/// egress. Out of line: its frame (the tuple's) is gone when the entry goes on to the
/// node's own flow (`out_dnat`).
#[inline(never)]
pub fn tc<const PART: u8>(ctx: &TcContext, s: &mut FlowScratch) -> Carried {
    match parse::parse_ipv4(ctx, ctx.len()) {
        Ok(Parsed::Flow(t)) if PART == nat::DST => ingress::flow(ctx, &t, s),
        Ok(Parsed::Flow(t)) => egress::flow(ctx, &t, s),
        Ok(Parsed::Icmp(m)) => egress::icmp_error::<Tuple, PART>(ctx, &m, s),
        Ok(Parsed::Pass(r)) => Carried::done::<i32>(Ok((TC_ACT_OK, r))),
        Err(r) => Carried::done::<i32>(Err(r)),
    }
}
