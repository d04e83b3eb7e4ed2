//! `/metrics` as Prometheus scrapes it from the real agent, run in a network namespace of its
//! own: node-level series by default (kube-proxy's names, xlb's reason counters and map
//! fill, never a series per backend), per-service series only with `--metrics-per-service`
//! (bounded by its limit), `promtool check metrics` clean, and `/healthz` answered within
//! 100 ms while scrapes run back to back at thousands of services.

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use xlb_tests::{
    agent::Agent,
    http::{get_path, ok_body},
    netns::Netns,
    require_root,
    services::{service_yaml, write_atomic},
    unique_tag,
};

pub(super) const HEALTHZ: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 10256);
pub(super) const METRICS: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 10249);

/// The series of kube-proxy's that xlb serves, as sample names.
const KUBE_PROXY: [&str; 13] = [
    "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
    "kubeproxy_sync_proxy_rules_duration_seconds_count",
    "kubeproxy_sync_full_proxy_rules_duration_seconds_count",
    "kubeproxy_sync_partial_proxy_rules_duration_seconds_count",
    "kubeproxy_network_programming_duration_seconds_count",
    "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
    "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
    "kubeproxy_sync_proxy_rules_service_changes_total",
    "kubeproxy_sync_proxy_rules_endpoint_changes_total",
    "kubeproxy_sync_proxy_rules_service_changes_pending",
    "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
    "kubeproxy_conntrack_reconciler_sync_duration_seconds_count",
    "kubeproxy_proxy_healthz_total",
];

/// The agent in its namespace on `services` × `endpoints`. Field order is drop order: the
/// agent (and its pins) first.
pub(super) struct Lab {
    pub(super) agent: Agent,
    pub(super) ns: Netns,
    pub(super) workdir: PathBuf,
    services: usize,
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.workdir);
    }
}

/// `services` Services `test/s<i>` (port `p`), each with `endpoints` ready endpoints.
fn services_yaml(services: usize, endpoints: usize) -> String {
    let at = |base: u32, n: usize| Ipv4Addr::from(base + n as u32);
    (0..services)
        .map(|i| {
            let backends: Vec<Ipv4Addr> = (0..endpoints)
                .map(|k| at(0x0a80_0000, i * 16 + k))
                .collect();
            service_yaml(
                &format!("s{i}"),
                at(0x0a60_0000, i),
                80,
                "TCP",
                8080,
                &backends,
            )
        })
        .collect()
}

/// How [`Lab::start_in`] starts the agent, beyond its services.
#[derive(Default)]
pub(super) struct Start<'a> {
    /// A command the agent runs under (e.g. `unshare …`).
    pub(super) wrapper: &'a [&'a str],
    /// Flags added to the lab's own.
    pub(super) extra: &'a [&'a str],
    /// A `--config` file's text.
    pub(super) config: Option<&'a str>,
    /// Run in the lab's namespace before the agent starts.
    pub(super) before: Option<&'a dyn Fn(&Netns)>,
}

impl Lab {
    fn start(prefix: &str, services: usize, endpoints: usize, extra: &[&str]) -> Self {
        Self::start_in(
            prefix,
            services,
            endpoints,
            Start {
                extra,
                ..Default::default()
            },
        )
    }

    pub(super) fn start_in(prefix: &str, services: usize, endpoints: usize, s: Start<'_>) -> Self {
        let tag = unique_tag(prefix);
        let ns = Netns::new(&tag).expect("netns");
        let workdir = std::env::temp_dir().join(&tag);
        std::fs::create_dir_all(&workdir).expect("workdir");
        let yaml = workdir.join("services.yaml");
        write_atomic(&yaml, &services_yaml(services, endpoints)).expect("yaml");
        let mut args = Self::args(&yaml, s.extra);
        if let Some(text) = s.config {
            let config = workdir.join("config.yaml");
            write_atomic(&config, text).expect("config");
            args.extend(["--config".into(), config.display().to_string()]);
        }
        if let Some(before) = s.before {
            before(&ns);
        }
        let pins = PathBuf::from(format!("/sys/fs/bpf/{tag}"));
        let agent = Agent::start_wrapped(&ns, s.wrapper, &args, pins, workdir.join("a.log"))
            .inspect_err(|_| {
                let _ = std::fs::remove_dir_all(&workdir);
            })
            .expect("agent");
        let mut lab = Lab {
            agent,
            ns,
            workdir,
            services,
        };
        lab.wait_synced();
        lab
    }

    fn args(yaml: &std::path::Path, extra: &[&str]) -> Vec<String> {
        let mut args = vec![
            "--source".to_string(),
            format!("file:{}", yaml.display()),
            "--healthz-bind-address".into(),
            HEALTHZ.to_string(),
            "--metrics-bind-address".into(),
            METRICS.to_string(),
            "--socket-lb".into(),
            "off".into(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    }

    /// Restarts the agent on the same pins with `extra` flags.
    fn restart(&mut self, extra: &[&str]) {
        let yaml = self.workdir.join("services.yaml");
        let log = self.workdir.join(format!("{}.log", unique_tag("a")));
        self.agent
            .restart_with(&Self::args(&yaml, extra), log)
            .expect("restart");
        self.wait_synced();
    }

    /// Waits for the first sync of every service and for `/healthz` to answer 200.
    fn wait_synced(&mut self) {
        let want = format!("synced services={} ", self.services);
        self.agent
            .wait_log(&want, 1, Duration::from_secs(240))
            .expect("synced");
        let deadline = Instant::now() + Duration::from_secs(10);
        while self
            .get(HEALTHZ, "/healthz")
            .and_then(|r| ok_body(&r).map(|_| ()))
            .is_err()
        {
            assert!(Instant::now() < deadline, "/healthz never answered 200");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(super) fn get(&self, at: SocketAddr, path: &str) -> Result<String, String> {
        let path = path.to_string();
        self.ns
            .run(move || get_path(at, &path, Duration::from_secs(30)))?
    }

    pub(super) fn scrape(&self) -> String {
        let r = self.get(METRICS, "/metrics").expect("scrape");
        ok_body(&r).expect("a 200").to_string()
    }
}

/// The sample lines of an exposition (no comments).
fn samples(text: &str) -> Vec<&str> {
    text.lines().filter(|l| !l.starts_with('#')).collect()
}

/// The value of the sample `series` (name and labels as written).
pub(super) fn value(text: &str, series: &str) -> f64 {
    samples(text)
        .iter()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
}

/// No sample is per backend (a backend label, or xlb's old per-backend names; the reason
/// counters' `no_backend` and `backend_gone` are reasons).
fn assert_no_backend_series(text: &str) {
    let per_backend: Vec<&str> = samples(text)
        .into_iter()
        .filter(|l| l.contains("backend=") || l.starts_with("xlb_backend"))
        .collect();
    assert!(
        per_backend.is_empty(),
        "per-backend series: {per_backend:?}"
    );
}

#[test]
fn metrics_are_node_level_by_default_and_per_service_only_when_asked() {
    if !require_root() {
        return;
    }
    let mut lab = Lab::start("xmd", 3, 2, &[]);
    let text = lab.scrape();
    for name in KUBE_PROXY {
        assert!(
            samples(&text).iter().any(|l| l.starts_with(name)),
            "{name} missing:\n{text}"
        );
    }
    assert!(value(&text, "kubeproxy_sync_proxy_rules_duration_seconds_count") >= 1.0);
    assert!(value(&text, "kubeproxy_sync_proxy_rules_service_changes_total") >= 3.0);
    assert!(value(&text, "kubeproxy_sync_proxy_rules_last_timestamp_seconds") > 1e9);
    let map = |m: &str| format!("xlb_map_entries{{map=\"{m}\"}}");
    assert_eq!(value(&text, &map(lb_common::MAP_BACKEND)), 6.0);
    // Three frontend entries; their slots, a range of two each, in the slot array.
    assert_eq!(value(&text, &map(lb_common::MAP_SVC)), 3.0);
    assert_eq!(value(&text, &map(lb_common::MAP_SLOT)), 6.0);
    assert_eq!(
        value(&text, "xlb_datapath_packets_total{reason=\"new_flow\"}"),
        0.0
    );
    assert!(
        value(
            &text,
            "xlb_conntrack_entries_limit{ip_family=\"IPv4\",table=\"lru\"}"
        ) > 0.0
    );
    assert!(value(&text, "process_resident_memory_bytes") > 0.0);
    assert_no_backend_series(&text);
    assert!(
        !text.contains("xlb_service_"),
        "per-service series:\n{text}"
    );

    lab.restart(&["--metrics-per-service"]);
    let text = lab.scrape();
    for i in 0..3 {
        let s = format!("xlb_service_packets_total{{service=\"test/s{i}\",port=\"p\"}}");
        assert_eq!(value(&text, &s), 0.0);
    }
    assert_eq!(value(&text, "xlb_metrics_service_ports_omitted"), 0.0);
    assert_no_backend_series(&text);

    // The limit: the first two service ports in name order, the third counted as left out.
    lab.restart(&["--metrics-per-service=2"]);
    let text = lab.scrape();
    let services: Vec<&str> = samples(&text)
        .into_iter()
        .filter(|l| l.starts_with("xlb_service_packets_total"))
        .collect();
    assert_eq!(services.len(), 2, "{services:?}");
    assert!(!text.contains("service=\"test/s2\""), "{text}");
    assert_eq!(value(&text, "xlb_metrics_service_ports_omitted"), 1.0);
}

#[test]
fn promtool_finds_the_metrics_clean() {
    if !require_root() {
        return;
    }
    let Some(promtool) = xlb_tests::promtool() else {
        xlb_tests::skip(
            "no promtool: `cargo xtask setup` extracts it from Debian's prometheus package, which this machine's apt does not offer",
        );
        return;
    };
    let lab = Lab::start("xmp", 3, 2, &["--metrics-per-service"]);
    // A flow's worth of counters is not needed: the lint looks at names, types and format.
    let text = lab.scrape();
    let out = lab
        .ns
        .command(&promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write as _;
            c.stdin.take().expect("stdin").write_all(text.as_bytes())?;
            c.wait_with_output()
        })
        .expect("promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics: {}\n{said}\n{text}",
        out.status
    );
}

#[test]
fn health_is_answered_while_scrapes_run_at_thousands_of_services() {
    if !require_root() {
        return;
    }
    const SERVICES: usize = 3000;
    // Per-service series: the heaviest scrape the agent serves.
    let lab = Lab::start("xmh", SERVICES, 10, &["--metrics-per-service"]);
    let text = lab.scrape();
    let per_service = samples(&text)
        .iter()
        .filter(|l| l.starts_with("xlb_service_"))
        .count();
    assert_eq!(per_service, 2 * SERVICES);
    // Everything else is node-level: a few hundred samples, whatever the services.
    let node_level = samples(&text).len() - per_service;
    assert!(node_level < 400, "{node_level} node-level samples");
    assert_no_backend_series(&text);

    // Four scrapes back to back on one thread, /healthz probed on another meanwhile.
    let scraping = Arc::new(AtomicBool::new(true));
    let flag = scraping.clone();
    let scraper = lab.ns.spawn(move || {
        let mut took = Vec::new();
        for _ in 0..4 {
            let started = Instant::now();
            let r = get_path(METRICS, "/metrics", Duration::from_secs(30));
            took.push((started.elapsed(), r.map(|r| r.len())));
        }
        flag.store(false, Ordering::Relaxed);
        took
    });
    let flag = scraping.clone();
    let probes = lab
        .ns
        .run(move || {
            let mut probes = Vec::new();
            while flag.load(Ordering::Relaxed) || probes.len() < 20 {
                let started = Instant::now();
                let r = get_path(HEALTHZ, "/healthz", Duration::from_secs(2));
                probes.push((started.elapsed(), r.and_then(|r| ok_body(&r).map(|_| ()))));
                std::thread::sleep(Duration::from_millis(5));
            }
            probes
        })
        .expect("probes");
    let scrapes = scraper.join().expect("scraper").expect("netns");
    eprintln!(
        "scrapes: {:?}",
        scrapes
            .iter()
            .map(|(d, n)| (d, n.as_ref().ok()))
            .collect::<Vec<_>>()
    );
    for (took, r) in &scrapes {
        assert!(r.is_ok(), "a scrape failed after {took:?}: {r:?}");
    }
    let slowest = probes.iter().map(|(d, _)| *d).max().unwrap_or_default();
    eprintln!("/healthz: {} probes, slowest {slowest:?}", probes.len());
    for (took, r) in &probes {
        assert!(r.is_ok(), "/healthz failed during the scrapes: {r:?}");
        assert!(
            *took < Duration::from_millis(100),
            "/healthz took {took:?} during the scrapes"
        );
    }
}
