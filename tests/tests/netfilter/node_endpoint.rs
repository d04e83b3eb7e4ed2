//! A Service whose endpoint is an address of the node itself (a hostNetwork backend: a
//! node-local DNS, the API server on a control-plane node) reached from a pod that tc
//! serves: the request is translated at the pod's interface, the node's answer leaves a
//! local socket for the pod and must be translated back on its way out. With the agent's
//! `--socket-lb host`, from a thread outside the agent's cgroup and from an `xlb-probe`
//! process inside it (in a pod, so the hooks leave it to tc), over TCP and UDP, in both
//! families; then again under kube-proxy's INVALID-dropping rules. A control runs the same
//! with kube-proxy's own rules in place of the agent.

use std::net::{IpAddr, SocketAddr};

use xlb_tests::{
    client::{tcp_request, udp_request},
    echo::EchoServer,
    netfilter::Firewall,
    probe::{self, Line},
    scenario::{TCP_PORT, UDP_PORT},
    twonode::Lab,
};

use crate::{Frontends, TIMEOUT, V4, V6, lab, log_tail, paths, wait_served};

const REQUESTS: usize = 3;

/// Requests from the client pod to the `host` Service of `family`: `REQUESTS` over TCP and
/// over UDP from a thread, then from a probe process in the agent's cgroup; the failures.
fn failures(lab: &Lab, family: &Frontends) -> Vec<String> {
    let (tcp, udp) = (
        SocketAddr::new(family.host, 80),
        SocketAddr::new(family.host, 53),
    );
    let client_ip = match family.host {
        IpAddr::V4(_) => IpAddr::V4(lab.topo.client.ip),
        IpAddr::V6(_) => IpAddr::V6(lab.topo.client.ip6.expect("a dual-stack client")),
    };
    let mut bad = Vec::new();
    let answers = lab
        .topo
        .client
        .ns
        .run(move || {
            (0..REQUESTS)
                .flat_map(|_| [tcp_request(tcp, TIMEOUT), udp_request(udp, TIMEOUT)])
                .collect::<Vec<_>>()
        })
        .expect("client thread");
    for a in answers {
        match a {
            Ok(a) if a.backend == "node1" && a.seen_client.contains(&client_ip.to_string()) => {}
            other => bad.push(format!("thread outside the cgroup: {other:?}")),
        }
    }
    let cg = lab.agent.cgroup.as_ref().expect("the agent's cgroup");
    for (mode, to) in [("tcp", tcp), ("udp", udp)] {
        let args = [mode.to_string(), to.to_string(), REQUESTS.to_string()];
        match probe::run(cg, &lab.topo.client.ns, &args) {
            Ok(lines) => {
                for l in lines {
                    match &l {
                        Line::Ok { backend, peer, .. } if backend == "node1" && *peer == to => {}
                        _ => bad.push(format!("xlb-probe {mode} in the agent's cgroup: {l:?}")),
                    }
                }
            }
            Err(e) => bad.push(format!("xlb-probe {mode}: {e}")),
        }
    }
    bad
}

/// The `host` Service of `family` served to the client pod, before and after kube-proxy's
/// INVALID-dropping rules; with `control`, by kube-proxy's own rules instead of xlb.
fn node_endpoint_served(prefix: &str, family: &Frontends, control: bool) {
    let Some(mut lab) = lab(prefix, &["--socket-lb", "host"]) else {
        return;
    };
    if control {
        crate::control::kube_proxy_instead(&mut lab);
    }
    // The lab serves: pod → ClusterIP reaches the backend pod.
    wait_served(&lab, &paths(family)[..1]);
    let node = &lab.topo.node;
    // On the endpoint address itself, as a node-local DNS binds: a UDP server on the
    // wildcard would answer from the address of the interface towards the pod.
    let _server = EchoServer::start_at(node, "node1", family.node, TCP_PORT, UDP_PORT)
        .expect("echo server in node1's namespace");
    let who = if control {
        "kube-proxy's rules (control)"
    } else {
        "xlb's tc datapath"
    };
    let bad = failures(&lab, family);
    assert!(
        bad.is_empty(),
        "a pod served by {who} does not reach the Service on node1's own address {}:\n{}\n{}",
        family.host,
        bad.join("\n"),
        log_tail(&lab.agent.log_text())
    );
    Firewall::KubeForward
        .install(node, &[])
        .expect("kube-proxy's rules");
    let bad = failures(&lab, family);
    assert!(
        bad.is_empty(),
        "under kube-proxy's INVALID-dropping rules, a pod served by {who} does not reach \
         the Service on node1's own address {}:\n{}\n--- rules:\n{}\n{}",
        family.host,
        bad.join("\n"),
        Firewall::KubeForward.listing(node),
        log_tail(&lab.agent.log_text())
    );
}

#[test]
fn a_pod_served_by_tc_reaches_an_ipv4_service_on_the_node_itself() {
    node_endpoint_served("nfh4", &V4, false);
}

#[test]
fn a_pod_served_by_tc_reaches_an_ipv6_service_on_the_node_itself() {
    node_endpoint_served("nfh6", &V6, false);
}

#[test]
fn control_a_pod_reaches_the_services_on_the_node_itself_under_kube_proxy() {
    node_endpoint_served("nfhc4", &V4, true);
    node_endpoint_served("nfhc6", &V6, true);
}
