//! `xlb agent --shadow`: the source into the model as the agent does, but no program is
//! loaded, no map or rule written. Every interval it reads kube-proxy's live state of both
//! families, compares (`crate::shadow`), logs what passed the grace period or ended, and
//! writes the report (`xlb shadow report` prints it) and the metrics.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tracing::{info, warn};

use super::{AgentError, AgentOptions, STOP_CHECK, State, feed, feed::Wake, node_port_addresses};
use crate::{
    datapath::netfilter::{self, LiveText},
    desired::NodeContext,
    model::IpFamily,
    serve::{self, health::Health},
    shadow::{
        self,
        report::{Report, ShadowMetrics, Tracker},
    },
};

/// How shadow mode looks and reports.
#[derive(Clone, Debug)]
pub struct ShadowOptions {
    /// How often kube-proxy's state is read and compared.
    pub interval: Duration,
    /// How long a divergence lasts before it is reported (kube-proxy's sync period).
    pub grace: Duration,
    /// Where the report is written (JSON; `xlb shadow report` reads it).
    pub report: PathBuf,
}

/// Runs shadow mode until `stop` is set.
pub(super) fn run(
    opts: &AgentOptions,
    shadow: &ShadowOptions,
    stop: &AtomicBool,
) -> Result<(), AgentError> {
    info!(
        interval = ?shadow.interval,
        grace = ?shadow.grace,
        report = %shadow.report.display(),
        "shadow mode: nothing is loaded, attached or changed; kube-proxy's live rules are compared with what xlb would do"
    );
    let health = Arc::new(Health::new(
        Duration::from_secs(10).max(shadow.interval * 3),
    ));
    let metrics = Arc::new(ShadowMetrics::new());
    let last = Arc::new(Mutex::new(Report::default()));
    serve_shadow(opts, &health, &metrics, &last)?;
    let (wake, _) = feed::start(&opts.source, opts.poll);
    let mut state = State::default();
    let mut tracker = Tracker::new(shadow.grace);
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if state.ready && Instant::now() >= next {
            let report = look(opts, &state, &mut tracker, &metrics);
            // The next look an interval after this one ended: a look that takes longer
            // than the interval (a debug build at 10,000 services) never runs back to back.
            next = Instant::now() + shadow.interval;
            write_report(&shadow.report, &report);
            *last.lock().unwrap_or_else(|p| p.into_inner()) = report;
            health.synced();
        }
        let timeout = STOP_CHECK.min(next.saturating_duration_since(Instant::now()));
        let first = match wake.recv_timeout(timeout) {
            Ok(w) => w,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(AgentError::SourceStopped);
            }
        };
        for w in std::iter::once(first).chain(std::iter::from_fn(|| wake.try_recv().ok())) {
            match w {
                Wake::Source(t) => {
                    state.take(t, &health);
                }
                Wake::SourceEnded(Some(e)) => return Err(e.into()),
                Wake::SourceEnded(None) => return Err(AgentError::SourceStopped),
                Wake::Links | Wake::Addresses | Wake::Routing => {}
            }
        }
    }
    info!("shadow mode stopping");
    Ok(())
}

/// One look: kube-proxy's state read, compared, aged; the changes logged.
fn look(
    opts: &AgentOptions,
    state: &State,
    tracker: &mut Tracker,
    metrics: &ShadowMetrics,
) -> Report {
    let started = Instant::now();
    let node = NodeContext::new(
        &opts.node.name,
        &node_port_addresses(&opts.node, &opts.interfaces),
        false,
    );
    let ipvs = netfilter::read_ipvs();
    let mut read_errors = Vec::new();
    let texts: Vec<(IpFamily, LiveText)> = [IpFamily::V4, IpFamily::V6]
        .into_iter()
        .map(|f| {
            let (text, errors) = netfilter::read_kube_proxy_state(f);
            read_errors.extend(errors.into_iter().map(|e| e.to_string()));
            (f, text)
        })
        .collect();
    let refs: Vec<(IpFamily, &LiveText)> = texts.iter().map(|(f, t)| (*f, t)).collect();
    let mut c = shadow::look(&state.model, &node, &refs, ipvs.as_deref());
    c.errors.extend(read_errors);
    let (report, changes) = tracker.update(c, Instant::now());
    for d in &changes.reported {
        warn!(
            service = %d.service,
            object = %d.object,
            frontend = %d.frontend,
            origin = %d.origin,
            reason = d.reason.name(),
            xlb = %d.xlb,
            kube_proxy = %d.kube_proxy,
            "shadow: kube-proxy and xlb disagree"
        );
    }
    for d in &changes.ended {
        info!(object = %d.object, frontend = %d.frontend, reason = d.reason.name(), "shadow: divergence ended");
    }
    for e in &report.errors {
        warn!("shadow: {e}");
    }
    metrics.looked(&report, &changes);
    tracing::debug!(
        took = ?started.elapsed(),
        compared = report.compared,
        divergent_services = report.divergent_services,
        "shadow: looked"
    );
    report
}

/// Writes the report atomically (a temporary file renamed over it).
fn write_report(path: &Path, report: &Report) {
    let write = || -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension("tmp");
        let json = serde_json::to_vec_pretty(report).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, json)?;
        std::fs::rename(&tmp, path)
    };
    if let Err(e) = write() {
        warn!(path = %path.display(), "shadow: cannot write the report: {e}");
    }
}

/// `/healthz` and `/livez`; `/metrics` and `/shadow` (the report, JSON) on the metrics
/// address.
fn serve_shadow(
    opts: &AgentOptions,
    health: &Arc<Health>,
    metrics: &Arc<ShadowMetrics>,
    last: &Arc<Mutex<Report>>,
) -> Result<(), AgentError> {
    if let Some(addr) = opts.servers.healthz_addr {
        let h = health.clone();
        let bound = serve::spawn(addr, serve::Pool::Health, move |path| h.handle(path))?;
        info!(%bound, "serving /healthz and /livez");
    }
    if let Some(addr) = opts.servers.metrics_addr {
        let (m, last) = (metrics.clone(), last.clone());
        let bound = serve::spawn(addr, serve::Pool::Metrics, move |path| match path {
            "/metrics" => Some(serve::respond(
                serve::StatusCode::OK,
                prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
                m.render(),
            )),
            "/shadow" => {
                let r = last.lock().unwrap_or_else(|p| p.into_inner());
                let body = serde_json::to_string_pretty(&*r).unwrap_or_default();
                Some(serve::json(serve::StatusCode::OK, body))
            }
            _ => None,
        })?;
        info!(%bound, "serving /metrics and /shadow");
    }
    Ok(())
}
