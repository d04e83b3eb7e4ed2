//! Conntrack entries of either family (`XLB_CT_V*`/`XLB_CTA_V*` for IPv4, `XLB_CT6_V1`/
//! `XLB_CTA6_V1` for IPv6), as the trace shows them.

use std::net::SocketAddr;

use lb_common::{CT_DIR_FORWARD, CtKey, CtKey6, CtValue, CtValue6, FAMILY_V4, FAMILY_V6};

use super::sock;
use crate::{
    datapath::scratch::{Change, Run, Scratch},
    model::Protocol,
};

/// One conntrack entry a run wrote: its tuple, the tuple its packets are rewritten to, and
/// what it records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Flow {
    /// `CT_DIR_FORWARD` or `CT_DIR_REPLY`.
    pub dir: u8,
    pub key_src: SocketAddr,
    pub key_dst: SocketAddr,
    pub to_src: SocketAddr,
    pub to_dst: SocketAddr,
    pub backend_id: u32,
    /// `CT_F_*`.
    pub flags: u16,
    /// The entry was there before the run (refreshed, not created).
    pub existed: bool,
}

fn v4(a: u32, port_be: u16) -> SocketAddr {
    sock([a, 0, 0, 0], FAMILY_V4, port_be)
}

fn v6(a: [u32; 4], port_be: u16) -> SocketAddr {
    sock(a, FAMILY_V6, port_be)
}

impl Flow {
    fn of4(c: &Change<CtKey, CtValue>) -> Self {
        let (k, v) = (&c.key, &c.after);
        Self {
            dir: k.dir,
            key_src: v4(k.saddr_be, k.sport_be),
            key_dst: v4(k.daddr_be, k.dport_be),
            to_src: v4(v.saddr_be, v.sport_be),
            to_dst: v4(v.daddr_be, v.dport_be),
            backend_id: v.backend_id,
            flags: v.flags,
            existed: c.before.is_some(),
        }
    }

    fn of6(c: &Change<CtKey6, CtValue6>) -> Self {
        let (k, v) = (&c.key, &c.after);
        Self {
            dir: k.dir,
            key_src: v6(k.saddr_be, k.sport_be),
            key_dst: v6(k.daddr_be, k.dport_be),
            to_src: v6(v.saddr_be, v.sport_be),
            to_dst: v6(v.daddr_be, v.dport_be),
            backend_id: v.backend_id,
            flags: v.flags,
            existed: c.before.is_some(),
        }
    }
}

/// Every conntrack entry the run wrote, of both families, forward entries first.
pub(super) fn written(run: &Run) -> Vec<Flow> {
    let mut out: Vec<Flow> = run.conntrack.iter().map(Flow::of4).collect();
    out.extend(run.conntrack6.iter().map(Flow::of6));
    out.sort_by_key(|f| f.dir);
    out
}

/// The run's forward entry (the flow's own direction), if it wrote one.
pub(super) fn forward(run: &Run) -> Option<Flow> {
    written(run).into_iter().find(|f| f.dir == CT_DIR_FORWARD)
}

/// Where the live forward entry of the tuple `src` → `dst` sends its packets, if the flow
/// is tracked.
pub(super) fn tracked(
    scratch: &Scratch,
    src: SocketAddr,
    dst: SocketAddr,
    proto: Protocol,
) -> Option<SocketAddr> {
    let words = |a: SocketAddr| lb_common::user::addr_words(a.ip()).0;
    match (src, dst) {
        (SocketAddr::V4(_), SocketAddr::V4(_)) => {
            let key = CtKey {
                saddr_be: words(src)[0],
                daddr_be: words(dst)[0],
                sport_be: src.port().to_be(),
                dport_be: dst.port().to_be(),
                proto: proto.number(),
                dir: CT_DIR_FORWARD,
                _pad: 0,
            };
            scratch
                .conntrack_entry(&key)
                .map(|v| v4(v.daddr_be, v.dport_be))
        }
        _ => {
            let key = CtKey6 {
                saddr_be: words(src),
                daddr_be: words(dst),
                sport_be: src.port().to_be(),
                dport_be: dst.port().to_be(),
                proto: proto.number(),
                dir: CT_DIR_FORWARD,
                _pad: 0,
            };
            scratch
                .conntrack6_entry(&key)
                .map(|v| v6(v.daddr_be, v.dport_be))
        }
    }
}
