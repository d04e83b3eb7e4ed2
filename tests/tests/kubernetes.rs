//! `xlb agent --source kubernetes` against the test API server (tests/src/apiserver/), with
//! real traffic: initial lists gate the first write, scaling, terminating endpoints, deletes,
//! a cut watch, a 410 Gone relist without disruption, and the service-proxy-name selector;
//! and the API server's ways the agent must take as the real one's: a watch served from the
//! compaction point, paged lists at one resourceVersion (and an expired continue token), a
//! Service leaving the label selector (DELETED), watches from the current state, 403/429/
//! 500/503 and an API server down at start or later, and one kind's list held while the
//! others complete.

use std::{
    net::Ipv4Addr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use xlb_tests::{
    agent::Agent,
    apiserver::{ApiServer, Fault, Gate, Served},
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
const SERVICES: &str = "/api/v1/services";
const SLICES: &str = "/apis/discovery.k8s.io/v1/endpointslices";

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
    launch(prefix, true, |api| api.hold_lists(hold_lists), extra)
}

/// A cluster whose API server is listening (`up`) or not when the agent starts; `before`
/// runs on the server before the agent starts.
fn launch(prefix: &str, up: bool, before: impl FnOnce(&ApiServer), extra: &[&str]) -> Cluster {
    let tag = unique_tag(prefix);
    let topo = Topology::build(&tag, 3).expect("topology");
    let servers = topo
        .backends
        .iter()
        .map(|p| EchoServer::start(&p.ns, &p.name, TCP_PORT, UDP_PORT).expect("server"))
        .collect();
    let api = if up {
        ApiServer::start(&topo.node)
    } else {
        ApiServer::start_down(&topo.node)
    }
    .expect("api server");
    api.apply_yaml("apiVersion: v1\nkind: Node\nmetadata: {name: node1, labels: {topology.kubernetes.io/zone: z1}}\n")
        .expect("node");
    before(&api);
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
                    "{FRONTEND} never had {n} backends: {e}\n{}",
                    self.api.diagnosis()
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

    /// The list requests (not watches) for `path` so far.
    fn lists(&self, path: &str) -> Vec<Served> {
        self.api
            .served()
            .into_iter()
            .filter(|s| s.is_for(path) && !s.is_watch())
            .collect()
    }

    /// Waits until `what` holds (a condition on the API server), or panics with its log.
    fn wait_server(&self, what: &str, timeout: Duration, pred: impl Fn(&ApiServer) -> bool) {
        let deadline = Instant::now() + timeout;
        while !pred(&self.api) {
            assert!(
                Instant::now() < deadline,
                "never {what} in {timeout:?}; {}\nagent log:\n{}",
                self.api.diagnosis(),
                self.agent.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until the agent's three watches are open and have seen the current
    /// resourceVersion (bookmarks carry it to those whose kind did not change).
    fn wait_watches_current(&self) {
        self.wait_server(
            "three watches at the current resourceVersion",
            WAIT,
            |api| {
                let now = api.resource_version();
                let at = api.watch_positions();
                at.len() == 3 && at.iter().all(|(_, rv)| *rv == now)
            },
        );
    }

    fn request(&self) -> Result<String, String> {
        self.topo
            .client
            .ns
            .run(|| tcp_request(sock(WEB, 80), Duration::from_secs(2)).map(|a| a.backend))
            .expect("client thread")
    }
}

/// Requests to `web` from the client pod, one after another, until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Result<(usize, Vec<String>), String>>,
}

/// What a [`Load`] saw: how many requests, and the failures.
struct Outcome(usize, Vec<String>);

impl Load {
    fn start(c: &Cluster) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = c.topo.client.ns.spawn(move || {
            let mut failures = Vec::new();
            let mut n = 0;
            while !flag.load(Ordering::Relaxed) {
                n += 1;
                if let Err(e) = tcp_request(sock(WEB, 80), Duration::from_secs(2)) {
                    failures.push(e);
                }
                // About 200 a second: a long load would otherwise use up the client's
                // ephemeral ports (TIME_WAIT), which is no fault of the agent's.
                std::thread::sleep(Duration::from_millis(5));
            }
            (n, failures)
        });
        Load { stop, thread }
    }

    fn stop(self) -> Outcome {
        self.stop.store(true, Ordering::Relaxed);
        let (n, failures) = self.thread.join().expect("join").expect("client");
        Outcome(n, failures)
    }
}

impl Outcome {
    fn expect_no_failures(&self, during: &str) {
        let Outcome(n, failures) = self;
        assert!(*n > 10, "too little traffic during {during}: {n}");
        assert!(
            failures.is_empty(),
            "{} of {n} requests failed during {during}: {:?}",
            failures.len(),
            failures.first()
        );
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
    let load = Load::start(&c);
    std::thread::sleep(Duration::from_millis(200));
    // The change happens while no watch is open and the history is compacted past it.
    c.api
        .apply_unseen(&slice("web", &ready(&b[1..])))
        .expect("slice");
    c.wait_backends(2);
    std::thread::sleep(Duration::from_millis(300));
    load.stop().expect_no_failures("the relist");
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
    // The 5 connections may all go to one backend: their packets are counted over both.
    let backend_packets: f64 = text
        .lines()
        .filter(|l| l.starts_with("xlb_backend_packets_total{backend="))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(backend_packets >= 5.0, "backend counters:\n{text}");
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

#[test]
fn a_watch_from_the_compaction_point_is_served() {
    if !require_root("a_watch_from_the_compaction_point_is_served") {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
    let mut c = start("xc", false, &[]);
    c.api.apply_yaml(&service("web", WEB, "")).expect("svc");
    c.api.apply_yaml(&slice("web", &ready(&b))).expect("slice");
    c.wait_backends(3);
    c.wait_watches_current();
    let lists = c.api.served().iter().filter(|s| !s.is_watch()).count();

    // Compacted at the agent's own resourceVersion: its re-watches are served, no relist.
    c.api.compact();
    c.api.cut_watches();
    c.api
        .apply_yaml(&slice("web", &ready(&b[..2])))
        .expect("slice");
    c.wait_backends(2);
    c.wait_watches_current();
    assert_eq!(
        c.api.served().iter().filter(|s| !s.is_watch()).count(),
        lists,
        "a watch from the compaction point was refused (the agent relisted): {:#?}",
        c.api.requests()
    );
    assert_eq!(c.api.watch_errors(), vec![], "no watch may get 410 here");

    // One change older than the compaction point: 410 Gone, a relist, the change arrives.
    c.api
        .apply_unseen(&slice("web", &ready(&b[..1])))
        .expect("slice");
    c.wait_backends(1);
    assert!(
        c.api.watch_errors().iter().any(|(_, code)| *code == 410),
        "a watch from before the compaction point must get 410: {:?}",
        c.api.watch_errors()
    );
    assert!(c.lists(SLICES).len() >= 2, "no relist after 410");
}

/// Service `m{i}` (ClusterIP in 10.97/16) and its EndpointSlice (one ready endpoint).
fn numbered(i: usize, port: u16) -> [serde_json::Value; 2] {
    let name = format!("m{i:04}");
    let ip = Ipv4Addr::new(10, 97, (i / 200) as u8, (i % 200 + 1) as u8);
    [
        serde_json::json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "test", "name": name},
            "spec": {"clusterIP": ip.to_string(), "ports": [{"name": "http", "port": port, "protocol": "TCP"}]}}),
        serde_json::json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"namespace": "test", "name": format!("{name}-abc"), "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": TCP_PORT, "protocol": "TCP"}],
            "endpoints": [{"addresses": [pod_ip(2).to_string()], "conditions": {"ready": true}}]}),
    ]
}

fn frontend_of(i: usize, port: u16) -> String {
    format!("10.97.{}.{}:{port}/TCP", i / 200, i % 200 + 1)
}

#[test]
fn lists_are_paged_at_one_resource_version() {
    if !require_root("lists_are_paged_at_one_resource_version") {
        return;
    }
    const MANY: usize = 1200;
    let mut c = start("xp", true, &[]);
    c.api.apply_all((0..MANY).flat_map(|i| numbered(i, 80)));
    // The agent gets the first page of Services, then waits for the second.
    c.api.hold("Service", Gate::Continues);
    c.api.hold_lists(false);
    c.wait_server("a second page of Services asked for", WAIT, |api| {
        api.held_requests("Service") == 1
    });
    // Changes between the pages: the rest of the list stays the first page's snapshot, the
    // watch from its resourceVersion brings them.
    c.api.delete("Service", "test/m0000");
    c.api.apply(numbered(700, 81)[0].clone());
    c.api.apply_all(numbered(MANY, 80));
    c.api.release("Service", Gate::Continues);
    let want_in = [frontend_of(700, 81), frontend_of(MANY, 80)];
    let want_out = [frontend_of(0, 80), frontend_of(700, 80)];
    let took = c
        .agent
        .wait_for(Duration::from_secs(30), |rows| {
            let fronts: std::collections::BTreeSet<&str> =
                rows.iter().map(|r| r.frontend.as_str()).collect();
            fronts.len() == MANY
                && want_in.iter().all(|f| fronts.contains(f.as_str()))
                && want_out.iter().all(|f| !fronts.contains(f.as_str()))
        })
        .expect("every Service of the paged list, with the changes");
    eprintln!("{MANY} services programmed {took:?} after the second page");
    for path in [SERVICES, SLICES] {
        let pages = c.lists(path);
        assert_eq!(pages.len(), 3, "{path}: 3 pages of 500: {pages:#?}");
        assert!(pages.iter().all(|p| p.target.contains("limit=500")));
        assert_eq!(pages.iter().filter(|p| p.is_continue()).count(), 2);
        assert!(
            pages.iter().all(|p| p.list_rv == pages[0].list_rv),
            "{path}: every page at the first page's resourceVersion: {pages:#?}"
        );
    }

    // An expired continue token: the agent starts its list over, and keeps the datapath.
    c.api.hold("EndpointSlice", Gate::Continues);
    c.api
        .apply_unseen(&serde_json::to_string(&numbered(1, 82)[0]).expect("json"))
        .expect("svc");
    c.wait_server("a second page of slices asked for", WAIT, |api| {
        api.held_requests("EndpointSlice") == 1
    });
    // While it waits: a slice moves to another pod and the history is compacted past the
    // list's resourceVersion. Only the restarted list can bring that change.
    let mut moved = numbered(2, 80)[1].clone();
    moved["endpoints"][0]["addresses"][0] = serde_json::json!(pod_ip(3).to_string());
    c.api.apply(moved);
    c.api.compact();
    let rows = lb_userspace::list::services(&c.agent.pins).expect("rows");
    assert_eq!(
        rows.len(),
        MANY,
        "a relist in progress changed the datapath"
    );
    c.api.release("EndpointSlice", Gate::Continues);
    let moved_to = vec![format!("{}:{TCP_PORT}/TCP", pod_ip(3))];
    c.agent
        .wait_for(Duration::from_secs(30), |rows| {
            rows.len() == MANY
                && rows.iter().any(|r| r.frontend == frontend_of(1, 82))
                && rows
                    .iter()
                    .any(|r| r.frontend == frontend_of(2, 80) && r.backends == moved_to)
        })
        .expect("the changes after a restarted list");
    let slices = c.lists(SLICES);
    let expired = slices
        .iter()
        .position(|p| p.is_continue() && p.status == 410)
        .unwrap_or_else(|| panic!("no 410 for an expired continue token: {slices:#?}"));
    assert!(
        slices[expired + 1..]
            .iter()
            .any(|p| !p.is_continue() && p.status == 200),
        "the list did not start over after 410: {slices:#?}"
    );
}

#[test]
fn a_service_labelled_headless_leaves_the_datapath() {
    if !require_root("a_service_labelled_headless_leaves_the_datapath") {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=3).map(pod_ip).collect();
    let mut c = start("xh", false, &[]);
    c.api.apply_yaml(&service("web", WEB, "")).expect("svc");
    c.api.apply_yaml(&slice("web", &ready(&b))).expect("slice");
    c.wait_backends(2);
    c.request().expect("traffic");
    let lists = c.api.served().iter().filter(|s| !s.is_watch()).count();
    for label in [
        "service.kubernetes.io/headless: \"\"",
        "service.kubernetes.io/service-proxy-name: someone-else",
    ] {
        // No longer selected: the watch sends DELETED.
        c.api.apply_yaml(&service("web", WEB, label)).expect("svc");
        let took = c
            .agent
            .wait_for(WAIT, |rows| rows.iter().all(|r| r.frontend != FRONTEND))
            .unwrap_or_else(|e| panic!("labelled {label}, still programmed: {e}"));
        assert!(
            took < Duration::from_secs(1),
            "{label}: removal took {took:?}"
        );
        // Selected again: ADDED.
        c.api.apply_yaml(&service("web", WEB, "")).expect("svc");
        c.wait_backends(2);
        c.request().expect("traffic once selected again");
    }
    assert_eq!(
        c.api.served().iter().filter(|s| !s.is_watch()).count(),
        lists,
        "the changes must come through the watch, not a relist"
    );
}

/// Requests for `path` that arrived after `since`: how many, the shortest gap between two,
/// and the longest time without one (up to now).
fn tries_since(c: &Cluster, path: &str, since: Instant) -> (usize, Duration, Duration) {
    let mut at: Vec<Instant> = vec![since];
    at.extend(
        c.api
            .served()
            .into_iter()
            .filter(|s| s.is_for(path) && s.at >= since)
            .map(|s| s.at),
    );
    let gaps: Vec<Duration> = at
        .windows(2)
        .skip(1)
        .map(|w| w[1].saturating_duration_since(w[0]))
        .collect();
    let silence = at
        .windows(2)
        .map(|w| w[1].saturating_duration_since(w[0]))
        .chain(at.last().map(|l| l.elapsed()))
        .max()
        .unwrap_or_default();
    let shortest = gaps.into_iter().min().unwrap_or(Duration::MAX);
    (at.len() - 1, shortest, silence)
}

/// How many failures of `what` ("Services", "EndpointSlices", "Node") the agent logged.
fn logged_failures(c: &Cluster, what: &str) -> usize {
    c.agent
        .log_text()
        .lines()
        .filter(|l| l.contains(&format!("watch of {what}:")))
        .count()
}

#[test]
fn the_agent_waits_for_an_api_server_down_at_start() {
    if !require_root("the_agent_waits_for_an_api_server_down_at_start") {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
    let mut c = launch(
        "xd",
        false,
        |api| {
            api.apply_yaml(&service("web", WEB, "")).expect("svc");
            api.apply_yaml(&slice("web", &ready(&b))).expect("slice");
            // Once up, the agent's RBAC lacks EndpointSlices for a while.
            api.inject("EndpointSlice", Fault::Forbidden);
        },
        &[],
    );
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    c.agent
        .wait_for(Duration::ZERO, |rows| rows.is_empty())
        .expect("the agent runs and programs nothing while the API server is down");
    c.api.up().expect("api server up");
    let up = Instant::now();
    c.wait_server("the Services list served", Duration::from_secs(40), |api| {
        api.served()
            .iter()
            .any(|s| s.is_for(SERVICES) && !s.is_watch() && s.status == 200)
    });
    eprintln!("first list {:?} after the API server came up", up.elapsed());
    std::thread::sleep(Duration::from_secs(10).saturating_sub(started.elapsed()));
    // 10 s of failures (refused, then 403): a doubling backoff from 0.8 s tries 3 to 5
    // times; one reset by every list attempt would try about 8 times.
    let failures = logged_failures(&c, "EndpointSlices");
    let forbidden = c.lists(SLICES).iter().filter(|s| s.status == 403).count();
    eprintln!("EndpointSlices: {failures} failures logged in 10 s, {forbidden} of them 403");
    assert!(
        (2..=5).contains(&failures) && forbidden >= 1,
        "{failures} EndpointSlice failures in 10 s ({forbidden} 403s): no backoff\n{}",
        c.agent.log_text()
    );
    assert!(
        lb_userspace::list::services(&c.agent.pins)
            .expect("rows")
            .is_empty(),
        "Services were programmed without their EndpointSlices"
    );
    c.api.clear_fault("EndpointSlice");
    let cleared = Instant::now();
    c.agent
        .wait_for(Duration::from_secs(40), |rows| {
            rows.iter()
                .any(|r| r.frontend == FRONTEND && r.backends.len() == 3)
        })
        .expect("converged once the API server answers");
    eprintln!("programmed {:?} after the 403 ended", cleared.elapsed());
    c.request().expect("traffic");
}

/// A synced agent with traffic flowing to web (three backends).
fn serving(prefix: &str, b: &[Ipv4Addr]) -> (Cluster, Load) {
    let mut c = start(prefix, false, &[]);
    c.api.apply_yaml(&service("web", WEB, "")).expect("svc");
    c.api.apply_yaml(&slice("web", &ready(b))).expect("slice");
    c.wait_backends(3);
    let load = Load::start(&c);
    (c, load)
}

/// Injects `fault` on EndpointSlices while web moves to `b` (a change only a relist brings),
/// checks for `window` that the datapath stays and the agent asks again with backoff, then
/// clears it and waits for the change.
fn through_fault(c: &mut Cluster, fault: Fault, b: &[Ipv4Addr], window: Duration) {
    let before = c.backends_of();
    c.api.inject("EndpointSlice", fault);
    let since = Instant::now();
    c.api.apply_unseen(&slice("web", &ready(b))).expect("slice");
    std::thread::sleep(window);
    assert_eq!(c.backends_of(), before, "{fault:?} changed the datapath");
    let (tries, gap, silence) = tries_since(c, SLICES, since);
    eprintln!(
        "{fault:?}: {tries} EndpointSlice requests in {window:?}, {gap:?} apart at least, {silence:?} at most"
    );
    assert!(tries >= 1, "{fault:?}: the agent stopped asking");
    assert!(
        tries <= 12,
        "{fault:?}: {tries} requests in {window:?} is no backoff"
    );
    match fault {
        Fault::Unavailable => assert!(
            silence < Duration::from_millis(2500),
            "503s: {silence:?} without asking again (a recovered server waits as long)"
        ),
        Fault::TooManyRequests { retry_after_secs } => assert!(
            gap >= Duration::from_secs(retry_after_secs.into()) - Duration::from_millis(100),
            "Retry-After {retry_after_secs} s not honoured: {gap:?}"
        ),
        _ => {}
    }
    c.api.clear_fault("EndpointSlice");
    let cleared = Instant::now();
    c.agent
        .wait_for(Duration::from_secs(40), |rows| {
            rows.iter()
                .any(|r| r.frontend == FRONTEND && r.backends.len() == b.len())
        })
        .unwrap_or_else(|e| panic!("never converged after {fault:?}: {e}"));
    eprintln!(
        "{fault:?}: converged {:?} after it ended",
        cleared.elapsed()
    );
}

#[test]
fn api_errors_never_change_a_working_datapath() {
    if !require_root("api_errors_never_change_a_working_datapath") {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
    let (mut c, load) = serving("xf", &b);
    let window = Duration::from_millis(2500);
    through_fault(&mut c, Fault::Forbidden, &b[..2], window);
    let throttled = Fault::TooManyRequests {
        retry_after_secs: 1,
    };
    through_fault(&mut c, throttled, &b, window);
    through_fault(&mut c, Fault::InternalError, &b[..2], window);
    load.stop().expect_no_failures("403, 429 and 500");
}

#[test]
fn an_unavailable_or_down_api_server_never_changes_a_working_datapath() {
    if !require_root("an_unavailable_or_down_api_server_never_changes_a_working_datapath") {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
    let (mut c, load) = serving("xu", &b);
    // Long enough for 503s to show that the client's retries stay a few seconds apart.
    through_fault(&mut c, Fault::Unavailable, &b[..2], Duration::from_secs(8));

    // The API server down: nothing changes; up again: the change made meanwhile arrives.
    c.api.down().expect("down");
    c.api
        .apply_yaml(&slice("web", &ready(&b[..1])))
        .expect("slice");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        c.backends_of().len(),
        2,
        "the API server down changed the datapath"
    );
    c.api.up().expect("up");
    let up = Instant::now();
    c.agent
        .wait_for(Duration::from_secs(40), |rows| {
            rows.iter()
                .any(|r| r.frontend == FRONTEND && r.backends.len() == 1)
        })
        .expect("converged after the API server came back");
    eprintln!(
        "converged {:?} after the API server came back",
        up.elapsed()
    );
    load.stop()
        .expect_no_failures("503s and the API server down");
}

#[test]
fn no_service_is_programmed_before_its_endpoint_slices_are_listed() {
    if !require_root("no_service_is_programmed_before_its_endpoint_slices_are_listed") {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
    let mut c = launch(
        "xe",
        true,
        |api| {
            api.apply_yaml(&service("web", WEB, "")).expect("svc");
            api.apply_yaml(&slice("web", &ready(&b))).expect("slice");
            api.hold("EndpointSlice", Gate::Lists);
        },
        &[],
    );
    let services_listed = |api: &ApiServer| {
        api.held_requests("EndpointSlice") == 1
            && api
                .served()
                .iter()
                .any(|s| s.is_for(SERVICES) && !s.is_watch() && s.status == 200)
    };
    c.wait_server(
        "Services listed, EndpointSlices held",
        WAIT,
        services_listed,
    );
    std::thread::sleep(Duration::from_millis(1000));
    let rows = lb_userspace::list::services(&c.agent.pins).unwrap_or_default();
    assert!(
        rows.is_empty(),
        "Services were programmed before the EndpointSlice list completed: {rows:?}"
    );
    c.api.release("EndpointSlice", Gate::Lists);
    c.wait_backends(3);

    // A restarted agent, with EndpointSlices held: the pinned datapath keeps serving.
    let load = Load::start(&c);
    std::thread::sleep(Duration::from_millis(200));
    c.api.hold("EndpointSlice", Gate::Lists);
    let before = c.api.served().len();
    c.agent
        .restart(c.workdir.join("agent2.log"))
        .expect("restart");
    c.wait_server(
        "the new agent's Services listed, EndpointSlices held",
        WAIT,
        |api| {
            api.held_requests("EndpointSlice") == 1
                && api.served()[before..]
                    .iter()
                    .any(|s| s.is_for(SERVICES) && !s.is_watch() && s.status == 200)
        },
    );
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(c.backends_of().len(), 3, "the restarted agent emptied web");
    // …and a relist of both (410) while EndpointSlices are held changes nothing either.
    c.api.release("EndpointSlice", Gate::Lists);
    c.wait_watches_current();
    c.api.hold("EndpointSlice", Gate::Lists);
    c.api
        .apply_unseen(&slice("web", &ready(&b[..2])))
        .expect("slice");
    c.wait_server("EndpointSlices relist held", WAIT, |api| {
        api.held_requests("EndpointSlice") == 1
    });
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(c.backends_of().len(), 3, "a held relist changed web");
    c.api.release("EndpointSlice", Gate::Lists);
    c.wait_backends(2);
    load.stop()
        .expect_no_failures("the restart and relists with EndpointSlices held");
}

/// What kube-rs (the agent's client) sees of watches that start without a resourceVersion.
#[derive(Debug)]
struct InitialWatches {
    /// EndpointSlice events of a watch from resourceVersion "0", then one with none.
    from_zero: Vec<String>,
    from_unset: Vec<String>,
    /// Service events of kube-runtime's watcher in streaming-list mode, to `InitDone`.
    streamed: Vec<String>,
}

/// The events of a watch of EndpointSlices from `rv` in 1.5 s: "TYPE name endpoints".
async fn slice_events(
    api: &kube::Api<k8s_openapi::api::discovery::v1::EndpointSlice>,
    rv: &str,
) -> Result<Vec<String>, String> {
    use futures::StreamExt;
    use kube::{ResourceExt, api::WatchEvent};
    let stream = api
        .watch(&kube::api::WatchParams::default(), rv)
        .await
        .map_err(|e| e.to_string())?;
    let mut stream = std::pin::pin!(stream);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1500);
    let mut out = Vec::new();
    while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, stream.next()).await {
        let (kind, s) = match ev.map_err(|e| e.to_string())? {
            WatchEvent::Added(s) => ("ADDED", s),
            WatchEvent::Modified(s) => ("MODIFIED", s),
            WatchEvent::Deleted(s) => ("DELETED", s),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(e) => return Err(format!("watch from {rv:?}: {e:?}")),
        };
        out.push(format!("{kind} {} {}", s.name_any(), s.endpoints.len()));
    }
    Ok(out)
}

/// kube-runtime's watcher in streaming-list mode (`sendInitialEvents`), up to `InitDone`.
async fn streamed_services(client: kube::Client) -> Result<Vec<String>, String> {
    use futures::StreamExt;
    use kube::{ResourceExt, runtime::watcher};
    let api = kube::Api::<k8s_openapi::api::core::v1::Service>::all(client);
    let events = watcher(api, watcher::Config::default().streaming_lists());
    let mut events = std::pin::pin!(events);
    let mut out = Vec::new();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(5), events.next())
            .await
            .map_err(|_| format!("no InitDone in 5 s: {out:?}"))?
            .ok_or("the watcher ended")?
            .map_err(|e| e.to_string())?;
        out.push(match ev {
            watcher::Event::Init => "Init".to_string(),
            watcher::Event::InitApply(s) => format!("InitApply {}", s.name_any()),
            watcher::Event::InitDone => {
                out.push("InitDone".into());
                return Ok(out);
            }
            other => format!("unexpected {other:?}"),
        });
    }
}

fn initial_watches(addr: std::net::SocketAddr) -> Result<InitialWatches, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let url = format!("http://{addr}")
            .parse()
            .map_err(|e| format!("{e}"))?;
        let client = kube::Client::try_from(kube::Config::new(url)).map_err(|e| e.to_string())?;
        let slices = kube::Api::all(client.clone());
        Ok(InitialWatches {
            from_zero: slice_events(&slices, "0").await?,
            from_unset: slice_events(&slices, "").await?,
            streamed: streamed_services(client).await?,
        })
    })
}

#[test]
fn watches_without_a_resource_version_start_from_the_current_state() {
    if !require_root("watches_without_a_resource_version_start_from_the_current_state") {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
    let mut c = start("xw", false, &[]);
    // A history: web scaled 30 times, a Service created and deleted.
    c.api.apply_yaml(&service("web", WEB, "")).expect("svc");
    for i in 0..30 {
        c.api
            .apply_yaml(&slice("web", &ready(&b[..1 + i % 3])))
            .expect("slice");
    }
    c.api.apply_yaml(&slice("web", &ready(&b))).expect("slice");
    c.api
        .apply_yaml(&service("gone", Ipv4Addr::new(10, 96, 0, 30), ""))
        .expect("svc");
    c.api.delete("Service", "test/gone");
    c.wait_backends(3);
    let addr = c.api.addr;
    let seen = c
        .topo
        .node
        .run(move || initial_watches(addr))
        .expect("client thread")
        .expect("kube client");
    let current = vec!["ADDED web-abc 3".to_string()];
    assert_eq!(
        seen.from_zero, current,
        "resourceVersion=0: the state, not the history"
    );
    assert_eq!(
        seen.from_unset, current,
        "no resourceVersion: the state, not the history"
    );
    assert_eq!(seen.streamed, ["Init", "InitApply web", "InitDone"]);
    assert!(
        c.api.served().iter().any(|s| s.is_watch()
            && s.target.contains("sendInitialEvents=true")
            && s.status == 200),
        "a streaming list must be served"
    );
    // The agent, watching from resourceVersions, got no replay either: still 3 backends.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(c.backends_of().len(), 3);
}

/// The EndpointSlice of `web` holding `ips` (ready), as JSON for [`ApiServer::apply`].
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
/// event): the agent converges on the last one, programs it within a second of it, never
/// fails a request meanwhile (every intermediate set is of live pods), and syncs a bounded
/// number of times: at most one per minSyncPeriod (100 ms) of the burst, plus the first.
#[test]
fn a_burst_of_1000_endpoint_changes_converges_with_few_syncs() {
    if !require_root("a_burst_of_1000_endpoint_changes_converges_with_few_syncs") {
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
    let deadline = Instant::now() + Duration::from_secs(1);
    let want: Vec<String> = last
        .iter()
        .map(|ip| format!("{ip}:{TCP_PORT}/TCP"))
        .collect();
    while c.backends_of() != want {
        assert!(
            Instant::now() < deadline,
            "not converged a second after the burst ({burst:?}): {:?}, want {want:?}\n{}",
            c.backends_of(),
            c.api.diagnosis()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Nothing after convergence changes it again.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(c.backends_of(), want, "the final state moved");
    load.stop().expect_no_failures("the burst");
    let syncs = c.agent.log_text().matches(" synced ").count() - syncs_before;
    let bound = (burst + Duration::from_millis(400)).as_millis() as usize / 100 + 2;
    assert!(
        syncs >= 2 && syncs <= bound,
        "{syncs} syncs for {CHANGES} changes over {burst:?} (at most {bound}: one per 100 ms)"
    );
    eprintln!("{CHANGES} changes in {burst:?}: {syncs} syncs");
}
