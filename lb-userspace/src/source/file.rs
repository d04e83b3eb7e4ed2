//! The YAML file source: v1 Service and discovery.k8s.io/v1 EndpointSlice documents.

use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use serde_json::Value;
use tracing::{debug, error, warn};

use super::{
    Snapshot, SourceError,
    convert::{self, Converted},
    events::{self, Event, Stamped},
    objects, testconfig, yaml,
};

/// Parses a multi-document YAML text. A document that is not a Service or EndpointSlice is
/// ignored; an invalid object is reported and left out, every other object is kept.
pub fn parse(path: &str, text: &str) -> Result<Snapshot, SourceError> {
    parse_step(path, text, None)
}

/// As [`parse`], keeping only the objects present in `step` of a multi-step conformance
/// case (see [`testconfig::present_in_step`]); `None` keeps everything.
///
/// The stream is read as YAML (serde-saphyr) one document at a time ([`yaml::each_document`]),
/// each into plain data and decoded on its own before the next is read: one whose fields
/// have the wrong types (`port: "eighty"`, `ports: 5`) is reported by kind, namespace and
/// name and left out, like an object with a bad value. Only text that is not YAML at all
/// fails the whole file (what was read before it is dropped).
pub fn parse_step(path: &str, text: &str, step: Option<u32>) -> Result<Snapshot, SourceError> {
    let mut loaded = Snapshot::default();
    // Each document read as plain data first (a Kubernetes object is JSON's data model),
    // then decoded field by field, so a bad field is an error of its object alone; never
    // the whole stream as plain data at once (see yaml::each_document).
    let mut next = 0;
    yaml::each_document(text, |value| {
        let index = next;
        next += 1;
        if value.is_null() {
            return;
        }
        if let Some(step) = step
            && !testconfig::present_in_step(&value, step)
        {
            return;
        }
        take_document(&mut loaded, &Document { path, index }, value);
    })
    .map_err(|source| SourceError::Yaml {
        path: path.to_string(),
        source: Box::new(source),
    })?;
    Ok(loaded)
}

/// Where a document is: its file and its index in the stream.
struct Document<'a> {
    path: &'a str,
    index: usize,
}

impl Document<'_> {
    /// A decode error for this document, naming the object as far as it can be read.
    fn decode_error(
        &self,
        value: &Value,
        e: serde_path_to_error::Error<serde_json::Error>,
    ) -> SourceError {
        SourceError::Decode {
            path: self.path.to_string(),
            index: self.index,
            kind: str_at(value, &["kind"]).unwrap_or("").to_string(),
            object: object_name(value),
            field: e.path().to_string(),
            source: e.into_inner(),
        }
    }
}

/// The string at `keys` (a path of mapping keys) of `value`, if there is one.
fn str_at<'v>(value: &'v Value, keys: &[&str]) -> Option<&'v str> {
    keys.iter()
        .try_fold(value, |v, k| v.get(k))
        .and_then(|v| v.as_str())
}

/// `namespace/name` as far as the document says (namespace "default" when unset, `?` for a
/// name that is missing or not a string).
fn object_name(value: &Value) -> String {
    let namespace = match value.get("metadata").and_then(|m| m.get("namespace")) {
        None => "default",
        Some(ns) => ns.as_str().unwrap_or("?"),
    };
    let name = str_at(value, &["metadata", "name"]).unwrap_or("?");
    format!("{namespace}/{name}")
}

/// Takes one document into `loaded`: a Service or EndpointSlice into the model (or its
/// error), a conformance TestConfig, or a note that it was ignored.
fn take_document(loaded: &mut Snapshot, doc: &Document<'_>, value: Value) {
    let api_version = str_at(&value, &["apiVersion"]).unwrap_or("").to_string();
    let kind = str_at(&value, &["kind"]).unwrap_or("").to_string();
    match (api_version.as_str(), kind.as_str()) {
        (_, "TestConfig") if api_version.starts_with("peertest.kube-proxy.local/") => {
            match testconfig::parse(&value) {
                Ok(tc) => loaded.test_config = Some(tc),
                Err(e) => loaded.errors.push(e),
            }
        }
        ("v1", "Service") => match decode::<objects::Service>(doc, value) {
            Ok(svc) => match convert::service(&svc) {
                Ok(Converted::Take(s)) => loaded.model.upsert_service(s),
                Ok(Converted::Ignore(why)) => loaded.ignored.push(why),
                Err(e) => loaded.errors.push(e),
            },
            Err(e) => loaded.errors.push(e),
        },
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            match decode::<objects::EndpointSlice>(doc, value) {
                Ok(slice) => match convert::endpoint_slice(&slice) {
                    Ok(Converted::Take(s)) => loaded.model.upsert_slice(s),
                    Ok(Converted::Ignore(why)) => loaded.ignored.push(why),
                    Err(e) => loaded.errors.push(e),
                },
                Err(e) => loaded.errors.push(e),
            }
        }
        _ => loaded.ignored.push(format!(
            "{}: document {} is {api_version} {kind}, not a Service or EndpointSlice",
            doc.path, doc.index
        )),
    }
}

/// Decodes a document into the proxy's reading of its type; a field of the wrong type is an error of
/// this document alone.
fn decode<T: serde::de::DeserializeOwned>(
    doc: &Document<'_>,
    value: Value,
) -> Result<T, SourceError> {
    serde_path_to_error::deserialize(&value).map_err(|e| doc.decode_error(&value, e))
}

/// Reads and parses a file.
pub fn load(path: &Path) -> Result<Snapshot, SourceError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| SourceError::Io {
        path: shown.clone(),
        source,
    })?;
    parse(&shown, &text)
}

/// Notices when a file changes (modification time, size or content).
pub struct FileWatch {
    path: PathBuf,
    last: Option<(SystemTime, u64, u64)>,
}

impl FileWatch {
    pub fn new(path: PathBuf) -> Self {
        Self { path, last: None }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True the first time, and whenever the file differs from the last call.
    pub fn changed(&mut self) -> bool {
        let stamp = std::fs::read(&self.path).ok().and_then(|bytes| {
            let meta = std::fs::metadata(&self.path).ok()?;
            Some((meta.modified().ok()?, meta.len(), fnv1a(&bytes)))
        });
        if stamp.is_some() && stamp != self.last {
            self.last = stamp;
            true
        } else {
            false
        }
    }
}

/// Watches `path` on its own thread and sends what changed: the whole file on its first
/// good read ([`Event::Replace`]), then one event per object that differs from the last
/// good read. The file is re-read only when inotify says it was written and closed, or
/// moved or created in place (an editor's rename), never on a poll; without inotify it is
/// looked at every `fallback`. A file that cannot be read or is not YAML is reported
/// ([`Event::Error`]) and what was read before stays. The thread ends when `send` returns
/// false.
pub fn watch(
    path: PathBuf,
    fallback: Duration,
    mut send: impl FnMut(Stamped) -> bool + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("xlb-file".into())
        .spawn(move || {
            let (tx, rx) = std::sync::mpsc::channel();
            let _watcher = match inotify(&path, tx) {
                Ok(w) => Some(w),
                Err(e) => {
                    warn!(file = %path.display(), "cannot watch with inotify ({e}); looking every {fallback:?}");
                    None
                }
            };
            let mut reader = Reader::new(path);
            loop {
                for event in reader.read() {
                    if !send(event) {
                        return;
                    }
                }
                let woke = if _watcher.is_some() {
                    rx.recv().map_err(|_| ())
                } else {
                    std::thread::sleep(fallback);
                    Ok(())
                };
                if woke.is_err() {
                    return;
                }
                while rx.try_recv().is_ok() {}
            }
        })
}

/// An inotify watch of `path`'s directory (so a file replaced by a rename is still seen)
/// that wakes `tx` when `path` was written and closed, created, moved or removed.
fn inotify(
    path: &Path,
    tx: std::sync::mpsc::Sender<()>,
) -> notify::Result<notify::RecommendedWatcher> {
    use notify::{
        EventKind, RecursiveMode, Watcher,
        event::{AccessKind, AccessMode, ModifyKind},
    };
    let name = path.file_name().map(|n| n.to_os_string());
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut w = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        let Ok(ev) = res else {
            // An overflow: look anyway.
            let _ = tx.send(());
            return;
        };
        let ours = ev.paths.iter().any(|p| p.file_name() == name.as_deref());
        let complete = matches!(
            ev.kind,
            EventKind::Access(AccessKind::Close(AccessMode::Write))
                | EventKind::Create(_)
                | EventKind::Modify(ModifyKind::Name(_))
                | EventKind::Remove(_)
        );
        if ours && complete {
            let _ = tx.send(());
        }
    })?;
    w.watch(&dir, RecursiveMode::NonRecursive)?;
    Ok(w)
}

/// Re-reads the file and turns what changed into events.
struct Reader {
    watch: FileWatch,
    /// The digest of the last good read (`None` before the first).
    last: Option<events::Digest>,
    /// The last read's object errors (reported again only when they change).
    last_errors: Vec<String>,
    reported_missing: bool,
}

impl Reader {
    fn new(path: PathBuf) -> Self {
        Self {
            watch: FileWatch::new(path),
            last: None,
            last_errors: Vec::new(),
            reported_missing: false,
        }
    }

    fn read(&mut self) -> Vec<Stamped> {
        if !self.watch.changed() {
            if self.last.is_none() && !self.reported_missing {
                self.reported_missing = true;
                error!(file = %self.watch.path().display(), "cannot read the source file; waiting for it");
            }
            return Vec::new();
        }
        let since = std::time::Instant::now();
        let loaded = match load(self.watch.path()) {
            Ok(l) => l,
            Err(e) => return vec![Stamped::now(Event::Error(e))],
        };
        for why in &loaded.ignored {
            debug!("ignored: {why}");
        }
        let errors: Vec<String> = loaded.errors.iter().map(|e| e.to_string()).collect();
        let mut out = Vec::new();
        let fresh_errors = errors != self.last_errors;
        self.last_errors = errors;
        let Some(last) = &mut self.last else {
            self.last = Some(events::Digest::of(&loaded.model));
            return vec![Stamped {
                event: Event::Replace(Box::new(loaded)),
                since,
            }];
        };
        if fresh_errors {
            out.extend(loaded.errors.into_iter().map(|e| Stamped {
                event: Event::Error(e),
                since,
            }));
        }
        out.extend(
            last.diff(&loaded.model)
                .into_iter()
                .map(|event| Stamped { event, since }),
        );
        out
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
apiVersion: v1
kind: Service
metadata: {namespace: demo, name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: demo
  name: web-abc
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: ["10.244.2.2"]
  conditions: {ready: true}
- addresses: ["10.244.3.2"]
"#;

    #[test]
    fn parses_services_and_slices() {
        let l = parse("t.yaml", GOOD).expect("parse");
        assert!(l.errors.is_empty(), "{:?}", l.errors);
        assert_eq!(l.model.services.len(), 1);
        let (id, svc) = l.model.services.iter().next().expect("one");
        let be = l.model.backends(id, &svc.ports[0]);
        let shown: Vec<String> = be.iter().map(|b| b.to_string()).collect();
        assert_eq!(shown, ["10.244.2.2:8080/TCP", "10.244.3.2:8080/TCP"]);
    }

    #[test]
    fn a_bad_object_is_named_and_the_rest_is_kept() {
        let bad = GOOD.replace("10.96.0.10", "10.96.0.999")
            + r#"
---
apiVersion: v1
kind: Service
metadata: {namespace: demo, name: dns}
spec:
  clusterIP: 10.96.0.53
  ports: [{name: dns, port: 53, protocol: ICMP}]
---
apiVersion: v1
kind: Service
metadata: {namespace: demo, name: ok}
spec:
  clusterIP: 10.96.0.54
  ports: [{name: dns, port: 53, protocol: UDP}]
"#;
        let l = parse("t.yaml", &bad).expect("parse");
        let msgs: Vec<String> = l.errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(msgs.len(), 2, "{msgs:?}");
        assert!(msgs[0].contains("Service demo/web") && msgs[0].contains("10.96.0.999"));
        assert!(msgs[1].contains("Service demo/dns") && msgs[1].contains("ICMP"));
        assert_eq!(l.model.services.len(), 1);
        assert!(l.model.services.keys().any(|k| &*k.name == "ok"));
    }

    #[test]
    fn wrong_family_addresses_are_skipped_and_unknown_address_types_are_errors() {
        let bad = GOOD.replace("10.244.3.2", "2001:db8::1");
        let l = parse("t.yaml", &bad).expect("parse");
        assert!(l.errors.is_empty(), "{:?}", l.errors);
        let (id, svc) = l.model.services.iter().next().expect("one");
        let be: Vec<String> = l
            .model
            .backends(id, &svc.ports[0])
            .iter()
            .map(|b| b.to_string())
            .collect();
        assert_eq!(
            be,
            ["10.244.2.2:8080/TCP"],
            "the IPv4 endpoint stays, the IPv6 one is skipped"
        );
        let bad = GOOD.replace("addressType: IPv4", "addressType: IPX");
        let l = parse("t.yaml", &bad).expect("parse");
        assert!(l.errors[0].to_string().contains("unknown address family"));
    }

    #[test]
    fn a_document_of_the_wrong_types_is_named_and_the_others_are_kept() {
        let text = GOOD.to_string()
            + r#"
---
apiVersion: v1
kind: Service
metadata: {namespace: demo, name: eighty}
spec:
  clusterIP: 10.96.0.80
  ports: [{name: http, port: "eighty", protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {namespace: demo, name: five}
spec:
  clusterIP: 10.96.0.5
  ports: 5
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: many, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: "many"
---
apiVersion: v1
kind: Service
metadata: {namespace: demo, name: [not, a, name]}
spec: {clusterIP: 10.96.0.6, ports: [{port: 6}]}
---
apiVersion: v1
kind: Service
metadata: {namespace: demo, name: after}
spec:
  clusterIP: 10.96.0.81
  ports: [{name: http, port: 81, protocol: TCP}]
"#;
        let l = parse("t.yaml", &text).expect("one bad document does not fail the file");
        let msgs: Vec<String> = l.errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(msgs.len(), 4, "{msgs:?}");
        for (msg, named, says) in [
            (
                &msgs[0],
                "document 2: Service demo/eighty: spec.ports[0].port",
                "eighty",
            ),
            (&msgs[1], "document 3: Service demo/five: spec.ports", "5"),
            (
                &msgs[2],
                "document 4: EndpointSlice default/many: endpoints",
                "many",
            ),
            (
                &msgs[3],
                "document 5: Service demo/?: metadata.name",
                "sequence",
            ),
        ] {
            assert!(
                msg.starts_with(&format!("t.yaml: {named}: cannot decode: ")) && msg.contains(says),
                "{msg}"
            );
        }
        let names: Vec<&str> = l.model.services.keys().map(|k| &*k.name).collect();
        assert_eq!(
            names,
            ["after", "web"],
            "the good objects before and after are kept"
        );
        assert_eq!(l.model.slices.len(), 1, "the good slice is kept");
    }

    #[test]
    fn broken_yaml_is_an_error_for_the_whole_file() {
        assert!(parse("t.yaml", "kind: [unclosed").is_err());
    }
}
