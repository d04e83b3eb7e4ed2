//! `xlb agent --source kubernetes` against the test API server (tests/src/apiserver.rs), with
//! real traffic: initial lists gate the first write, scaling, terminating endpoints, deletes,
//! a cut watch, a 410 Gone relist without disruption, and the service-proxy-name selector.

use std::{
    net::Ipv4Addr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use xlb_tests::{
    agent::Agent,
    apiserver::ApiServer,
    client::tcp_request,
    echo::EchoServer,
    require_root,
    scenario::{TCP_PORT, UDP_PORT, sock},
    topology::{Topology, pod_ip},
    unique_tag,
};

const WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const FRONTEND: &str = "10.96.0.10:80/TCP";
const WAIT: Duration = Duration::from_secs(10);

fn service(name: &str, ip: Ipv4Addr, labels: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{namespace: test, name: {name}, labels: {{{labels}}}}}\nspec:\n  clusterIP: {ip}\n  ports: [{{name: http, port: 80, protocol: TCP}}]\n"
    )
}

/// An EndpointSlice for `svc` with (ip, ready, serving, terminating) endpoints.
fn slice(svc: &str, endpoints: &[(Ipv4Addr, bool, bool, bool)]) -> String {
    let mut y = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{namespace: test, name: {svc}-abc, labels: {{kubernetes.io/service-name: {svc}}}}}\naddressType: IPv4\nports: [{{name: http, port: {TCP_PORT}, protocol: TCP}}]\nendpoints:"
    );
    if endpoints.is_empty() {
        y.push_str(" []");
    }
    y.push('\n');
    for (ip, ready, serving, terminating) in endpoints {
        y.push_str(&format!(
            "- addresses: [\"{ip}\"]\n  nodeName: node1\n  conditions: {{ready: {ready}, serving: {serving}, terminating: {terminating}}}\n"
        ));
    }
    y
}

fn ready(ips: &[Ipv4Addr]) -> Vec<(Ipv4Addr, bool, bool, bool)> {
    ips.iter().map(|ip| (*ip, true, true, false)).collect()
}

struct Cluster {
    agent: Agent,
    api: ApiServer,
    _servers: Vec<EchoServer>,
    topo: Topology,
    workdir: PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.workdir);
    }
}

fn start(prefix: &str, hold_lists: bool, extra: &[&str]) -> Cluster {
    let tag = unique_tag(prefix);
    let topo = Topology::build(&tag, 3).expect("topology");
    let servers = topo
        .backends
        .iter()
        .map(|p| EchoServer::start(&p.ns, &p.name, TCP_PORT, UDP_PORT).expect("server"))
        .collect();
    let api = ApiServer::start(&topo.node).expect("api server");
    api.apply_yaml("apiVersion: v1\nkind: Node\nmetadata: {name: node1, labels: {topology.kubernetes.io/zone: z1}}\n")
        .expect("node");
    api.hold_lists(hold_lists);
    let workdir = std::env::temp_dir().join(&tag);
    std::fs::create_dir_all(&workdir).expect("workdir");
    let kubeconfig = workdir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let mut args: Vec<String> = vec![
        "--source".into(),
        "kubernetes".into(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
        "--hostname-override".into(),
        "node1".into(),
        "--pod-interfaces".into(),
        "xv-*".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let agent = Agent::start_with(
        &topo.node,
        &args,
        PathBuf::from(format!("/sys/fs/bpf/{tag}")),
        workdir.join("agent.log"),
    )
    .expect("agent");
    Cluster {
        agent,
        api,
        _servers: servers,
        topo,
        workdir,
    }
}

impl Cluster {
    fn wait_backends(&mut self, n: usize) -> Duration {
        self.agent
            .wait_for(WAIT, |rows| {
                rows.iter()
                    .any(|r| r.frontend == FRONTEND && r.backends.len() == n)
            })
            .unwrap_or_else(|e| {
                panic!(
                    "{FRONTEND} never had {n} backends: {e}\nrequests: {:#?}",
                    self.api.requests()
                )
            })
    }

    fn backends_of(&self) -> Vec<String> {
        lb_userspace::list::services(&self.agent.pins)
            .unwrap_or_default()
            .into_iter()
            .find(|r| r.frontend == FRONTEND)
            .map(|r| r.backends)
            .unwrap_or_default()
    }

    fn request(&self) -> Result<String, String> {
        self.topo
            .client
            .ns
            .run(|| tcp_request(sock(WEB, 80), Duration::from_secs(2)).map(|a| a.backend))
            .expect("client thread")
    }
}

#[test]
fn the_agent_follows_the_api_server() {
    if !require_root("the_agent_follows_the_api_server") {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
    let mut c = start("xk", true, &[]);
    c.api.apply_yaml(&service("web", WEB, "")).expect("svc");
    c.api.apply_yaml(&slice("web", &ready(&b))).expect("slice");

    // Lists are held: the agent must not write a single service.
    std::thread::sleep(Duration::from_millis(1500));
    let rows = lb_userspace::list::services(&c.agent.pins).unwrap_or_default();
    assert!(
        rows.is_empty(),
        "services were written before the initial lists completed: {rows:?}"
    );
    c.api.hold_lists(false);
    c.wait_backends(3);
    assert!(c.request().is_ok(), "traffic after the first sync");

    // Scale down, then one endpoint terminating: new flows go to ready ones only.
    c.api
        .apply_yaml(&slice("web", &ready(&b[..2])))
        .expect("slice");
    let took = c.wait_backends(2);
    assert!(took < Duration::from_secs(1), "scale-down took {took:?}");
    c.api
        .apply_yaml(&slice(
            "web",
            &[(b[0], true, true, false), (b[1], false, true, true)],
        ))
        .expect("slice");
    c.wait_backends(1);
    assert_eq!(c.backends_of(), vec![format!("{}:{TCP_PORT}/TCP", b[0])]);
    // All terminating: kube-proxy falls back to the serving-terminating ones.
    c.api
        .apply_yaml(&slice(
            "web",
            &[
                (b[0], false, true, true),
                (b[1], false, true, true),
                (b[2], false, false, true),
            ],
        ))
        .expect("slice");
    c.wait_backends(2);
    // …and traffic reaches them (never the not-serving one).
    for _ in 0..20 {
        let answer = c
            .request()
            .expect("served by the serving-terminating endpoints");
        assert_ne!(answer, "backend-3", "a not-serving endpoint got traffic");
    }

    // A cut watch: the agent re-watches and still sees changes.
    c.api.cut_watches();
    c.api.apply_yaml(&slice("web", &ready(&b))).expect("slice");
    c.wait_backends(3);

    // A 410 Gone: the agent relists; traffic keeps flowing throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let load = c.topo.client.ns.spawn(move || {
        let mut failures = Vec::new();
        let mut n = 0;
        while !flag.load(Ordering::Relaxed) {
            n += 1;
            if let Err(e) = tcp_request(sock(WEB, 80), Duration::from_secs(2)) {
                failures.push(e);
            }
        }
        (n, failures)
    });
    std::thread::sleep(Duration::from_millis(200));
    c.api.compact();
    c.api
        .apply_yaml(&slice("web", &ready(&b[1..])))
        .expect("slice");
    c.wait_backends(2);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let (n, failures) = load.join().expect("join").expect("client");
    assert!(n > 10, "too little traffic during the relist: {n}");
    assert!(
        failures.is_empty(),
        "{} of {n} requests failed across the relist: {:?}",
        failures.len(),
        failures.first()
    );
    let lists_after = c
        .api
        .requests()
        .iter()
        .filter(|r| r.contains("/endpointslices") && !r.contains("watch="))
        .count();
    assert!(
        lists_after >= 2,
        "the agent did not relist after 410: {:#?}",
        c.api.requests()
    );

    // Delete: the frontend goes away.
    c.api.delete("Service", "test/web");
    c.api.delete("EndpointSlice", "test/web-abc");
    c.agent
        .wait_for(WAIT, |rows| rows.iter().all(|r| r.frontend != FRONTEND))
        .expect("service removed");
}

#[test]
fn service_proxy_name_and_headless_labels_select_services() {
    if !require_root("service_proxy_name_and_headless_labels_select_services") {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=3).map(pod_ip).collect();
    let mut c = start("xs", false, &[]);
    let other = Ipv4Addr::new(10, 96, 0, 11);
    let headless_ip = Ipv4Addr::new(10, 96, 0, 12);
    c.api.apply_yaml(&service("web", WEB, "")).expect("svc");
    c.api.apply_yaml(&slice("web", &ready(&b))).expect("slice");
    c.api
        .apply_yaml(&service(
            "other",
            other,
            "service.kubernetes.io/service-proxy-name: someone-else",
        ))
        .expect("svc");
    c.api
        .apply_yaml(&slice("other", &ready(&b)))
        .expect("slice");
    c.api
        .apply_yaml(&service(
            "marked",
            headless_ip,
            "service.kubernetes.io/headless: \"\"",
        ))
        .expect("svc");
    c.wait_backends(2);
    std::thread::sleep(Duration::from_millis(300));
    let fronts: Vec<String> = lb_userspace::list::services(&c.agent.pins)
        .expect("read")
        .into_iter()
        .map(|r| r.frontend)
        .collect();
    assert_eq!(
        fronts,
        vec![FRONTEND.to_string()],
        "only the unlabelled service is served"
    );
    let lists: Vec<String> = c
        .api
        .requests()
        .into_iter()
        .filter(|r| r.contains("/services?"))
        .collect();
    assert!(
        lists
            .iter()
            .all(|r| r.contains("service-proxy-name") && r.contains("headless")),
        "kube-proxy's label selector must be used: {lists:?}"
    );
}

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
    if !require_root("health_and_metrics_follow_kube_proxy") {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=3).map(pod_ip).collect();
    let mut c = start("xm", true, &[]);
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
    assert!(value("xlb_service_packets_total{service=\"test/web:http\"") >= 10.0);
    assert!(value("xlb_datapath_packets_total{reason=\"new_flow\"}") >= 5.0);
    assert_eq!(
        value(&format!(
            "xlb_map_entries{{map=\"{}\"}}",
            lb_common::MAP_BACKEND
        )),
        2.0
    );
    assert!(value("xlb_backend_packets_total{backend=") >= 5.0);
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

#[test]
fn internal_traffic_policy_local_and_client_ip_affinity() {
    if !require_root("internal_traffic_policy_local_and_client_ip_affinity") {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
    let mut c = start("xl", false, &[]);
    let local = Ipv4Addr::new(10, 96, 0, 20);
    let nowhere = Ipv4Addr::new(10, 96, 0, 21);
    let sticky = Ipv4Addr::new(10, 96, 0, 22);
    let svc = |name: &str, ip: Ipv4Addr, extra: &str| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{namespace: test, name: {name}}}\nspec:\n  clusterIP: {ip}\n{extra}  ports: [{{name: http, port: 80, protocol: TCP}}]\n"
        )
    };
    let slice_on = |name: &str, eps: &[(Ipv4Addr, &str)]| {
        let mut y = format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{namespace: test, name: {name}-abc, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: http, port: {TCP_PORT}, protocol: TCP}}]\nendpoints:\n"
        );
        for (ip, node) in eps {
            y.push_str(&format!("- addresses: [\"{ip}\"]\n  nodeName: {node}\n"));
        }
        y
    };
    c.api
        .apply_yaml(&svc("local", local, "  internalTrafficPolicy: Local\n"))
        .expect("svc");
    c.api
        .apply_yaml(&slice_on(
            "local",
            &[(b[0], "node1"), (b[1], "node2"), (b[2], "node2")],
        ))
        .expect("slice");
    c.api
        .apply_yaml(&svc("nowhere", nowhere, "  internalTrafficPolicy: Local\n"))
        .expect("svc");
    c.api
        .apply_yaml(&slice_on("nowhere", &[(b[1], "node2")]))
        .expect("slice");
    c.api
        .apply_yaml(&svc("sticky", sticky, "  sessionAffinity: ClientIP\n"))
        .expect("svc");
    c.api
        .apply_yaml(&slice_on(
            "sticky",
            &[(b[0], "node1"), (b[1], "node2"), (b[2], "node3")],
        ))
        .expect("slice");
    // Topology hints: every ready endpoint has zone hints and node1 is in z1 (its Node's
    // label), so only the z1 endpoint gets traffic.
    let zoned = Ipv4Addr::new(10, 96, 0, 23);
    c.api
        .apply_yaml(&svc("zoned", zoned, "  trafficDistribution: PreferClose\n"))
        .expect("svc");
    c.api
        .apply_yaml(&format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{namespace: test, name: zoned-abc, labels: {{kubernetes.io/service-name: zoned}}}}\naddressType: IPv4\nports: [{{name: http, port: {TCP_PORT}, protocol: TCP}}]\nendpoints:\n- {{addresses: [\"{}\"], nodeName: node2, zone: z1, hints: {{forZones: [{{name: z1}}]}}}}\n- {{addresses: [\"{}\"], nodeName: node3, zone: z2, hints: {{forZones: [{{name: z2}}]}}}}\n",
            b[1], b[2]
        ))
        .expect("slice");
    c.agent
        .wait_for(WAIT, |rows| {
            rows.iter()
                .filter(|r| r.frontend.starts_with("10.96.0.2"))
                .count()
                == 4
        })
        .expect("four services programmed");
    let zoned_answers = c
        .topo
        .client
        .ns
        .run(move || {
            (0..20)
                .map(|_| tcp_request(sock(zoned, 80), Duration::from_secs(2)).map(|a| a.backend))
                .collect::<Vec<_>>()
        })
        .expect("client");
    for a in zoned_answers {
        assert_eq!(
            a.expect("zoned answers"),
            "backend-2",
            "topology hints must keep traffic in zone z1"
        );
    }

    let (local_answers, nowhere_result, sticky_answers) = c
        .topo
        .client
        .ns
        .run(move || {
            let ask =
                |ip: Ipv4Addr| tcp_request(sock(ip, 80), Duration::from_secs(2)).map(|a| a.backend);
            let local: Vec<_> = (0..20).map(|_| ask(local)).collect();
            let t0 = std::time::Instant::now();
            let nowhere = std::net::TcpStream::connect_timeout(
                &sock(nowhere, 80),
                Duration::from_millis(700),
            )
            .map(|_| ())
            .map_err(|e| (e.kind(), t0.elapsed()));
            let sticky: Vec<_> = (0..20).map(|_| ask(sticky)).collect();
            (local, nowhere, sticky)
        })
        .expect("client");
    let local_answers: Vec<String> = local_answers
        .into_iter()
        .map(|r| r.expect("local service answers"))
        .collect();
    assert!(
        local_answers.iter().all(|b| b == "backend-1"),
        "Local policy left the node: {local_answers:?}"
    );
    let (kind, _) = nowhere_result.expect_err("no local endpoint must not connect");
    assert_eq!(
        kind,
        std::io::ErrorKind::TimedOut,
        "Local without local endpoints drops (as kube-proxy), it does not refuse"
    );
    let sticky_answers: Vec<String> = sticky_answers
        .into_iter()
        .map(|r| r.expect("sticky answers"))
        .collect();
    assert!(
        sticky_answers.iter().all(|b| *b == sticky_answers[0]),
        "ClientIP affinity broken: {sticky_answers:?}"
    );
}
