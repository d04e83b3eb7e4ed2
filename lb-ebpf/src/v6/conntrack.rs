//! IPv6 per-flow state: IPv6's part of the conntrack, its tables `XLB_CT6_V1` and
//! `XLB_CTA6_V1` and its scratch, named to `family::flow!`. The flow logic is
//! `conntrack.rs`'s, generic over the tuple ([`Flow`]): forward entry client → frontend,
//! reply entry backend → client, an answered flow that goes on moves to the assured table,
//! a new flow's reply tuple is claimed as IPv4's (a live flow's tuple remaps the port, a
//! flow that is over is reclaimed).

use lb_common::{CtKey6, CtValue6};

use super::{
    maps::{FlowScratch6, XLB_CT6_V1, XLB_CTA6_V1},
    parse::Tuple6,
};
use crate::affinity::{Client, ClientOf};

impl ClientOf for Tuple6 {
    #[inline(always)]
    fn client(&self) -> Client {
        Client::addr6(self.saddr_be)
    }
}

// IPv6: `XLB_CT6_V1` and `XLB_CTA6_V1`, its scratch `FlowScratch6` (`work::WorkArea::v6`).
crate::family::flow!(
    Tuple6,
    CtKey6,
    CtValue6,
    FlowScratch6,
    [u8; 48],
    XLB_CT6_V1,
    XLB_CTA6_V1
);
