//! IPv6's leaf of the one flow: what [`Family`] asks of the family, answered by the IPv6
//! modules beside this one. Nothing here knows IPv4.

use aya_ebpf::programs::TcContext;
use lb_common::{Backend, CtValue6, DSR6_HDR_LEN, NodeConfig, R_REWRITE_FAILED, filter_fold};

use super::{
    dsr,
    maps::FlowScratch6,
    parse::{
        DIRECT6_SCTP, DIRECT6_TCP, DIRECT6_UDP, HOP_LIMIT_OFF, IP6_DST_OFF, IP6_HLEN, IP6_L4_OFF,
        IP6_SRC_OFF, IPPROTO_ICMPV6, Tuple6,
    },
    reject,
};
use crate::{
    addr::eq6,
    family::{Ends, Family, Message},
    nat::{DADDR, SADDR},
    packet::{Packet, csum_add, diff4, st32},
    reason::Reason,
    select::Frontend6,
    shared::Shared,
    srcrange,
};

impl Family for Tuple6 {
    type Front = Frontend6;
    const DSR_LEN: u16 = DSR6_HDR_LEN as u16;
    /// The address's four words folded (`lb_common::filter_fold`, as the agent sets the
    /// bits), so the addresses of one /32 do not share a bit.
    #[inline(always)]
    fn filter_word(a: &[u32; 4]) -> u32 {
        filter_fold(a)
    }
    /// ::1.
    #[inline(always)]
    fn is_loopback(a: &[u32; 4]) -> bool {
        a[0] | a[1] | a[2] == 0 && a[3] == 1u32.to_be()
    }
    #[inline(always)]
    fn front(addr: &[u32; 4], port_be: u16, proto: u8, scope: u8) -> Frontend6 {
        Frontend6 {
            addr_be: *addr,
            port_be,
            proto,
            scope,
        }
    }
    #[inline(always)]
    fn backend_addr(be: &Backend) -> &[u32; 4] {
        &be.addr_be
    }
    #[inline(always)]
    fn src_allowed(&self, svc_id: u32) -> bool {
        srcrange::allowed6(svc_id, &self.saddr_be)
    }
    #[inline(always)]
    fn hairpin(cfg: &NodeConfig) -> [u32; 4] {
        cfg.hairpin6_addr_be
    }
    const MIN_CHECKED: u32 = 1280;
    #[inline(always)]
    fn df(&self) -> bool {
        true
    }
    #[inline(always)]
    fn l4_off(&self) -> usize {
        self.l4_off as usize
    }
    type DirectTcp = [u8; DIRECT6_TCP];
    type DirectUdp = [u8; DIRECT6_UDP];
    type DirectSctp = [u8; DIRECT6_SCTP];
    const L4_OFF: usize = IP6_L4_OFF;
    #[inline(always)]
    fn direct(&self) -> bool {
        self.direct != 0
    }
    #[inline(always)]
    fn csum_off(&self) -> usize {
        self.csum_off as usize
    }
    /// The payload but its extension headers.
    #[inline(always)]
    fn l4_len(&self) -> u32 {
        self.payload_len - (self.l4_off - IP6_L4_OFF as u32)
    }
    /// No header checksum.
    #[inline(always)]
    unsafe fn addrs_in_place<const PART: u8>(&self, p: *mut u8, to: &Shared<'_, CtValue6>) -> u32 {
        let mut addr = 0;
        // SAFETY (every access): the caller checked the header's bytes.
        unsafe {
            if PART & SADDR != 0 && !eq6(&self.saddr_be, to.saddr()) {
                addr = diff16(&self.saddr_be, to.saddr());
                for i in 0..4 {
                    st32(p, IP6_SRC_OFF + 4 * i, to.saddr()[i]);
                }
            }
            if PART & DADDR != 0 && !eq6(&self.daddr_be, to.daddr()) {
                addr = csum_add(addr, diff16(&self.daddr_be, to.daddr()));
                for i in 0..4 {
                    st32(p, IP6_DST_OFF + 4 * i, to.daddr()[i]);
                }
            }
        }
        addr
    }
    #[inline(always)]
    fn readdress<P: Packet, const PART: u8>(
        ctx: &P,
        (saddr_be, daddr_be): (&[u32; 4], &[u32; 4]),
        (saddr, daddr): (&[u32; 4], &[u32; 4]),
    ) -> Result<u32, Reason> {
        let failed = |_| Reason(R_REWRITE_FAILED);
        let mut addr = 0;
        if PART & SADDR != 0 && !eq6(saddr_be, saddr) {
            addr = diff16(saddr_be, saddr);
            ctx.store(IP6_SRC_OFF, saddr).map_err(failed)?;
        }
        if PART & DADDR != 0 && !eq6(daddr_be, daddr) {
            addr = csum_add(addr, diff16(daddr_be, daddr));
            ctx.store(IP6_DST_OFF, daddr).map_err(failed)?;
        }
        Ok(addr)
    }
    #[inline(always)]
    fn refuse(&self, ctx: &TcContext, s: &mut FlowScratch6, back: u64) -> Result<i32, Reason> {
        crate::reject::refuse(ctx, self, &mut s.quote_old, back)
    }
    #[inline(always)]
    fn too_big(&self, ctx: &TcContext, s: &mut FlowScratch6, mtu: u16) -> Result<i32, Reason> {
        crate::reject::too_big(ctx, self, mtu, &mut s.quote_old)
    }
    const ICMP_PROTO: u8 = IPPROTO_ICMPV6;
    /// Destination unreachable (1): port unreachable (4); Packet Too Big (2, code 0).
    const PORT_UNREACH: (u8, u8) = (1, 4);
    const TOO_BIG: (u8, u8) = (2, 0);
    #[inline(always)]
    fn answer_header(&self, ctx: &TcContext, proto: u8, payload: u16) -> Result<(), Reason> {
        reject::header(ctx, self, proto, payload)
    }
    /// The parse leaves an ICMPv6 message in the tuple (its type, where it starts).
    type Icmp = Tuple6;
    const ICMP_PSEUDO: bool = true;
    /// The quoted fixed header and the first 8 bytes of its L4 header (a quote with
    /// extension headers is left alone: its ports are further in).
    const Q_PROTO: usize = 6;
    const Q_SRC: usize = 8;
    const Q_DST: usize = 24;
    const Q_L4: usize = 40;
    #[inline(always)]
    fn quote_plain(q: &[u8; 48]) -> bool {
        q[0] >> 4 == 6
    }
    /// No header checksum.
    #[inline(always)]
    fn quote_header_sum(_: &mut [u8; 48]) {}
    const DSR_WORD_OFF: usize = dsr::PLEN_OFF;
    const HDR_CSUM_OFF: Option<usize> = None;
    /// A destination-options header of its own (`v6/dsr.rs`).
    type DsrOpt = [u32; 6];
    #[inline(always)]
    fn dsr_build(w: u32, addr: &[u32; 4], port_be: u16) -> (u32, [u32; 6]) {
        dsr::build(w, addr, port_be)
    }
    #[inline(always)]
    fn dsr_parse(w: u32, opt: &[u32; 6]) -> Option<([u32; 4], u16)> {
        dsr::parse(w, opt)
    }
    /// The fixed header's 40 bytes and the payload (extension headers and L4).
    #[inline(always)]
    fn ip_len(&self) -> u16 {
        (IP6_HLEN + self.payload_len) as u16
    }
    type Hdr = [u8; IP6_L4_OFF];
    const TTL_OFF: usize = HOP_LIMIT_OFF;
}

impl Message for Tuple6 {
    type Addr = [u32; 4];
    #[inline(always)]
    fn addrs(&self) -> (&[u32; 4], &[u32; 4]) {
        (&self.saddr_be, &self.daddr_be)
    }
    #[inline(always)]
    fn icmp_off(&self) -> usize {
        self.l4_off as usize
    }
    #[inline(always)]
    fn end(&self) -> usize {
        IP6_L4_OFF + self.payload_len as usize
    }
    /// Destination unreachable (1), Packet Too Big (2), time exceeded (3).
    #[inline(always)]
    fn quotes_packet(&self, _: &TcContext) -> Result<bool, Reason> {
        Ok((1..=3).contains(&self.icmp_type))
    }
}

/// The partial-sum change of an IPv6 address going `from` → `to`.
#[inline(always)]
fn diff16(from: &[u32; 4], to: &[u32; 4]) -> u32 {
    let mut d = 0;
    for i in 0..4 {
        d = csum_add(d, diff4(from[i], to[i]));
    }
    d
}
