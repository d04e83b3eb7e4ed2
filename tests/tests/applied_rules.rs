//! kube-proxy's rules as xlb emits them, applied with the real tools inside a test node
//! namespace (`iptables-restore`, `nft -f`), carrying real traffic from a client pod to the
//! backends: the emitters produce rules that work, not just text that matches.
//! (This kernel has no ip_vs, so ipvs output is checked by the conformance tests only.)

use std::{
    collections::BTreeSet,
    io::Write,
    net::Ipv4Addr,
    process::{Command, Stdio},
    time::Duration,
};

use lb_userspace::{
    emit::{self, Mode},
    model::node::NodeSettings,
    source::file,
};
use xlb_tests::{
    client::{tcp_request, udp_request},
    echo::EchoServer,
    netns::Netns,
    require_root,
    scenario::{TCP_PORT, UDP_PORT, sock},
    services::service_yaml,
    topology::{Topology, pod_ip},
    unique_tag,
};

const WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const DNS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 53);

/// Pipes `input` into `program args…` run inside `ns`.
fn feed(ns: &Netns, program: &str, args: &[&str], input: &str) -> Result<(), String> {
    let mut child = ns
        .command(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{program}: {e}"))?;
    child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(input.as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

fn run(ns: &Netns, program: &str, args: &[&str]) -> Result<(), String> {
    xlb_tests::netns::run(ns.command(program).args(args)).map(|_| ())
}

/// Topology + backends, and the rules of `mode` for the two demo-like services.
fn setup(prefix: &str, mode: Mode) -> Option<(Topology, Vec<EchoServer>, String)> {
    if !require_root(prefix) {
        return None;
    }
    let topo = Topology::build(&unique_tag(prefix), 3).expect("topology");
    let servers = topo
        .backends
        .iter()
        .map(|p| EchoServer::start(&p.ns, &p.name, TCP_PORT, UDP_PORT).expect("server"))
        .collect();
    let ips: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
    let yaml = service_yaml("web", WEB, 80, "TCP", TCP_PORT, &ips)
        + &service_yaml("dns", DNS, 53, "UDP", UDP_PORT, &ips);
    let model = file::parse("rules.yaml", &yaml).expect("yaml").model;
    let node = NodeSettings {
        node_name: "node1".into(),
        ..NodeSettings::default()
    };
    Some((topo, servers, emit::render(mode, &model, &node)))
}

/// 60 TCP and 60 UDP requests from the client: all answered, from the ClusterIP, by more
/// than one backend, which saw the client pod's own address.
fn check_traffic(topo: &Topology, what: &str) {
    let client_ip = topo.client.ip;
    let answers = topo
        .client
        .ns
        .run(move || {
            let mut out = Vec::new();
            for _ in 0..60 {
                out.push(tcp_request(sock(WEB, 80), Duration::from_secs(2)));
                out.push(udp_request(sock(DNS, 53), Duration::from_secs(2)));
            }
            out
        })
        .expect("client");
    let mut backends = BTreeSet::new();
    for a in answers {
        let a = a.unwrap_or_else(|e| panic!("{what}: request failed: {e}"));
        assert!(
            a.peer == sock(WEB, 80) || a.peer == sock(DNS, 53),
            "{what}: peer {}",
            a.peer
        );
        assert!(
            a.seen_client.starts_with(&format!("{client_ip}:")),
            "{what}: backend saw {}",
            a.seen_client
        );
        backends.insert(a.backend);
    }
    assert!(backends.len() > 1, "{what}: only {backends:?} answered");
}

#[test]
fn emitted_iptables_rules_carry_traffic() {
    let Some((topo, _servers, rules)) = setup("xi", Mode::Iptables) else {
        return;
    };
    feed(&topo.node, "iptables-restore", &["--noflush"], &rules).expect("iptables-restore");
    // The jumps from the built-in chains kube-proxy installs once (not part of the restore).
    for (table, chain, target) in [
        ("nat", "PREROUTING", "KUBE-SERVICES"),
        ("nat", "OUTPUT", "KUBE-SERVICES"),
        ("nat", "POSTROUTING", "KUBE-POSTROUTING"),
        ("filter", "FORWARD", "KUBE-FORWARD"),
    ] {
        run(
            &topo.node,
            "iptables",
            &["-t", table, "-I", chain, "-j", target],
        )
        .expect("jump");
    }
    check_traffic(&topo, "iptables");
}

#[test]
fn emitted_nftables_rules_carry_traffic() {
    let Some((topo, _servers, rules)) = setup("xf", Mode::Nftables) else {
        return;
    };
    feed(&topo.node, "nft", &["-f", "-"], &rules).expect("nft -f");
    check_traffic(&topo, "nftables");
}
