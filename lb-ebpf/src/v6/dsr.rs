//! IPv6's DSR option (`dsr.rs` pushes, reads and learns it, both families): the frontend
//! rides to the backend's node in a destination-options header of its own, inserted right
//! after the fixed header ([`lb_common::DSR6_OPT_TYPE`], 24 bytes: the MTU cost). Its option
//! type's top bits tell a node that does not know it to skip it, so the backend's stack
//! accepts the packet as sent; routers never read destination options. The L4 checksum
//! does not change: the pseudo-header holds the upper-layer length and the final
//! destination, neither touched.

use lb_common::{DSR6_HDR_LEN, DSR6_OPT_LEN, DSR6_OPT_TYPE};

use crate::parse::ETH_HLEN;

/// The next-header value of a destination-options header.
const NEXTHDR_DEST: u8 = 60;
/// The fixed header's payload length, next header and hop limit (one word).
pub const PLEN_OFF: usize = ETH_HLEN + 4;

/// The fixed header's word at `PLEN_OFF` (`w`) with the DSR header after the fixed header
/// (payload length + 24, next header: destination options), and that header naming the
/// frontend `addr_be`:`port_be`.
#[inline(always)]
pub fn build(w: u32, addr_be: &[u32; 4], port_be: u16) -> (u32, [u32; 6]) {
    let w = w.to_ne_bytes();
    let p = u16::from_be_bytes([w[0], w[1]])
        .wrapping_add(DSR6_HDR_LEN as u16)
        .to_be_bytes();
    let fixed = u32::from_ne_bytes([p[0], p[1], NEXTHDR_DEST, w[3]]);
    // Next header (the L4 protocol), length in 8-byte units beyond the first, the option.
    let head = u32::from_ne_bytes([w[2], DSR6_HDR_LEN / 8 - 1, DSR6_OPT_TYPE, DSR6_OPT_LEN]);
    let port = port_be.to_ne_bytes();
    // The port, then PadN with no data bytes: the header ends on its 8-byte boundary.
    let tail = u32::from_ne_bytes([port[0], port[1], 1, 0]);
    let a = addr_be;
    (fixed, [head, a[0], a[1], a[2], a[3], tail])
}

/// The frontend the DSR header `opt` names, if the fixed header's word `w` says a
/// destination-options header follows and `opt` is xlb's.
#[inline(always)]
pub fn parse(w: u32, opt: &[u32; 6]) -> Option<([u32; 4], u16)> {
    let head = opt[0].to_ne_bytes();
    if w.to_ne_bytes()[2] != NEXTHDR_DEST
        || head[1] != DSR6_HDR_LEN / 8 - 1
        || head[2] != DSR6_OPT_TYPE
        || head[3] != DSR6_OPT_LEN
    {
        return None;
    }
    let port = opt[5].to_ne_bytes();
    Some((
        [opt[1], opt[2], opt[3], opt[4]],
        u16::from_ne_bytes([port[0], port[1]]),
    ))
}
