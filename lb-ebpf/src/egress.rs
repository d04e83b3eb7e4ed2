//! tc egress's one flow, for both families (`xlb_tc_egress` parses the packet with its
//! family's leaf and runs [`flow`] monomorphised for it), after routing and netfilter:
//!
//! ```text
//! reply of a tracked flow (backend → client) ──▶ frontend as source ──▶ REVERSE_NAT
//! to a backend, with options / extension headers ▶ a DSR flow learnt ──▶ DSR_IN
//! to a backend, a DSR flow's packet ─────────────▶ the option pushed ──▶ DSR_OUT
//! request of a SNATed flow (client → backend) ────▶ SNAT source ───────▶ SNAT_OUT
//! to a frontend ─────────────────────────────────▶ the node's own flow (`out_dnat`)
//! anything else ──────────────────────────────────────────────────────▶ PASS
//! ```
//!
//! So every netfilter hook of the node sees a flow as client ⇄ backend, as it would under
//! kube-proxy (MASQUERADE in POSTROUTING).

use core::borrow::Borrow;

use aya_ebpf::{bindings::TC_ACT_OK, programs::TcContext};
use lb_common::{
    IPPROTO_SCTP, R_DSR_IN, R_DSR_OUT, R_ICMP_XLATE, R_PASS, R_REVERSE_NAT, R_SNAT_OUT,
};

use crate::{
    conntrack::{self, touch},
    dsr,
    family::{Ends, Family, View},
    filter::Filters,
    icmp,
    nat::{self, BOTH, SRC},
    parse::Frame,
    reason::{self, Carried, Reason, Then},
};

type Outcome = reason::Outcome<i32>;

#[inline(always)]
fn pass(reason: u32) -> Outcome {
    Ok((TC_ACT_OK, Reason(reason)))
}

/// tc egress for a frame its family's leaf parsed (`v4::tc_out`, `v6::tc`): the one flow,
/// or the ICMP step (the source side); anything else passes (a malformed frame is the
/// entry's to pass).
#[inline(always)]
pub fn frame<F: Family>(
    ctx: &TcContext,
    f: Result<Frame<impl Borrow<F>, impl Borrow<F::Icmp>>, Reason>,
    s: &mut F::Scratch,
) -> Carried {
    match f {
        Ok(Frame::Flow(t)) => flow(ctx, t.borrow(), s),
        Ok(Frame::Icmp(m)) => icmp_error::<F, SRC>(ctx, m.borrow(), s),
        Ok(Frame::Pass(r)) => Carried::done::<i32>(Ok((TC_ACT_OK, r))),
        Err(r) => Carried::done::<i32>(Err(r)),
    }
}

/// A parsed TCP, UDP or SCTP packet `t` at tc egress (`s`: its family's part of the run's
/// work area): its verdict, or [`Then::Next`] for a packet to a frontend, which may be the
/// node's own (`out_dnat`, run by the entry from a frame of its own).
#[inline(always)]
pub fn flow<F: Family>(ctx: &TcContext, t: &F, s: &mut F::Scratch) -> Carried {
    Carried::then(try_flow(ctx, t, s))
}

#[inline(always)]
fn try_flow<F: Family>(ctx: &TcContext, t: &F, s: &mut F::Scratch) -> Result<Then<i32>, Reason> {
    let filters = Filters::load();
    // A reply as netfilter saw it (backend → client): the frontend as source.
    if let Some(ct) = filters
        .backend(F::filter_word(t.saddr()))
        .then(|| conntrack::lookup_reply(t))
        .flatten()
    {
        touch(&ct, t);
        nat::rewrite::<F, _, BOTH>(ctx, t, &ct)?;
        conntrack::count(&ct, ctx.len());
        return Ok(Then::Done(pass(R_REVERSE_NAT)));
    }
    // The destination's filter word, once (an IPv6 address's is a fold of its four words).
    let daddr_word = F::filter_word(t.daddr());
    let to_backend = filters.backend(daddr_word);
    if to_backend {
        // A flow another node sends here by DSR, on its way to the backend (its option makes
        // the header longer): recorded for the backend's replies, which leave this node.
        // (Any other packet with options goes on.)
        if !t.plain() {
            if let Then::Done(o) = dsr_in(ctx, t, s).next::<i32>() {
                return Ok(Then::Done(o));
            }
        } else if dsr::carries(t)
            && let Some(ct) = dsr::frontend_entry(t)
        {
            // A packet of a DSR flow leaving for its backend's node: the option naming its
            // frontend on those that node learns the flow from.
            dsr::push::<F>(ctx, ct.saddr(), ct.sport())?;
            return Ok(Then::Done(pass(R_DSR_OUT)));
        }
    }
    // A request of a SNATed flow as netfilter saw it (client → backend): the SNAT source.
    if let Some(ct) = to_backend.then(|| conntrack::lookup_snat_out(t)).flatten() {
        touch(&ct, t);
        nat::rewrite::<F, _, SRC>(ctx, t, &ct)?;
        return Ok(Then::Done(pass(R_SNAT_OUT)));
    }
    // Maybe the node's own SCTP packet to a frontend: no socket hook saw its association
    // (its TCP and UDP ones were translated at connect or send time). The protocol first:
    // the packets of no service, nearly all of what leaves a node, read no third filter
    // word (`out_dnat` checks the protocol again, on its own parse).
    if t.proto() == IPPROTO_SCTP && filters.frontend(daddr_word) {
        return Ok(Then::Next(Reason(R_PASS)));
    }
    Ok(Then::Done(pass(R_PASS)))
}

/// tc egress: a packet with IP options or extension headers to a backend: a DSR packet's
/// flow is recorded (`dsr::learn`); [`Then::Next`] for anything else.
#[inline(never)]
fn dsr_in<F: Family>(ctx: &TcContext, t: &F, s: &mut F::Scratch) -> Carried {
    if !dsr::read(ctx, t, s) {
        return Carried::then::<i32>(Ok(Then::Next(Reason(R_PASS))));
    }
    Carried::done(match dsr::learn(t, s) {
        Ok(true) => pass(R_DSR_IN),
        Ok(false) => pass(R_PASS),
        Err(r) => Err(r),
    })
}

/// An ICMP or ICMPv6 message `m` at tc ingress (`PART` = `nat::DST`) or egress (`nat::SRC`):
/// that side translated when it is an error about a tracked flow, else passed.
#[inline(never)]
pub fn icmp_error<F: Family, const PART: u8>(
    ctx: &TcContext,
    m: &F::Icmp,
    s: &mut F::Scratch,
) -> Carried {
    Carried::done(match icmp::translate::<F, PART>(ctx, m, s) {
        Ok(Some(ct)) => {
            reason::count_service(ct.svc_id(), ct.backend().0, ctx.len());
            pass(R_ICMP_XLATE)
        }
        Ok(None) => pass(R_PASS),
        Err(r) => Err(r),
    })
}
