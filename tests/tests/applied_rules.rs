//! kube-proxy's rules as xlb emits them, applied with the real tools inside a test node
//! namespace (`iptables-restore`, `nft -f`; the userspace rules with `xlb proxy userspace`),
//! carrying real traffic from a client pod to the backends: the emitters produce rules that
//! work, not just text that matches. The lab and the installation are `compare::install`'s,
//! the same that `xlb compare` uses. (This kernel has no ip_vs, so ipvs output is checked by
//! the conformance tests only.)

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{Ipv4Addr, SocketAddr},
    time::Duration,
};

use lb_userspace::{emit::Mode, model::node::NodeSettings, source::file};
use xlb_lab::{
    compare::{Impl, Installed, LabSpec, install},
    topology::Topology,
};
use xlb_tests::{
    capture::Capture,
    client::{tcp_request, udp_request},
    require_root,
    scenario::{TCP_PORT, UDP_PORT, sock},
    services::service_yaml,
    topology::pod_ip,
    unique_tag,
};

const WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const DNS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 53);

/// A lab with three backend pods and `mode` installed for the two demo-like services.
fn setup(prefix: &str, mode: Impl) -> Option<Installed> {
    if !require_root(prefix) {
        return None;
    }
    let tag = unique_tag(prefix);
    let ips: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
    let yaml = service_yaml("web", WEB, 80, "TCP", TCP_PORT, &ips)
        + &service_yaml("dns", DNS, 53, "UDP", UDP_PORT, &ips);
    let dir = std::env::temp_dir().join(format!("{tag}-src"));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("services.yaml");
    std::fs::write(&path, &yaml).expect("yaml");
    let model = file::parse("rules.yaml", &yaml).expect("yaml").model;
    let node = NodeSettings {
        node_name: "node1".into(),
        ..NodeSettings::default()
    };
    let pods: BTreeMap<Ipv4Addr, BTreeSet<u16>> = ips
        .iter()
        .map(|ip| (*ip, [TCP_PORT, UDP_PORT].into()))
        .collect();
    let frontends = [SocketAddr::from((WEB, 80)), SocketAddr::from((DNS, 53))];
    let lab = install(&LabSpec {
        mode: Some(mode),
        tag: &tag,
        source: &path,
        xlb: &xlb_tests::xlb_bin(),
        model: &model,
        settings: &node,
        options: &lb_userspace::emit::Options::default(),
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

fn check_traffic_seen(topo: &Topology, what: &str, proxied: bool) {
    let client_ip = topo.client.ip;
    let capture = Capture::start(&topo.client.ns, "eth0").expect("capture");
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
    capture.finish().expect("capture").assert_inbound_only_from(
        &[sock(WEB, 80), sock(DNS, 53)],
        120,
        &format!("{what}: replies at the client pod"),
    );
    let mut backends = BTreeSet::new();
    for a in answers {
        let a = a.unwrap_or_else(|e| panic!("{what}: request failed: {e}"));
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
    let Some(lab) = setup("xi", Impl::KubeProxy(Mode::Iptables)) else {
        return;
    };
    check_traffic(&lab.topo, "iptables");
}

#[test]
fn emitted_nftables_rules_carry_traffic() {
    let Some(lab) = setup("xf", Impl::KubeProxy(Mode::Nftables)) else {
        return;
    };
    check_traffic(&lab.topo, "nftables");
}

#[test]
fn userspace_rules_and_the_userspace_proxy_carry_traffic() {
    let Some(lab) = setup("xu", Impl::KubeProxy(Mode::Userspace)) else {
        return;
    };
    wait_ready(&lab.topo, "userspace");
    check_traffic_seen(&lab.topo, "userspace", true);
}
