//! Two nodes with a bridge-based pod network ([`xlb_tests::bridge`]): a pod on node 1 calls
//! node 2's NodePort, and node 2 (the agent attached to its pods' veths, which are ports of
//! its bridge) sends the request to its own pod without SNAT: externalTrafficPolicy Local,
//! and Cluster with only a local endpoint. The backend's reply enters the bridge before it
//! is routed back to node 1; with its source already the node's own address, the kernel
//! would drop it there as a martian, so it must be translated after routing. Over TCP and
//! UDP, with `accept_local` left off on the bridge.

use std::{path::PathBuf, time::Duration};

use xlb_tests::{
    agent::Agent,
    bridge::{BRIDGE, BridgeNode, bridge_node_ip},
    client::{tcp_request, udp_request},
    echo::EchoServer,
    netns::run,
    require_root,
    scenario::{TCP_PORT, UDP_PORT, sock},
    services::{service_on_nodes, write_atomic},
    unique_tag,
};

use crate::{TIMEOUT, log_tail};

/// The NodePorts: eTP Local TCP and UDP, eTP Cluster TCP and UDP.
const NODE_PORTS: [(u16, &str, &str); 4] = [
    (30080, "TCP", "Local"),
    (30053, "UDP", "Local"),
    (30081, "TCP", "Cluster"),
    (30054, "UDP", "Cluster"),
];

/// One NodePort Service per entry of [`NODE_PORTS`], each on `backend` (on node2).
fn services(backend: std::net::Ipv4Addr) -> String {
    let mut y = String::new();
    for (i, (np, proto, policy)) in NODE_PORTS.into_iter().enumerate() {
        let target = if proto == "TCP" { TCP_PORT } else { UDP_PORT };
        y += &service_on_nodes(
            &format!("np-{}-{}", policy.to_lowercase(), proto.to_lowercase()),
            "NodePort",
            &format!("10.96.0.{}", 60 + i),
            proto,
            80,
            target,
            Some(np),
            &format!("  externalTrafficPolicy: {policy}\n"),
            "",
            &[(backend, "node2")],
        );
    }
    y
}

/// The agent's flags on node2: its pods' veths, its underlay as node interface and NodePort
/// address.
fn agent_args(yaml: &std::path::Path) -> Vec<String> {
    let node2 = bridge_node_ip(2).to_string();
    [
        "--source",
        &format!("file:{}", yaml.display()),
        "--pod-interfaces",
        "xv-*",
        "--node-interfaces",
        "ul1",
        "--nodeport-addresses",
        &node2,
        "--hostname-override",
        "node2",
        "--healthz-bind-address",
        "",
        "--metrics-bind-address",
        "",
    ]
    .map(String::from)
    .to_vec()
}

/// A directory removed on drop (after the agent, declared later, stopped).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_pod_reaches_a_node_port_answered_by_a_bridged_local_backend() {
    let test = "a_pod_reaches_a_node_port_answered_by_a_bridged_local_backend";
    if !require_root(test) {
        return;
    }
    let tag = unique_tag("nfb");
    let mut node1 = BridgeNode::new(&tag, 1).expect("node1");
    let mut node2 = BridgeNode::new(&tag, 2).expect("node2");
    node1.join(&node2).expect("underlay");
    let client = node1.add_pod(&tag, "client").expect("client pod").ip;
    let backend = node2.add_pod(&tag, "backend").expect("backend pod");
    let backend_ip = backend.ip;
    let _server = EchoServer::start(&backend.ns, "backend", TCP_PORT, UDP_PORT).expect("server");
    // The network works without xlb: the client reaches the backend pod by its address.
    let direct = node1.pods[0]
        .ns
        .run(move || tcp_request(sock(backend_ip, TCP_PORT), TIMEOUT))
        .expect("client thread");
    direct.unwrap_or_else(|e| panic!("pod to pod across the bridges, without xlb: {e}"));

    let dir = Scratch(std::env::temp_dir().join(&tag));
    std::fs::create_dir_all(&dir.0).expect("dir");
    let yaml = dir.0.join("svc.yaml");
    write_atomic(&yaml, &services(backend_ip)).expect("yaml");
    let pins = PathBuf::from(format!("/sys/fs/bpf/{tag}"));
    let mut agent = Agent::start_with(&node2.ns, &agent_args(&yaml), pins, dir.0.join("agent.log"))
        .expect("agent on node2");
    let last = format!("{}:30054/UDP", bridge_node_ip(2));
    agent
        .wait_for(Duration::from_secs(10), |rows| {
            rows.iter()
                .any(|r| r.frontend == last && r.backends.len() == 1)
        })
        .unwrap_or_else(|e| panic!("{last} programmed: {e}"));
    std::thread::sleep(Duration::from_millis(300));

    let node2_ip = bridge_node_ip(2);
    let answers = node1.pods[0]
        .ns
        .run(move || {
            let mut out = Vec::new();
            for (np, proto, policy) in NODE_PORTS {
                for _ in 0..3 {
                    let to = sock(node2_ip, np);
                    let a = match proto {
                        "TCP" => tcp_request(to, TIMEOUT),
                        _ => udp_request(to, TIMEOUT),
                    };
                    out.push((format!("eTP {policy} {proto} {to}"), a));
                }
            }
            out
        })
        .expect("client thread");
    let bad: Vec<String> = answers
        .iter()
        .filter(|(_, a)| {
            !matches!(a, Ok(a) if a.backend == "backend" && a.seen_client.starts_with(&format!("{client}:")))
        })
        .map(|(what, a)| format!("{what}: {a:?}"))
        .collect();
    let accept_local = run(node2
        .ns
        .command("sysctl")
        .args(["-n", &format!("net.ipv4.conf.{BRIDGE}.accept_local")]))
    .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    .expect("sysctl");
    assert!(
        bad.is_empty(),
        "node1's pod → node2's NodePort → node2's bridged pod, without SNAT: {} of {} \
         requests not answered by the backend seeing the client's own address:\n{}\n{}",
        bad.len(),
        answers.len(),
        bad.join("\n"),
        log_tail(&agent.log_text())
    );
    assert_eq!(
        accept_local, "0",
        "the agent must not widen accept_local on the bridge it is not attached to"
    );
}
