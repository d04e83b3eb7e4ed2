//! The steps tc and XDP share for a flow: keeping an established one fresh, admitting a new
//! one (source ranges) and recording it once its backend and route are settled.

use lb_common::{CT_F_AFFINITY, CT_F_SNAT, R_CT_MISS, R_SRC_DENIED, SVC_F_SRC_RANGES, SvcValue};

use crate::{
    affinity::{self, ClientOf},
    conntrack::{self, Ct},
    family::{Entry, Family, Flow, View},
    packet::Packet,
    reason::Reason,
    shared::Shared,
    translate,
};

/// A packet of an established flow keeps its entries (and its client's affinity, when its
/// service has affinity) fresh: from what the entry holds, without the service map. An
/// answered flow that goes on becomes assured (out of reach of LRU eviction; its entries
/// are copied through the scratch `s`). Returns the forward entry to rewrite with
/// (`ct_miss` when the flow was moved and its assured entry deleted meanwhile: the flow is
/// over).
#[inline(always)]
pub fn keep_alive<T: Flow + ClientOf>(
    ct: Ct<T>,
    t: &T,
    s: &mut T::Scratch,
) -> Result<Ct<T>, Reason> {
    let ct = conntrack::assure(ct, t, s).ok_or(Reason(R_CT_MISS))?;
    if conntrack::touch(&ct, t) {
        if ct.flags() & CT_F_SNAT != 0 {
            conntrack::keep_reply(&ct, t);
        }
        // Affinity times out in seconds at least: a refresh once a second is plenty.
        if ct.flags() & CT_F_AFFINITY != 0 {
            affinity::touch(&t.client(), ct.svc_id());
        }
    }
    Ok(ct)
}

/// loadBalancerSourceRanges: a client outside them never gets a flow (kube-proxy checks new
/// connections only).
#[inline(always)]
pub fn admitted<F: Family>(t: &F, svc: &SvcValue) -> Result<(), Reason> {
    if svc.flags & SVC_F_SRC_RANGES != 0 && !t.src_allowed(svc.svc_id) {
        return Err(Reason(R_SRC_DENIED));
    }
    Ok(())
}

/// Records a new flow of `t` to the backend the scratch `s` holds (`Parts::chosen`): its
/// source translation, the client's affinity, its conntrack entries (`mtu`: the size known
/// to fit its route, 0 for none; `flags`: more `CT_F_*` flags for the forward entry), built
/// in `s`. Returns the forward tuple its packets are rewritten to (in `s`).
#[inline(always)]
pub fn record<'s, F: Family, P: Packet>(
    ctx: &P,
    t: &F,
    svc: &SvcValue,
    mtu: u16,
    flags: u16,
    s: &'s mut F::Scratch,
) -> Result<Shared<'s, F::Value>, Reason> {
    let p = F::parts(s);
    let source = translate::forward_tuple(ctx, t, svc, p.chosen, p.fwd)?;
    *p.fwd.mtu_mut() = mtu;
    let mut more = flags;
    if svc.affinity_timeout_s != 0 {
        more |= CT_F_AFFINITY;
    }
    *p.fwd.flags_mut() |= more;
    let c = &*p.chosen;
    affinity::remember(&t.client(), svc, c.id, c.slot, c.backend.generation);
    conntrack::create(t, &source, s)?;
    Ok(Shared::local(F::parts(s).fwd))
}
