//! XDP on the node's external interfaces: NodePort, LoadBalancer and externalIP traffic (new
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
//! remote backend looks its route up once.
//!
//! Whatever XDP cannot finish is passed to the stack untouched, where the tc program does the
//! whole job: ICMP, refusals (no endpoints), fragmentation needed, unresolved neighbours,
//! re-balanced UDP flows, and packets whose checksum is still to be completed by offload
//! (`CHECKSUM_PARTIAL` from a local veth peer: XDP cannot see that state, tc's helpers keep
//! it right).

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS, XDP_REDIRECT},
    programs::XdpContext,
};
use lb_common::{
    BE_F_REMOTE, CT_F_XDP_STACK, CtValue, IPPROTO_SCTP, IPPROTO_UDP, R_ESTABLISHED, R_MALFORMED,
    R_NEW_FLOW, R_PASS, R_REPLY_IN, R_REVERSE_NAT, R_XDP_REDIRECT, SvcValue,
};

use crate::{
    affinity::Client,
    conntrack::{self, Ct},
    family::{Ends, Mtu, View},
    fib, filter, flow,
    maps::{FlowScratch, XLB_XDPTX_V1},
    nat,
    packet::{Packet, at, csum_apply, csum_replace, diff2, ld16, st16, st32},
    parse::{self, ETH_HLEN, IP_CSUM_OFF, IP_TTL_OFF, L4_OFF, Parsed, Tuple},
    reason::{self, Carried, Reason},
    select::{self, Frontend},
    shared::Shared,
    translate, work,
};

/// The XDP program's outcome.
pub type XdpOutcome = reason::Outcome<u32>;

#[inline(always)]
fn pass(reason: u32) -> XdpOutcome {
    Ok((XDP_PASS, Reason(reason)))
}

/// An IPv4 frame (the entry read its Ethernet type); `len`: the frame's length.
#[inline(always)]
pub fn try_xdp(ctx: &XdpContext, len: u32) -> XdpOutcome {
    let t = match parse::parse_ipv4(ctx, len)? {
        Parsed::Flow(t) => t,
        Parsed::Icmp(_) => return pass(R_PASS),
        Parsed::Pass(r) => return Ok((XDP_PASS, r)),
    };
    if t.proto == IPPROTO_SCTP {
        // Left to tc, whose rewrite keeps SCTP's checksum (XDP's redirect and its
        // checksum steps are TCP's and UDP's).
        return pass(R_PASS);
    }
    // The same order as tc: the address filters, a tracked flow from its entry alone, then
    // replies, then the service map for a new flow.
    let frontend = filter::maybe_frontend(t.daddr_be);
    let forward = if frontend {
        conntrack::lookup_forward(&t)
    } else {
        None
    };
    let reply = if forward.is_none() && filter::maybe_backend(t.saddr_be) {
        conntrack::lookup_reply(&t)
    } else {
        None
    };
    if !frontend && reply.is_none() {
        return pass(R_PASS);
    }
    if checksum_partial(ctx, &t)? {
        return pass(R_PASS);
    }
    if let Some(ct) = forward {
        if !conntrack::continues(&ct, &t) {
            // Re-balanced (UDP to a removed backend) or started over (a reused TCP port) by tc.
            return pass(R_PASS);
        }
        return established(ctx, &t, ct, len).outcome();
    }
    if let Some(ct) = reply {
        conntrack::touch(&ct, &t);
        return reply_of(ctx, &t, ct, len).outcome();
    }
    let Some(svc) = select::lookup_service(&t) else {
        return pass(R_PASS);
    };
    // SAFETY: the only acquire on this path of the run.
    let w = unsafe { work::acquire() }?;
    xdp_new_flow(ctx, &t, svc, &mut w.v4, len).outcome()
}

/// A packet of a tracked flow to its backend: into the stack as tc would send it when the
/// entry says its way out takes no XDP frames (no route lookup), else by the way its route
/// gives (remembered in the entry when that is the stack). Out of line: its frame stays off
/// the entry's.
#[inline(never)]
fn established(ctx: &XdpContext, t: &Tuple, ct: Ct<Tuple>, len: u32) -> Carried {
    Carried::done(try_established(ctx, t, ct, len))
}

#[inline(always)]
fn try_established(ctx: &XdpContext, t: &Tuple, ct: Ct<Tuple>, len: u32) -> XdpOutcome {
    // A DSR packet that carries the frontend to the backend's node: tc adds the option.
    if ct.flags() & lb_common::CT_F_DSR != 0 && crate::dsr::carries(t) {
        return pass(R_PASS);
    }
    // SAFETY: the only acquire on this path of the run.
    let w = unsafe { work::acquire() }?;
    if ct.flags() & CT_F_XDP_STACK == 0 {
        match way(ctx, t, &ct) {
            Way::Tc => return pass(R_PASS),
            Way::Redirect(hop) => {
                let ct = flow::keep_alive(ct, t, &mut w.v4)?;
                return redirect(ctx, t, &ct, &hop, R_ESTABLISHED, len);
            }
            Way::Stack => {
                ct.add_flags(CT_F_XDP_STACK);
                // The route lookup has just checked this size.
                ct.set_mtu(ct.mtu().max(t.tot_len));
            }
        }
    }
    // tc's steps for an established packet, the answer to a packet too big left to tc.
    match translate::check_mtu(ctx, t, *ct.daddr(), ct.mtu(), 0) {
        Mtu::TooBig(_) => return pass(R_PASS),
        Mtu::Fits(len) => ct.set_mtu(len),
        Mtu::Unchecked => {}
    }
    let ct = flow::keep_alive(ct, t, &mut w.v4)?;
    nat::forward_in(ctx, t, &ct)?;
    reason::count_service(ct.svc_id(), ct.backend().0, len);
    pass(R_ESTABLISHED)
}

/// A backend's reply of a tracked flow (already touched): as [`established`], its
/// destination side translated into the stack (tc egress restores the source), or both
/// sides redirected. Out of line, as [`established`].
#[inline(never)]
fn reply_of(ctx: &XdpContext, t: &Tuple, ct: Ct<Tuple>, len: u32) -> Carried {
    Carried::done(try_reply_of(ctx, t, ct, len))
}

#[inline(always)]
fn try_reply_of(ctx: &XdpContext, t: &Tuple, ct: Ct<Tuple>, len: u32) -> XdpOutcome {
    if ct.flags() & CT_F_XDP_STACK == 0 {
        match way(ctx, t, &ct) {
            Way::Tc => return pass(R_PASS),
            Way::Redirect(hop) => return redirect(ctx, t, &ct, &hop, R_REVERSE_NAT, len),
            Way::Stack => ct.add_flags(CT_F_XDP_STACK),
        }
    }
    nat::reply_in(ctx, t, &ct)?;
    pass(R_REPLY_IN)
}

/// A new flow: chosen, recorded (in the scratch `s`) and translated here when its route is
/// ready, else left to tc.
#[inline(never)]
fn xdp_new_flow(
    ctx: &XdpContext,
    t: &Tuple,
    svc: &SvcValue,
    s: &mut FlowScratch,
    len: u32,
) -> Carried {
    Carried::done(try_xdp_new_flow(ctx, t, svc, s, len))
}

#[inline(always)]
fn try_xdp_new_flow(
    ctx: &XdpContext,
    t: &Tuple,
    svc: &SvcValue,
    s: &mut FlowScratch,
    len: u32,
) -> XdpOutcome {
    flow::admitted(t, svc)?;
    if svc.count == 0 {
        // Refused or dropped by tc, which can build the answer.
        return pass(R_PASS);
    }
    let chosen = select::choose(
        &Frontend::of(t),
        &Client::of(t),
        svc,
        Some(select::flow_hash(t)),
    )?;
    s.chosen.set(&chosen);
    let be = &chosen.backend;
    // Direct server return: tc adds the option (room in front of the payload).
    if crate::dsr::applies(t, svc, be) {
        return pass(R_PASS);
    }
    // A backend on this node is reached through a pod's veth or a local address, which take
    // no XDP frames: into the stack as tc would, with tc's MTU check and no route lookup.
    // A remote one by the route's way out: the neighbour known and the packet fitting, else
    // tc does it all (and answers fragmentation needed).
    let (mtu, way_flags) = if be.flags & BE_F_REMOTE == 0 {
        match translate::check_mtu(ctx, t, be.addr_be[0], 0, 0) {
            Mtu::TooBig(_) => return pass(R_PASS),
            Mtu::Fits(len) => (len, CT_F_XDP_STACK),
            Mtu::Unchecked => (0, CT_F_XDP_STACK),
        }
    } else {
        match fib::hop(
            ctx.raw(),
            Packet::ingress_ifindex(ctx),
            t.proto,
            t.saddr_be,
            be.addr_be[0],
            t.tot_len,
        ) {
            Some(hop) if XLB_XDPTX_V1.get_ifindex(hop.out_ifindex).is_none() => {
                (t.tot_len, CT_F_XDP_STACK)
            }
            Some(_) => (t.tot_len, 0),
            None => return pass(R_PASS),
        }
    };
    let fwd = flow::record(ctx, t, svc, mtu, way_flags, s)?;
    if way_flags == 0 {
        // Redirected: the hop of the translated packet (its source may be the SNAT address).
        match way(ctx, t, &fwd) {
            Way::Redirect(hop) => return redirect(ctx, t, &fwd, &hop, R_NEW_FLOW, len),
            Way::Tc => return pass(R_PASS),
            Way::Stack => {}
        }
    }
    nat::forward_in(ctx, t, &fwd)?;
    reason::count_service(fwd.svc_id(), fwd.backend().0, len);
    pass(R_NEW_FLOW)
}

/// The next hop of a packet XDP sends out itself (either family).
pub(crate) struct Hop {
    pub ifindex: u32,
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
}

/// How a packet translated to `v` leaves (either family).
pub(crate) enum Way {
    /// Untouched to tc: the route is not ready (no neighbour yet) or too small.
    Tc,
    /// Into the stack translated as tc ingress would: its way out takes no XDP frames.
    Stack,
    /// Redirected out of an interface that takes XDP frames.
    Redirect(Hop),
}

/// Whether XDP is attached to interface `ifindex` (the agent lists every such interface in
/// `XLB_XDPTX_V1`): tc ingress there also sees the packets XDP translated and passed up.
#[inline(always)]
pub(crate) fn runs_on(ifindex: u32) -> bool {
    XLB_XDPTX_V1.get_ifindex(ifindex).is_some()
}

impl Way {
    /// The way out by a route's egress interface and next hop: redirected when the
    /// interface takes XDP frames, else into the stack.
    #[inline(always)]
    pub(crate) fn out(ifindex: u32, smac: &[u8; 6], dmac: &[u8; 6]) -> Way {
        if XLB_XDPTX_V1.get_ifindex(ifindex).is_none() {
            return Way::Stack;
        }
        Way::Redirect(Hop {
            ifindex,
            smac: *smac,
            dmac: *dmac,
        })
    }
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

/// The way out of a packet of `t` rewritten to `v`, by its route (cached per CPU).
#[inline(always)]
fn way(ctx: &XdpContext, t: &Tuple, v: &Shared<'_, CtValue>) -> Way {
    let Some(hop) = fib::hop(
        ctx.raw(),
        Packet::ingress_ifindex(ctx),
        t.proto,
        *v.saddr(),
        *v.daddr(),
        t.tot_len,
    ) else {
        return Way::Tc;
    };
    Way::out(hop.out_ifindex, &hop.smac, &hop.dmac)
}

/// Past the stack, both ways (a reply too comes back through XDP): both sides at once, the
/// TTL down by one and the next hop's MACs, out of `hop`'s interface.
#[inline(always)]
fn redirect(
    ctx: &XdpContext,
    t: &Tuple,
    v: &Shared<'_, CtValue>,
    hop: &Hop,
    reason: u32,
    len: u32,
) -> XdpOutcome {
    let ttl = read_ttl(ctx, t)?;
    if ttl <= 1 {
        // The kernel answers time exceeded; XDP must not forward it.
        return pass(R_PASS);
    }
    nat::apply::<_, { nat::BOTH }>(ctx, t, v)?;
    reason::count_service(v.svc_id(), v.backend().0, len);
    forward_l2(ctx, t, ttl, &hop.smac, &hop.dmac)?;
    send_out(hop.ifindex, reason)
}

/// The IPv4 TTL.
#[inline(always)]
fn read_ttl(ctx: &XdpContext, t: &Tuple) -> Result<u8, Reason> {
    if t.direct
        && let Some(p) = at::<_, [u8; L4_OFF]>(ctx, 0)
    {
        // SAFETY: `at` checked the bytes.
        return Ok(unsafe { *(p as *const u8).add(IP_TTL_OFF) });
    }
    ctx.load(IP_TTL_OFF).map_err(|_| Reason(R_MALFORMED))
}

/// Forwarded here, not by the kernel: the TTL goes down by one, as ip_forward does, and the
/// frame gets the next hop's MAC addresses.
#[inline(always)]
fn forward_l2(
    ctx: &XdpContext,
    t: &Tuple,
    ttl: u8,
    smac: &[u8; 6],
    dmac: &[u8; 6],
) -> Result<(), Reason> {
    let fail = |_| Reason(lb_common::R_REWRITE_FAILED);
    // The 16-bit word [TTL, protocol], as it sits in the packet.
    let old = u16::from_ne_bytes([ttl, t.proto]);
    let new = u16::from_ne_bytes([ttl - 1, t.proto]);
    if t.direct
        && let Some(p) = at::<_, [u8; L4_OFF]>(ctx, 0)
    {
        let p = p as *mut u8;
        // SAFETY: every offset below is within the L4_OFF bytes `at` checked.
        unsafe {
            st16(
                p,
                IP_CSUM_OFF,
                csum_apply(ld16(p, IP_CSUM_OFF), diff2(old, new)),
            );
            st16(p, IP_TTL_OFF, new);
            write_macs(p, smac, dmac);
        }
        return Ok(());
    }
    let csum: u16 = ctx.load(IP_CSUM_OFF).map_err(fail)?;
    ctx.store(IP_CSUM_OFF, &csum_replace(csum, old as u32, new as u32, 2))
        .map_err(fail)?;
    ctx.store(IP_TTL_OFF, &new).map_err(fail)?;
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

/// The L4 checksum field as it sits in the packet.
#[inline(always)]
fn read_l4_csum(ctx: &XdpContext, t: &Tuple) -> Result<u16, Reason> {
    if t.direct {
        let v = if t.proto == IPPROTO_UDP {
            csum_at::<{ L4_OFF + 6 }>(ctx)
        } else {
            csum_at::<{ L4_OFF + 16 }>(ctx)
        };
        if v <= u16::MAX as u32 {
            return Ok(v as u16);
        }
    }
    ctx.load(t.csum_off).map_err(|_| Reason(R_MALFORMED))
}

/// The 16-bit field at `OFF` read in place, or `u32::MAX` when it is not in place. Out of
/// line, one per offset (see `nat::in_place`).
#[inline(never)]
pub(crate) fn csum_at<const OFF: usize>(ctx: &XdpContext) -> u32 {
    match at::<_, u16>(ctx, OFF) {
        // SAFETY: `at` checked the two bytes.
        Some(p) => unsafe { ld16(p as *const u8, 0) as u32 },
        None => u32::MAX,
    }
}

/// Whether the L4 checksum is still partial (`CHECKSUM_PARTIAL`: the field holds the folded
/// pseudo-header sum for offload to complete). A complete checksum equals that value by
/// chance 1 in 65,536 times; such a packet simply goes the tc way, which is always correct.
#[inline(always)]
fn checksum_partial(ctx: &XdpContext, t: &Tuple) -> Result<bool, Reason> {
    let csum = read_l4_csum(ctx, t)?;
    if t.proto == IPPROTO_UDP && csum == 0 {
        return Ok(false);
    }
    let l4_len = (t.tot_len as u32).saturating_sub((t.l4_off - ETH_HLEN) as u32);
    let s = u32::from_be(t.saddr_be);
    let d = u32::from_be(t.daddr_be);
    let mut sum = (s >> 16) + (s & 0xffff) + (d >> 16) + (d & 0xffff) + t.proto as u32 + l4_len;
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    Ok(u16::from_be(csum) == sum as u16)
}

/// The XDP entry's verdict for a dropped packet.
pub const DROP: u32 = XDP_DROP;
/// XDP_PASS, for the bench floor.
pub const PASS: u32 = XDP_PASS;
