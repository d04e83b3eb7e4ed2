use std::{path::Path, time::Duration};

use lb_common::{MAP_BACKEND, MAP_CT, MAP_CT_ASSURED, MAP_SVC};

use super::*;
use crate::datapath::ct_gc::TablePass;

/// Metrics of an agent whose pins are missing (the datapath's series are left out).
fn metrics(per_service: Option<usize>) -> Metrics {
    Metrics::new(
        MetricsOptions {
            pins: Pins::open(Path::new("/nonexistent/xlb-test-pins")).expect("no pins"),
            per_service: per_service.map(|limit| PerServiceOptions {
                limit,
                names: Default::default(),
            }),
        },
        Some(Arc::new(Health::new(Duration::from_secs(10)))),
    )
}

/// The value of the sample line starting with `series ` in `text`.
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
}

#[test]
fn the_sync_series_follow_the_loop_with_kube_proxys_names() {
    let m = metrics(None);
    // Before the conntrack collector's first pass its IPv4 series are there, at zero.
    let fresh = m.render();
    for series in [
        "kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family=\"IPv4\"}",
        "kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"}",
    ] {
        assert_eq!(value(&fresh, series), 0.0);
    }
    m.queued(2, 3);
    let text = m.render();
    assert_eq!(
        value(&text, "kubeproxy_sync_proxy_rules_service_changes_pending"),
        2.0
    );
    assert!(
        value(
            &text,
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds"
        ) > 1e9
    );
    // Queued again before the sync: only the new changes count.
    m.queued(2, 5);
    m.synced(&Synced {
        took: Duration::from_micros(300),
        full: true,
        programming: Some(Duration::from_millis(2)),
        services: 3,
        endpoints: 5,
        errors: 1,
    });
    m.synced(&Synced {
        took: Duration::from_micros(100),
        ..Synced::default()
    });
    let text = m.render();
    for (series, want) in [
        ("kubeproxy_sync_proxy_rules_service_changes_total", 3.0),
        ("kubeproxy_sync_proxy_rules_endpoint_changes_total", 5.0),
        ("kubeproxy_sync_proxy_rules_service_changes_pending", 0.0),
        ("kubeproxy_sync_proxy_rules_endpoint_changes_pending", 0.0),
        ("kubeproxy_sync_proxy_rules_duration_seconds_count", 2.0),
        (
            "kubeproxy_sync_full_proxy_rules_duration_seconds_count",
            1.0,
        ),
        (
            "kubeproxy_sync_partial_proxy_rules_duration_seconds_count",
            1.0,
        ),
        ("kubeproxy_network_programming_duration_seconds_count", 1.0),
        (
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.0002\"}",
            1.0,
        ),
        (
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.0004\"}",
            2.0,
        ),
        ("xlb_sync_errors_total", 1.0),
    ] {
        assert_eq!(value(&text, series), want, "{series}");
    }
    assert!(value(&text, "kubeproxy_sync_proxy_rules_last_timestamp_seconds") > 1e9);
    assert!(
        text.contains("# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram\n"),
        "{text}"
    );
    assert!(value(&text, "process_resident_memory_bytes") > 0.0);
}

#[test]
fn map_fill_comes_from_the_last_sync_and_the_collectors_last_pass() {
    let m = metrics(None);
    let mut d = Desired::default();
    d.backends.insert(1, lb_common::Backend::default());
    m.programmed(&d, Tally::recount(&d), Limits::default());
    let fill = |entries, capacity| crate::datapath::counts::Fill { entries, capacity };
    let pass = |lru| ct_gc::Pass {
        v4: TablePass {
            assured: fill(4, 100),
            lru,
            deleted: 2,
            took: Duration::from_millis(1),
        },
        v6: None,
    };
    m.conntrack(&pass(Some(fill(10, 200))));
    // A pass that did not count the LRU table keeps the last count.
    m.conntrack(&pass(None));
    let text = m.render();
    let map = |what: &str, name: &str| value(&text, &format!("xlb_map_{what}{{map=\"{name}\"}}"));
    assert_eq!(map("entries", MAP_BACKEND), 1.0);
    assert_eq!(map("entries", MAP_SVC), 0.0);
    assert_eq!(
        map("capacity", MAP_SVC),
        f64::from(Limits::default().svc_entries)
    );
    assert_eq!(map("entries", MAP_CT), 10.0);
    assert_eq!(map("entries", MAP_CT_ASSURED), 4.0);
    assert_eq!(
        value(
            &text,
            "xlb_conntrack_entries{ip_family=\"IPv4\",table=\"lru\"}"
        ),
        10.0
    );
    assert_eq!(
        value(
            &text,
            "xlb_conntrack_entries_limit{ip_family=\"IPv4\",table=\"assured\"}"
        ),
        100.0
    );
    assert_eq!(
        value(
            &text,
            "kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"}"
        ),
        4.0
    );
    assert!(!text.contains("IPv6"), "no IPv6 tables: {text}");
}

#[test]
fn health_answers_are_counted_and_no_series_is_per_backend() {
    let health = Arc::new(Health::new(Duration::from_secs(10)));
    let m = Metrics::new(
        MetricsOptions {
            pins: Pins::open(Path::new("/nonexistent/xlb-test-pins")).expect("no pins"),
            per_service: Some(PerServiceOptions {
                limit: 10,
                names: Default::default(),
            }),
        },
        Some(health.clone()),
    );
    health.handle("/healthz");
    health.synced();
    health.handle("/livez");
    let text = m.render();
    assert_eq!(
        value(&text, "kubeproxy_proxy_healthz_total{code=\"503\"}"),
        1.0
    );
    assert_eq!(
        value(&text, "kubeproxy_proxy_livez_total{code=\"200\"}"),
        1.0
    );
    assert!(!text.contains("backend"), "{text}");
    let r = m.handle("/metrics").expect("served");
    assert_eq!(
        r.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    assert!(m.handle("/other").is_none());
}

#[test]
fn stale_udp_pairs_the_worker_dropped_are_counted() {
    let m = metrics(None);
    assert_eq!(value(&m.render(), "xlb_stale_udp_dropped_pairs_total"), 0.0);
    m.stale_udp_dropped(0);
    m.stale_udp_dropped(3);
    m.stale_udp_dropped(2);
    assert_eq!(value(&m.render(), "xlb_stale_udp_dropped_pairs_total"), 5.0);
}
