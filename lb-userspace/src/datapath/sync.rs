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
    /// Service index → the first error that left its frontend (or its name or source range)
    /// unwritten: a failed backend names every frontend that had to wait for it.
    pub by_service: BTreeMap<u32, WriteError>,
}

impl SyncReport {
    /// A failed write, of service index `svc_id` when it has one.
    fn fail(&mut self, svc_id: Option<u32>, e: WriteError) {
        if let Some(id) = svc_id {
            self.by_service.entry(id).or_insert_with(|| e.clone());
        }
        self.errors.push(e);
    }
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
        maglev: both().flat_map(|d| d.maglev.keys().copied()).collect(),
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
    Apply {
        w,
        now,
        desired,
        touched,
        r: SyncReport::default(),
        record: true,
    }
    .run()
}

/// A first sync into maps that hold nothing: [`apply_touched`] from an empty state in the
/// same order, but what is written is not recorded (nothing to compare it with, no copy of
/// the maps made: at 10,000 × 10 that copy was 8 MiB and a tenth of the sync). After
/// errors what is programmed is for the caller to read back ([`MapWriter::read`]).
pub fn apply_fresh(w: &mut dyn MapWriter, desired: &Desired, touched: &Touched) -> SyncReport {
    let mut empty = Desired::default();
    Apply {
        w,
        now: &mut empty,
        desired,
        touched,
        r: SyncReport::default(),
        record: false,
    }
    .run()
}

impl Apply<'_> {
    fn run(mut self) -> SyncReport {
        // 0. Address filter bits that are new, before anything that needs them (a frontend
        // whose bit is clear is invisible to the datapath).
        self.filter_words(|have, want| have | want);
        // 1. Backends that are new or changed; 1b. source ranges before the entries that use
        // them (a frontend flagged for ranges denies everyone until they are in).
        // 1c. Maglev tables new or changed, before the entries flagged to read them (a table
        // replaced is swapped whole by the kernel).
        let failed_backends = self.put_backends();
        self.put_src_ranges();
        let failed_tables = self.put_maglev();
        // 2. The desired frontends: names, then slots, then entries, then the slots past an
        // entry's new count trimmed. A frontend whose backend, table or slot failed keeps its
        // old entry.
        let frontends = self.frontends_to_write(failed_backends, &failed_tables);
        self.put_names(&frontends);
        let (failed_frontends, old_counts) = self.put_slots_and_entries(&frontends);
        self.trim_slots(&frontends, &failed_frontends, &old_counts);
        // 3. Services no longer desired; 4. source ranges no longer desired (their entries are
        // updated or gone).
        self.remove_gone_frontends();
        self.remove_src_ranges();
        self.remove_maglev();
        // 5. Address filter bits no longer wanted, once nothing that needed them is left
        // (none when the maps held nothing).
        if self.record {
            self.filter_words(|_, want| want);
        }
        // 6. Backends no slot references any more.
        self.remove_unused_backends();
        self.r
    }
}

/// One [`apply_touched`]: the writer, what is programmed, what is wanted, what to compare,
/// and what was done.
struct Apply<'a> {
    w: &'a mut dyn MapWriter,
    now: &'a mut Desired,
    desired: &'a Desired,
    touched: &'a Touched,
    r: SyncReport,
    /// Successful writes are recorded in `now` (not for [`apply_fresh`]).
    record: bool,
}

impl Apply<'_> {
    /// Writes each touched filter word whose programmed bits differ from `bits(have, want)`.
    fn filter_words(&mut self, bits: impl Fn(u64, u64) -> u64) {
        for &word in &self.touched.filter_words {
            let have = word_of(&self.now.filter, word);
            let to = bits(have, word_of(&self.desired.filter, word));
            if to != have {
                write_filter(self.w, self.now, &mut self.r, word, to, self.record);
            }
        }
    }

    /// Backends that are new or changed, batched (a cold sync writes them all at once);
    /// the indices whose write failed, with the error.
    fn put_backends(&mut self) -> BTreeMap<u32, WriteError> {
        let (now, desired) = (&*self.now, self.desired);
        let backends: Vec<(u32, Backend)> = self
            .touched
            .backends
            .iter()
            .filter_map(|id| desired.backends.get(id).map(|be| (*id, *be)))
            .filter(|(id, be)| now.backends.get(id) != Some(be))
            .collect();
        let failed = self.w.put_backends(&backends);
        self.r.writes += backends.len() - failed.len();
        let failed_backends: BTreeMap<u32, WriteError> = failed
            .into_iter()
            .map(|(i, e)| {
                self.r.errors.push(e.clone());
                (backends[i].0, e)
            })
            .collect();
        for (id, be) in backends.iter().filter(|_| self.record) {
            if !failed_backends.contains_key(id) {
                self.now.backends.insert(*id, *be);
            }
        }
        failed_backends
    }

    /// Source ranges wanted and not programmed.
    fn put_src_ranges(&mut self) {
        let new_ranges: Vec<SrcRange> = self
            .touched
            .src_ranges
            .iter()
            .filter(|x| self.desired.src_ranges.contains(x) && !self.now.src_ranges.contains(x))
            .copied()
            .collect();
        for range in &new_ranges {
            match self.w.put_src_range(range) {
                Ok(()) => {
                    if self.record {
                        self.now.src_ranges.insert(*range);
                    }
                    self.r.writes += 1;
                }
                Err(e) => self.r.fail(Some(range.svc_id), e),
            }
        }
    }

    /// Maglev tables wanted and not programmed as they are; the service indices whose
    /// write failed.
    fn put_maglev(&mut self) -> BTreeSet<u32> {
        let mut failed = BTreeSet::new();
        for id in &self.touched.maglev {
            let Some(t) = self.desired.maglev.get(id) else {
                continue;
            };
            if self.now.maglev.get(id) == Some(t) {
                continue;
            }
            match self.w.put_maglev(*id, t) {
                Ok(()) => {
                    if self.record {
                        self.now.maglev.insert(*id, t.clone());
                    }
                    self.r.writes += 1;
                }
                Err(e) => {
                    self.r.fail(Some(*id), e);
                    failed.insert(*id);
                }
            }
        }
        failed
    }

    /// Maglev tables programmed and no longer wanted (their entries are unflagged or gone).
    fn remove_maglev(&mut self) {
        let gone: Vec<u32> = self
            .touched
            .maglev
            .iter()
            .filter(|id| !self.desired.maglev.contains_key(id) && self.now.maglev.contains_key(id))
            .copied()
            .collect();
        for id in gone {
            match self.w.del_maglev(id) {
                Ok(()) => {
                    self.now.maglev.remove(&id);
                    self.r.deletes += 1;
                }
                Err(e) => self.r.fail(Some(id), e),
            }
        }
    }

    /// The desired entries of the touched frontends, but those with a slot naming a
    /// backend whose write failed, or flagged for a Maglev table whose write failed (that
    /// error is theirs).
    fn frontends_to_write(
        &mut self,
        failed_backends: BTreeMap<u32, WriteError>,
        failed_tables: &BTreeSet<u32>,
    ) -> Vec<(SvcKey, SvcValue)> {
        let desired = self.desired;
        let mut out = Vec::new();
        for (k, v) in self
            .touched
            .frontends
            .iter()
            .filter_map(|k| desired.services.get(k).map(|v| (*k, *v)))
        {
            let failed = (1..=v.count).find_map(|slot| {
                let s = desired.services.get(&SvcKey { slot, ..k })?;
                failed_backends.get(&s.backend_id)
            });
            match failed {
                Some(e) => {
                    self.r
                        .by_service
                        .entry(v.svc_id)
                        .or_insert_with(|| e.clone());
                }
                None if v.flags & lb_common::SVC_F_MAGLEV != 0
                    && failed_tables.contains(&v.svc_id) => {}
                None => out.push((k, v)),
            }
        }
        out
    }

    /// The names of `frontends`' services that are new or changed, as one batch.
    fn put_names(&mut self, frontends: &[(SvcKey, SvcValue)]) {
        let mut names: Vec<(u32, SvcName, bool)> = Vec::new();
        for (_, entry) in frontends {
            if let Some(name) = self.desired.names.get(&entry.svc_id)
                && self.now.names.get(&entry.svc_id) != Some(name)
                && names.last().map(|n| n.0) != Some(entry.svc_id)
            {
                let fresh = !self.now.names.contains_key(&entry.svc_id);
                names.push((entry.svc_id, *name, fresh));
            }
        }
        names.sort_by_key(|n| n.0);
        names.dedup_by_key(|n| n.0);
        let failed = self.w.put_names(&names);
        let failed_names: BTreeSet<usize> = failed.iter().map(|(i, _)| *i).collect();
        self.r.writes += names.len() - failed.len();
        for (i, e) in failed {
            self.r.fail(Some(names[i].0), e);
        }
        for (i, (id, name, _)) in names.iter().enumerate().filter(|_| self.record) {
            if !failed_names.contains(&i) {
                self.now.names.insert(*id, *name);
            }
        }
    }

    /// Each frontend's slots then its entry, all frontends in one ordered batch: a failed
    /// write skips the rest of its frontend (its entry never names a missing slot) and the
    /// batch goes on with the next frontend. The frontends that failed, and each written
    /// entry's count before.
    fn put_slots_and_entries(
        &mut self,
        frontends: &[(SvcKey, SvcValue)],
    ) -> (BTreeSet<SvcKey>, BTreeMap<SvcKey, u16>) {
        let mut writes: Vec<(SvcKey, SvcValue)> = Vec::new();
        let mut old_counts: BTreeMap<SvcKey, u16> = BTreeMap::new();
        for (key, entry) in frontends {
            for slot in 1..=entry.count {
                let k = SvcKey { slot, ..*key };
                if let Some(v) = self.desired.services.get(&k)
                    && self.now.services.get(&k) != Some(v)
                {
                    writes.push((k, *v));
                }
            }
            if self.now.services.get(key) != Some(entry) {
                old_counts.insert(*key, self.now.services.get(key).map_or(0, |v| v.count));
                writes.push((*key, *entry));
            }
        }
        let mut start = 0;
        let mut failed_frontends = BTreeSet::new();
        while start < writes.len() {
            let (written, failed) = match self.w.put_svcs(&writes[start..]) {
                Ok(()) => (writes.len() - start, None),
                Err((i, e)) => (i, Some(e)),
            };
            for (k, v) in writes[start..start + written]
                .iter()
                .filter(|_| self.record)
            {
                self.now.services.insert(*k, *v);
            }
            self.r.writes += written;
            start += written;
            let Some(e) = failed else { break };
            self.r.fail(Some(writes[start].1.svc_id), e);
            let frontend = frontend_of(&writes[start].0);
            failed_frontends.insert(frontend);
            // Past the failed frontend's remaining writes.
            while start < writes.len() && frontend_of(&writes[start].0) == frontend {
                start += 1;
            }
        }
        (failed_frontends, old_counts)
    }

    /// The slots past each written entry's new count.
    fn trim_slots(
        &mut self,
        frontends: &[(SvcKey, SvcValue)],
        failed_frontends: &BTreeSet<SvcKey>,
        old_counts: &BTreeMap<SvcKey, u16>,
    ) {
        for (key, entry) in frontends {
            if failed_frontends.contains(key) {
                continue;
            }
            let old_count = old_counts.get(key).copied().unwrap_or(entry.count);
            for slot in entry.count + 1..=old_count {
                delete_svc(self.w, self.now, &mut self.r, SvcKey { slot, ..*key });
            }
        }
    }

    /// Frontends no longer desired: entry first, then its slots, then its name.
    fn remove_gone_frontends(&mut self) {
        let gone: Vec<(SvcKey, u16, u32)> = self
            .touched
            .frontends
            .iter()
            .filter(|k| !self.desired.services.contains_key(k))
            .filter_map(|k| self.now.services.get(k).map(|v| (*k, v.count, v.svc_id)))
            .collect();
        for (key, count, svc_id) in gone {
            if !delete_svc(self.w, self.now, &mut self.r, key) {
                continue;
            }
            for slot in 1..=count {
                delete_svc(self.w, self.now, &mut self.r, SvcKey { slot, ..key });
            }
            if !self.desired.names.contains_key(&svc_id) && self.now.names.contains_key(&svc_id) {
                match self.w.del_name(svc_id) {
                    Ok(()) => {
                        self.now.names.remove(&svc_id);
                        self.r.deletes += 1;
                    }
                    Err(e) => self.r.fail(Some(svc_id), e),
                }
            }
        }
    }

    /// Source ranges programmed and no longer wanted.
    fn remove_src_ranges(&mut self) {
        let old_ranges: Vec<SrcRange> = self
            .touched
            .src_ranges
            .iter()
            .filter(|x| !self.desired.src_ranges.contains(x) && self.now.src_ranges.contains(x))
            .copied()
            .collect();
        for range in &old_ranges {
            match self.w.del_src_range(range) {
                Ok(()) => {
                    self.now.src_ranges.remove(range);
                    self.r.deletes += 1;
                }
                Err(e) => self.r.fail(Some(range.svc_id), e),
            }
        }
    }

    /// Touched backends no longer desired that no slot of a touched frontend (the only
    /// ones whose slots changed) references.
    fn remove_unused_backends(&mut self) {
        let now = &*self.now;
        let referenced: BTreeSet<u32> = self
            .touched
            .frontends
            .iter()
            .filter_map(|k| now.services.get(k).map(|v| (k, v.count)))
            .flat_map(|(k, count)| {
                (1..=count).filter_map(|slot| now.services.get(&SvcKey { slot, ..*k }))
            })
            .map(|v| v.backend_id)
            .collect();
        let unused: Vec<u32> = self
            .touched
            .backends
            .iter()
            .filter(|id| {
                now.backends.contains_key(id)
                    && !self.desired.backends.contains_key(id)
                    && !referenced.contains(id)
            })
            .copied()
            .collect();
        for id in unused {
            match self.w.del_backend(id) {
                Ok(()) => {
                    self.now.backends.remove(&id);
                    self.r.deletes += 1;
                }
                Err(e) => self.r.errors.push(e),
            }
        }
    }
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
    record: bool,
) {
    match w.put_filter_word(word, bits) {
        Ok(()) => {
            if record {
                set_word(&mut now.filter, word, bits);
            }
            r.writes += 1;
        }
        Err(e) => r.errors.push(e),
    }
}

fn delete_svc(w: &mut dyn MapWriter, now: &mut Desired, r: &mut SyncReport, key: SvcKey) -> bool {
    let Some(svc_id) = now.services.get(&key).map(|v| v.svc_id) else {
        return true;
    };
    match w.del_svc(&key) {
        Ok(()) => {
            now.services.remove(&key);
            r.deletes += 1;
            true
        }
        Err(e) => {
            r.fail(Some(svc_id), e);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        datapath::writer::MemoryMaps,
        desired::{Limits, compute},
        reconcile::Ids,
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
