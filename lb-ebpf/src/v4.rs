//! IPv4's leaf of the one flow: what [`Family`] asks of the family (the header's addresses
//! and checksum, the quote of an ICMP error, the DSR option's bytes), here or from
//! `parse.rs`'s tuple; the one flows (`nat.rs`'s rewrite, `fib.rs`'s route lookups,
//! `reject.rs`'s answers, `icmp.rs`, `dsr.rs`) use it. Nothing here knows IPv6.

use aya_ebpf::programs::{TcContext, XdpContext};
use lb_common::{
    Backend, CtKey, CtValue, DSR_OPT_LEN, DSR_OPT_TYPE, NodeConfig, R_NO_BACKEND, R_REWRITE_FAILED,
};

use crate::{
    affinity::{Client, ClientOf},
    egress,
    family::{Ends, Family, Message},
    ingress,
    maps::{FlowScratch, XLB_CT_V3, XLB_CTA_V1},
    nat::{DADDR, SADDR},
    out_dnat,
    packet::{Packet, csum_add, csum_apply, diff4, ld16, st16, st32},
    parse::{
        self, DIRECT_SCTP, DIRECT_TCP, DIRECT_UDP, ETH_HLEN, IP_CSUM_OFF, IP_DST_OFF, IP_SRC_OFF,
        IP_TTL_OFF, Icmp, L4_OFF, Tuple,
    },
    reason::{Carried, Reason},
    reject,
    select::{self, Frontend},
    shared::Shared,
    srcrange,
    work::Work,
    xdp,
};

// IPv4: `XLB_CT_V3` and `XLB_CTA_V1`, its scratch `FlowScratch` (`work::WorkArea::v4`).
crate::family::flow!(
    Tuple,
    CtKey,
    CtValue,
    FlowScratch,
    [u8; 28],
    XLB_CT_V3,
    XLB_CTA_V1
);

impl ClientOf for Tuple {
    #[inline(always)]
    fn client(&self) -> Client {
        Client::addr(self.saddr_be)
    }
}

impl Family for Tuple {
    type Front = Frontend;
    const DSR_LEN: u16 = DSR_OPT_LEN as u16;
    #[inline(always)]
    fn filter_word(a: &u32) -> u32 {
        *a
    }
    #[inline(always)]
    fn is_loopback(a: &u32) -> bool {
        select::is_loopback(*a)
    }
    #[inline(always)]
    fn front(addr: &u32, port_be: u16, proto: u8, scope: u8) -> Frontend {
        Frontend {
            addr_be: *addr,
            port_be,
            proto,
            scope,
        }
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
    const MIN_CHECKED: u32 = 576;
    #[inline(always)]
    fn df(&self) -> bool {
        self.df
    }
    #[inline(always)]
    fn l4_off(&self) -> usize {
        self.l4_off
    }
    type DirectTcp = [u8; DIRECT_TCP];
    type DirectUdp = [u8; DIRECT_UDP];
    type DirectSctp = [u8; DIRECT_SCTP];
    const L4_OFF: usize = L4_OFF;
    #[inline(always)]
    fn direct(&self) -> bool {
        self.direct
    }
    #[inline(always)]
    fn csum_off(&self) -> usize {
        self.csum_off
    }
    #[inline(always)]
    fn l4_len(&self) -> u32 {
        self.tot_len as u32 - (self.l4_off - ETH_HLEN) as u32
    }
    /// The header checksum updated with them.
    #[inline(always)]
    unsafe fn addrs_in_place<const PART: u8>(&self, p: *mut u8, to: &Shared<'_, CtValue>) -> u32 {
        let (saddr, daddr) = (*to.saddr(), *to.daddr());
        let mut addr = 0;
        // SAFETY (every access): the caller checked the header's bytes.
        unsafe {
            if PART & SADDR != 0 && saddr != self.saddr_be {
                addr = diff4(self.saddr_be, saddr);
                st32(p, IP_SRC_OFF, saddr);
            }
            if PART & DADDR != 0 && daddr != self.daddr_be {
                addr = csum_add(addr, diff4(self.daddr_be, daddr));
                st32(p, IP_DST_OFF, daddr);
            }
            if addr != 0 {
                st16(p, IP_CSUM_OFF, csum_apply(ld16(p, IP_CSUM_OFF), addr));
            }
        }
        addr
    }
    #[inline(always)]
    fn readdress<P: Packet, const PART: u8>(
        ctx: &P,
        (saddr_be, daddr_be): (&u32, &u32),
        (saddr, daddr): (&u32, &u32),
    ) -> Result<u32, Reason> {
        let failed = |_| Reason(R_REWRITE_FAILED);
        let (saddr, daddr) = (*saddr, *daddr);
        let mut addr = 0;
        if PART & DADDR != 0 && daddr != *daddr_be {
            addr = diff4(*daddr_be, daddr);
            ctx.l3_csum_replace(IP_CSUM_OFF, *daddr_be, daddr)
                .map_err(failed)?;
            ctx.store(IP_DST_OFF, &daddr).map_err(failed)?;
        }
        if PART & SADDR != 0 && saddr != *saddr_be {
            addr = csum_add(addr, diff4(*saddr_be, saddr));
            ctx.l3_csum_replace(IP_CSUM_OFF, *saddr_be, saddr)
                .map_err(failed)?;
            ctx.store(IP_SRC_OFF, &saddr).map_err(failed)?;
        }
        Ok(addr)
    }
    /// A packet with IP options is not answered: dropped, as a timeout would.
    #[inline(always)]
    fn refuse(&self, ctx: &TcContext, s: &mut FlowScratch, back: u64) -> Result<i32, Reason> {
        if !self.plain() {
            return Err(Reason(R_NO_BACKEND));
        }
        reject::refuse(ctx, self, &mut s.quote_old, back)
    }
    #[inline(always)]
    fn too_big(&self, ctx: &TcContext, s: &mut FlowScratch, mtu: u16) -> Result<i32, Reason> {
        reject::too_big(ctx, self, mtu, &mut s.quote_old)
    }
    const ICMP_PROTO: u8 = 1;
    /// Destination unreachable (3): port unreachable (3), fragmentation needed (4).
    const PORT_UNREACH: (u8, u8) = (3, 3);
    const TOO_BIG: (u8, u8) = (3, 4);
    /// No options; don't fragment; TTL 64; its header checksum.
    #[inline(always)]
    fn answer_header(&self, ctx: &TcContext, proto: u8, payload: u16) -> Result<(), Reason> {
        let (src, dst) = (self.daddr_be.to_ne_bytes(), self.saddr_be.to_ne_bytes());
        let t = (20 + payload).to_be_bytes();
        let mut h = [
            0x45, 0, t[0], t[1], 0, 0, 0x40, 0, 64, proto, 0, 0, src[0], src[1], src[2], src[3],
            dst[0], dst[1], dst[2], dst[3],
        ];
        let c = reject::fold(reject::sum16(&h, 0));
        h[10] = c[0];
        h[11] = c[1];
        ctx.store(ETH_HLEN, &h, 0)
            .map_err(|_| Reason(R_REWRITE_FAILED))
    }
    type Icmp = Icmp;
    /// ICMP's checksum covers its message only.
    const ICMP_PSEUDO: bool = false;
    /// The quoted IPv4 header (no options) and the first 8 bytes of its L4 header.
    const Q_PROTO: usize = 9;
    const Q_SRC: usize = 12;
    const Q_DST: usize = 16;
    const Q_L4: usize = 20;
    /// IPv4, a 20-byte header.
    #[inline(always)]
    fn quote_plain(q: &[u8; 28]) -> bool {
        q[0] == 0x45
    }
    #[inline(always)]
    fn quote_header_sum(q: &mut [u8; 28]) {
        q[10] = 0;
        q[11] = 0;
        let c = reject::fold(reject::sum16(&q[..20], 0));
        q[10] = c[0];
        q[11] = c[1];
    }
    const DSR_WORD_OFF: usize = ETH_HLEN;
    const HDR_CSUM_OFF: Option<usize> = Some(IP_CSUM_OFF);
    /// An IP option: its type, length and the port, then the address.
    type DsrOpt = [u32; 2];
    /// Version/IHL 0x47 (28 bytes), TOS as it was, total length + 8.
    #[inline(always)]
    fn dsr_build(w: u32, addr: &u32, port_be: u16) -> (u32, [u32; 2]) {
        let mut w0 = w.to_ne_bytes();
        w0[0] = 0x47;
        let tot = u16::from_be_bytes([w0[2], w0[3]]).wrapping_add(DSR_OPT_LEN as u16);
        w0[2..4].copy_from_slice(&tot.to_be_bytes());
        let port = port_be.to_ne_bytes();
        let opt0 = u32::from_ne_bytes([DSR_OPT_TYPE, DSR_OPT_LEN, port[0], port[1]]);
        (u32::from_ne_bytes(w0), [opt0, *addr])
    }
    #[inline(always)]
    fn dsr_parse(w: u32, opt: &[u32; 2]) -> Option<(u32, u16)> {
        let o = opt[0].to_ne_bytes();
        if w.to_ne_bytes()[0] != 0x47 || o[0] != DSR_OPT_TYPE || o[1] != DSR_OPT_LEN {
            return None;
        }
        Some((opt[1], u16::from_ne_bytes([o[2], o[3]])))
    }
    #[inline(always)]
    fn ip_len(&self) -> u16 {
        self.tot_len
    }
    type Hdr = [u8; L4_OFF];
    const TTL_OFF: usize = IP_TTL_OFF;
}

impl Message for Icmp {
    type Addr = u32;
    #[inline(always)]
    fn addrs(&self) -> (&u32, &u32) {
        (&self.saddr_be, &self.daddr_be)
    }
    #[inline(always)]
    fn icmp_off(&self) -> usize {
        self.l4_off
    }
    #[inline(always)]
    fn end(&self) -> usize {
        ETH_HLEN + self.tot_len as usize
    }
    /// Destination unreachable (3, fragmentation needed among its codes), time exceeded
    /// (11).
    #[inline(always)]
    fn quotes_packet(&self, ctx: &TcContext) -> Result<bool, Reason> {
        let t: u8 = ctx
            .load(self.l4_off)
            .map_err(|_| Reason(R_REWRITE_FAILED))?;
        Ok(t == 3 || t == 11)
    }
}

/// XDP for an IPv4 frame of `len` bytes: parsed here (its tuple on this frame), then XDP's
/// dispatch (`front`: the entry's early pass's finding, if it tested the filters). Out of line: inline, the entry's frame and the deepest step's go over 512
/// bytes.
#[inline(never)]
pub fn xdp<'a>(
    ctx: &XdpContext,
    work: impl Work<'a, FlowScratch>,
    len: u32,
    front: Option<bool>,
) -> Carried {
    xdp::frame::<Tuple>(ctx, parse::parse_ipv4(ctx, len), work, len, front)
}

/// tc egress: the node's own IPv4 packet to a frontend the egress flow left, parsed again
/// (its frame is gone), then `out_dnat`'s dispatch.
#[inline(never)]
pub fn node(ctx: &TcContext, s: &mut FlowScratch) -> Carried {
    out_dnat::frame::<Tuple>(ctx, parse::parse_ipv4(ctx, ctx.len()), s)
}

/// tc ingress for an IPv4 packet: parsed here, then the hook's dispatch. Inline in the
/// entry: a packet that is no service's passes with no call at all (the flow's steps are
/// out of line, so their frames do not add to this one).
#[inline(always)]
pub fn tc_in<'a>(ctx: &TcContext, work: impl Work<'a, FlowScratch>) -> Carried {
    ingress::frame::<Tuple>(ctx, parse::parse_ipv4(ctx, ctx.len()), work)
}

/// tc egress for an IPv4 packet: parsed here (its tuple on this frame), then the hook's
/// dispatch. Out of line: its frame (the tuple's) is gone when the entry goes on to the
/// node's own flow (`out_dnat`).
#[inline(never)]
pub fn tc_out(ctx: &TcContext, s: &mut FlowScratch) -> Carried {
    egress::frame::<Tuple>(ctx, parse::parse_ipv4(ctx, ctx.len()), s)
}
