//! Divergences aged against the grace period (kube-proxy's sync period: a change reaches
//! its rules and xlb's model at slightly different times, so a divergence only counts once
//! it has lasted longer), the report `xlb shadow report` prints, and the metrics.

use std::{
    collections::{BTreeSet, HashMap},
    fmt::Write as _,
    time::{Duration, Instant, SystemTime},
};

use prometheus_client::{
    encoding::prometheus_text,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use serde::{Deserialize, Serialize};

use super::compare::{Comparison, Divergence, Reason};

/// Rules kube-proxy writes that the tracer does not understand, listed in the report at
/// most (the rest are counted).
const NOT_UNDERSTOOD_LISTED: usize = 100;

/// A divergence in the report: how long it has lasted.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Reported {
    #[serde(flatten)]
    pub divergence: Divergence,
    /// Seconds since it was first seen.
    pub for_s: f64,
}

/// What `xlb shadow report` prints.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    /// When the last look was (seconds since the epoch).
    pub at_unix: f64,
    /// Looks taken since the agent started.
    pub looks: u64,
    pub grace_s: f64,
    /// kube-proxy's state found, per family.
    pub proxiers: Vec<String>,
    /// Frontend-origin pairs compared in the last look.
    pub compared: usize,
    /// Services with a divergence past the grace period.
    pub divergent_services: usize,
    /// Divergences past the grace period, by service.
    pub divergences: Vec<Reported>,
    /// Divergences seen, still within the grace period.
    pub pending: usize,
    /// kube-proxy's rules the tracer does not understand (at most 100 listed).
    pub not_understood: Vec<String>,
    pub not_understood_total: usize,
    /// Live state that could not be read or used.
    pub errors: Vec<String>,
}

impl Report {
    /// The report as text.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "shadow: {} look(s); the last compared {} frontend-origin pair(s); grace {}s",
            self.looks, self.compared, self.grace_s
        );
        if self.proxiers.is_empty() {
            let _ = writeln!(s, "kube-proxy: no state found on this node");
        }
        for p in &self.proxiers {
            let _ = writeln!(s, "kube-proxy {p}");
        }
        let _ = writeln!(
            s,
            "divergent services: {} ({} divergence(s) past the grace period, {} within it)",
            self.divergent_services,
            self.divergences.len(),
            self.pending
        );
        for r in &self.divergences {
            let d = &r.divergence;
            let _ = writeln!(
                s,
                "  {} {} from {}: {} for {:.0}s\n    xlb: {}\n    kube-proxy: {}",
                d.object,
                d.frontend,
                d.origin,
                d.reason.name(),
                r.for_s,
                d.xlb,
                d.kube_proxy
            );
        }
        if self.not_understood_total > 0 {
            let _ = writeln!(
                s,
                "kube-proxy rules not understood (not compared): {}",
                self.not_understood_total
            );
            for r in &self.not_understood {
                let _ = writeln!(s, "  {r}");
            }
        }
        for e in &self.errors {
            let _ = writeln!(s, "error: {e}");
        }
        s
    }
}

/// A divergence being watched.
struct Open {
    since: Instant,
    divergence: Divergence,
    /// It has been reported (past the grace period).
    reported: bool,
}

/// What one look changed, for the log.
#[derive(Debug, Default)]
pub struct Changes {
    /// Divergences that passed the grace period in this look.
    pub reported: Vec<Divergence>,
    /// Reported divergences that ended.
    pub ended: Vec<Divergence>,
}

/// Divergences by (object, frontend, origin), with when each was first seen.
pub struct Tracker {
    grace: Duration,
    open: HashMap<(String, String, String), Open>,
    looks: u64,
}

impl Tracker {
    pub fn new(grace: Duration) -> Self {
        Self {
            grace,
            open: HashMap::new(),
            looks: 0,
        }
    }

    /// Takes one look's comparison in at `now`; returns the report and what changed.
    pub fn update(&mut self, c: Comparison, now: Instant) -> (Report, Changes) {
        self.looks += 1;
        let mut changes = Changes::default();
        let seen: BTreeSet<_> = c.divergences.iter().map(Divergence::key).collect();
        self.open.retain(|k, o| {
            let keep = seen.contains(k);
            if !keep && o.reported {
                changes.ended.push(o.divergence.clone());
            }
            keep
        });
        for d in c.divergences {
            let o = self.open.entry(d.key()).or_insert_with(|| Open {
                since: now,
                divergence: d.clone(),
                reported: false,
            });
            o.divergence = d;
            if !o.reported && now.duration_since(o.since) >= self.grace {
                o.reported = true;
                changes.reported.push(o.divergence.clone());
            }
        }
        let mut divergences: Vec<Reported> = self
            .open
            .values()
            .filter(|o| o.reported)
            .map(|o| Reported {
                divergence: o.divergence.clone(),
                for_s: now.duration_since(o.since).as_secs_f64(),
            })
            .collect();
        divergences.sort_by_key(|a| a.divergence.key());
        let services: BTreeSet<&str> = divergences
            .iter()
            .map(|r| r.divergence.service.as_str())
            .collect();
        let report = Report {
            at_unix: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            looks: self.looks,
            grace_s: self.grace.as_secs_f64(),
            proxiers: c.proxiers,
            compared: c.compared,
            divergent_services: services.len(),
            pending: self.open.len() - divergences.len(),
            divergences,
            not_understood_total: c.not_understood.len(),
            not_understood: c
                .not_understood
                .into_iter()
                .take(NOT_UNDERSTOOD_LISTED)
                .collect(),
            errors: c.errors,
        };
        (report, changes)
    }
}

/// Shadow mode's metrics.
#[derive(Debug)]
pub struct ShadowMetrics {
    registry: Registry,
    divergent_services: Gauge,
    divergences: Family<[(&'static str, &'static str); 1], Gauge>,
    reported: Family<[(&'static str, &'static str); 1], Counter>,
    compared: Gauge,
    not_understood: Gauge,
    looks: Counter,
}

impl Default for ShadowMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ShadowMetrics {
    pub fn new() -> Self {
        let m = Self {
            registry: Registry::default(),
            divergent_services: Gauge::default(),
            divergences: Family::default(),
            reported: Family::default(),
            compared: Gauge::default(),
            not_understood: Gauge::default(),
            looks: Counter::default(),
        };
        let mut registry = Registry::default();
        registry.register(
            "xlb_shadow_divergent_services",
            "Services on which kube-proxy's live rules and xlb disagree past the grace period",
            m.divergent_services.clone(),
        );
        registry.register(
            "xlb_shadow_divergences",
            "Divergences past the grace period now, by reason",
            m.divergences.clone(),
        );
        registry.register(
            "xlb_shadow_divergences_reported",
            "Divergences that passed the grace period, by reason",
            m.reported.clone(),
        );
        registry.register(
            "xlb_shadow_compared_frontends",
            "Frontend-origin pairs the last look compared",
            m.compared.clone(),
        );
        registry.register(
            "xlb_shadow_not_understood_rules",
            "kube-proxy rules the tracer does not understand",
            m.not_understood.clone(),
        );
        registry.register(
            "xlb_shadow_looks",
            "Looks at kube-proxy's live state",
            m.looks.clone(),
        );
        for r in Reason::ALL {
            let _ = m.divergences.get_or_create(&[("reason", r.name())]);
            let _ = m.reported.get_or_create(&[("reason", r.name())]);
        }
        Self { registry, ..m }
    }

    /// Records one look.
    pub fn looked(&self, report: &Report, changes: &Changes) {
        self.looks.inc();
        self.divergent_services
            .set(report.divergent_services as i64);
        self.compared.set(report.compared as i64);
        self.not_understood.set(report.not_understood_total as i64);
        for r in Reason::ALL {
            let now = report
                .divergences
                .iter()
                .filter(|d| d.divergence.reason == r)
                .count();
            self.divergences
                .get_or_create(&[("reason", r.name())])
                .set(now as i64);
        }
        for d in &changes.reported {
            self.reported
                .get_or_create(&[("reason", d.reason.name())])
                .inc();
        }
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_text::encode(&mut out, &self.registry) {
            tracing::warn!("metrics: cannot encode: {e}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shadow::compare::Outcome;

    fn divergence(object: &str) -> Divergence {
        Divergence {
            service: object.split(':').next().unwrap_or_default().to_string(),
            object: object.to_string(),
            frontend: "10.96.0.1:80/TCP".into(),
            origin: "pod".into(),
            reason: Reason::BackendsDiffer,
            xlb: Outcome::Drop,
            kube_proxy: Outcome::Reject,
        }
    }

    #[test]
    fn a_divergence_is_reported_once_it_outlasts_the_grace_period_and_ends_when_it_goes() {
        let mut t = Tracker::new(Duration::from_secs(3));
        let t0 = Instant::now();
        let look = |ds: Vec<Divergence>| Comparison {
            divergences: ds,
            compared: 2,
            ..Comparison::default()
        };
        let (r, ch) = t.update(look(vec![divergence("ns/a:p")]), t0);
        assert_eq!((r.divergent_services, r.pending), (0, 1));
        assert!(ch.reported.is_empty());
        let (r, ch) = t.update(
            look(vec![divergence("ns/a:p")]),
            t0 + Duration::from_secs(3),
        );
        assert_eq!((r.divergent_services, r.pending), (1, 0));
        assert_eq!(ch.reported.len(), 1);
        let (_, ch) = t.update(
            look(vec![divergence("ns/a:p")]),
            t0 + Duration::from_secs(4),
        );
        assert!(ch.reported.is_empty(), "reported once");
        let (r, ch) = t.update(look(Vec::new()), t0 + Duration::from_secs(5));
        assert_eq!(r.divergent_services, 0);
        assert_eq!(ch.ended.len(), 1);
        let m = ShadowMetrics::new();
        m.looked(&r, &ch);
        assert!(m.render().contains("xlb_shadow_divergent_services 0"));
    }
}
