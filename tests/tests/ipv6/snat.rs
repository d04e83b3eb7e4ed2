//! IPv6 SNAT to a remote backend, with real traffic across two nodes: an external client's
//! SHA-256-checked uploads and UDP requests to an IPv6 NodePort (externalTrafficPolicy
//! Cluster) on node1 reach a backend on node2 SNATed to node1's IPv6 underlay address with
//! a port of the SNAT range (so its replies come back through node1), and a local backend
//! with the client's own address; every reply reaches the client from the NodePort.

use std::{
    collections::BTreeMap,
    net::{Ipv6Addr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use xlb_tests::{
    agent::Agent,
    client::{tcp_upload, udp_request},
    echo::EchoServer,
    require_root,
    scenario::{TCP_PORT, UDP_PORT},
    services::write_atomic,
    topology::{NODE1_UNDERLAY6, Pod, RemoteNode, Topology},
    twonode::{SNAT_PORTS, agent_args},
};

const NODE6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x192, 0, 0, 0, 0, 0, 1);
const CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x192, 0, 0, 0, 0, 0, 0x10);

/// An IPv6 NodePort Service (TCP 30080, UDP 30053, Cluster policy) on `endpoints`
/// (address, node).
fn yaml(endpoints: &[(Ipv6Addr, &str)]) -> String {
    let mut y = "---\napiVersion: v1\nkind: Service\nmetadata: {namespace: ns, name: far6}\nspec:\n  type: NodePort\n  ipFamilies: [IPv6]\n  clusterIP: \"fd00:10:96::81\"\n  ports:\n  - {name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}\n  - {name: dns, port: 53, protocol: UDP, targetPort: 5353, nodePort: 30053}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: ns\n  name: far6-1\n  labels: {kubernetes.io/service-name: far6}\naddressType: IPv6\nports:\n- {name: http, port: 8080, protocol: TCP}\n- {name: dns, port: 5353, protocol: UDP}\nendpoints:\n".to_string();
    for (ip, node) in endpoints {
        y.push_str(&format!(
            "- addresses: [\"{ip}\"]\n  conditions: {{ready: true}}\n  nodeName: {node}\n"
        ));
    }
    y
}

/// Node1 with one dual-stack backend pod, the external client on its uplink, node2 across a
/// dual-stack underlay with one dual-stack pod, IPv6 echo servers on both pods, the agent
/// on node1 with the NodePort programmed.
struct Lab {
    // Drop order: the agent, the servers, then the namespaces.
    agent: Agent,
    _servers: Vec<EchoServer>,
    ext: Pod,
    _remote: RemoteNode,
    _topo: Topology,
    dir: PathBuf,
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.agent.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn build() -> Lab {
    let tag = xlb_tests::unique_tag("x6s");
    let mut topo = Topology::build(&tag, 1).expect("topology");
    topo.dual_stack().expect("dual-stack pods");
    let mut ext = topo.add_external_client("up0").expect("external client");
    topo.add_external_ipv6(&mut ext, "up0", NODE6, CLIENT6)
        .expect("external IPv6");
    let mut remote = topo.add_remote_node("ul1", 1500, 1).expect("node2");
    remote
        .dual_stack(&topo.node, "ul1")
        .expect("dual-stack node2");
    let pods: Vec<&Pod> = topo.backends.iter().chain(&remote.pods).collect();
    let _servers: Vec<EchoServer> = pods
        .iter()
        .map(|p| {
            let ip6 = p.ip6.expect("a dual-stack pod");
            EchoServer::start_at(&p.ns, &p.name, ip6.into(), TCP_PORT, UDP_PORT).expect("server")
        })
        .collect();
    let endpoints = [
        (pods[0].ip6.expect("ip6"), "node1"),
        (pods[1].ip6.expect("ip6"), "node2"),
    ];
    let dir = std::env::temp_dir().join(&tag);
    std::fs::create_dir_all(&dir).expect("dir");
    write_atomic(&dir.join("svc.yaml"), &yaml(&endpoints)).expect("yaml");
    let args = agent_args(&dir.join("svc.yaml"), &format!("192.0.2.1,{NODE6}"), &[]);
    let pins = PathBuf::from(format!("/sys/fs/bpf/{tag}"));
    let mut agent =
        Agent::start_with(&topo.node, &args, pins, dir.join("agent.log")).expect("agent");
    let tcp = format!("[{NODE6}]:30080/TCP");
    agent
        .wait_for(Duration::from_secs(10), |rows| {
            rows.iter()
                .any(|r| r.frontend == tcp && r.backends.len() == 2)
        })
        .unwrap_or_else(|e| panic!("{tcp} programmed: {e}"));
    // Let the interfaces get attached too.
    std::thread::sleep(Duration::from_millis(300));
    Lab {
        agent,
        _servers,
        ext,
        _remote: remote,
        _topo: topo,
        dir,
    }
}

/// Checks one answer's client as `backend` saw it: the external client's own address at
/// node1's backend, node1's underlay address with a SNAT port at node2's. Returns the
/// backend.
fn check_seen(what: &str, backend: &str, seen_client: &str) -> String {
    let seen: SocketAddr = seen_client
        .parse()
        .unwrap_or_else(|e| panic!("{what}: {seen_client:?}: {e}"));
    match backend {
        "backend-1" => assert_eq!(
            seen.ip(),
            CLIENT6,
            "{what}: a local backend sees the client"
        ),
        "n2-backend-1" => {
            assert_eq!(
                seen.ip(),
                NODE1_UNDERLAY6,
                "{what}: a remote backend sees node1's underlay address"
            );
            assert!(
                (SNAT_PORTS.0..=SNAT_PORTS.1).contains(&seen.port()),
                "{what}: {seen}"
            );
        }
        other => panic!("{what}: unknown backend {other}"),
    }
    backend.to_string()
}

#[test]
fn ipv6_node_port_flows_to_a_remote_backend_are_snated_to_node1() {
    if !require_root() {
        return;
    }
    let lab = build();
    let agent = &lab.agent;
    let to = SocketAddr::from((NODE6, 30080));
    let dns = SocketAddr::from((NODE6, 30053));
    let (uploads, answers) = lab
        .ext
        .ns
        .run(move || {
            let up: Vec<_> = (0..16)
                .map(|_| tcp_upload(to, 256 * 1024, Duration::from_secs(5)))
                .collect();
            let udp: Vec<_> = (0..16)
                .map(|_| udp_request(dns, Duration::from_secs(2)))
                .collect();
            (up, udp)
        })
        .expect("client");
    let mut reached = BTreeMap::<String, usize>::new();
    for u in uploads {
        let u = u.unwrap_or_else(|e| panic!("upload: {e}\n{}", agent.log_text()));
        assert!(u.sha256_matches, "the bytes arrived changed");
        let b = check_seen("upload", &u.answer.backend, &u.answer.seen_client);
        *reached.entry(b).or_default() += 1;
    }
    for a in answers {
        let a = a.unwrap_or_else(|e| panic!("UDP NodePort: {e}\n{}", agent.log_text()));
        let b = check_seen("UDP", &a.backend, &a.seen_client);
        *reached.entry(b).or_default() += 1;
    }
    assert_eq!(reached.len(), 2, "both nodes' backends: {reached:?}");
    let flows =
        lb_userspace::list::conntrack(&xlb_tests::pins(&agent.pins)).expect("list conntrack");
    let snat = format!("[{NODE1_UNDERLAY6}]:");
    assert!(
        flows.iter().any(|f| f.snat.starts_with(&snat)),
        "SNATed flows listed: {flows:?}"
    );
}
