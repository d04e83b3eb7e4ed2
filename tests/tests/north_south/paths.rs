//! Source ranges on LoadBalancer IPs, hairpin through a service, ICMP errors translated
//! back, path MTU discovery through a NodePort.

use std::{
    net::{IpAddr, Ipv4Addr},
    time::Duration,
};

use xlb_tests::suites::north_south::{
    CLIENT_IP, NODE_IP, TIMEOUT, local, remote, seen_ip, service,
};
use xlb_tests::{
    client::{tcp_request, tcp_upload, udp_request},
    require_root,
    scenario::{TCP_PORT, UDP_PORT, sock},
    twonode::{Lab, web_node_port},
};

/// loadBalancerSourceRanges: a client inside the ranges gets through, one outside is
/// dropped (and counted); the NodePort of the same Service ignores the ranges, as in
/// kube-proxy.
#[test]
fn source_ranges_admit_only_listed_clients_on_load_balancer_ips() {
    if !require_root() {
        return;
    }
    let lb = |name: &str, ip: &str, vip: &str, np: u16, range: &str| {
        service(
            name,
            "LoadBalancer",
            vip,
            "TCP",
            80,
            TCP_PORT,
            np,
            &format!("  loadBalancerSourceRanges: [\"{range}\"]\n"),
            &format!("status:\n  loadBalancer:\n    ingress: [{{ip: {ip}}}]\n"),
            &[local()],
        )
    };
    let yaml = lb("open", "198.51.100.30", "10.96.0.30", 30090, "192.0.2.0/24")
        + &lb(
            "closed",
            "198.51.100.31",
            "10.96.0.31",
            30091,
            "203.0.113.0/24",
        );
    let lab = Lab::start("nsr", &yaml, 1500, "198.51.100.31:80/TCP");
    let (open, closed, closed_np) = lab.outside(|| {
        (
            tcp_request(sock(Ipv4Addr::new(198, 51, 100, 30), 80), TIMEOUT),
            tcp_request(
                sock(Ipv4Addr::new(198, 51, 100, 31), 80),
                Duration::from_millis(700),
            ),
            tcp_request(sock(NODE_IP, 30091), TIMEOUT),
        )
    });
    let open = open.unwrap_or_else(|e| panic!("inside the ranges: {e}\n{}", lab.agent.log_text()));
    assert_eq!(seen_ip(&open), IpAddr::V4(CLIENT_IP));
    assert!(
        closed.is_err(),
        "outside the ranges must be dropped: {closed:?}"
    );
    assert!(lab.counter("src_denied") > 0, "the denied SYNs are counted");
    closed_np.unwrap_or_else(|e| panic!("the NodePort ignores source ranges: {e}"));
}

/// Hairpin: a pod reaching itself through its own Service is SNATed to the hairpin address
/// (it would drop a packet from its own address), and gets its answer from the ClusterIP.
#[test]
fn a_pod_reaches_itself_through_its_service() {
    if !require_root() {
        return;
    }
    let yaml = service(
        "self",
        "ClusterIP",
        "10.96.0.40",
        "TCP",
        80,
        TCP_PORT,
        0,
        "",
        "",
        &[local()],
    ) + &service(
        "selfudp",
        "ClusterIP",
        "10.96.0.41",
        "UDP",
        53,
        UDP_PORT,
        0,
        "",
        "",
        &[local()],
    );
    let lab = Lab::start("nsh", &yaml, 1500, "10.96.0.41:53/UDP");
    let backend = &lab.topo.backends[0];
    let answers = backend
        .ns
        .run(|| {
            let vip = Ipv4Addr::new(10, 96, 0, 40);
            let dns = Ipv4Addr::new(10, 96, 0, 41);
            (0..5)
                .flat_map(|_| {
                    [
                        tcp_request(sock(vip, 80), TIMEOUT),
                        udp_request(sock(dns, 53), TIMEOUT),
                    ]
                })
                .collect::<Vec<_>>()
        })
        .expect("pod thread");
    for a in answers {
        let a = a.unwrap_or_else(|e| panic!("hairpin: {e}\n{}", lab.agent.log_text()));
        assert_eq!(a.backend, "backend-1");
        assert_eq!(
            seen_ip(&a),
            IpAddr::V4(Ipv4Addr::new(169, 254, 42, 1)),
            "the pod sees its hairpin flow come from the hairpin address"
        );
    }
}

/// ICMP errors about translated flows are translated back: a UDP datagram to a port nobody
/// listens on at the backend comes back to the client as "connection refused", from the
/// frontend, for a remote (SNATed) backend and for a local one.
#[test]
fn icmp_errors_from_backends_reach_the_client_translated() {
    if !require_root() {
        return;
    }
    // Port 9 has no listener on the backends.
    let yaml = service(
        "far",
        "NodePort",
        "10.96.0.50",
        "UDP",
        53,
        9,
        30050,
        "",
        "",
        &[remote()],
    ) + &service(
        "near",
        "NodePort",
        "10.96.0.51",
        "UDP",
        53,
        9,
        30051,
        "",
        "",
        &[local()],
    );
    let lab = Lab::start("nsi", &yaml, 1500, "192.0.2.1:30051/UDP");
    let (far, near) = lab.outside(|| {
        (
            udp_request(sock(NODE_IP, 30050), TIMEOUT),
            udp_request(sock(NODE_IP, 30051), TIMEOUT),
        )
    });
    for (what, r) in [("remote", far), ("local", near)] {
        let err = r.expect_err("nobody listens on the backend port");
        assert!(
            err.contains("refused"),
            "{what} backend: the port unreachable must reach the client's socket: {err}"
        );
    }
    assert!(
        lab.counter("icmp_xlate") >= 2,
        "translated ICMP errors are counted"
    );
}

/// Path-MTU discovery through a service: the underlay to node2 has a 1280-byte MTU, which
/// neither end's interface shows. A 1 MB upload through the NodePort to the remote backend
/// only completes if the client learns the path MTU from an ICMP message about its own flow.
#[test]
fn path_mtu_discovery_works_through_a_node_port() {
    if !require_root() {
        return;
    }
    let yaml = web_node_port(&[remote()]);
    let lab = Lab::start("nsm", &yaml, 1280, "192.0.2.1:30080/TCP");
    let up = lab.outside(|| tcp_upload(sock(NODE_IP, 30080), 1 << 20, Duration::from_secs(10)));
    let up = up.unwrap_or_else(|e| panic!("1 MB upload: {e}\n{}", lab.agent.log_text()));
    assert_eq!(up.answer.backend, "n2-backend-1");
    assert!(up.sha256_matches, "the backend received different bytes");
    assert!(
        lab.counter("frag_needed") > 0,
        "the client was told the path MTU"
    );
}
