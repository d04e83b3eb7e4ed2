//! What one incremental update changed in the desired state, as it was before: the value
//! of each key the update wrote or removed, recorded the first time it is touched. After a
//! sync without errors the maps hold exactly the desired state, so these values are what
//! is programmed: the agent keeps no second copy of the maps, only this journal of one
//! update (a few entries for one endpoint change), from which [`Journal::programmed`] gives
//! the programmed state of everything the update touched for the make-before-break apply.

use std::collections::{BTreeMap, BTreeSet};

use lb_common::{Backend, SvcKey};

use crate::desired::{Desired, MaglevTable, ObjectName, Plan, SrcRange, SvcEntry, Touched};

/// The before-values of one update's changes.
#[derive(Debug, Default)]
pub struct Journal {
    services: BTreeMap<SvcKey, Option<SvcEntry>>,
    backends: BTreeMap<u32, Option<Backend>>,
    names: BTreeMap<u32, Option<ObjectName>>,
    src_ranges: BTreeMap<SrcRange, bool>,
    /// Filter word → its bits before.
    filter: BTreeMap<u32, u64>,
    maglev: BTreeMap<u32, Option<MaglevTable>>,
}

impl Journal {
    /// Records what applying `plan` to `d` overwrites.
    pub(super) fn plan(&mut self, d: &Desired, plan: &Plan) {
        self.service(d, plan.key());
        for id in plan.backend_ids() {
            self.backend(d, id);
        }
        self.name(d, plan.name_id());
        for r in plan.src_ranges() {
            self.src_range(d, *r);
        }
        if let Some(id) = plan.maglev_id() {
            self.maglev(d, id);
        }
    }

    pub(super) fn maglev(&mut self, d: &Desired, id: u32) {
        self.maglev
            .entry(id)
            .or_insert_with(|| d.maglev.get(&id).cloned());
    }

    pub(super) fn service(&mut self, d: &Desired, k: SvcKey) {
        self.services
            .entry(k)
            .or_insert_with(|| d.services.get(&k).cloned());
    }

    pub(super) fn backend(&mut self, d: &Desired, id: u32) {
        self.backends
            .entry(id)
            .or_insert_with(|| d.backends.get(&id).copied());
    }

    pub(super) fn name(&mut self, d: &Desired, id: u32) {
        self.names
            .entry(id)
            .or_insert_with(|| d.names.get(&id).cloned());
    }

    pub(super) fn src_range(&mut self, d: &Desired, r: SrcRange) {
        self.src_ranges
            .entry(r)
            .or_insert_with(|| d.src_ranges.contains(&r));
    }

    pub(super) fn filter_bit(&mut self, d: &Desired, bit: u32) {
        let word = bit / 64;
        self.filter
            .entry(word)
            .or_insert_with(|| word_of(&d.filter, word));
    }

    /// The programmed state of what `t` names (its frontends, slots and names,
    /// its backends, ranges and filter words): the journal's value where the update
    /// changed a key, else the desired state's (which it did not change). `d` is the
    /// desired state after the update.
    pub fn programmed(&self, d: &Desired, t: &Touched) -> Desired {
        let mut p = Desired::default();
        let svc = |k: SvcKey| match self.services.get(&k) {
            Some(v) => v.as_ref(),
            None => d.services.get(&k),
        };
        let name = |id: u32| match self.names.get(&id) {
            Some(n) => n.clone(),
            None => d.names.get(&id).cloned(),
        };
        for &k in &t.frontends {
            let before = svc(k);
            let after = d.services.get(&k);
            if let Some(v) = before {
                p.services.insert(k, v.clone());
            }
            for id in [before.map(|v| v.svc_id), after.map(|v| v.svc_id)]
                .into_iter()
                .flatten()
            {
                if let Some(n) = name(id) {
                    p.names.insert(id, n);
                }
            }
        }
        for &id in &t.backends {
            let b = match self.backends.get(&id) {
                Some(b) => *b,
                None => d.backends.get(&id).copied(),
            };
            if let Some(b) = b {
                p.backends.insert(id, b);
            }
        }
        for r in &t.src_ranges {
            let had = match self.src_ranges.get(r) {
                Some(had) => *had,
                None => d.src_ranges.contains(r),
            };
            if had {
                p.src_ranges.insert(*r);
            }
        }
        for &id in &t.maglev {
            let table = match self.maglev.get(&id) {
                Some(t) => t.clone(),
                None => d.maglev.get(&id).cloned(),
            };
            if let Some(table) = table {
                p.maglev.insert(id, table);
            }
        }
        for &w in &t.filter_words {
            let bits = match self.filter.get(&w) {
                Some(b) => *b,
                None => word_of(&d.filter, w),
            };
            p.filter.extend(
                (0..64)
                    .filter(|i| bits & (1u64 << i) != 0)
                    .map(|i| w * 64 + i),
            );
        }
        p
    }

    /// The whole programmed state after a sync of `t` whose writes partly failed: the
    /// desired state, with what `now` (the programmed state of `t`, as the apply left it)
    /// says for every key `t` names.
    pub fn patched(d: &Desired, t: &Touched, now: &Desired) -> Desired {
        let mut p = d.clone();
        let named = Journal::default().programmed(d, t);
        for k in named.services.keys() {
            p.services.remove(k);
        }
        for k in named.backends.keys() {
            p.backends.remove(k);
        }
        for k in named.names.keys() {
            p.names.remove(k);
        }
        for r in &t.src_ranges {
            p.src_ranges.remove(r);
        }
        for id in &t.maglev {
            p.maglev.remove(id);
        }
        p.maglev.extend(
            now.maglev
                .iter()
                .filter(|(id, _)| t.maglev.contains(id))
                .map(|(id, m)| (*id, m.clone())),
        );
        let words: BTreeSet<u32> = t.filter_words.iter().copied().collect();
        p.filter.retain(|b| !words.contains(&(b / 64)));
        p.services
            .extend(now.services.iter().map(|(k, v)| (*k, v.clone())));
        p.backends.extend(now.backends.iter());
        p.names
            .extend(now.names.iter().map(|(id, n)| (*id, n.clone())));
        p.src_ranges.extend(now.src_ranges.iter());
        p.filter
            .extend(now.filter.iter().filter(|b| words.contains(&(*b / 64))));
        p
    }
}

/// Word `word` of a set of filter bits.
fn word_of(bits: &BTreeSet<u32>, word: u32) -> u64 {
    bits.range(word * 64..(word + 1) * 64)
        .fold(0, |acc, b| acc | 1u64 << (b % 64))
}
