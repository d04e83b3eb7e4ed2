//! One sync of the agent: the desired state of what changed (of everything at start, on a
//! node change, as the prune), applied make-before-break against what is programmed (the
//! state a full computation replaces, or an update's journal), the problems logged, stale
//! UDP sockets destroyed; after a full sync the B-trees rebuilt full and the freed memory
//! given back.

use std::{collections::BTreeSet, time::Instant};

use tracing::{error, info, warn};

use super::{AgentOptions, State, sockets};
use crate::{
    datapath::{
        kernel::KernelMaps,
        stale,
        sync::{self, apply_touched},
    },
    desired::{self, Desired, Ids},
    model::ServiceRef,
};

/// What is programmed and how to reach it.
pub(super) struct Programmed<'a> {
    pub(super) maps: &'a mut KernelMaps,
    /// What is programmed, when it is not the desired state (at start: what was pinned;
    /// after a sync with errors); none when the maps hold exactly the desired state.
    pub(super) programmed: &'a mut Option<Desired>,
    pub(super) ids: &'a mut Ids,
    pub(super) limits: desired::Limits,
}

/// The desired state of what changed (of everything when `full`), and what is programmed
/// of what it touched: for a full computation the state it replaces (the maps held it), for
/// an update the journal's view of what it changed.
fn compute(
    state: &mut State,
    node: &desired::NodeContext,
    p: &mut Programmed<'_>,
    full: bool,
    changed: &BTreeSet<ServiceRef>,
) -> (desired::Touched, Desired) {
    if full {
        let now = p
            .programmed
            .take()
            .unwrap_or_else(|| state.engine.take_desired());
        state.engine.full(&state.model, node, p.ids, p.limits);
        (sync::everything(&now, state.engine.desired()), now)
    } else {
        let touched =
            state
                .engine
                .update(&state.model, node, p.ids, p.limits, changed.iter().cloned());
        let now = state.engine.programmed_before(&touched);
        (touched, now)
    }
}

/// Gives the heap's free memory back to the kernel (a full sync's temporaries: the
/// replaced desired state, the candidates); glibc keeps it otherwise.
pub(super) fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free heap pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Programs what changed in `state` (everything when `state.full`); returns how many
/// errors the sync had. With the socket hooks (`udp`), connected UDP sockets of backends
/// that left their frontend are destroyed.
pub(super) fn sync(
    state: &mut State,
    node: &desired::NodeContext,
    p: &mut Programmed<'_>,
    udp: Option<(&AgentOptions, &std::path::Path)>,
) -> u64 {
    let started = Instant::now();
    p.ids.tick(Instant::now());
    // A programmed state apart from the desired one (at start, after errors) is diffed in
    // full.
    let full = std::mem::take(&mut state.full) || p.programmed.is_some();
    state.health_changed |= full;
    let changed = std::mem::take(&mut state.changed);
    let (touched, mut now) = compute(state, node, p, full, &changed);
    let problems: Vec<&desired::DesiredError> = if full {
        state.engine.problems().collect()
    } else {
        changed
            .iter()
            .flat_map(|id| state.engine.problems_of(id))
            .collect()
    };
    for p in &problems {
        match p {
            desired::DesiredError::NoEndpointSlice { .. } => info!("{p}"),
            _ => warn!("{p}"),
        }
    }
    let udp_before = udp.map(|_| stale::udp_pairs(&now, &touched.frontends));
    let report = apply_touched(p.maps, &mut now, state.engine.desired(), &touched);
    for e in &report.errors {
        error!("{e}");
    }
    if let (Some((opts, cgroup)), Some(before)) = (udp, udp_before) {
        let after = stale::udp_pairs(&now, &touched.frontends);
        let gone = before.difference(&after).copied().collect();
        sockets::destroy_stale_udp(opts, cgroup, &gone);
    }
    if !report.errors.is_empty() {
        // Whatever failed is tried again at the next sync, from scratch, against what is
        // programmed (the only time the agent holds a copy of the maps apart from the
        // desired state).
        state.full = true;
        *p.programmed = Some(match full {
            true => now,
            false => desired::Journal::patched(state.engine.desired(), &touched, &now),
        });
    } else {
        drop(now);
    }

    // A Service without an EndpointSlice is normal (kube-proxy does not count it).
    let counted = problems
        .iter()
        .filter(|p| !matches!(p, desired::DesiredError::NoEndpointSlice { .. }))
        .count();
    let errors = report.errors.len() + counted;
    info!(
        services = state.engine.frontends(),
        changed = changed.len(),
        full,
        writes = report.writes,
        deletes = report.deletes,
        errors,
        took_us = started.elapsed().as_micros() as u64,
        "synced"
    );
    if full {
        // The sync's temporaries first (a full one's touched sets are as large as the
        // maps), then the B-trees rebuilt full, then the freed pages back to the kernel.
        drop((touched, changed, problems));
        state.engine.compact(p.ids);
        state.trim = true;
    }
    errors as u64
}
