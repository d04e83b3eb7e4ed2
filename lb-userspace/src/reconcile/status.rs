//! Each frontend's status: programmed, or failed with a reason and since when. Only the
//! failing frontends are kept (a few, where the programmed ones are thousands): a frontend
//! of a Service the agent knows and not listed here is programmed once its sync ran.
//!
//! [`Statuses::update`] replaces what is known of one Service by its failures now and
//! returns the transitions its owner is told about (as an Event on the Service): a
//! frontend that starts failing, or fails for another reason, and one that no longer
//! fails. The same failure again is no transition, so a Service that stays broken is told
//! once, and a healthy Service never.

use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime},
};

use serde::Serialize;

use crate::{desired::DesiredError, model::ServiceRef};

/// Why a frontend is not (fully) programmed: an Event's reason, and the label of
/// `xlb_frontends_failing`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Reason {
    /// A map is full (`--service-map-max`, `--backend-map-max`, the source-range tries, the
    /// per-service arrays): not programmed.
    MapFull,
    /// The Maglev map is full: programmed, its new flows pick a backend at random.
    MaglevMapFull,
    /// Another Service has the frontend (address, port and protocol): not programmed.
    FrontendConflict,
    /// More backends than a service port holds: programmed with the first ones.
    TooManyBackends,
    /// Something the datapath does not do: not programmed.
    Unsupported,
    /// The kernel refused its writes: retried with backoff.
    WriteFailed,
    /// The node lacks the frontend's address family (IPv6 turned off): not programmed.
    FamilyMissing,
}

impl Reason {
    pub const ALL: [Reason; 7] = [
        Reason::MapFull,
        Reason::MaglevMapFull,
        Reason::FrontendConflict,
        Reason::TooManyBackends,
        Reason::Unsupported,
        Reason::WriteFailed,
        Reason::FamilyMissing,
    ];

    /// Its name (PascalCase, as Event reasons are written).
    pub fn name(self) -> &'static str {
        match self {
            Reason::MapFull => "MapFull",
            Reason::MaglevMapFull => "MaglevMapFull",
            Reason::FrontendConflict => "FrontendConflict",
            Reason::TooManyBackends => "TooManyBackends",
            Reason::Unsupported => "Unsupported",
            Reason::WriteFailed => "WriteFailed",
            Reason::FamilyMissing => "FamilyMissing",
        }
    }

    /// A computation's problem as a failure of the frontend it names; none for what is not
    /// a failure (a Service without an EndpointSlice: kube-proxy does not count it either).
    pub fn of(e: &DesiredError) -> Option<(Reason, &str)> {
        match e {
            DesiredError::MapFull { object, .. } | DesiredError::MapFullPartly { object, .. } => {
                Some((Reason::MapFull, object))
            }
            DesiredError::MaglevFull { object, .. } => Some((Reason::MaglevMapFull, object)),
            DesiredError::FrontendConflict { object, .. } => {
                Some((Reason::FrontendConflict, object))
            }
            DesiredError::TooManyBackends { object, .. } => Some((Reason::TooManyBackends, object)),
            DesiredError::Unsupported { object, .. } => Some((Reason::Unsupported, object)),
            DesiredError::NoIpv6 { object, .. } => Some((Reason::FamilyMissing, object)),
            DesiredError::NoEndpointSlice { .. } => None,
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A failing frontend: why, what the log said, since when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Failure {
    pub reason: Reason,
    pub message: String,
    pub since: SystemTime,
}

/// One frontend's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status<'a> {
    Programmed,
    Failed(&'a Failure),
}

/// A change of a frontend's status its Service's owner is told about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transition {
    /// `frontend` (its object name, `namespace/name:port (nodePort a.b.c.d)`) started
    /// failing, or fails for another reason now.
    Failed {
        service: ServiceRef,
        frontend: String,
        reason: Reason,
        message: String,
    },
    /// `frontend` no longer fails: it had failed for `reason` for `lasted`.
    Recovered {
        service: ServiceRef,
        frontend: String,
        reason: Reason,
        lasted: Duration,
    },
}

impl Transition {
    pub fn service(&self) -> &ServiceRef {
        match self {
            Transition::Failed { service, .. } | Transition::Recovered { service, .. } => service,
        }
    }
}

/// The failing frontends, by Service and frontend object name.
#[derive(Debug, Default)]
pub struct Statuses {
    failing: BTreeMap<ServiceRef, BTreeMap<String, Failure>>,
}

impl Statuses {
    /// Service `id`'s failures now (frontend object → reason and message) replace what was
    /// known of it, at `at`; its transitions are added to `out`. A Service that is gone
    /// (`exists` false) is forgotten without a word: there is no one left to tell.
    pub fn update(
        &mut self,
        id: &ServiceRef,
        now: BTreeMap<String, (Reason, String)>,
        exists: bool,
        at: SystemTime,
        out: &mut Vec<Transition>,
    ) {
        let before = match now.is_empty() {
            true => self.failing.remove(id).unwrap_or_default(),
            false => self.failing.get(id).cloned().unwrap_or_default(),
        };
        if !exists {
            self.failing.remove(id);
            return;
        }
        let mut kept = BTreeMap::new();
        for (frontend, (reason, message)) in now {
            let since = match before.get(&frontend) {
                Some(f) if f.reason == reason => f.since,
                _ => {
                    out.push(Transition::Failed {
                        service: id.clone(),
                        frontend: frontend.clone(),
                        reason,
                        message: message.clone(),
                    });
                    at
                }
            };
            let failure = Failure {
                reason,
                message,
                since,
            };
            kept.insert(frontend, failure);
        }
        for (frontend, f) in before {
            if !kept.contains_key(&frontend) {
                out.push(Transition::Recovered {
                    service: id.clone(),
                    frontend,
                    reason: f.reason,
                    lasted: at.duration_since(f.since).unwrap_or_default(),
                });
            }
        }
        if !kept.is_empty() {
            self.failing.insert(id.clone(), kept);
        }
    }

    /// The Services with a failing frontend.
    pub fn failing_services(&self) -> impl Iterator<Item = &ServiceRef> {
        self.failing.keys()
    }

    /// Every failing frontend: its Service, its object name, its failure.
    pub fn failing(&self) -> impl Iterator<Item = (&ServiceRef, &str, &Failure)> {
        self.failing
            .iter()
            .flat_map(|(id, f)| f.iter().map(move |(o, f)| (id, o.as_str(), f)))
    }

    /// Frontend `frontend` of Service `id`: failing, else programmed (once synced).
    pub fn status(&self, id: &ServiceRef, frontend: &str) -> Status<'_> {
        match self.failing.get(id).and_then(|f| f.get(frontend)) {
            Some(f) => Status::Failed(f),
            None => Status::Programmed,
        }
    }

    /// How many frontends fail, per reason (every reason, zeros included).
    pub fn counts(&self) -> BTreeMap<Reason, usize> {
        let mut counts: BTreeMap<Reason, usize> = Reason::ALL.iter().map(|r| (*r, 0)).collect();
        for (_, _, f) in self.failing() {
            *counts.entry(f.reason).or_default() += 1;
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str) -> ServiceRef {
        ServiceRef::new("t", name)
    }

    fn failing(entries: &[(&str, Reason, &str)]) -> BTreeMap<String, (Reason, String)> {
        entries
            .iter()
            .map(|(f, r, m)| (f.to_string(), (*r, m.to_string())))
            .collect()
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn a_failure_is_told_once_and_its_recovery_once() {
        let (mut s, web) = (Statuses::default(), svc("web"));
        let mut out = Vec::new();
        let full = failing(&[("t/web:http", Reason::MapFull, "map full (4 needed)")]);
        s.update(&web, full.clone(), true, at(10), &mut out);
        assert_eq!(
            out,
            [Transition::Failed {
                service: web.clone(),
                frontend: "t/web:http".into(),
                reason: Reason::MapFull,
                message: "map full (4 needed)".into(),
            }]
        );
        // The same failure at the next syncs (another message too): nothing to tell, and
        // it fails since the first.
        out.clear();
        s.update(&web, full, true, at(20), &mut out);
        let again = failing(&[("t/web:http", Reason::MapFull, "map full (5 needed)")]);
        s.update(&web, again, true, at(30), &mut out);
        assert_eq!(out, []);
        match s.status(&web, "t/web:http") {
            Status::Failed(f) => assert_eq!(
                (f.since, f.message.as_str()),
                (at(10), "map full (5 needed)")
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(s.counts()[&Reason::MapFull], 1);
        // Programmed: told once, with how long it failed; then nothing more.
        s.update(&web, BTreeMap::new(), true, at(70), &mut out);
        assert_eq!(
            out,
            [Transition::Recovered {
                service: web.clone(),
                frontend: "t/web:http".into(),
                reason: Reason::MapFull,
                lasted: Duration::from_secs(60),
            }]
        );
        out.clear();
        s.update(&web, BTreeMap::new(), true, at(80), &mut out);
        assert_eq!(out, []);
        assert_eq!(s.status(&web, "t/web:http"), Status::Programmed);
        assert!(s.counts().values().all(|n| *n == 0));
    }

    #[test]
    fn another_reason_is_a_new_failure_and_each_frontend_counts_alone() {
        let (mut s, web) = (Statuses::default(), svc("web"));
        let mut out = Vec::new();
        let both = failing(&[
            ("t/web:http", Reason::MapFull, "full"),
            ("t/web:http (nodePort 10.0.0.1)", Reason::MapFull, "full"),
        ]);
        s.update(&web, both, true, at(1), &mut out);
        assert_eq!(out.len(), 2);
        out.clear();
        let one = failing(&[("t/web:http", Reason::FrontendConflict, "taken")]);
        s.update(&web, one, true, at(2), &mut out);
        let reasons: Vec<(&str, Reason, bool)> = out
            .iter()
            .map(|t| match t {
                Transition::Failed {
                    frontend, reason, ..
                } => (frontend.as_str(), *reason, true),
                Transition::Recovered {
                    frontend, reason, ..
                } => (frontend.as_str(), *reason, false),
            })
            .collect();
        assert_eq!(
            reasons,
            [
                ("t/web:http", Reason::FrontendConflict, true),
                ("t/web:http (nodePort 10.0.0.1)", Reason::MapFull, false),
            ]
        );
        let counts = s.counts();
        assert_eq!(
            (counts[&Reason::MapFull], counts[&Reason::FrontendConflict]),
            (0, 1)
        );
    }

    #[test]
    fn a_deleted_service_is_forgotten_without_a_transition() {
        let (mut s, web) = (Statuses::default(), svc("web"));
        let mut out = Vec::new();
        s.update(
            &web,
            failing(&[("t/web:http", Reason::MapFull, "full")]),
            true,
            at(1),
            &mut out,
        );
        out.clear();
        s.update(&web, BTreeMap::new(), false, at(2), &mut out);
        assert_eq!(out, []);
        assert_eq!(s.failing().count(), 0);
        assert_eq!(s.failing_services().count(), 0);
    }

    #[test]
    fn problems_that_are_not_failures_are_not_counted() {
        let e = DesiredError::NoEndpointSlice {
            object: "t/web".into(),
        };
        assert_eq!(Reason::of(&e), None);
        let e = DesiredError::MapFull {
            object: "t/web:http".into(),
            map: "XLB_SVC",
            capacity: 16,
            needed: 4,
        };
        assert_eq!(Reason::of(&e), Some((Reason::MapFull, "t/web:http")));
    }
}
