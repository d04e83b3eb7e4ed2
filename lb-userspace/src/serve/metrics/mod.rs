//! Prometheus metrics, in the text format (0.0.4) as `prometheus-client` writes it.
//!
//! By default node-level series only: kube-proxy's names where they mean the same (the sync
//! histograms and timestamps, the change counters, the health answers), the process's, and
//! xlb's own: the datapath's counters by reason, map fill levels and the conntrack tables.
//! Per-service series only with `--metrics-per-service` (at most its limit of service
//! ports, in name order); never per backend (`xlb list backends` has those).
//!
//! A scrape costs what its answer costs: the sync loop's numbers are kept as they happen;
//! the reason counters are one batched read of a per-CPU array of `R_COUNT` (29) slots; the fill of the maps
//! the agent writes is what its last sync left, that of the conntrack tables the collector's
//! last pass (`datapath::ct_gc`, off the request path), both cached between scrapes. Nothing
//! on the default scrape path grows with services or backends.

mod collect;
mod process;
mod status;

use std::{
    sync::{Arc, Mutex, atomic::AtomicU64},
    time::{Duration, SystemTime},
};

use prometheus_client::{
    encoding::prometheus_text,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use super::{Response, health::Health};
use crate::{
    datapath::{counts::Fill, ct_gc, names_file::ServiceNames, pins::Pins},
    desired::{Desired, Limits, Tally},
};

/// What the metrics show.
#[derive(Clone, Debug)]
pub struct MetricsOptions {
    /// The agent's pins (the datapath's counters are read from there).
    pub pins: Pins,
    /// Per-service series (`--metrics-per-service`).
    pub per_service: Option<PerServiceOptions>,
}

/// What the per-service series need.
#[derive(Clone, Debug)]
pub struct PerServiceOptions {
    /// At most this many service ports.
    pub limit: usize,
    /// The service ports' names, as the agent writes them.
    pub names: ServiceNames,
}

/// Sync histograms' buckets: 0.1 ms doubling to 13 s (kube-proxy's start at 1 ms; an
/// incremental sync of xlb's takes well under one).
fn sync_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

/// Network programming latency's buckets: 0.1 ms doubling to 105 s.
fn programming_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 21))
}

/// Series labelled by IP family only.
type ByFamily = [(&'static str, &'static str); 1];

/// The series the sync loop and the conntrack collector update.
#[derive(Debug, Clone)]
struct Series {
    duration: Histogram,
    full: Histogram,
    partial: Histogram,
    programming: Histogram,
    last: Gauge<f64, AtomicU64>,
    last_queued: Gauge<f64, AtomicU64>,
    service_changes: Counter,
    endpoint_changes: Counter,
    service_pending: Gauge,
    endpoint_pending: Gauge,
    errors: Counter,
    stale_udp_dropped: Counter,
    reconciled: Family<ByFamily, Histogram, fn() -> Histogram>,
    deleted: Family<ByFamily, Counter>,
    sysctls: Family<[(&'static str, &'static str); 2], Gauge>,
}

impl Series {
    fn new() -> Self {
        Self {
            duration: sync_buckets(),
            full: sync_buckets(),
            partial: sync_buckets(),
            programming: programming_buckets(),
            last: Gauge::default(),
            last_queued: Gauge::default(),
            service_changes: Counter::default(),
            endpoint_changes: Counter::default(),
            service_pending: Gauge::default(),
            endpoint_pending: Gauge::default(),
            errors: Counter::default(),
            stale_udp_dropped: Counter::default(),
            reconciled: Family::new_with_constructor(sync_buckets as fn() -> Histogram),
            deleted: Family::default(),
            sysctls: Family::default(),
        }
        .with_ipv4_conntrack()
    }

    /// The IPv4 conntrack series exist from the start (zero until the collector's first
    /// pass), as the other series do: a scrape before that pass finds them.
    fn with_ipv4_conntrack(self) -> Self {
        let label = [("ip_family", "IPv4")];
        drop(self.reconciled.get_or_create(&label));
        drop(self.deleted.get_or_create(&label));
        self
    }

    fn register(&self, r: &mut Registry) {
        r.register(
            "xlb_node_sysctl",
            "The kernel conntrack's settings in force after the agent's start, by sysctl and what the agent did (set; kept; left: asked 0; higher: above what was asked, not lowered; not-owned: the host's, and this is not its network namespace; missing: nf_conntrack not loaded; failed: the write was refused)",
            self.sysctls.clone(),
        );
        let p = "kubeproxy_sync_proxy_rules";
        r.register(
            format!("{p}_duration_seconds"),
            "SyncProxyRules latency in seconds: one sync, model to programmed BPF maps",
            self.duration.clone(),
        );
        r.register(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds of the full syncs (everything recomputed and diffed)",
            self.full.clone(),
        );
        r.register(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds of the incremental syncs (the changed services)",
            self.partial.clone(),
        );
        r.register(
            "kubeproxy_network_programming_duration_seconds",
            "In-cluster network programming latency in seconds: a change seen by the agent to programmed",
            self.programming.clone(),
        );
        r.register(
            format!("{p}_last_timestamp_seconds"),
            "The last time the maps were synced (Unix seconds)",
            self.last.clone(),
        );
        r.register(
            format!("{p}_last_queued_timestamp_seconds"),
            "The last time a change was queued for a sync (Unix seconds)",
            self.last_queued.clone(),
        );
        r.register(
            format!("{p}_service_changes"),
            "Cumulative Service changes",
            self.service_changes.clone(),
        );
        r.register(
            format!("{p}_endpoint_changes"),
            "Cumulative EndpointSlice changes",
            self.endpoint_changes.clone(),
        );
        r.register(
            format!("{p}_service_changes_pending"),
            "Pending Service changes",
            self.service_pending.clone(),
        );
        r.register(
            format!("{p}_endpoint_changes_pending"),
            "Pending EndpointSlice changes",
            self.endpoint_pending.clone(),
        );
        r.register(
            "xlb_sync_errors",
            "Objects or map writes a sync could not take",
            self.errors.clone(),
        );
        r.register(
            "xlb_stale_udp_dropped_pairs",
            "Frontend and endpoint pairs that went whose connected UDP sockets were not destroyed: more waited for the worker than its limit",
            self.stale_udp_dropped.clone(),
        );
        r.register(
            "kubeproxy_conntrack_reconciler_sync_duration_seconds",
            "Latency in seconds of one pass of xlb's assured conntrack collector over a family's table",
            self.reconciled.clone(),
        );
        r.register(
            "kubeproxy_conntrack_reconciler_deleted_entries",
            "Conntrack entries xlb's assured conntrack collector deleted (flows that are over)",
            self.deleted.clone(),
        );
    }
}

/// One sync as the loop saw it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Synced {
    pub took: Duration,
    /// Everything recomputed (else the changed services).
    pub full: bool,
    /// Since the oldest change it programmed arrived.
    pub programming: Option<Duration>,
    /// Service and EndpointSlice changes it took.
    pub services: u64,
    pub endpoints: u64,
    pub errors: u64,
}

/// The agent's metrics: what the sync loop records, and the registry a scrape encodes.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    series: Series,
    shared: Arc<collect::Shared>,
    /// Changes reported pending since the last sync (services, endpoint slices).
    pending: Mutex<(u64, u64)>,
    failing: status::Failing,
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Metrics {
    /// The metrics of an agent with pins in `opts.pins`; `health`'s answers are counted.
    pub fn new(opts: MetricsOptions, health: Option<Arc<Health>>) -> Self {
        let mut registry = Registry::default();
        let series = Series::new();
        series.register(&mut registry);
        let shared = Arc::new(collect::Shared::default());
        collect::register(&mut registry, &opts, &shared, health);
        let failing = status::Failing::default();
        failing.register(&mut registry);
        Self {
            registry,
            series,
            shared,
            pending: Mutex::new((0, 0)),
            failing,
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, (u64, u64)> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `services` Service and `endpoints` EndpointSlice changes wait for a sync (all of
    /// them since the last one): the counters take the new ones.
    pub fn queued(&self, services: u64, endpoints: u64) {
        let mut p = self.pending();
        let (new_svc, new_ep) = (services.saturating_sub(p.0), endpoints.saturating_sub(p.1));
        if new_svc + new_ep == 0 {
            return;
        }
        *p = (services, endpoints);
        let s = &self.series;
        s.service_changes.inc_by(new_svc);
        s.endpoint_changes.inc_by(new_ep);
        s.service_pending.set(services as i64);
        s.endpoint_pending.set(endpoints as i64);
        s.last_queued.set(now_unix());
    }

    /// A sync finished.
    pub fn synced(&self, sync: &Synced) {
        self.queued(sync.services, sync.endpoints);
        *self.pending() = (0, 0);
        let s = &self.series;
        s.service_pending.set(0);
        s.endpoint_pending.set(0);
        let took = sync.took.as_secs_f64();
        s.duration.observe(took);
        match sync.full {
            true => s.full.observe(took),
            false => s.partial.observe(took),
        }
        if let Some(p) = sync.programming {
            s.programming.observe(p.as_secs_f64());
        }
        s.errors.inc_by(sync.errors);
        s.last.set(now_unix());
    }

    /// `n` connected UDP pairs of removed backends were dropped: their sockets are not
    /// destroyed.
    pub fn stale_udp_dropped(&self, n: u64) {
        if n > 0 {
            self.series.stale_udp_dropped.inc_by(n);
        }
    }

    /// What is programmed after a sync: the fill of the maps the agent writes, from the
    /// maps' lengths and `tally`, `d`'s running totals (nothing here walks `d`: a sync of one
    /// change costs the same at 100,000 frontends).
    pub fn programmed(&self, d: &Desired, tally: Tally, limits: Limits) {
        use lb_common::{MAP_BACKEND, MAP_SLOT, MAP_SRC_RANGE, MAP_SRC_RANGE6, MAP_SVC};
        let fill = |entries: u64, capacity: u32| Fill { entries, capacity };
        let len = |n: usize| n as u64;
        let v6 = tally.src_ranges6;
        self.shared.set_programmed(vec![
            (MAP_SVC, fill(len(d.services.len()), limits.svc_entries)),
            // The slots the frontends' ranges take (a power of two each).
            (MAP_SLOT, fill(tally.slots, limits.slots)),
            (MAP_BACKEND, fill(len(d.backends.len()), limits.backends)),
            (
                MAP_SRC_RANGE,
                fill(
                    len(d.src_ranges.len()).saturating_sub(v6),
                    limits.src_ranges,
                ),
            ),
            (MAP_SRC_RANGE6, fill(v6, limits.src_ranges6)),
        ]);
    }

    /// The failing frontends by reason (its name), after a sync.
    pub fn failing(&self, counts: impl IntoIterator<Item = (&'static str, usize)>) {
        self.failing.set(counts);
    }

    /// One pass of the conntrack collector: the tables' fill, what it deleted, how long.
    pub fn conntrack(&self, pass: &ct_gc::Pass) {
        let families = [("IPv4", Some(pass.v4)), ("IPv6", pass.v6)];
        for (family, t) in families {
            let Some(t) = t else { continue };
            let label = [("ip_family", family)];
            self.series
                .reconciled
                .get_or_create(&label)
                .observe(t.took.as_secs_f64());
            self.series.deleted.get_or_create(&label).inc_by(t.deleted);
        }
        self.shared.set_conntrack(pass, now_unix());
    }

    /// What the agent's start did to the kernel conntrack's settings.
    pub fn node_sysctls(&self, applied: &[crate::datapath::sysctl::Applied]) {
        for a in applied {
            let Some(v) = a.value else { continue };
            let labels = [("sysctl", a.knob.name), ("outcome", a.outcome.label())];
            self.series
                .sysctls
                .get_or_create(&labels)
                .set(i64::try_from(v).unwrap_or(i64::MAX));
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

    /// `/metrics`.
    pub fn handle(&self, path: &str) -> Option<Response> {
        (path == "/metrics").then(|| {
            super::respond(
                super::StatusCode::OK,
                prometheus_text::CONTENT_TYPE,
                self.render(),
            )
        })
    }
}

#[cfg(test)]
mod tests;
