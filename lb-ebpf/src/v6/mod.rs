//! IPv6's leaves: the header parse (`parse.rs`), ICMPv6's answers' header (`reject.rs`),
//! the DSR header (`dsr.rs`), the tables and scratch (`maps.rs`, `conntrack.rs`), XDP's
//! layer-2 forward (`xdp.rs`), and what the one flow of each hook asks of the family
//! (`family.rs`: the addresses' rewrite, offsets, pseudo-header sum, the quote's layout). The flows, the
//! rewrite (`nat.rs`) and the route lookups (`fib.rs`) are the families' one; what remains
//! here is IPv6's parse dispatch of tc.
//!
//! The address filters are read with an address's four words folded
//! (`lb_common::filter_fold`, as the agent sets them), so the addresses of one /32 do not
//! share a bit: a clear bit means "certainly not".

pub mod conntrack;
pub mod dsr;
mod family;

pub mod maps;
pub mod parse;
pub mod reject;
pub mod xdp;

use self::parse::{Parsed6, Tuple6};
use aya_ebpf::{bindings::TC_ACT_OK, programs::TcContext};
use lb_common::{IPPROTO_SCTP, R_PASS};

use crate::{
    egress, ingress,
    nat::DST,
    out_dnat,
    reason::{Carried, Reason},
    work::Work6,
};

/// tc ingress and egress for an IPv6 packet (the Ethernet type said IPv6): parsed into the
/// run's IPv6 work area `w`, then the hook's one flow (`ingress.rs`, `egress.rs`), or the
/// ICMPv6 step. `PART`: `nat::DST` at ingress, `nat::SRC` at egress. Out of line: its
/// frame holds nothing of IPv4's.
#[inline(never)]
pub fn tc<const PART: u8>(ctx: &TcContext, w: &mut Work6) -> Carried {
    match parse::parse6(ctx, &mut w.pkt) {
        Ok(Parsed6::Flow) if PART == DST => ingress::flow(ctx, &w.pkt, || Ok(&mut w.flow)),
        Ok(Parsed6::Flow) => egress::flow(ctx, &w.pkt, &mut w.flow),
        Ok(Parsed6::Icmp) => egress::icmp_error::<Tuple6, PART>(ctx, &w.pkt, &mut w.flow),
        Ok(Parsed6::Pass(r)) => Carried::done::<i32>(Ok((TC_ACT_OK, r))),
        Err(r) => Carried::done::<i32>(Err(r)),
    }
}

/// tc egress: the node's own IPv6 packet to a frontend the egress flow left, parsed again
/// into the work area (the egress flow's frame is gone): an SCTP one goes to `out_dnat`,
/// anything else passes.
#[inline(never)]
pub fn node(ctx: &TcContext, w: &mut Work6) -> Carried {
    match parse::parse6(ctx, &mut w.pkt) {
        Ok(Parsed6::Flow) if w.pkt.proto == IPPROTO_SCTP => {
            out_dnat::flow(ctx, &w.pkt, &mut w.flow)
        }
        _ => Carried::done::<i32>(Ok((TC_ACT_OK, Reason(R_PASS)))),
    }
}
