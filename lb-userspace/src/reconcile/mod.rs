//! Reconciliation: the desired state kept service by service and brought into the maps.
//!
//! [`crate::desired`] says what the maps should hold for a model; this module keeps the
//! books that make that a sequence of small, safe writes, as Cilium's reconciler keeps a
//! status per object and kube-proxy's change trackers keep only what changed:
//!
//! | file | what it keeps |
//! |---|---|
//! | `mod.rs` | [`Reconciler`]: one sync, the desired state of what changed applied make-before-break |
//! | `ids.rs` | [`Ids`]: the dense indices, their quarantine, the filter bits of addresses that went |
//! | `incremental.rs` | [`Incremental`]: the desired state and what each service put in it |
//! | `journal.rs` | [`Journal`]: what one update overwrote (what is programmed of what it touched) |
//! | `slots.rs` | [`slots::Slots`]: each frontend's range of the slot array (a buddy allocator), their quarantine |
//! | `retry.rs` | services whose writes failed, each retried on its own with backoff |
//! | `status.rs` | [`Statuses`]: each failing frontend, its reason and since when; the transitions |
//!
//! What is programmed is not kept as a copy: after a sync without errors it is the desired
//! state; at start it is what was pinned (until the first full sync replaces it); for a
//! failed service it is what that service left ([`crate::datapath::diverged::Diverged`]).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::{Instant, SystemTime},
};

use tracing::{error, info, warn};

use crate::{
    datapath::{
        diverged::Diverged,
        stale,
        sync::{self, apply_fresh, apply_touched},
        writer::MapWriter,
    },
    desired::{self, Desired, DesiredError, Limits, NodeContext, Tally, Touched},
    model::{Model, ServiceRef},
};

mod ids;
mod incremental;
mod journal;
mod retry;
pub mod slots;
mod status;

pub use ids::{FILTER_RETAIN, Ids, QUARANTINE};
pub use incremental::Incremental;
pub use journal::Journal;
use retry::{Retries, Taken};
pub use status::{Failure, Reason, Status, Statuses, Transition};

/// The problems of what a sync computed (every service's after a full one, else the
/// `changed` ones'), logged: a Service without an EndpointSlice as information.
fn logged_problems<'e>(
    engine: &'e Incremental,
    full: bool,
    changed: &BTreeSet<ServiceRef>,
    logged: &mut HashMap<ServiceRef, u64>,
) -> Vec<&'e DesiredError> {
    let mut problems = Vec::new();
    let mut log = ProblemLog::default();
    let mut note = |id: &ServiceRef, of: &'e [DesiredError], logged: &mut HashMap<_, _>| {
        problems.extend(of.iter());
        log.note(id, of, logged);
    };
    match full {
        true => {
            let now: BTreeSet<&ServiceRef> =
                engine.problems_by_service().map(|(id, _)| id).collect();
            logged.retain(|id, _| now.contains(id));
            for (id, of) in engine.problems_by_service() {
                note(id, of, logged);
            }
        }
        false => {
            for id in changed {
                match engine.problem_list(id) {
                    [] => {
                        logged.remove(id);
                    }
                    of => note(id, of, logged),
                }
            }
        }
    }
    log.finish();
    problems
}

/// The problems of one sync that are logged: a service's when they appeared or changed,
/// at most [`LOGGED_PER_SYNC`] lines, the rest counted in one (each is in the service's
/// status, `xlb list services` and its Events).
#[derive(Default)]
struct ProblemLog {
    lines: usize,
    more: usize,
}

/// The most problems one sync logs one by one.
const LOGGED_PER_SYNC: usize = 50;

impl ProblemLog {
    fn note(
        &mut self,
        id: &ServiceRef,
        of: &[DesiredError],
        logged: &mut HashMap<ServiceRef, u64>,
    ) {
        let hash = {
            use std::hash::{Hash, Hasher};
            let mut h = std::hash::DefaultHasher::new();
            for p in of {
                p.to_string().hash(&mut h);
            }
            h.finish()
        };
        if logged.insert(id.clone(), hash) == Some(hash) {
            return;
        }
        for p in of {
            if self.lines == LOGGED_PER_SYNC {
                self.more += 1;
                continue;
            }
            self.lines += 1;
            match p {
                DesiredError::NoEndpointSlice { .. } => info!("{p}"),
                _ => warn!("{p}"),
            }
        }
    }

    fn finish(self) {
        if self.more > 0 {
            warn!(
                more = self.more,
                "and more problems than one sync logs; `xlb list services` shows each"
            );
        }
    }
}

/// Writes what `touched` names of `desired` into `maps`, which hold `now` (updated to
/// what they hold after), the errors logged. A full sync into maps that hold nothing
/// compares and copies nothing; after an error there, what is programmed is read back.
fn apply(
    maps: &mut dyn MapWriter,
    now: &mut Desired,
    desired: &Desired,
    touched: &Touched,
    full: bool,
) -> sync::SyncReport {
    let report = if full && now.is_empty() {
        let report = apply_fresh(maps, desired, touched);
        if !report.errors.is_empty() {
            *now = maps.read().unwrap_or_else(|e| {
                warn!("reading back the maps after a failed first sync: {e}");
                Desired::default()
            });
        }
        report
    } else {
        apply_touched(maps, now, desired, touched)
    };
    for e in &report.errors {
        error!("{e}");
    }
    report
}

/// A full computation that keeps `ids`' books: [`desired::compute_on`], then the indices
/// of what is no longer desired given back (after their quarantine) and the filter bits of
/// addresses that went kept for [`FILTER_RETAIN`]. [`Incremental::full`] gives the same.
pub fn recompute(
    model: &Model,
    node: &NodeContext,
    ids: &mut Ids,
    limits: Limits,
) -> (Desired, Vec<DesiredError>) {
    let (mut d, errors) = desired::compute_on(model, node, ids, limits);
    ids.retain(&d);
    d.filter = ids.filter_bits(std::mem::take(&mut d.filter));
    (d, errors)
}

/// The agent's books on the maps: the desired state service by service, the indices, what
/// is programmed where that is not the desired state, the services whose writes failed.
#[derive(Debug)]
pub struct Reconciler {
    engine: Incremental,
    ids: Ids,
    /// What is programmed, when it is not the desired state (at start: what was pinned);
    /// none when the maps hold the desired state (but where failed services' writes left
    /// them otherwise: see [`retry`]).
    programmed: Option<Desired>,
    retries: Retries,
    /// The failing frontends.
    statuses: Statuses,
    /// Entries the last sync freed in the maps (0: none): as many services a full map left
    /// out are computed again, the next ones after [`Reconciler::woken`] in turn.
    room_freed: usize,
    /// The last service woken for freed room (the next wake starts after it).
    woken: Option<ServiceRef>,
    /// What was logged of each service's problems (a hash of them), so that a problem is
    /// logged when it appears or changes, not at every sync that computes it again.
    logged: HashMap<ServiceRef, u64>,
    limits: Limits,
}

/// What a sync recomputes.
#[derive(Clone, Copy, Debug)]
pub enum Scope<'a> {
    /// Everything, diffed against what is programmed (at start, after a node change, as
    /// the prune).
    Everything,
    /// These services (and what they unblock).
    Changed(&'a BTreeSet<ServiceRef>),
}

/// Whether a sync finds the connected UDP pairs it took out (their sockets are destroyed
/// when the socket hooks are attached).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GoneUdp {
    Find,
    Ignore,
}

/// What one sync did.
#[derive(Debug, Default)]
pub struct Synced {
    /// It recomputed and diffed everything.
    pub full: bool,
    /// Its failed writes and its services' problems (a Service without an EndpointSlice is
    /// normal, as kube-proxy does not count it).
    pub errors: u64,
    /// Connected UDP frontend–backend pairs it took out (when asked for them): their
    /// sockets are stale.
    pub gone_udp: BTreeSet<stale::Pair>,
    /// Frontends that started failing, failed otherwise or recovered (see [`Statuses`]).
    pub transitions: Vec<Transition>,
}

impl Reconciler {
    /// Books for maps that hold `programmed` (adopted from the pins; its indices in `ids`),
    /// within `limits`. The first sync is a full one against it.
    pub fn adopt(programmed: Desired, limits: Limits) -> Self {
        Self {
            engine: Incremental::default(),
            ids: Ids::adopt(&programmed),
            programmed: Some(programmed),
            retries: Retries::default(),
            statuses: Statuses::default(),
            room_freed: 0,
            woken: None,
            logged: HashMap::new(),
            limits,
        }
    }

    /// Books for maps of this layout that hold no frontend yet beside the layout before slot
    /// ranges (`datapath::upgrade::slotted_indices`): the indices adopted from `indices`
    /// (each frontend's service index, each backend's index and generation), so the first
    /// sync keeps every flow's; `programmed` what this layout's maps hold, with the backends
    /// both layouts share.
    pub fn adopt_slotted(mut indices: Desired, mut programmed: Desired, limits: Limits) -> Self {
        programmed.backends = indices.backends.clone();
        indices.filter = programmed.filter.clone();
        let mut books = Self::adopt(programmed, limits);
        books.ids = Ids::adopt(&indices);
        books
    }

    /// The failing frontends.
    pub fn statuses(&self) -> &Statuses {
        &self.statuses
    }

    /// What the maps hold (but for what failed services left).
    pub fn programmed(&self) -> &Desired {
        self.programmed.as_ref().unwrap_or(self.engine.desired())
    }

    /// What [`Reconciler::programmed`] takes beyond its maps' lengths (the slots of its
    /// frontends' ranges, its IPv6 source ranges): the running totals of the desired
    /// state, no walk; counted once from the pins' state before the first sync.
    pub fn tally(&self) -> Tally {
        match &self.programmed {
            Some(p) => Tally::recount(p),
            None => {
                let t = self.engine.tally();
                debug_assert_eq!(t, Tally::recount(self.engine.desired()), "running totals");
                t
            }
        }
    }

    /// The desired state now.
    pub fn desired(&self) -> &Desired {
        self.engine.desired()
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The next sync must be a full one (the maps hold something else than the desired
    /// state: at start).
    pub fn needs_full(&self) -> bool {
        self.programmed.is_some()
    }

    /// When the next failed service's retry is due (at once when room was made in a map
    /// a service could not fit in).
    pub fn next_retry(&self) -> Option<Instant> {
        match self.room_freed > 0 && self.waiting_for_room().next().is_some() {
            true => Some(Instant::now()),
            false => self.retries.next_due(),
        }
    }

    /// The services a full map left out (in order, some more than once).
    fn waiting_for_room(&self) -> impl Iterator<Item = &ServiceRef> {
        self.statuses
            .failing()
            .filter(|(_, _, f)| matches!(f.reason, Reason::MapFull | Reason::MaglevMapFull))
            .map(|(id, _, _)| id)
    }

    /// The services a full map left out to compute again for `freed` entries of room: as
    /// many (each needs one at least), the ones after the last woken first, in turn, so a
    /// small change never recomputes every waiter and none waits behind the others for
    /// ever. Those left wait for the next room or the periodic full sync.
    fn wake(&mut self, freed: usize) -> BTreeSet<ServiceRef> {
        let waiting: BTreeSet<&ServiceRef> = self.waiting_for_room().collect();
        let after = |id: &&&ServiceRef| self.woken.as_ref().is_none_or(|w| **id > w);
        let turn: Vec<ServiceRef> = waiting
            .iter()
            .filter(after)
            .chain(waiting.iter().filter(|id| !after(id)))
            .take(freed.max(1))
            .map(|id| (*id).clone())
            .collect();
        let last = turn.last().cloned();
        let woken = turn.into_iter().collect();
        self.woken = last;
        woken
    }

    /// Programs `scope` of `model` on `node` (everything as well when
    /// [`Reconciler::needs_full`]) into `maps`: the problems logged, failed writes kept per
    /// service for their retry, and the connected UDP pairs that went returned when asked.
    /// After a full sync the B-trees are rebuilt full.
    pub fn sync(
        &mut self,
        model: &Model,
        node: &NodeContext,
        maps: &mut dyn MapWriter,
        scope: Scope,
        udp: GoneUdp,
    ) -> Synced {
        let started = Instant::now();
        self.ids.tick(Instant::now());
        let none = BTreeSet::new();
        let (full, changed) = match scope {
            Scope::Everything => (true, &none),
            Scope::Changed(changed) => (self.programmed.is_some(), changed),
        };
        // Room made in a map by the last sync: who did not fit is computed again.
        let widened: BTreeSet<ServiceRef>;
        let freed = std::mem::take(&mut self.room_freed);
        let changed = match freed > 0 && !full {
            true => {
                let mut woken = self.wake(freed);
                woken.extend(changed.iter().cloned());
                widened = woken;
                &widened
            }
            false => changed,
        };
        let sizes = Sizes::of(self.engine.desired());
        let (touched, mut now, taken) = self.compute(model, node, full, changed);
        self.room_freed = match full {
            true => 0,
            false => Sizes::of(self.engine.desired()).freed_from(&sizes),
        };
        let retried = taken.len();
        let problems = logged_problems(&self.engine, full, changed, &mut self.logged);
        let udp_before = (udp == GoneUdp::Find).then(|| stale::udp_pairs(&now, &touched.frontends));
        let report = apply(maps, &mut now, self.engine.desired(), &touched, full);
        let gone_udp = match udp_before {
            Some(before) => {
                let after = stale::udp_pairs(&now, &touched.frontends);
                before.difference(&after).copied().collect()
            }
            None => BTreeSet::new(),
        };
        // What failed is kept per service (what it left programmed) and retried on its own
        // with backoff; the next syncs stay incremental.
        let diverged = match report.errors.is_empty() {
            true => Diverged::default(),
            false => Diverged::of(&now, self.engine.desired(), &touched),
        };
        drop(now);
        let desired = self.engine.desired();
        self.retries
            .record(taken, diverged, desired, &report, Instant::now());
        // The maps hold the desired state: no entry names what was given back, so its
        // quarantine starts now (while a write keeps failing it is held).
        if report.errors.is_empty() && self.retries.len() == 0 {
            self.ids.confirm(Instant::now());
        }
        let counted = problems
            .iter()
            .filter(|p| !matches!(p, DesiredError::NoEndpointSlice { .. }))
            .count();
        let errors = (report.errors.len() + counted) as u64;
        info!(
            services = self.engine.frontends(),
            changed = changed.len(),
            full,
            writes = report.writes,
            deletes = report.deletes,
            errors,
            retried,
            failing = self.retries.len(),
            took_us = started.elapsed().as_micros() as u64,
            "synced"
        );
        if full {
            // The sync's temporaries first (a full one's touched sets are as large as the
            // maps), then the B-trees rebuilt full.
            drop((touched, problems));
            self.engine.compact();
            self.ids.compact(self.engine.desired());
        }
        let transitions = self.update_statuses(model, full, changed);
        Synced {
            full,
            errors,
            gone_udp,
            transitions,
        }
    }

    /// The status of the services whose failures may have changed: those a full sync
    /// computed with problems, or `changed` ones, and every one failing before or now;
    /// healthy services that stay healthy cost nothing.
    fn update_statuses(
        &mut self,
        model: &Model,
        full: bool,
        changed: &BTreeSet<ServiceRef>,
    ) -> Vec<Transition> {
        let mut now: BTreeMap<ServiceRef, BTreeMap<String, (Reason, String)>> = BTreeMap::new();
        let mut ids: BTreeSet<&ServiceRef> = match full {
            true => self
                .engine
                .problems_by_service()
                .map(|(id, _)| id)
                .collect(),
            false => changed.iter().collect(),
        };
        // Waiters recomputed when a frontend freed are among these.
        ids.extend(self.statuses.failing_services());
        for id in ids {
            for p in self.engine.problems_of(id) {
                if let Some((reason, object)) = Reason::of(p) {
                    let f = now.entry(id.clone()).or_default();
                    f.entry(object.to_string())
                        .or_insert_with(|| (reason, p.to_string()));
                }
            }
        }
        for (name, error) in self.retries.failing() {
            if let Some(id) = service_of(name) {
                let f = now.entry(id).or_default();
                f.entry(name.to_string())
                    .or_insert_with(|| (Reason::WriteFailed, error.to_string()));
            }
        }
        let before: Vec<ServiceRef> = self.statuses.failing_services().cloned().collect();
        for id in before {
            now.entry(id).or_default();
        }
        let (at, mut out) = (SystemTime::now(), Vec::new());
        for (id, failures) in now {
            let exists = model.services.contains_key(&id);
            self.statuses.update(&id, failures, exists, at, &mut out);
        }
        out
    }

    /// The desired state of what changed (of everything when `full`), and what is
    /// programmed of what it touched: for a full computation the state it replaces (the
    /// maps held it), for an update the journal's view of what it changed; either with
    /// what the failed services it takes in (all of them for a full one, else those due or
    /// touched) left programmed.
    fn compute(
        &mut self,
        model: &Model,
        node: &NodeContext,
        full: bool,
        changed: &BTreeSet<ServiceRef>,
    ) -> (Touched, Desired, Taken) {
        let (ids, limits) = (&mut self.ids, self.limits);
        if full {
            let mut retried = Touched::default();
            let taken = self.retries.take(&mut retried, Instant::now(), true);
            let replaced = self.engine.full(model, node, ids, limits);
            let mut now = self.programmed.take().unwrap_or(replaced);
            taken.overlay(&mut now);
            let mut touched = sync::everything(&now, self.engine.desired());
            touched.extend(retried);
            (touched, now, taken)
        } else {
            let changed = changed.iter().cloned();
            let mut touched = self.engine.update(model, node, ids, limits, changed);
            let taken = self.retries.take(&mut touched, Instant::now(), false);
            let mut now = self.engine.programmed_before(&touched);
            taken.overlay(&mut now);
            (touched, now, taken)
        }
    }
}

/// The entries of each map of a desired state limited in size.
#[derive(PartialEq, Eq)]
struct Sizes([usize; 5]);

impl Sizes {
    fn of(d: &Desired) -> Self {
        Sizes([
            d.services.len(),
            d.backends.len(),
            d.names.len(),
            d.src_ranges.len(),
            d.maglev.len(),
        ])
    }

    /// The most entries one map has fewer of than in `before` (0: none shrank): how many
    /// services left out may fit now, one entry each at least.
    fn freed_from(&self, before: &Sizes) -> usize {
        self.0
            .iter()
            .zip(before.0)
            .map(|(now, was)| was.saturating_sub(*now))
            .max()
            .unwrap_or(0)
    }
}

/// The Service of a service port's name in the maps (`namespace/name:port`).
fn service_of(name: &str) -> Option<ServiceRef> {
    let (service, _port) = crate::desired::service_port_of(name);
    let (namespace, name) = service.split_once('/')?;
    Some(ServiceRef::new(namespace, name))
}

#[cfg(test)]
mod tests;
