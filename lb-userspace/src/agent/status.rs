//! The frontends' status told: each transition of a sync logged, the failing frontends
//! written beside the pins for `xlb list services` (`datapath::status_file`), and with
//! the Kubernetes source each transition an Event on its Service
//! (`source::kube::recorder`); the file source has no API server, its status shows in the
//! log, `xlb list services` and `/metrics`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use tracing::{info, warn};

use super::SourceSpec;
use crate::{
    datapath::status_file::{self, Failing},
    model::{Model, ServiceRef, Uid},
    reconcile::{Reason, Statuses, Transition},
    source::kube::recorder::{Events, Notice, PROGRAMMED},
};

/// An Event's note is at most 1 kB (the API server refuses more).
const NOTE_MAX: usize = 1024;

impl Drop for Told {
    fn drop(&mut self) {
        self.remove_file();
    }
}

/// Where transitions go.
pub(super) struct Told {
    events: Option<Events>,
    /// The pin directory (its status file).
    pins: PathBuf,
}

impl Told {
    /// Events are written with the Kubernetes source; the status file of `pins` starts
    /// empty (nothing failed yet).
    pub(super) fn start(source: &SourceSpec, pins: &Path) -> Self {
        let events = match source {
            SourceSpec::Kubernetes(opts) => Some(Events::new(opts)),
            SourceSpec::File(_) => None,
        };
        let told = Self {
            events,
            pins: pins.to_path_buf(),
        };
        told.write_file(&Statuses::default());
        told
    }

    /// The failing frontends, for `xlb list services`.
    fn write_file(&self, statuses: &Statuses) {
        let unix = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        };
        let failing: Vec<Failing> = statuses
            .failing()
            .map(|(service, frontend, f)| Failing {
                service: service.to_string(),
                frontend: frontend.to_string(),
                reason: f.reason.name().to_string(),
                message: f.message.clone(),
                since: unix(f.since),
            })
            .collect();
        if let Err(e) = status_file::write(&self.pins, &failing) {
            let path = status_file::path(&self.pins);
            warn!(
                "cannot write {}: {e}; `xlb list services` does not show the failing frontends",
                path.display()
            );
        }
    }

    /// The status file goes when the agent does (an agent killed leaves it: the next one
    /// at the pins rewrites it at start, `xlb cleanup` removes it).
    fn remove_file(&self) {
        if let Err(e) = status_file::remove(&self.pins) {
            let path = status_file::path(&self.pins);
            warn!("cannot remove {}: {e}", path.display());
        }
    }

    /// A sync's transitions, logged, in the status file and (with an API server) written
    /// as Events; nothing when there are none.
    pub(super) fn tell(&mut self, transitions: &[Transition], statuses: &Statuses, model: &Model) {
        if transitions.is_empty() {
            return;
        }
        self.write_file(statuses);
        for t in transitions {
            match t {
                Transition::Failed {
                    service,
                    frontend,
                    reason,
                    ..
                } => warn!(%service, frontend, %reason, "frontend failing"),
                Transition::Recovered {
                    service,
                    frontend,
                    reason,
                    lasted,
                } => info!(
                    %service,
                    frontend,
                    %reason,
                    failed_for_s = lasted.as_secs(),
                    "frontend programmed after failing"
                ),
            }
        }
        let Some(events) = &mut self.events else {
            return;
        };
        let uid = |id: &_| model.services.get(id).and_then(|s| s.uid);
        for n in notices(transitions, uid) {
            events.tell(n);
        }
    }
}

/// A sync's transitions as Events: one per Service, kind (failure or recovery) and
/// reason, naming every frontend it is about. `uid` gives a Service's uid.
pub fn notices(
    transitions: &[Transition],
    uid: impl Fn(&ServiceRef) -> Option<Uid>,
) -> Vec<Notice> {
    let mut grouped: BTreeMap<(&ServiceRef, bool, Reason), Vec<String>> = BTreeMap::new();
    for t in transitions {
        let (warning, reason, line) = match t {
            Transition::Failed {
                reason, message, ..
            } => (true, *reason, message.clone()),
            Transition::Recovered {
                frontend,
                reason,
                lasted,
                ..
            } => {
                let lasted = humantime(*lasted);
                let line = format!("{frontend} is programmed (it was not for {lasted}: {reason})");
                (false, *reason, line)
            }
        };
        grouped
            .entry((t.service(), warning, reason))
            .or_default()
            .push(line);
    }
    grouped
        .into_iter()
        .map(|((service, warning, reason), lines)| Notice {
            service: service.clone(),
            uid: uid(service),
            warning,
            reason: match warning {
                true => reason.name(),
                false => PROGRAMMED,
            },
            note: truncate(lines.join("; ")),
        })
        .collect()
}

/// `1m30s`-like, to the second.
fn humantime(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, _) => format!("{h}h{m}m"),
    }
}

/// At most [`NOTE_MAX`] bytes, cut at a character.
fn truncate(mut note: String) -> String {
    if note.len() > NOTE_MAX {
        let mut end = NOTE_MAX - 3;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push_str("...");
    }
    note
}

/// Every reason's count of failing frontends (zeros too), for `/metrics`.
pub(super) fn counts(s: &Statuses) -> impl Iterator<Item = (&'static str, usize)> {
    s.counts().into_iter().map(|(r, n)| (r.name(), n))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str) -> ServiceRef {
        ServiceRef::new("t", name)
    }

    #[test]
    fn one_event_per_service_and_reason_naming_each_frontend() {
        let failed = |s: &str, f: &str, r| Transition::Failed {
            service: svc(s),
            frontend: f.into(),
            reason: r,
            message: format!("Service {f}: broken"),
        };
        let t = [
            failed("web", "t/web:http", Reason::MapFull),
            failed("web", "t/web:http (nodePort 10.0.0.1)", Reason::MapFull),
            failed("api", "t/api:p", Reason::FrontendConflict),
            Transition::Recovered {
                service: svc("web"),
                frontend: "t/web:dns".into(),
                reason: Reason::WriteFailed,
                lasted: Duration::from_secs(95),
            },
        ];
        let uid = Uid::from(7);
        let n = notices(&t, |s| (s.name.as_ref() == "web").then_some(uid));
        let shown: Vec<(&str, bool, &str, &str, Option<Uid>)> = n
            .iter()
            .map(|n| {
                (
                    n.service.name.as_ref(),
                    n.warning,
                    n.reason,
                    n.note.as_str(),
                    n.uid,
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                (
                    "api",
                    true,
                    "FrontendConflict",
                    "Service t/api:p: broken",
                    None
                ),
                (
                    "web",
                    false,
                    "Programmed",
                    "t/web:dns is programmed (it was not for 1m35s: WriteFailed)",
                    Some(uid)
                ),
                (
                    "web",
                    true,
                    "MapFull",
                    "Service t/web:http: broken; Service t/web:http (nodePort 10.0.0.1): broken",
                    Some(uid)
                ),
            ]
        );
    }

    #[test]
    fn a_note_is_cut_at_a_kilobyte() {
        let long = truncate("é".repeat(1000));
        assert!(
            long.len() <= NOTE_MAX && long.ends_with("..."),
            "{}",
            long.len()
        );
    }
}
