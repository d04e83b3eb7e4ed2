//! WATCH as the real server streams it, one JSON event a line:
//!
//! * from a resourceVersion N: every change after N; N older than the compaction point gets
//!   an `ERROR` event with a 410 `Expired` Status and the stream ends (a watch from the
//!   compaction point itself is served);
//! * without a resourceVersion, or `0`: synthetic ADDED events for the current state, then
//!   the changes after it ("Get State and Start at Most Recent"), not the history;
//! * `sendInitialEvents=true` (streaming lists; needs `allowWatchBookmarks=true` and
//!   `resourceVersionMatch=NotOlderThan`, else 422): the same ADDED events, then a BOOKMARK
//!   annotated `k8s.io/initial-events-end`;
//! * through a selector, a change that makes an object stop matching is sent as DELETED (the
//!   object before the change, at the change's resourceVersion) and one that makes it start
//!   matching as ADDED;
//! * `allowWatchBookmarks=true`: a BOOKMARK with the current resourceVersion every
//!   [`super::BOOKMARK_EVERY`]; `timeoutSeconds` ends the stream.

use std::{sync::Arc, time::Duration};

use hyper::body::Bytes;
use serde_json::{Value, json};
use tokio::{sync::mpsc, time::Instant};

use super::{
    Kind, Shared,
    list::Query,
    selector::Selector,
    status::Status,
    store::{Event, Store, TooOld},
};

/// A parsed watch request.
#[derive(Debug)]
pub(super) struct WatchQuery {
    selector: Selector,
    /// `Some(N)`: the changes after N. `None`: from the current state.
    from: Option<u64>,
    /// Start with ADDED events for the current state.
    initial: bool,
    /// End the initial events with an `initial-events-end` BOOKMARK.
    end_bookmark: bool,
    bookmarks: bool,
    timeout: Duration,
}

fn param<'q>(q: &'q Query, name: &str) -> Option<&'q str> {
    q.get(name).map(String::as_str).filter(|v| !v.is_empty())
}

fn flag(q: &Query, name: &str) -> Result<Option<bool>, Status> {
    match param(q, name) {
        None => Ok(None),
        Some("true" | "1") => Ok(Some(true)),
        Some("false" | "0") => Ok(Some(false)),
        Some(other) => Err(Status::bad_request(format!(
            "{name}: invalid value {other:?}"
        ))),
    }
}

/// Parses a watch request's parameters, refusing the combinations the real server refuses.
pub(super) fn parse(q: &Query) -> Result<WatchQuery, Status> {
    let selector = Selector::parse(
        param(q, "labelSelector").unwrap_or(""),
        param(q, "fieldSelector").unwrap_or(""),
    )?;
    let from = match param(q, "resourceVersion") {
        None | Some("0") => None,
        Some(text) => Some(
            text.parse::<u64>()
                .map_err(|_| Status::bad_request(format!("invalid resource version: {text:?}")))?,
        ),
    };
    let bookmarks = flag(q, "allowWatchBookmarks")?.unwrap_or(false);
    let send_initial = flag(q, "sendInitialEvents")?;
    let matching = param(q, "resourceVersionMatch");
    match (send_initial, matching) {
        (None, Some(_)) => {
            return Err(Status::invalid(
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided".into(),
            ));
        }
        (Some(_), m) if m != Some("NotOlderThan") => {
            return Err(Status::invalid(
                "resourceVersionMatch: Forbidden: sendInitialEvents requires resourceVersionMatch=NotOlderThan".into(),
            ));
        }
        (Some(true), _) if !bookmarks => {
            return Err(Status::invalid(
                "allowWatchBookmarks: Forbidden: sendInitialEvents requires setting allowWatchBookmarks=true".into(),
            ));
        }
        _ => {}
    }
    let timeout = match param(q, "timeoutSeconds") {
        None => Duration::from_secs(1800),
        Some(t) => Duration::from_secs(
            t.parse()
                .map_err(|_| Status::bad_request(format!("invalid timeoutSeconds {t:?}")))?,
        ),
    };
    Ok(WatchQuery {
        selector,
        initial: send_initial.unwrap_or(from.is_none()),
        end_bookmark: send_initial == Some(true),
        // With initial events, the changes follow the state they show.
        from: if send_initial == Some(true) {
            None
        } else {
            from
        },
        bookmarks,
        timeout,
    })
}

/// Where a watch starts: its synthetic ADDED objects and the resourceVersion it follows.
struct Start {
    initial: Vec<Value>,
    from: u64,
}

fn start(store: &Store, kind: &str, w: &WatchQuery) -> Result<Start, TooOld> {
    let Some(from) = w.from else {
        let initial = if w.initial {
            store
                .at(kind, store.rv())?
                .into_values()
                .filter(|o| w.selector.matches(o))
                .collect()
        } else {
            Vec::new()
        };
        return Ok(Start {
            initial,
            from: store.rv(),
        });
    };
    store.since(kind, from)?;
    Ok(Start {
        initial: Vec::new(),
        from,
    })
}

/// The event a watcher through `selector` sees for `e`, if any.
fn event(e: &Event, selector: &Selector) -> Option<Value> {
    let now = e.object.as_ref().filter(|o| selector.matches(o));
    let before = e.prev.as_ref().filter(|o| selector.matches(o));
    let (kind, object) = match (now, before) {
        (Some(o), None) => ("ADDED", o.clone()),
        (Some(o), Some(_)) => ("MODIFIED", o.clone()),
        (None, Some(p)) => {
            let mut gone = p.clone();
            gone["metadata"]["resourceVersion"] = json!(e.rv.to_string());
            ("DELETED", gone)
        }
        (None, None) => return None,
    };
    Some(json!({"type": kind, "object": object}))
}

fn bookmark(kind: &Kind, rv: u64, initial_end: bool) -> Value {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({"type": "BOOKMARK", "object": {"kind": kind.kind, "apiVersion": kind.api_version, "metadata": metadata}})
}

/// The 410 `ERROR` event for a watch whose history is gone (counted by the server).
fn gone(shared: &Shared, kind: &str, e: TooOld) -> Value {
    let status = Status::expired(format!(
        "too old resource version: {} ({})",
        e.requested, e.oldest
    ));
    shared
        .lock()
        .watch_errors
        .push((kind.to_string(), status.code));
    json!({"type": "ERROR", "object": status.body()})
}

/// What a watch has to send next.
enum Next {
    /// Its events, and the resourceVersion they bring it to.
    Events(Vec<Value>, u64),
    /// Its history was compacted from under it.
    Gone(TooOld),
    /// Cut, or the server is stopping.
    End,
}

fn next(shared: &Shared, kind: &str, w: &WatchQuery, generation: u64, from: u64) -> Next {
    let inner = shared.lock();
    if inner.generation != generation {
        return Next::End;
    }
    match inner.store.since(kind, from) {
        Ok(events) => Next::Events(
            events
                .iter()
                .filter_map(|e| event(e, &w.selector))
                .collect(),
            inner.store.rv(),
        ),
        Err(e) => Next::Gone(e),
    }
}

/// Sends one event line; false once the client is gone.
/// Sends one watch event line, `type` before `object` as the real API server writes it
/// (serde_json's map would sort `object` first, and a client then buffers the whole object
/// before it knows what it is).
async fn send(tx: &mpsc::Sender<Bytes>, v: &Value) -> bool {
    let line = match (v.get("type"), v.get("object")) {
        (Some(t), Some(o)) => format!("{{\"type\":{t},\"object\":{o}}}\n"),
        _ => format!("{v}\n"),
    };
    tx.send(Bytes::from(line)).await.is_ok()
}

/// Registers an open watch's position (the resourceVersion its client has seen) and removes
/// it when the watch ends.
struct Position<'s> {
    shared: &'s Shared,
    id: u64,
}

impl<'s> Position<'s> {
    fn open(shared: &'s Shared, kind: &str) -> Self {
        let mut inner = shared.lock();
        inner.next_id += 1;
        let id = inner.next_id;
        inner.watches.insert(id, (kind.to_string(), 0));
        Position { shared, id }
    }

    fn at(&self, rv: u64) {
        if let Some(w) = self.shared.lock().watches.get_mut(&self.id) {
            w.1 = rv;
        }
    }
}

impl Drop for Position<'_> {
    fn drop(&mut self) {
        self.shared.lock().watches.remove(&self.id);
    }
}

fn rv_of(v: &Value) -> u64 {
    v["object"]["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// Streams a watch of `kind` into `tx` until it is cut, times out, loses its history, or
/// its client goes away.
pub(super) async fn run(
    shared: Arc<Shared>,
    kind: &'static Kind,
    w: WatchQuery,
    tx: mpsc::Sender<Bytes>,
) {
    let mut changes = shared.changed.subscribe();
    let (generation, begun) = {
        let inner = shared.lock();
        (inner.generation, start(&inner.store, kind.kind, &w))
    };
    let position = Position::open(&shared, kind.kind);
    let mut from = match begun {
        Ok(s) => {
            for o in &s.initial {
                if !send(&tx, &json!({"type": "ADDED", "object": o})).await {
                    return;
                }
            }
            if w.end_bookmark && !send(&tx, &bookmark(kind, s.from, true)).await {
                return;
            }
            s.from
        }
        Err(e) => {
            send(&tx, &gone(&shared, kind.kind, e)).await;
            return;
        }
    };
    position.at(from);
    let deadline = Instant::now() + w.timeout;
    let every = shared.bookmark_every;
    let mut ticks = tokio::time::interval_at(Instant::now() + every, every);
    loop {
        match next(&shared, kind.kind, &w, generation, from) {
            Next::End => return,
            Next::Gone(e) => {
                send(&tx, &gone(&shared, kind.kind, e)).await;
                return;
            }
            Next::Events(events, upto) => {
                for e in &events {
                    if !send(&tx, e).await {
                        return;
                    }
                    position.at(rv_of(e));
                }
                from = upto;
            }
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            _ = ticks.tick(), if w.bookmarks => {
                if !send(&tx, &bookmark(kind, from, false)).await {
                    return;
                }
                position.at(from);
            }
            () = tokio::time::sleep_until(deadline) => return,
            () = tx.closed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Query {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn leaving_and_entering_the_selector() {
        let sel = Selector::parse("!headless", "").expect("selector");
        let plain = json!({"metadata": {"name": "a", "resourceVersion": "1"}});
        let marked =
            json!({"metadata": {"name": "a", "labels": {"headless": ""}, "resourceVersion": "2"}});
        let leave = Event {
            rv: 2,
            kind: "Service".into(),
            key: "/a".into(),
            prev: Some(plain.clone()),
            object: Some(marked.clone()),
        };
        let out = event(&leave, &sel).expect("an event");
        assert_eq!(out["type"], "DELETED");
        assert_eq!(out["object"]["metadata"]["resourceVersion"], "2");
        assert!(
            out["object"]["metadata"]["labels"].is_null(),
            "the object before"
        );
        let enter = Event {
            prev: Some(marked.clone()),
            object: Some(plain.clone()),
            ..leave.clone()
        };
        assert_eq!(event(&enter, &sel).expect("an event")["type"], "ADDED");
        let outside = Event {
            prev: Some(marked.clone()),
            object: Some(marked),
            ..leave
        };
        assert!(event(&outside, &sel).is_none());
    }

    #[test]
    fn start_points() {
        let mut s = Store::default();
        for i in 0..3 {
            s.apply(json!({"kind": "Service", "metadata": {"namespace": "t", "name": "a"}, "spec": {"i": i}}));
        }
        let now = parse(&q(&[])).expect("no rv");
        let st = start(&s, "Service", &now).expect("start");
        assert_eq!(
            (st.initial.len(), st.from),
            (1, 3),
            "the state, not the history"
        );
        let zero = parse(&q(&[("resourceVersion", "0")])).expect("rv 0");
        assert_eq!(start(&s, "Service", &zero).expect("start").initial.len(), 1);
        let none = parse(&q(&[
            ("resourceVersion", "0"),
            ("sendInitialEvents", "false"),
            ("resourceVersionMatch", "NotOlderThan"),
        ]))
        .expect("no initial events");
        assert!(
            start(&s, "Service", &none)
                .expect("start")
                .initial
                .is_empty()
        );
        let bad = parse(&q(&[
            ("sendInitialEvents", "true"),
            ("resourceVersionMatch", "NotOlderThan"),
        ]));
        assert_eq!(
            bad.map(|_| ()).map_err(|s| s.code),
            Err(422),
            "needs bookmarks"
        );
        let bad = parse(&q(&[
            ("resourceVersion", "2"),
            ("resourceVersionMatch", "NotOlderThan"),
        ]));
        assert_eq!(bad.map(|_| ()).map_err(|s| s.code), Err(422));
        s.compact();
        let at = parse(&q(&[("resourceVersion", "3")])).expect("rv 3");
        assert!(
            start(&s, "Service", &at).is_ok(),
            "the compaction point is served"
        );
        let old = parse(&q(&[("resourceVersion", "2")])).expect("rv 2");
        assert_eq!(
            start(&s, "Service", &old).map(|_| ()).map_err(|e| e.oldest),
            Err(3)
        );
    }
}
