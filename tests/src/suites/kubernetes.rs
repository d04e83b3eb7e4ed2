//! Helpers shared by the `kubernetes` test files.

use std::{
    net::Ipv4Addr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use crate::{
    agent::Agent,
    apiserver::{ApiServer, Served},
    client::tcp_request,
    echo::EchoServer,
    scenario::{TCP_PORT, UDP_PORT, sock},
    topology::Topology,
    unique_tag,
};

pub const WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
pub const FRONTEND: &str = "10.96.0.10:80/TCP";
pub const WAIT: Duration = Duration::from_secs(10);
pub const SERVICES: &str = "/api/v1/services";
pub const SLICES: &str = "/apis/discovery.k8s.io/v1/endpointslices";

pub fn service(name: &str, ip: Ipv4Addr, labels: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{namespace: test, name: {name}, labels: {{{labels}}}}}\nspec:\n  clusterIP: {ip}\n  ports: [{{name: http, port: 80, protocol: TCP}}]\n"
    )
}

/// An EndpointSlice for `svc` with (ip, ready, serving, terminating) endpoints.
pub fn slice(svc: &str, endpoints: &[(Ipv4Addr, bool, bool, bool)]) -> String {
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

pub fn ready(ips: &[Ipv4Addr]) -> Vec<(Ipv4Addr, bool, bool, bool)> {
    ips.iter().map(|ip| (*ip, true, true, false)).collect()
}

pub struct Cluster {
    pub agent: Agent,
    pub api: ApiServer,
    pub _servers: Vec<EchoServer>,
    pub topo: Topology,
    pub workdir: PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.workdir);
    }
}

pub fn start(prefix: &str, hold_lists: bool, extra: &[&str]) -> Cluster {
    launch(prefix, true, |api| api.hold_lists(hold_lists), extra)
}

/// A cluster whose API server is listening (`up`) or not when the agent starts; `before`
/// runs on the server before the agent starts.
pub fn launch(prefix: &str, up: bool, before: impl FnOnce(&ApiServer), extra: &[&str]) -> Cluster {
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
    pub fn wait_backends(&mut self, n: usize) -> Duration {
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

    pub fn backends_of(&self) -> Vec<String> {
        lb_userspace::list::services(&crate::pins(&self.agent.pins))
            .unwrap_or_default()
            .into_iter()
            .find(|r| r.frontend == FRONTEND)
            .map(|r| r.backends)
            .unwrap_or_default()
    }

    /// The list requests (not watches) for `path` so far.
    pub fn lists(&self, path: &str) -> Vec<Served> {
        self.api
            .served()
            .into_iter()
            .filter(|s| s.is_for(path) && !s.is_watch())
            .collect()
    }

    /// Waits until `what` holds (a condition on the API server), or panics with its log.
    pub fn wait_server(&self, what: &str, timeout: Duration, pred: impl Fn(&ApiServer) -> bool) {
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
    pub fn wait_watches_current(&self) {
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

    pub fn request(&self) -> Result<String, String> {
        self.topo
            .client
            .ns
            .run(|| tcp_request(sock(WEB, 80), Duration::from_secs(2)).map(|a| a.backend))
            .expect("client thread")
    }
}

/// Requests to `web` from the client pod, one after another, until stopped.
pub struct Load {
    pub stop: Arc<AtomicBool>,
    pub thread: std::thread::JoinHandle<Result<(usize, Vec<String>), String>>,
}

/// What a [`Load`] saw: how many requests, and the failures.
pub struct Outcome(pub usize, Vec<String>);

impl Load {
    pub fn start(c: &Cluster) -> Self {
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

    pub fn stop(self) -> Outcome {
        self.stop.store(true, Ordering::Relaxed);
        let (n, failures) = self.thread.join().expect("join").expect("client");
        Outcome(n, failures)
    }
}

impl Outcome {
    pub fn expect_no_failures(&self, during: &str) {
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

/// A synced agent with traffic flowing to web (three backends).
pub fn serving(prefix: &str, b: &[Ipv4Addr]) -> (Cluster, Load) {
    let mut c = start(prefix, false, &[]);
    c.api.apply_yaml(&service("web", WEB, "")).expect("svc");
    c.api.apply_yaml(&slice("web", &ready(b))).expect("slice");
    c.wait_backends(3);
    let load = Load::start(&c);
    (c, load)
}
