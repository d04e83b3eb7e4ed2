//! What a new flow is translated to: the backend as destination, and a source that brings
//! the backend's replies back through this node (SNAT to the node for a remote backend of an
//! external frontend; the hairpin address when the client is its own backend).

use lb_common::{BE_F_REMOTE, CT_F_HAIRPIN, CT_F_SNAT, R_SNAT_FAILED, SVC_F_SNAT_REMOTE, SvcValue};

use crate::{
    conntrack::Source,
    family::{Addr, EndsMut, Entry, Family},
    maps,
    maps::Chosen,
    packet::Packet,
    reason::Reason,
};

/// Writes the forward tuple of a new flow from `t` to the backend `c` into `fwd` (a SNATed
/// flow's source: the SNAT address, its port chosen by `conntrack::create`), and returns
/// how its source is chosen. Both families.
#[inline(always)]
pub fn forward_tuple<F: Family, P: Packet>(
    ctx: &P,
    t: &F,
    svc: &SvcValue,
    c: &Chosen,
    fwd: &mut F::Value,
) -> Result<Source, Reason> {
    let be = &c.backend;
    // Field by field: a struct literal with `..Default::default()` into map memory compiles
    // to a `memset` byte loop, which the verifier refuses without CAP_PERFMON.
    let (saddr, daddr, sport, dport) = fwd.ends_mut();
    saddr.set(t.saddr());
    daddr.set(F::backend_addr(be));
    *sport = t.sport();
    *dport = be.port_be;
    fwd.start(c.id, be.generation, svc.svc_id);
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
    if F::backend_addr(be).same(t.saddr()) {
        // Hairpin: the client is its own backend. SNATed to the hairpin address (so the pod
        // accepts a packet that is not from itself, and its replies come back through tc),
        // keeping the client's port when its reply tuple is free; without one configured
        // the source is kept.
        let hairpin = F::hairpin(&cfg);
        if F::is_zero(&hairpin) {
            return Ok(keep);
        }
        *fwd.flags_mut() = CT_F_SNAT | CT_F_HAIRPIN;
        fwd.ends_mut().0.set(&hairpin);
        return Ok(Source {
            snat: true,
            first_be: t.sport(),
            min: cfg.snat_port_min,
            max: cfg.snat_port_max,
        });
    }
    if crate::dsr::applies(t, svc, be) {
        // Direct server return: the client stays the source; the backend's node answers.
        *fwd.flags_mut() = lb_common::CT_F_DSR;
        return Ok(keep);
    }
    if svc.flags & SVC_F_SNAT_REMOTE != 0 && be.flags & BE_F_REMOTE != 0 {
        // A remote backend of a Cluster-policy external frontend: SNATed to the node's
        // address toward it (the route's source), so its replies come back here.
        let src = t
            .route_src(ctx, F::backend_addr(be))
            .ok_or(Reason(R_SNAT_FAILED))?;
        *fwd.flags_mut() = CT_F_SNAT;
        fwd.ends_mut().0.set(&src);
        return Ok(Source {
            snat: true,
            first_be: 0,
            min: cfg.snat_port_min,
            max: cfg.snat_port_max,
        });
    }
    Ok(keep)
}
