//! Applies desired state make-before-break: backends, then slots, then the service entry;
//! deletes in reverse. At no instant does a programmed slot name a missing backend. A
//! frontend's slots are written into its range of the slot array before its entry names
//! the range: a frontend that moved to a new range keeps reading the old one (untouched,
//! in quarantine) until its entry flips; one that shrinks in place reads no slot past its
//! entry's count.

use std::collections::{BTreeMap, BTreeSet};

use lb_common::{Backend, SvcKey, SvcValue};

use crate::desired::SvcEntry;

use super::writer::{MapWriter, WriteError};
use crate::desired::{Desired, ObjectName, SrcRange, Touched};

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
        frontends: both().flat_map(|d| d.services.keys().copied()).collect(),
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
        // 2. The desired frontends: names, then slots (one batch), then entries. A frontend
        // whose backend, table or slots failed keeps its old entry.
        let frontends = self.frontends_to_write(failed_backends, &failed_tables);
        self.put_names(&frontends);
        let frontends = self.put_slots(frontends);
        self.put_entries(&frontends);
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

impl<'a> Apply<'a> {
    /// Writes each touched filter word whose programmed bits differ from `bits(have, want)`,
    /// as one batch.
    fn filter_words(&mut self, bits: impl Fn(u64, u64) -> u64) {
        let words: Vec<(u32, u64)> = self
            .touched
            .filter_words
            .iter()
            .filter_map(|&word| {
                let have = word_of(&self.now.filter, word);
                let to = bits(have, word_of(&self.desired.filter, word));
                (to != have).then_some((word, to))
            })
            .collect();
        let failed = self.w.put_filter_words(&words);
        self.r.writes += words.len() - failed.len();
        let failed_words: BTreeSet<usize> = failed.iter().map(|(i, _)| *i).collect();
        self.r.errors.extend(failed.into_iter().map(|(_, e)| e));
        if self.record {
            for (i, (word, bits)) in words.iter().enumerate() {
                if !failed_words.contains(&i) {
                    set_word(&mut self.now.filter, *word, *bits);
                }
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
    ) -> Vec<(SvcKey, &'a SvcEntry)> {
        let desired = self.desired;
        let mut out = Vec::new();
        for (k, v) in self
            .touched
            .frontends
            .iter()
            .filter_map(|k| desired.services.get(k).map(|v| (*k, v)))
        {
            match v.slots.iter().find_map(|b| failed_backends.get(b)) {
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
    fn put_names(&mut self, frontends: &[(SvcKey, &SvcEntry)]) {
        let mut names: Vec<(u32, ObjectName, bool)> = Vec::new();
        for (_, entry) in frontends {
            if let Some(name) = self.desired.names.get(&entry.svc_id)
                && self.now.names.get(&entry.svc_id) != Some(name)
                && names.last().map(|n| n.0) != Some(entry.svc_id)
            {
                let fresh = !self.now.names.contains_key(&entry.svc_id);
                names.push((entry.svc_id, name.clone(), fresh));
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
                self.now.names.insert(*id, name.clone());
            }
        }
    }

    /// The slots of `frontends` that differ from what their range holds, all runs in one
    /// batch: a frontend in a new range (or new) has its whole range written, one in place
    /// the run from its first changed slot to its last. The frontends whose slots are
    /// written (or needed none).
    fn put_slots(&mut self, frontends: Vec<(SvcKey, &'a SvcEntry)>) -> Vec<(SvcKey, &'a SvcEntry)> {
        let mut runs: Vec<(u32, &[u32])> = Vec::new();
        let mut of: Vec<usize> = Vec::new();
        for (i, (key, want)) in frontends.iter().enumerate() {
            let have = self.now.services.get(key);
            if let Some((base, ids)) = changed_slots(have, want) {
                runs.push((base, ids));
                of.push(i);
            }
        }
        let failed = self.w.put_slot_runs(&runs);
        let written: usize = runs.iter().map(|(_, ids)| ids.len()).sum();
        let failed_slots: usize = failed.iter().map(|(i, _)| runs[*i].1.len()).sum();
        self.r.writes += written - failed_slots;
        let mut skip = BTreeSet::new();
        for (i, e) in failed {
            let (key, want) = frontends[of[i]];
            self.r.fail(Some(want.svc_id), e);
            skip.insert(key);
        }
        if self.record {
            // Slots written in place are programmed at once (the entry reads them).
            for (i, (base, ids)) in runs.iter().enumerate() {
                let (key, want) = frontends[of[i]];
                if !skip.contains(&key) {
                    record_in_place(self.now, &key, want.slot_base, (*base, ids));
                }
            }
        }
        frontends
            .into_iter()
            .filter(|(k, _)| !skip.contains(k))
            .collect()
    }

    /// The entries of `frontends` that differ from what is programmed, in one ordered
    /// batch; a failed one is named and the writes go on with the next, one by one (a
    /// full map refuses the rest too: a new batch per failure would copy the rest again
    /// each time).
    fn put_entries(&mut self, frontends: &[(SvcKey, &SvcEntry)]) {
        let writes: Vec<(SvcKey, SvcValue)> = frontends
            .iter()
            .filter(|(k, want)| self.now.services.get(k).map(|e| &e.value) != Some(&want.value))
            .map(|(k, want)| (*k, want.value))
            .collect();
        let mut start = 0;
        let mut failed = BTreeSet::new();
        while start < writes.len() {
            let end = match failed.is_empty() {
                true => writes.len(),
                false => start + 1,
            };
            let (written, e) = match self.w.put_svcs(&writes[start..end]) {
                Ok(()) => (end - start, None),
                Err((i, e)) => (i, Some(e)),
            };
            self.r.writes += written;
            start += written;
            let Some(e) = e else { continue };
            self.r.fail(Some(writes[start].1.svc_id), e);
            failed.insert(writes[start].0);
            start += 1;
        }
        for (k, want) in frontends.iter().filter(|_| self.record) {
            if !failed.contains(k) {
                self.now.services.insert(*k, (*want).clone());
            }
        }
    }

    /// Frontends no longer desired: entry first, then its name (its range of the slot
    /// array is left as it is: no entry reads it, and it is reused after a quarantine).
    fn remove_gone_frontends(&mut self) {
        let gone: Vec<(SvcKey, u32)> = self
            .touched
            .frontends
            .iter()
            .filter(|k| !self.desired.services.contains_key(k))
            .filter_map(|k| self.now.services.get(k).map(|v| (*k, v.svc_id)))
            .collect();
        for (key, svc_id) in gone {
            if !delete_svc(self.w, self.now, &mut self.r, key) {
                continue;
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
            .filter_map(|k| now.services.get(k))
            .flat_map(|v| v.slots.iter().copied())
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

/// The run of `want`'s slots that its range does not hold yet, as `(base, ids)`: all of
/// them when `have` (what is programmed) is in another range or none, else from the first
/// slot that differs to the last (slots past `have`'s count hold nothing it can read).
fn changed_slots<'e>(have: Option<&SvcEntry>, want: &'e SvcEntry) -> Option<(u32, &'e [u32])> {
    let base = want.slot_base;
    let Some(have) = have.filter(|h| h.slot_base == base && h.count > 0) else {
        return (!want.slots.is_empty()).then_some((base, &want.slots[..]));
    };
    let differs = |i: &usize| have.slots.get(*i) != Some(&want.slots[*i]);
    let first = (0..want.slots.len()).find(differs)?;
    let last = (0..want.slots.len()).rev().find(differs)?;
    Some((base + first as u32, &want.slots[first..=last]))
}

/// Slots `base..` written with `ids` in the range at `range`: when that is `key`'s
/// programmed range, what its entry reads now (slots past its count stay unread until the
/// entry grows).
fn record_in_place(now: &mut Desired, key: &SvcKey, range: u32, (base, ids): (u32, &[u32])) {
    let Some(e) = now.services.get_mut(key).filter(|e| e.slot_base == range) else {
        return;
    };
    let Some(from) = base.checked_sub(e.slot_base) else {
        return;
    };
    let mut slots = e.slots.to_vec();
    for (i, id) in ids.iter().enumerate() {
        if let Some(s) = slots.get_mut(from as usize + i) {
            *s = *id;
        }
    }
    e.slots = slots.into();
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
    fn removal_deletes_the_entry_before_its_backends() {
        let mut ids = Ids::default();
        let want = desired(WEB, &mut ids);
        let mut maps = MemoryMaps::default();
        let (now, _) = apply(&mut maps, &Desired::default(), &want);
        maps.log.clear();
        let (gone, r) = apply(&mut maps, &now, &Desired::default());
        assert!(r.errors.is_empty());
        assert_eq!(gone, Desired::default());
        let entry = maps.log.iter().position(|l| l.starts_with("del svc"));
        let backend = maps.log.iter().position(|l| l.contains("backend"));
        assert!(entry.is_some() && entry < backend, "{:?}", maps.log);
        assert!(
            !maps.log.iter().any(|l| l.contains("slots")),
            "its range is left as it is: {:?}",
            maps.log
        );
    }

    /// WEB with `n` endpoints.
    fn web_with(n: u8) -> String {
        let mut y = WEB.replace(
            "- {addresses: [10.244.0.1], conditions: {ready: true}}\n- {addresses: [10.244.0.2], conditions: {ready: true}}\n",
            "",
        );
        for i in 1..=n {
            y.push_str(&format!(
                "- {{addresses: [10.244.0.{i}], conditions: {{ready: true}}}}\n"
            ));
        }
        y
    }

    #[test]
    fn a_frontend_that_outgrows_its_range_has_its_new_range_written_before_its_entry_flips() {
        let mut ids = Ids::default();
        let desired = |y: &str, ids: &mut Ids| {
            let model = file::parse("t.yaml", y).expect("yaml").model;
            crate::reconcile::recompute(&model, &Default::default(), ids, Limits::default()).0
        };
        let two = desired(&web_with(3), &mut ids);
        let mut maps = MemoryMaps::default();
        let (now, _) = apply(&mut maps, &Desired::default(), &two);
        let (key, old) = two.services.iter().next().expect("web");
        // Four in place (its range of 4 holds them): the new slot before the entry.
        let three = desired(&web_with(4), &mut ids);
        maps.log.clear();
        let (now, r) = apply(&mut maps, &now, &three);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(three.services[key].slot_base, old.slot_base, "in place");
        let base = old.slot_base;
        let log: Vec<&String> = maps.log.iter().filter(|l| !l.contains("filter")).collect();
        assert_eq!(
            log,
            [
                "put backend 4",
                &format!("put slots {}+1", base + 3),
                "put svc 10.96.0.1:80/TCP"
            ]
        );
        // Five: a new range, written whole before the entry names it; the old one untouched.
        let five = desired(&web_with(5), &mut ids);
        let moved = &five.services[key];
        assert_ne!(moved.slot_base, base, "moved");
        maps.log.clear();
        let (now, r) = apply(&mut maps, &now, &five);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        let slots = maps
            .log
            .iter()
            .position(|l| *l == format!("put slots {}+5", moved.slot_base));
        let entry = maps.log.iter().position(|l| l.starts_with("put svc"));
        assert!(slots.is_some() && slots < entry, "{:?}", maps.log);
        assert_eq!(maps.slot_array[&base], three.services[key].slots[0]);
        assert_eq!(now, five);
        assert_eq!(maps.state, five);
    }
}
