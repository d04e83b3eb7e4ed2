//! What a new flow is translated to: the backend as destination, and a source that brings
//! the backend's replies back through this node (SNAT to the node for a remote backend of an
//! external frontend; the hairpin address when the client is its own backend).

use lb_common::{
    BE_F_REMOTE, Backend, CT_F_HAIRPIN, CT_F_SNAT, CtValue, IPPROTO_SCTP, IPPROTO_TCP,
    R_SNAT_FAILED, SVC_F_SNAT_REMOTE, SvcValue,
};

use crate::{
    conntrack::Source,
    fib, maps,
    packet::Packet,
    parse::{ETH_HLEN, Tuple},
    reason::Reason,
};

/// Packets up to this size are not checked against the route MTU (no IPv4 link is smaller).
const MIN_CHECKED_LEN: u16 = 576;

/// Writes the forward tuple of a new flow from `t` to backend `be` into `fwd` (a SNATed
/// flow's source: the SNAT address, its port chosen by `conntrack::create`), and returns
/// how its source is chosen.
#[inline(always)]
pub fn forward_tuple<P: Packet>(
    ctx: &P,
    t: &Tuple,
    svc: &SvcValue,
    backend_id: u32,
    be: &Backend,
    fwd: &mut CtValue,
) -> Result<Source, Reason> {
    // Field by field: a struct literal with `..Default::default()` into map memory compiles
    // to a `memset` byte loop, which the verifier refuses without CAP_PERFMON.
    fwd.saddr_be = t.saddr_be;
    fwd.sport_be = t.sport_be;
    fwd.daddr_be = be.addr_be[0];
    fwd.dport_be = be.port_be;
    fwd.backend_id = backend_id;
    fwd.backend_gen = be.generation;
    fwd.svc_id = svc.svc_id;
    fwd.flags = 0;
    fwd.mtu = 0;
    fwd._pad = 0;
    // created_ns and last_seen_ns are set by `conntrack::create`.
    let cfg = maps::config();
    // The source is kept, unless its reply tuple clashes with another flow's (then only the
    // port is remapped, from the SNAT range).
    let keep = Source {
        snat: false,
        first_be: 0,
        min: cfg.snat_port_min,
        max: cfg.snat_port_max,
    };
    if be.addr_be[0] == t.saddr_be {
        if cfg.hairpin_addr_be == 0 {
            return Ok(keep);
        }
        fwd.flags = CT_F_SNAT | CT_F_HAIRPIN;
        fwd.saddr_be = cfg.hairpin_addr_be;
        return Ok(Source {
            snat: true,
            first_be: t.sport_be,
            min: cfg.snat_port_min,
            max: cfg.snat_port_max,
        });
    }
    if crate::dsr::applies(t, svc, be) {
        // Direct server return: the client stays the source; the backend's node answers.
        fwd.flags = lb_common::CT_F_DSR;
        return Ok(keep);
    }
    if svc.flags & SVC_F_SNAT_REMOTE != 0 && be.flags & BE_F_REMOTE != 0 {
        let route = fib::lookup(
            ctx.raw(),
            ctx.ingress_ifindex(),
            t.proto,
            t.saddr_be,
            be.addr_be[0],
            0,
            false,
        )
        .ok_or(Reason(R_SNAT_FAILED))?;
        if route.src_be == 0 {
            return Err(Reason(R_SNAT_FAILED));
        }
        fwd.flags = CT_F_SNAT;
        fwd.saddr_be = route.src_be;
        return Ok(Source {
            snat: true,
            first_be: 0,
            min: cfg.snat_port_min,
            max: cfg.snat_port_max,
        });
    }
    Ok(keep)
}

/// What the route-MTU check says about a packet about to be translated toward a backend.
pub enum Mtu {
    /// Not checked: small, no DF, a GSO super-packet, it fits the cached MTU, or no route.
    Unchecked,
    /// It fits: this size is worth remembering in the flow's entry.
    Fits(u16),
    /// It does not fit: answer fragmentation needed with this MTU before translating it.
    TooBig(u16),
}

/// Checks a packet (DF set) against the route to `daddr_be` (its MTU, as the kernel's
/// forwarding would), unless it is no bigger than `fits`, a size already known to fit (0 =
/// none). A GSO super-packet is checked by the size of its segments. `extra`: bytes the
/// packet gains on its way (a DSR option, `dsr::extra`), counted in its size and taken off
/// the MTU a too-big packet is answered with.
#[inline(always)]
pub fn check_mtu<P: Packet>(ctx: &P, t: &Tuple, daddr_be: u32, fits: u16, extra: u16) -> Mtu {
    if !t.df {
        return Mtu::Unchecked;
    }
    let gso = ctx.gso_size();
    let len = if gso == 0 {
        t.tot_len as u32
    } else {
        let l4_hdr = if t.proto == IPPROTO_TCP {
            ctx.load::<u8>(t.l4_off + 12)
                .map_or(20, |d| ((d >> 4) as u32) * 4)
        } else if t.proto == IPPROTO_SCTP {
            12
        } else {
            8
        };
        (t.l4_off - ETH_HLEN) as u32 + l4_hdr + gso
    } + extra as u32;
    if len <= MIN_CHECKED_LEN as u32 || len <= fits as u32 || len > u16::MAX as u32 {
        return Mtu::Unchecked;
    }
    let Some(route) = fib::lookup(
        ctx.raw(),
        ctx.ingress_ifindex(),
        t.proto,
        t.saddr_be,
        daddr_be,
        len as u16,
        false,
    ) else {
        return Mtu::Unchecked;
    };
    if route.too_big != 0 {
        Mtu::TooBig(route.mtu.saturating_sub(extra))
    } else {
        Mtu::Fits(len as u16)
    }
}
