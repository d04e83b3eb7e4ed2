//! Health-check node ports say what kube-proxy says: the ready endpoints on this node, never
//! the serving-terminating fallback. A node whose pods of an externalTrafficPolicy Local
//! Service are all shutting down answers 503 (`localEndpoints: 0`) so that a cloud load
//! balancer drains it, while the connections it still sends reach those pods.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use xlb_tests::suites::north_south::{NODE_IP, TIMEOUT, local, remote, service};
use xlb_tests::{
    client::tcp_request, require_root, scenario::TCP_PORT, scenario::sock, twonode::Lab,
};

const HC: u16 = 32011;

/// `near`: a LoadBalancer with externalTrafficPolicy Local (health-check node port `HC`) on
/// node1's pod and node2's, node1's pod ready or serving-terminating.
fn yaml(local_terminating: bool) -> String {
    let y = service(
        "near",
        "LoadBalancer",
        "10.96.0.10",
        "TCP",
        80,
        TCP_PORT,
        30080,
        &format!("  externalTrafficPolicy: Local\n  healthCheckNodePort: {HC}\n"),
        "status:\n  loadBalancer:\n    ingress: [{ip: 198.51.100.20}]\n",
        &[local(), remote()],
    );
    if !local_terminating {
        return y;
    }
    let ready = format!(
        "- addresses: [\"{}\"]\n  conditions: {{ready: true}}",
        local().0
    );
    assert!(y.contains(&ready), "{y}");
    y.replace(
        &ready,
        &format!(
            "- addresses: [\"{}\"]\n  conditions: {{ready: false, serving: true, terminating: true}}",
            local().0
        ),
    )
}

/// The health-check node port's answer, as a load balancer probes it from outside.
fn probe(lab: &Lab) -> String {
    lab.outside(|| xlb_tests::http::get(sock(NODE_IP, HC), TIMEOUT))
        .unwrap_or_else(|e| panic!("health check: {e}\n{}", lab.agent.log_text()))
}

#[test]
fn serving_terminating_local_endpoints_fail_the_health_check_but_keep_their_traffic() {
    if !require_root() {
        return;
    }
    let lab = Lab::start("nsh", &yaml(false), 1500, "192.0.2.1:30080/TCP");
    let hc = probe(&lab);
    assert!(hc.starts_with("HTTP/1.1 200"), "{hc}");
    assert!(hc.contains("\"localEndpoints\": 1"), "{hc}");

    lab.rewrite(&yaml(true));
    let changed = Instant::now();
    let hc = loop {
        let hc = probe(&lab);
        if hc.starts_with("HTTP/1.1 503") || changed.elapsed() > Duration::from_secs(1) {
            break hc;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!(
        "503 {:?} after the endpoint became terminating",
        changed.elapsed()
    );
    assert!(
        hc.starts_with("HTTP/1.1 503"),
        "still healthy a second after its only local endpoint became serving-terminating: {hc}\n{}",
        lab.agent.log_text()
    );
    let lower = hc.to_ascii_lowercase();
    for header in [
        "content-type: application/json",
        "x-content-type-options: nosniff",
        "x-load-balancing-endpoint-weight: 0",
    ] {
        assert!(lower.contains(header), "{header} missing: {hc}");
    }
    let body = hc.split("\r\n\r\n").nth(1).unwrap_or_default();
    assert_eq!(
        body,
        "{\n\t\"service\": {\n\t\t\"namespace\": \"ns\",\n\t\t\"name\": \"near\"\n\t},\n\t\"localEndpoints\": 0,\n\t\"serviceProxyHealthy\": true\n}",
        "kube-proxy's body"
    );

    // The connections still sent to the node reach its terminating pod (the fallback), never
    // node2's (Local policy), and keep the client's address.
    let answers = lab.outside(|| {
        (0..10)
            .map(|_| tcp_request(sock(NODE_IP, 30080), TIMEOUT))
            .chain((0..5).map(|_| tcp_request(sock(Ipv4Addr::new(198, 51, 100, 20), 80), TIMEOUT)))
            .collect::<Vec<_>>()
    });
    for a in answers {
        let a = a.unwrap_or_else(|e| panic!("through the fallback: {e}\n{}", lab.agent.log_text()));
        assert_eq!(
            a.backend, "backend-1",
            "the local serving-terminating pod serves"
        );
    }
}
