//! A burst of endpoint changes: the agent's bounded-frequency sync coalesces them and
//! converges on the last.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use xlb_tests::suites::kubernetes::{Load, WEB, service, start};
use xlb_tests::{require_root, scenario::TCP_PORT, topology::pod_ip};

/// The EndpointSlice of `web` holding `ips` (ready), as JSON for the API server's `apply`.
fn web_slice(ips: &[Ipv4Addr]) -> serde_json::Value {
    let endpoints: Vec<serde_json::Value> = ips
        .iter()
        .map(|ip| serde_json::json!({"addresses": [ip.to_string()], "nodeName": "node1", "conditions": {"ready": true}}))
        .collect();
    serde_json::json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": "test", "name": "web-abc", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": TCP_PORT, "protocol": "TCP"}],
        "endpoints": endpoints})
}

/// 1,000 endpoint changes in a burst (as fast as the API server takes them, each a watch
/// event): the agent converges on the last one and programs it (how soon is the sync
/// bench's to say; the wait here is a bound to fail by), never fails a request meanwhile (every intermediate set is of live pods), and syncs a bounded
/// number of times: at most one per minSyncPeriod (100 ms) until it converged, plus the
/// first.
#[test]
fn a_burst_of_1000_endpoint_changes_converges_with_few_syncs() {
    if !require_root() {
        return;
    }
    const CHANGES: usize = 1000;
    let b: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
    let mut c = start("xkb", false, &["--min-sync-period-ms", "100"]);
    c.api.apply_yaml(&service("web", WEB, "")).expect("svc");
    c.api.apply(web_slice(&b));
    c.wait_backends(3);
    let subsets: [&[Ipv4Addr]; 4] = [&b[..1], &b[..2], &b[1..], &b];
    let syncs_before = c.agent.log_text().matches(" synced ").count();
    let load = Load::start(&c);
    let started = Instant::now();
    for i in 0..CHANGES - 1 {
        c.api.apply(web_slice(subsets[i % subsets.len()]));
    }
    // The last: b[0] and b[2], a set no earlier change had.
    let last = [b[0], b[2]];
    c.api.apply(web_slice(&last));
    let burst = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(10);
    let want: Vec<String> = last
        .iter()
        .map(|ip| format!("{ip}:{TCP_PORT}/TCP"))
        .collect();
    while c.backends_of() != want {
        assert!(
            Instant::now() < deadline,
            "not converged 10 s after the burst ({burst:?}): {:?}, want {want:?}\n{}",
            c.backends_of(),
            c.api.diagnosis()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let converged = started.elapsed();
    // Nothing after convergence changes it again.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(c.backends_of(), want, "the final state moved");
    load.stop().expect_no_failures("the burst");
    let syncs = c.agent.log_text().matches(" synced ").count() - syncs_before;
    // One per 100 ms while changes arrive: from the burst's start to convergence (a busy
    // machine delays the agent's reading of the burst, not its coalescing), plus the first
    // and the one that ends the burst, and the 300 ms after it.
    let bound = (converged + Duration::from_millis(100)).as_millis() as usize / 100 + 2;
    assert!(
        syncs >= 2 && syncs <= bound,
        "{syncs} syncs for {CHANGES} changes over {burst:?}, converged after {converged:?} (at most {bound}: one per 100 ms)"
    );
    eprintln!("{CHANGES} changes in {burst:?}, converged after {converged:?}: {syncs} syncs");
}
