//! Real traffic spread over backends: ClusterIP TCP and UDP, a bad service beside good
//! ones, a service without endpoints, a NodePort from an external client.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use xlb_tests::suites::traffic::{DNS, TIMEOUT, WEB, backends, spread, synced, yaml};
use xlb_tests::{
    capture::Capture,
    client::{Answer, tcp_request, udp_request},
    require_root,
    scenario::{Scenario, TCP_PORT, UDP_PORT, sock},
    services::{service_yaml, write_atomic},
};

/// The services' endpoints, placed on node `node`.
fn on_node(yaml: &str, node: &str) -> String {
    yaml.replace(
        "conditions: {ready: true}\n",
        &format!("conditions: {{ready: true}}\n  nodeName: {node}\n"),
    )
}

#[test]
fn clusterip_spreads_tcp_and_udp_over_three_backends() {
    let Some(mut s) = synced("xt", 3) else {
        return;
    };
    s.wait_backends("10.96.0.53:53/UDP", 3, Duration::from_secs(30))
        .expect("dns programmed");
    let client_ip = s.topo.client.ip;

    let capture = Capture::start(&s.topo.client.ns, "eth0").expect("capture");
    let (tcp, udp) = s
        .topo
        .client
        .ns
        .run(move || {
            let tcp: Vec<Result<Answer, String>> = (0..300)
                .map(|_| tcp_request(sock(WEB, 80), TIMEOUT))
                .collect();
            let udp: Vec<Result<Answer, String>> = (0..300)
                .map(|_| udp_request(sock(DNS, 53), TIMEOUT))
                .collect();
            (tcp, udp)
        })
        .expect("client thread");

    // On the wire, every reply reached the client from the ClusterIP: none left a backend
    // untranslated (at least a reply per request came in).
    capture.finish().expect("capture").assert_inbound_only_from(
        &[sock(WEB, 80), sock(DNS, 53)],
        600,
        "replies at the client pod",
    );
    for (proto, results) in [("TCP", tcp), ("UDP", udp)] {
        let failures: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        assert!(
            failures.is_empty(),
            "{proto}: {} of 300 failed, first: {:?}\n{}",
            failures.len(),
            failures.first(),
            s.agent.log_text()
        );
        let answers: Vec<Answer> = results.into_iter().flatten().collect();
        for a in &answers {
            assert!(
                a.seen_client.starts_with(&format!("{client_ip}:")),
                "{proto}: backend saw {} instead of the client pod {client_ip}",
                a.seen_client
            );
        }
        let by_backend = spread(&answers);
        assert_eq!(by_backend.len(), 3, "{proto}: {by_backend:?}");
        for (b, n) in &by_backend {
            assert!(
                *n >= 45,
                "{proto}: {b} got {n} of 300 (< 15%): {by_backend:?}"
            );
        }
    }

    // The counters saw it: per backend, per service (both directions) and per reason.
    let per_backend =
        lb_userspace::list::backends(&xlb_tests::pins(&s.agent.pins)).expect("read pins");
    assert_eq!(per_backend.len(), 6);
    for b in &per_backend {
        assert!(
            b.packets >= 100,
            "{}: only {} packets counted",
            b.backend,
            b.packets
        );
    }
    let rows = lb_userspace::list::services(&xlb_tests::pins(&s.agent.pins)).expect("read pins");
    for r in &rows {
        assert!(
            r.packets >= 600,
            "{}: only {} packets counted",
            r.service,
            r.packets
        );
    }
    let counts = xlb_tests::datapath::reason_counts(&s.agent.pins);
    // A fresh socket may reuse an earlier flow's source port: that flow is then established.
    assert!(counts["new_flow"] >= 550, "{counts:?}");
    assert!(counts["reverse_nat"] >= 600, "{counts:?}");
}

#[test]
fn a_bad_service_is_named_and_the_good_ones_work() {
    if !require_root() {
        return;
    }
    let all = backends(2);
    let bad = yaml(&all, &all).replace("clusterIP: 10.96.0.53", "clusterIP: 10.96.0.530");
    let mut s = Scenario::start("xb", 2, &bad).expect("scenario");
    s.wait_backends("10.96.0.10:80/TCP", 2, Duration::from_secs(30))
        .expect("good service programmed");
    std::thread::sleep(Duration::from_millis(200));
    let log = s.agent.log_text();
    assert!(
        log.contains("Service test/dns") && log.contains("10.96.0.530"),
        "error does not name the object: {log}"
    );
    let r = s
        .topo
        .client
        .ns
        .run(|| tcp_request(sock(WEB, 80), TIMEOUT))
        .expect("client");
    r.expect("the good service still works");

    // Fixing the file programs the service; breaking the whole file keeps what works.
    write_atomic(&s.yaml, &yaml(&all, &all)).expect("write");
    s.wait_backends("10.96.0.53:53/UDP", 2, Duration::from_secs(5))
        .expect("fixed service programmed");
    write_atomic(&s.yaml, "kind: [this is not yaml").expect("write");
    std::thread::sleep(Duration::from_millis(500));
    let rows = lb_userspace::list::services(&xlb_tests::pins(&s.agent.pins)).expect("read");
    assert_eq!(
        rows.len(),
        2,
        "a broken file must not remove programmed services"
    );
    let r = s
        .topo
        .client
        .ns
        .run(|| udp_request(sock(DNS, 53), TIMEOUT))
        .expect("client");
    r.expect("still forwarding after a broken file");
}

#[test]
fn a_service_without_endpoints_refuses_at_once() {
    if !require_root() {
        return;
    }
    let s_yaml = yaml(&[], &[]);
    let mut s = Scenario::start("xn", 1, &s_yaml).expect("scenario");
    s.wait_backends("10.96.0.10:80/TCP", 0, Duration::from_secs(30))
        .expect("sync");
    s.wait_backends("10.96.0.53:53/UDP", 0, Duration::from_secs(30))
        .expect("sync");
    let (tcp, udp) = s
        .topo
        .client
        .ns
        .run(|| {
            let t0 = Instant::now();
            let tcp = std::net::TcpStream::connect_timeout(&sock(WEB, 80), Duration::from_secs(3))
                .map(|_| ())
                .map_err(|e| (e.kind(), t0.elapsed()));
            let t1 = Instant::now();
            let udp =
                udp_request(sock(DNS, 53), Duration::from_secs(3)).map_err(|e| (e, t1.elapsed()));
            (tcp, udp)
        })
        .expect("client");
    let (kind, took) = tcp.expect_err("connect to a service without endpoints must fail");
    assert_eq!(
        kind,
        std::io::ErrorKind::ConnectionRefused,
        "TCP must be refused (RST), not time out"
    );
    assert!(took < Duration::from_millis(500), "refusal took {took:?}");
    let (err, took) = udp.expect_err("UDP to a service without endpoints must fail");
    assert!(
        err.contains("refused"),
        "UDP must get ICMP port unreachable: {err}"
    );
    assert!(took < Duration::from_millis(500), "refusal took {took:?}");
}

#[test]
fn node_port_reaches_local_backends_from_an_external_client() {
    if !require_root() {
        return;
    }
    let yaml = node_port_yaml();
    let tag = xlb_tests::unique_tag("xo");
    let topo = xlb_tests::topology::Topology::build(&tag, 3).expect("topology");
    let ext = topo.add_external_client("up0").expect("external client");
    ext.ns
        .ip(&["route", "add", "198.51.100.10/32", "via", "192.0.2.1"])
        .expect("route to the externalIP");
    let _servers: Vec<_> = topo
        .backends
        .iter()
        .map(|p| {
            xlb_tests::echo::EchoServer::start(&p.ns, &p.name, TCP_PORT, UDP_PORT).expect("server")
        })
        .collect();
    let dir = std::env::temp_dir().join(&tag);
    std::fs::create_dir_all(&dir).expect("dir");
    write_atomic(&dir.join("svc.yaml"), &yaml).expect("yaml");
    let args: Vec<String> = vec![
        "--source".into(),
        format!("file:{}", dir.join("svc.yaml").display()),
        "--pod-interfaces".into(),
        "xv-*".into(),
        "--node-interfaces".into(),
        "up0".into(),
        "--hostname-override".into(),
        "node1".into(),
    ];
    let mut agent = xlb_tests::agent::Agent::start_with(
        &topo.node,
        &args,
        std::path::PathBuf::from(format!("/sys/fs/bpf/{tag}")),
        dir.join("agent.log"),
    )
    .expect("agent");
    agent
        .wait_for(Duration::from_secs(10), |rows| {
            rows.iter()
                .any(|r| r.frontend == "192.0.2.1:30080/TCP" && r.backends.len() == 3)
                && rows.iter().any(|r| r.frontend == "192.0.2.1:30053/UDP")
        })
        .expect("NodePort frontends programmed on the uplink's address");
    std::thread::sleep(Duration::from_millis(300));
    node_port_answers_keep_the_client(&ext.ns, &agent);
    external_ip_answers_keep_the_client(&ext.ns, &agent);
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
}

/// web (TCP NodePort 30080, externalIP 198.51.100.10) and dns (UDP NodePort 30053) on
/// three of node1's pods.
fn node_port_yaml() -> String {
    let all = backends(3);
    let node_port = |proto: &str, port: u16, target: u16, np: u16, name: &str, vip: Ipv4Addr| {
        service_yaml(name, vip, port, proto, target, &all)
            .replace("spec:\n", "spec:\n  type: NodePort\n")
            .replace(
                &format!("targetPort: {target}}}"),
                &format!("targetPort: {target}, nodePort: {np}}}"),
            )
    };
    // web also has an externalIP, which the external client routes to the node.
    let yaml = node_port("TCP", 80, TCP_PORT, 30080, "web", WEB).replace(
        "  type: NodePort\n",
        "  type: NodePort\n  externalIPs: [198.51.100.10]\n",
    ) + &node_port("UDP", 53, UDP_PORT, 30053, "dns", DNS);
    // The backends are this node's pods: their traffic is not SNATed (remote ones would be).
    on_node(&yaml, "node1")
}

/// From the external client to the NodePorts: every backend, the client's address kept,
/// the replies from the NodePorts.
fn node_port_answers_keep_the_client(
    ns: &xlb_tests::netns::Netns,
    agent: &xlb_tests::agent::Agent,
) {
    let node_ip = Ipv4Addr::new(192, 0, 2, 1);
    let capture = Capture::start(ns, "eth0").expect("capture");
    let answers = ns
        .run(move || {
            let mut out = Vec::new();
            for _ in 0..60 {
                for r in [
                    tcp_request(sock(node_ip, 30080), TIMEOUT),
                    udp_request(sock(node_ip, 30053), TIMEOUT),
                ] {
                    let failed = r.is_err();
                    out.push(r);
                    if failed {
                        return out;
                    }
                }
            }
            out
        })
        .expect("client");
    capture.finish().expect("capture").assert_inbound_only_from(
        &[sock(node_ip, 30080), sock(node_ip, 30053)],
        120,
        "NodePort replies at the external client",
    );
    let mut seen = std::collections::BTreeSet::new();
    for a in answers {
        let a = a.unwrap_or_else(|e| panic!("NodePort request failed: {e}\n{}", agent.log_text()));
        assert!(
            a.seen_client.starts_with("192.0.2.10:"),
            "client IP not preserved: {}",
            a.seen_client
        );
        seen.insert(a.backend);
    }
    assert_eq!(seen.len(), 3, "NodePort traffic reached {seen:?}");
}

/// From the external client to the externalIP: the client's address kept.
fn external_ip_answers_keep_the_client(
    ns: &xlb_tests::netns::Netns,
    agent: &xlb_tests::agent::Agent,
) {
    let external_ip = Ipv4Addr::new(198, 51, 100, 10);
    let capture = Capture::start(ns, "eth0").expect("capture");
    let via_external_ip = ns
        .run(move || {
            (0..20)
                .map(|_| tcp_request(sock(external_ip, 80), TIMEOUT))
                .collect::<Vec<_>>()
        })
        .expect("client");
    capture.finish().expect("capture").assert_inbound_only_from(
        &[sock(external_ip, 80)],
        40,
        "externalIP replies at the external client",
    );
    for a in via_external_ip {
        let a =
            a.unwrap_or_else(|e| panic!("externalIP request failed: {e}\n{}", agent.log_text()));
        assert!(
            a.seen_client.starts_with("192.0.2.10:"),
            "client IP not preserved: {}",
            a.seen_client
        );
    }
}
