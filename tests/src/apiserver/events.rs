//! events.k8s.io/v1 Events, as the real API server takes them from a recorder (kube-rs's
//! `Recorder`, client-go's `events` broadcaster): POST creates one in the namespace of the
//! path (201 with the stored object: uid, resourceVersion, creationTimestamp added), PATCH
//! with a JSON merge patch (`application/merge-patch+json`) updates one (its `series`).
//!
//! Checked as the real server checks them (`ValidateEventCreate`/`ValidateEventUpdate` of
//! events.k8s.io/v1): a name, an `eventTime`, a `type` of Normal or Warning,
//! `reportingController`, `reportingInstance`, `action` and `reason` (at most 128
//! characters), a `note` of at most 1024 bytes, a `regarding` object in the Event's own
//! namespace, a `series` with a count of at least 2 and a `lastObservedTime`; on update
//! those fields (but `series`) are immutable. A name that exists is 409 AlreadyExists, an
//! unknown one 404, another patch type 415.

use serde_json::{Value, json};

use super::{status::Status, store::Store};

/// The path prefix of namespaced Events.
pub(super) const PREFIX: &str = "/apis/events.k8s.io/v1/namespaces/";

const KIND: &str = "Event";

/// Fields an update may not change.
const IMMUTABLE: [&str; 9] = [
    "regarding",
    "related",
    "reason",
    "note",
    "type",
    "eventTime",
    "action",
    "reportingController",
    "reportingInstance",
];

/// `(namespace, name)` of an Events path (no name: the collection); none for another path.
pub(super) fn parse_path(path: &str) -> Option<(&str, Option<&str>)> {
    let rest = path.strip_prefix(PREFIX)?;
    let (ns, rest) = rest.split_once('/')?;
    match rest.strip_prefix("events")? {
        "" => Some((ns, None)),
        name => Some((ns, Some(name.strip_prefix('/')?).filter(|n| !n.is_empty()))),
    }
}

fn quoted(name: &str) -> String {
    format!("events.events.k8s.io {name:?}")
}

/// POST: `body` created in `ns`.
pub(super) fn create(store: &mut Store, ns: &str, body: &[u8]) -> Result<Value, Status> {
    let mut event: Value = serde_json::from_slice(body)
        .map_err(|e| Status::bad_request(format!("the body is not an Event: {e}")))?;
    match event["metadata"]["namespace"].as_str() {
        Some(n) if n != ns => {
            return Err(Status::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request".into(),
            ));
        }
        _ => event["metadata"]["namespace"] = json!(ns),
    }
    let name = event["metadata"]["name"].as_str().unwrap_or("").to_string();
    if name.is_empty() {
        return Err(Status::invalid("Event.events.k8s.io \"\" is invalid: metadata.name: Required value: name or generateName is required".to_string()));
    }
    invalid(&name, check(&event, ns))?;
    if store.get(KIND, &format!("{ns}/{name}")).is_some() {
        return Err(Status::already_exists(format!(
            "{} already exists",
            quoted(&name)
        )));
    }
    event["kind"] = json!(KIND);
    event["apiVersion"] = json!("events.k8s.io/v1");
    event["metadata"]["creationTimestamp"] = json!(now_rfc3339());
    // The server assigns the uid.
    if let Some(m) = event["metadata"].as_object_mut() {
        m.remove("uid");
    }
    store.apply(event);
    Ok(store
        .get(KIND, &format!("{ns}/{name}"))
        .cloned()
        .unwrap_or_default())
}

/// PATCH of `ns/name` with a merge patch.
pub(super) fn patch(
    store: &mut Store,
    ns: &str,
    name: &str,
    content_type: &str,
    body: &[u8],
) -> Result<Value, Status> {
    if content_type != "application/merge-patch+json" {
        return Err(Status::unsupported_media_type(content_type));
    }
    let key = format!("{ns}/{name}");
    let Some(old) = store.get(KIND, &key).cloned() else {
        return Err(Status::not_found_named(format!(
            "{} not found",
            quoted(name)
        )));
    };
    let p: Value = serde_json::from_slice(body)
        .map_err(|e| Status::bad_request(format!("the body is not a merge patch: {e}")))?;
    let mut new = old.clone();
    merge(&mut new, &p);
    // The object's identity and server-set fields stay.
    for field in ["name", "namespace", "uid", "creationTimestamp"] {
        new["metadata"][field] = old["metadata"][field].clone();
    }
    let mut errors = check(&new, ns);
    for f in IMMUTABLE {
        if new[f] != old[f] {
            errors.push(format!("{f}: Invalid value: field is immutable"));
        }
    }
    invalid(name, errors)?;
    store.apply(new);
    Ok(store.get(KIND, &key).cloned().unwrap_or_default())
}

/// RFC 7386: objects merged key by key, `null` removes, anything else replaces.
fn merge(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Some(t) = target.as_object_mut() {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

fn invalid(name: &str, errors: Vec<String>) -> Result<(), Status> {
    match errors.is_empty() {
        true => Ok(()),
        false => Err(Status::invalid(format!(
            "Event.events.k8s.io {name:?} is invalid: [{}]",
            errors.join(", ")
        ))),
    }
}

/// What the real server's validation of an events.k8s.io/v1 Event refuses.
fn check(e: &Value, ns: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let text = |f: &str| e[f].as_str().unwrap_or("");
    if e["eventTime"].is_null() {
        errors.push("eventTime: Required value".to_string());
    }
    if !matches!(text("type"), "Normal" | "Warning") {
        errors.push(format!(
            "type: Unsupported value: {:?}: supported values: \"Normal\", \"Warning\"",
            text("type")
        ));
    }
    for f in [
        "reportingController",
        "reportingInstance",
        "action",
        "reason",
    ] {
        match text(f).len() {
            0 => errors.push(format!("{f}: Required value")),
            n if n > 128 => errors.push(format!("{f}: Too long: may not be more than 128 bytes")),
            _ => {}
        }
    }
    if text("note").len() > 1024 {
        errors.push("note: Too long: may not be more than 1024 bytes".to_string());
    }
    match e["regarding"]["namespace"].as_str() {
        Some(n) if n != ns => errors.push(format!(
            "regarding.namespace: Invalid value: {n:?}: does not match event.namespace"
        )),
        _ => {}
    }
    let series = &e["series"];
    if !series.is_null() {
        if series["count"].as_i64().unwrap_or(0) < 2 {
            errors.push("series.count: Invalid value: should be at least 2".to_string());
        }
        if series["lastObservedTime"].is_null() {
            errors.push("series.lastObservedTime: Required value".to_string());
        }
    }
    errors
}

/// Now, as the API server writes a timestamp (seconds).
fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(name: &str) -> Value {
        json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": name, "namespace": "t"},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "type": "Warning", "reason": "MapFull", "action": "ProgramFrontends",
            "note": "full", "reportingController": "xlb", "reportingInstance": "node-1",
            "regarding": {"apiVersion": "v1", "kind": "Service", "namespace": "t", "name": "web"},
        })
    }

    fn body(v: &Value) -> Vec<u8> {
        v.to_string().into_bytes()
    }

    #[test]
    fn paths() {
        assert_eq!(
            parse_path("/apis/events.k8s.io/v1/namespaces/t/events"),
            Some(("t", None))
        );
        assert_eq!(
            parse_path("/apis/events.k8s.io/v1/namespaces/t/events/web.1"),
            Some(("t", Some("web.1")))
        );
        assert_eq!(parse_path("/api/v1/namespaces/t/events"), None);
        assert_eq!(
            parse_path("/apis/events.k8s.io/v1/namespaces/t/eventsx"),
            None
        );
    }

    #[test]
    fn created_once_patched_in_its_series_and_checked_as_the_real_server_does() {
        let mut s = Store::default();
        let created = create(&mut s, "t", &body(&event("web.1"))).expect("created");
        assert!(
            created["metadata"]["uid"].is_string()
                && created["metadata"]["resourceVersion"].is_string()
        );
        let again = create(&mut s, "t", &body(&event("web.1"))).expect_err("exists");
        assert_eq!(again.code, 409);
        let wrong_ns = create(&mut s, "u", &body(&event("web.2"))).expect_err("namespace");
        assert_eq!(wrong_ns.code, 400);
        let mut bad = event("web.3");
        bad["reason"] = Value::Null;
        bad["regarding"]["namespace"] = json!("u");
        let e = create(&mut s, "t", &body(&bad)).expect_err("invalid");
        assert_eq!(e.code, 422);
        assert!(
            e.message.contains("reason: Required value")
                && e.message.contains("regarding.namespace"),
            "{}",
            e.message
        );

        let series =
            json!({"series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"}});
        let merge_type = "application/merge-patch+json";
        let p = patch(&mut s, "t", "web.1", merge_type, &body(&series)).expect("patched");
        assert_eq!(p["series"]["count"], 2);
        assert_eq!(p["note"], "full");
        assert_eq!(p["metadata"]["uid"], created["metadata"]["uid"]);
        let note = json!({"note": "other"});
        assert_eq!(
            patch(&mut s, "t", "web.1", merge_type, &body(&note))
                .expect_err("immutable")
                .code,
            422
        );
        assert_eq!(
            patch(&mut s, "t", "web.9", merge_type, &body(&series))
                .expect_err("unknown")
                .code,
            404
        );
        let json_patch = "application/json-patch+json";
        assert_eq!(
            patch(&mut s, "t", "web.1", json_patch, b"[]")
                .expect_err("type")
                .code,
            415
        );
    }

    #[test]
    fn timestamps_are_rfc3339() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.starts_with("20") && t.ends_with('Z'), "{t}");
    }
}
