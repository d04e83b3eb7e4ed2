//! The agent's life: YAML edits, pins that outlive it, cleanup, interfaces that appear
//! later, its capabilities, a kube-proxy config file.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use xlb_tests::suites::traffic::{TIMEOUT, WEB, backends, synced, traffic, yaml};
use xlb_tests::{
    capture::Capture,
    client::tcp_request,
    require_root,
    scenario::{Scenario, TCP_PORT, UDP_PORT, sock},
    services::write_atomic,
};

#[test]
fn yaml_edits_take_effect_within_a_second_without_failed_requests() {
    if !require_root() {
        return;
    }
    let all = backends(3);
    let mut s = Scenario::start("xe", 3, &yaml(&all[..2], &all[..2])).expect("scenario");
    s.wait_backends("10.96.0.10:80/TCP", 2, Duration::from_secs(30))
        .expect("initial sync");

    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(&s, stop.clone());
    std::thread::sleep(Duration::from_millis(300));

    // Add backend-3.
    write_atomic(&s.yaml, &yaml(&all, &all)).expect("write");
    // Within 5 s: applied on the file's event, not on the 60 s prune (how fast is the sync
    // bench's to say).
    s.wait_backends("10.96.0.10:80/TCP", 3, Duration::from_secs(5))
        .expect("scale up");
    s.wait_backends("10.96.0.53:53/UDP", 3, Duration::from_secs(1))
        .expect("udp scale up");
    std::thread::sleep(Duration::from_millis(500));

    // Remove backend-1; its server keeps running, so any failure would be xlb's.
    write_atomic(&s.yaml, &yaml(&all[1..], &all[1..])).expect("write");
    let removed_at = Instant::now();
    s.wait_backends("10.96.0.10:80/TCP", 2, Duration::from_secs(5))
        .expect("scale down");
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
    let Some(mut s) = synced("xr", 3) else {
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
    let before = lb_userspace::list::services(&xlb_tests::pins(&s.agent.pins)).expect("read pins");
    let log = s.workdir.join("agent2.log");
    s.agent.restart(log).expect("restart");
    let stable = s.wait_backends("10.96.0.10:80/TCP", 3, Duration::from_secs(30));
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
    let after = lb_userspace::list::services(&xlb_tests::pins(&s.agent.pins)).expect("read pins");
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
    let Some(mut s) = synced("xc", 2) else {
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
fn a_pod_interface_that_appears_later_is_attached() {
    if !require_root() {
        return;
    }
    let all = backends(3);
    let mut s = Scenario::start("xh", 2, &yaml(&all[..2], &all[..2])).expect("scenario");
    s.wait_backends("10.96.0.10:80/TCP", 2, Duration::from_secs(30))
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
    let Some(mut s) = synced("xp", 2) else {
        return;
    };
    // The scenario's own agent is replaced by one whose capabilities are cut down to the two
    // deploy/base/daemonset-capabilities.yaml grants.
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
    s.wait_backends("10.96.0.10:80/TCP", 2, Duration::from_secs(30))
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
fn a_kube_proxy_style_config_file_is_read_and_unknown_keys_are_named() {
    let Some(mut s) = synced("xg", 2) else {
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
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nhealthzBindAddress: 127.0.0.1:10299\nminSyncPeriod: 50ms\nconntrack: {udpTimeout: 45s}\n",
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
            // The pins already held the two services (the first agent's), so the wait
            // above can end before this agent's first sync, while its health answers 503.
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut last = None;
            loop {
                if let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", 10299)) {
                    let _ = write!(
                        c,
                        "GET /livez HTTP/1.1\r\nHost: n\r\nConnection: close\r\n\r\n"
                    );
                    let mut t = String::new();
                    let _ = c.read_to_string(&mut t);
                    last = t.split_whitespace().nth(1).map(str::to_string);
                    if last.as_deref() == Some("200") {
                        return last;
                    }
                }
                if Instant::now() > deadline {
                    return last;
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
    // The file's conntrack section applies to the kernel's conntrack, as kube-proxy's does
    // (the namespace's UDP timeout was the kernel's 30 s).
    let log = a.log_text();
    assert!(
        log.contains("sysctl=\"net.netfilter.nf_conntrack_udp_timeout\" value=45 was=30"),
        "the config file's conntrack.udpTimeout must be set:\n{log}"
    );
}
