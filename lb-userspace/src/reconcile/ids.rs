//! Indices handed out to frontends (service ports) and backends, stable across syncs and
//! agent restarts.
//!
//! Both are dense: a service index addresses the per-service counter array, a backend index
//! the backend array and its counter array, so the datapath never hashes to find either. An
//! index is reused, but only after it has been free for [`QUARANTINE`] (a packet of a flow
//! that outlived its backend or service still counts toward the index for a while), and a
//! backend also carries a generation that is never reused while the agent runs: a conntrack
//! or affinity entry names its backend by index *and* generation, so an index handed to
//! another backend is never mistaken for the one the flow had. An index handed out but never
//! programmed (its service did not fit) is free again at once.
//!
//! The quarantine starts when the kernel is known to no longer name the index: an index
//! given back is *held* until [`Ids::confirm`], which the reconciler calls after a sync that
//! left the maps holding exactly the desired state (no failed write, no service waiting for
//! its retry). While a write keeps failing, what it left programmed may still name an old
//! index or slot range, so nothing given back since is handed out again: held indices are
//! bounded by the pool, and a long failure costs free indices, never a flow read by another
//! frontend's or backend's entry.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    time::{Duration, Instant},
};

use foldhash::{HashMap, HashMapExt};
use hashbrown::HashTable;
use lb_common::{Backend, SvcKey};

use std::sync::Arc;

use super::slots::Slots;
use crate::desired::{Dense, Desired, Indices, maglev::TableCache};

/// How long a freed index stays unused before it is handed out again.
pub const QUARANTINE: Duration = Duration::from_secs(300);

/// How long an address filter bit stays set after its last address went: a TCP flow keeps
/// its backend after its service or backend is gone, and its packets must still reach their
/// conntrack entry (kube-proxy's established TCP timeout).
pub const FILTER_RETAIN: Duration = Duration::from_secs(24 * 3600);

/// One kind of dense index: `1..capacity` (0 names nothing).
#[derive(Clone, Debug)]
struct Pool {
    /// The lowest index never handed out.
    next: u32,
    /// Freed indices, oldest first, with the time they were freed.
    freed: VecDeque<(u32, Instant)>,
    /// Indices handed out but never programmed: free at once.
    unused: Vec<u32>,
    /// Given back while programmed, until the maps are known not to name them.
    held: Vec<u32>,
}

impl Default for Pool {
    fn default() -> Self {
        Self {
            next: 1,
            freed: VecDeque::new(),
            unused: Vec::new(),
            held: Vec::new(),
        }
    }
}

impl Pool {
    /// A pool in which `used` are taken; the holes below the highest are freed `now`.
    fn adopt(used: &BTreeSet<u32>, now: Instant) -> Self {
        let next = used.last().map_or(1, |m| m + 1);
        Self {
            next,
            freed: (1..next)
                .filter(|i| !used.contains(i))
                .map(|i| (i, now))
                .collect(),
            unused: Vec::new(),
            held: Vec::new(),
        }
    }

    /// An index below `capacity`: one never programmed, else the oldest freed one past its
    /// quarantine, else a fresh one. `None` when every index is taken or in quarantine.
    fn take(&mut self, now: Instant, capacity: u32) -> Option<u32> {
        if let Some(i) = self.unused.pop() {
            return Some(i);
        }
        if let Some(&(i, freed)) = self.freed.front()
            && now.saturating_duration_since(freed) >= QUARANTINE
        {
            self.freed.pop_front();
            return Some(i);
        }
        if self.next < capacity {
            self.next += 1;
            return Some(self.next - 1);
        }
        None
    }

    /// Gives `i` back: at once when it was never programmed, else held until
    /// [`Pool::confirm`] starts its quarantine.
    fn give_back(&mut self, i: u32, programmed: bool) {
        if programmed {
            self.held.push(i);
        } else {
            self.unused.push(i);
        }
    }

    /// The maps no longer name the held indices: their quarantine starts `now`.
    fn confirm(&mut self, now: Instant) {
        self.freed.extend(self.held.drain(..).map(|i| (i, now)));
    }
}

/// Indices handed out to frontends and backends. The frontend and backend indices are hash
/// maps (a lookup without a walk, one allocation each); what is given back goes back to
/// its pool in key order, so indices are handed out as deterministically as before.
#[derive(Clone, Debug)]
pub struct Ids {
    svc: HashMap<SvcKey, u32>,
    backend: BackendIndex,
    svc_pool: Pool,
    backend_pool: Pool,
    /// The last generation handed out.
    generation: u32,
    /// Handed out since the last [`Ids::retain`].
    fresh: Fresh,
    /// Address filter bits of the last computation's addresses (a bit per filter bit:
    /// the filters' own size, a fraction of a tree of their numbers)…
    filter_live: Bits,
    /// …and those set for addresses that went, with when they went.
    filter_retired: BTreeMap<u32, Instant>,
    now: Instant,
    /// Maglev tables computed before (swept at each full computation).
    maglev: TableCache,
    /// Each frontend's range of the slot array.
    slots: Slots,
}

impl Default for Ids {
    fn default() -> Self {
        Self {
            svc: HashMap::new(),
            backend: BackendIndex::default(),
            svc_pool: Pool::default(),
            backend_pool: Pool::default(),
            generation: 0,
            fresh: Fresh::default(),
            filter_live: Bits::default(),
            filter_retired: BTreeMap::new(),
            now: Instant::now(),
            maglev: TableCache::default(),
            slots: Slots::default(),
        }
    }
}

/// A backend as [`Ids`] knows it: without its generation.
fn identity(be: &Backend) -> Backend {
    Backend {
        generation: 0,
        ..*be
    }
}

/// The backend indices handed out: a hash table of indices (4 bytes each) hashed by their
/// backend, the backends themselves looked up where they are. There is one copy of each
/// backend: the desired state's ([`Desired::backends`], lent to every call by the
/// computation that keeps it) holds those it programs; [`BackendIndex::own`] those it does
/// not hold now (handed out in this computation and not yet in it, taken out of it and not
/// yet given back, or every one when no desired state is kept: [`super::recompute`], the
/// pins adopted); [`BackendIndex::held`] the backends of the state a full computation
/// replaces, while it runs.
#[derive(Clone, Debug, Default)]
struct BackendIndex {
    /// The indices handed out, hashed by their backend (without its generation).
    table: HashTable<u32>,
    /// Index → backend, for indices handed out that the lent desired state does not hold.
    own: Dense<Backend>,
    /// The replaced state's backends during a full computation ([`Ids::hold`]).
    held: Dense<Backend>,
    hasher: foldhash::fast::RandomState,
}

/// Where the backend of an index is: its own copy, the held state's, the lent state's.
#[derive(Clone, Copy)]
struct Stores<'a> {
    own: &'a Dense<Backend>,
    held: &'a Dense<Backend>,
    lent: &'a Dense<Backend>,
}

impl<'a> Stores<'a> {
    fn at(self, id: u32) -> Option<&'a Backend> {
        self.own
            .get(&id)
            .or_else(|| self.held.get(&id))
            .or_else(|| self.lent.get(&id))
    }

    /// Whether index `id` holds `be` (an identity: without its generation).
    fn holds(self, id: u32, be: &Backend) -> bool {
        self.at(id).is_some_and(|b| identity(b) == *be)
    }
}

impl BackendIndex {
    fn hash(hasher: &foldhash::fast::RandomState, be: &Backend) -> u64 {
        std::hash::BuildHasher::hash_one(hasher, identity(be))
    }

    /// The table, where its indices' backends are, and a hash of an index's backend (to
    /// rehash the table).
    fn parts<'a>(
        &'a mut self,
        lent: &'a Dense<Backend>,
    ) -> (
        &'a mut HashTable<u32>,
        Stores<'a>,
        impl Fn(&u32) -> u64 + Copy + 'a,
    ) {
        let stores = Stores {
            own: &self.own,
            held: &self.held,
            lent,
        };
        let hasher = &self.hasher;
        let rehash = move |id: &u32| stores.at(*id).map_or(0, |b| Self::hash(hasher, b));
        (&mut self.table, stores, rehash)
    }

    /// The index and generation of `be` (its generation ignored).
    fn get(&self, be: &Backend, lent: &Dense<Backend>) -> Option<(u32, u32)> {
        let be = identity(be);
        let stores = Stores {
            own: &self.own,
            held: &self.held,
            lent,
        };
        let hash = Self::hash(&self.hasher, &be);
        let id = *self.table.find(hash, |id| stores.holds(*id, &be))?;
        stores.at(id).map(|b| (id, b.generation))
    }

    /// Hands `id` with `generation` (not 0) to `be`, which holds no index (its copy kept
    /// here until the desired state holds it).
    fn insert(&mut self, be: &Backend, id: u32, generation: u32, lent: &Dense<Backend>) {
        let be = Backend {
            generation,
            ..identity(be)
        };
        self.own.insert(id, be);
        let hash = Self::hash(&self.hasher, &be);
        let (table, _, rehash) = self.parts(lent);
        table.insert_unique(hash, id, rehash);
    }

    /// Takes `be`'s index back; returns it.
    fn remove(&mut self, be: &Backend, lent: &Dense<Backend>) -> Option<u32> {
        let be = identity(be);
        let hash = Self::hash(&self.hasher, &be);
        let (table, stores, _) = self.parts(lent);
        let entry = table.find_entry(hash, |id| stores.holds(*id, &be)).ok()?;
        let (id, _) = entry.remove();
        self.own.remove(&id);
        Some(id)
    }

    /// Gives back the room the table and its own copies grew past what they hold.
    fn shrink_to_fit(&mut self, lent: &Dense<Backend>) {
        self.own.shrink_to_fit();
        let (table, _, rehash) = self.parts(lent);
        table.shrink_to_fit(rehash);
    }

    /// Keeps the indices whose backend `desired` holds at that index (the same backend,
    /// whatever its generation); returns the others, in backend order. Which are kept is
    /// found in index order (the arrays read in order, not at random as the table holds
    /// them), then the table is swept.
    fn retain_held_by(&mut self, desired: &Dense<Backend>) -> Vec<(Backend, u32)> {
        let stores = Stores {
            own: &self.own,
            held: &self.held,
            lent: desired,
        };
        let live: Bits = desired
            .iter()
            .filter(|(id, d)| stores.at(**id).is_some_and(|b| identity(b) == identity(d)))
            .map(|(id, _)| *id)
            .collect();
        let mut gone = Vec::new();
        let (table, stores, _) = self.parts(desired);
        table.retain(|id| {
            if live.contains(*id) {
                return true;
            }
            if let Some(be) = stores.at(*id) {
                gone.push((identity(be), *id));
            }
            false
        });
        for (_, id) in &gone {
            self.own.remove(id);
        }
        gone.sort_unstable();
        gone
    }

    /// The lent state holds its backends from now: the copies of those it holds go.
    fn lend(&mut self, lent: &Dense<Backend>) {
        self.own.retain(|id, b| lent.get(id) != Some(b));
    }
}

/// Indices handed out since the last [`Ids::retain`] (a bit per index: they are dense).
#[derive(Clone, Debug, Default)]
struct Fresh {
    svc: Bits,
    backend: Bits,
}

/// A set of small numbers as a bit per number (up to the highest held).
#[derive(Clone, Debug, Default)]
pub(super) struct Bits(Vec<u64>);

impl Bits {
    pub(super) fn contains(&self, n: u32) -> bool {
        self.0
            .get(n as usize / 64)
            .is_some_and(|w| w & (1 << (n % 64)) != 0)
    }

    /// Adds `n`; whether it was not there.
    pub(super) fn insert(&mut self, n: u32) -> bool {
        let w = n as usize / 64;
        if self.0.len() <= w {
            self.0.resize(w + 1, 0);
        }
        let was = self.0[w] & (1 << (n % 64)) != 0;
        self.0[w] |= 1 << (n % 64);
        !was
    }

    /// Takes `n` out; whether it was there.
    pub(super) fn remove(&mut self, n: u32) -> bool {
        let was = self.contains(n);
        if let Some(w) = self.0.get_mut(n as usize / 64) {
            *w &= !(1 << (n % 64));
        }
        was
    }

    /// The numbers held that `other` does not hold, in order (a word at a time).
    pub(super) fn minus<'a>(&'a self, other: &'a Bits) -> impl Iterator<Item = u32> + 'a {
        self.0.iter().enumerate().flat_map(move |(i, w)| {
            let mut left = w & !other.0.get(i).copied().unwrap_or(0);
            std::iter::from_fn(move || {
                let b = left.trailing_zeros();
                left &= left.wrapping_sub(1);
                (b < 64).then_some((i * 64) as u32 + b)
            })
        })
    }
}

impl FromIterator<u32> for Bits {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        let mut b = Bits::default();
        for n in iter {
            b.insert(n);
        }
        b
    }
}

impl Ids {
    /// Takes over the indices of what is already programmed (a restarted agent adopts its
    /// pins). Indices below the highest one in use but free are in quarantine from now: a
    /// flow of the previous agent may still name them.
    pub fn adopt(current: &Desired) -> Self {
        let now = Instant::now();
        let mut ids = Ids {
            now,
            ..Ids::default()
        };
        let mut svc_used = BTreeSet::new();
        for (k, v) in &current.services {
            ids.svc.insert(*k, v.svc_id);
            svc_used.insert(v.svc_id);
        }
        ids.slots = Slots::adopt(
            current
                .services
                .iter()
                .map(|(k, v)| (*k, v.slot_base, v.count)),
            now,
        );
        let mut be_used = BTreeSet::new();
        let none = Dense::default();
        for (id, be) in &current.backends {
            ids.backend.insert(be, *id, be.generation, &none);
            ids.generation = ids.generation.max(be.generation);
            be_used.insert(*id);
        }
        ids.svc_pool = Pool::adopt(&svc_used, now);
        ids.backend_pool = Pool::adopt(&be_used, now);
        // Every bit set now counts as live until the first computation says otherwise (then
        // it is kept for FILTER_RETAIN from now: a flow of the previous agent may need it).
        ids.filter_live = current.filter.iter().copied().collect();
        ids
    }

    /// The address filter bits to program for `live` (this computation's addresses): those,
    /// and those of addresses gone less than [`FILTER_RETAIN`] ago.
    pub(super) fn filter_bits(&mut self, live: BTreeSet<u32>) -> BTreeSet<u32> {
        self.filter_bits_of(live.iter().copied().collect())
    }

    /// [`Ids::filter_bits`] of the bits `bits` holds.
    pub(super) fn filter_bits_of(&mut self, bits: Bits) -> BTreeSet<u32> {
        let now = self.now;
        for gone in self.filter_live.minus(&bits) {
            self.filter_retired.entry(gone).or_insert(now);
        }
        self.filter_retired.retain(|b, since| {
            !bits.contains(*b) && now.saturating_duration_since(*since) < FILTER_RETAIN
        });
        // In order (the set's sort finds them sorted).
        let mut out: BTreeSet<u32> = bits.minus(&Bits::default()).collect();
        out.extend(self.filter_retired.keys());
        self.filter_live = bits;
        out
    }

    /// Room for `frontends` frontends and `backends` backends in all (a full computation's,
    /// counted from its candidates: the tables grow once, not by doubling and rehashing as
    /// they fill).
    pub(super) fn reserve(&mut self, frontends: usize, backends: usize, lent: &Desired) {
        let more = |held: usize, want: usize| want.saturating_sub(held);
        self.svc.reserve(more(self.svc.len(), frontends));
        self.slots.reserve(frontends);
        let new = more(self.backend.table.len(), backends);
        // The new ones' copies are kept here until the state holds them.
        self.backend.own.reserve(new);
        let (table, _, rehash) = self.backend.parts(&lent.backends);
        table.reserve(new, rehash);
    }

    /// Whether address filter bit `bit` is one of the last computation's addresses'.
    pub(super) fn filter_live(&self, bit: u32) -> bool {
        self.filter_live.contains(bit)
    }

    /// [`Ids::retain`] for some frontends and backends only (those an incremental
    /// computation touched): each of `keys` not in `desired`, and each of `backends` whose
    /// index `desired` no longer holds, gives its index back.
    pub(super) fn retain_touched<'a>(
        &mut self,
        desired: &Desired,
        keys: impl IntoIterator<Item = &'a SvcKey>,
        backends: impl IntoIterator<Item = Backend>,
    ) {
        let fresh = std::mem::take(&mut self.fresh);
        let keys: Vec<&SvcKey> = keys.into_iter().collect();
        self.slots
            .retain_touched(keys.iter().copied(), |k| desired.services.contains_key(k));
        for k in keys {
            if !desired.services.contains_key(k)
                && let Some(id) = self.svc.remove(k)
            {
                self.svc_pool.give_back(id, !fresh.svc.contains(id));
            }
        }
        for be in backends {
            if let Some((id, generation)) = self.backend.get(&be, &desired.backends)
                && desired
                    .backends
                    .get(&id)
                    .is_none_or(|d| d.generation != generation)
            {
                self.backend.remove(&be, &desired.backends);
                self.backend_pool.give_back(id, !fresh.backend.contains(id));
            }
        }
    }

    /// An address filter bit is used again (`true`) or no longer (`false`: it stays set
    /// until a full computation after [`FILTER_RETAIN`]).
    pub(super) fn filter_bit(&mut self, bit: u32, live: bool) {
        if live {
            self.filter_retired.remove(&bit);
            self.filter_live.insert(bit);
        } else if self.filter_live.remove(bit) {
            self.filter_retired.insert(bit, self.now);
        }
    }

    /// Gives back the room the backend index grew past what it holds (the agent does it
    /// after a full sync, as [`crate::reconcile::Incremental::compact`]); `desired` is the
    /// state it was last lent ([`Ids::lend`]), if any.
    pub fn compact(&mut self, desired: &Desired) {
        self.backend.shrink_to_fit(&desired.backends);
        self.svc.shrink_to_fit();
    }

    /// `desired` keeps its backends from now on, and is passed to every later computation
    /// as the state it computes (an incremental one's) or, for a full one, held
    /// ([`Ids::hold`]): the copies of the backends it holds go (one copy of each backend).
    pub(super) fn lend(&mut self, desired: &Desired) {
        self.backend.lend(&desired.backends);
    }

    /// A full computation replaces the state lent with `backends` (its backends, taken out
    /// of it): they are found here while it runs, and handed back by [`Ids::unhold`].
    pub(super) fn hold(&mut self, backends: Dense<Backend>) {
        self.backend.held = backends;
    }

    /// The backends [`Ids::hold`] took (after the computation's [`Ids::retain`]).
    pub(super) fn unhold(&mut self) -> Dense<Backend> {
        std::mem::take(&mut self.backend.held)
    }

    /// The backend at index `id` of the lent state `desired` is about to leave it (an
    /// incremental computation took its last slot out): its copy is kept here until its
    /// index is given back or the state holds it again.
    pub(super) fn keep_backend(&mut self, id: u32, desired: &Dense<Backend>) {
        if let Some(be) = desired.get(&id)
            && self.backend.get(be, desired) == Some((id, be.generation))
        {
            self.backend.own.insert(id, *be);
        }
    }

    /// `desired`, lent before ([`crate::reconcile::Incremental`] lends its state), is
    /// no longer passed to every computation (it is taken away, or the indices serve
    /// [`crate::reconcile::recompute`]): the backends of it the index names are copied
    /// back here.
    pub fn unlend(&mut self, desired: &Dense<Backend>) {
        for (id, be) in desired {
            if self.backend.get(be, desired) == Some((*id, be.generation)) {
                self.backend.own.insert(*id, *be);
            }
        }
    }

    /// The time a sync runs at (quarantines end by it); the agent calls it before every
    /// sync. Until it is called again, the time the `Ids` were made.
    pub fn tick(&mut self, now: Instant) {
        self.now = now;
    }

    /// The maps hold the desired state (a sync without a failed write, no retry waiting):
    /// what was given back since the last call is named by no entry from `now`, so its
    /// quarantine starts.
    pub fn confirm(&mut self, now: Instant) {
        self.svc_pool.confirm(now);
        self.backend_pool.confirm(now);
        self.slots.confirm(now);
    }

    /// Indices and slot ranges given back and held until [`Ids::confirm`].
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.svc_pool.held.len() + self.backend_pool.held.len() + self.slots.held()
    }

    /// Gives back the indices of what is no longer desired: those programmed before after
    /// [`Ids::confirm`] and the quarantine, those handed out in this computation (never
    /// programmed) at once.
    pub(super) fn retain(&mut self, desired: &Desired) {
        self.maglev.sweep();
        let fresh = std::mem::take(&mut self.fresh);
        self.slots.retain(|k| desired.services.contains_key(k));
        let mut gone = Vec::new();
        self.svc.retain(|k, id| {
            let keep = desired.services.contains_key(k);
            if !keep {
                gone.push((*k, *id));
            }
            keep
        });
        gone.sort_unstable();
        for (_, id) in gone {
            let programmed = !fresh.svc.contains(id);
            self.svc_pool.give_back(id, programmed);
        }
        // Live: its index holds it in the desired state.
        let gone = self.backend.retain_held_by(&desired.backends);
        for (_, id) in gone {
            let programmed = !fresh.backend.contains(id);
            self.backend_pool.give_back(id, programmed);
        }
    }
}

impl Indices for Ids {
    fn svc_id(&mut self, key: SvcKey, capacity: u32) -> Option<u32> {
        if let Some(id) = self.svc.get(&key) {
            return Some(*id);
        }
        let id = self.svc_pool.take(self.now, capacity)?;
        self.fresh.svc.insert(id);
        self.svc.insert(key, id);
        Some(id)
    }

    fn backend_id(
        &mut self,
        be: Backend,
        capacity: u32,
        desired: &Dense<Backend>,
    ) -> Option<(u32, u32)> {
        if let Some(v) = self.backend.get(&be, desired) {
            return Some(v);
        }
        let id = self.backend_pool.take(self.now, capacity)?;
        self.generation = self.generation.wrapping_add(1).max(1);
        self.fresh.backend.insert(id);
        self.backend.insert(&be, id, self.generation, desired);
        Some((id, self.generation))
    }

    fn has_svc(&self, key: &SvcKey) -> bool {
        self.svc.contains_key(key)
    }

    fn slot_range(&mut self, key: SvcKey, count: u16, capacity: u32) -> Option<(u32, u16)> {
        self.slots.range(key, count, capacity, self.now)
    }

    fn maglev_table(&mut self, backends: &[String], m: u32, seed: &[u8]) -> Arc<[u16]> {
        self.maglev.get(backends, m, seed)
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use lb_common::user::{backend_value, frontend_key};

    use super::*;
    use crate::model::Protocol;

    /// A capacity no test reaches.
    const CAP: u32 = 1000;

    fn web() -> SvcKey {
        frontend_key(Ipv4Addr::new(10, 96, 0, 1), 80, Protocol::Tcp)
    }
    fn dns() -> SvcKey {
        frontend_key(Ipv4Addr::new(10, 96, 0, 2), 53, Protocol::Udp)
    }

    /// A desired state holding `svc` with index `id` (and nothing else).
    fn holding(svc: SvcKey, id: u32) -> Desired {
        let mut d = Desired::default();
        d.services.insert(
            svc,
            crate::desired::SvcEntry::new(
                lb_common::SvcValue {
                    svc_id: id,
                    ..Default::default()
                },
                [],
            ),
        );
        d
    }

    #[test]
    fn indices_are_stable_adopted_and_not_reused_before_the_quarantine() {
        let mut ids = Ids::default();
        let t0 = Instant::now();
        ids.tick(t0);
        let a = ids.svc_id(web(), CAP).expect("index");
        let b = ids.svc_id(dns(), CAP).expect("index");
        assert_ne!(a, b);
        assert_eq!((a, b), (1, 2), "dense from 1");
        assert_eq!(ids.svc_id(web(), CAP), Some(a), "stable");
        ids.retain(&holding(web(), a));
        // Adopted from what is programmed: the same indices come back.
        let mut d = holding(web(), a);
        let be = Backend {
            generation: 9,
            ..backend_value(Ipv4Addr::new(10, 244, 0, 1), 8080, Protocol::Tcp)
        };
        d.backends.insert(7, be);
        let mut adopted = Ids::adopt(&d);
        adopted.tick(t0);
        assert_eq!(adopted.svc_id(web(), CAP), Some(a));
        assert_eq!(adopted.backend_id(be, CAP, &Dense::default()), Some((7, 9)));
        adopted.retain(&d);
        // A programmed index that was freed waits out its quarantine…
        adopted.retain(&Desired::default());
        assert!(!adopted.has_svc(&web()));
        let other = adopted.svc_id(dns(), CAP).expect("index");
        assert_ne!(other, a, "reused within the quarantine");
        adopted.retain(&holding(dns(), other));
        // …from when the maps are known to no longer name it (a sync without a failed
        // write): held until then, however long that takes…
        adopted.tick(t0 + QUARANTINE * 2);
        let fourth = frontend_key(Ipv4Addr::new(10, 96, 0, 4), 80, Protocol::Tcp);
        let id4 = adopted.svc_id(fourth, CAP).expect("index");
        assert_ne!(id4, a, "reused while held");
        let mut both = holding(dns(), other);
        both.services.extend(holding(fourth, id4).services);
        adopted.retain(&both);
        adopted.confirm(t0);
        // …and is handed out again after it.
        adopted.tick(t0 + QUARANTINE);
        let third = frontend_key(Ipv4Addr::new(10, 96, 0, 3), 80, Protocol::Tcp);
        assert_eq!(
            adopted.svc_id(third, CAP),
            Some(a),
            "reused after the quarantine"
        );
    }

    #[test]
    fn bits_hold_a_set_of_numbers_in_order() {
        let mut b: Bits = [130, 3, 64].into_iter().collect();
        assert!(b.contains(3) && b.contains(64) && b.contains(130) && !b.contains(4));
        assert!(!b.insert(3), "held already");
        assert!(b.insert(0));
        assert!(b.remove(64) && !b.remove(64) && !b.remove(10_000));
        let none = Bits::default();
        assert_eq!(b.minus(&none).collect::<Vec<_>>(), [0, 3, 130]);
        let other: Bits = [3, 200].into_iter().collect();
        assert_eq!(b.minus(&other).collect::<Vec<_>>(), [0, 130]);
    }

    #[test]
    fn filter_bits_of_gone_addresses_stay_for_a_day() {
        let mut ids = Ids::default();
        let t0 = Instant::now();
        ids.tick(t0);
        assert_eq!(ids.filter_bits([1, 2].into()), [1, 2].into());
        // 2 went: still set…
        ids.tick(t0 + Duration::from_secs(60));
        assert_eq!(ids.filter_bits([1].into()), [1, 2].into());
        // …until a day after it went; 1 is live throughout.
        ids.tick(t0 + Duration::from_secs(60) + FILTER_RETAIN);
        assert_eq!(ids.filter_bits([1].into()), [1].into());
        // Adopted bits that no address explains are kept a day too.
        let d = Desired {
            filter: [7].into(),
            ..Desired::default()
        };
        let mut adopted = Ids::adopt(&d);
        assert_eq!(adopted.filter_bits([1].into()), [1, 7].into());
    }

    #[test]
    fn a_reused_backend_index_gets_a_new_generation() {
        let mut ids = Ids::default();
        let t0 = Instant::now();
        ids.tick(t0);
        let one = backend_value(Ipv4Addr::new(10, 244, 0, 1), 8080, Protocol::Tcp);
        let two = backend_value(Ipv4Addr::new(10, 244, 0, 2), 8080, Protocol::Tcp);
        let (i1, g1) = ids.backend_id(one, CAP, &Dense::default()).expect("index");
        let mut d = Desired::default();
        d.backends.insert(
            i1,
            Backend {
                generation: g1,
                ..one
            },
        );
        ids.retain(&d);
        ids.retain(&Desired::default());
        ids.confirm(t0);
        ids.tick(t0 + QUARANTINE);
        let (i2, g2) = ids.backend_id(two, CAP, &Dense::default()).expect("index");
        assert_eq!(i2, i1, "the index comes back after the quarantine");
        assert_ne!(g2, g1, "with another generation");
        assert!(g1 != 0 && g2 != 0);
    }

    #[test]
    fn an_index_never_programmed_is_free_at_once_and_capacity_is_kept() {
        let mut ids = Ids::default();
        let cap = 3;
        assert_eq!(ids.svc_id(web(), cap), Some(1));
        assert_eq!(ids.svc_id(dns(), cap), Some(2));
        let third = frontend_key(Ipv4Addr::new(10, 96, 0, 3), 80, Protocol::Tcp);
        assert_eq!(ids.svc_id(third, cap), None, "indices 1..3 only");
        // Neither was programmed (not in the desired state): both are free again at once.
        ids.retain(&Desired::default());
        assert_eq!(ids.svc_id(third, cap).map(|i| i < 3), Some(true));
    }
}
