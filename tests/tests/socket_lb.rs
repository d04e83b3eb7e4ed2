//! Connect-time load balancing: real client processes in the agent's cgroup, from the node
//! namespace itself and from a pod, through the cgroup socket hooks.

use std::{collections::BTreeMap, net::Ipv4Addr, time::Duration};

use xlb_tests::{
    datapath::reason_counts,
    probe::{self, Line},
    require_root,
    scenario::{Scenario, TCP_PORT, UDP_PORT, sock},
    services::service_yaml,
    topology::{GATEWAY, pod_ip},
};

const WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const DNS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 53);

fn backends(n: u8) -> Vec<Ipv4Addr> {
    (1..=n).map(|k| pod_ip(k + 1)).collect()
}

fn yaml(web: &[Ipv4Addr], dns: &[Ipv4Addr]) -> String {
    service_yaml("web", WEB, 80, "TCP", TCP_PORT, web)
        + &service_yaml("dns", DNS, 53, "UDP", UDP_PORT, dns)
}

fn args(mode: &str, to: std::net::SocketAddr, n: u32) -> Vec<String> {
    vec![mode.into(), to.to_string(), n.to_string()]
}

fn spread(lines: &[Line]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for l in lines {
        *m.entry(l.backend().unwrap_or("FAILED").to_string())
            .or_insert(0) += 1;
    }
    m
}

fn started(test: &str, prefix: &str, yaml: &str, backends: usize) -> Option<Scenario> {
    if !require_root(test) {
        return None;
    }
    let mut s = Scenario::start(prefix, backends, yaml).expect("scenario");
    s.wait_backends("10.96.0.10:80/TCP", backends, Duration::from_secs(10))
        .expect("initial sync");
    Some(s)
}

#[test]
fn the_node_itself_reaches_a_cluster_ip_over_tcp_and_udp() {
    let all = backends(3);
    let Some(s) = started(
        "the_node_itself_reaches_a_cluster_ip_over_tcp_and_udp",
        "xs",
        &yaml(&all, &all),
        3,
    ) else {
        return;
    };
    let cg = s.agent.cgroup.as_ref().expect("the agent's cgroup");
    // A new socket per request spreads; one unconnected UDP socket stays on one backend
    // (one flow, as kube-proxy's conntrack keeps it).
    for (mode, vip, spread_over) in [
        ("tcp", sock(WEB, 80), 3),
        ("udp", sock(DNS, 53), 3),
        ("udp-unconnected", sock(DNS, 53), 1),
    ] {
        let lines = probe::run(cg, &s.topo.node, &args(mode, vip, 60)).expect("probe");
        let by_backend = spread(&lines);
        assert_eq!(
            by_backend.len(),
            spread_over,
            "{mode}: {by_backend:?}\n{lines:?}\n{}",
            s.agent.log_text()
        );
        for l in &lines {
            let Line::Ok {
                seen_client, peer, ..
            } = l
            else {
                panic!("{mode}: {l:?}");
            };
            assert_eq!(*peer, vip, "{mode}: the socket must see the frontend");
            assert!(
                seen_client.starts_with(&format!("{GATEWAY}:")),
                "{mode}: the backend saw {seen_client}, not the node"
            );
        }
    }
    let counts = reason_counts(&s.agent.pins);
    assert!(counts["sock_xlate"] >= 120, "{counts:?}");
    assert!(counts["sock_revnat"] >= 180, "{counts:?}");
}
