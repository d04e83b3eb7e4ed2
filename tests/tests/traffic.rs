//! Real traffic through the attached datapath: a client pod, three backend pods, the agent in
//! the node namespace, real TCP and UDP sockets.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use xlb_tests::{
    capture::Capture,
    client::{Answer, tcp_request, udp_request},
    require_root,
    scenario::{Scenario, TCP_PORT, UDP_PORT, sock},
    services::{service_yaml, write_atomic},
    topology::pod_ip,
};

const WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const DNS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 53);
const TIMEOUT: Duration = Duration::from_secs(2);

fn backends(n: u8) -> Vec<Ipv4Addr> {
    (1..=n).map(|k| pod_ip(k + 1)).collect()
}

fn yaml(web: &[Ipv4Addr], dns: &[Ipv4Addr]) -> String {
    service_yaml("web", WEB, 80, "TCP", TCP_PORT, web)
        + &service_yaml("dns", DNS, 53, "UDP", UDP_PORT, dns)
}

/// The services' endpoints, placed on node `node`.
fn on_node(yaml: &str, node: &str) -> String {
    yaml.replace(
        "conditions: {ready: true}\n",
        &format!("conditions: {{ready: true}}\n  nodeName: {node}\n"),
    )
}

fn spread(answers: &[Answer]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for a in answers {
        *m.entry(a.backend.clone()).or_insert(0) += 1;
    }
    m
}

#[test]
fn clusterip_spreads_tcp_and_udp_over_three_backends() {
    let Some(mut s) = synced("clusterip_spreads_tcp_and_udp_over_three_backends", "xt", 3) else {
        return;
    };
    s.wait_backends("10.96.0.53:53/UDP", 3, Duration::from_secs(10))
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
    let per_backend = lb_userspace::list::backends(&s.agent.pins).expect("read pins");
    assert_eq!(per_backend.len(), 6);
    for b in &per_backend {
        assert!(
            b.packets >= 100,
            "{}: only {} packets counted",
            b.backend,
            b.packets
        );
    }
    let rows = lb_userspace::list::services(&s.agent.pins).expect("read pins");
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

/// The usual start: the root check, `n` backend pods behind the web and dns services, and the
/// agent synced on web. `None` (after a loud notice) where the test cannot run.
fn synced(test: &str, prefix: &str, n: u8) -> Option<Scenario> {
    if !require_root(test) {
        return None;
    }
    let all = backends(n);
    let mut s = Scenario::start(prefix, n.into(), &yaml(&all, &all)).expect("scenario");
    s.wait_backends("10.96.0.10:80/TCP", n.into(), Duration::from_secs(10))
        .expect("initial sync");
    Some(s)
}

/// A request's start time and result.
type Timed = (Instant, Result<Answer, String>);

/// Requests in a loop from the client pod until stopped; returns every result with its time.
fn traffic(
    s: &Scenario,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<Vec<Timed>, String>> {
    s.topo.client.ns.spawn(move || {
        let mut out = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            out.push((Instant::now(), tcp_request(sock(WEB, 80), TIMEOUT)));
            out.push((Instant::now(), udp_request(sock(DNS, 53), TIMEOUT)));
        }
        out
    })
}

#[test]
fn yaml_edits_take_effect_within_a_second_without_failed_requests() {
    if !require_root("yaml_edits_take_effect_within_a_second_without_failed_requests") {
        return;
    }
    let all = backends(3);
    let mut s = Scenario::start("xe", 3, &yaml(&all[..2], &all[..2])).expect("scenario");
    s.wait_backends("10.96.0.10:80/TCP", 2, Duration::from_secs(10))
        .expect("initial sync");

    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(&s, stop.clone());
    std::thread::sleep(Duration::from_millis(300));

    // Add backend-3.
    write_atomic(&s.yaml, &yaml(&all, &all)).expect("write");
    let took = s
        .wait_backends("10.96.0.10:80/TCP", 3, Duration::from_secs(5))
        .expect("scale up");
    assert!(took < Duration::from_secs(1), "scale-up took {took:?}");
    s.wait_backends("10.96.0.53:53/UDP", 3, Duration::from_secs(1))
        .expect("udp scale up");
    std::thread::sleep(Duration::from_millis(500));

    // Remove backend-1; its server keeps running, so any failure would be xlb's.
    write_atomic(&s.yaml, &yaml(&all[1..], &all[1..])).expect("write");
    let removed_at = Instant::now();
    let took = s
        .wait_backends("10.96.0.10:80/TCP", 2, Duration::from_secs(5))
        .expect("scale down");
    assert!(took < Duration::from_secs(1), "scale-down took {took:?}");
    s.wait_backends("10.96.0.53:53/UDP", 2, Duration::from_secs(1))
        .expect("udp scale down");
    let synced_at = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let results = load.join().expect("join").expect("client thread");

    let failures: Vec<&String> = results
        .iter()
        .filter_map(|(_, r)| r.as_ref().err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} requests failed during the edits, first: {:?}",
        failures.len(),
        results.len(),
        failures.first()
    );
    let answered = |name: &str| {
        results
            .iter()
            .filter(|(_, r)| matches!(r, Ok(a) if a.backend == name))
            .count()
    };
    assert!(
        answered("backend-3") > 0,
        "backend-3 never answered after it was added"
    );
    let late_to_removed = results
        .iter()
        .filter(|(t, r)| *t > synced_at && matches!(r, Ok(a) if a.backend == "backend-1"))
        .count();
    assert_eq!(
        late_to_removed, 0,
        "backend-1 still got new flows after its removal was synced"
    );
    assert!(
        results.iter().any(|(t, _)| *t > removed_at),
        "no traffic after the removal"
    );
}

#[test]
fn pinned_datapath_outlives_the_agent_and_a_new_agent_adopts_it() {
    let Some(mut s) = synced(
        "pinned_datapath_outlives_the_agent_and_a_new_agent_adopts_it",
        "xr",
        3,
    ) else {
        return;
    };
    let burst = |s: &Scenario| {
        s.topo
            .client
            .ns
            .run(|| {
                (0..30)
                    .map(|_| tcp_request(sock(WEB, 80), TIMEOUT))
                    .collect::<Result<Vec<_>, _>>()
            })
            .expect("client thread")
    };
    burst(&s).expect("traffic with the agent up");

    s.agent.stop();
    burst(&s).expect("traffic with the agent down: links and maps are pinned");

    // A new agent on the same pins adopts them: ids are kept and nothing is rewritten.
    let before = lb_userspace::list::services(&s.agent.pins).expect("read pins");
    let log = s.workdir.join("agent2.log");
    s.agent.restart(log).expect("restart");
    let stable = s.wait_backends("10.96.0.10:80/TCP", 3, Duration::from_secs(10));
    stable.expect("restarted agent");
    // The maps were already right, so wait for the new agent's own first sync in its log.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !s.agent.log_text().contains("synced") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = s.agent.log_text();
    assert!(
        text.contains("adopted") && text.contains("services=2"),
        "restart did not adopt: {text}"
    );
    assert!(
        text.contains("writes=0"),
        "restart rewrote maps that were already right: {text}"
    );
    let after = lb_userspace::list::services(&s.agent.pins).expect("read pins");
    let ids = |rows: &[lb_userspace::list::ServiceRow]| {
        rows.iter()
            .map(|r| (r.frontend.clone(), r.id))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ids(&before),
        ids(&after),
        "service ids changed across the restart"
    );
    burst(&s).expect("traffic after the restart");
}

#[test]
fn cleanup_removes_every_pin_and_the_datapath() {
    let Some(mut s) = synced("cleanup_removes_every_pin_and_the_datapath", "xc", 2) else {
        return;
    };
    s.agent.stop();
    // A map of an earlier layout, as an older agent would have left it after an upgrade.
    aya::maps::MapData::from_pin(s.agent.pins.join(lb_common::MAP_SVC))
        .expect("open a pin")
        .pin(s.agent.pins.join("XLB_CT_V1"))
        .expect("pin an old-layout name");
    let out = std::process::Command::new(xlb_tests::xlb_bin())
        .args(["agent", "--cleanup", "--bpffs"])
        .arg(&s.agent.pins)
        .output()
        .expect("xlb agent --cleanup");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!s.agent.pins.exists(), "pin directory still there");
    let r = s
        .topo
        .client
        .ns
        .run(|| tcp_request(sock(WEB, 80), Duration::from_millis(500)))
        .expect("client");
    assert!(
        r.is_err(),
        "the ClusterIP still answers after cleanup: {r:?}"
    );
}

#[test]
fn a_bad_service_is_named_and_the_good_ones_work() {
    if !require_root("a_bad_service_is_named_and_the_good_ones_work") {
        return;
    }
    let all = backends(2);
    let bad = yaml(&all, &all).replace("clusterIP: 10.96.0.53", "clusterIP: 10.96.0.530");
    let mut s = Scenario::start("xb", 2, &bad).expect("scenario");
    s.wait_backends("10.96.0.10:80/TCP", 2, Duration::from_secs(10))
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
    let rows = lb_userspace::list::services(&s.agent.pins).expect("read");
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
fn a_pod_interface_that_appears_later_is_attached() {
    if !require_root("a_pod_interface_that_appears_later_is_attached") {
        return;
    }
    let all = backends(3);
    let mut s = Scenario::start("xh", 2, &yaml(&all[..2], &all[..2])).expect("scenario");
    s.wait_backends("10.96.0.10:80/TCP", 2, Duration::from_secs(10))
        .expect("sync");

    // A new pod: its veth appears after the agent started. Only backend-3 is left in the
    // service, so every answer must cross the new interface's reverse NAT.
    let pod = s.topo.add_backend().expect("new pod");
    let server =
        xlb_tests::echo::EchoServer::start(&pod.ns, &pod.name, TCP_PORT, UDP_PORT).expect("server");
    s.servers.push(server);
    write_atomic(&s.yaml, &yaml(&all[2..], &all[2..])).expect("write");
    s.wait_backends("10.96.0.10:80/TCP", 1, Duration::from_secs(5))
        .expect("resync");
    let deadline = Instant::now() + Duration::from_secs(5);
    let answer = loop {
        let r = s
            .topo
            .client
            .ns
            .run(|| tcp_request(sock(WEB, 80), Duration::from_millis(300)))
            .expect("client");
        match r {
            Ok(a) => break a,
            Err(e) if Instant::now() > deadline => {
                panic!("new pod never answered: {e}\n{}", s.agent.log_text())
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    assert_eq!(answer.backend, "backend-3");
    // Now that it answers: its replies, which only the new interface's program translates,
    // reach the client from the ClusterIP, and backend-3 sees the client pod itself.
    let capture = Capture::start(&s.topo.client.ns, "eth0").expect("capture");
    let more = s
        .topo
        .client
        .ns
        .run(|| {
            (0..5)
                .map(|_| tcp_request(sock(WEB, 80), TIMEOUT))
                .collect::<Vec<_>>()
        })
        .expect("client");
    capture.finish().expect("capture").assert_inbound_only_from(
        &[sock(WEB, 80)],
        10,
        "replies of backend-3 (through xv-backend-3)",
    );
    let client_ip = s.topo.client.ip;
    for a in more {
        let a = a.unwrap_or_else(|e| panic!("backend-3: {e}\n{}", s.agent.log_text()));
        assert_eq!(a.backend, "backend-3");
        assert!(
            a.seen_client.starts_with(&format!("{client_ip}:")),
            "backend-3 saw {} instead of the client pod {client_ip}",
            a.seen_client
        );
    }
    assert!(
        s.agent.log_text().contains("xv-backend-3"),
        "attach not logged"
    );
}

#[test]
fn the_agent_needs_only_cap_bpf_and_cap_net_admin() {
    let Some(mut s) = synced("the_agent_needs_only_cap_bpf_and_cap_net_admin", "xp", 2) else {
        return;
    };
    // The scenario's own agent is replaced by one whose capabilities are cut down to the two
    // deploy/daemonset-capabilities.yaml grants.
    s.agent.stop();
    let _ = lb_userspace::cleanup::cleanup(&s.agent.pins);
    let args = vec![
        "--source".to_string(),
        format!("file:{}", s.yaml.display()),
        "--pod-interfaces".into(),
        "xv-*".into(),
    ];
    // Its own pin directory: assigning the new agent drops the old one, whose `xlb cleanup`
    // would otherwise race the new agent's pinning in the same directory.
    let mut pins = s.agent.pins.clone().into_os_string();
    pins.push("-caps");
    let pins = std::path::PathBuf::from(pins);
    s.agent = xlb_tests::agent::Agent::start_wrapped(
        &s.topo.node,
        &[
            "setpriv",
            "--bounding-set=-all,+bpf,+net_admin",
            "--inh-caps=-all",
        ],
        &args,
        pins,
        s.workdir.join("agent-caps.log"),
    )
    .expect("agent with reduced capabilities");
    s.wait_backends("10.96.0.10:80/TCP", 2, Duration::from_secs(10))
        .expect("sync with CAP_BPF + CAP_NET_ADMIN");
    let r = s
        .topo
        .client
        .ns
        .run(|| tcp_request(sock(WEB, 80), TIMEOUT))
        .expect("client");
    let answer = r.unwrap_or_else(|e| panic!("{e}\n{}", s.agent.log_text()));
    assert!(
        ["backend-1", "backend-2"].contains(&answer.backend.as_str())
            && answer
                .seen_client
                .starts_with(&format!("{}:", s.topo.client.ip)),
        "a backend must answer and see the client pod: {answer:?}"
    );
    // The socket hooks attach with the same two: a process on the node reaches the
    // ClusterIP through them.
    let cg = s.agent.cgroup.as_ref().expect("the agent's cgroup");
    let lines = xlb_tests::probe::run(
        cg,
        &s.topo.node,
        &["tcp".into(), sock(WEB, 80).to_string(), "5".into()],
    )
    .expect("probe");
    assert!(
        lines.iter().all(
            |l| matches!(l, xlb_tests::probe::Line::Ok { peer, .. } if *peer == sock(WEB, 80))
        ),
        "node → ClusterIP with CAP_BPF + CAP_NET_ADMIN: {lines:?}\n{}",
        s.agent.log_text()
    );
    // And it really ran with just those: CAP_NET_ADMIN is bit 12, CAP_BPF bit 39.
    let pid = s.agent.pid().expect("agent running");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("agent status");
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(str::trim);
    assert_eq!(
        eff,
        Some("0000008000001000"),
        "agent capabilities:\n{status}"
    );
}

#[test]
fn a_service_without_endpoints_refuses_at_once() {
    if !require_root("a_service_without_endpoints_refuses_at_once") {
        return;
    }
    let s_yaml = yaml(&[], &[]);
    let mut s = Scenario::start("xn", 1, &s_yaml).expect("scenario");
    s.wait_backends("10.96.0.10:80/TCP", 0, Duration::from_secs(10))
        .expect("sync");
    s.wait_backends("10.96.0.53:53/UDP", 0, Duration::from_secs(10))
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
    if !require_root("node_port_reaches_local_backends_from_an_external_client") {
        return;
    }
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
    let yaml = on_node(&yaml, "node1");
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
    let node_ip = Ipv4Addr::new(192, 0, 2, 1);
    let capture = Capture::start(&ext.ns, "eth0").expect("capture");
    let answers = ext
        .ns
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
    let external_ip = Ipv4Addr::new(198, 51, 100, 10);
    let capture = Capture::start(&ext.ns, "eth0").expect("capture");
    let via_external_ip = ext
        .ns
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

    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_kube_proxy_style_config_file_is_read_and_unknown_keys_are_named() {
    let Some(mut s) = synced(
        "a_kube_proxy_style_config_file_is_read_and_unknown_keys_are_named",
        "xg",
        2,
    ) else {
        return;
    };
    s.agent.stop();
    let _ = lb_userspace::cleanup::cleanup(&s.agent.pins);
    let args = |config: &std::path::Path| -> Vec<String> {
        vec![
            "--source".into(),
            format!("file:{}", s.yaml.display()),
            "--pod-interfaces".into(),
            "xv-*".into(),
            "--config".into(),
            config.display().to_string(),
            "--metrics-bind-address".into(),
            "".into(),
        ]
    };
    // A typo'd key: the agent refuses to start and names it.
    let bad = s.workdir.join("bad.yaml");
    std::fs::write(&bad, "kind: KubeProxyConfiguration\nminSyncPeriodd: 1s\n").expect("write");
    let mut a = xlb_tests::agent::Agent::start_with(
        &s.topo.node,
        &args(&bad),
        s.agent.pins.clone(),
        s.workdir.join("bad.log"),
    )
    .expect("agent");
    let err = a
        .wait_for(Duration::from_secs(5), |_| false)
        .expect_err("must exit");
    assert!(
        err.contains("exited") && err.contains("minSyncPeriodd"),
        "{err}"
    );
    drop(a);

    // A good file: its healthz address is used (flags would override it).
    let good = s.workdir.join("good.yaml");
    std::fs::write(
        &good,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nhealthzBindAddress: 127.0.0.1:10299\nminSyncPeriod: 50ms\nconntrack: {udpTimeout: 30s}\n",
    )
    .expect("write");
    let mut a = xlb_tests::agent::Agent::start_with(
        &s.topo.node,
        &args(&good),
        s.agent.pins.clone(),
        s.workdir.join("good.log"),
    )
    .expect("agent");
    a.wait_for(Duration::from_secs(10), |rows| rows.len() == 2)
        .expect("synced with the config");
    let code = s
        .topo
        .node
        .run(|| {
            use std::io::{Read, Write};
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                if let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", 10299)) {
                    let _ = write!(
                        c,
                        "GET /livez HTTP/1.1\r\nHost: n\r\nConnection: close\r\n\r\n"
                    );
                    let mut t = String::new();
                    let _ = c.read_to_string(&mut t);
                    return t.split_whitespace().nth(1).map(str::to_string);
                }
                if Instant::now() > deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
        .expect("thread");
    assert_eq!(
        code.as_deref(),
        Some("200"),
        "health not served on the config file's address:\n{}",
        a.log_text()
    );
    assert!(
        a.log_text().contains("conntrack.udpTimeout not used"),
        "unused conntrack keys must be reported"
    );
}

/// One request to `to` from the client's port `port` (SO_REUSEADDR, so a port whose last
/// connection is in TIME_WAIT can be bound again); the answer's line. Must run in the
/// client's namespace.
fn request_from_port(
    from: Ipv4Addr,
    port: u16,
    to: std::net::SocketAddr,
) -> Result<String, String> {
    use std::io::{BufRead, BufReader, Write};
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .map_err(|e| e.to_string())?;
    sock.set_reuse_address(true).map_err(|e| e.to_string())?;
    sock.bind(&std::net::SocketAddr::from((from, port)).into())
        .map_err(|e| format!("bind :{port}: {e}"))?;
    sock.connect_timeout(&to.into(), TIMEOUT)
        .map_err(|e| format!("connect {to} from :{port}: {e}"))?;
    let mut s: std::net::TcpStream = sock.into();
    s.set_read_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    s.write_all(b"hello\n").map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(&s)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    Ok(line)
}

/// A client reusing a 4-tuple through a ClusterIP once its last connection is over (TIME_WAIT
/// reuse, `net.ipv4.tcp_tw_reuse=1`): the closed flow's own reply entry is no clash, so the
/// backend sees the client's port (kube-proxy's conntrack reuses the entry). Today xlb
/// remaps the port from the SNAT range for every reuse, and a busy client runs the range
/// out (`snat_failed`, connects time out): see `cargo xtask bench traffic`'s tc row.
#[test]
fn a_reused_tuple_through_a_cluster_ip_keeps_the_clients_port() {
    let Some(s) = synced(
        "a_reused_tuple_through_a_cluster_ip_keeps_the_clients_port",
        "xtw",
        1,
    ) else {
        return;
    };
    s.topo
        .client
        .ns
        .sysctl(&["net.ipv4.tcp_tw_reuse=1"])
        .expect("sysctl");
    let client = s.topo.client.ip;
    let (first, again) = s
        .topo
        .client
        .ns
        .run(move || {
            let first = request_from_port(client, 40000, sock(WEB, 80));
            // TIME_WAIT may be reused once its last timestamp is a second old.
            std::thread::sleep(Duration::from_millis(1200));
            (first, request_from_port(client, 40000, sock(WEB, 80)))
        })
        .expect("client");
    for (what, r) in [("first", first), ("again", again)] {
        let line = r.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            line.contains(&format!(" {client}:40000")),
            "{what}: the backend saw {line:?}"
        );
    }
}

/// A pod's connection through a ClusterIP (tc translates it) is closed; the pod then connects
/// from the same port straight to that backend's address (as a socket the hooks translated
/// does). Today the closed flow's reply entry reverse-NATs the new connection's SYN-ACK to
/// the ClusterIP, and the handshake never completes.
#[test]
fn a_closed_flows_reply_entry_leaves_a_direct_connection_from_its_port_alone() {
    let Some(s) = synced(
        "a_closed_flows_reply_entry_leaves_a_direct_connection_from_its_port_alone",
        "xtd",
        1,
    ) else {
        return;
    };
    let client = s.topo.client.ip;
    let backend = sock(s.topo.backends[0].ip, TCP_PORT);
    let (via_vip, direct) = s
        .topo
        .client
        .ns
        .run(move || {
            let via_vip = request_from_port(client, 40002, sock(WEB, 80));
            (via_vip, request_from_port(client, 40002, backend))
        })
        .expect("client");
    via_vip.expect("through the ClusterIP");
    direct.unwrap_or_else(|e| panic!("straight to the backend: {e}\n{}", s.agent.log_text()));
}

/// Sends a line on a long-lived TCP connection; the backend that answered.
fn ask_tcp(c: &mut std::net::TcpStream) -> Result<String, String> {
    use std::io::{BufRead, BufReader, Write};
    c.write_all(b"hello\n").map_err(|e| format!("send: {e}"))?;
    let mut line = String::new();
    BufReader::new(&*c)
        .read_line(&mut line)
        .map_err(|e| format!("read: {e}"))?;
    line.split_whitespace()
        .next()
        .map(str::to_string)
        .ok_or_else(|| format!("no answer on {:?}: {line:?}", c.peer_addr()))
}

/// Sends a datagram on a long-lived connected UDP socket; the backend that answered.
fn ask_udp(u: &std::net::UdpSocket) -> Result<String, String> {
    u.send(b"hello\n").map_err(|e| format!("send: {e}"))?;
    let mut buf = [0u8; 512];
    let n = u.recv(&mut buf).map_err(|e| format!("recv: {e}"))?;
    String::from_utf8_lossy(&buf[..n])
        .split_whitespace()
        .next()
        .map(str::to_string)
        .ok_or_else(|| "empty UDP answer".to_string())
}

/// An agent of this layout takes over the pins of the previous one (`lb_common::prev`: 40-byte
/// conntrack keys, hash backends, other ids) without breaking a flow: long-lived TCP
/// connections and UDP flows opened before it starts keep their backends after it has
/// copied their entries over, replaced the programs and removed the previous pins.
#[test]
fn a_new_layout_takes_over_the_previous_layouts_flows_without_breaking_them() {
    let Some(mut s) = synced(
        "a_new_layout_takes_over_the_previous_layouts_flows_without_breaking_them",
        "xu",
        3,
    ) else {
        return;
    };
    s.wait_backends("10.96.0.53:53/UDP", 3, Duration::from_secs(10))
        .expect("dns programmed");
    const N: usize = 6;
    type Flows = (
        Vec<std::net::TcpStream>,
        Vec<std::net::UdpSocket>,
        Vec<String>,
    );
    let (mut tcp, udp, first): Flows = s
        .topo
        .client
        .ns
        .run(|| -> Result<Flows, String> {
            let (mut tcp, mut udp, mut first) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..N {
                let mut c = std::net::TcpStream::connect_timeout(&sock(WEB, 80), TIMEOUT)
                    .map_err(|e| format!("connect: {e}"))?;
                c.set_read_timeout(Some(TIMEOUT))
                    .map_err(|e| e.to_string())?;
                first.push(ask_tcp(&mut c)?);
                tcp.push(c);
            }
            for _ in 0..N {
                let u = std::net::UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
                u.connect(sock(DNS, 53)).map_err(|e| e.to_string())?;
                u.set_read_timeout(Some(TIMEOUT))
                    .map_err(|e| e.to_string())?;
                first.push(ask_udp(&u)?);
                udp.push(u);
            }
            Ok((tcp, udp, first))
        })
        .expect("client thread")
        .expect("long-lived flows");
    let ask_all = |tcp: &mut Vec<std::net::TcpStream>, when: &str| {
        let mut got = Vec::new();
        for c in tcp.iter_mut() {
            got.push(ask_tcp(c).unwrap_or_else(|e| panic!("TCP flow {when}: {e}")));
        }
        for u in &udp {
            got.push(ask_udp(u).unwrap_or_else(|e| panic!("UDP flow {when}: {e}")));
        }
        got
    };
    assert!(
        first
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            > 1,
        "the flows should spread: {first:?}"
    );

    // The previous layout's pins, as its agent leaves them; its programs keep forwarding.
    s.agent.stop();
    let entries = xlb_tests::prev_layout::downgrade(&s.agent.pins).expect("previous layout");
    assert!(
        entries >= 4 * N,
        "{entries} conntrack entries for {N}+{N} flows"
    );
    assert_eq!(ask_all(&mut tcp, "before the upgrade"), first);
    let counts = |s: &Scenario| {
        let c = xlb_tests::datapath::reason_counts(&s.agent.pins);
        (c["ct_miss"], c["backend_gone"])
    };
    let misses = counts(&s);

    // The new layout's agent on the same pins.
    let log = s.workdir.join("agent-upgraded.log");
    s.agent.restart(log).expect("restart");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !s.agent.log_text().contains("took over") {
        assert!(
            Instant::now() < deadline,
            "no takeover: {}",
            s.agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = s.agent.log_text();
    for old in lb_common::prev::REPLACED {
        assert!(
            !s.agent.pins.join(old).exists(),
            "{old} still pinned: {text}"
        );
    }
    assert_eq!(
        ask_all(&mut tcp, "after the upgrade"),
        first,
        "every flow keeps its backend"
    );
    assert!(
        text.contains(&format!("conntrack={entries}")),
        "every entry copied: {text}"
    );
    assert_eq!(
        counts(&s),
        misses,
        "no flow was picked up mid-stream or lost its backend"
    );
    // And the new programs serve new flows.
    let answers = s
        .topo
        .client
        .ns
        .run(|| {
            (0..10)
                .map(|_| tcp_request(sock(WEB, 80), TIMEOUT))
                .collect::<Result<Vec<_>, _>>()
        })
        .expect("client thread")
        .expect("new connections after the upgrade");
    assert_eq!(answers.len(), 10);
}
