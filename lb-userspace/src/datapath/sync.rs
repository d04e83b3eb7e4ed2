//! Applies desired state make-before-break: backends, then slots, then the service entry;
//! deletes in reverse. At no instant does a programmed slot name a missing backend.

use std::collections::{BTreeMap, BTreeSet};

use lb_common::{Backend, SvcKey, SvcName, SvcValue};

use super::writer::{MapWriter, WriteError};
use crate::desired::{Desired, SrcRange, Touched};

/// What one sync did.
#[derive(Debug, Default)]
pub struct SyncReport {
    pub writes: usize,
    pub deletes: usize,
    pub errors: Vec<WriteError>,
}

/// Moves the maps from `current` to `desired`; returns what is programmed afterwards (equal
/// to `desired` unless a write failed) and the report. A failed write leaves the affected
/// service as it was; every other service is still updated.
pub fn apply(w: &mut dyn MapWriter, current: &Desired, desired: &Desired) -> (Desired, SyncReport) {
    let mut now = current.clone();
    let touched = everything(current, desired);
    let r = apply_touched(w, &mut now, desired, &touched);
    (now, r)
}

/// Every key, index, range and filter word of either state: what a full diff compares.
pub fn everything(current: &Desired, desired: &Desired) -> Touched {
    let both = || [current, desired].into_iter();
    Touched {
        frontends: both()
            .flat_map(|d| d.services.keys().filter(|k| k.slot == 0).copied())
            .collect(),
        backends: both().flat_map(|d| d.backends.keys().copied()).collect(),
        src_ranges: both().flat_map(|d| d.src_ranges.iter().copied()).collect(),
        filter_words: both()
            .flat_map(|d| d.filter.iter().map(|b| b / 64))
            .collect(),
    }
}

/// [`apply`] of only what `touched` names, in place on `now` (what is programmed): the
/// frontends, backends, ranges and filter words an incremental computation changed; the
/// rest of `now` is taken to equal `desired` already. Same order and make-before-break.
pub fn apply_touched(
    w: &mut dyn MapWriter,
    now: &mut Desired,
    desired: &Desired,
    touched: &Touched,
) -> SyncReport {
    let mut r = SyncReport::default();

    // 0. Address filter bits that are new, before anything that needs them (a frontend
    // whose bit is clear is invisible to the datapath).
    for &word in &touched.filter_words {
        let (have, bits) = (word_of(&now.filter, word), word_of(&desired.filter, word));
        if have | bits != have {
            write_filter(w, now, &mut r, word, have | bits);
        }
    }

    // 1. Backends that are new or changed (batched: a cold sync writes them all at once).
    let backends: Vec<(u32, Backend)> = touched
        .backends
        .iter()
        .filter_map(|id| desired.backends.get(id).map(|be| (*id, *be)))
        .filter(|(id, be)| now.backends.get(id) != Some(be))
        .collect();
    let mut failed_backends = BTreeSet::new();
    let failed = w.put_backends(&backends);
    for (i, _) in &failed {
        failed_backends.insert(backends[*i].0);
    }
    r.writes += backends.len() - failed.len();
    r.errors.extend(failed.into_iter().map(|(_, e)| e));
    for (id, be) in &backends {
        if !failed_backends.contains(id) {
            now.backends.insert(*id, *be);
        }
    }

    // 1b. Source ranges before the entries that use them (a frontend flagged for ranges
    // denies everyone until they are in).
    let new_ranges: Vec<SrcRange> = touched
        .src_ranges
        .iter()
        .filter(|x| desired.src_ranges.contains(x) && !now.src_ranges.contains(x))
        .copied()
        .collect();
    for range in &new_ranges {
        match w.put_src_range(range) {
            Ok(()) => {
                now.src_ranges.insert(*range);
                r.writes += 1;
            }
            Err(e) => r.errors.push(e),
        }
    }

    // 2. The desired frontends: names, then slots, then entries (each a batch), then the
    // slots past an entry's new count trimmed. A frontend whose backend or slot failed
    // keeps its old entry.
    let frontends: Vec<(SvcKey, SvcValue)> = touched
        .frontends
        .iter()
        .filter_map(|k| desired.services.get(k).map(|v| (*k, *v)))
        .filter(|(k, v)| {
            !(1..=v.count).any(|slot| {
                desired
                    .services
                    .get(&SvcKey { slot, ..*k })
                    .is_some_and(|s| failed_backends.contains(&s.backend_id))
            })
        })
        .collect();
    let mut names: Vec<(u32, SvcName, bool)> = Vec::new();
    for (_, entry) in &frontends {
        if let Some(name) = desired.names.get(&entry.svc_id)
            && now.names.get(&entry.svc_id) != Some(name)
            && names.last().map(|n| n.0) != Some(entry.svc_id)
        {
            let fresh = !now.names.contains_key(&entry.svc_id);
            names.push((entry.svc_id, *name, fresh));
        }
    }
    names.sort_by_key(|n| n.0);
    names.dedup_by_key(|n| n.0);
    let failed = w.put_names(&names);
    let failed_names: BTreeSet<usize> = failed.iter().map(|(i, _)| *i).collect();
    r.writes += names.len() - failed.len();
    r.errors.extend(failed.into_iter().map(|(_, e)| e));
    for (i, (id, name, _)) in names.iter().enumerate() {
        if !failed_names.contains(&i) {
            now.names.insert(*id, *name);
        }
    }
    // Each frontend's slots then its entry, all frontends in one ordered batch: a failed
    // write skips the rest of its frontend (its entry never names a missing slot) and the
    // batch goes on with the next frontend.
    let mut writes: Vec<(SvcKey, SvcValue)> = Vec::new();
    let mut old_counts: BTreeMap<SvcKey, u16> = BTreeMap::new();
    for (key, entry) in &frontends {
        for slot in 1..=entry.count {
            let k = SvcKey { slot, ..*key };
            if let Some(v) = desired.services.get(&k)
                && now.services.get(&k) != Some(v)
            {
                writes.push((k, *v));
            }
        }
        if now.services.get(key) != Some(entry) {
            old_counts.insert(*key, now.services.get(key).map_or(0, |v| v.count));
            writes.push((*key, *entry));
        }
    }
    let mut start = 0;
    let mut failed_frontends = BTreeSet::new();
    while start < writes.len() {
        let (written, failed) = match w.put_svcs(&writes[start..]) {
            Ok(()) => (writes.len() - start, None),
            Err((i, e)) => (i, Some(e)),
        };
        for (k, v) in &writes[start..start + written] {
            now.services.insert(*k, *v);
        }
        r.writes += written;
        start += written;
        let Some(e) = failed else { break };
        r.errors.push(e);
        let frontend = frontend_of(&writes[start].0);
        failed_frontends.insert(frontend);
        // Past the failed frontend's remaining writes.
        while start < writes.len() && frontend_of(&writes[start].0) == frontend {
            start += 1;
        }
    }
    for (key, entry) in &frontends {
        if failed_frontends.contains(key) {
            continue;
        }
        let old_count = old_counts.get(key).copied().unwrap_or(entry.count);
        for slot in entry.count + 1..=old_count {
            delete_svc(w, now, &mut r, SvcKey { slot, ..*key });
        }
    }

    // 3. Services no longer desired: entry first, then its slots, then its name.
    let gone: Vec<(SvcKey, u16, u32)> = touched
        .frontends
        .iter()
        .filter(|k| !desired.services.contains_key(k))
        .filter_map(|k| now.services.get(k).map(|v| (*k, v.count, v.svc_id)))
        .collect();
    for (key, count, svc_id) in gone {
        if !delete_svc(w, now, &mut r, key) {
            continue;
        }
        for slot in 1..=count {
            delete_svc(w, now, &mut r, SvcKey { slot, ..key });
        }
        if !desired.names.contains_key(&svc_id) && now.names.contains_key(&svc_id) {
            match w.del_name(svc_id) {
                Ok(()) => {
                    now.names.remove(&svc_id);
                    r.deletes += 1;
                }
                Err(e) => r.errors.push(e),
            }
        }
    }

    // 4. Source ranges no longer desired (their entries are updated or gone).
    let old_ranges: Vec<SrcRange> = touched
        .src_ranges
        .iter()
        .filter(|x| !desired.src_ranges.contains(x) && now.src_ranges.contains(x))
        .copied()
        .collect();
    for range in &old_ranges {
        match w.del_src_range(range) {
            Ok(()) => {
                now.src_ranges.remove(range);
                r.deletes += 1;
            }
            Err(e) => r.errors.push(e),
        }
    }

    // 5. Address filter bits no longer wanted, once nothing that needed them is left.
    for &word in &touched.filter_words {
        let bits = word_of(&desired.filter, word);
        if word_of(&now.filter, word) != bits {
            write_filter(w, now, &mut r, word, bits);
        }
    }

    // 6. Backends no slot references any more (of the touched frontends, which are the
    // only ones whose slots changed).
    let referenced: BTreeSet<u32> = touched
        .frontends
        .iter()
        .filter_map(|k| now.services.get(k).map(|v| (k, v.count)))
        .flat_map(|(k, count)| {
            (1..=count).filter_map(|slot| now.services.get(&SvcKey { slot, ..*k }))
        })
        .map(|v| v.backend_id)
        .collect();
    let unused: Vec<u32> = touched
        .backends
        .iter()
        .filter(|id| {
            now.backends.contains_key(id)
                && !desired.backends.contains_key(id)
                && !referenced.contains(id)
        })
        .copied()
        .collect();
    for id in unused {
        match w.del_backend(id) {
            Ok(()) => {
                now.backends.remove(&id);
                r.deletes += 1;
            }
            Err(e) => r.errors.push(e),
        }
    }
    r
}

/// The entry (slot 0) of a slot's frontend.
fn frontend_of(k: &SvcKey) -> SvcKey {
    SvcKey { slot: 0, ..*k }
}

/// Word `word` of a set of filter bits.
fn word_of(bits: &BTreeSet<u32>, word: u32) -> u64 {
    bits.range(word * 64..(word + 1) * 64)
        .fold(0, |acc, b| acc | 1u64 << (b % 64))
}

/// Replaces word `word` of a set of filter bits with `bits` (64 updates, whatever the size
/// of the set).
pub fn set_word(set: &mut BTreeSet<u32>, word: u32, bits: u64) {
    for i in 0..64 {
        if bits & (1u64 << i) != 0 {
            set.insert(word * 64 + i);
        } else {
            set.remove(&(word * 64 + i));
        }
    }
}

fn write_filter(
    w: &mut dyn MapWriter,
    now: &mut Desired,
    r: &mut SyncReport,
    word: u32,
    bits: u64,
) {
    match w.put_filter_word(word, bits) {
        Ok(()) => {
            set_word(&mut now.filter, word, bits);
            r.writes += 1;
        }
        Err(e) => r.errors.push(e),
    }
}

fn delete_svc(w: &mut dyn MapWriter, now: &mut Desired, r: &mut SyncReport, key: SvcKey) -> bool {
    if !now.services.contains_key(&key) {
        return true;
    }
    match w.del_svc(&key) {
        Ok(()) => {
            now.services.remove(&key);
            r.deletes += 1;
            true
        }
        Err(e) => {
            r.errors.push(e);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        datapath::writer::MemoryMaps,
        desired::{Ids, Limits, compute},
        source::file,
    };

    fn desired(yaml: &str, ids: &mut Ids) -> Desired {
        let loaded = file::parse("t.yaml", yaml).expect("yaml");
        compute(&loaded.model, ids, Limits::default()).0
    }

    const WEB: &str = "apiVersion: v1\nkind: Service\nmetadata: {namespace: ns, name: web}\nspec:\n  clusterIP: 10.96.0.1\n  ports: [{name: p, port: 80, protocol: TCP}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {namespace: ns, name: web-1, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: p, port: 8080, protocol: TCP}]\nendpoints:\n- {addresses: [10.244.0.1], conditions: {ready: true}}\n- {addresses: [10.244.0.2], conditions: {ready: true}}\n";

    #[test]
    fn a_second_apply_of_the_same_state_writes_nothing() {
        let mut ids = Ids::default();
        let want = desired(WEB, &mut ids);
        let mut maps = MemoryMaps::default();
        let (now, r) = apply(&mut maps, &Desired::default(), &want);
        assert!(r.errors.is_empty() && r.writes > 0);
        assert_eq!(now, want);
        let (again, r) = apply(&mut maps, &now, &want);
        assert_eq!((r.writes, r.deletes), (0, 0));
        assert_eq!(again, want);
    }

    #[test]
    fn removal_deletes_the_entry_before_its_slots_and_backends() {
        let mut ids = Ids::default();
        let want = desired(WEB, &mut ids);
        let mut maps = MemoryMaps::default();
        let (now, _) = apply(&mut maps, &Desired::default(), &want);
        maps.log.clear();
        let (gone, r) = apply(&mut maps, &now, &Desired::default());
        assert!(r.errors.is_empty());
        assert_eq!(gone, Desired::default());
        let first_slot = maps.log.iter().position(|l| l.contains("#1"));
        let entry = maps.log.iter().position(|l| l.contains("#0"));
        let backend = maps.log.iter().position(|l| l.contains("backend"));
        assert!(entry < first_slot && first_slot < backend, "{:?}", maps.log);
    }
}
