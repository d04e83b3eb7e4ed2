//! XDP's one flow, for both families (the entry parses the frame with its family's leaf and
//! runs [`flow`] monomorphised for it), on the node's external interfaces: NodePort, LoadBalancer and externalIP traffic (new
//! and established flows) and the replies of SNATed flows are translated before the kernel
//! allocates an skb, then sent out with `bpf_fib_lookup` + redirect when the egress
//! interface takes XDP frames (both sides translated: such a flow enters and leaves by node
//! interfaces, so its replies come back through XDP too and neither way meets netfilter),
//! or passed to the stack with only the destination side translated, as tc ingress would
//! (netfilter then sees the flow as under kube-proxy; tc egress restores the source side).
//!
//! Which of the two is a flow's, once found, is kept in its conntrack entry
//! (`CT_F_XDP_STACK`, forgotten with the once-a-second refresh): a packet into the stack
//! then costs what tc's does, with no route lookup. A new flow to a backend on this node
//! always goes into the stack (a pod's veth takes no XDP frames) without a lookup; one to a
//! remote backend takes the way out kept for its backend (`fib::backend_hop`: looked up at
//! most once a second per backend, ingress interface and CPU), where the node's routes
//! depend on the destination alone (the agent says so in the node config, from its `ip
//! rule`s); else it looks its own route up once (a source-keyed cache a new client misses).
//!
//! Whatever XDP cannot finish is passed to the stack untouched, where the tc program does the
//! whole job: ICMP, refusals (no endpoints), fragmentation needed, unresolved neighbours,
//! re-balanced UDP flows, and packets whose checksum is still to be completed by offload
//! (`CHECKSUM_PARTIAL` from a local veth peer: XDP cannot see that state, tc's helpers keep
//! it right).

use core::borrow::Borrow;

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS, XDP_REDIRECT},
    programs::XdpContext,
};
use lb_common::{
    BE_F_REMOTE, CT_F_XDP_STACK, IPPROTO_SCTP, IPPROTO_UDP, R_ESTABLISHED, R_MALFORMED, R_NEW_FLOW,
    R_PASS, R_REPLY_IN, R_REVERSE_NAT, R_REWRITE_FAILED, R_XDP_REDIRECT, SCOPE_EXTERNAL, SvcValue,
};

use crate::{
    conntrack::{self, Ct, continues, touch},
    dsr,
    family::{Ends, Family, Mtu, View},
    fib::{Hop, Way},
    filter::{self, Filters},
    flow::{self, keep_alive},
    maps::XLB_XDPTX_V1,
    nat::{self, BOTH},
    packet::{Packet, at, csum_apply, csum_replace, diff2, ld16, st16, st32},
    parse::Frame,
    reason::{self, Carried, Reason, Then},
    select,
    shared::Shared,
    work::Work,
};

/// The XDP program's outcome.
pub type XdpOutcome = reason::Outcome<u32>;

#[inline(always)]
fn pass(reason: u32) -> XdpOutcome {
    Ok((XDP_PASS, Reason(reason)))
}

/// XDP for a frame of `len` bytes its family's leaf parsed (`v4::xdp`, `v6::xdp::xdp`): the
/// one flow; anything but TCP, UDP and SCTP passes (ICMP: tc translates it), a malformed
/// frame is dropped.
#[inline(always)]
pub fn frame<'a, F: Family>(
    ctx: &XdpContext,
    f: Result<Frame<impl Borrow<F>, impl Borrow<F::Icmp>>, Reason>,
    work: impl Work<'a, F::Scratch>,
    len: u32,
    front: Option<bool>,
) -> Carried {
    match f {
        Ok(Frame::Flow(t)) => flow(ctx, t.borrow(), work, len, front),
        Ok(Frame::Icmp(_)) => Carried::done::<u32>(Ok((XDP_PASS, Reason(R_PASS)))),
        Ok(Frame::Pass(r)) => Carried::done::<u32>(Ok((XDP_PASS, r))),
        Err(r) => Carried::done::<u32>(Err(r)),
    }
}

/// A frame's parsed TCP or UDP packet `t` (its family's leaf parsed it; `s`: the family's
/// part of the run's work area; `len`: the frame's length; `front`: whether its destination
/// may be a frontend, if the entry's early pass tested its filters already). The same order as tc: the
/// address filters, a tracked flow from its entry alone, then replies, then the service
/// map for a new flow. The tracked step, the hot path's, runs inline (a packet of an
/// established flow or a reply makes one call, its family's leaf); the new-flow steps are
/// out of line, called from here.
#[inline(always)]
pub fn flow<'a, F: Family>(
    ctx: &XdpContext,
    t: &F,
    work: impl Work<'a, F::Scratch>,
    len: u32,
    front: Option<bool>,
) -> Carried {
    if t.proto() == IPPROTO_SCTP {
        // Left to tc, whose rewrite keeps SCTP's checksum (XDP's redirect and its
        // checksum steps are TCP's and UDP's).
        return Carried::done(pass(R_PASS));
    }
    let front = match front {
        // The entry tested the filters already (and passed a frame neither to a frontend
        // nor from a backend).
        Some(front) => front,
        None => {
            let filters = Filters::load();
            let front = filters.frontend(F::filter_word(t.daddr()));
            if !front && !filters.backend(F::filter_word(t.saddr())) {
                // Neither to a frontend nor from a backend: no flow of ours (no call out of
                // line, no work area).
                return Carried::done(pass(R_PASS));
            }
            front
        }
    };
    let s = match work() {
        Ok(s) => s,
        Err(r) => return Carried::done::<u32>(Err(r)),
    };
    match Carried::then(tracked(ctx, t, front, s, len)).next::<u32>() {
        Then::Next(_) => {}
        Then::Done(o) => return Carried::done(o),
        Then::Refuse | Then::FragNeeded(_) => return Carried::done(pass(R_PASS)),
    }
    if !front || F::is_loopback(t.daddr()) {
        return Carried::done(pass(R_PASS));
    }
    let Some(svc) = select::lookup(&t.frontend(SCOPE_EXTERNAL)) else {
        return Carried::done(pass(R_PASS));
    };
    match checksum_partial(ctx, t) {
        Ok(false) => {}
        Ok(true) => return Carried::done(pass(R_PASS)),
        Err(r) => return Carried::done::<u32>(Err(r)),
    }
    match choose(t, svc, s).next::<u32>() {
        Then::Next(_) => {}
        Then::Done(o) => return Carried::done(o),
        Then::Refuse | Then::FragNeeded(_) => return Carried::done(pass(R_PASS)),
    }
    match start(ctx, t, svc, s).next::<u32>() {
        Then::Next(_) => send_new(ctx, t, s, len),
        Then::Done(o) => Carried::done(o),
        Then::Refuse | Then::FragNeeded(_) => Carried::done(pass(R_PASS)),
    }
}

/// A packet of a tracked flow or a reply of one; else [`Then::Next`]. `front`: the
/// destination may be a frontend (its address filter bit); when it may not, [`flow`] found
/// the source may be a backend (else the packet passed there). Inline in [`flow`]: the
/// chain of frames it adds to stays within the 512 bytes (480 at most, IPv6's new flow).
#[inline(always)]
fn tracked<F: Family>(
    ctx: &XdpContext,
    t: &F,
    front: bool,
    s: &mut F::Scratch,
    len: u32,
) -> Result<Then<u32>, Reason> {
    let forward = if front {
        conntrack::lookup_forward(t)
    } else {
        None
    };
    // Not to a frontend: `flow` tested the source's bit already. The source's bit only
    // when no forward entry was found (a hot established packet hashes one address).
    let reply = if forward.is_none() && (!front || filter::maybe_backend(F::filter_word(t.saddr())))
    {
        conntrack::lookup_reply(t)
    } else {
        None
    };
    if forward.is_none() && reply.is_none() {
        return Ok(Then::Next(Reason(R_NEW_FLOW)));
    }
    if checksum_partial(ctx, t)? {
        return Ok(Then::Done(pass(R_PASS)));
    }
    if let Some(ct) = forward {
        if !continues(&ct, t) {
            // Re-balanced (UDP to a removed backend) or started over (a reused TCP port) by tc.
            return Ok(Then::Done(pass(R_PASS)));
        }
        return Ok(Then::Done(established(ctx, t, ct, s, len)));
    }
    Ok(Then::Done(match reply {
        Some(ct) => {
            touch(&ct, t);
            reply_of(ctx, t, ct, len)
        }
        None => pass(R_PASS),
    }))
}

/// A packet of a tracked flow to its backend: into the stack as tc would send it when the
/// entry says its way out takes no XDP frames (no route lookup), else by the way its route
/// gives (remembered in the entry when that is the stack). Inline in [`tracked`]: a frame
/// of its own would make the call chain too deep for the 512 bytes.
#[inline(always)]
fn established<F: Family>(
    ctx: &XdpContext,
    t: &F,
    ct: Ct<F>,
    s: &mut F::Scratch,
    len: u32,
) -> XdpOutcome {
    // A DSR packet that carries the frontend to the backend's node: tc adds the option.
    if ct.flags() & lb_common::CT_F_DSR != 0 && dsr::carries(t) {
        return pass(R_PASS);
    }
    if ct.flags() & CT_F_XDP_STACK == 0 {
        match way(ctx, t, &ct) {
            Way::Tc => return pass(R_PASS),
            Way::Redirect(hop) => {
                let ct = keep_alive(ct, t, s)?;
                return redirect(ctx, t, &ct, &hop, R_ESTABLISHED, len);
            }
            Way::Stack => {
                ct.add_flags(CT_F_XDP_STACK);
                // The route lookup has just checked this size.
                ct.set_mtu(ct.mtu().max(t.ip_len()));
            }
        }
    }
    // tc's steps for an established packet, the answer to a packet too big left to tc.
    match t.check_mtu(ctx, ct.daddr(), ct.mtu(), 0) {
        Mtu::TooBig(_) => return pass(R_PASS),
        Mtu::Fits(len) => ct.set_mtu(len),
        Mtu::Unchecked => {}
    }
    let ct = keep_alive(ct, t, s)?;
    nat::forward_in(ctx, t, &ct)?;
    conntrack::count(&ct, len);
    pass(R_ESTABLISHED)
}

/// A backend's reply of a tracked flow (already touched): as [`established`], its
/// destination side translated into the stack (tc egress restores the source), or both
/// sides redirected. Inline in [`tracked`] too.
#[inline(always)]
fn reply_of<F: Family>(ctx: &XdpContext, t: &F, ct: Ct<F>, len: u32) -> XdpOutcome {
    if ct.flags() & CT_F_XDP_STACK == 0 {
        match way_back(ctx, t, &ct) {
            Way::Tc => return pass(R_PASS),
            Way::Redirect(hop) => return redirect(ctx, t, &ct, &hop, R_REVERSE_NAT, len),
            Way::Stack => ct.add_flags(CT_F_XDP_STACK),
        }
    }
    nat::reply_in(ctx, t, &ct)?;
    pass(R_REPLY_IN)
}

/// A new flow's backend, into the scratch (`Parts::chosen`): dropped when its source is
/// outside the frontend's source ranges; left to tc when the frontend has no endpoints (tc
/// builds the refusal).
#[inline(never)]
fn choose<F: Family>(t: &F, svc: &SvcValue, s: &mut F::Scratch) -> Carried {
    Carried::then(try_choose(t, svc, s))
}

#[inline(always)]
fn try_choose<F: Family>(t: &F, svc: &SvcValue, s: &mut F::Scratch) -> Result<Then<u32>, Reason> {
    flow::admitted(t, svc)?;
    if svc.count == 0 {
        return Ok(Then::Done(pass(R_PASS)));
    }
    let c = select::choose(&t.client(), svc, Some(t.flow_hash()))?;
    F::parts(s).chosen.set(&c);
    Ok(Then::Next(Reason(R_NEW_FLOW)))
}

/// A new flow to the backend [`choose`] put in the scratch: to a backend on this node into
/// the stack (a pod's veth takes no XDP frames; tc's MTU check, no route lookup); to a
/// remote one by its route when that is ready (the neighbour known, the packet fits).
/// Recorded ([`Then::Next`]: [`send_new`] sends it on); else left to tc (and a DSR flow:
/// tc adds the option, with room in front of the payload).
#[inline(never)]
fn start<F: Family>(ctx: &XdpContext, t: &F, svc: &SvcValue, s: &mut F::Scratch) -> Carried {
    Carried::then(try_start(ctx, t, svc, s))
}

#[inline(always)]
fn try_start<F: Family>(
    ctx: &XdpContext,
    t: &F,
    svc: &SvcValue,
    s: &mut F::Scratch,
) -> Result<Then<u32>, Reason> {
    let chosen = &*F::parts(s).chosen;
    let be = &chosen.backend;
    if dsr::applies(t, svc, be) {
        return Ok(Then::Done(pass(R_PASS)));
    }
    let (mtu, flags) = if be.flags & BE_F_REMOTE == 0 {
        match t.check_mtu(ctx, F::backend_addr(be), 0, 0) {
            Mtu::TooBig(_) => return Ok(Then::Done(pass(R_PASS))),
            Mtu::Fits(fits) => (fits, CT_F_XDP_STACK),
            Mtu::Unchecked => (0, CT_F_XDP_STACK),
        }
    } else {
        let len = t.ip_len();
        let id = (chosen.id, be.generation);
        match t.hop_to_backend(ctx, t.saddr(), F::backend_addr(be), id, len) {
            Way::Stack => (len, CT_F_XDP_STACK),
            Way::Redirect(_) => (len, 0),
            Way::Tc => return Ok(Then::Done(pass(R_PASS))),
        }
    };
    flow::record(ctx, t, svc, mtu, flags, s)?;
    Ok(Then::Next(Reason(R_NEW_FLOW)))
}

/// Sends the first packet of the flow just recorded on (the scratch's forward tuple): into
/// the stack when its entry says so, else by its route (its source may be the SNAT address).
#[inline(never)]
fn send_new<F: Family>(ctx: &XdpContext, t: &F, s: &mut F::Scratch, len: u32) -> Carried {
    Carried::done(try_send_new(ctx, t, &Shared::local(F::parts(s).fwd), len))
}

#[inline(always)]
fn try_send_new<F: Family>(
    ctx: &XdpContext,
    t: &F,
    v: &Shared<'_, F::Value>,
    len: u32,
) -> XdpOutcome {
    if v.flags() & CT_F_XDP_STACK == 0 {
        match way(ctx, t, v) {
            Way::Redirect(hop) => return redirect(ctx, t, v, &hop, R_NEW_FLOW, len),
            Way::Tc => return pass(R_PASS),
            Way::Stack => {}
        }
    }
    nat::forward_in(ctx, t, v)?;
    reason::count_service(v.svc_id(), v.backend().0, len);
    pass(R_NEW_FLOW)
}

/// The way out of a packet of `t` rewritten to `v`, a forward entry (its destination its
/// backend): by the way kept for the backend (`Family::hop_to_backend`). Routed from the
/// packet's own source, as the kernel routes it: after DNAT (PREROUTING), before SNAT
/// (POSTROUTING), so a rule by source sees the client even when the flow is SNATed.
#[inline(always)]
fn way<F: Family>(ctx: &XdpContext, t: &F, v: &Shared<'_, F::Value>) -> Way {
    t.hop_to_backend(ctx, t.saddr(), v.daddr(), v.backend(), t.ip_len())
}

/// The way out of a reply of `t` rewritten to `v`, a reply entry (its destination the
/// client): by its route from the packet's own source (the backend, as [`way`]), cached
/// per flow.
#[inline(always)]
fn way_back<F: Family>(ctx: &XdpContext, t: &F, v: &Shared<'_, F::Value>) -> Way {
    t.hop(ctx, t.saddr(), v.daddr(), t.ip_len())
}

/// Past the stack, both ways (a reply too comes back through XDP): both sides at once, the
/// TTL (hop limit) down by one and the next hop's MACs, out of `hop`'s interface.
#[inline(always)]
fn redirect<F: Family>(
    ctx: &XdpContext,
    t: &F,
    v: &Shared<'_, F::Value>,
    hop: &Hop,
    reason: u32,
    len: u32,
) -> XdpOutcome {
    let ttl = hop_limit(ctx, t)?;
    if ttl <= 1 {
        // The kernel answers time exceeded; XDP must not forward it.
        return pass(R_PASS);
    }
    nat::rewrite::<F, _, BOTH>(ctx, t, v)?;
    // A new flow's scratch value is not assured: counted straight.
    conntrack::count(v, len);
    forward_l2(ctx, t, ttl, &hop.smac, &hop.dmac)?;
    send_out(hop.ifindex, reason)
}

/// Whether XDP is attached to interface `ifindex` (the agent lists every such interface in
/// `XLB_XDPTX_V1`): tc ingress there also sees the packets XDP translated and passed up.
#[inline(always)]
pub(crate) fn runs_on(ifindex: u32) -> bool {
    XLB_XDPTX_V1.get_ifindex(ifindex).is_some()
}

/// Redirects the frame, ready to go, out of `ifindex`; passed (counted as `reason`) if the
/// redirect map refuses it.
#[inline(always)]
pub(crate) fn send_out(ifindex: u32, reason: u32) -> XdpOutcome {
    match XLB_XDPTX_V1.redirect(ifindex, XDP_PASS as u64) {
        Ok(action) if action == XDP_REDIRECT => Ok((XDP_REDIRECT, Reason(R_XDP_REDIRECT))),
        _ => pass(reason),
    }
}

/// Forwarded here, not by the kernel: the TTL (hop limit) goes down by one from `ttl`, as
/// ip_forward does (IPv4's header checksum with it), and the frame gets the next hop's MAC
/// addresses; in place for the common packet.
#[inline(always)]
fn forward_l2<F: Family>(
    ctx: &XdpContext,
    t: &F,
    ttl: u8,
    smac: &[u8; 6],
    dmac: &[u8; 6],
) -> Result<(), Reason> {
    let fail = |_| Reason(R_REWRITE_FAILED);
    // The TTL's 16-bit word of the header, as it sits in the packet (the other byte's value
    // does not change the sum's change).
    let old = u16::from_ne_bytes([ttl, 0]);
    let new = u16::from_ne_bytes([ttl - 1, 0]);
    if t.direct()
        && let Some(p) = at::<_, F::Hdr>(ctx, 0)
    {
        let p = p as *mut u8;
        // SAFETY: every offset below is within the header `at` checked.
        unsafe {
            if let Some(c) = F::HDR_CSUM_OFF {
                st16(p, c, csum_apply(ld16(p, c), diff2(old, new)));
            }
            *p.add(F::TTL_OFF) = ttl - 1;
            write_macs(p, smac, dmac);
        }
        return Ok(());
    }
    if let Some(c) = F::HDR_CSUM_OFF {
        let csum: u16 = ctx.load(c).map_err(fail)?;
        ctx.store(c, &csum_replace(csum, old as u32, new as u32, 2))
            .map_err(fail)?;
    }
    ctx.store(F::TTL_OFF, &(ttl - 1)).map_err(fail)?;
    ctx.store(0, dmac).map_err(fail)?;
    ctx.store(6, smac).map_err(fail)
}

/// Writes the next hop's MAC addresses into the Ethernet header at `p`.
///
/// # Safety
/// `p` is a packet pointer with at least the 12 bytes of both addresses checked by `at`.
#[inline(always)]
pub(crate) unsafe fn write_macs(p: *mut u8, smac: &[u8; 6], dmac: &[u8; 6]) {
    // SAFETY: the caller checked the 12 bytes.
    unsafe {
        st32(
            p,
            0,
            u32::from_ne_bytes([dmac[0], dmac[1], dmac[2], dmac[3]]),
        );
        st16(p, 4, u16::from_ne_bytes([dmac[4], dmac[5]]));
        st16(p, 6, u16::from_ne_bytes([smac[0], smac[1]]));
        st32(
            p,
            8,
            u32::from_ne_bytes([smac[2], smac[3], smac[4], smac[5]]),
        );
    }
}

/// The TTL (hop limit): in place for the common packet, else through the load helper.
#[inline(always)]
fn hop_limit<F: Family>(ctx: &XdpContext, t: &F) -> Result<u8, Reason> {
    if t.direct()
        && let Some(p) = at::<_, F::Hdr>(ctx, 0)
    {
        // SAFETY: `at` checked the header's bytes.
        return Ok(unsafe { *(p as *const u8).add(F::TTL_OFF) });
    }
    ctx.load(F::TTL_OFF).map_err(|_| Reason(R_MALFORMED))
}

/// The L4 checksum field as it sits in the packet (in place for the common packet).
#[inline(always)]
fn read_l4_csum<F: Family>(ctx: &XdpContext, t: &F) -> Result<u16, Reason> {
    if t.direct() {
        let v = if t.proto() == IPPROTO_UDP {
            csum_at::<F, F::DirectUdp, 6>(ctx)
        } else {
            csum_at::<F, F::DirectTcp, 16>(ctx)
        };
        if v <= u16::MAX as u32 {
            return Ok(v as u16);
        }
    }
    ctx.load(t.csum_off()).map_err(|_| Reason(R_MALFORMED))
}

/// Whether the L4 checksum is still partial (`CHECKSUM_PARTIAL`: the field holds the folded
/// pseudo-header sum for offload to complete; XDP cannot see that state). A complete
/// checksum equals that value by chance 1 in 65,536 times; such a packet simply goes the tc
/// way, which is always correct.
#[inline(always)]
fn checksum_partial<F: Family>(ctx: &XdpContext, t: &F) -> Result<bool, Reason> {
    let csum = read_l4_csum(ctx, t)?;
    if t.proto() == IPPROTO_UDP && csum == 0 {
        return Ok(false);
    }
    let mut sum = t.pseudo_sum();
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    Ok(u16::from_be(csum) == sum as u16)
}

/// The 16-bit field at `REL` into the L4 header of a packet whose `H` (`[u8; N]`: up to the
/// L4 checksum) is in place, or `u32::MAX` when it is not in place. Out of line, one per
/// offset (see `nat::in_place`).
#[inline(never)]
fn csum_at<F: Family, H, const REL: usize>(ctx: &XdpContext) -> u32 {
    match at::<_, H>(ctx, 0) {
        // SAFETY: `at` checked the bytes, the field's among them.
        Some(p) => unsafe { ld16(p as *const u8, F::L4_OFF + REL) as u32 },
        None => u32::MAX,
    }
}

/// The XDP entry's verdict for a dropped packet.
pub const DROP: u32 = XDP_DROP;
/// XDP_PASS, for the bench floor.
pub const PASS: u32 = XDP_PASS;
