//! Failed writes, retried per service with backoff, as Cilium's reconciler retries per
//! object. A service port whose writes failed (a full map) keeps what it left programmed
//! ([`Diverged`]) and a time for its next try, 0.5 s doubling to 30 s; until then every
//! other service syncs incrementally against the desired state, and a sync that touches
//! one of its keys takes it in (the apply then compares against what it left). It is
//! reported by name, with the map and the limit, at every failed try.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use tracing::{info, warn};

use crate::{
    datapath::{diverged::Diverged, sync::SyncReport},
    desired::{Desired, Touched},
};

/// The first retry's delay; it doubles with every failed try up to [`BACKOFF_MAX`].
pub(super) const BACKOFF_MIN: Duration = Duration::from_millis(500);
pub(super) const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// One service port whose writes failed.
#[derive(Debug)]
pub(super) struct Failed {
    /// Its name in the maps (`namespace/name:port`).
    name: String,
    /// What it left programmed where that differs from the desired state.
    diverged: Diverged,
    /// Its last error, as logged.
    error: String,
    /// Failed tries so far.
    tries: u32,
    next: Instant,
}

/// The services whose writes failed, by service index (0: entries of no one service).
#[derive(Debug)]
pub(super) struct Retries {
    failed: BTreeMap<u32, Failed>,
    /// The first retry's delay (tests shorten it).
    backoff_min: Duration,
}

impl Default for Retries {
    fn default() -> Self {
        Self {
            failed: BTreeMap::new(),
            backoff_min: BACKOFF_MIN,
        }
    }
}

/// The services a sync took in: their keys are in its touched set.
#[derive(Debug, Default)]
pub(super) struct Taken(Vec<(u32, Failed)>);

impl Taken {
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// What they left programmed, put into `now`.
    pub(super) fn overlay(&self, now: &mut Desired) {
        for (_, f) in &self.0 {
            f.diverged.overlay(now);
        }
    }
}

/// The delay before try `tries + 1` after `tries` failed ones.
fn backoff(min: Duration, tries: u32) -> Duration {
    min.saturating_mul(1 << tries.saturating_sub(1).min(16))
        .min(BACKOFF_MAX)
}

impl Retries {
    #[cfg(test)]
    pub(super) fn with_backoff(backoff_min: Duration) -> Self {
        Self {
            failed: BTreeMap::new(),
            backoff_min,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.failed.len()
    }

    /// Every failing service's retry due now.
    #[cfg(test)]
    pub(super) fn make_due(&mut self) {
        let now = Instant::now();
        for f in self.failed.values_mut() {
            f.next = now;
        }
    }

    /// Each failing service's name and failed tries.
    #[cfg(test)]
    pub(super) fn tries(&self) -> Vec<(String, u32)> {
        self.failed
            .values()
            .map(|f| (f.name.clone(), f.tries))
            .collect()
    }

    /// Each failing service's name (`namespace/name:port`) and last error.
    pub(super) fn failing(&self) -> impl Iterator<Item = (&str, &str)> {
        self.failed
            .values()
            .map(|f| (f.name.as_str(), f.error.as_str()))
    }

    /// When the next retry is due.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.failed.values().map(|f| f.next).min()
    }

    /// Takes the failed services this sync must include: every one when `all` (a full
    /// sync), else those due at `now` and those whose keys `touched` names, and then
    /// those whose keys theirs name. Their keys are added to `touched`.
    pub(super) fn take(&mut self, touched: &mut Touched, now: Instant, all: bool) -> Taken {
        let mut taken = Vec::new();
        loop {
            let ids: Vec<u32> = self
                .failed
                .iter()
                .filter(|(_, f)| all || f.next <= now || f.diverged.overlaps(touched))
                .map(|(id, _)| *id)
                .collect();
            if ids.is_empty() {
                return Taken(taken);
            }
            for id in ids {
                if let Some(f) = self.failed.remove(&id) {
                    let t = f.diverged.touched();
                    touched.frontends.extend(t.frontends);
                    touched.backends.extend(t.backends);
                    touched.src_ranges.extend(t.src_ranges);
                    touched.filter_words.extend(t.filter_words);
                    taken.push((id, f));
                }
            }
        }
    }

    /// After a sync's apply: what still differs from the desired state (`diverged`, of the
    /// keys the sync touched) is kept per service with its next try; each failing service
    /// is reported with its error, each taken one that is now programmed too.
    pub(super) fn record(
        &mut self,
        taken: Taken,
        diverged: Diverged,
        desired: &Desired,
        report: &SyncReport,
        now: Instant,
    ) {
        let mut tries: BTreeMap<u32, u32> = BTreeMap::new();
        let mut names: BTreeMap<u32, String> = BTreeMap::new();
        for (id, f) in taken.0 {
            tries.insert(id, f.tries);
            names.insert(id, f.name);
        }
        let groups = diverged.by_service(desired);
        for (id, name) in &names {
            if !groups.contains_key(id) {
                info!(service = %name, tries = tries[id], "programmed after failed writes");
            }
        }
        for (id, d) in groups {
            let name = desired
                .names
                .get(&id)
                .map(|n| n.to_string())
                .or_else(|| names.remove(&id))
                .or_else(|| d.names.get(&id).cloned().flatten().map(|n| n.to_string()))
                .unwrap_or_else(|| match id {
                    0 => "backends and address filter".to_string(),
                    _ => format!("service index {id}"),
                });
            let tried = tries.get(&id).copied().unwrap_or(0) + 1;
            let delay = backoff(self.backoff_min, tried);
            let error = report
                .by_service
                .get(&id)
                .or(report.errors.first())
                .map_or_else(|| "not written".to_string(), |e| e.to_string());
            warn!(
                service = %name,
                tries = tried,
                retry_in_ms = delay.as_millis() as u64,
                "not programmed: {error}; retried with backoff, other services sync on"
            );
            let failed = Failed {
                name,
                error,
                diverged: d,
                tries: tried,
                next: now + delay,
            };
            match self.failed.get_mut(&id) {
                // Only entries of no one service can meet ones not taken.
                Some(f) => f.diverged.merge(failed.diverged),
                None => {
                    self.failed.insert(id, failed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_half_a_second_to_thirty() {
        let b = |n| backoff(BACKOFF_MIN, n);
        assert_eq!(b(1), Duration::from_millis(500));
        assert_eq!(b(2), Duration::from_secs(1));
        assert_eq!(b(4), Duration::from_secs(4));
        assert_eq!(b(7), BACKOFF_MAX);
        assert_eq!(b(1000), BACKOFF_MAX);
    }
}
