//! One sync of the agent: the desired state of what changed (of everything at start, on a
//! node change, as the prune), applied make-before-break against what is programmed (the
//! state a full computation replaces, or an update's journal, with what services whose
//! writes failed left programmed), the problems logged, stale UDP sockets destroyed; after
//! a full sync the B-trees rebuilt full and the freed memory given back. A failed write
//! never makes the next sync a full one: the service it belongs to is retried on its own
//! ([`super::retry`]).

use std::{collections::BTreeSet, time::Instant};

use tracing::{error, info, warn};

use super::{State, retry::Taken, sockets};
use crate::{
    datapath::{
        diverged::Diverged,
        stale,
        sync::{self, apply_touched},
        writer::MapWriter,
    },
    desired::{self, Desired, Ids},
    model::ServiceRef,
};

/// What is programmed and how to reach it.
pub(super) struct Programmed<'a> {
    pub(super) maps: &'a mut dyn MapWriter,
    /// What is programmed, when it is not the desired state (at start: what was pinned);
    /// none when the maps hold the desired state (but where failed services' writes left
    /// them otherwise: see [`super::retry`]).
    pub(super) programmed: &'a mut Option<Desired>,
    pub(super) ids: &'a mut Ids,
    pub(super) limits: desired::Limits,
}

/// The desired state of what changed (of everything when `full`), and what is programmed
/// of what it touched: for a full computation the state it replaces (the maps held it), for
/// an update the journal's view of what it changed; either with what the failed services
/// it takes in (all of them for a full one, else those due or touched) left programmed.
fn compute(
    state: &mut State,
    node: &desired::NodeContext,
    p: &mut Programmed<'_>,
    full: bool,
    changed: &BTreeSet<ServiceRef>,
) -> (desired::Touched, Desired, Taken) {
    if full {
        let mut now = p
            .programmed
            .take()
            .unwrap_or_else(|| state.engine.take_desired());
        let mut retried = desired::Touched::default();
        let taken = state.retries.take(&mut retried, Instant::now(), true);
        taken.overlay(&mut now);
        state.engine.full(&state.model, node, p.ids, p.limits);
        let mut touched = sync::everything(&now, state.engine.desired());
        touched.frontends.extend(retried.frontends);
        touched.backends.extend(retried.backends);
        touched.src_ranges.extend(retried.src_ranges);
        touched.filter_words.extend(retried.filter_words);
        (touched, now, taken)
    } else {
        let mut touched =
            state
                .engine
                .update(&state.model, node, p.ids, p.limits, changed.iter().cloned());
        let taken = state.retries.take(&mut touched, Instant::now(), false);
        let mut now = state.engine.programmed_before(&touched);
        taken.overlay(&mut now);
        (touched, now, taken)
    }
}

/// Allocations of 128 KiB and more are mapped on their own and unmapped when freed, for the
/// agent's life: glibc otherwise raises that threshold each time such a block is freed, so
/// a full sync's large temporaries (sorted vectors, the parsed file) come from the heap and
/// leave it larger (at 10,000 × 10 the peak was 11 MiB higher).
pub(super) fn fixed_mmap_threshold() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes an allocator setting.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// Gives the heap's free memory back to the kernel (a full sync's temporaries: the
/// replaced desired state, the candidates); glibc keeps it otherwise.
pub(super) fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free heap pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
        let m = libc::mallinfo2();
        tracing::info!(
            heap_in_use_kib = (m.uordblks + m.hblkhd) / 1024,
            heap_free_kib = m.fordblks / 1024,
            "memory given back"
        );
    }
}

/// Programs what changed in `state` (everything when `state.full`); returns how many
/// errors the sync had. With the socket hooks (`udp`), connected UDP sockets of backends
/// that left their frontend are destroyed.
pub(super) fn sync(
    state: &mut State,
    node: &desired::NodeContext,
    p: &mut Programmed<'_>,
    udp: Option<sockets::Attached<'_>>,
) -> u64 {
    let started = Instant::now();
    p.ids.tick(Instant::now());
    // A programmed state apart from the desired one (at start) is diffed in full.
    let full = std::mem::take(&mut state.full) || p.programmed.is_some();
    state.health_changed |= full;
    let changed = std::mem::take(&mut state.changed);
    let (touched, mut now, taken) = compute(state, node, p, full, &changed);
    let retried = taken.len();
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
    if let (Some(hooks), Some(before)) = (udp, udp_before) {
        let after = stale::udp_pairs(&now, &touched.frontends);
        let gone = before.difference(&after).copied().collect();
        sockets::destroy_stale_udp(hooks, &gone);
    }
    // What failed is kept per service (what it left programmed) and retried on its own
    // with backoff; the next syncs stay incremental.
    let diverged = match report.errors.is_empty() {
        true => Diverged::default(),
        false => Diverged::of(&now, state.engine.desired(), &touched),
    };
    drop(now);
    state.retries.record(
        taken,
        diverged,
        state.engine.desired(),
        &report,
        Instant::now(),
    );

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
        retried,
        failing = state.retries.len(),
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        agent::retry::Retries,
        datapath::writer::MemoryMaps,
        desired::{Limits, NodeContext},
        model::intern,
        source::file,
    };

    fn svc(name: &str, ip: &str, backends: &[&str]) -> String {
        let mut y = format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: ns, name: {name}}}\nspec:\n  clusterIP: {ip}\n  ports: [{{name: p, port: 80, protocol: TCP}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{namespace: ns, name: {name}-1, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: p, port: 8080, protocol: TCP}}]\nendpoints:\n"
        );
        for b in backends {
            y.push_str(&format!(
                "- {{addresses: [{b}], conditions: {{ready: true}}}}\n"
            ));
        }
        y
    }

    fn id(name: &str) -> ServiceRef {
        ServiceRef {
            namespace: intern("ns"),
            name: intern(name),
        }
    }

    /// The agent's sync state on memory maps.
    struct Bench {
        state: State,
        maps: MemoryMaps,
        programmed: Option<Desired>,
        ids: Ids,
    }

    impl Bench {
        fn new(yaml: &str, backoff: Duration) -> Self {
            let mut state = State {
                retries: Retries::with_backoff(backoff),
                ..State::default()
            };
            state.model = file::parse("t.yaml", yaml).expect("yaml").model;
            state.ready = true;
            state.full = true;
            let mut b = Bench {
                state,
                maps: MemoryMaps::default(),
                programmed: None,
                ids: Ids::default(),
            };
            assert_eq!(b.sync(&[]), 0);
            b
        }

        /// A sync of `changed` against `yaml` (the whole model); its errors.
        fn change(&mut self, yaml: &str, changed: &[&str]) -> u64 {
            self.state.model = file::parse("t.yaml", yaml).expect("yaml").model;
            self.sync(changed)
        }

        fn sync(&mut self, changed: &[&str]) -> u64 {
            self.state.changed.extend(changed.iter().map(|n| id(n)));
            sync(
                &mut self.state,
                &NodeContext::default(),
                &mut Programmed {
                    maps: &mut self.maps,
                    programmed: &mut self.programmed,
                    ids: &mut self.ids,
                    limits: Limits::default(),
                },
                None,
            )
        }

        /// The next sync is an incremental one.
        fn incremental(&self) -> bool {
            !self.state.full && self.programmed.is_none()
        }
    }

    #[test]
    fn a_service_a_full_map_refuses_is_retried_alone_while_the_others_sync_incrementally() {
        let web = |b: &str| svc("web", "10.96.0.1", &["10.244.0.1", b]);
        let api = svc("api", "10.96.0.2", &["10.244.0.3", "10.244.0.4"]);
        // A long backoff: api is not retried by web's sync.
        let mut b = Bench::new(&web("10.244.0.2"), Duration::from_secs(3600));
        b.maps.svc_capacity = Some(b.maps.state.services.len());
        let both = web("10.244.0.2") + &api;
        assert!(b.change(&both, &["api"]) > 0, "the full map refuses api");
        assert!(b.incremental(), "a failed write makes no full sync");
        assert_eq!(b.state.retries.tries(), [("ns/api:p".to_string(), 1)]);
        // web changes an endpoint (the same number of slots): applied incrementally, api
        // not tried again before its time.
        let moved = web("10.244.0.9") + &api;
        assert_eq!(b.change(&moved, &["web"]), 0);
        assert!(b.incremental());
        assert_eq!(b.state.retries.tries(), [("ns/api:p".to_string(), 1)]);
        let be: Vec<String> = b
            .maps
            .state
            .backends
            .values()
            .map(lb_common::user::show_backend)
            .collect();
        assert!(be.iter().any(|s| s.contains("10.244.0.9")), "{be:?}");
        assert!(!be.iter().any(|s| s.contains("10.244.0.2")), "{be:?}");
        // With room again, api's retry programs it, alone.
        b.maps.svc_capacity = None;
        b.state.retries.make_due();
        b.maps.log.clear();
        assert_eq!(b.sync(&[]), 0);
        assert_eq!(b.state.retries.len(), 0);
        assert_eq!(b.maps.state.services, b.state.engine.desired().services);
        assert!(
            b.maps.log.iter().all(|l| !l.contains("10.96.0.1")),
            "only api is written: {:?}",
            b.maps.log
        );
    }

    #[test]
    fn a_due_retry_that_still_fails_backs_off_and_the_others_still_sync() {
        let web = |b: &str| svc("web", "10.96.0.1", &["10.244.0.1", b]);
        let api = svc("api", "10.96.0.2", &["10.244.0.3"]);
        let mut b = Bench::new(&web("10.244.0.2"), Duration::ZERO);
        b.maps.svc_capacity = Some(b.maps.state.services.len());
        let both = web("10.244.0.2") + &api;
        assert!(b.change(&both, &["api"]) > 0);
        // Due at once (no backoff here): every sync tries api again, and web's change
        // still applies.
        let moved = web("10.244.0.9") + &api;
        assert!(b.change(&moved, &["web"]) > 0, "api still fails");
        assert!(b.incremental());
        assert_eq!(b.state.retries.tries(), [("ns/api:p".to_string(), 2)]);
        let be: Vec<String> = b
            .maps
            .state
            .backends
            .values()
            .map(lb_common::user::show_backend)
            .collect();
        assert!(
            be.iter().any(|s| s.contains("10.244.0.9"))
                && !be.iter().any(|s| s.contains("10.244.0.2")),
            "web's change is applied: {be:?}"
        );
        // A full sync (the prune) takes it in too, and keeps it failing, not lost.
        b.state.full = true;
        assert!(b.sync(&[]) > 0);
        assert_eq!(b.state.retries.tries(), [("ns/api:p".to_string(), 3)]);
        b.maps.svc_capacity = None;
        assert_eq!(b.sync(&[]), 0);
        assert_eq!(b.state.retries.len(), 0);
        assert_eq!(b.maps.state, *b.state.engine.desired());
    }
}
