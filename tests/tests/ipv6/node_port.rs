//! NodePorts over IPv6 from outside the node: an external client on the node's uplink
//! reaches an IPv6 NodePort on the uplink's global IPv6 address (the agent's default
//! NodePort addresses: the node interfaces' addresses of both families) through tc, with
//! SHA-256-checked uploads, spread over the backends; externalTrafficPolicy Local keeps the
//! client's address, the UDP NodePort answers from it too, and the Service's health-check
//! node port answers on the IPv6 address as a cloud load balancer probes it. IPv6
//! LoadBalancer IPs routed to the node admit only the clients in their
//! loadBalancerSourceRanges. An IPv6 address added to the node after start is a NodePort
//! address within a second (rtnetlink's IPv6 address events), and stops being one when it
//! is removed.

use std::{
    collections::BTreeSet,
    net::{Ipv6Addr, SocketAddr},
    time::{Duration, Instant},
};

use xlb_tests::agent::Agent;
use xlb_tests::{
    client::{tcp_request, tcp_upload, udp_request},
    echo::EchoServer,
    require_root,
    scenario::{TCP_PORT, UDP_PORT},
    services::write_atomic,
    topology::{Pod, Topology},
};

/// The node's address on the uplink and the external client's.
const NODE6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x192, 0, 0, 0, 0, 0, 1);
const CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x192, 0, 0, 0, 0, 0, 0x10);
/// LoadBalancer IPs (routed to the node by the client): one whose source ranges hold the
/// client, one whose ranges do not.
const OPEN6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 0x30);
const CLOSED6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 0x31);

/// An IPv6 single-stack LoadBalancer Service (NodePorts TCP 30080 and UDP 30053, Local
/// policy, health-check node port 32080) on the pods' IPv6 addresses, all on node1.
fn yaml(backends: &[Ipv6Addr]) -> String {
    let mut y = "---\napiVersion: v1\nkind: Service\nmetadata: {namespace: ns, name: web6}\nspec:\n  type: LoadBalancer\n  ipFamilies: [IPv6]\n  clusterIP: \"fd00:10:96::80\"\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 32080\n  ports:\n  - {name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}\n  - {name: dns, port: 53, protocol: UDP, targetPort: 5353, nodePort: 30053}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: ns\n  name: web6-1\n  labels: {kubernetes.io/service-name: web6}\naddressType: IPv6\nports:\n- {name: http, port: 8080, protocol: TCP}\n- {name: dns, port: 5353, protocol: UDP}\nendpoints:\n".to_string();
    for ip in backends {
        y.push_str(&format!(
            "- addresses: [\"{ip}\"]\n  conditions: {{ready: true}}\n  nodeName: node1\n"
        ));
    }
    y + &ranged("open6", OPEN6, 30081, "fd00:192::/64", backends)
        + &ranged("closed6", CLOSED6, 30082, "2001:db8:dead::/48", backends)
}

/// An IPv6 LoadBalancer Service `name` on `lb_ip` (TCP 80 → 8080, nodePort `np`) admitting
/// the clients in `range`, on `backends`.
fn ranged(name: &str, lb_ip: Ipv6Addr, np: u16, range: &str, backends: &[Ipv6Addr]) -> String {
    let cluster_ip = format!("fd00:10:96::{:x}", np - 30000 + 0x80);
    let mut y = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: ns, name: {name}}}\nspec:\n  type: LoadBalancer\n  ipFamilies: [IPv6]\n  clusterIP: \"{cluster_ip}\"\n  loadBalancerSourceRanges: [\"{range}\"]\n  ports:\n  - {{name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: {np}}}\nstatus:\n  loadBalancer:\n    ingress: [{{ip: \"{lb_ip}\"}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: ns\n  name: {name}-1\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv6\nports:\n- {{name: http, port: 8080, protocol: TCP}}\nendpoints:\n"
    );
    for ip in backends {
        y.push_str(&format!(
            "- addresses: [\"{ip}\"]\n  conditions: {{ready: true}}\n  nodeName: node1\n"
        ));
    }
    y
}

/// The lab: dual-stack pods with IPv6 echo servers, an external client on `up0` with an
/// IPv6 address beside the node's, the agent on the Service with the NodePort programmed.
struct Lab {
    // Drop order: the agent, the servers, then the namespaces.
    agent: Agent,
    _servers: Vec<EchoServer>,
    ext: Pod,
    topo: Topology,
    dir: std::path::PathBuf,
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Lab {
    fn build() -> Lab {
        let tag = xlb_tests::unique_tag("x6n");
        let mut topo = Topology::build(&tag, 3).expect("topology");
        topo.dual_stack().expect("dual-stack pods");
        let mut ext = topo.add_external_client("up0").expect("external client");
        topo.add_external_ipv6(&mut ext, "up0", NODE6, CLIENT6)
            .expect("external IPv6");
        // The LoadBalancer IPs are routed to the node, as a cloud's load balancer would.
        ext.ns
            .ip(&[
                "-6",
                "route",
                "add",
                "2001:db8:100::/64",
                "via",
                &NODE6.to_string(),
                "dev",
                "eth0",
            ])
            .expect("route to the LoadBalancer IPs");
        let backends: Vec<Ipv6Addr> = topo.backends.iter().filter_map(|p| p.ip6).collect();
        let _servers: Vec<EchoServer> = topo
            .backends
            .iter()
            .zip(&backends)
            .map(|(p, ip)| {
                EchoServer::start_at(&p.ns, &p.name, (*ip).into(), TCP_PORT, UDP_PORT)
                    .expect("server")
            })
            .collect();
        let dir = std::env::temp_dir().join(&tag);
        std::fs::create_dir_all(&dir).expect("dir");
        write_atomic(&dir.join("svc.yaml"), &yaml(&backends)).expect("yaml");
        let args: Vec<String> = [
            "--source",
            &format!("file:{}", dir.join("svc.yaml").display()),
            "--pod-interfaces",
            "xv-*",
            "--node-interfaces",
            "up0",
            "--hostname-override",
            "node1",
        ]
        .map(String::from)
        .to_vec();
        let pins = std::path::PathBuf::from(format!("/sys/fs/bpf/{tag}"));
        let mut agent =
            xlb_tests::agent::Agent::start_with(&topo.node, &args, pins, dir.join("agent.log"))
                .expect("agent");
        let tcp = format!("[{NODE6}]:30080/TCP");
        let closed = format!("[{CLOSED6}]:80/TCP");
        agent
            .wait_for(Duration::from_secs(10), |rows| {
                let ready = |f: &str| {
                    rows.iter()
                        .any(|r| r.frontend == f && r.backends.len() == 3)
                };
                ready(&tcp) && ready(&closed)
            })
            .expect("the IPv6 NodePort programmed on the uplink's IPv6 address");
        std::thread::sleep(Duration::from_millis(300));
        Lab {
            agent,
            _servers,
            ext,
            topo,
            dir,
        }
    }
}

#[test]
fn an_external_client_reaches_an_ipv6_node_port_with_checked_uploads() {
    if !require_root() {
        return;
    }
    let lab = Lab::build();
    let (ext, agent) = (&lab.ext, &lab.agent);
    let to = SocketAddr::from((NODE6, 30080));
    let dns = SocketAddr::from((NODE6, 30053));
    let (uploads, answers) = ext
        .ns
        .run(move || {
            let up: Vec<_> = (0..12)
                .map(|_| tcp_upload(to, 256 * 1024, Duration::from_secs(5)))
                .collect();
            let udp: Vec<_> = (0..12)
                .map(|_| udp_request(dns, Duration::from_secs(2)))
                .collect();
            (up, udp)
        })
        .expect("client");
    let mut seen = BTreeSet::new();
    for u in uploads {
        let u = u.unwrap_or_else(|e| panic!("upload: {e}\n{}", agent.log_text()));
        assert!(u.sha256_matches, "the bytes arrived changed");
        assert!(
            u.answer.seen_client.starts_with(&format!("[{CLIENT6}]:")),
            "Local policy keeps the client's address, the backend saw {}",
            u.answer.seen_client
        );
        seen.insert(u.answer.backend);
    }
    assert!(seen.len() > 1, "only {seen:?} took uploads");
    let health = SocketAddr::from((NODE6, 32080));
    let hc = ext
        .ns
        .run(move || xlb_tests::http::get(health, Duration::from_secs(2)))
        .expect("client")
        .unwrap_or_else(|e| panic!("health check over IPv6: {e}\n{}", agent.log_text()));
    assert!(hc.starts_with("HTTP/1.1 200"), "{hc}");
    assert!(hc.contains("\"localEndpoints\": 3"), "{hc}");
    for a in answers {
        let a = a.unwrap_or_else(|e| panic!("UDP NodePort: {e}"));
        assert!(
            a.seen_client.starts_with(&format!("[{CLIENT6}]:")),
            "{}",
            a.seen_client
        );
    }
}

/// loadBalancerSourceRanges over IPv6: the external client gets through to the LoadBalancer
/// IP whose ranges hold it (keeping its address), its SYNs to the one whose ranges do not
/// are dropped (the connect times out; counted `src_denied`), and that Service's NodePort
/// ignores the ranges, as in kube-proxy.
#[test]
fn ipv6_source_ranges_admit_only_listed_external_clients() {
    if !require_root() {
        return;
    }
    let lab = Lab::build();
    let (ext, agent) = (&lab.ext, &lab.agent);
    let denied = |pins: &std::path::Path| {
        lb_userspace::list::counters(&xlb_tests::pins(pins))
            .expect("counters")
            .iter()
            .find(|c| c.reason == "src_denied")
            .map_or(0, |c| c.packets)
    };
    let before = denied(&agent.pins);
    let (open, closed, closed_np) = ext
        .ns
        .run(|| {
            (
                tcp_request(SocketAddr::from((OPEN6, 80)), Duration::from_secs(3)),
                tcp_request(SocketAddr::from((CLOSED6, 80)), Duration::from_millis(700)),
                tcp_request(SocketAddr::from((NODE6, 30082)), Duration::from_secs(3)),
            )
        })
        .expect("client");
    let open = open.unwrap_or_else(|e| panic!("inside the ranges: {e}\n{}", agent.log_text()));
    assert!(
        open.seen_client.starts_with(&format!("[{CLIENT6}]:")),
        "{}",
        open.seen_client
    );
    assert!(
        closed.is_err(),
        "outside the ranges must be dropped: {closed:?}"
    );
    assert!(denied(&agent.pins) > before, "the denied SYNs are counted");
    closed_np.unwrap_or_else(|e| panic!("the NodePort ignores source ranges: {e}"));
}

/// An IPv6 address added to the node's uplink after the agent started becomes a NodePort
/// address within a second: the external client reaches the NodePort on it. Removed, it
/// stops being one within a second.
#[test]
fn an_ipv6_address_added_after_start_is_a_node_port_address_within_a_second() {
    if !require_root() {
        return;
    }
    let mut lab = Lab::build();
    let added6 = Ipv6Addr::new(0xfd00, 0x192, 0, 0, 0, 0, 0, 2);
    let frontend = format!("[{added6}]:30080/TCP");
    let cidr = format!("{added6}/64");
    assert!(
        !lb_userspace::list::services(&xlb_tests::pins(&lab.agent.pins))
            .expect("rows")
            .iter()
            .any(|r| r.frontend == frontend),
        "{frontend} before the address exists"
    );
    // nodad: the address answers at once (no duplicate address detection on a lab link).
    lab.topo
        .node
        .ip(&["-6", "addr", "add", &cidr, "dev", "up0", "nodad"])
        .expect("add the address");
    let took = lab
        .agent
        .wait_for(Duration::from_secs(1), |rows| {
            rows.iter()
                .any(|r| r.frontend == frontend && r.backends.len() == 3)
        })
        .unwrap_or_else(|e| {
            panic!(
                "{frontend} not a NodePort within 1 s of the address: {e}\n{}",
                lab.agent.log_text()
            )
        });
    eprintln!("{frontend} programmed {took:?} after the address was added");
    let to = SocketAddr::from((added6, 30080));
    let answer = lab
        .ext
        .ns
        .run(move || tcp_request(to, Duration::from_secs(2)))
        .expect("client")
        .unwrap_or_else(|e| panic!("the NodePort on the added address: {e}"));
    assert!(
        answer.seen_client.starts_with(&format!("[{CLIENT6}]:")),
        "{}",
        answer.seen_client
    );
    lab.topo
        .node
        .ip(&["-6", "addr", "del", &cidr, "dev", "up0"])
        .expect("remove the address");
    let removed = Instant::now();
    lab.agent
        .wait_for(Duration::from_secs(1), |rows| {
            !rows.iter().any(|r| r.frontend == frontend)
        })
        .unwrap_or_else(|e| {
            panic!(
                "{frontend} still a NodePort 1 s after its address went: {e}\n{}",
                lab.agent.log_text()
            )
        });
    eprintln!(
        "{frontend} removed {:?} after the address",
        removed.elapsed()
    );
    // The node's first address still serves.
    let first = SocketAddr::from((NODE6, 30080));
    lab.ext
        .ns
        .run(move || tcp_request(first, Duration::from_secs(2)))
        .expect("client")
        .unwrap_or_else(|e| panic!("the NodePort on the node's first address: {e}"));
}
