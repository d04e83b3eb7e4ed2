//! Health and metrics endpoints as kube-proxy serves them.

use std::{net::Ipv4Addr, time::Duration};

use xlb_tests::suites::kubernetes::{Cluster, WAIT, WEB, ready, service, slice, start};
use xlb_tests::{require_root, topology::pod_ip};

/// GET `path` on 127.0.0.1:`port` inside the node namespace: (status code, body).
fn http_get(c: &Cluster, port: u16, path: &str) -> (u16, String) {
    try_http_get(c, port, path).unwrap_or_else(|e| panic!("GET {port}: {e}"))
}

/// [`http_get`], or why it failed (the listener not up yet: connection refused).
fn try_http_get(c: &Cluster, port: u16, path: &str) -> Result<(u16, String), String> {
    let path = path.to_string();
    c.topo
        .node
        .run(move || {
            use std::io::{Read, Write};
            let mut s =
                std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(Duration::from_secs(5)))
                .map_err(|e| e.to_string())?;
            write!(
                s,
                "GET {path} HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n"
            )
            .map_err(|e| e.to_string())?;
            let mut text = String::new();
            s.read_to_string(&mut text).map_err(|e| e.to_string())?;
            let code = text
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let body = text
                .split_once("\r\n\r\n")
                .map(|(_, b)| b.to_string())
                .unwrap_or_default();
            Ok::<_, String>((code, body))
        })
        .expect("thread")
}

#[test]
fn health_and_metrics_follow_kube_proxy() {
    if !require_root() {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=3).map(pod_ip).collect();
    let mut c = start("xm", true, &["--metrics-per-service"]);
    c.api.apply_yaml(&service("web", WEB, "")).expect("svc");
    c.api.apply_yaml(&slice("web", &ready(&b))).expect("slice");
    // The agent is up once it listens (it cannot sync: the lists are held).
    let deadline = std::time::Instant::now() + WAIT;
    let first = loop {
        match try_http_get(&c, 10256, "/healthz") {
            Ok(r) => break r,
            Err(e) => assert!(std::time::Instant::now() < deadline, "GET 10256: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(first.0, 503, "healthy before the first sync");
    c.api.hold_lists(false);
    c.wait_backends(2);
    let deadline = std::time::Instant::now() + WAIT;
    while http_get(&c, 10256, "/healthz").0 != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "/healthz never became 200"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(http_get(&c, 10256, "/livez").0, 200);
    for _ in 0..5 {
        c.request().expect("traffic");
    }

    let (code, text) = http_get(&c, 10249, "/metrics");
    assert_eq!(code, 200);
    let value = |prefix: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {prefix} in:\n{text}"))
    };
    assert!(value("kubeproxy_sync_proxy_rules_duration_seconds_count") >= 1.0);
    assert!(value("kubeproxy_network_programming_duration_seconds_count") >= 1.0);
    assert!(value("kubeproxy_sync_proxy_rules_last_timestamp_seconds") > 1.0e9);
    assert!(value("kubeproxy_sync_proxy_rules_service_changes_total") >= 1.0);
    assert!(value("kubeproxy_sync_proxy_rules_endpoint_changes_total") >= 1.0);
    assert!(value("xlb_service_packets_total{service=\"test/web\",port=\"http\"}") >= 10.0);
    assert!(value("xlb_datapath_packets_total{reason=\"new_flow\"}") >= 5.0);
    assert_eq!(
        value(&format!(
            "xlb_map_entries{{map=\"{}\"}}",
            lb_common::MAP_BACKEND
        )),
        2.0
    );
    // Per-backend counters stay in `xlb list backends`: no series has a backend label.
    assert!(
        !text.contains("backend=\""),
        "per-backend series in /metrics:\n{text}"
    );
    assert!(
        value(&format!(
            "xlb_map_capacity{{map=\"{}\"}}",
            lb_common::MAP_SVC
        )) > 0.0
    );

    // The node is being deleted: /healthz says so, /livez does not.
    c.api
        .apply_yaml("apiVersion: v1\nkind: Node\nmetadata: {name: node1, deletionTimestamp: \"2026-01-01T00:00:00Z\"}\n")
        .expect("node");
    let deadline = std::time::Instant::now() + WAIT;
    while http_get(&c, 10256, "/healthz").0 != 503 {
        assert!(
            std::time::Instant::now() < deadline,
            "/healthz never reported the node deletion"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(http_get(&c, 10256, "/livez").0, 200);
}
