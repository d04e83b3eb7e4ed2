//! LIST as the real server answers it: `limit` pages with `continue` tokens, every page of one
//! list at the resourceVersion of its first (a consistent snapshot, whatever changed since),
//! `remainingItemCount` when there is no selector, a 410 for a continue token whose
//! resourceVersion was compacted (with the inconsistent continuation in `metadata.continue`),
//! and `resourceVersion` / `resourceVersionMatch` (unset: the most recent state; `0`: any;
//! `N`: not older than N, or exactly N when a limit is set or `Exact` is asked).

use std::{collections::BTreeMap, ops::Bound};

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use serde_json::{Value, json};

use super::{
    Kind,
    selector::Selector,
    status::Status,
    store::{Store, TooOld},
};

/// A request's query parameters.
pub(super) type Query = BTreeMap<String, String>;

/// What a continue token holds (as the real server's: base64url JSON).
#[derive(Debug, PartialEq)]
struct Token {
    /// -1: continue at the most recent resourceVersion (the inconsistent continuation).
    rv: i64,
    /// The first key of the next page.
    start: String,
}

const TOKEN_VERSION: &str = "meta.k8s.io/v1";

fn encode(token: &Token) -> String {
    let json = json!({"v": TOKEN_VERSION, "rv": token.rv, "start": token.start});
    URL_SAFE_NO_PAD.encode(json.to_string())
}

fn decode(text: &str) -> Result<Token, Status> {
    let invalid = |why: &str| Status::bad_request(format!("continue key is not valid: {why}"));
    let bytes = URL_SAFE_NO_PAD
        .decode(text)
        .map_err(|_| invalid("not base64"))?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| invalid("not JSON"))?;
    if v["v"] != TOKEN_VERSION {
        return Err(invalid(
            "incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        ));
    }
    let rv = v["rv"].as_i64().ok_or_else(|| invalid("no rv"))?;
    let start = v["start"].as_str().ok_or_else(|| invalid("no start"))?;
    Ok(Token {
        rv,
        start: start.to_string(),
    })
}

fn param<'q>(q: &'q Query, name: &str) -> Option<&'q str> {
    q.get(name).map(String::as_str).filter(|v| !v.is_empty())
}

fn limit(q: &Query) -> Result<Option<usize>, Status> {
    match param(q, "limit") {
        None => Ok(None),
        Some(l) => l
            .parse::<usize>()
            .map(|l| (l > 0).then_some(l))
            .map_err(|_| Status::bad_request(format!("invalid limit {l:?}"))),
    }
}

fn expired_continue(start: &str) -> Status {
    let mut s = Status::expired("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.".to_string());
    s.continue_token = Some(encode(&Token {
        rv: -1,
        start: start.to_string(),
    }));
    s
}

fn too_old(e: TooOld) -> Status {
    Status::expired(format!(
        "too old resource version: {} ({})",
        e.requested, e.oldest
    ))
}

/// The resourceVersion a list without a continue token reads at.
fn read_point(store: &Store, q: &Query, limited: bool) -> Result<u64, Status> {
    let current = store.rv();
    let matching = param(q, "resourceVersionMatch");
    let Some(text) = param(q, "resourceVersion") else {
        if matching.is_some() {
            return Err(Status::bad_request(
                "resourceVersionMatch is forbidden unless resourceVersion is provided".into(),
            ));
        }
        return Ok(current);
    };
    let rv: u64 = text
        .parse()
        .map_err(|_| Status::bad_request(format!("invalid resource version: {text:?}")))?;
    let exact = match matching {
        None => limited && rv != 0,
        Some("NotOlderThan") => false,
        Some("Exact") if rv == 0 => {
            return Err(Status::bad_request(
                "resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\"".into(),
            ));
        }
        Some("Exact") => true,
        Some(other) => {
            return Err(Status::bad_request(format!(
                "unsupported resourceVersionMatch {other:?}"
            )));
        }
    };
    if rv > current {
        return Err(Status::too_large(rv, current));
    }
    Ok(if exact { rv } else { current })
}

/// Where a list reads: its resourceVersion and the first key.
fn snapshot_point(store: &Store, q: &Query, limited: bool) -> Result<(u64, String), Status> {
    let Some(text) = param(q, "continue") else {
        return Ok((read_point(store, q, limited)?, String::new()));
    };
    if param(q, "resourceVersion").is_some() || param(q, "resourceVersionMatch").is_some() {
        return Err(Status::bad_request(
            "specifying resource version is not allowed when using continue".into(),
        ));
    }
    let token = decode(text)?;
    let rv = u64::try_from(token.rv).unwrap_or(store.rv());
    Ok((rv, token.start))
}

/// One page of the list of `kind` for the query `q`.
pub(super) fn page(store: &Store, kind: &Kind, q: &Query) -> Result<Value, Status> {
    let selector = Selector::parse(
        param(q, "labelSelector").unwrap_or(""),
        param(q, "fieldSelector").unwrap_or(""),
    )?;
    let limit = limit(q)?;
    let (rv, start) = snapshot_point(store, q, limit.is_some())?;
    let objects = store.at(kind.kind, rv).map_err(|e| {
        if param(q, "continue").is_some() {
            expired_continue(&start)
        } else {
            too_old(e)
        }
    })?;
    let mut matching = objects
        .range::<str, _>((Bound::Included(start.as_str()), Bound::Unbounded))
        .filter(|(_, o)| selector.matches(o));
    let items: Vec<(&String, &Value)> = matching
        .by_ref()
        .take(limit.unwrap_or(usize::MAX))
        .collect();
    let remaining = matching.count();
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if remaining > 0
        && let Some((last, _)) = items.last()
    {
        metadata["continue"] = json!(encode(&Token {
            rv: rv as i64,
            start: format!("{last}\u{0}"),
        }));
        // Counting under a selector is what the real server does not do.
        if selector.is_empty() {
            metadata["remainingItemCount"] = json!(remaining);
        }
    }
    Ok(json!({
        "kind": kind.list_kind,
        "apiVersion": kind.api_version,
        "metadata": metadata,
        "items": items.into_iter().map(|(_, o)| o.clone()).collect::<Vec<_>>(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::KINDS;

    fn store(n: usize) -> Store {
        let mut s = Store::default();
        for i in 0..n {
            s.apply(json!({"kind": "Service", "metadata": {"namespace": "t", "name": format!("s{i:04}")}}));
        }
        s
    }

    fn query(pairs: &[(&str, &str)]) -> Query {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn names(list: &Value) -> Vec<String> {
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| o["metadata"]["name"].as_str().unwrap_or("").to_string())
            .collect()
    }

    #[test]
    fn pages_are_one_consistent_snapshot() {
        let mut s = store(5);
        let kind = &KINDS[0];
        let first = page(&s, kind, &query(&[("limit", "2")])).expect("page 1");
        assert_eq!(names(&first), ["s0000", "s0001"]);
        assert_eq!(first["metadata"]["remainingItemCount"], 3);
        // A change after the first page is not in the later ones.
        s.apply(json!({"kind": "Service", "metadata": {"namespace": "t", "name": "s0003"}, "spec": {"x": 1}}));
        assert!(s.delete("Service", "t/s0004"));
        let token = first["metadata"]["continue"].as_str().expect("token");
        let second = page(&s, kind, &query(&[("limit", "2"), ("continue", token)])).expect("2");
        assert_eq!(names(&second), ["s0002", "s0003"]);
        assert!(second["items"][1]["spec"].is_null());
        assert_eq!(second["metadata"]["resourceVersion"], "5");
        let token = second["metadata"]["continue"].as_str().expect("token");
        let third = page(&s, kind, &query(&[("limit", "2"), ("continue", token)])).expect("3");
        assert_eq!(names(&third), ["s0004"]);
        assert!(third["metadata"]["continue"].is_null());
        // Once compacted, the token is expired and the inconsistent one continues now.
        s.compact();
        let gone = page(&s, kind, &query(&[("continue", token)])).expect_err("expired");
        assert_eq!((gone.code, gone.reason), (410, "Expired"));
        let next = gone.continue_token.expect("inconsistent continuation");
        let rest = page(&s, kind, &query(&[("continue", &next)])).expect("rest");
        assert!(names(&rest).is_empty(), "s0004 was deleted");
    }

    #[test]
    fn resource_version_semantics() {
        let mut s = store(2);
        s.apply(json!({"kind": "Service", "metadata": {"namespace": "t", "name": "s0000"}, "spec": {"x": 1}}));
        let kind = &KINDS[0];
        let exact = page(
            &s,
            kind,
            &query(&[("resourceVersion", "1"), ("limit", "5")]),
        )
        .expect("exact");
        assert_eq!(names(&exact), ["s0000"]);
        let newer = page(&s, kind, &query(&[("resourceVersion", "1")])).expect("not older");
        assert_eq!(newer["metadata"]["resourceVersion"], "3");
        let any = page(
            &s,
            kind,
            &query(&[("resourceVersion", "0"), ("limit", "1")]),
        )
        .expect("0");
        assert_eq!(any["metadata"]["resourceVersion"], "3");
        let future = page(&s, kind, &query(&[("resourceVersion", "9")])).expect_err("future");
        assert_eq!(future.code, 504);
        s.compact();
        let old = page(
            &s,
            kind,
            &query(&[("resourceVersion", "1"), ("resourceVersionMatch", "Exact")]),
        )
        .expect_err("compacted");
        assert_eq!(old.code, 410);
        let bad = page(&s, kind, &query(&[("continue", "%%%")])).expect_err("bad token");
        assert_eq!(bad.code, 400);
    }
}
