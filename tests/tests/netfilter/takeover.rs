//! `xlb agent --takeover-from kube-proxy` (issue [migrate]): a node whose services run on
//! kube-proxy's rules of its iptables or nftables mode for both families (as `xlb emit`
//! writes them, applied by `iptables-restore`/`ip6tables-restore` or `nft -f`), with 20
//! long-lived TCP connections and 10 connected UDP flows over IPv4 and IPv6: from a pod to
//! ClusterIPs and to a NodePort (which kube-proxy masquerades), from the node itself to
//! ClusterIPs (kube-proxy's OUTPUT rules), from an external client to a NodePort
//! (masqueraded too). The agent starts with the takeover: afterwards every flow is
//! unbroken and still answered by the backend it had, kube-proxy's rules are gone, and new
//! connections go through xlb (nothing else is left to translate them).

use std::time::Duration;

use lb_userspace::emit::Mode;
use xlb_lab::{compare::Impl, netns::run};
use xlb_tests::{agent::Agent, client::tcp_request, require_root, unique_tag};

use crate::migration::{
    FAMILIES, Flows, MigrationLab, Outcome, TIMEOUT, Targets, affinity, assert_unbroken, dns,
    local_node_port, node_port, web,
};

/// Per family: the pod's connections to the ClusterIPs (one with ClientIP affinity) and to
/// the NodePort and its UDP flows; the node's connections and UDP flows to the ClusterIPs;
/// the external client's connections and UDP flows to the NodePorts (one with
/// `externalTrafficPolicy: Local`).
fn flows(m: &MigrationLab) -> Flows {
    let [pod, node, ext] = m.namespaces();
    let pod_targets = Targets::default()
        .tcp(4, web)
        .tcp(2, |f| node_port(f, true))
        .udp(3, dns);
    let node_targets = Targets::default().tcp(2, web).udp(1, dns);
    let sticky_targets = Targets::default().tcp(2, affinity);
    let ext_targets = Targets::default()
        .tcp(2, |f| node_port(f, true))
        .tcp(1, local_node_port)
        .udp(1, |f| node_port(f, false));
    let sets = [&pod_targets, &node_targets, &sticky_targets, &ext_targets];
    let tcp: usize = sets.iter().map(|t| t.tcp.len()).sum();
    let udp: usize = sets.iter().map(|t| t.udp.len()).sum();
    assert!(
        tcp >= 20 && udp >= 10,
        "at least the issue's 20 TCP streams and 10 UDP flows"
    );
    Flows::open(vec![
        ("the node", node, node_targets),
        ("the pod", pod, pod_targets),
        (STICKY, pod, sticky_targets),
        ("the external client", ext, ext_targets),
    ])
}

/// The pod's connections to the ClientIP-affinity Service (two per family, IPv4 first).
const STICKY: &str = "the pod, to the affinity Service";

/// The backend kube-proxy's affinity gave the pod's connections of `family`'s index in
/// the affinity set (`results`), both connections alike.
fn sticky_backend(results: &[(&'static str, Outcome)], family: usize) -> String {
    let Some((_, Ok((Ok((tcp, _)), _)))) = results.iter().find(|(name, _)| *name == STICKY) else {
        panic!("the affinity set answered");
    };
    let pair = &tcp[2 * family..2 * family + 2];
    assert_eq!(pair[0], pair[1], "kube-proxy's affinity kept one backend");
    pair[0].clone()
}

#[test]
fn kube_proxys_iptables_connections_go_on_through_xlb_after_a_takeover() {
    takeover(Mode::Iptables, false);
}

#[test]
fn kube_proxys_nftables_connections_go_on_through_xlb_after_a_takeover() {
    takeover(Mode::Nftables, false);
}

#[test]
fn a_takeover_from_iptables_killed_midway_completes_when_the_agent_starts_again() {
    takeover(Mode::Iptables, true);
}

#[test]
fn a_takeover_from_nftables_killed_midway_completes_when_the_agent_starts_again() {
    takeover(Mode::Nftables, true);
}

/// kube-proxy's rules are still there: (iptables-save, nft list tables) of `node`.
fn kube_proxy_rules(node: &xlb_lab::netns::Netns) -> String {
    let save = run(&mut node.command("iptables-save")).expect("iptables-save");
    let save6 = run(&mut node.command("ip6tables-save")).expect("ip6tables-save");
    let tables = run(node.command("nft").args(["list", "tables"])).expect("nft");
    [save.stdout, save6.stdout, tables.stdout]
        .iter()
        .map(|o| String::from_utf8_lossy(o).into_owned())
        .collect()
}

fn has_kube_proxy(rules: &str) -> bool {
    rules.contains("KUBE-SVC-") || rules.contains("KUBE-SERVICES") || rules.contains("kube-proxy")
}

/// Freezes the agent (SIGSTOP) as soon as its log says its programs attached mid-takeover,
/// checks that kube-proxy's rules are still there (the kill lands in the middle), then
/// SIGKILLs it.
fn kill_mid_takeover(agent: &Agent, node: &xlb_lab::netns::Netns) {
    let pid = agent.pid().expect("agent") as i32;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !agent
        .log_text()
        .contains("takeover: kube-proxy's flows adopted, xlb attached")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the takeover never attached:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_micros(500));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let rules = kube_proxy_rules(node);
    // SAFETY: as above; a stopped process dies of SIGKILL.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(
        has_kube_proxy(&rules),
        "killed in the middle: kube-proxy's rules not yet removed\n{}",
        agent.log_text()
    );
}

/// kube-proxy in `mode` serves the flows; xlb takes over (with `kill`, the first agent is
/// killed in the middle and a second one completes it).
fn takeover(mode: Mode, kill: bool) {
    if !require_root() {
        return;
    }
    let tag = unique_tag("xto");
    let m = MigrationLab::build(&tag, Some(Impl::KubeProxy(mode)));
    let lab = &m.lab;
    let flows = flows(&m);

    let pins = std::path::PathBuf::from(format!("/sys/fs/bpf/{tag}"));
    let log = std::env::temp_dir().join(format!("{tag}-agent.log"));
    let log_path = log.clone();
    let mut agent = Agent::start_with(
        &lab.topo.node,
        &m.agent_args(&["--takeover-from", "kube-proxy"]),
        pins,
        log,
    )
    .expect("agent");
    if kill {
        kill_mid_takeover(&agent, &lab.topo.node);
        let first = agent.log_text();
        agent
            .restart(std::env::temp_dir().join(format!("{tag}-agent2.log")))
            .unwrap_or_else(|e| panic!("the second agent: {e}\nthe first one's log:\n{first}"));
    }
    let took = agent.wait_log("took over from kube-proxy", 1, Duration::from_secs(20));
    let text = agent.log_text();
    took.unwrap_or_else(|e| panic!("{e}\n{text}"));
    let context = || {
        let ct = run(lab.topo.node.command("conntrack").arg("-L"))
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let counters = run(lab
            .topo
            .node
            .command(xlb_tests::xlb_bin())
            .args(["list", "counters", "--bpffs"])
            .arg(&agent.pins))
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
        let ruleset = run(lab.topo.node.command("nft").args(["list", "ruleset"]))
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        format!(
            "{}\nthe kernel's conntrack:\n{ct}\nxlb's counters:\n{counters}\nthe node's ruleset:\n{ruleset}",
            agent.log_text()
        )
    };
    let results = flows.finish();
    assert_unbroken(&results, &context);

    let rules = kube_proxy_rules(&lab.topo.node);
    assert!(
        !has_kube_proxy(&rules),
        "kube-proxy's rules are gone:\n{rules}"
    );
    assert!(
        rules.contains("table inet xlb-keep-nat"),
        "the kernel's NAT hooks are kept for the node's connections:\n{rules}"
    );
    for (i, family) in FAMILIES.into_iter().enumerate() {
        let fresh = lab
            .topo
            .client
            .ns
            .run(move || tcp_request(web(family), TIMEOUT))
            .expect("client");
        fresh.unwrap_or_else(|e| panic!("a new connection from the pod goes through xlb: {e}"));
        let sticky = lab
            .topo
            .client
            .ns
            .run(move || tcp_request(affinity(family), TIMEOUT))
            .expect("client")
            .unwrap_or_else(|e| panic!("a new connection to the affinity Service: {e}"));
        assert_eq!(
            sticky.backend,
            sticky_backend(&results, i),
            "the pod's next connection keeps the backend kube-proxy's affinity chose"
        );
        let fresh = m
            .ext
            .ns
            .run(move || tcp_request(node_port(family, true), TIMEOUT))
            .expect("external client");
        fresh.unwrap_or_else(|e| {
            panic!(
                "a new connection from outside goes through xlb: {e}\n{}",
                context()
            )
        });
    }
    let _ = std::fs::remove_file(&log_path);
}
