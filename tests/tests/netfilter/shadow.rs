//! `xlb agent --shadow` (issue [migrate]) beside kube-proxy's live rules of its iptables and
//! nftables modes, both families (as `xlb emit` writes them, applied by the real
//! `iptables-restore`/`ip6tables-restore` or `nft -f` in a node namespace), for a ClusterIP
//! TCP and a UDP Service, a NodePort, one with externalTrafficPolicy Local, one with
//! ClientIP affinity, one with no endpoints and an IPv6 one.
//!
//! Identical state: no divergence within three looks past the grace period, and nothing
//! changed (the namespace's rules the same before and after, no program loaded by the agent,
//! no pin directory). Then one endpoint's rule is emptied in kube-proxy's live rules only:
//! the Service is reported, with its reason, once the grace period has passed, in the report
//! file, `xlb shadow report` and `/metrics`.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use lb_userspace::{emit::Mode, shadow::report::Report};
use xlb_lab::netns::{Netns, run};
use xlb_tests::{agent::Agent, require_root, services::source_file, unique_tag, xlb_bin};

const NODE_IP: &str = "192.0.2.10";
const NODE_IP6: &str = "2001:db8::10";
/// Seconds between looks, and the grace period.
const INTERVAL: &str = "0.5";
const GRACE: Duration = Duration::from_secs(2);
/// The backend whose rule the test empties (test/web's first endpoint).
const CUT: &str = "10.1.0.2:8080";

fn slice(name: &str, family: &str, port: u16, proto: &str, eps: &[(&str, &str)]) -> String {
    let mut y = format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{namespace: test, name: {name}-1, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: {family}\nports: [{{name: p, port: {port}, protocol: {proto}}}]\nendpoints:"
    );
    if eps.is_empty() {
        y.push_str(" []\n");
    }
    for (ip, node) in eps {
        y.push_str(&format!(
            "\n- {{addresses: [\"{ip}\"], nodeName: {node}, conditions: {{ready: true}}}}"
        ));
    }
    y.push('\n');
    y
}

fn service(name: &str, spec: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: test, name: {name}}}\nspec:\n{spec}"
    )
}

/// The Services and their slices.
fn services_yaml() -> String {
    let three = [
        ("10.1.0.2", "node1"),
        ("10.1.0.3", "node2"),
        ("10.1.0.4", "node2"),
    ];
    let mut y = String::new();
    y += &service(
        "web",
        "  clusterIP: 10.96.0.10\n  ports: [{name: p, port: 80, protocol: TCP, targetPort: 8080}]\n",
    );
    y += &slice("web", "IPv4", 8080, "TCP", &three);
    y += &service(
        "dns",
        "  clusterIP: 10.96.0.53\n  ports: [{name: p, port: 53, protocol: UDP, targetPort: 5353}]\n",
    );
    y += &slice("dns", "IPv4", 5353, "UDP", &three);
    y += &service(
        "np",
        "  type: NodePort\n  clusterIP: 10.96.0.20\n  ports: [{name: p, port: 80, protocol: TCP, targetPort: 8081, nodePort: 30080}]\n",
    );
    y += &slice("np", "IPv4", 8081, "TCP", &three);
    y += &service(
        "local",
        "  type: NodePort\n  externalTrafficPolicy: Local\n  clusterIP: 10.96.0.21\n  ports: [{name: p, port: 80, protocol: TCP, targetPort: 8082, nodePort: 30081}]\n",
    );
    y += &slice(
        "local",
        "IPv4",
        8082,
        "TCP",
        &[("10.1.0.5", "node1"), ("10.1.0.6", "node2")],
    );
    y += &service(
        "sticky",
        "  clusterIP: 10.96.0.30\n  sessionAffinity: ClientIP\n  ports: [{name: p, port: 80, protocol: TCP, targetPort: 8083}]\n",
    );
    y += &slice("sticky", "IPv4", 8083, "TCP", &three[..2]);
    y += &service(
        "empty",
        "  clusterIP: 10.96.0.40\n  ports: [{name: p, port: 80, protocol: TCP, targetPort: 8085}]\n",
    );
    y += &slice("empty", "IPv4", 8085, "TCP", &[]);
    y += &service(
        "web6",
        "  ipFamilies: [IPv6]\n  clusterIP: fd00:96::10\n  ports: [{name: p, port: 80, protocol: TCP, targetPort: 8084}]\n",
    );
    y += &slice(
        "web6",
        "IPv6",
        8084,
        "TCP",
        &[("fd00:1::2", "node1"), ("fd00:1::3", "node2")],
    );
    y
}

/// `xlb emit MODE` for one family of the services file at `path`.
fn emit(path: &Path, mode: Mode, family: &str) -> String {
    let out = run(Command::new(xlb_bin()).args([
        "emit",
        mode.name(),
        "--source",
        &format!("file:{}", path.display()),
        "--ip-family",
        family,
        "--node-name",
        "node1",
        "--node-ip",
        &format!("{NODE_IP},{NODE_IP6}"),
        "--local-address",
        &format!("{NODE_IP},{NODE_IP6}"),
    ]))
    .expect("xlb emit");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// kube-proxy's rules of `mode`, both families, applied in `node`.
fn apply_kube_proxy(node: &Netns, path: &Path, mode: Mode) {
    for (family, restore) in [("ipv4", "iptables-restore"), ("ipv6", "ip6tables-restore")] {
        let rules = emit(path, mode, family);
        match mode {
            Mode::Iptables => node.feed(restore, &["--noflush"], &rules),
            _ => node.feed("nft", &["-f", "-"], &rules),
        }
        .unwrap_or_else(|e| panic!("kube-proxy's {} {family} rules: {e}", mode.name()));
    }
}

/// Everything the namespace's netfilter holds, both families and nftables.
fn netfilter_state(node: &Netns) -> String {
    let mut s = String::new();
    for tool in ["iptables-save", "ip6tables-save"] {
        let out = run(&mut node.command(tool)).expect(tool);
        s += &String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
    }
    let out = run(node.command("nft").args(["list", "ruleset"])).expect("nft list ruleset");
    s + &String::from_utf8_lossy(&out.stdout)
}

/// Empties the chain that DNATs to `backend` in kube-proxy's live rules (its endpoint chain).
fn cut_endpoint(node: &Netns, mode: Mode, backend: &str) {
    match mode {
        Mode::Iptables => {
            let out = run(node.command("iptables-save").args(["-t", "nat"])).expect("save");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let chain = text
                .lines()
                .find(|l| l.contains(&format!("--to-destination {backend}")))
                .and_then(|l| l.split_whitespace().nth(1))
                .expect("the endpoint's chain");
            run(node.command("iptables").args(["-t", "nat", "-F", chain])).expect("flush");
        }
        _ => {
            let out = run(node
                .command("nft")
                .args(["-j", "list", "table", "ip", "kube-proxy"]))
            .expect("nft -j list");
            let table = lb_userspace::emit::nft_json::parse(&String::from_utf8_lossy(&out.stdout))
                .expect("kube-proxy's table");
            let chain = table
                .chains
                .iter()
                .find(|(_, c)| {
                    c.rules
                        .iter()
                        .any(|r| r.contains(&format!("dnat to {backend}")))
                })
                .map(|(name, _)| name.clone())
                .expect("the endpoint's chain");
            run(node
                .command("nft")
                .args(["flush", "chain", "ip", "kube-proxy", &chain]))
            .expect("flush");
        }
    }
}

fn read_report(path: &Path) -> Option<Report> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// Waits until the report satisfies `ok`; the last report seen otherwise.
fn wait_report(
    path: &Path,
    timeout: Duration,
    ok: impl Fn(&Report) -> bool,
) -> Result<Report, String> {
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < timeout {
        if let Some(r) = read_report(path) {
            if ok(&r) {
                return Ok(r);
            }
            last = Some(r);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!(
        "not within {timeout:?}; last report:\n{}",
        last.map_or("none".into(), |r| r.render())
    ))
}

/// The BPF programs the process `pid` holds (`bpftool prog show` names their owners).
fn programs_of(pid: u32) -> usize {
    let out = Command::new("bpftool").args(["prog", "show"]).output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    text.unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&format!("({pid})")))
        .count()
}

#[test]
fn shadow_agrees_with_kube_proxys_iptables_rules_and_reports_a_cut_endpoint() {
    shadow(Mode::Iptables);
}

#[test]
fn shadow_agrees_with_kube_proxys_nftables_rules_and_reports_a_cut_endpoint() {
    shadow(Mode::Nftables);
}

fn shadow(mode: Mode) {
    if !require_root() {
        return;
    }
    let tag = unique_tag("xsh");
    let path = source_file(&tag, &services_yaml());
    let dir: PathBuf = path.parent().map(PathBuf::from).expect("dir");
    let node = Netns::new(&format!("{tag}-node")).expect("node namespace");
    node.ip(&["addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"])
        .expect("node IP");
    node.ip(&["addr", "add", &format!("{NODE_IP6}/128"), "dev", "lo"])
        .expect("node IPv6");
    apply_kube_proxy(&node, &path, mode);
    let before = netfilter_state(&node);
    let report = dir.join("shadow.json");
    let pins = dir.join("pins");
    let args: Vec<String> = [
        "--source",
        &format!("file:{}", path.display()),
        "--hostname-override",
        "node1",
        "--nodeport-addresses",
        &format!("{NODE_IP},{NODE_IP6}"),
        "--healthz-bind-address",
        "",
        "--metrics-bind-address",
        "127.0.0.1:10249",
        "--shadow",
        "--shadow-interval",
        INTERVAL,
        "--shadow-grace",
        &GRACE.as_secs_f64().to_string(),
        "--shadow-report",
        &report.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut agent =
        Agent::start_with(&node, &args, pins.clone(), dir.join("agent.log")).expect("agent");

    // Identical state: three looks past the grace period, and no divergence.
    let settled = wait_report(&report, Duration::from_secs(60), |r| {
        r.looks >= 3 && r.looks as f64 * 0.5 > GRACE.as_secs_f64() + 1.5
    });
    let settled = settled.unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()));
    assert_eq!(
        settled.proxiers.len(),
        2,
        "kube-proxy's state of both families found:\n{}",
        settled.render()
    );
    assert!(
        settled.proxiers.iter().all(|p| p.contains(mode.name())),
        "{}",
        settled.render()
    );
    // web, dns, np (ClusterIP, NodePort on two addresses... of its family), local, sticky,
    // empty, web6: every frontend-origin pair compared.
    assert!(settled.compared >= 9, "{}", settled.render());
    assert!(
        settled.divergences.is_empty() && settled.pending == 0,
        "identical state, no divergence:\n{}",
        settled.render()
    );
    assert!(settled.errors.is_empty(), "{}", settled.render());
    assert!(settled.not_understood.is_empty(), "{}", settled.render());
    let pid = agent.pid().expect("the agent's pid");
    assert_eq!(programs_of(pid), 0, "shadow mode loads no BPF program");
    assert!(!pins.exists(), "shadow mode pins nothing");
    assert_eq!(
        netfilter_state(&node),
        before,
        "shadow mode changes no rule"
    );

    // One endpoint's rule emptied in kube-proxy's live rules only.
    cut_endpoint(&node, mode, CUT);
    let cut_at = Instant::now();
    let reported = wait_report(&report, Duration::from_secs(30), |r| {
        !r.divergences.is_empty()
    })
    .unwrap_or_else(|e| panic!("the cut endpoint is never reported: {e}"));
    assert!(
        cut_at.elapsed() >= GRACE,
        "reported within the grace period ({:?}):\n{}",
        cut_at.elapsed(),
        reported.render()
    );
    assert_eq!(reported.divergent_services, 1, "{}", reported.render());
    let d = &reported.divergences[0].divergence;
    assert_eq!(d.service, "test/web", "{}", reported.render());
    assert_eq!(d.reason.name(), "backends-differ", "{}", reported.render());
    let cut: SocketAddr = CUT.parse().expect("addr");
    match (&d.xlb, &d.kube_proxy) {
        (
            lb_userspace::shadow::compare::Outcome::Backends(x),
            lb_userspace::shadow::compare::Outcome::Backends(k),
        ) => {
            assert!(
                x.contains(&cut) && !k.contains(&cut),
                "{}",
                reported.render()
            );
            assert_eq!(x.len(), k.len() + 1, "{}", reported.render());
        }
        other => panic!("backends on both sides: {other:?}"),
    }
    assert!(
        agent
            .log_text()
            .contains("shadow: kube-proxy and xlb disagree"),
        "the divergence is logged"
    );

    // `xlb shadow report` and /metrics say the same.
    let printed = run(Command::new(xlb_bin()).args([
        "shadow",
        "report",
        "--file",
        &report.display().to_string(),
    ]))
    .expect("xlb shadow report");
    let printed = String::from_utf8_lossy(&printed.stdout).into_owned();
    assert!(
        printed.contains("divergent services: 1") && printed.contains("test/web:p"),
        "{printed}"
    );
    let check = Command::new(xlb_bin())
        .args(["shadow", "report", "--check", "--file"])
        .arg(&report)
        .output()
        .expect("xlb shadow report --check");
    assert_eq!(
        check.status.code(),
        Some(3),
        "--check fails on a divergence"
    );
    let metrics = node
        .run(|| {
            let to = "127.0.0.1:10249".parse().expect("addr");
            xlb_tests::http::get_path(to, "/metrics", Duration::from_secs(5))
        })
        .expect("the namespace's thread")
        .expect("GET /metrics");
    assert!(
        metrics.contains("xlb_shadow_divergent_services 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("xlb_shadow_divergences_reported_total{reason=\"backends-differ\"} 1"),
        "{metrics}"
    );
    assert_eq!(programs_of(pid), 0, "shadow mode loads no BPF program");
    agent.stop();
    assert!(!pins.exists(), "shadow mode pins nothing");
}
