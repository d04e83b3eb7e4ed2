//! kube-proxy's rules as xlb emits them, applied with the real tools inside a test node
//! namespace (`iptables-restore`, `nft -f`), carrying real traffic from a client pod to the
//! backends: the emitters produce rules that work, not just text that matches.
//! (This kernel has no ip_vs, so ipvs output is checked by the conformance tests only.)

use std::{collections::BTreeSet, net::Ipv4Addr, time::Duration};

use lb_userspace::{
    emit::{self, Mode},
    model::node::NodeSettings,
    source::file,
};
use xlb_tests::{
    client::{tcp_request, udp_request},
    echo::EchoServer,
    netns::{Netns, Reap},
    require_root,
    scenario::{TCP_PORT, UDP_PORT, sock},
    services::service_yaml,
    topology::{Topology, pod_ip},
    unique_tag,
};

const WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const DNS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 53);

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
/// than one backend, which saw the client pod's own address (or, with `proxied`, the node's:
/// a userspace proxy opens its own connections).
fn check_traffic(topo: &Topology, what: &str) {
    check_traffic_seen(topo, what, false)
}

fn check_traffic_seen(topo: &Topology, what: &str, proxied: bool) {
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
        let from_client = a.seen_client.starts_with(&format!("{client_ip}:"));
        assert_eq!(
            from_client, !proxied,
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
    topo.node
        .feed("iptables-restore", &["--noflush"], &rules)
        .expect("iptables-restore");
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
    topo.node.feed("nft", &["-f", "-"], &rules).expect("nft -f");
    check_traffic(&topo, "nftables");
}

#[test]
fn userspace_rules_and_the_userspace_proxy_carry_traffic() {
    let Some((topo, _servers, rules)) = setup("xu", Mode::Userspace) else {
        return;
    };
    let dir = std::env::temp_dir().join(&topo.tag);
    std::fs::create_dir_all(&dir).expect("dir");
    let ips: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
    let yaml = service_yaml("web", WEB, 80, "TCP", TCP_PORT, &ips)
        + &service_yaml("dns", DNS, 53, "UDP", UDP_PORT, &ips);
    let path = dir.join("services.yaml");
    std::fs::write(&path, yaml).expect("yaml");
    let log = std::fs::File::create(dir.join("proxy.log")).expect("log");
    let _proxy = Reap(
        topo.node
            .command(xlb_tests::xlb_bin())
            .args(["proxy", "userspace", "--source"])
            .arg(format!("file:{}", path.display()))
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("xlb proxy userspace"),
    );
    topo.node
        .feed("iptables-restore", &["--noflush"], &rules)
        .expect("iptables-restore");
    run(
        &topo.node,
        "iptables",
        &[
            "-t",
            "nat",
            "-I",
            "PREROUTING",
            "-j",
            "KUBE-PORTALS-CONTAINER",
        ],
    )
    .expect("jump");
    // Wait until the proxy listens (it reads the file and binds its ports first).
    let ready = topo
        .client
        .ns
        .run(|| {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while std::time::Instant::now() < deadline {
                if tcp_request(sock(WEB, 80), Duration::from_millis(300)).is_ok()
                    && udp_request(sock(DNS, 53), Duration::from_millis(300)).is_ok()
                {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            false
        })
        .expect("client");
    let text = std::fs::read_to_string(dir.join("proxy.log")).unwrap_or_default();
    assert!(ready, "the userspace proxy never answered:\n{text}");
    check_traffic_seen(&topo, "userspace", true);
    let _ = std::fs::remove_dir_all(&dir);
}
