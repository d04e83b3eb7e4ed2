//! A test Kubernetes API server for Services, EndpointSlices and Nodes, modelled on the real
//! one so the real `xlb agent --source kubernetes` can run against it:
//!
//! * LIST with `limit`/`continue` pages, every page at the first page's resourceVersion, a
//!   410 for a compacted continue token (`list.rs`);
//! * WATCH from a resourceVersion, from the current state (no resourceVersion, or `0`), or
//!   as a streaming list (`sendInitialEvents`); DELETED/ADDED when an object leaves or enters
//!   the selector; BOOKMARKs; a 410 `ERROR` event only for a resourceVersion older than the
//!   compaction point (`watch.rs`);
//! * a history kept per change, compacted on demand (`store.rs`);
//! * Events (events.k8s.io/v1): created and merge-patched as the real server takes them
//!   from a recorder, with its validation (`events.rs`);
//! * faults: a Status of 403, 429 (with `Retry-After`), 500 or 503 for every request of a
//!   kind, lists held at a gate per kind (or only their later pages), watches cut, and the
//!   listener down (connections refused) before or after the agent starts.
//!
//! It listens on 127.0.0.1 inside a network namespace (the agent's node namespace), so nothing
//! leaves the test's namespaces. HTTP is hyper's, on a tokio runtime of its own thread.

mod events;
mod http;
mod list;
mod selector;
mod status;
mod store;
mod watch;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    sync::{Arc, Mutex, MutexGuard},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;
use tokio::sync::watch as signal;

pub use status::Status;
use store::Store;

use crate::netns::Netns;

/// A kind served: its list path, list kind and API group.
#[derive(Debug)]
struct Kind {
    kind: &'static str,
    path: &'static str,
    list_kind: &'static str,
    api_version: &'static str,
    /// The resource (for RBAC messages) and its API group.
    resource: &'static str,
    group: &'static str,
}

const KINDS: [Kind; 3] = [
    Kind {
        kind: "Service",
        path: "/api/v1/services",
        list_kind: "ServiceList",
        api_version: "v1",
        resource: "services",
        group: "",
    },
    Kind {
        kind: "EndpointSlice",
        path: "/apis/discovery.k8s.io/v1/endpointslices",
        list_kind: "EndpointSliceList",
        api_version: "discovery.k8s.io/v1",
        resource: "endpointslices",
        group: "discovery.k8s.io",
    },
    Kind {
        kind: "Node",
        path: "/api/v1/nodes",
        list_kind: "NodeList",
        api_version: "v1",
        resource: "nodes",
        group: "",
    },
];

/// Events: written, not watched (`events.rs`); its faults are injected as `"Event"`.
const EVENT_KIND: Kind = Kind {
    kind: "Event",
    path: events::PREFIX,
    list_kind: "EventList",
    api_version: "events.k8s.io/v1",
    resource: "events",
    group: "events.k8s.io",
};

/// How often a watch that allows bookmarks gets one (the real server: about once a minute).
const BOOKMARK_EVERY: Duration = Duration::from_secs(1);

/// A failure answered to every list and watch request of a kind while injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// 403: the agent's RBAC lacks the verb.
    Forbidden,
    /// 429 with `Retry-After` (API priority and fairness).
    TooManyRequests { retry_after_secs: u32 },
    /// 500.
    InternalError,
    /// 503.
    Unavailable,
}

impl Fault {
    fn status(self, kind: &Kind, verb: &str) -> Status {
        match self {
            Fault::Forbidden => Status::forbidden(verb, kind.resource, kind.group),
            Fault::TooManyRequests { retry_after_secs } => {
                Status::too_many_requests(retry_after_secs)
            }
            Fault::InternalError => Status::internal_error(),
            Fault::Unavailable => Status::service_unavailable(),
        }
    }
}

/// Which list requests of a kind a gate holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Gate {
    /// Every list request.
    Lists,
    /// Only the pages after the first (requests with a continue token).
    Continues,
}

/// One request the server answered.
#[derive(Clone, Debug)]
pub struct Served {
    /// The method (GET for lists and watches, POST and PATCH for Events).
    pub method: String,
    /// Path and query, as sent.
    pub target: String,
    /// The HTTP status (200 for a watch, whatever its stream then carried).
    pub status: u16,
    /// When it arrived.
    pub at: Instant,
    /// The resourceVersion a list page was read at.
    pub list_rv: Option<u64>,
}

impl Served {
    /// Is it a request for `path` (e.g. "/api/v1/services")?
    pub fn is_for(&self, path: &str) -> bool {
        self.target.split('?').next() == Some(path)
    }

    pub fn is_watch(&self) -> bool {
        self.target.contains("watch=true") || self.target.contains("watch=1")
    }

    /// A later page of a list.
    pub fn is_continue(&self) -> bool {
        self.target.contains("continue=")
    }
}

/// The listener's state, as the test asks it to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Up,
    Down,
    Stop,
}

struct Inner {
    store: Store,
    /// Bumped to end every open watch.
    generation: u64,
    gates: BTreeSet<(String, Gate)>,
    /// List requests a gate holds, by kind.
    waiting: BTreeMap<String, usize>,
    faults: BTreeMap<String, Fault>,
    served: Vec<Served>,
    /// Open watches: kind and the resourceVersion their client has seen.
    watches: BTreeMap<u64, (String, u64)>,
    /// The `ERROR` events watches sent: kind and Status code.
    watch_errors: Vec<(String, u16)>,
    next_id: u64,
    /// Connections accepted so far, and the requests being answered now.
    connections: usize,
    in_flight: BTreeMap<u64, String>,
    /// Whether the listener is up, or why it could not listen.
    listening: Result<bool, String>,
}

impl Inner {
    fn held(&self, kind: &str, continued: bool) -> bool {
        self.gates.contains(&(kind.to_string(), Gate::Lists))
            || (continued && self.gates.contains(&(kind.to_string(), Gate::Continues)))
    }
}

struct Shared {
    inner: Mutex<Inner>,
    /// Bumped after every change of `inner` that a request may wait for.
    changed: signal::Sender<u64>,
    mode: signal::Sender<Mode>,
    bookmark_every: Duration,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes `inner` and wakes what waits on it.
    fn update<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let r = f(&mut self.lock());
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
        r
    }

    fn record(&self, served: Served) {
        self.lock().served.push(served);
    }
}

/// A running server; stops on drop.
pub struct ApiServer {
    shared: Arc<Shared>,
    pub addr: SocketAddr,
    thread: Option<thread::JoinHandle<Result<Result<(), String>, String>>>,
}

/// Parses YAML or JSON documents (null ones skipped).
fn documents(yaml: &str) -> Result<Vec<Value>, String> {
    let docs = lb_userspace::source::yaml::documents(yaml).map_err(|e| e.to_string())?;
    Ok(docs.into_iter().filter(|v| !v.is_null()).collect())
}

impl ApiServer {
    /// Starts the server inside `ns` on 127.0.0.1 (a free port), listening.
    pub fn start(ns: &Netns) -> Result<Self, String> {
        Self::launch(ns, Mode::Up)
    }

    /// Starts the server with its address taken but not listening: connections are refused
    /// until [`ApiServer::up`].
    pub fn start_down(ns: &Netns) -> Result<Self, String> {
        Self::launch(ns, Mode::Down)
    }

    fn launch(ns: &Netns, mode: Mode) -> Result<Self, String> {
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                store: Store::default(),
                generation: 0,
                gates: BTreeSet::new(),
                waiting: BTreeMap::new(),
                faults: BTreeMap::new(),
                served: Vec::new(),
                watches: BTreeMap::new(),
                watch_errors: Vec::new(),
                next_id: 0,
                connections: 0,
                in_flight: BTreeMap::new(),
                listening: Ok(false),
            }),
            changed: signal::channel(0).0,
            mode: signal::channel(mode).0,
            bookmark_every: BOOKMARK_EVERY,
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let s = shared.clone();
        let thread = ns.spawn(move || run(s, tx));
        let addr = rx
            .recv()
            .map_err(|_| "api server thread died".to_string())??;
        let server = ApiServer {
            shared,
            addr,
            thread: Some(thread),
        };
        if mode == Mode::Up {
            server.wait_listening(true)?;
        }
        Ok(server)
    }

    fn wait_listening(&self, want: bool) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match &self.shared.lock().listening {
                Ok(l) if *l == want => return Ok(()),
                Err(e) => return Err(e.clone()),
                Ok(_) if Instant::now() > deadline => {
                    return Err(format!("api server never became listening={want}"));
                }
                Ok(_) => {}
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Listens again (on the same address).
    pub fn up(&self) -> Result<(), String> {
        self.shared.mode.send_replace(Mode::Up);
        self.wait_listening(true)
    }

    /// Stops listening and closes every connection (open watches end): new connections are
    /// refused, as of an API server that is down.
    pub fn down(&self) -> Result<(), String> {
        self.shared.mode.send_replace(Mode::Down);
        self.wait_listening(false)
    }

    /// Writes a kubeconfig pointing at this server (no auth) to `path`.
    pub fn write_kubeconfig(&self, path: &std::path::Path) -> Result<(), String> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster: {{server: \"http://{}\"}}\nusers:\n- name: test\n  user: {{}}\ncontexts:\n- name: test\n  context: {{cluster: test, user: test}}\ncurrent-context: test\n",
            self.addr
        );
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Creates or replaces objects (ADDED or MODIFIED), given as YAML or JSON.
    pub fn apply_yaml(&self, yaml: &str) -> Result<(), String> {
        let docs = documents(yaml)?;
        self.shared.update(|i| {
            for d in docs {
                i.store.apply(d);
            }
        });
        Ok(())
    }

    /// Creates or replaces one object.
    pub fn apply(&self, obj: Value) {
        self.shared.update(|i| i.store.apply(obj));
    }

    /// Creates or replaces many objects at once.
    pub fn apply_all(&self, objects: impl IntoIterator<Item = Value>) {
        self.shared.update(|i| {
            for o in objects {
                i.store.apply(o);
            }
        });
    }

    /// Deletes an object (DELETED); `key` is `namespace/name` ("/name" for Nodes).
    pub fn delete(&self, kind: &str, key: &str) {
        self.shared.update(|i| i.store.delete(kind, key));
    }

    /// A change no open watch sees: every watch is cut, the objects applied and the history
    /// compacted, at once. A client re-watching from before it gets 410 Gone and must relist
    /// (as after a long disconnection).
    pub fn apply_unseen(&self, yaml: &str) -> Result<(), String> {
        let docs = documents(yaml)?;
        self.shared.update(|i| {
            i.generation += 1;
            for d in docs {
                i.store.apply(d);
            }
            i.store.compact();
        });
        Ok(())
    }

    /// Ends every open watch stream (as a restarting API server or a broken connection would).
    pub fn cut_watches(&self) {
        self.shared.update(|i| i.generation += 1);
    }

    /// Forgets the history up to the current resourceVersion: a watch from it (or later) is
    /// still served; one from an older resourceVersion gets 410 Gone, and so does an open
    /// watch that has not seen every change up to it.
    pub fn compact(&self) {
        self.shared.update(|i| i.store.compact());
    }

    /// Holds every kind's list requests (they wait) while `hold` is true.
    pub fn hold_lists(&self, hold: bool) {
        for k in &KINDS {
            if hold {
                self.hold(k.kind, Gate::Lists);
            } else {
                self.release(k.kind, Gate::Lists);
            }
        }
    }

    /// Holds `kind`'s list requests at `gate` until [`ApiServer::release`].
    pub fn hold(&self, kind: &str, gate: Gate) {
        self.shared
            .update(|i| i.gates.insert((kind.to_string(), gate)));
    }

    pub fn release(&self, kind: &str, gate: Gate) {
        self.shared
            .update(|i| i.gates.remove(&(kind.to_string(), gate)));
    }

    /// How many of `kind`'s list requests a gate holds now.
    pub fn held_requests(&self, kind: &str) -> usize {
        self.shared.lock().waiting.get(kind).copied().unwrap_or(0)
    }

    /// Answers every list and watch request of `kind` with `fault` until cleared.
    pub fn inject(&self, kind: &str, fault: Fault) {
        self.shared
            .update(|i| i.faults.insert(kind.to_string(), fault));
    }

    pub fn clear_fault(&self, kind: &str) {
        self.shared.update(|i| i.faults.remove(kind));
    }

    /// Requests answered so far, as `METHOD target -> status`, in the order they were
    /// answered.
    pub fn requests(&self) -> Vec<String> {
        self.shared
            .lock()
            .served
            .iter()
            .map(|s| format!("{} {} -> {}", s.method, s.target, s.status))
            .collect()
    }

    /// Object `kind` `key` (`namespace/name`) as stored now.
    pub fn object(&self, kind: &str, key: &str) -> Option<Value> {
        self.shared.lock().store.get(kind, key).cloned()
    }

    /// The Events written so far (events.k8s.io/v1 objects, by namespace and name).
    pub fn events(&self) -> Vec<Value> {
        self.shared.lock().store.all(EVENT_KIND.kind)
    }

    /// What the server saw, for a failing test's message: listener, connections, requests
    /// in flight, open watches, requests answered.
    pub fn diagnosis(&self) -> String {
        let i = self.shared.lock();
        let answered: Vec<String> = i
            .served
            .iter()
            .map(|s| format!("{} {} -> {}", s.method, s.target, s.status))
            .collect();
        format!(
            "api server: listening {:?}, {} connections accepted, in flight {:#?}, watches (kind, rv) {:?} at rv {}, answered {answered:#?}",
            i.listening,
            i.connections,
            i.in_flight.values().collect::<Vec<_>>(),
            i.watches.values().collect::<Vec<_>>(),
            i.store.rv(),
        )
    }

    /// Requests answered so far, in the order they were answered.
    pub fn served(&self) -> Vec<Served> {
        self.shared.lock().served.clone()
    }

    /// Open watches: kind and the resourceVersion of the last event or bookmark sent.
    pub fn watch_positions(&self) -> Vec<(String, u64)> {
        self.shared.lock().watches.values().cloned().collect()
    }

    /// The `ERROR` events watches sent so far: kind and Status code (410: too old).
    pub fn watch_errors(&self) -> Vec<(String, u16)> {
        self.shared.lock().watch_errors.clone()
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().store.rv()
    }
}

/// The server thread: a current-thread runtime serving until the mode is `Stop`.
fn run(
    shared: Arc<Shared>,
    tx: std::sync::mpsc::Sender<Result<SocketAddr, String>>,
) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("api server runtime: {e}"))?;
    rt.block_on(async move {
        let bound = http::park(SocketAddr::from(([127, 0, 0, 1], 0)))
            .and_then(|s| Ok((s.local_addr()?, s)))
            .map_err(|e| format!("api server bind: {e}"));
        let (addr, parked) = match bound {
            Ok(b) => b,
            Err(e) => {
                let _ = tx.send(Err(e.clone()));
                return Err(e);
            }
        };
        let _ = tx.send(Ok(addr));
        http::serve(shared, Some(parked), addr).await;
        Ok(())
    })
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.shared.mode.send_replace(Mode::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
