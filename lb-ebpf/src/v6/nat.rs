//! IPv6 address and port rewrites: no IP header checksum, the L4 checksum updated for the
//! pseudo-header's addresses and the ports (one combined diff each, as IPv4's rewrites).

use aya_ebpf::programs::{TcContext, XdpContext};
use lb_common::{CtValue6, IPPROTO_UDP, R_REWRITE_FAILED};

use super::{
    conntrack::eq6,
    parse::{IP6_DST_OFF, IP6_SRC_OFF, Tuple6},
};
use crate::{
    packet::{Packet, csum_add, csum_apply, diff2, diff4},
    reason::Reason,
};

/// The partial-sum change of an IPv6 address going `from` → `to`.
#[inline(always)]
pub fn diff16(from: &[u32; 4], to: &[u32; 4]) -> u32 {
    let mut d = 0;
    for i in 0..4 {
        d = csum_add(d, diff4(from[i], to[i]));
    }
    d
}

#[inline(always)]
fn failed<E>(_: E) -> Reason {
    Reason(R_REWRITE_FAILED)
}

/// Rewrites the packet's tuple into the one a conntrack entry holds (as IPv4's
/// `nat::apply`), through the store and checksum helpers: an IPv6 packet's L4 header sits
/// at a variable offset behind its extension headers.
#[inline(always)]
pub fn apply<P: L4Sum>(ctx: &P, t: &Tuple6, to: &CtValue6) -> Result<(), Reason> {
    let mut addr = 0;
    if !eq6(&t.saddr_be, &to.saddr_be) {
        addr = diff16(&t.saddr_be, &to.saddr_be);
        ctx.store(IP6_SRC_OFF, &to.saddr_be).map_err(failed)?;
    }
    if !eq6(&t.daddr_be, &to.daddr_be) {
        addr = csum_add(addr, diff16(&t.daddr_be, &to.daddr_be));
        ctx.store(IP6_DST_OFF, &to.daddr_be).map_err(failed)?;
    }
    let mut port = 0;
    if to.sport_be != t.sport_be {
        port = diff2(t.sport_be, to.sport_be);
        ctx.store(t.l4_off as usize, &to.sport_be).map_err(failed)?;
    }
    if to.dport_be != t.dport_be {
        port = csum_add(port, diff2(t.dport_be, to.dport_be));
        ctx.store(t.l4_off as usize + 2, &to.dport_be)
            .map_err(failed)?;
    }
    ctx.l4_sum(t.csum_off as usize, addr, port, t.proto == IPPROTO_UDP)
        .map_err(failed)
}

/// The L4 checksum update at a variable offset (behind extension headers), per hook.
pub trait L4Sum: Packet {
    /// Applies `addr` (pseudo-header words) and `port` (L4 header words) diffs to the
    /// checksum at `off`; `udp`: a 0 checksum stays 0 and a computed 0 is sent as 0xffff.
    fn l4_sum(&self, off: usize, addr: u32, port: u32, udp: bool) -> Result<(), ()>;
}

impl L4Sum for TcContext {
    #[inline(always)]
    fn l4_sum(&self, off: usize, addr: u32, port: u32, udp: bool) -> Result<(), ()> {
        self.l4_csum_diff(off, addr, port, udp)
    }
}

impl L4Sum for XdpContext {
    /// Through the load and store helpers: XDP's own `l4_csum_diff` reads in place, at
    /// constant offsets only.
    #[inline(always)]
    fn l4_sum(&self, off: usize, addr: u32, port: u32, udp: bool) -> Result<(), ()> {
        let old: u16 = self.load(off)?;
        if udp && old == 0 {
            return Ok(());
        }
        let mut new = csum_apply(old, csum_add(addr, port));
        if udp && new == 0 {
            new = 0xffff;
        }
        self.store(off, &new)
    }
}
