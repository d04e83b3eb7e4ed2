//! Kubernetes Events on a Service whose frontend fails to program or recovers, so that its
//! owner sees it in `kubectl describe service` (kube-proxy, Cilium and Calico only log it).
//!
//! The agent makes the reconciler's transitions of one sync at most one [`Notice`] per
//! Service and reason: a `Warning` with the reason and the log's message, or a `Normal`
//! `Programmed` saying which frontend recovered from what. A Service that stays broken
//! has no transition, and a healthy one none at all: nothing is written per sync.
//!
//! They are written as the kubelet's are, off the sync loop: on a thread of their own,
//! started at the first Event (a bounded queue; a full queue drops the Event, it never
//! blocks a sync) through
//! kube-rs's [`Recorder`] (events.k8s.io/v1), which de-duplicates as client-go's does: the
//! same Event again within 6 minutes patches the first one's `series` (count, last seen)
//! instead of creating another. And as client-go's spam filter, each Service gets a burst
//! of [`BURST`] Events, then one per [`REFILL`]; over all Services the node writes at most
//! [`NODE_QPS`] a second after a burst of [`NODE_BURST`] ([`Pace`]: a failure on every
//! node, a full map cluster-wide, must not flood the API server).

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::KubeOptions;
use crate::model::{ServiceRef, Uid};

/// Events a Service may get at once (client-go's `defaultSpamBurst`).
pub const BURST: f64 = 25.0;
/// Then one per this long (client-go's `defaultSpamQPS`, 1/300).
pub const REFILL: Duration = Duration::from_secs(300);
/// Events waiting to be written before new ones are dropped.
const QUEUE: usize = 1024;
/// Events this node writes a second, whatever the Services (a failure on every node, such
/// as a full map cluster-wide, is written once per node and Service): the kubelet's
/// `eventRecordQPS` is 50, a tenth of it here.
pub const NODE_QPS: f64 = 5.0;
/// Events this node may write at once before [`NODE_QPS`] paces them.
pub const NODE_BURST: f64 = 25.0;
/// The reason of a recovery.
pub const PROGRAMMED: &str = "Programmed";
/// The action every Event names.
pub const ACTION: &str = "ProgramFrontends";

/// One Event to write on a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub service: ServiceRef,
    pub uid: Option<Uid>,
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

/// A token bucket per Service (client-go's `EventSourceObjectSpamFilter`).
#[derive(Debug, Default)]
pub struct SpamFilter {
    buckets: HashMap<ServiceRef, (f64, Instant)>,
}

impl SpamFilter {
    /// May `service` get an Event at `now`? Takes a token when it may.
    pub fn allow(&mut self, service: &ServiceRef, now: Instant) -> bool {
        if self.buckets.len() > 4096 {
            // Full buckets are as good as none.
            self.buckets.retain(|_, (tokens, at)| {
                *tokens + now.duration_since(*at).as_secs_f64() / REFILL.as_secs_f64() < BURST
            });
        }
        let (tokens, at) = self.buckets.entry(service.clone()).or_insert((BURST, now));
        *tokens =
            (*tokens + now.duration_since(*at).as_secs_f64() / REFILL.as_secs_f64()).min(BURST);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The writer's pace over every Service: a token bucket of [`NODE_BURST`] refilled at
/// [`NODE_QPS`]; what waits stays in the bounded queue.
#[derive(Debug)]
pub struct Pace {
    tokens: f64,
    at: Instant,
}

impl Pace {
    pub fn new(now: Instant) -> Self {
        Self {
            tokens: NODE_BURST,
            at: now,
        }
    }

    /// How long to wait from `now` before the next Event; takes its token.
    pub fn take(&mut self, now: Instant) -> Duration {
        let refill = now.saturating_duration_since(self.at).as_secs_f64() * NODE_QPS;
        self.tokens = (self.tokens + refill).min(NODE_BURST) - 1.0;
        self.at = now;
        match self.tokens >= 0.0 {
            true => Duration::ZERO,
            false => Duration::from_secs_f64(-self.tokens / NODE_QPS),
        }
    }
}

/// Where the agent hands its Events: a queue to the writer's thread, started at the first
/// Event (a cluster where every frontend programs never pays for its client).
pub struct Events {
    opts: KubeOptions,
    tx: Option<mpsc::Sender<Notice>>,
    dropped: u64,
}

impl Events {
    /// Events for the API server of `opts`, reported as `xlb` on this node.
    pub fn new(opts: &KubeOptions) -> Events {
        Events {
            opts: opts.clone(),
            tx: None,
            dropped: 0,
        }
    }

    /// The writer on a thread of its own (its own client to the API server).
    fn spawn(opts: KubeOptions) -> std::io::Result<mpsc::Sender<Notice>> {
        let (tx, rx) = mpsc::channel(QUEUE);
        std::thread::Builder::new()
            .name("xlb-events".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => return warn!("Events are not written: {e}"),
                };
                rt.block_on(write(opts, rx));
            })?;
        Ok(tx)
    }

    /// Queues `n` (the writer started at the first); dropped, and counted in the log,
    /// when the queue is full or the writer cannot start.
    pub fn tell(&mut self, n: Notice) {
        if self.tx.is_none() {
            match Self::spawn(self.opts.clone()) {
                Ok(tx) => self.tx = Some(tx),
                Err(e) => {
                    warn!("cannot start the Event writer: {e}; failing frontends are only logged")
                }
            }
        }
        let sent = match &self.tx {
            Some(tx) => tx.try_send(n).map_err(|e| e.to_string()),
            None => Err("no writer".to_string()),
        };
        if let Err(e) = sent {
            self.dropped += 1;
            if self.dropped.is_power_of_two() {
                warn!(dropped = self.dropped, "an Event is not written: {e}");
            }
        }
    }
}

/// The writer: each notice through the spam filter and the recorder, in order.
async fn write(opts: KubeOptions, mut rx: mpsc::Receiver<Notice>) {
    let client = match super::client(&opts).await {
        Ok(c) => c,
        Err(e) => return warn!("Events are not written: {e}"),
    };
    let reporter = Reporter {
        controller: "xlb".into(),
        instance: Some(opts.node_name.clone()),
    };
    let recorder = Recorder::new(client, reporter);
    let mut spam = SpamFilter::default();
    let mut pace = Pace::new(Instant::now());
    while let Some(n) = rx.recv().await {
        if !spam.allow(&n.service, Instant::now()) {
            debug!(service = %n.service, reason = n.reason, "Event dropped: too many for this Service");
            continue;
        }
        let wait = pace.take(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        let event = Event {
            type_: match n.warning {
                true => EventType::Warning,
                false => EventType::Normal,
            },
            reason: n.reason.into(),
            note: Some(n.note),
            action: ACTION.into(),
            secondary: None,
        };
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Service".into()),
            namespace: Some(n.service.namespace.to_string()),
            name: Some(n.service.name.to_string()),
            uid: n.uid.map(|u| u.to_string()),
            ..ObjectReference::default()
        };
        match recorder.publish(&event, &regarding).await {
            Ok(()) => info!(service = %n.service, reason = n.reason, "Event written"),
            Err(e) => warn!(service = %n.service, reason = n.reason, "cannot write an Event: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str) -> ServiceRef {
        ServiceRef::new("t", name)
    }

    #[test]
    fn the_node_writes_a_burst_then_paces_every_service_together() {
        let t0 = Instant::now();
        let mut pace = Pace::new(t0);
        for _ in 0..NODE_BURST as usize {
            assert_eq!(pace.take(t0), Duration::ZERO);
        }
        let per = Duration::from_secs_f64(1.0 / NODE_QPS);
        let wait = pace.take(t0);
        assert!(wait > per * 9 / 10 && wait < per * 11 / 10, "{wait:?}");
        // A thousand Events at once: the last waits a thousand tokens' refill, less the burst.
        let mut last = Duration::ZERO;
        for _ in 0..1000 {
            last = pace.take(t0);
        }
        let expect = per * 1001;
        assert!(
            last > expect * 99 / 100 && last < expect * 101 / 100,
            "{last:?}"
        );
        // After a quiet while the burst is back.
        let later = t0 + expect + Duration::from_secs(60);
        assert_eq!(pace.take(later), Duration::ZERO);
    }

    #[test]
    fn a_service_gets_a_burst_then_one_event_per_refill() {
        let (mut f, web, api) = (SpamFilter::default(), svc("web"), svc("api"));
        let t0 = Instant::now();
        for _ in 0..BURST as usize {
            assert!(f.allow(&web, t0));
        }
        assert!(!f.allow(&web, t0), "the burst is spent");
        assert!(f.allow(&api, t0), "another Service has its own");
        assert!(!f.allow(&web, t0 + REFILL / 2));
        assert!(f.allow(&web, t0 + REFILL + REFILL / 2));
        assert!(!f.allow(&web, t0 + REFILL + REFILL / 2));
    }
}
