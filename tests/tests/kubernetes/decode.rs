//! The watch decodes only what the proxy reads: a Service whose status carries a condition
//! with `lastTransitionTime: null` (the API server accepts it; Kubernetes' e2e status
//! lifecycle test writes one) and one with fields xlb does not know are watched without a
//! single stream failure; one whose read field cannot be decoded is reported by name and
//! skipped; a Service created right after them (on the same watch) applies at once.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use serde_json::json;
use xlb_tests::suites::kubernetes::{SERVICES, SLICES, WEB, ready, service, slice, start};
use xlb_tests::{require_root, topology::pod_ip};

/// A Service `name` on `ip`:80 with one ready endpoint, as JSON; `extra` is merged into
/// the Service object.
fn odd_service(name: &str, ip: Ipv4Addr, extra: serde_json::Value) -> [serde_json::Value; 2] {
    let mut svc = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"namespace": "test", "name": name},
        "spec": {"clusterIP": ip.to_string(),
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
    });
    merge(&mut svc, extra);
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"namespace": "test", "name": format!("{name}-abc"),
                     "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": xlb_tests::scenario::TCP_PORT, "protocol": "TCP"}],
        "endpoints": [{"addresses": [pod_ip(2).to_string()], "nodeName": "node1",
                       "conditions": {"ready": true}}],
    });
    [svc, slice]
}

fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
    match (into, from) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

#[test]
fn odd_services_never_fail_the_watch_and_the_others_keep_syncing() {
    if !require_root() {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
    let mut c = start("xo", false, &[]);
    c.api.apply_yaml(&service("web", WEB, "")).expect("svc");
    c.api.apply_yaml(&slice("web", &ready(&b))).expect("slice");
    // The slice of a Service created later (it waits for its Service).
    let after = Ipv4Addr::new(10, 96, 0, 33);
    c.api
        .apply_all(odd_service("after", after, json!({})).into_iter().skip(1));
    c.wait_backends(3);
    c.wait_watches_current();

    // From here on a failed watch would show as a new request (the watcher's restart).
    let watched = Instant::now();
    let null_time = Ipv4Addr::new(10, 96, 0, 30);
    let unknown = Ipv4Addr::new(10, 96, 0, 31);
    let bad = Ipv4Addr::new(10, 96, 0, 32);
    c.api.apply_all(odd_service(
        "null-time",
        null_time,
        json!({"status": {"conditions": [{
            "type": "StatusUpdate", "status": "True", "reason": "E2E",
            "message": "Set from e2e test", "lastTransitionTime": null,
        }]}}),
    ));
    c.api.apply_all(odd_service(
        "unknown",
        unknown,
        json!({
            "futureTopLevel": {"a": [1, 2, 3]},
            "metadata": {"futureMeta": true, "managedFields": [{"time": null}]},
            "spec": {"futureSpec": "x", "ports": [{"name": "http", "port": 80,
                     "protocol": "TCP", "futurePortField": null}]},
            "status": {"futureStatus": 5, "loadBalancer": {}},
        }),
    ));
    // A field the proxy reads, of the wrong type (the real API server would refuse it).
    c.api.apply_all(odd_service(
        "bad",
        bad,
        json!({"spec": {"ports": [{"name": "http", "port": "eighty"}]}}),
    ));
    // Right after them, another Service is created (on the same watch) and web's slice
    // changes: both apply on their events, with no list in between (how fast is for the
    // sync bench to say; the wait is only a bound to fail by).
    let changed = Instant::now();
    c.api
        .apply_all(odd_service("after", after, json!({})).into_iter().take(1));
    c.api
        .apply_yaml(&slice("web", &ready(&b[..2])))
        .expect("slice");
    c.wait_backends(2);
    c.agent
        .wait_for(Duration::from_secs(10), |rows| {
            rows.iter()
                .any(|r| r.frontend == format!("{after}:80/TCP") && r.backends.len() == 1)
        })
        .unwrap_or_else(|e| {
            panic!(
                "the Service created after the odd ones: {e}\n{}",
                c.agent.log_text()
            )
        });
    eprintln!(
        "both changes applied {:?} after they were made",
        changed.elapsed()
    );
    // A watch that failed on an object would be opened again (or the lists read again).
    let again: Vec<String> = c
        .api
        .served()
        .into_iter()
        .filter(|r| r.at >= watched && (r.is_for(SERVICES) || r.is_for(SLICES)))
        .map(|r| r.target)
        .collect();
    assert!(
        again.is_empty(),
        "the odd Services restarted the watch (requests after them: {again:?})\n{}",
        c.agent.log_text()
    );
    c.agent
        .wait_for(Duration::from_secs(3), |rows| {
            let has = |ip: Ipv4Addr| {
                rows.iter()
                    .any(|r| r.frontend == format!("{ip}:80/TCP") && r.backends.len() == 1)
            };
            has(null_time) && has(unknown)
        })
        .unwrap_or_else(|e| panic!("the odd Services are served: {e}\n{}", c.agent.log_text()));
    let log = c.agent.log_text();
    let failures: Vec<&str> = log.lines().filter(|l| l.contains("watch of ")).collect();
    assert!(
        failures.is_empty(),
        "the watch failed: {failures:#?}\n{}",
        c.api.diagnosis()
    );
    assert!(
        log.lines()
            .any(|l| l.contains("Service test/bad: cannot decode")
                && l.contains("spec.ports[0].port")),
        "the undecodable Service is named with its field:\n{log}"
    );
    let rows = lb_userspace::list::services(&xlb_tests::pins(&c.agent.pins)).expect("rows");
    assert!(
        !rows.iter().any(|r| r.frontend == format!("{bad}:80/TCP")),
        "the undecodable Service is skipped: {rows:?}"
    );
    assert!(
        c.api.watch_errors().is_empty(),
        "{:?}",
        c.api.watch_errors()
    );
}
