//! What wakes the agent: a source event, the source ending, a link or address change. Every
//! source and watcher runs on its own thread and sends into one channel; the agent sleeps
//! on it.

use std::{sync::mpsc, time::Duration};

use tracing::warn;

use super::SourceSpec;
use crate::{
    datapath::netif,
    source::{
        events::Stamped,
        file,
        kube::{self as kube_source, KubeError},
    },
};

/// Why the agent woke.
pub(super) enum Wake {
    Source(Stamped),
    /// The Kubernetes source's thread ended (with its error, if it had one).
    SourceEnded(Option<KubeError>),
    /// An interface appeared, went or changed.
    Links,
    /// An interface address changed (NodePort addresses may have).
    Addresses,
    /// A rule or route selecting by source came or went (`datapath::routing`).
    Routing,
}

/// Starts the source and the rtnetlink watch; their events arrive on the returned channel.
/// `fallback` is how often the file is looked at when inotify is unavailable. The second
/// value is false when link changes cannot be watched (the caller then looks every
/// `fallback`).
pub(super) fn start(spec: &SourceSpec, fallback: Duration) -> (mpsc::Receiver<Wake>, bool) {
    let (tx, rx) = mpsc::channel();
    let send = tx.clone();
    let links = netif::watch_links(move |change| {
        let wake = match change {
            netif::LinkChange::Links => Wake::Links,
            netif::LinkChange::Addresses => Wake::Addresses,
            netif::LinkChange::Routing => Wake::Routing,
        };
        send.send(wake).is_ok()
    });
    if let Err(e) = &links {
        warn!(
            "cannot watch link changes over rtnetlink: {e}; interfaces are looked at every {fallback:?}"
        );
    }
    match spec {
        SourceSpec::File(path) => {
            let send = tx.clone();
            if let Err(e) = file::watch(path.clone(), fallback, move |t| {
                send.send(Wake::Source(t)).is_ok()
            }) {
                let _ = tx.send(Wake::SourceEnded(Some(KubeError::Runtime(e))));
            }
        }
        SourceSpec::Kubernetes(opts) => {
            let send = tx.clone();
            let thread =
                kube_source::spawn(opts.clone(), move |t| send.send(Wake::Source(t)).is_ok());
            let spawned = std::thread::Builder::new()
                .name("xlb-kube-join".into())
                .spawn(move || {
                    let error = match thread.join() {
                        Ok(Ok(())) | Err(_) => None,
                        Ok(Err(e)) => Some(e),
                    };
                    let _ = tx.send(Wake::SourceEnded(error));
                });
            if let Err(e) = spawned {
                warn!("cannot watch the Kubernetes source's thread: {e}");
            }
        }
    }
    (rx, links.is_ok())
}
