//! A test Kubernetes API server: list and watch of Services, EndpointSlices and Nodes over
//! HTTP/1.1 as the real one serves them (resourceVersion, ADDED/MODIFIED/DELETED/BOOKMARK
//! events, chunked streaming, 410 Gone for a compacted resourceVersion), so the real
//! `xlb agent --source kubernetes` can run against it.
//!
//! It listens on 127.0.0.1 inside a network namespace (the agent's node namespace), so nothing
//! leaves the test's namespaces.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc, Condvar, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::netns::Netns;

/// The kinds served, with their list path and list kind.
const KINDS: [(&str, &str, &str); 3] = [
    ("Service", "/api/v1/services", "ServiceList"),
    (
        "EndpointSlice",
        "/apis/discovery.k8s.io/v1/endpointslices",
        "EndpointSliceList",
    ),
    ("Node", "/api/v1/nodes", "NodeList"),
];

#[derive(Clone, Debug)]
struct Event {
    rv: u64,
    kind: String,
    kind_type: &'static str,
    object: Value,
}

#[derive(Default)]
struct State {
    rv: u64,
    /// Objects by kind, then `namespace/name`.
    objects: BTreeMap<String, BTreeMap<String, Value>>,
    events: Vec<Event>,
    /// Watches from a resourceVersion below this get 410 Gone.
    compacted: u64,
    /// Bumped to end every open watch.
    generation: u64,
    /// Every request line served, in order.
    requests: Vec<String>,
    /// Lists are answered only once this is true.
    lists_open: bool,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    stop: AtomicBool,
}

/// A running server; stops on drop.
pub struct ApiServer {
    shared: Arc<Shared>,
    pub addr: SocketAddr,
    thread: Option<thread::JoinHandle<Result<(), String>>>,
}

fn key_of(obj: &Value) -> String {
    let m = &obj["metadata"];
    format!(
        "{}/{}",
        m["namespace"].as_str().unwrap_or(""),
        m["name"].as_str().unwrap_or("")
    )
}

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(|p| p.into_inner())
}

impl ApiServer {
    /// Starts the server inside `ns` on 127.0.0.1 (a free port).
    pub fn start(ns: &Netns) -> Result<Self, String> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                lists_open: true,
                ..State::default()
            }),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let s = shared.clone();
        let thread = ns.spawn(move || {
            let listener = match TcpListener::bind("127.0.0.1:0").and_then(|l| {
                l.set_nonblocking(true)?;
                Ok(l)
            }) {
                Ok(l) => l,
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    return;
                }
            };
            let _ = tx.send(listener.local_addr().map_err(|e| e.to_string()));
            while !s.stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let s = s.clone();
                        thread::spawn(move || serve(conn, &s));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        let addr = rx
            .recv()
            .map_err(|_| "api server thread died".to_string())??;
        Ok(ApiServer {
            shared,
            addr,
            thread: Some(thread),
        })
    }

    /// Writes a kubeconfig pointing at this server (no auth) to `path`.
    pub fn write_kubeconfig(&self, path: &std::path::Path) -> Result<(), String> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster: {{server: \"http://{}\"}}\nusers:\n- name: test\n  user: {{}}\ncontexts:\n- name: test\n  context: {{cluster: test, user: test}}\ncurrent-context: test\n",
            self.addr
        );
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Creates or replaces an object (ADDED or MODIFIED), given as YAML or JSON.
    pub fn apply_yaml(&self, yaml: &str) -> Result<(), String> {
        for doc in serde_yaml::Deserializer::from_str(yaml) {
            let v: Value = serde::Deserialize::deserialize(doc).map_err(|e| e.to_string())?;
            if v.is_null() {
                continue;
            }
            self.apply(v);
        }
        Ok(())
    }

    /// Creates or replaces one object.
    pub fn apply(&self, mut obj: Value) {
        let mut st = lock(&self.shared);
        st.rv += 1;
        let rv = st.rv;
        let kind = obj["kind"].as_str().unwrap_or("").to_string();
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let key = key_of(&obj);
        let objects = st.objects.entry(kind.clone()).or_default();
        let kind_type = if objects.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        objects.insert(key, obj.clone());
        st.events.push(Event {
            rv,
            kind,
            kind_type,
            object: obj,
        });
        self.shared.changed.notify_all();
    }

    /// Deletes an object (DELETED); `key` is `namespace/name` ("/name" for Nodes).
    pub fn delete(&self, kind: &str, key: &str) {
        let mut st = lock(&self.shared);
        st.rv += 1;
        let rv = st.rv;
        if let Some(mut obj) = st.objects.get_mut(kind).and_then(|o| o.remove(key)) {
            obj["metadata"]["resourceVersion"] = json!(rv.to_string());
            st.events.push(Event {
                rv,
                kind: kind.to_string(),
                kind_type: "DELETED",
                object: obj,
            });
        }
        self.shared.changed.notify_all();
    }

    /// Ends every open watch stream (as a restarting API server or a broken connection would).
    pub fn cut_watches(&self) {
        lock(&self.shared).generation += 1;
        self.shared.changed.notify_all();
    }

    /// Forgets the history: watches from an older resourceVersion now get 410 Gone.
    pub fn compact(&self) {
        let mut st = lock(&self.shared);
        st.compacted = st.rv + 1;
        st.events.clear();
        st.generation += 1;
        self.shared.changed.notify_all();
    }

    /// Holds list requests (they wait) until `open` is true again.
    pub fn hold_lists(&self, hold: bool) {
        lock(&self.shared).lists_open = !hold;
        self.shared.changed.notify_all();
    }

    /// Request lines served so far.
    pub fn requests(&self) -> Vec<String> {
        lock(&self.shared).requests.clone()
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        lock(&self.shared).rv
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.cut_watches();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Parses `a=b&c=d` (percent-decoding the few characters selectors use).
fn query(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| {
            let v = v
                .replace("%21", "!")
                .replace("%2C", ",")
                .replace("%2c", ",")
                .replace("%3D", "=")
                .replace("%3d", "=")
                .replace("%2F", "/")
                .replace("%2f", "/")
                .replace('+', " ");
            (k.to_string(), v)
        })
        .collect()
}

/// Does `obj` match a label selector (`k`, `!k`, `k=v`, `k!=v`, comma-separated) and a field
/// selector (only `metadata.name=X`)?
fn matches(obj: &Value, labels: &str, fields: &str) -> bool {
    let l = &obj["metadata"]["labels"];
    let label_ok = labels.split(',').filter(|r| !r.is_empty()).all(|req| {
        if let Some(k) = req.strip_prefix('!') {
            l.get(k).is_none()
        } else if let Some((k, v)) = req.split_once("!=") {
            l.get(k).and_then(Value::as_str) != Some(v)
        } else if let Some((k, v)) = req.split_once('=') {
            l.get(k).and_then(Value::as_str) == Some(v.trim_start_matches('='))
        } else {
            l.get(req).is_some()
        }
    });
    let field_ok =
        fields
            .split(',')
            .filter(|r| !r.is_empty())
            .all(|req| match req.split_once('=') {
                Some(("metadata.name", v)) => obj["metadata"]["name"].as_str() == Some(v),
                _ => true,
            });
    label_ok && field_ok
}

fn respond(conn: &mut TcpStream, status: &str, body: &Value) -> std::io::Result<()> {
    let body = body.to_string();
    write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn chunk(conn: &mut TcpStream, v: &Value) -> std::io::Result<()> {
    let line = format!("{v}\n");
    write!(conn, "{:x}\r\n{line}\r\n", line.len())?;
    conn.flush()
}

fn serve(mut conn: TcpStream, shared: &Shared) {
    let _ = conn.set_nonblocking(false);
    let mut reader = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut request = String::new();
    if reader.read_line(&mut request).is_err() {
        return;
    }
    let mut header = String::new();
    while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
        header.clear();
    }
    let target = request.split_whitespace().nth(1).unwrap_or("/").to_string();
    lock(shared).requests.push(request.trim().to_string());
    let (path, q) = target.split_once('?').unwrap_or((&target, ""));
    let q = query(q);
    let Some((kind, _, list_kind)) = KINDS.iter().find(|(_, p, _)| *p == path) else {
        let _ = respond(
            &mut conn,
            "404 Not Found",
            &json!({"kind": "Status", "code": 404}),
        );
        return;
    };
    let labels = q.get("labelSelector").cloned().unwrap_or_default();
    let fields = q.get("fieldSelector").cloned().unwrap_or_default();
    if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
        let _ = watch(&mut conn, shared, kind, &q, &labels, &fields);
        return;
    }
    // LIST: the whole collection at the current resourceVersion (no pagination).
    let mut st = lock(shared);
    while !st.lists_open && !shared.stop.load(Ordering::Relaxed) {
        st = shared
            .changed
            .wait_timeout(st, Duration::from_millis(100))
            .map(|(g, _)| g)
            .unwrap_or_else(|p| p.into_inner().0);
    }
    let items: Vec<Value> = st
        .objects
        .get(*kind)
        .into_iter()
        .flat_map(|o| o.values())
        .filter(|o| matches(o, &labels, &fields))
        .cloned()
        .collect();
    let rv = st.rv.to_string();
    drop(st);
    let api_version = if *kind == "EndpointSlice" {
        "discovery.k8s.io/v1"
    } else {
        "v1"
    };
    let _ = respond(
        &mut conn,
        "200 OK",
        &json!({"kind": list_kind, "apiVersion": api_version, "metadata": {"resourceVersion": rv}, "items": items}),
    );
}

fn watch(
    conn: &mut TcpStream,
    shared: &Shared,
    kind: &str,
    q: &BTreeMap<String, String>,
    labels: &str,
    fields: &str,
) -> std::io::Result<()> {
    let mut from: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = Duration::from_secs(
        q.get("timeoutSeconds")
            .and_then(|v| v.parse().ok())
            .unwrap_or(300),
    );
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    write!(
        conn,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )?;
    let started = Instant::now();
    let mut st = lock(shared);
    let generation = st.generation;
    if from < st.compacted {
        let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": format!("too old resource version: {from} ({})", st.compacted), "reason": "Expired", "code": 410}});
        drop(st);
        chunk(conn, &gone)?;
        return write!(conn, "0\r\n\r\n");
    }
    let mut last_bookmark = Instant::now();
    loop {
        // A cut or a compaction ends the stream before anything newer is sent.
        if st.generation != generation
            || shared.stop.load(Ordering::Relaxed)
            || started.elapsed() > timeout
        {
            drop(st);
            return write!(conn, "0\r\n\r\n");
        }
        let pending: Vec<Event> = st
            .events
            .iter()
            .filter(|e| e.rv > from && e.kind == kind && matches(&e.object, labels, fields))
            .cloned()
            .collect();
        let current = st.rv;
        drop(st);
        for e in &pending {
            chunk(conn, &json!({"type": e.kind_type, "object": e.object}))?;
            from = e.rv;
        }
        if bookmarks && last_bookmark.elapsed() > Duration::from_secs(1) {
            let api_version = if kind == "EndpointSlice" {
                "discovery.k8s.io/v1"
            } else {
                "v1"
            };
            chunk(
                conn,
                &json!({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api_version,
                "metadata": {"resourceVersion": current.to_string()}}}),
            )?;
            from = from.max(current);
            last_bookmark = Instant::now();
        }
        st = lock(shared);
        if st.generation != generation {
            continue;
        }
        if !st.events.iter().any(|e| e.rv > from && e.kind == kind) {
            st = shared
                .changed
                .wait_timeout(st, Duration::from_millis(200))
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_and_field_selectors() {
        let obj = json!({"metadata": {"name": "n1", "labels": {"a": "1"}}});
        assert!(matches(&obj, "a=1,!b", ""));
        assert!(!matches(&obj, "!a", ""));
        assert!(matches(&obj, "", "metadata.name=n1"));
        assert!(!matches(&obj, "", "metadata.name=n2"));
        assert!(matches(&obj, "a!=2", ""));
    }
}
