//! Connect-time load balancing: real client processes in the agent's cgroup, from the node
//! namespace itself and from a pod, through the cgroup socket hooks.

use std::{collections::BTreeMap, net::Ipv4Addr, time::Duration};

use xlb_tests::{
    datapath::reason_counts,
    probe::{self, Line},
    require_root,
    scenario::{Scenario, TCP_PORT, UDP_PORT, sock},
    services::{service_yaml, write_atomic},
    topology::{GATEWAY, pod_ip},
};

const WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const DNS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 53);

fn backends(n: u8) -> Vec<Ipv4Addr> {
    (1..=n).map(|k| pod_ip(k + 1)).collect()
}

fn yaml(web: &[Ipv4Addr], dns: &[Ipv4Addr]) -> String {
    service_yaml("web", WEB, 80, "TCP", TCP_PORT, web)
        + &service_yaml("dns", DNS, 53, "UDP", UDP_PORT, dns)
}

fn args(mode: &str, to: std::net::SocketAddr, n: u32) -> Vec<String> {
    vec![mode.into(), to.to_string(), n.to_string()]
}

fn spread(lines: &[Line]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for l in lines {
        *m.entry(l.backend().unwrap_or("FAILED").to_string())
            .or_insert(0) += 1;
    }
    m
}

fn started(prefix: &str, yaml: &str, backends: usize) -> Option<Scenario> {
    Scenario::started(prefix, yaml, backends, "10.96.0.10:80/TCP")
}

#[test]
fn the_node_itself_reaches_a_cluster_ip_over_tcp_and_udp() {
    let all = backends(3);
    let Some(s) = started("xs", &yaml(&all, &all), 3) else {
        return;
    };
    let cg = s.agent.cgroup.as_ref().expect("the agent's cgroup");
    // A new socket per request spreads; one unconnected UDP socket stays on one backend
    // (one flow, as kube-proxy's conntrack keeps it).
    for (mode, vip, spread_over) in [
        ("tcp", sock(WEB, 80), 3),
        ("udp", sock(DNS, 53), 3),
        ("udp-unconnected", sock(DNS, 53), 1),
    ] {
        let lines = probe::run(cg, &s.topo.node, &args(mode, vip, 60)).expect("probe");
        let by_backend = spread(&lines);
        assert_eq!(
            by_backend.len(),
            spread_over,
            "{mode}: {by_backend:?}\n{lines:?}\n{}",
            s.agent.log_text()
        );
        for l in &lines {
            let Line::Ok {
                seen_client, peer, ..
            } = l
            else {
                panic!("{mode}: {l:?}");
            };
            assert_eq!(*peer, vip, "{mode}: the socket must see the frontend");
            assert!(
                seen_client.starts_with(&format!("{GATEWAY}:")),
                "{mode}: the backend saw {seen_client}, not the node"
            );
        }
    }
    let counts = reason_counts(&s.agent.pins);
    assert!(counts["sock_xlate"] >= 120, "{counts:?}");
    assert!(counts["sock_revnat"] >= 180, "{counts:?}");
}

/// Counter deltas over `f`.
fn counted<T>(s: &Scenario, f: impl FnOnce() -> T) -> (T, BTreeMap<&'static str, i64>) {
    let before = reason_counts(&s.agent.pins);
    let out = f();
    let after = reason_counts(&s.agent.pins);
    let delta = after
        .iter()
        .map(|(k, v)| (*k, *v as i64 - before.get(k).copied().unwrap_or(0) as i64))
        .collect();
    (out, delta)
}

fn all_ok(what: &str, lines: &[Line], s: &Scenario) {
    assert!(
        lines.iter().all(|l| matches!(l, Line::Ok { .. })),
        "{what}: {lines:?}\n{}",
        s.agent.log_text()
    );
}

#[test]
fn pod_sockets_are_translated_at_connect_and_need_no_packet_nat() {
    let all = backends(3);
    let Some(s) = started("xsp", &yaml(&all, &all), 3) else {
        return;
    };
    let cg = s.agent.cgroup.as_ref().expect("cgroup");
    let client = s.topo.client.ip;
    let ((tcp, udp), delta) = counted(&s, || {
        let tcp = probe::run(cg, &s.topo.client.ns, &args("tcp", sock(WEB, 80), 60));
        let udp = probe::run(cg, &s.topo.client.ns, &args("udp", sock(DNS, 53), 60));
        (tcp.expect("tcp probe"), udp.expect("udp probe"))
    });
    for (what, lines, vip) in [("tcp", &tcp, sock(WEB, 80)), ("udp", &udp, sock(DNS, 53))] {
        all_ok(what, lines, &s);
        assert_eq!(spread(lines).len(), 3, "{what}: {:?}", spread(lines));
        for l in lines.iter() {
            if let Line::Ok {
                seen_client, peer, ..
            } = l
            {
                assert!(
                    seen_client.starts_with(&format!("{client}:")),
                    "{what}: {l:?}"
                );
                assert_eq!(*peer, vip, "{what}: {l:?}");
            }
        }
    }
    // Translated at connect(): tc saw only backend addresses, nothing to NAT.
    assert_eq!(delta["new_flow"], 0, "{delta:?}");
    assert_eq!(delta["established"], 0, "{delta:?}");
    assert_eq!(delta["reverse_nat"], 0, "{delta:?}");
    assert!(delta["sock_xlate"] >= 120, "{delta:?}");
}

#[test]
fn socket_lb_host_leaves_pods_to_tc_and_off_removes_the_hooks() {
    let all = backends(2);
    let Some(mut s) = started("xsh", &yaml(&all, &all), 2) else {
        return;
    };
    let restart = |s: &mut Scenario, mode: &str, log: &str| {
        let args: Vec<String> = [
            "--source",
            &format!("file:{}", s.yaml.display()),
            "--pod-interfaces",
            "xv-*",
            "--socket-lb",
            mode,
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        let log = s.workdir.join(log);
        s.agent.restart_with(&args, log).expect("restart");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !s.agent.log_text().contains("synced") {
            assert!(
                std::time::Instant::now() < deadline,
                "{}",
                s.agent.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    restart(&mut s, "host", "agent-host.log");
    let cg = s.agent.cgroup.take().expect("cgroup");
    let (pod, delta) = counted(&s, || {
        probe::run(&cg, &s.topo.client.ns, &args("tcp", sock(WEB, 80), 30)).expect("probe")
    });
    all_ok("pod, host mode", &pod, &s);
    assert_eq!(
        delta["sock_xlate"], 0,
        "pods are not translated in host mode: {delta:?}"
    );
    assert!(
        delta["new_flow"] >= 30,
        "tc translated the pod's flows: {delta:?}"
    );
    let (node, delta) = counted(&s, || {
        probe::run(&cg, &s.topo.node, &args("tcp", sock(WEB, 80), 30)).expect("probe")
    });
    all_ok("node, host mode", &node, &s);
    assert!(delta["sock_xlate"] >= 30, "{delta:?}");

    restart(&mut s, "off", "agent-off.log");
    let links: Vec<String> = std::fs::read_dir(s.agent.pins.join("links"))
        .expect("links")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !links.iter().any(|l| l.starts_with("sock_")),
        "off must remove the hooks: {links:?}"
    );
    let (node, delta) = counted(&s, || {
        probe::run(&cg, &s.topo.node, &args("tcp", sock(WEB, 80), 3)).expect("probe")
    });
    assert!(
        node.iter().all(|l| matches!(l, Line::Err { .. })),
        "with the hooks off the node has no route to a ClusterIP: {node:?}"
    );
    assert_eq!(delta["sock_xlate"] + delta["sock_pass"], 0, "{delta:?}");
    s.agent.cgroup = Some(cg);
}

const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 50);
const NODE_PORT: u16 = 30080;

/// A NodePort Service with an externalIP and externalTrafficPolicy Local whose endpoints
/// are all on another node, plus a ClientIP-affinity ClusterIP Service on this node's pods.
fn external_yaml(eps: &[Ipv4Addr]) -> String {
    let remote: Vec<(Ipv4Addr, &str)> = eps.iter().map(|ip| (*ip, "node2")).collect();
    let local: Vec<(Ipv4Addr, &str)> = eps.iter().map(|ip| (*ip, "node1")).collect();
    xlb_tests::services::service_on_nodes(
        "np",
        "NodePort",
        "10.96.0.20",
        "TCP",
        80,
        TCP_PORT,
        Some(NODE_PORT),
        &format!("  externalTrafficPolicy: Local\n  externalIPs: [\"{EXTERNAL_IP}\"]\n"),
        "",
        &remote,
    ) + &xlb_tests::services::service_on_nodes(
        "sticky",
        "ClusterIP",
        "10.96.0.30",
        "TCP",
        80,
        TCP_PORT,
        None,
        "  sessionAffinity: ClientIP\n",
        "",
        &local,
    )
}

fn external_scenario(prefix: &str) -> Option<Scenario> {
    if !require_root() {
        return None;
    }
    let all = backends(3);
    let mut s = Scenario::start_with(
        prefix,
        3,
        &external_yaml(&all),
        &[
            "--hostname-override",
            "node1",
            "--nodeport-addresses",
            &NODE_IP.to_string(),
        ],
    )
    .expect("scenario");
    s.topo
        .node
        .ip(&["addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"])
        .expect("node address");
    s.wait_backends("10.96.0.30:80/TCP", 3, Duration::from_secs(30))
        .expect("sync");
    Some(s)
}

#[test]
fn the_node_reaches_node_ports_on_its_address_and_loopback_and_external_ips() {
    let Some(s) = external_scenario("xsn") else {
        return;
    };
    let cg = s.agent.cgroup.as_ref().expect("cgroup");
    // externalTrafficPolicy Local and no endpoint on this node: external clients would be
    // dropped, but traffic from the node goes to every endpoint (as kube-proxy does).
    for to in [
        sock(NODE_IP, NODE_PORT),
        sock(Ipv4Addr::LOCALHOST, NODE_PORT),
        sock(EXTERNAL_IP, 80),
    ] {
        let lines = probe::run(cg, &s.topo.node, &args("tcp", to, 45)).expect("probe");
        all_ok(&to.to_string(), &lines, &s);
        assert_eq!(spread(&lines).len(), 3, "{to}: {:?}", spread(&lines));
        assert!(
            lines
                .iter()
                .all(|l| matches!(l, Line::Ok { peer, .. } if *peer == to)),
            "{to}: getpeername must show the frontend: {lines:?}"
        );
    }
    // A pod's 127.0.0.1 is its own: the loopback NodePort is the host's only.
    let lines = probe::run(
        cg,
        &s.topo.client.ns,
        &args("tcp", sock(Ipv4Addr::LOCALHOST, NODE_PORT), 2),
    )
    .expect("probe");
    assert!(
        lines
            .iter()
            .all(|l| matches!(l, Line::Err { errno: 111, .. })),
        "nothing listens on the pod's own loopback: {lines:?}"
    );
}

#[test]
fn client_ip_affinity_holds_for_the_node_and_for_a_pod() {
    let Some(s) = external_scenario("xsa") else {
        return;
    };
    let cg = s.agent.cgroup.as_ref().expect("cgroup");
    let vip = sock(Ipv4Addr::new(10, 96, 0, 30), 80);
    for (who, ns) in [("node", &s.topo.node), ("pod", &s.topo.client.ns)] {
        let lines = probe::run(cg, ns, &args("tcp", vip, 30)).expect("probe");
        all_ok(who, &lines, &s);
        assert_eq!(spread(&lines).len(), 1, "{who}: {:?}", spread(&lines));
    }
}

#[test]
fn a_frontend_without_endpoints_refuses_connect_and_send_at_once() {
    let Some(s) = started("xsr", &yaml(&[], &[]), 0) else {
        return;
    };
    let cg = s.agent.cgroup.as_ref().expect("cgroup");
    for (who, ns) in [("node", &s.topo.node), ("pod", &s.topo.client.ns)] {
        for (mode, to) in [
            ("tcp", sock(WEB, 80)),
            ("udp", sock(DNS, 53)),
            ("udp-unconnected", sock(DNS, 53)),
        ] {
            let lines = probe::run(cg, ns, &args(mode, to, 5)).expect("probe");
            for l in &lines {
                match l {
                    Line::Err { ms, errno: 111, .. } => {
                        assert!(*ms < 100.0, "{who} {mode}: refused after {ms} ms")
                    }
                    other => panic!("{who} {mode}: expected ECONNREFUSED, got {other:?}"),
                }
            }
        }
    }
    let counts = reason_counts(&s.agent.pins);
    assert!(counts["sock_reject"] >= 30, "{counts:?}");
}

#[test]
fn a_connected_udp_socket_leaves_a_removed_backend_within_a_second() {
    let all = backends(3);
    let Some(s) = started("xsu", &yaml(&all, &all), 3) else {
        return;
    };
    let cg = s.agent.cgroup.as_ref().expect("cgroup");
    let mut remaining = all.clone();
    for (who, ns) in [("node", &s.topo.node), ("pod", &s.topo.client.ns)] {
        let (rx, on, index) = probe::udp_stay(cg, ns, sock(DNS, 53));
        // Remove the backend this socket is connected to (its pod keeps serving: a socket
        // left on it would go on getting answers from it).
        let gone = s.topo.backends[index - 1].ip;
        remaining.retain(|ip| *ip != gone);
        write_atomic(&s.yaml, &yaml(&all, &remaining)).expect("write");
        let removed = std::time::Instant::now();
        let after: Vec<(std::time::Instant, Line)> = rx.iter().collect();
        probe::assert_left_removed_backend(who, &on, removed, &after, &s.agent.log_text());
    }
    assert!(
        s.agent
            .log_text()
            .contains("destroyed connected UDP sockets of removed backends"),
        "{}",
        s.agent.log_text()
    );
}

#[test]
fn host_connections_survive_an_agent_sigkill_and_restart() {
    let all = backends(2);
    let Some(mut s) = started("xsk", &yaml(&all, &all), 2) else {
        return;
    };
    let cg = s.agent.cgroup.take().expect("cgroup");
    let hold: Vec<String> = ["tcp-hold", &sock(WEB, 80).to_string(), "3", "20"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    let held = probe::spawn(&cg, &s.topo.node, &hold).expect("probe");
    std::thread::sleep(Duration::from_millis(500));
    let pid = s.agent.pid().expect("agent running");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    std::thread::sleep(Duration::from_millis(200));
    // No agent: the pinned hooks and maps go on serving new connections too.
    let orphaned = probe::run(&cg, &s.topo.node, &args("tcp", sock(WEB, 80), 10)).expect("probe");
    all_ok("new connections with no agent", &orphaned, &s);
    let log = s.workdir.join("agent-2.log");
    s.agent.restart(log).expect("restart");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !s.agent.log_text().contains("synced") {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            s.agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let fresh = probe::run(&cg, &s.topo.node, &args("tcp", sock(WEB, 80), 10)).expect("probe");
    all_ok("new connections after the restart", &fresh, &s);
    let held = probe::finish(held).expect("held connection");
    assert!(held.len() >= 50, "the connection stopped early: {held:?}");
    all_ok("the long-lived connection", &held, &s);
    assert_eq!(
        spread(&held).len(),
        1,
        "one connection, one backend: {held:?}"
    );
    // getpeername() ran on every request: the hooks never left, through kill and restart.
    assert!(
        held.iter()
            .all(|l| matches!(l, Line::Ok { peer, .. } if *peer == sock(WEB, 80))),
        "{held:?}"
    );
    s.agent.cgroup = Some(cg);
}
