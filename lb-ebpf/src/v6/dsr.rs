//! Direct server return for IPv6, as IPv4's (`dsr.rs`): the frontend rides to the backend's
//! node in a destination-options header of its own, inserted right after the fixed header
//! ([`lb_common::DSR6_OPT_TYPE`], 24 bytes: the MTU cost). Its option type's top bits tell
//! a node that does not know it to skip it, so the backend's stack accepts the packet as
//! sent; routers never read destination options. The L4 checksum does not change: the
//! pseudo-header holds the upper-layer length and the final destination, neither touched.

use aya_ebpf::programs::TcContext;
use lb_common::{CtValue6, DSR6_HDR_LEN, DSR6_OPT_LEN, DSR6_OPT_TYPE, R_REWRITE_FAILED};

use super::parse::{IP6_L4_OFF, Tuple6};
use crate::{dsr::ADJ_ROOM_NET, packet::Packet, parse::ETH_HLEN, reason::Reason};

/// The next-header value of a destination-options header.
const NEXTHDR_DEST: u8 = 60;
/// The fixed header's payload length, next header and hop limit (one word).
const PLEN_OFF: usize = ETH_HLEN + 4;

/// Inserts the DSR header naming the frontend `addr_be`:`port_be` after the fixed header of
/// a packet without extension headers, leaving for its backend's node (tc egress): 24 bytes
/// of room, the header written there, the fixed header's payload length and next header
/// made to match.
#[inline(never)]
pub fn push(ctx: &TcContext, addr_be: &[u32; 4], port_be: u16) -> Result<(), Reason> {
    let failed = |()| Reason(R_REWRITE_FAILED);
    let w: [u8; 4] = Packet::load(ctx, PLEN_OFF).map_err(failed)?;
    ctx.adjust_room(DSR6_HDR_LEN as i32, ADJ_ROOM_NET, 0)
        .map_err(|_| Reason(R_REWRITE_FAILED))?;
    let plen = u16::from_be_bytes([w[0], w[1]]).wrapping_add(DSR6_HDR_LEN as u16);
    let p = plen.to_be_bytes();
    let fixed = u32::from_ne_bytes([p[0], p[1], NEXTHDR_DEST, w[3]]);
    // Next header (the L4 protocol), length in 8-byte units beyond the first, the option.
    let head = u32::from_ne_bytes([w[2], DSR6_HDR_LEN / 8 - 1, DSR6_OPT_TYPE, DSR6_OPT_LEN]);
    let port = port_be.to_ne_bytes();
    // The port, then PadN with no data bytes: the header ends on its 8-byte boundary.
    let tail = u32::from_ne_bytes([port[0], port[1], 1, 0]);
    Packet::store(ctx, PLEN_OFF, &fixed).map_err(failed)?;
    Packet::store(ctx, IP6_L4_OFF, &head).map_err(failed)?;
    for i in 0..4 {
        Packet::store(ctx, IP6_L4_OFF + 4 + 4 * i, &addr_be[i]).map_err(failed)?;
    }
    Packet::store(ctx, IP6_L4_OFF + 20, &tail).map_err(failed)
}

/// On the backend's node: whether the packet (parsed into `t`) carries the DSR header; if so
/// the frontend it names is read into `front`'s source (its address and port), where
/// [`learn`] takes it.
#[inline(always)]
pub fn read_option<P: Packet>(ctx: &P, t: &Tuple6, front: &mut CtValue6) -> bool {
    if t.l4_off != IP6_L4_OFF as u32 + DSR6_HDR_LEN as u32 {
        return false;
    }
    let Ok(fixed) = ctx.load::<[u8; 4]>(PLEN_OFF) else {
        return false;
    };
    let Ok(head) = ctx.load::<[u8; 4]>(IP6_L4_OFF) else {
        return false;
    };
    if fixed[2] != NEXTHDR_DEST
        || head[1] != DSR6_HDR_LEN / 8 - 1
        || head[2] != DSR6_OPT_TYPE
        || head[3] != DSR6_OPT_LEN
    {
        return false;
    }
    for i in 0..4 {
        match ctx.load::<u32>(IP6_L4_OFF + 4 + 4 * i) {
            Ok(a) => front.saddr_be[i] = a,
            Err(()) => return false,
        }
    }
    match ctx.load::<u16>(IP6_L4_OFF + 20) {
        Ok(p) => front.sport_be = p,
        Err(()) => return false,
    }
    true
}
