//! The agent's view of a source: the next model to program, when there is one.

use std::time::Instant;

use tracing::error;

use super::{AgentError, SourceSpec};
use crate::source::{
    SourceError,
    file::{self, FileWatch, Loaded},
    kube::{self as kube_source, KubeError, Snapshot},
};

/// Something new from the source.
pub(super) struct Update {
    pub loaded: Result<Loaded, SourceError>,
    /// When the oldest change in it was seen.
    pub since: Instant,
    pub node_deleting: bool,
    /// The node's zone, when the source knows it.
    pub zone: Option<String>,
}

/// The agent's view of a source: the next model to program, when there is one.
pub(super) enum Feed {
    File {
        watch: FileWatch,
        reported: bool,
    },
    Kube {
        rx: std::sync::mpsc::Receiver<Snapshot>,
        thread: Option<std::thread::JoinHandle<Result<(), KubeError>>>,
    },
}

impl Feed {
    pub fn start(spec: &SourceSpec) -> Self {
        match spec {
            SourceSpec::File(path) => Feed::File {
                watch: FileWatch::new(path.clone()),
                reported: false,
            },
            SourceSpec::Kubernetes(opts) => {
                let (tx, rx) = std::sync::mpsc::channel();
                let thread = Some(kube_source::spawn(opts.clone(), tx));
                Feed::Kube { rx, thread }
            }
        }
    }

    /// `Ok(Some)` when there is something new to program (only the newest snapshot counts).
    pub fn next(&mut self) -> Result<Option<Update>, AgentError> {
        match self {
            Feed::File { watch, reported } => {
                if watch.changed() {
                    *reported = true;
                    return Ok(Some(Update {
                        since: Instant::now(),
                        loaded: file::load(watch.path()),
                        node_deleting: false,
                        zone: None,
                    }));
                }
                if !*reported {
                    error!(file = %watch.path().display(), "cannot read the source file; waiting for it");
                    *reported = true;
                }
                Ok(None)
            }
            Feed::Kube { rx, thread } => {
                let mut newest = None;
                loop {
                    match rx.try_recv() {
                        Ok(s) => {
                            let since = newest
                                .as_ref()
                                .map_or(s.since, |u: &Update| u.since.min(s.since));
                            newest = Some(Update {
                                loaded: Ok(s.loaded),
                                since,
                                node_deleting: s.node_deleting,
                                zone: s.zone,
                            });
                        }
                        Err(std::sync::mpsc::TryRecvError::Empty) => return Ok(newest),
                        Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                            return match thread.take().map(|t| t.join()) {
                                Some(Ok(Err(e))) => Err(e.into()),
                                _ => Err(AgentError::SourceStopped),
                            };
                        }
                    }
                }
            }
        }
    }
}
