//! Prometheus metrics: kube-proxy's names where they mean the same, and xlb's own from the
//! datapath's per-CPU counters and maps.

use std::{
    fmt::Write as _,
    path::PathBuf,
    sync::Mutex,
    time::{Duration, SystemTime},
};

use super::Response;
use crate::list;

/// Buckets (seconds) of kube-proxy's sync histograms.
const BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

#[derive(Debug, Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, d: Duration) {
        let v = d.as_secs_f64();
        for (c, b) in self.counts.iter_mut().zip(BUCKETS) {
            if v <= b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (c, b) in self.counts.iter().zip(BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", self.sum, self.count);
    }
}

#[derive(Debug, Default)]
struct State {
    sync: Histogram,
    programming: Histogram,
    last_sync: f64,
    service_changes_total: u64,
    endpoint_changes_total: u64,
    service_changes_pending: u64,
    endpoint_changes_pending: u64,
    sync_errors_total: u64,
}

/// Metrics the sync loop records; the datapath's counters are read at scrape time.
#[derive(Debug)]
pub struct Metrics {
    inner: Mutex<State>,
    pins: PathBuf,
}

impl Metrics {
    pub fn new(pins: PathBuf) -> Self {
        Self {
            inner: Mutex::new(State::default()),
            pins,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes that arrived and wait for a sync.
    pub fn queued(&self, services: u64, endpoints: u64) {
        let mut s = self.state();
        s.service_changes_pending += services;
        s.endpoint_changes_pending += endpoints;
    }

    /// A sync finished after `took`; its oldest change arrived `programming` ago.
    pub fn synced(&self, took: Duration, programming: Option<Duration>, errors: u64) {
        let mut s = self.state();
        s.sync.observe(took);
        if let Some(p) = programming {
            s.programming.observe(p);
        }
        s.last_sync = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        s.service_changes_total += std::mem::take(&mut s.service_changes_pending);
        s.endpoint_changes_total += std::mem::take(&mut s.endpoint_changes_pending);
        s.sync_errors_total += errors;
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        {
            let s = self.state();
            s.sync.render(
                &mut out,
                "kubeproxy_sync_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds (model to programmed BPF maps)",
            );
            s.programming.render(
                &mut out,
                "kubeproxy_network_programming_duration_seconds",
                "In-cluster network programming latency in seconds (change seen to programmed)",
            );
            let gauges = [
                (
                    "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
                    "gauge",
                    "The last time the maps were synced",
                    s.last_sync,
                ),
                (
                    "kubeproxy_sync_proxy_rules_service_changes_pending",
                    "gauge",
                    "Pending service changes",
                    s.service_changes_pending as f64,
                ),
                (
                    "kubeproxy_sync_proxy_rules_service_changes_total",
                    "counter",
                    "Cumulative service changes",
                    s.service_changes_total as f64,
                ),
                (
                    "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                    "gauge",
                    "Pending endpoint changes",
                    s.endpoint_changes_pending as f64,
                ),
                (
                    "kubeproxy_sync_proxy_rules_endpoint_changes_total",
                    "counter",
                    "Cumulative endpoint changes",
                    s.endpoint_changes_total as f64,
                ),
                (
                    "xlb_sync_errors_total",
                    "counter",
                    "Objects or map writes a sync could not take",
                    s.sync_errors_total as f64,
                ),
            ];
            for (name, kind, help, v) in gauges {
                let _ = writeln!(
                    out,
                    "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
                );
            }
        }
        self.render_datapath(&mut out);
        out
    }

    fn render_datapath(&self, out: &mut String) {
        if let Ok(rows) = list::counters(&self.pins) {
            let by_reason = |v: fn(&list::CounterRow) -> u64| {
                rows.iter()
                    .map(move |r| (format!("reason=\"{}\"", r.reason), v(r)))
            };
            family(
                out,
                "xlb_datapath_packets_total",
                "counter",
                "Packets by datapath verdict reason",
                by_reason(|r| r.packets),
            );
            family(
                out,
                "xlb_datapath_bytes_total",
                "counter",
                "Bytes by datapath verdict reason",
                by_reason(|r| r.bytes),
            );
        }
        if let Ok(rows) = list::services(&self.pins) {
            let by_service = |v: fn(&list::ServiceRow) -> u64| {
                rows.iter().map(move |r| {
                    (
                        format!("service=\"{}\",frontend=\"{}\"", r.service, r.frontend),
                        v(r),
                    )
                })
            };
            family(
                out,
                "xlb_service_packets_total",
                "counter",
                "Packets forwarded for a service frontend, both directions",
                by_service(|r| r.packets),
            );
            family(
                out,
                "xlb_service_bytes_total",
                "counter",
                "Bytes forwarded for a service frontend, both directions",
                by_service(|r| r.bytes),
            );
            family(
                out,
                "xlb_service_backends",
                "gauge",
                "Backends a service frontend balances over",
                by_service(|r| r.backends.len() as u64),
            );
        }
        if let Ok(rows) = list::backends(&self.pins) {
            let by_backend = |v: fn(&list::BackendRow) -> u64| {
                rows.iter()
                    .map(move |r| (format!("backend=\"{}\"", r.backend), v(r)))
            };
            family(
                out,
                "xlb_backend_packets_total",
                "counter",
                "Packets forwarded to and from a backend",
                by_backend(|r| r.packets),
            );
            family(
                out,
                "xlb_backend_bytes_total",
                "counter",
                "Bytes forwarded to and from a backend",
                by_backend(|r| r.bytes),
            );
        }
        if let Ok(maps) = list::map_usage(&self.pins) {
            let by_map = |v: fn(&list::MapUsage) -> u64| {
                maps.iter()
                    .map(move |m| (format!("map=\"{}\"", m.map), v(m)))
            };
            family(
                out,
                "xlb_map_entries",
                "gauge",
                "Entries in a pinned map",
                by_map(|m| m.entries),
            );
            family(
                out,
                "xlb_map_capacity",
                "gauge",
                "Capacity (max_entries) of a pinned map",
                by_map(|m| m.capacity.into()),
            );
        }
    }

    /// `/metrics`.
    pub fn handle(&self, path: &str) -> Option<Response> {
        (path == "/metrics").then(|| Response {
            status: "200 OK",
            content_type: "text/plain; version=0.0.4",
            headers: Vec::new(),
            body: self.render(),
        })
    }
}

/// One metric family: its HELP and TYPE lines, then one sample per (labels, value).
fn family(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    samples: impl Iterator<Item = (String, u64)>,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, v) in samples {
        let _ = writeln!(out, "{name}{{{labels}}} {v}");
    }
}
