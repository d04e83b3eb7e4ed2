//! Two nodes with a bridge-based pod network ([`xlb_tests::bridge`]): a pod on node 1 calls
//! node 2's NodePort, and node 2 (the agent attached to its pods' veths, which are ports of
//! its bridge) sends the request to its own pod without SNAT: externalTrafficPolicy Local,
//! and Cluster with only a local endpoint. The backend's reply enters the bridge before it
//! is routed back to node 1; with its source already the node's own address, the kernel
//! would drop it there as a martian, so it must be translated after routing. Over TCP and
//! UDP, with `accept_local` left off on the bridge. A control serves the same requests with
//! kube-proxy's iptables rules on node 2 instead: the lab itself carries them.

use std::{net::Ipv4Addr, path::PathBuf, time::Duration};

use lb_userspace::{
    emit::{self, Mode},
    model::{IpFamily, LocalDetector, NodeSettings},
    source::file,
};
use xlb_lab::compare::install_rules;
use xlb_tests::{
    agent::Agent,
    bridge::{BRIDGE, BridgeNode, bridge_node_ip},
    client::{Answer, tcp_request, udp_request},
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
fn services(backend: Ipv4Addr) -> String {
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

/// A directory removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Node1 with a client pod, node2 with a backend pod (an echo server named `backend`), the
/// Services' YAML written; the pod network checked without any service proxy.
struct BridgeLab {
    tag: String,
    dir: Scratch,
    _server: EchoServer,
    client: Ipv4Addr,
    backend: Ipv4Addr,
    node1: BridgeNode,
    node2: BridgeNode,
}

impl BridgeLab {
    fn build(prefix: &str) -> Self {
        let tag = unique_tag(prefix);
        let mut node1 = BridgeNode::new(&tag, 1).expect("node1");
        let mut node2 = BridgeNode::new(&tag, 2).expect("node2");
        node1.join(&node2).expect("underlay");
        let client = node1.add_pod(&tag, "client").expect("client pod").ip;
        let pod = node2.add_pod(&tag, "backend").expect("backend pod");
        let backend = pod.ip;
        let _server = EchoServer::start(&pod.ns, "backend", TCP_PORT, UDP_PORT).expect("server");
        let direct = node1.pods[0]
            .ns
            .run(move || tcp_request(sock(backend, TCP_PORT), TIMEOUT))
            .expect("client thread");
        direct.unwrap_or_else(|e| panic!("pod to pod across the bridges, without xlb: {e}"));
        let dir = Scratch(std::env::temp_dir().join(&tag));
        std::fs::create_dir_all(&dir.0).expect("dir");
        write_atomic(&dir.0.join("svc.yaml"), &services(backend)).expect("yaml");
        BridgeLab {
            tag,
            dir,
            _server,
            client,
            backend,
            node1,
            node2,
        }
    }

    /// Three requests to each of node2's NodePorts from node1's pod: what each got.
    fn ask(&self) -> Vec<(String, Result<Answer, String>)> {
        let node2 = bridge_node_ip(2);
        self.node1.pods[0]
            .ns
            .run(move || {
                let mut out = Vec::new();
                for (np, proto, policy) in NODE_PORTS {
                    for _ in 0..3 {
                        let to = sock(node2, np);
                        let a = match proto {
                            "TCP" => tcp_request(to, TIMEOUT),
                            _ => udp_request(to, TIMEOUT),
                        };
                        out.push((format!("eTP {policy} {proto} {to}"), a));
                    }
                }
                out
            })
            .expect("client thread")
    }

    /// `accept_local` of node2's bridge.
    fn accept_local(&self) -> String {
        let key = format!("net.ipv4.conf.{BRIDGE}.accept_local");
        let out = run(self.node2.ns.command("sysctl").args(["-n", &key])).expect("sysctl");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
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

#[test]
fn a_pod_reaches_a_node_port_answered_by_a_bridged_local_backend() {
    if !require_root() {
        return;
    }
    let lab = BridgeLab::build("nfb");
    let pins = PathBuf::from(format!("/sys/fs/bpf/{}", lab.tag));
    let args = agent_args(&lab.dir.0.join("svc.yaml"));
    let mut agent = Agent::start_with(&lab.node2.ns, &args, pins, lab.dir.0.join("agent.log"))
        .expect("agent on node2");
    let last = format!("{}:30054/UDP", bridge_node_ip(2));
    agent
        .wait_for(Duration::from_secs(10), |rows| {
            rows.iter()
                .any(|r| r.frontend == last && r.backends.len() == 1)
        })
        .unwrap_or_else(|e| panic!("{last} programmed: {e}"));
    std::thread::sleep(Duration::from_millis(300));
    let answers = lab.ask();
    let client = format!("{}:", lab.client);
    let bad: Vec<String> = answers
        .iter()
        .filter(|(_, a)| {
            !matches!(a, Ok(a) if a.backend == "backend" && a.seen_client.starts_with(&client))
        })
        .map(|(what, a)| format!("{what}: {a:?}"))
        .collect();
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
        lab.accept_local(),
        "0",
        "the agent must not widen accept_local on the bridge it is not attached to"
    );
}

/// The control: kube-proxy's iptables rules on node2 (pod traffic told by the bridge)
/// serve the same requests in the same lab.
#[test]
fn control_the_bridged_node_port_is_served_under_kube_proxy() {
    if !require_root() {
        return;
    }
    let lab = BridgeLab::build("nfbc");
    let model = file::parse("svc.yaml", &services(lab.backend))
        .expect("Services")
        .model;
    let node2 = bridge_node_ip(2);
    let settings = NodeSettings {
        node_name: "node2".into(),
        node_ips: vec![node2.into()],
        local_addresses: vec![node2.into()],
        node_port_addresses: vec![format!("{node2}/32").parse().expect("cidr")],
        detector: LocalDetector::BridgeInterface(BRIDGE.into()),
        ..NodeSettings::default()
    };
    let options = emit::WriterOptions::default();
    let (ns, families) = (&lab.node2.ns, [IpFamily::V4]);
    install_rules(ns, Mode::Iptables, &model, &settings, &options, &families)
        .expect("kube-proxy's rules on node2");
    let answers = lab.ask();
    let bad: Vec<String> = answers
        .iter()
        .filter(|(_, a)| !matches!(a, Ok(a) if a.backend == "backend"))
        .map(|(what, a)| format!("{what}: {a:?}"))
        .collect();
    assert!(
        bad.is_empty(),
        "under kube-proxy's rules: {} of {} not served:\n{}",
        bad.len(),
        answers.len(),
        bad.join("\n")
    );
    assert_eq!(lab.accept_local(), "0");
}
