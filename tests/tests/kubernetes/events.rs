//! A Service whose frontend cannot be programmed gets a Kubernetes Event, as `kubectl
//! describe service` shows them: the service map is full (`--service-map-max`), so api's
//! ClusterIP is left out: a Warning `MapFull` naming the map and its capacity, on api (its
//! uid too). It stays failing through a change: no second Event. Room made (web deleted),
//! api is programmed and a Normal `Programmed` Event says what recovered. Failing with the
//! same reason again within the de-duplication window (a full slot array this time, at
//! `--slot-map-max`) is the first Event's series (count 2), not a second Event. `xlb list services` shows the failing frontend meanwhile.

use std::{net::Ipv4Addr, time::Duration};

use serde_json::Value;
use xlb_tests::suites::kubernetes::{Cluster, WAIT, ready, service, slice, start};
use xlb_tests::{require_root, topology::pod_ip};

const API: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 11);
const API_FRONTEND: &str = "10.96.0.11:80/TCP";

/// The Events on Service `test/name`, oldest first.
fn events_on(c: &Cluster, name: &str) -> Vec<Value> {
    let mut e: Vec<Value> = c
        .api
        .events()
        .into_iter()
        .filter(|e| e["regarding"]["kind"] == "Service" && e["regarding"]["name"] == name)
        .collect();
    // By when each happened first (the series' patches bump resourceVersion).
    e.sort_by_key(|e| e["eventTime"].as_str().unwrap_or("").to_string());
    e
}

/// `(type, reason, series count)` of each Event.
fn shown(events: &[Value]) -> Vec<(String, String, i64)> {
    events
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap_or("").to_string(),
                e["reason"].as_str().unwrap_or("").to_string(),
                e["series"]["count"].as_i64().unwrap_or(1),
            )
        })
        .collect()
}

fn wait_events(c: &Cluster, name: &str, what: &str, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    c.wait_server(what, WAIT, |_| pred(&events_on(c, name)));
    events_on(c, name)
}

fn api_programmed(c: &Cluster) -> bool {
    lb_userspace::list::services(&xlb_tests::pins(&c.agent.pins))
        .unwrap_or_default()
        .iter()
        .any(|r| r.frontend == API_FRONTEND)
}

#[test]
fn a_frontend_the_full_service_map_leaves_out_is_an_event_on_its_service_once_and_so_is_its_recovery()
 {
    if !require_root() {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
    // web takes the one entry (its ClusterIP); api needs one too. Eight slots: web's range
    // of two, then (web gone, its range in quarantine) api's range of four.
    let mut c = start(
        "xev",
        false,
        &["--service-map-max", "1", "--slot-map-max", "8"],
    );
    c.api
        .apply_yaml(&service("web", xlb_tests::suites::kubernetes::WEB, ""))
        .expect("web");
    c.api
        .apply_yaml(&slice("web", &ready(&b[..2])))
        .expect("web's slice");
    c.wait_backends(2);
    let api_service = service("api", API, "");
    c.api.apply_yaml(&api_service).expect("api");
    c.api
        .apply_yaml(&slice("api", &ready(&b[..2])))
        .expect("api's slice");

    let events = wait_events(&c, "api", "a MapFull Event on api", |e| !e.is_empty());
    assert_eq!(shown(&events), [("Warning".into(), "MapFull".into(), 1)]);
    let e = &events[0];
    let uid = c.api.object("Service", "test/api").expect("api")["metadata"]["uid"].clone();
    assert!(uid.is_string());
    assert_eq!(
        e["regarding"]["uid"], uid,
        "kubectl describe finds it by the Service's uid"
    );
    assert_eq!(e["regarding"]["namespace"], "test");
    assert_eq!(e["metadata"]["namespace"], "test");
    assert_eq!(e["reportingController"], "xlb");
    assert_eq!(e["reportingInstance"], "node1");
    let note = e["note"].as_str().unwrap_or("");
    assert!(
        note.contains("test/api:http")
            && note.contains(lb_common::MAP_SVC)
            && note.contains("is full (capacity 1"),
        "the note names the frontend, the map and its capacity: {note}"
    );
    assert!(events_on(&c, "web").is_empty(), "web is healthy: no Event");
    assert!(!api_programmed(&c));
    // `xlb list services` shows api's frontend failing, web's programmed.
    let rows = lb_userspace::list::services(&xlb_tests::pins(&c.agent.pins)).expect("rows");
    let status: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| (r.service.as_str(), r.frontend.as_str(), r.status.as_str()))
        .collect();
    assert!(
        matches!(status.as_slice(), [("test/api:http", "-", failing), ("test/web:http", "10.96.0.10:80/TCP", "programmed")]
            if failing.starts_with("MapFull since 20") && failing.contains("is full (capacity 1")),
        "{status:#?}"
    );

    // api changes and still does not fit: the same failure, no second Event.
    let syncs = c.agent.log_text().matches(" synced ").count();
    c.api
        .apply_yaml(&slice("api", &ready(&b)))
        .expect("api's slice");
    c.agent
        .wait_log(" synced ", syncs + 1, WAIT)
        .unwrap_or_else(|e| panic!("api's change synced: {e}\n{}", c.agent.log_text()));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        shown(&events_on(&c, "api")),
        [("Warning".into(), "MapFull".into(), 1)]
    );

    // web goes: api fits and is programmed at once; told so.
    c.api.delete("Service", "test/web");
    c.agent
        .wait_for(WAIT, |rows| rows.iter().any(|r| r.frontend == API_FRONTEND))
        .unwrap_or_else(|e| {
            panic!(
                "api programmed once room was made: {e}\n{}",
                c.agent.log_text()
            )
        });
    let events = wait_events(&c, "api", "a Programmed Event on api", |e| e.len() == 2);
    assert_eq!(
        shown(&events),
        [
            ("Warning".into(), "MapFull".into(), 1),
            ("Normal".into(), "Programmed".into(), 1)
        ]
    );
    let rows = lb_userspace::list::services(&xlb_tests::pins(&c.agent.pins)).expect("rows");
    assert!(
        rows.iter().all(|r| r.status == "programmed"),
        "api is programmed: {rows:#?}"
    );
    let note = events[1]["note"].as_str().unwrap_or("");
    assert!(
        note.contains("test/api:http is programmed") && note.contains("MapFull"),
        "the Event says what recovered from what: {note}"
    );

    // The same failure again within the window: the first Event's series, not a new one
    // (five backends want a range of eight: the slot array has none, api keeps its four).
    c.api
        .apply_yaml(&slice(
            "api",
            &ready(&[b[0], b[1], b[2], pod_ip(5), pod_ip(6)]),
        ))
        .expect("api's slice");
    let events = wait_events(&c, "api", "the MapFull Event's series", |e| {
        shown(e).iter().any(|(_, r, n)| r == "MapFull" && *n == 2)
    });
    assert_eq!(
        shown(&events),
        [
            ("Warning".into(), "MapFull".into(), 2),
            ("Normal".into(), "Programmed".into(), 1)
        ]
    );
    let writes: Vec<String> = c
        .api
        .requests()
        .into_iter()
        .filter(|r| r.contains("events.k8s.io"))
        .collect();
    assert_eq!(
        writes
            .iter()
            .map(|r| r.split(' ').next().unwrap_or(""))
            .collect::<Vec<_>>(),
        ["POST", "POST", "PATCH"],
        "{writes:#?}"
    );
    assert!(
        writes
            .iter()
            .all(|r| r.ends_with("-> 201") || r.ends_with("-> 200")),
        "{writes:#?}"
    );
}
