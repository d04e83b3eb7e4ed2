//! kube-proxy's rules as xlb emits them, applied with the real tools inside a test node
//! namespace (`iptables-restore`, `nft -f`; the userspace rules with `xlb proxy userspace`),
//! carrying real traffic from a client pod to the backends: the emitters produce rules that
//! work, not just text that matches. The lab and the installation are `compare::install`'s,
//! the same that `xlb compare` uses. Over IPv6 too: dual-stack services, kube-proxy's second
//! proxier's rules (`ip6tables-restore`, the `ip6 kube-proxy` table) carrying IPv6 traffic
//! between dual-stack pods. (This kernel has no ip_vs, so ipvs output is checked by the
//! conformance tests only.)

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use lb_userspace::{
    emit::Mode,
    model::{
        Protocol,
        node::{IpFamily, NodeSettings},
    },
    source::file,
};
use xlb_lab::{
    compare::{Impl, Installed, LabSpec, install},
    topology::Topology,
};
use xlb_tests::{
    capture::Capture,
    client::{tcp_request, udp_request},
    require_root,
    scenario::{TCP_PORT, UDP_PORT, sock},
    services::dual_stack_service_yaml,
    topology::{pod_ip, pod_ip6},
    unique_tag,
};

const WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const DNS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 53);
const WEB6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x10);
const DNS6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x53);

/// The two demo-like services' frontends of one family: web (TCP) and dns (UDP).
fn frontends(family: IpFamily) -> [SocketAddr; 2] {
    match family {
        IpFamily::V4 => [SocketAddr::from((WEB, 80)), SocketAddr::from((DNS, 53))],
        IpFamily::V6 => [SocketAddr::from((WEB6, 80)), SocketAddr::from((DNS6, 53))],
    }
}

/// A lab with three backend pods and `mode` installed for the two demo-like services; with
/// `dual`, the services and the pods are dual-stack (each family's endpoints in its slice).
fn setup(prefix: &str, mode: Impl, dual: bool) -> Option<Installed> {
    if !require_root() {
        return None;
    }
    let tag = unique_tag(prefix);
    let ips: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
    let ips6: Vec<Ipv6Addr> = if dual {
        (2..=4).map(pod_ip6).collect()
    } else {
        Vec::new()
    };
    let yaml = if dual {
        dual_stack_service_yaml("web", (WEB, WEB6), (80, "TCP", TCP_PORT), &ips, &ips6)
            + &dual_stack_service_yaml("dns", (DNS, DNS6), (53, "UDP", UDP_PORT), &ips, &ips6)
    } else {
        xlb_tests::services::service_yaml("web", WEB, 80, "TCP", TCP_PORT, &ips)
            + &xlb_tests::services::service_yaml("dns", DNS, 53, "UDP", UDP_PORT, &ips)
    };
    let path = xlb_tests::services::source_file(&tag, &yaml);
    let dir = path
        .parent()
        .map(std::path::PathBuf::from)
        .unwrap_or_default();
    let model = file::parse("rules.yaml", &yaml).expect("yaml").model;
    let node = NodeSettings {
        node_name: "node1".into(),
        ..NodeSettings::default()
    };
    let addrs = ips.iter().map(|ip| IpAddr::V4(*ip));
    let pods: BTreeMap<IpAddr, BTreeSet<(u16, Protocol)>> = addrs
        .chain(ips6.iter().map(|ip| IpAddr::V6(*ip)))
        .map(|ip| {
            (
                ip,
                [(TCP_PORT, Protocol::Tcp), (UDP_PORT, Protocol::Udp)].into(),
            )
        })
        .collect();
    let mut frontends = frontends(IpFamily::V4).to_vec();
    if dual {
        frontends.extend(self::frontends(IpFamily::V6));
    }
    let lab = install(&LabSpec {
        mode: Some(mode),
        tag: &tag,
        source: &path,
        xlb: &xlb_tests::xlb_bin(),
        model: &model,
        settings: &node,
        options: &lb_userspace::emit::WriterOptions::default(),
        pods: &pods,
        frontends: &frontends,
    })
    .expect("install");
    let _ = std::fs::remove_dir_all(&dir);
    Some(lab)
}

/// Waits until both services answer (a proxy binds its ports after reading the file).
fn wait_ready(topo: &Topology, what: &str) {
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
    assert!(ready, "{what}: the services never answered");
}

/// 60 TCP and 60 UDP requests from the client: all answered by more than one backend, which
/// saw the client pod's own address (or, with `proxied`, the node's: a userspace proxy opens
/// its own connections), and every reply reached the client pod from the ClusterIP (as a
/// capture on its interface shows).
fn check_traffic(topo: &Topology, what: &str) {
    check_traffic_seen(topo, what, false)
}

/// The 60 + 60 requests from the client pod to `web` and `dns` of one family.
fn requests(
    topo: &Topology,
    [web, dns]: [SocketAddr; 2],
) -> Vec<Result<xlb_tests::client::Answer, String>> {
    topo.client
        .ns
        .run(move || {
            let mut out = Vec::new();
            for _ in 0..60 {
                out.push(tcp_request(web, Duration::from_secs(2)));
                out.push(udp_request(dns, Duration::from_secs(2)));
            }
            out
        })
        .expect("client")
}

fn check_traffic_seen(topo: &Topology, what: &str, proxied: bool) {
    let client_ip = topo.client.ip;
    let capture = Capture::start(&topo.client.ns, "eth0").expect("capture");
    let answers = requests(topo, frontends(IpFamily::V4));
    capture.finish().expect("capture").assert_inbound_only_from(
        &[sock(WEB, 80), sock(DNS, 53)],
        120,
        &format!("{what}: replies at the client pod"),
    );
    check_answers(answers, &format!("{client_ip}:"), what, proxied);
}

/// As [`check_traffic`], over IPv6: 60 TCP and 60 UDP requests from the dual-stack client
/// to the services' IPv6 ClusterIPs, answered by more than one IPv6 backend, which saw the
/// client pod's IPv6 address, every reply on the client's wire from an IPv6 frontend.
fn check_traffic6(topo: &Topology, what: &str) {
    let client6 = topo.client.ip6.expect("a dual-stack client");
    let capture = Capture::start(&topo.client.ns, "eth0").expect("capture");
    let answers = requests(topo, frontends(IpFamily::V6));
    capture.finish().expect("capture").assert_inbound_only_from(
        &frontends(IpFamily::V6),
        120,
        &format!("{what}: replies at the client pod"),
    );
    let backends = check_answers(answers, &format!("[{client6}]:"), what, false);
    assert!(
        backends.iter().all(|b| b.starts_with("[fd00:10:244:")),
        "{what}: answered by {backends:?}, not only IPv6 backends"
    );
}

/// Every answer came, from more than one backend, which saw `client_prefix` (or, with
/// `proxied`, something else: a userspace proxy's own address); the backends that answered.
fn check_answers(
    answers: Vec<Result<xlb_tests::client::Answer, String>>,
    client_prefix: &str,
    what: &str,
    proxied: bool,
) -> BTreeSet<String> {
    let mut backends = BTreeSet::new();
    for a in answers {
        let a = a.unwrap_or_else(|e| panic!("{what}: request failed: {e}"));
        let from_client = a.seen_client.starts_with(client_prefix);
        assert_eq!(
            from_client, !proxied,
            "{what}: backend saw {}",
            a.seen_client
        );
        backends.insert(a.backend);
    }
    assert!(backends.len() > 1, "{what}: only {backends:?} answered");
    backends
}

#[test]
fn emitted_iptables_rules_carry_traffic() {
    let Some(lab) = setup("xi", Impl::KubeProxy(Mode::Iptables), false) else {
        return;
    };
    check_traffic(&lab.topo, "iptables");
}

#[test]
fn emitted_nftables_rules_carry_traffic() {
    let Some(lab) = setup("xf", Impl::KubeProxy(Mode::Nftables), false) else {
        return;
    };
    check_traffic(&lab.topo, "nftables");
}

#[test]
fn userspace_rules_and_the_userspace_proxy_carry_traffic() {
    let Some(lab) = setup("xu", Impl::KubeProxy(Mode::Userspace), false) else {
        return;
    };
    wait_ready(&lab.topo, "userspace");
    check_traffic_seen(&lab.topo, "userspace", true);
}

#[test]
fn emitted_ip6tables_rules_carry_ipv6_traffic_beside_iptables() {
    let Some(lab) = setup("x6i", Impl::KubeProxy(Mode::Iptables), true) else {
        return;
    };
    check_traffic6(&lab.topo, "ip6tables");
    check_traffic(&lab.topo, "iptables beside ip6tables");
}

#[test]
fn emitted_nft_ip6_table_carries_ipv6_traffic_beside_the_ip_table() {
    let Some(lab) = setup("x6f", Impl::KubeProxy(Mode::Nftables), true) else {
        return;
    };
    check_traffic6(&lab.topo, "nftables ip6");
    check_traffic(&lab.topo, "nftables ip beside ip6");
}

/// `xlb emit MODE --ip-family dual` on a dual-stack source.
fn emit_dual(mode: &str) -> String {
    let source =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/compare-dual-stack.yaml");
    let out = std::process::Command::new(xlb_tests::xlb_bin())
        .args([
            "emit",
            mode,
            "--ip-family",
            "dual",
            "--node-ip",
            "10.0.0.1,fd00::10:1",
        ])
        .arg("--source")
        .arg(format!("file:{}", source.display()))
        .output()
        .expect("xlb emit");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// `xlb emit --ip-family dual` prints both of kube-proxy's proxiers, each loadable by its
/// own tool: the two nftables tables in one `nft -f`, the iptables payloads split at their
/// headers into `iptables-restore` and `ip6tables-restore`; the IPv6 ClusterIPs only in the
/// IPv6 half.
#[test]
fn emit_dual_prints_both_proxiers_and_each_loads() {
    if !require_root() {
        return;
    }
    let ns = xlb_tests::netns::Netns::new(&unique_tag("x6e")).expect("netns");
    let nft = emit_dual("nftables");
    ns.feed("nft", &["-f", "-"], &nft)
        .expect("nft -f of both tables");
    let tables = ns
        .command("nft")
        .args(["list", "tables"])
        .output()
        .expect("nft list");
    let tables = String::from_utf8_lossy(&tables.stdout);
    assert!(
        tables.contains("table ip kube-proxy") && tables.contains("table ip6 kube-proxy"),
        "{tables}"
    );
    let ipt = emit_dual("iptables");
    let (v4, v6) = ipt
        .split_once("# kube-proxy's IPv6 proxier (ip6tables-restore)\n")
        .expect("an IPv6 section");
    assert!(
        v4.starts_with("# kube-proxy's IPv4 proxier (iptables-restore)\n"),
        "{v4}"
    );
    assert!(
        !v4.contains("fd00:10:96::") && v6.contains("fd00:10:96::10"),
        "{ipt}"
    );
    ns.feed("iptables-restore", &["--noflush"], v4)
        .expect("iptables-restore");
    ns.feed("ip6tables-restore", &["--noflush"], v6)
        .expect("ip6tables-restore");
    let nat6 = ns
        .command("ip6tables")
        .args(["-t", "nat", "-S", "KUBE-SERVICES"])
        .output();
    let nat6 = String::from_utf8_lossy(&nat6.expect("ip6tables").stdout).to_string();
    assert!(nat6.contains("fd00:10:96::10/128"), "{nat6}");
}
