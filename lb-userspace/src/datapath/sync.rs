//! Applies desired state make-before-break: backends, then slots, then the service entry;
//! deletes in reverse. At no instant does a programmed slot name a missing backend.

use std::collections::BTreeSet;

use lb_common::SvcKey;

use super::writer::{MapWriter, WriteError};
use crate::desired::Desired;

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
    let mut r = SyncReport::default();

    // 0. Address filter bits that are new, before anything that needs them (a frontend
    // whose bit is clear is invisible to the datapath).
    for (word, bits) in filter_words(&desired.filter) {
        let have = word_of(&now.filter, word);
        if have | bits != have {
            write_filter(w, &mut now, &mut r, word, have | bits);
        }
    }

    // 1. Backends that are new or changed.
    let mut failed_backends = BTreeSet::new();
    for (id, be) in &desired.backends {
        if now.backends.get(id) != Some(be) {
            match w.put_backend(*id, be) {
                Ok(()) => {
                    now.backends.insert(*id, *be);
                    r.writes += 1;
                }
                Err(e) => {
                    failed_backends.insert(*id);
                    r.errors.push(e);
                }
            }
        }
    }

    // 1b. Source ranges before the entries that use them (a frontend flagged for ranges
    // denies everyone until they are in).
    for range in desired.src_ranges.difference(&current.src_ranges) {
        match w.put_src_range(range) {
            Ok(()) => {
                now.src_ranges.insert(*range);
                r.writes += 1;
            }
            Err(e) => r.errors.push(e),
        }
    }

    // 2. Each desired service: name, slots, entry, then trim slots past the new count.
    for (key, entry) in desired.services.iter().filter(|(k, _)| k.slot == 0) {
        let slots: Vec<(SvcKey, _)> = (1..=entry.count)
            .filter_map(|slot| {
                let k = SvcKey { slot, ..*key };
                desired.services.get(&k).map(|v| (k, *v))
            })
            .collect();
        if slots
            .iter()
            .any(|(_, v)| failed_backends.contains(&v.backend_id))
        {
            continue;
        }
        if let Some(name) = desired.names.get(&entry.svc_id)
            && now.names.get(&entry.svc_id) != Some(name)
        {
            match w.put_name(entry.svc_id, name) {
                Ok(()) => {
                    now.names.insert(entry.svc_id, *name);
                    r.writes += 1;
                }
                Err(e) => r.errors.push(e),
            }
        }
        let mut ok = true;
        for (k, v) in &slots {
            if now.services.get(k) != Some(v) {
                match w.put_svc(k, v) {
                    Ok(()) => {
                        now.services.insert(*k, *v);
                        r.writes += 1;
                    }
                    Err(e) => {
                        r.errors.push(e);
                        ok = false;
                        break;
                    }
                }
            }
        }
        if !ok {
            continue;
        }
        let old_count = now.services.get(key).map_or(0, |v| v.count);
        if now.services.get(key) != Some(entry) {
            match w.put_svc(key, entry) {
                Ok(()) => {
                    now.services.insert(*key, *entry);
                    r.writes += 1;
                }
                Err(e) => {
                    r.errors.push(e);
                    continue;
                }
            }
        }
        for slot in entry.count + 1..=old_count {
            delete_svc(w, &mut now, &mut r, SvcKey { slot, ..*key });
        }
    }

    // 3. Services no longer desired: entry first, then its slots, then its name.
    let gone: Vec<(SvcKey, u16, u32)> = now
        .services
        .iter()
        .filter(|(k, _)| k.slot == 0 && !desired.services.contains_key(k))
        .map(|(k, v)| (*k, v.count, v.svc_id))
        .collect();
    for (key, count, svc_id) in gone {
        if !delete_svc(w, &mut now, &mut r, key) {
            continue;
        }
        for slot in 1..=count {
            delete_svc(w, &mut now, &mut r, SvcKey { slot, ..key });
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
    for range in current.src_ranges.difference(&desired.src_ranges) {
        match w.del_src_range(range) {
            Ok(()) => {
                now.src_ranges.remove(range);
                r.deletes += 1;
            }
            Err(e) => r.errors.push(e),
        }
    }

    // 5. Address filter bits no longer wanted, once nothing that needed them is left.
    let words: BTreeSet<u32> = now
        .filter
        .symmetric_difference(&desired.filter)
        .map(|b| b / 64)
        .collect();
    for word in words {
        write_filter(w, &mut now, &mut r, word, word_of(&desired.filter, word));
    }

    // 6. Backends no slot references any more.
    let referenced: BTreeSet<u32> = now
        .services
        .iter()
        .filter(|(k, _)| k.slot > 0)
        .map(|(_, v)| v.backend_id)
        .collect();
    let unused: Vec<u32> = now
        .backends
        .keys()
        .filter(|id| !desired.backends.contains_key(id) && !referenced.contains(id))
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
    (now, r)
}

/// The 64-bit words of a set of filter bits.
fn filter_words(bits: &BTreeSet<u32>) -> std::collections::BTreeMap<u32, u64> {
    let mut words = std::collections::BTreeMap::new();
    for b in bits {
        *words.entry(b / 64).or_insert(0u64) |= 1u64 << (b % 64);
    }
    words
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
