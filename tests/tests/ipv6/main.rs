//! IPv6 and dual-stack through the socket hooks: a dual-stack Service (IPv6 first) reached
//! over IPv6 from the node itself and from a pod, TCP and unconnected UDP, each socket
//! seeing the frontend as its peer; its IPv4 ClusterIP keeps working beside it; IPv6
//! LoadBalancer IPs' source ranges apply to sockets at connect().

//!
//! One binary for IPv6 end to end: this file (the socket hooks, dual stack), `snat`
//! (NodePort SNAT to a remote backend across two nodes), `node_port` (NodePorts from outside
//! the node, address changes).

mod node_port;
mod snat;

use std::{
    collections::BTreeSet,
    net::{Ipv6Addr, SocketAddr},
    time::Duration,
};

use xlb_tests::{
    datapath::reason_counts,
    echo::EchoServer,
    probe::{self, Line},
    require_root,
    scenario::{Scenario, sock},
    services::write_atomic,
    topology::{pod_ip, pod_ip6},
};

const WEB6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x10);
const WEB4: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 96, 0, 10);
/// The ports the IPv6 echo servers of this test listen on: the lab's, on the pods' IPv6
/// addresses (the scenario's own echo servers hold them on IPv4).
const TCP6: u16 = 8080;
const UDP6: u16 = 5353;

fn dual_stack_yaml(backends4: &[std::net::Ipv4Addr], backends6: &[Ipv6Addr]) -> String {
    let mut y = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: test, name: web}}\nspec:\n  ipFamilyPolicy: PreferDualStack\n  ipFamilies: [IPv6, IPv4]\n  clusterIP: \"{WEB6}\"\n  clusterIPs: [\"{WEB6}\", \"{WEB4}\"]\n  ports:\n  - {{name: http, port: 80, protocol: TCP, targetPort: {TCP6}}}\n  - {{name: dns, port: 53, protocol: UDP, targetPort: {UDP6}}}\n"
    );
    for (family, addrs) in [
        (
            "IPv6",
            backends6.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        ),
        ("IPv4", backends4.iter().map(|a| a.to_string()).collect()),
    ] {
        y.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: test\n  name: web-{}\n  labels: {{kubernetes.io/service-name: web}}\naddressType: {family}\nports:\n- {{name: http, port: {TCP6}, protocol: TCP}}\n- {{name: dns, port: {UDP6}, protocol: UDP}}\nendpoints:\n",
            family.to_lowercase()
        ));
        for a in addrs {
            y.push_str(&format!(
                "- addresses: [\"{a}\"]\n  conditions: {{ready: true}}\n"
            ));
        }
    }
    y
}

/// A probe's answers from `what` to `vip`: every request answered, its socket seeing the
/// frontend, the backend seeing an IPv6 client (`client`, when given), over `spread_over`
/// backends.
fn check_answers(
    s: &Scenario,
    what: &str,
    lines: &[Line],
    vip: SocketAddr,
    client: Option<Ipv6Addr>,
    spread_over: usize,
) {
    check_answers_by(s, what, lines, vip, |_| client, spread_over);
}

/// As [`check_answers`], the client each backend must see given by `client_at(backend)`.
fn check_answers_by(
    s: &Scenario,
    what: &str,
    lines: &[Line],
    vip: SocketAddr,
    client_at: impl Fn(&str) -> Option<Ipv6Addr>,
    spread_over: usize,
) {
    let mut backends = BTreeSet::new();
    for l in lines {
        let Line::Ok {
            backend,
            seen_client,
            peer,
            ..
        } = l
        else {
            panic!("{what}: {l:?}\n{}", s.agent.log_text());
        };
        backends.insert(backend.clone());
        assert_eq!(*peer, vip, "{what}: the socket sees the frontend");
        let seen: SocketAddr = seen_client.parse().expect("client address");
        assert!(seen.is_ipv6(), "{what}: {seen}");
        if let Some(c) = client_at(backend) {
            assert_eq!(seen.ip(), c, "{what}: the client {backend} sees");
        }
    }
    assert_eq!(
        backends.len(),
        spread_over,
        "{what}: {backends:?} ({} requests)",
        lines.len()
    );
}

fn args(mode: &str, to: SocketAddr, n: u32) -> Vec<String> {
    vec![mode.into(), to.to_string(), n.to_string()]
}

/// The dual-stack Service on two backend pods with IPv6 addresses and echo servers on them
/// (the lab's dual-stack pods), the client pod with its IPv6 address, the agent started
/// with `extra` flags and every frontend programmed. Returns the scenario, the client
/// pod's IPv6 address and the IPv6 echo servers (running until dropped).
fn dual_stack(prefix: &str, extra: &[&str]) -> (Scenario, Ipv6Addr, Vec<EchoServer>) {
    let b4: Vec<_> = (2..4).map(pod_ip).collect();
    let b6: Vec<_> = (2..4).map(pod_ip6).collect();
    let mut s =
        Scenario::start_with(prefix, 2, &dual_stack_yaml(&b4, &b6), extra).expect("scenario");
    s.topo.dual_stack().expect("dual-stack pods");
    let mut servers = Vec::new();
    for pod in &s.topo.backends {
        let ip6 = pod.ip6.expect("a dual-stack backend");
        let server = EchoServer::start_at(&pod.ns, &pod.name, ip6.into(), TCP6, UDP6);
        servers.push(server.expect("IPv6 echo server"));
    }
    let client6 = s.topo.client.ip6.expect("a dual-stack client");
    for frontend in [
        format!("{}/TCP", SocketAddr::from((WEB6, 80))),
        format!("{}/UDP", SocketAddr::from((WEB6, 53))),
        "10.96.0.10:80/TCP".to_string(),
    ] {
        s.wait_backends(&frontend, 2, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{frontend} programmed: {e}\n{}", s.agent.log_text()));
    }
    (s, client6, servers)
}

#[test]
fn a_dual_stack_service_is_reached_over_ipv6_from_the_node_and_from_a_pod() {
    if !require_root() {
        return;
    }
    let (s, client6, _servers) = dual_stack("xv6", &[]);
    let web6 = SocketAddr::from((WEB6, 80));
    let dns6 = SocketAddr::from((WEB6, 53));
    let text = s.agent.log_text();
    assert!(
        !text.contains("IPv6 ClusterIP"),
        "no IPv6 frontend is skipped any more: {text}"
    );
    let cg = s.agent.cgroup.as_ref().expect("the agent's cgroup");
    let before = reason_counts(&s.agent.pins);
    for (origin, ns, client) in [
        ("node", &s.topo.node, None),
        ("pod", &s.topo.client.ns, Some(client6)),
    ] {
        for (mode, vip, spread_over) in [
            ("tcp", web6, 2),
            ("udp", dns6, 2),
            ("udp-unconnected", dns6, 1),
        ] {
            let lines = probe::run(cg, ns, &args(mode, vip, 30)).expect("probe");
            let what = format!("{origin} {mode}");
            check_answers(&s, &what, &lines, vip, client, spread_over);
        }
    }
    let after = reason_counts(&s.agent.pins);
    assert!(
        after["sock_xlate"] - before["sock_xlate"] >= 4 * 30,
        "{after:?}"
    );
    // The IPv4 ClusterIP of the same Service, beside it.
    let lines = probe::run(cg, &s.topo.node, &args("tcp", sock(WEB4, 80), 10)).expect("probe");
    assert!(
        lines.iter().all(|l| l.backend().is_some()),
        "IPv4 ClusterIP of the dual-stack Service: {lines:?}"
    );
}

/// With `--socket-lb host` a pod's sockets are not translated: its IPv6 connections to the
/// dual-stack Service go through tc at the host side of its veth (DNAT, conntrack, reverse
/// NAT of the replies). TCP and UDP spread over both backends, every backend sees the pod's
/// own address, the socket sees the frontend, `xlb list conntrack` shows the flows.
#[test]
fn a_pod_reaches_a_dual_stack_service_over_ipv6_through_tc() {
    if !require_root() {
        return;
    }
    let (s, client6, _servers) = dual_stack("xv6t", &["--socket-lb", "host"]);
    let cg = s.agent.cgroup.as_ref().expect("the agent's cgroup");
    let web6 = SocketAddr::from((WEB6, 80));
    let dns6 = SocketAddr::from((WEB6, 53));
    let before = reason_counts(&s.agent.pins);
    // The flows the probes opened: a client port the kernel hands out again for a later
    // socket continues the earlier flow of that tuple (counted established, not new).
    let mut tuples = BTreeSet::new();
    for (mode, vip, spread_over) in [("tcp", web6, 2), ("udp", dns6, 2)] {
        let lines = probe::run(cg, &s.topo.client.ns, &args(mode, vip, 30)).expect("probe");
        assert_eq!(lines.len(), 30, "{mode}");
        check_answers(&s, mode, &lines, vip, Some(client6), spread_over);
        for l in &lines {
            if let Line::Ok { seen_client, .. } = l {
                tuples.insert((mode, seen_client.clone()));
            }
        }
    }
    let after = reason_counts(&s.agent.pins);
    let delta = |r: &str| after[r] - before[r];
    assert_eq!(
        delta("sock_xlate"),
        0,
        "the pod's sockets are tc's: {after:?}"
    );
    assert!(
        tuples.len() > 50,
        "the probes' sockets reuse ports: {tuples:?}"
    );
    assert!(delta("new_flow") >= tuples.len() as u64, "{after:?}");
    assert!(delta("reverse_nat") >= 60, "{after:?}");
    assert!(delta("established") >= 30, "{after:?}");
    let flows =
        lb_userspace::list::conntrack(&xlb_tests::pins(&s.agent.pins)).expect("list conntrack");
    let v6 = flows
        .iter()
        .filter(|f| f.client.starts_with(&format!("[{client6}]:")))
        .count();
    // One flow per distinct tuple: a client port handed out again continues its flow.
    assert!(
        v6 >= tuples.len(),
        "IPv6 flows listed: {v6} of {} ({} tuples)",
        flows.len(),
        tuples.len()
    );

    // An IPv6 Service without endpoints refuses at once, through tc: a TCP RST, an ICMPv6
    // port unreachable that the pod's connected UDP socket reports.
    let empty6 = Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x99);
    let yaml = dual_stack_yaml(&[], &[])
        + &xlb_tests::services::service6_yaml("empty6", empty6, 80, "TCP", 8080, &[])
        + &xlb_tests::services::service6_yaml("emptyu6", empty6, 53, "UDP", 5353, &[]);
    xlb_tests::services::write_atomic(&s.yaml, &yaml).expect("yaml");
    let mut s = s;
    s.wait_backends(
        &format!("{}/UDP", SocketAddr::from((empty6, 53))),
        0,
        Duration::from_secs(10),
    )
    .expect("empty frontend programmed");
    let before = reason_counts(&s.agent.pins)["reject"];
    let cg = s.agent.cgroup.as_ref().expect("the agent's cgroup");
    for (mode, port) in [("tcp", 80), ("udp", 53)] {
        let to = SocketAddr::from((empty6, port));
        let lines = probe::run(cg, &s.topo.client.ns, &args(mode, to, 5)).expect("probe");
        assert_eq!(lines.len(), 5, "{mode}");
        for l in &lines {
            assert!(
                matches!(l, Line::Err { errno: 111, ms, .. } if *ms < 500.0),
                "{mode}: expected ECONNREFUSED at once, got {l:?}"
            );
        }
    }
    assert!(reason_counts(&s.agent.pins)["reject"] >= before + 10);
}

/// An IPv6 LoadBalancer Service `name` on `lb_ip` (ClusterIP `cluster_ip`, TCP 80 → the
/// IPv6 echo servers' port) admitting `range`, on `backends`.
fn load_balancer6(
    name: &str,
    (cluster_ip, lb_ip): (Ipv6Addr, Ipv6Addr),
    range: &str,
    backends: &[Ipv6Addr],
) -> String {
    let mut y = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: test, name: {name}}}\nspec:\n  type: LoadBalancer\n  ipFamilies: [IPv6]\n  clusterIP: \"{cluster_ip}\"\n  loadBalancerSourceRanges: [\"{range}\"]\n  ports:\n  - {{name: http, port: 80, protocol: TCP, targetPort: {TCP6}}}\nstatus:\n  loadBalancer:\n    ingress: [{{ip: \"{lb_ip}\"}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: test\n  name: {name}-1\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv6\nports:\n- {{name: http, port: {TCP6}, protocol: TCP}}\nendpoints:\n"
    );
    for a in backends {
        y.push_str(&format!(
            "- addresses: [\"{a}\"]\n  conditions: {{ready: true}}\n"
        ));
    }
    y
}

/// loadBalancerSourceRanges through the IPv6 socket hooks, as through the IPv4 ones: an
/// unbound socket's connect() to an IPv6 LoadBalancer IP is checked as the frontend address
/// (the node's own traffic, which kube-proxy admits when a range holds a node address), so
/// the LoadBalancer IP whose ranges hold it is reached, from the node and from a pod, and
/// the one whose ranges do not fails at once with EHOSTUNREACH, counted `src_denied`.
#[test]
fn ipv6_source_ranges_apply_to_sockets_at_connect() {
    if !require_root() {
        return;
    }
    let (mut s, _client6, _servers) = dual_stack("xv6r", &[]);
    let open = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 0x40);
    let closed = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 0x41);
    let cip = |last| Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, last);
    let b4: Vec<_> = (2..4).map(pod_ip).collect();
    let b6: Vec<_> = (2..4).map(pod_ip6).collect();
    let yaml = dual_stack_yaml(&b4, &b6)
        + &load_balancer6("open6", (cip(0x40), open), "2001:db8:100::/64", &b6)
        + &load_balancer6("closed6", (cip(0x41), closed), "2001:db8:dead::/48", &b6);
    xlb_tests::services::write_atomic(&s.yaml, &yaml).expect("yaml");
    for ip in [open, closed] {
        let frontend = format!("{}/TCP", SocketAddr::from((ip, 80)));
        s.wait_backends(&frontend, 2, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{frontend} programmed: {e}\n{}", s.agent.log_text()));
    }
    let cg = s.agent.cgroup.as_ref().expect("the agent's cgroup");
    let before = reason_counts(&s.agent.pins);
    for (who, ns) in [("node", &s.topo.node), ("pod", &s.topo.client.ns)] {
        let to = SocketAddr::from((open, 80));
        // 30 requests: all on one of the two backends by chance is 2 in 2^30 (10 made it
        // 1 in 512, and CI met it).
        let lines = probe::run(cg, ns, &args("tcp", to, 30)).expect("probe");
        assert_eq!(lines.len(), 30, "{who}");
        let what = format!("{who} to the LoadBalancer IP its ranges admit");
        check_answers(&s, &what, &lines, to, None, 2);
        let to = SocketAddr::from((closed, 80));
        let lines = probe::run(cg, ns, &args("tcp", to, 5)).expect("probe");
        assert_eq!(lines.len(), 5, "{who}");
        for l in &lines {
            assert!(
                matches!(l, Line::Err { errno: 113, ms, .. } if *ms < 100.0),
                "{who}: expected EHOSTUNREACH at once, got {l:?}"
            );
        }
    }
    let after = reason_counts(&s.agent.pins);
    assert!(
        after["src_denied"] - before["src_denied"] >= 10,
        "{after:?}"
    );
}

/// Hairpin over IPv6, through tc: a backend pod reaching its own Service sometimes lands on
/// itself; that flow comes from the IPv6 hairpin address (the pod would take a packet from
/// its own address for its own), the others from the pod's address, and every socket sees
/// the frontend.
#[test]
fn a_pod_reaches_itself_through_its_dual_stack_service_over_ipv6() {
    if !require_root() {
        return;
    }
    let (s, _client6, _servers) = dual_stack("xv6h", &["--socket-lb", "host"]);
    let cg = s.agent.cgroup.as_ref().expect("the agent's cgroup");
    let hairpin6: Ipv6Addr = "fd00:a9fe:2a::1".parse().expect("address");
    let pod = &s.topo.backends[0];
    let own6 = pod.ip6.expect("a dual-stack backend");
    for (mode, port) in [("tcp", 80), ("udp", 53)] {
        let vip = SocketAddr::from((WEB6, port));
        let lines = probe::run(cg, &pod.ns, &args(mode, vip, 30)).expect("probe");
        assert_eq!(lines.len(), 30, "{mode}");
        // Both backends answer: the pod itself (from the hairpin address) and the other.
        let client_at = |b: &str| Some(if b == pod.name { hairpin6 } else { own6 });
        check_answers_by(&s, mode, &lines, vip, client_at, 2);
    }
}

/// A pod's connected IPv6 UDP socket on a backend that leaves the Service is destroyed (its
/// next call fails) and its next socket goes to the live backend within a second: the agent
/// finds IPv6 sockets by every word of their addresses and searches IPv6 sockets too.
#[test]
fn a_connected_ipv6_udp_socket_leaves_a_removed_backend_within_a_second() {
    if !require_root() {
        return;
    }
    let (s, _client6, _servers) = dual_stack("xv6u", &[]);
    let cg = s.agent.cgroup.as_ref().expect("the agent's cgroup");
    let (rx, on, index) = probe::udp_stay(cg, &s.topo.client.ns, SocketAddr::from((WEB6, 53)));
    // Remove the backend this socket is connected to from the IPv6 slice (its pod keeps
    // serving: a socket left on it would go on getting answers from it).
    let gone = s.topo.backends[index - 1]
        .ip6
        .expect("a dual-stack backend");
    let b4: Vec<_> = s.topo.backends.iter().map(|b| b.ip).collect();
    let b6: Vec<_> = s
        .topo
        .backends
        .iter()
        .filter_map(|b| b.ip6)
        .filter(|ip| *ip != gone)
        .collect();
    write_atomic(&s.yaml, &dual_stack_yaml(&b4, &b6)).expect("write");
    let removed = std::time::Instant::now();
    let after: Vec<(std::time::Instant, Line)> = rx.iter().collect();
    probe::assert_left_removed_backend("pod", &on, removed, &after, &s.agent.log_text());
}
