//! Health as kube-proxy reports it: healthy when the datapath was synced recently (or has
//! nothing waiting), `/healthz` also 503 while this node is being deleted; `/livez` ignores
//! node deletion.

use std::{
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use super::{Response, StatusCode};

/// What the sync loop tells the health endpoints.
#[derive(Debug)]
pub struct Health {
    inner: Mutex<State>,
    timeout: Duration,
    /// Answers given: `/healthz` 200 and 503, `/livez` 200 and 503.
    answered: [AtomicU64; 4],
}

/// Answers of one endpoint: (path, status code, how many).
pub type Answered = (&'static str, &'static str, u64);

#[derive(Debug, Default)]
struct State {
    last_synced: Option<(Instant, SystemTime)>,
    /// Oldest change that arrived and is not programmed yet.
    pending_since: Option<Instant>,
    node_deleting: bool,
}

impl Health {
    /// `timeout`: how long a change may wait for its sync before the agent counts as unhealthy.
    pub fn new(timeout: Duration) -> Self {
        Self {
            inner: Mutex::new(State::default()),
            timeout,
            answered: Default::default(),
        }
    }

    /// How many times each endpoint answered each status (kube-proxy's
    /// `kubeproxy_proxy_healthz_total{code}` and `kubeproxy_proxy_livez_total{code}`).
    pub fn answered(&self) -> [Answered; 4] {
        let n = |i: usize| self.answered[i].load(Ordering::Relaxed);
        [
            ("/healthz", "200", n(0)),
            ("/healthz", "503", n(1)),
            ("/livez", "200", n(2)),
            ("/livez", "503", n(3)),
        ]
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A change arrived from the source.
    pub fn queued(&self) {
        let mut s = self.state();
        s.pending_since.get_or_insert_with(Instant::now);
    }

    /// Everything that arrived has been programmed.
    pub fn synced(&self) {
        let mut s = self.state();
        s.last_synced = Some((Instant::now(), SystemTime::now()));
        s.pending_since = None;
    }

    /// This node has a deletion timestamp (or is being drained for deletion).
    pub fn set_node_deleting(&self, deleting: bool) {
        self.state().node_deleting = deleting;
    }

    /// Synced, with no change waiting too long (what health-check node ports also require).
    pub fn is_healthy(&self) -> bool {
        let s = self.state();
        self.healthy(&s).is_ok()
    }

    fn healthy(&self, s: &State) -> Result<(), String> {
        match (s.last_synced, s.pending_since) {
            (None, _) => Err("not synced yet".into()),
            (_, Some(since)) if since.elapsed() > self.timeout => Err(format!(
                "a change has waited {:.1}s for its sync (limit {:.1}s)",
                since.elapsed().as_secs_f64(),
                self.timeout.as_secs_f64()
            )),
            _ => Ok(()),
        }
    }

    fn render(&self, check_node: bool) -> Response {
        let s = self.state();
        let last = s
            .last_synced
            .and_then(|(_, t)| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0.0, |d| d.as_secs_f64());
        let verdict = self.healthy(&s).and_then(|()| {
            if check_node && s.node_deleting {
                Err("node is being deleted".into())
            } else {
                Ok(())
            }
        });
        let slot = usize::from(!check_node) * 2 + usize::from(verdict.is_err());
        self.answered[slot].fetch_add(1, Ordering::Relaxed);
        let body = |ok: bool, why: &str| {
            format!("{{\"healthy\": {ok}, \"lastUpdated\": {last:.3}, \"message\": {why:?}}}\n")
        };
        match verdict {
            Ok(()) => super::json(StatusCode::OK, body(true, "")),
            Err(why) => super::json(StatusCode::SERVICE_UNAVAILABLE, body(false, &why)),
        }
    }

    /// `/healthz` and `/livez`.
    pub fn handle(&self, path: &str) -> Option<Response> {
        match path {
            "/healthz" => Some(self.render(true)),
            "/livez" => Some(self.render(false)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthz_follows_syncs_and_node_deletion() {
        let h = Health::new(Duration::from_millis(50));
        assert_eq!(
            h.handle("/healthz").map(|r| r.status()),
            Some(StatusCode::SERVICE_UNAVAILABLE)
        );
        h.synced();
        assert_eq!(
            h.handle("/healthz").map(|r| r.status()),
            Some(StatusCode::OK)
        );
        h.queued();
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(
            h.handle("/livez").map(|r| r.status()),
            Some(StatusCode::SERVICE_UNAVAILABLE)
        );
        h.synced();
        h.set_node_deleting(true);
        assert_eq!(
            h.handle("/healthz").map(|r| r.status()),
            Some(StatusCode::SERVICE_UNAVAILABLE)
        );
        assert_eq!(h.handle("/livez").map(|r| r.status()), Some(StatusCode::OK));
        assert!(h.handle("/other").is_none());
        assert_eq!(
            h.answered(),
            [
                ("/healthz", "200", 1),
                ("/healthz", "503", 2),
                ("/livez", "200", 1),
                ("/livez", "503", 1),
            ]
        );
    }
}
