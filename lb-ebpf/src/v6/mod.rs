//! IPv6's leaves: the header parse (`parse.rs`), ICMPv6's answers' header (`reject.rs`),
//! the DSR header (`dsr.rs`), the tables and scratch (`maps.rs`, `conntrack.rs`), XDP's
//! parse (`xdp.rs`), and what the one flow of each hook asks of the family
//! (`family.rs`: the addresses' rewrite, offsets, the quote's layout).
//! The flows, their dispatch of a parsed frame, the rewrite (`nat.rs`) and the route
//! lookups (`fib.rs`) are the families' one; what remains here is IPv6's parse of tc into
//! the work area, handed to the hook's dispatch.
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

use self::parse::Tuple6;
use aya_ebpf::programs::TcContext;

use crate::{egress, ingress, nat::DST, out_dnat, reason::Carried, work::Work6};

/// tc ingress and egress for an IPv6 packet (the Ethernet type said IPv6): parsed into the
/// run's IPv6 work area `w`, then the hook's dispatch (`ingress.rs`, `egress.rs`). `PART`:
/// `nat::DST` at ingress, `nat::SRC` at egress. Out of line: its frame holds nothing of
/// IPv4's.
#[inline(never)]
pub fn tc<const PART: u8>(ctx: &TcContext, w: &mut Work6) -> Carried {
    let f = parse::parse6(ctx, &mut w.pkt).map(|p| p.of(&w.pkt));
    if PART == DST {
        ingress::frame::<Tuple6>(ctx, f, || Ok(&mut w.flow))
    } else {
        egress::frame::<Tuple6>(ctx, f, &mut w.flow)
    }
}

/// tc egress: the node's own IPv6 packet to a frontend the egress flow left, parsed again
/// into the work area (the egress flow's frame is gone), then `out_dnat`'s dispatch.
#[inline(never)]
pub fn node(ctx: &TcContext, w: &mut Work6) -> Carried {
    out_dnat::frame::<Tuple6>(
        ctx,
        parse::parse6(ctx, &mut w.pkt).map(|p| p.of(&w.pkt)),
        &mut w.flow,
    )
}
