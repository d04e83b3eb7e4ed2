//! The Kubernetes source: watchers over Services, EndpointSlices and this node's Node, as
//! kube-proxy watches them. Nothing is sent until every initial list is complete; then the
//! whole state once ([`Event::Replace`](super::events::Event::Replace)), and after that one event per object that changed
//! (the agent coalesces them, at most one sync per `min_sync`). A broken watch or a 410 Gone
//! re-lists; when the new list is complete, the objects that differ from what was sent are
//! sent, so the agent never sees half a list. The source keeps no copy of the objects (see
//! `stores`).
//!
//! Services and EndpointSlices are decoded as the proxy reads them (`decoded`): an object
//! the API server accepted never fails its watch; one the proxy cannot read is reported by
//! name and skipped.
//!
//! Failing requests back off as client-go's reflector does: 0.8 s doubling to 30 s (jittered)
//! while a watcher makes no progress; 429/503/504 are retried a few times first, no sooner
//! than `Retry-After`, and never more than a few seconds apart.

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::{Stream, StreamExt, stream};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client, Config,
    client::{ClientBuilder, retry::RetryPolicy},
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{
        WatchStreamExt,
        utils::Backoff,
        watcher::{self, DefaultBackoff},
    },
};
use serde::de::DeserializeOwned;
use thiserror::Error;
use tower::{buffer::BufferLayer, retry::RetryLayer};
use tracing::warn;

mod decoded;
pub mod recorder;
mod stores;

pub use stores::{EndpointSlice, Service, ZONE_LABEL, node_deleting};
use stores::{Stores, Watched};

use super::events::Stamped;

/// Label selector kube-proxy uses when it serves every Service.
pub const DEFAULT_SELECTOR: &str =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

/// How to reach the API server and what to watch.
#[derive(Clone, Debug)]
pub struct KubeOptions {
    /// A kubeconfig file; in-cluster config (or `$KUBECONFIG`) when absent.
    pub kubeconfig: Option<PathBuf>,
    /// Serve only Services labelled `service.kubernetes.io/service-proxy-name=NAME`.
    pub service_proxy_name: Option<String>,
    /// This node's name (its Node object is watched).
    pub node_name: String,
    /// Smallest interval between two syncs after the first (the agent applies it).
    pub min_sync: Duration,
}

#[derive(Debug, Error)]
pub enum KubeError {
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("cannot configure a Kubernetes client (no kubeconfig and not in a cluster?): {0}")]
    Infer(#[from] kube::config::InferConfigError),
    #[error("Kubernetes client: {0}")]
    Client(#[from] kube::Error),
    #[error("cannot start the Kubernetes source's runtime: {0}")]
    Runtime(#[from] std::io::Error),
    #[error("Kubernetes client retry policy: {0}")]
    Retry(String),
}

/// The label selector for Services and EndpointSlices.
pub fn selector(service_proxy_name: Option<&str>) -> String {
    match service_proxy_name {
        Some(name) => format!(
            "service.kubernetes.io/service-proxy-name={name},!service.kubernetes.io/headless"
        ),
        None => DEFAULT_SELECTOR.to_string(),
    }
}

/// Retries of a 429, 503 or 504 before the watcher sees the error: never sooner than the
/// server's `Retry-After`, else 0.2 s doubling to at most 2 s. kube's own policy doubles from
/// 5 ms to 1000 s over 15 retries, so its waits grow with the outage: after 40 s of 503s the
/// agent asked a recovered API server again only 30 s later.
fn retry_policy() -> Result<RetryPolicy, KubeError> {
    RetryPolicy::new(Duration::from_millis(200), Duration::from_secs(2), 10, true)
        .map_err(|e| KubeError::Retry(e.to_string()))
}

/// Requests a client may have queued (kube's own buffer takes as many).
const CLIENT_QUEUE: usize = 1024;

async fn client(opts: &KubeOptions) -> Result<Client, KubeError> {
    let mut config = match &opts.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|source| KubeError::Kubeconfig {
                path: path.display().to_string(),
                source,
            })?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|source| KubeError::Kubeconfig {
                    path: path.display().to_string(),
                    source,
                })?
        }
        None => Config::infer().await?,
    };
    config.default_retry = false;
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&BufferLayer::new(CLIENT_QUEUE))
        .with_layer(&RetryLayer::new(retry_policy()?))
        .build())
}

/// kube-runtime's default backoff (client-go's reflector's: 0.8 s doubling to 30 s, jittered,
/// starting over after 2 minutes without a failure), reset only when its watcher made
/// progress: a list completed, an object changed. kube-runtime resets it on every event, and
/// each list attempt begins with one (`Init`), so a list failing again and again was retried
/// every 0.8 to 1.6 s for as long as it failed.
struct ProgressBackoff {
    inner: DefaultBackoff,
    progressed: Arc<AtomicBool>,
}

impl Iterator for ProgressBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.inner.next()
    }
}

impl Backoff for ProgressBackoff {
    fn reset(&mut self) {
        if self.progressed.swap(false, Ordering::Relaxed) {
            self.inner.reset();
        }
    }
}

/// A watcher of `api`, backing off while it fails.
fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    let progressed = Arc::new(AtomicBool::new(false));
    let flag = progressed.clone();
    watcher::watcher(api, config)
        .inspect(move |e| {
            if matches!(
                e,
                Ok(watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_))
            ) {
                flag.store(true, Ordering::Relaxed);
            }
        })
        .backoff(ProgressBackoff {
            inner: DefaultBackoff::default(),
            progressed,
        })
}

/// Runs the source on its own thread (a current-thread tokio runtime); every event goes to
/// `send`, which returns false once nobody listens (the thread then ends).
pub fn spawn(
    opts: KubeOptions,
    send: impl FnMut(Stamped) -> bool + Send + 'static,
) -> std::thread::JoinHandle<Result<(), KubeError>> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(run(opts, send))
    })
}

async fn run(opts: KubeOptions, mut send: impl FnMut(Stamped) -> bool) -> Result<(), KubeError> {
    let client = client(&opts).await?;
    let sel = selector(opts.service_proxy_name.as_deref());
    let svc_events = watch(
        Api::<Service>::all(client.clone()),
        watcher::Config::default().labels(&sel),
    )
    .map(|e| ("Services", e.map(Watched::Service)));
    let slice_events = watch(
        Api::<EndpointSlice>::all(client.clone()),
        watcher::Config::default().labels(&sel),
    )
    .map(|e| ("EndpointSlices", e.map(Watched::Slice)));
    let node_events = watch(
        Api::<Node>::all(client),
        watcher::Config::default().fields(&format!("metadata.name={}", opts.node_name)),
    )
    .map(|e| ("Node", e.map(Watched::Node)));
    let mut events = std::pin::pin!(stream::select(
        stream::select(svc_events, slice_events),
        node_events
    ));
    let mut stores = Stores::default();
    while let Some((what, result)) = events.next().await {
        let since = std::time::Instant::now();
        let watched = match result {
            Ok(w) => w,
            Err(e) => {
                warn!("watch of {what}: {e}; retrying (the datapath keeps what it has)");
                continue;
            }
        };
        for event in stores.events(watched) {
            if !send(Stamped { event, since }) {
                return Ok(());
            }
        }
    }
    Ok(())
}
