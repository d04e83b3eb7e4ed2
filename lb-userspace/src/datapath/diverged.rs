//! Where the maps differ from the desired state after a sync whose writes partly failed:
//! the programmed values of those keys only (a full map refused a frontend: its entries as
//! far as they were written), split by the service port (service index) they belong to.
//! The agent keeps them per service and retries each on its own ([`crate::agent`]); every
//! other key is what the desired state says, so other services keep syncing incrementally.

use std::collections::{BTreeMap, BTreeSet};

use lb_common::{Backend, SvcKey};

use super::sync::set_word;
use crate::desired::{Desired, MaglevTable, ObjectName, SrcRange, SvcEntry, Touched};

/// The programmed state of keys that differ from the desired state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diverged {
    /// Frontend → its programmed entry and slots (`None`: no entry).
    pub frontends: BTreeMap<SvcKey, Option<SvcEntry>>,
    /// Service index → its programmed name (`None`: none), for the diverged frontends.
    pub names: BTreeMap<u32, Option<ObjectName>>,
    pub backends: BTreeMap<u32, Option<Backend>>,
    /// Source range → whether it is programmed.
    pub src_ranges: BTreeMap<SrcRange, bool>,
    /// Filter word → its programmed bits.
    pub filter: BTreeMap<u32, u64>,
    /// Service index → its programmed Maglev table (`None`: none).
    pub maglev: BTreeMap<u32, Option<MaglevTable>>,
}

fn word_of(bits: &BTreeSet<u32>, word: u32) -> u64 {
    bits.range(word * 64..(word + 1) * 64)
        .fold(0, |acc, b| acc | 1u64 << (b % 64))
}

impl Diverged {
    /// The keys `touched` names whose value in `now` (what is programmed of them) differs
    /// from `desired`, with `now`'s value. A frontend differs when its entry, its slots, or
    /// the name of its service index does.
    pub fn of(now: &Desired, desired: &Desired, touched: &Touched) -> Self {
        let mut d = Diverged::default();
        for f in &touched.frontends {
            let (have, want) = (now.services.get(f), desired.services.get(f));
            let ids: BTreeSet<u32> = [have, want]
                .into_iter()
                .flatten()
                .map(|v| v.svc_id)
                .collect();
            let differs = have != want
                || ids
                    .iter()
                    .any(|id| now.names.get(id) != desired.names.get(id));
            if !differs {
                continue;
            }
            d.frontends.insert(*f, have.cloned());
            for id in ids {
                d.names.insert(id, now.names.get(&id).cloned());
            }
        }
        for id in &touched.backends {
            if now.backends.get(id) != desired.backends.get(id) {
                d.backends.insert(*id, now.backends.get(id).copied());
            }
        }
        for r in &touched.src_ranges {
            let have = now.src_ranges.contains(r);
            if have != desired.src_ranges.contains(r) {
                d.src_ranges.insert(*r, have);
            }
        }
        for &w in &touched.filter_words {
            let have = word_of(&now.filter, w);
            if have != word_of(&desired.filter, w) {
                d.filter.insert(w, have);
            }
        }
        for id in &touched.maglev {
            let have = now.maglev.get(id);
            if have != desired.maglev.get(id) {
                d.maglev.insert(*id, have.cloned());
            }
        }
        d
    }

    pub fn is_empty(&self) -> bool {
        self.frontends.is_empty()
            && self.names.is_empty()
            && self.backends.is_empty()
            && self.src_ranges.is_empty()
            && self.filter.is_empty()
            && self.maglev.is_empty()
    }

    /// Its keys, as an apply compares them.
    pub fn touched(&self) -> Touched {
        Touched {
            frontends: self.frontends.keys().copied().collect(),
            backends: self.backends.keys().copied().collect(),
            src_ranges: self.src_ranges.keys().copied().collect(),
            filter_words: self.filter.keys().copied().collect(),
            maglev: self.maglev.keys().copied().collect(),
        }
    }

    /// Whether `t` names any of its keys.
    pub fn overlaps(&self, t: &Touched) -> bool {
        self.frontends.keys().any(|k| t.frontends.contains(k))
            || self.backends.keys().any(|k| t.backends.contains(k))
            || self.src_ranges.keys().any(|k| t.src_ranges.contains(k))
            || self.filter.keys().any(|k| t.filter_words.contains(k))
            || self.maglev.keys().any(|k| t.maglev.contains(k))
    }

    /// Puts what it says of its keys into `now` (what is programmed, as far as the desired
    /// state or a journal knows): every entry of its frontends replaced by theirs.
    pub fn overlay(&self, now: &mut Desired) {
        for (k, entry) in &self.frontends {
            match entry {
                Some(e) => now.services.insert(*k, e.clone()),
                None => now.services.remove(k),
            };
        }
        for (id, name) in &self.names {
            match name {
                Some(n) => now.names.insert(*id, n.clone()),
                None => now.names.remove(id),
            };
        }
        for (id, be) in &self.backends {
            match be {
                Some(b) => now.backends.insert(*id, *b),
                None => now.backends.remove(id),
            };
        }
        for (r, have) in &self.src_ranges {
            match have {
                true => now.src_ranges.insert(*r),
                false => now.src_ranges.remove(r),
            };
        }
        for (w, bits) in &self.filter {
            set_word(&mut now.filter, *w, *bits);
        }
        for (id, t) in &self.maglev {
            match t {
                Some(t) => now.maglev.insert(*id, t.clone()),
                None => now.maglev.remove(id),
            };
        }
    }

    /// Takes in `other` (its values win).
    pub fn merge(&mut self, other: Diverged) {
        self.frontends.extend(other.frontends);
        self.names.extend(other.names);
        self.backends.extend(other.backends);
        self.src_ranges.extend(other.src_ranges);
        self.filter.extend(other.filter);
        self.maglev.extend(other.maglev);
    }

    /// Split by service index: a frontend and its name go with its index (the desired
    /// entry's, else the programmed one's), a source range with its own, a backend with
    /// every diverged frontend whose desired slots name it; what belongs to none (a backend
    /// or filter word alone) goes under index 0.
    pub fn by_service(self, desired: &Desired) -> BTreeMap<u32, Diverged> {
        let mut out: BTreeMap<u32, Diverged> = BTreeMap::new();
        let mut users: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
        for (f, entry) in self.frontends {
            let want = desired.services.get(&f);
            let id = want.or(entry.as_ref()).map(|v| v.svc_id).unwrap_or(0);
            for b in want.into_iter().flat_map(|v| v.slots.iter()) {
                users.entry(*b).or_default().insert(id);
            }
            out.entry(id).or_default().frontends.insert(f, entry);
        }
        for (id, name) in self.names {
            out.entry(id).or_default().names.insert(id, name);
        }
        for (r, have) in self.src_ranges {
            out.entry(r.svc_id).or_default().src_ranges.insert(r, have);
        }
        for (id, t) in self.maglev {
            out.entry(id).or_default().maglev.insert(id, t);
        }
        for (b, be) in self.backends {
            let ids = users.remove(&b).unwrap_or_else(|| BTreeSet::from([0]));
            for id in ids {
                out.entry(id).or_default().backends.insert(b, be);
            }
        }
        if !self.filter.is_empty() {
            out.entry(0).or_default().filter = self.filter;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        datapath::{
            sync::{apply, apply_touched},
            writer::{MapWriter, MemoryMaps},
        },
        desired::{Limits, NodeContext},
        reconcile::{Ids, Journal, recompute},
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

    fn desired(yaml: &str, ids: &mut Ids) -> Desired {
        let model = file::parse("t.yaml", yaml).expect("yaml").model;
        recompute(&model, &NodeContext::default(), ids, Limits::default()).0
    }

    #[test]
    fn a_frontend_a_full_map_refused_is_what_differs_and_its_overlay_is_what_is_programmed() {
        let mut ids = Ids::default();
        let web = svc("web", "10.96.0.1", &["10.244.0.1", "10.244.0.2"]);
        let before = desired(&web, &mut ids);
        let mut maps = MemoryMaps::default();
        let (mut now, r) = apply(&mut maps, &Desired::default(), &before);
        assert!(r.errors.is_empty());
        // No room for the new Service's entry.
        maps.svc_capacity = Some(before.services.len());
        let both = web + &svc("api", "10.96.0.2", &["10.244.0.3", "10.244.0.4"]);
        let after = desired(&both, &mut ids);
        let touched = crate::datapath::sync::everything(&now, &after);
        let r = apply_touched(&mut maps, &mut now, &after, &touched);
        assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
        assert!(r.errors[0].cause.contains("map is full"), "{:?}", r.errors);
        let d = Diverged::of(&now, &after, &touched);
        assert_eq!(d.frontends.len(), 1, "only api's frontend differs: {d:?}");
        let (api, entry) = d.frontends.iter().next().expect("api");
        assert_eq!(entry, &None, "its slots were written, not its entry");
        let base = after.services[api].slot_base;
        assert!(
            maps.log.contains(&format!("put slots {base}+2")),
            "{:?}",
            maps.log
        );
        // What the maps hold is the desired state with the overlay.
        let mut programmed = after.clone();
        d.overlay(&mut programmed);
        assert_eq!(programmed.services, maps.state.services);
        assert_eq!(programmed.backends, maps.state.backends);
        assert_eq!(programmed.names, maps.state.names);
        // It belongs to api's service index alone.
        let by = d.clone().by_service(&after);
        let api_id = after.services[api].svc_id;
        assert_eq!(by.keys().copied().collect::<Vec<_>>(), vec![api_id]);
        // A retry of its keys alone, with room now, programs it.
        maps.svc_capacity = None;
        let t = d.touched();
        let mut base = Journal::default().programmed(&after, &t);
        d.overlay(&mut base);
        let r = apply_touched(&mut maps, &mut base, &after, &t);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(maps.read().expect("read").services, after.services);
        assert!(Diverged::of(&base, &after, &t).is_empty());
    }
}
