//! `xlb trace`: its verdicts are the datapath's real ones (the same packets sent for real
//! from the lab's client pod), in both families from one table of steps (`live.rs`), it
//! leaves the live flow and affinity maps byte-identical, and each kube-proxy mode's rule
//! trace agrees with what `xlb compare` saw that mode do with real traffic on the
//! conformance inputs.

use std::{net::SocketAddr, path::Path, time::Duration};

use lb_userspace::emit::Mode;
use xlb_lab::compare::{CompareOptions, Flow, Impl, Origin, Outcome, compare};
use xlb_tests::{
    client,
    scenario::{Scenario, TCP_PORT},
    topology::pod_ip,
    trace_support::outcome,
};

mod live;

/// `xlb trace --mode MODE` of one of `xlb compare`'s flows on `source` (no datapath: the rule
/// modes need only the file).
fn trace_flow(source: &Path, mode: &str, flow: &Flow, client: &str) -> String {
    let from = match flow.origin {
        Origin::Pod => client,
        Origin::Node => "node",
    };
    let out = std::process::Command::new(xlb_tests::xlb_bin())
        .args(["trace", "--mode", mode, "--from", from, "--to"])
        .arg(flow.frontend.to_string())
        .args(["--proto", flow.protocol.lower(), "--source"])
        .arg(format!("file:{}", source.display()))
        .output()
        .expect("run xlb trace");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "xlb trace --mode {mode} {flow:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The backends a trace outcome names (`A`, or `one of A, B`); empty for a verdict.
fn traced_backends(outcome: &str) -> std::collections::BTreeSet<String> {
    let list = outcome.strip_prefix("one of ").unwrap_or(outcome);
    list.split(", ")
        .filter(|b| b.parse::<SocketAddr>().is_ok())
        .map(String::from)
        .collect()
}

/// A trace outcome and what a mode did with real traffic agree: the same backends (for an
/// affinity flow, the one it stuck to is among those traced), or the same refusal or drop.
fn agrees(flow: &Flow, traced: &str, real: &Outcome) -> bool {
    match real {
        Outcome::Backends(b) => {
            let t = traced_backends(traced);
            if flow.eligible.is_some() {
                b.len() == 1 && b.is_subset(&t)
            } else {
                *b == t
            }
        }
        Outcome::Refused => traced == "refused",
        Outcome::Dropped => traced == "dropped",
        Outcome::Failed(_) => false,
    }
}

/// Where the rule trace and the real mode are known to part (see tests/tests/compare.rs):
/// the node's own datagram to a ClusterIP without endpoints is REJECTed in the output path,
/// which fails the sender's send() with EPERM instead of an ICMP answer; the userspace proxy
/// takes a connection to a service without endpoints and closes it; IPVS (compared with
/// what iptables really did) has one virtual server per NodePort for every origin, so under
/// externalTrafficPolicy Local without a local endpoint it refuses a pod that iptables
/// short-circuits to the cluster's endpoints.
fn known_difference(mode: &str, flow: &Flow, traced: &str, real: &Outcome) -> bool {
    match (mode, real) {
        ("ipvs", Outcome::Backends(_)) => {
            flow.kind == xlb_lab::compare::Frontend::NodePort && traced == "refused"
        }
        ("iptables" | "nftables", Outcome::Failed(e)) => {
            flow.origin == Origin::Node
                && traced == "refused"
                && e.contains("Operation not permitted")
        }
        ("userspace", _) => {
            traced == "closed by the proxy" && !matches!(real, Outcome::Backends(_))
        }
        _ => false,
    }
}

fn modes_agree_with_compare(case: &str) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
        "../../shared/conformance/kube-proxy/cases/{case}.input.yaml"
    ));
    let opts = CompareOptions {
        source: source.clone(),
        node_name: "node1".into(),
        requests: 40,
        modes: vec![
            Impl::KubeProxy(Mode::Iptables),
            Impl::KubeProxy(Mode::Nftables),
            Impl::KubeProxy(Mode::Userspace),
        ],
        xlb: xlb_tests::xlb_bin(),
        tag: xlb_tests::unique_tag("xtq"),
    };
    let report = compare(&opts).unwrap_or_else(|e| panic!("{case}: {e}"));
    assert!(!report.flows.is_empty(), "{case}: no flows");
    // The lab's client pod: the first 10.255.255.x that is no endpoint (as compare picks it).
    let client = "10.255.255.1";
    let mut checked = 0;
    for (flow, by) in &report.flows {
        // IPVS has no lab in compare: its trace must agree with what iptables really did.
        for (mode, real) in [
            ("iptables", &by[&Impl::KubeProxy(Mode::Iptables)]),
            ("nftables", &by[&Impl::KubeProxy(Mode::Nftables)]),
            ("userspace", &by[&Impl::KubeProxy(Mode::Userspace)]),
            ("ipvs", &by[&Impl::KubeProxy(Mode::Iptables)]),
        ] {
            let text = trace_flow(&source, mode, flow, client);
            let traced = outcome(&text);
            assert!(
                agrees(flow, &traced, real) || known_difference(mode, flow, &traced, real),
                "{case}: {flow:?}: {mode} traced {traced:?}, really {real:?}\n{text}\n{}",
                report.render()
            );
            checked += 1;
        }
    }
    assert!(checked >= 4, "{case}: {checked} traces");
}

#[test]
fn rule_traces_agree_with_compare_on_kube_proxys_overall_case() {
    if !xlb_tests::require_root() {
        return;
    }
    modes_agree_with_compare("iptables-01-overall");
}

#[test]
fn rule_traces_agree_with_compare_on_a_service_without_endpoints() {
    if !xlb_tests::require_root() {
        return;
    }
    modes_agree_with_compare("iptables-30-flows-no-endpoints-reject");
}

#[test]
fn bpf_log_debug_puts_the_programs_decisions_in_the_agent_log() {
    if !xlb_tests::require_root() {
        return;
    }
    let mut s = Scenario::start_with("xtl", 2, &live::services4(), &["--bpf-log", "debug"])
        .expect("scenario");
    s.wait_backends("10.96.0.10:80/TCP", 2, Duration::from_secs(30))
        .expect("initial sync");
    let to = SocketAddr::new(live::V4.web, 80);
    let real = s
        .topo
        .client
        .ns
        .run(move || client::tcp_request(to, Duration::from_secs(3)))
        .expect("netns")
        .expect("web answers");
    let backend = s
        .topo
        .backends
        .iter()
        .find(|p| p.name == real.backend)
        .map(|p| p.ip)
        .expect("the backend that answered");
    // The SYN's decision, as it left the program: DNATed to the backend that answered.
    let want = format!("tc reason=new_flow action=ok proto=6 {}:", pod_ip(1));
    s.agent
        .wait_log(&want, 1, Duration::from_secs(5))
        .expect("the SYN's decision is logged");
    let log = s.agent.log_text();
    let line = log
        .lines()
        .find(|l| l.contains(&want))
        .expect("a new_flow line");
    assert!(line.contains("xlb::bpf"), "{line}");
    assert!(line.contains(&format!("-> {backend}:{TCP_PORT}")), "{line}");
    // Later packets' lines reach the log a moment after the SYN's (the reader drains the
    // programs' ring in batches).
    s.agent
        .wait_log("reason=established", 1, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("later packets too: {e}\n{}", s.agent.log_text()));
}

#[test]
fn bpf_log_is_off_by_default() {
    let Some(s) = Scenario::started("xto", &live::services4(), 2, "10.96.0.10:80/TCP") else {
        return;
    };
    let to = SocketAddr::new(live::V4.web, 80);
    s.topo
        .client
        .ns
        .run(move || client::tcp_request(to, Duration::from_secs(3)))
        .expect("netns")
        .expect("web answers");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !s.agent.log_text().contains("xlb::bpf"),
        "{}",
        s.agent.log_text()
    );
}
