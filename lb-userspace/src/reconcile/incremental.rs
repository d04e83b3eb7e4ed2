//! The desired state kept up to date service by service: a changed Service (or slice) has
//! its frontends recomputed and only they are replaced, as kube-proxy's change trackers
//! keep only what changed and Cilium reconciles per frontend. A full computation happens at
//! start (adopting the pins' indices), when the node changes, and as the periodic prune;
//! it gives the same state as [`super::recompute`], and so does every
//! sequence of incremental updates (a property test holds them to it).
//!
//! Each service's contribution (its map keys, the backend index of each slot, its names
//! and source ranges) is recorded, backends and filter bits are reference-counted, so
//! taking a service out touches only what it added. A frontend another service already
//! owns is a conflict; the loser waits on the frontend and is recomputed when the owner
//! lets it go.

use lb_common::user::show_frontend;
use std::collections::{BTreeMap, BTreeSet};

use foldhash::{HashMap, HashMapExt};
use lb_common::{Backend, FilterSize, SCOPE_EXTERNAL, SvcKey};
use smallvec::SmallVec;

use super::{Ids, Journal, ids::Bits};
use crate::{
    desired::{
        Candidate, Desired, DesiredError, Limits, NodeContext, ObjectName, Placed, Tally, Touched,
        backend_filter_bit, candidates_of, external, placing_order, plan, service_candidates,
    },
    model::{Model, ServiceRef},
};

/// A frontend key's owner: the service and the frontend's object name (the desired
/// state's name of it, shared, unless that one was cut short).
type Owner = (ServiceRef, ObjectName);

/// The desired state and what each service put in it.
#[derive(Debug, Default)]
pub struct Incremental {
    desired: Desired,
    /// Per service: the frontends it placed (a service's first inline: most have one).
    placed: BTreeMap<ServiceRef, SmallVec<[Placed; 1]>>,
    /// Per service: what it could not (fully) program, from its last computation (services
    /// without problems have no entry).
    problems: BTreeMap<ServiceRef, Vec<DesiredError>>,
    /// External frontend key → who owns it.
    owners: BTreeMap<SvcKey, Owner>,
    /// External frontend key → services that wanted it and lost (recomputed when it frees).
    waiting: BTreeMap<SvcKey, BTreeSet<ServiceRef>>,
    /// Backend index → slots naming it (dense: indices are small and reused).
    backend_refs: Vec<u32>,
    /// Filter bit → how many frontends and backends beyond the first have an address in
    /// it (a hash map of the few shared bits: whether a bit has one at all is
    /// [`Ids`]' set of live bits).
    filter_shared: HashMap<u32, u32>,
    /// The address filters' size (from the limits of the last full computation).
    filter: FilterSize,
    /// Frontend entries placed (either scope).
    frontends: usize,
    /// What the desired state takes beyond its maps' lengths (slots, IPv6 source ranges),
    /// kept as it changes: where a plan is applied ([`Plan::apply_counted`]) and in
    /// [`Incremental::remove`], the only places its frontends and ranges change.
    ///
    /// [`Plan::apply_counted`]: crate::desired::Plan::apply_counted
    tally: Tally,
    /// What the last [`Incremental::update`] changed, as it was before (none after a full
    /// computation, which records nothing).
    journal: Option<Journal>,
}

impl Incremental {
    /// The desired state now.
    pub fn desired(&self) -> &Desired {
        &self.desired
    }

    /// The desired state, taken out (this state is left empty; `ids`, which found its
    /// backends in it, keep copies of their own again).
    pub fn take_desired(&mut self, ids: &mut Ids) -> Desired {
        let d = std::mem::take(&mut self.desired);
        self.tally = Tally::default();
        ids.unlend(&d.backends);
        d
    }

    /// What the desired state takes beyond its maps' lengths: the slots of its frontends'
    /// ranges, its IPv6 source ranges (running totals: no walk).
    pub fn tally(&self) -> Tally {
        self.tally
    }

    /// What is programmed of what `touched` (the last update's) names, when the maps held
    /// the desired state before that update: see [`Journal::programmed`].
    pub fn programmed_before(&self, touched: &Touched) -> Desired {
        match &self.journal {
            Some(j) => j.programmed(&self.desired, touched),
            None => Journal::default().programmed(&self.desired, touched),
        }
    }

    /// The problems of service `id` (from its last computation).
    pub fn problems_of(&self, id: &ServiceRef) -> impl Iterator<Item = &DesiredError> {
        self.problems.get(id).into_iter().flatten()
    }

    /// The problems of service `id`, as a slice (none: empty).
    pub fn problem_list(&self, id: &ServiceRef) -> &[DesiredError] {
        self.problems.get(id).map_or(&[], |p| p.as_slice())
    }

    /// How many frontend entries (either scope) the desired state has.
    pub fn frontends(&self) -> usize {
        self.frontends
    }

    /// Each service with problems, with them.
    pub fn problems_by_service(&self) -> impl Iterator<Item = (&ServiceRef, &[DesiredError])> {
        self.problems.iter().map(|(id, p)| (id, p.as_slice()))
    }

    /// Every problem of every service, in service order.
    pub fn problems(&self) -> impl Iterator<Item = &DesiredError> {
        self.problems.values().flatten()
    }

    /// Recomputes everything, as [`super::recompute`] does (the same result): at start, on
    /// a node change, as the prune. Returns the desired state it replaced (after a sync
    /// without errors, what is programmed, to apply it against): kept until it is done, as
    /// `ids` find the backends they handed out in it.
    pub fn full(
        &mut self,
        model: &Model,
        node: &NodeContext,
        ids: &mut Ids,
        limits: Limits,
    ) -> Desired {
        let mut replaced = std::mem::take(&mut self.desired);
        ids.hold(std::mem::take(&mut replaced.backends));
        *self = Incremental {
            filter: limits.filter,
            ..Incremental::default()
        };
        let mut candidates = Vec::new();
        for (id, svc) in &model.services {
            let mut errors = Vec::new();
            for c in candidates_of(model, (id, svc), node, &mut errors) {
                candidates.push((id, c));
            }
            if !errors.is_empty() {
                self.problems.insert(id.clone(), errors);
            }
        }
        let backends = candidates
            .iter()
            .map(|(_, c)| c.backend_addrs().count())
            .sum();
        ids.reserve(candidates.len(), backends, &self.desired);
        let d = &mut self.desired;
        d.backends.reserve(backends.min(limits.backends as usize));
        d.names
            .reserve(candidates.len().min(limits.services as usize));
        // Already-programmed frontends first, then new ones, each group in model order (each
        // key looked up once: a candidate is large, the sort moves indices).
        candidates.sort_by_cached_key(|(_, c)| placing_order(ids, c));
        let mut placed = Vec::with_capacity(candidates.len());
        for (id, c) in candidates {
            if let Some(p) = self.offer(id, c, ids, limits) {
                placed.push((id, p));
            }
        }
        self.placed = by_service(placed);
        ids.retain(&self.desired);
        ids.lend(&self.desired);
        replaced.backends = ids.unhold();
        let (live, shared) = filter_bits(&self.desired, self.filter);
        self.desired.filter = ids.filter_bits_of(live);
        self.filter_shared = shared;
        replaced
    }

    /// Rebuilds the B-trees from their sorted entries (the arrays give back their room past
    /// the highest index): a B-tree filled one
    /// insert at a time has its nodes about half empty, one built from sorted entries full
    /// (the same contents in about half the memory; later inserts split nodes as before).
    /// The agent does it after a full sync is applied, off the sync's path.
    pub fn compact(&mut self) {
        let d = &mut self.desired;
        compact(&mut d.services);
        d.backends.shrink_to_fit();
        d.names.shrink_to_fit();
        compact(&mut d.maglev);
        compact(&mut self.placed);
        for p in self.placed.values_mut() {
            p.shrink_to_fit();
        }
        compact(&mut self.problems);
        compact(&mut self.owners);
        self.backend_refs.shrink_to_fit();
    }

    /// Recomputes the services in `changed` (and those waiting on a frontend one of them
    /// let go) against `model`; returns what differs for the maps.
    pub fn update(
        &mut self,
        model: &Model,
        node: &NodeContext,
        ids: &mut Ids,
        limits: Limits,
        changed: impl IntoIterator<Item = ServiceRef>,
    ) -> Touched {
        self.journal = Some(Journal::default());
        let mut touched = Touched::default();
        let mut backends_seen: BTreeSet<Backend> = BTreeSet::new();
        let mut queue: BTreeSet<ServiceRef> = changed.into_iter().collect();
        let mut done = BTreeSet::new();
        while let Some(id) = queue.pop_first() {
            if !done.insert(id.clone()) {
                continue;
            }
            let released = self.remove(&id, ids, &mut touched, &mut backends_seen);
            let mut errors = Vec::new();
            let mut candidates = service_candidates(model, &id, node, &mut errors);
            candidates.sort_by_key(|c| placing_order(ids, c));
            for c in candidates {
                self.offer_collect(&id, c, ids, limits, &mut errors, &mut touched);
            }
            for p in self.placed.get(&id).into_iter().flatten() {
                self.touch_placed(p, &mut touched, &mut backends_seen);
            }
            if model.services.contains_key(&id) && !errors.is_empty() {
                self.problems.insert(id.clone(), errors);
            } else {
                self.problems.remove(&id);
            }
            // A frontend this service let go: who waited for it is recomputed.
            for key in released {
                if self.owners.contains_key(&key) {
                    continue;
                }
                if let Some(w) = self.waiting.remove(&key) {
                    queue.extend(w.into_iter().filter(|s| !done.contains(s)));
                }
            }
        }
        ids.retain_touched(&self.desired, &touched.frontends, backends_seen);
        ids.lend(&self.desired);
        touched
    }

    /// Takes service `id`'s contribution out; returns the external keys it owned.
    fn remove(
        &mut self,
        id: &ServiceRef,
        ids: &mut Ids,
        touched: &mut Touched,
        backends_seen: &mut BTreeSet<Backend>,
    ) -> Vec<SvcKey> {
        for w in self.waiting.values_mut() {
            w.remove(id);
        }
        self.waiting.retain(|_, w| !w.is_empty());
        let mut released = Vec::new();
        for p in self.placed.remove(id).unwrap_or_default() {
            self.frontends -= 1;
            self.touch_placed(&p, touched, backends_seen);
            let k = p.key;
            if let Some(j) = &mut self.journal {
                j.service(&self.desired, k);
            }
            if let Some(v) = self.desired.services.remove(&k) {
                self.tally.service(&v, false);
                self.unref_filter(self.filter.bit_of(&k.addr_be), ids, touched);
                if k.scope == SCOPE_EXTERNAL {
                    self.owners.remove(&k);
                    released.push(k);
                }
                for b in v.slots.iter() {
                    self.unref_backend(*b, ids, touched);
                }
            }
            if let Some(j) = &mut self.journal {
                j.name(&self.desired, p.name);
            }
            self.desired.names.remove(&p.name);
            for r in &p.src_ranges {
                if let Some(j) = &mut self.journal {
                    j.src_range(&self.desired, *r);
                }
                if self.desired.src_ranges.remove(r) {
                    self.tally.src_range(r, false);
                }
            }
            if let Some(id) = p.maglev {
                if let Some(j) = &mut self.journal {
                    j.maglev(&self.desired, id);
                }
                self.desired.maglev.remove(&id);
            }
        }
        released
    }

    fn touch_placed(
        &self,
        p: &Placed,
        touched: &mut Touched,
        backends_seen: &mut BTreeSet<Backend>,
    ) {
        touched.frontends.insert(p.key);
        for b in p.backends(&self.desired) {
            touched.backends.insert(b);
            if let Some(be) = self.desired.backends.get(&b) {
                backends_seen.insert(*be);
            }
        }
        touched.src_ranges.extend(p.src_ranges.iter().copied());
        touched.maglev.extend(p.maglev);
    }

    fn unref_backend(&mut self, id: u32, ids: &mut Ids, touched: &mut Touched) {
        let Some(n) = self.backend_refs.get_mut(id as usize).filter(|n| **n > 0) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            if let Some(j) = &mut self.journal {
                j.backend(&self.desired, id);
            }
            ids.keep_backend(id, &self.desired.backends);
            if let Some(be) = self.desired.backends.remove(&id) {
                let bit = backend_filter_bit(self.filter, &be);
                self.unref_filter(bit, ids, touched);
            }
        }
    }

    fn unref_filter(&mut self, bit: u32, ids: &mut Ids, touched: &mut Touched) {
        if let Some(n) = self.filter_shared.get_mut(&bit) {
            *n -= 1;
            if *n == 0 {
                self.filter_shared.remove(&bit);
            }
        } else if ids.filter_live(bit) {
            // It stays set (a flow may still need it) until a prune retires it.
            ids.filter_bit(bit, false);
            touched.filter_words.insert(bit / 64);
        }
    }

    fn ref_filter(&mut self, bit: u32, ids: &mut Ids, touched: &mut Touched) {
        if ids.filter_live(bit) {
            *self.filter_shared.entry(bit).or_default() += 1;
            return;
        }
        ids.filter_bit(bit, true);
        if let Some(j) = &mut self.journal {
            j.filter_bit(&self.desired, bit);
        }
        self.desired.filter.insert(bit);
        touched.filter_words.insert(bit / 64);
    }

    /// [`Incremental::offer`], collecting problems in `errors` and what changed in `touched`.
    fn offer_collect(
        &mut self,
        id: &ServiceRef,
        c: Candidate,
        ids: &mut Ids,
        limits: Limits,
        errors: &mut Vec<DesiredError>,
        touched: &mut Touched,
    ) {
        let key = c.key;
        let p = match self.offer_inner(id, c, ids, limits, errors) {
            Err(e) => return errors.push(e),
            Ok(Some(p)) => {
                self.placed.entry(id.clone()).or_default().push(p.clone());
                p
            }
            Ok(None) => {
                // Not placed (a full map): its index is given back below.
                touched.frontends.insert(key);
                return;
            }
        };
        self.ref_filter(self.filter.bit_of(&p.key.addr_be), ids, touched);
        let backends: Vec<u32> = p.backends(&self.desired).collect();
        for b in backends {
            let n = backend_ref(&mut self.backend_refs, b);
            *n += 1;
            if *n == 1
                && let Some(be) = self.desired.backends.get(&b).copied()
            {
                self.ref_filter(backend_filter_bit(self.filter, &be), ids, touched);
            }
        }
    }

    /// A candidate of a full computation (problems go to the service's list); what it
    /// placed, for the caller to record.
    fn offer(
        &mut self,
        id: &ServiceRef,
        c: Candidate,
        ids: &mut Ids,
        limits: Limits,
    ) -> Option<Placed> {
        let mut errors = Vec::new();
        let placed = self
            .offer_inner(id, c, ids, limits, &mut errors)
            .unwrap_or_else(|e| {
                errors.push(e);
                None
            });
        if let Some(p) = &placed {
            for b in p.backends(&self.desired) {
                *backend_ref(&mut self.backend_refs, b) += 1;
            }
        }
        if !errors.is_empty() {
            self.problems.entry(id.clone()).or_default().extend(errors);
        }
        placed
    }

    /// Places candidate `c` of service `id` unless its frontend is taken: the conflict is
    /// the error (and `id` waits for the frontend). What it placed is for the caller to
    /// record in `placed` (none when it does not fit).
    fn offer_inner(
        &mut self,
        id: &ServiceRef,
        c: Candidate,
        ids: &mut Ids,
        limits: Limits,
        errors: &mut Vec<DesiredError>,
    ) -> Result<Option<Placed>, DesiredError> {
        if c.key.scope != SCOPE_EXTERNAL {
            // An internal scope goes with its external entry, placed before it.
            let ext = external(c.key);
            let owned = self.owners.get(&ext);
            if owned.is_none_or(|(s, object)| s != id || **object != *c.object) {
                return Ok(None);
            }
        } else if let Some((_, owner)) = self.owners.get(&c.key) {
            self.waiting.entry(c.key).or_default().insert(id.clone());
            return Err(DesiredError::FrontendConflict {
                frontend: show_frontend(&c.key),
                object: c.object.to_string(),
                owner: owner.to_string(),
            });
        }
        let key = c.key;
        // The owner's object name is the candidate's, which the name shares unless it is
        // cut short (one copy).
        let object = (key.scope == SCOPE_EXTERNAL).then(|| c.object.clone());
        let Some(plan) = plan(&self.desired, c, ids, limits, errors) else {
            return Ok(None);
        };
        if let Some(j) = &mut self.journal {
            j.plan(&self.desired, &plan);
        }
        let placed = plan.apply_counted(&mut self.desired, &mut self.tally);
        if let Some(object) = object {
            self.owners.insert(key, (id.clone(), object));
        }
        self.frontends += 1;
        Ok(Some(placed))
    }
}

/// What each service placed, from what each frontend placed in placing order (a service's
/// frontends kept in that order; the map built at once from its sorted entries, not one
/// search and insert per frontend).
fn by_service(
    mut placed: Vec<(&ServiceRef, Placed)>,
) -> BTreeMap<ServiceRef, SmallVec<[Placed; 1]>> {
    // Stable, and found sorted when every frontend is of one group (a cold start's IPv4).
    placed.sort_by(|a, b| a.0.cmp(b.0));
    let mut grouped: Vec<(ServiceRef, SmallVec<[Placed; 1]>)> = Vec::new();
    for (id, p) in placed {
        match grouped.last_mut() {
            Some((last, ps)) if last == id => ps.push(p),
            _ => grouped.push((id.clone(), SmallVec::from_buf([p]))),
        }
    }
    grouped.into_iter().collect()
}

/// Backend `id`'s reference count in `refs`, grown to hold it.
fn backend_ref(refs: &mut Vec<u32>, id: u32) -> &mut u32 {
    let i = id as usize;
    if refs.len() <= i {
        refs.resize(i + 1, 0);
    }
    &mut refs[i]
}

/// `m` rebuilt from its sorted entries, its nodes full.
pub(super) fn compact<K: Ord, V>(m: &mut BTreeMap<K, V>) {
    *m = std::mem::take(m).into_iter().collect();
}

/// The filter bits of the addresses `d` programs ([`crate::desired::live_filter_bits`]),
/// and how many frontends and backends of `d` beyond the first have an address in each
/// filter bit shared by more than one.
fn filter_bits(d: &Desired, size: FilterSize) -> (Bits, HashMap<u32, u32>) {
    let (mut seen, mut shared) = (Bits::default(), HashMap::new());
    let bits = (d.services.keys().map(|k| size.bit_of(&k.addr_be)))
        .chain(d.backends.values().map(|be| backend_filter_bit(size, be)));
    for bit in bits {
        if !seen.insert(bit) {
            *shared.entry(bit).or_default() += 1;
        }
    }
    (seen, shared)
}
