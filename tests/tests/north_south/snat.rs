//! External clients across two nodes: SNAT to remote backends only, SNAT ports that never
//! collide, externalTrafficPolicy Local and its health checks.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::Duration,
};

use xlb_tests::suites::north_south::{
    CLIENT_IP, NODE_IP, TIMEOUT, local, remote, seen_ip, service,
};
use xlb_tests::{
    capture::Capture,
    client::{Answer, tcp_request, udp_request},
    require_root,
    scenario::{TCP_PORT, sock},
    topology::NODE1_UNDERLAY,
    twonode::{Lab, SNAT_PORTS, dns_node_port, web_node_port},
};

fn seen_port(a: &Answer) -> u16 {
    a.seen_client
        .parse::<SocketAddr>()
        .map(|s| s.port())
        .unwrap_or_default()
}

/// externalTrafficPolicy Cluster: a remote backend sees the node's underlay address with a
/// port from the SNAT range (its replies must come back through node1); a local backend sees
/// the client. The client always sees the NodePort address.
#[test]
fn cluster_policy_snats_only_flows_to_remote_backends() {
    if !require_root() {
        return;
    }
    let yaml = web_node_port(&[local(), remote()]) + &dns_node_port(&[local(), remote()]);
    let lab = Lab::start("nsc", &yaml, 1500, "192.0.2.1:30053/UDP");
    let capture = Capture::start(&lab.ext.ns, "eth0").expect("capture");
    let answers = lab.outside(|| {
        let mut out = Vec::new();
        for _ in 0..40 {
            out.push(("TCP", tcp_request(sock(NODE_IP, 30080), TIMEOUT)));
            out.push(("UDP", udp_request(sock(NODE_IP, 30053), TIMEOUT)));
        }
        out
    });
    // Replies of local and of SNATed flows alike reach the client from the NodePort.
    capture.finish().expect("capture").assert_inbound_only_from(
        &[sock(NODE_IP, 30080), sock(NODE_IP, 30053)],
        80,
        "replies at the external client",
    );
    let mut reached = std::collections::BTreeSet::new();
    for (proto, a) in answers {
        let a = a.unwrap_or_else(|e| panic!("{proto}: {e}\n{}", lab.agent.log_text()));
        match a.backend.as_str() {
            "backend-1" => assert_eq!(
                seen_ip(&a),
                IpAddr::V4(CLIENT_IP),
                "{proto}: a local backend must see the client: {a:?}"
            ),
            "n2-backend-1" => {
                assert_eq!(
                    seen_ip(&a),
                    IpAddr::V4(NODE1_UNDERLAY),
                    "{proto}: a remote backend must see node1's address: {a:?}"
                );
                let p = seen_port(&a);
                assert!(
                    (SNAT_PORTS.0..=SNAT_PORTS.1).contains(&p),
                    "{proto}: SNAT port {p} outside the range {SNAT_PORTS:?}"
                );
            }
            other => panic!("unexpected backend {other}"),
        }
        reached.insert((proto, a.backend));
    }
    assert_eq!(
        reached.len(),
        4,
        "both backends over both protocols: {reached:?}"
    );
    // Conntrack shows the SNAT of the remote flows.
    let flows =
        lb_userspace::list::conntrack(&xlb_tests::pins(&lab.agent.pins)).expect("conntrack");
    assert!(
        flows
            .iter()
            .any(|f| f.snat.starts_with(&format!("{NODE1_UNDERLAY}:"))),
        "no SNATed flow listed: {flows:?}"
    );
}

/// Many concurrent flows from one client to one remote backend each get their own SNAT port:
/// the range is small, and every connection stays open while the next ones are made.
#[test]
fn snat_ports_never_collide_and_a_full_range_is_refused_cleanly() {
    if !require_root() {
        return;
    }
    let yaml = web_node_port(&[remote()]);
    let lab = Lab::start("nsp", &yaml, 1500, "192.0.2.1:30080/TCP");
    let range = (SNAT_PORTS.1 - SNAT_PORTS.0 + 1) as usize;
    let (seen, overflow) = lab.outside(move || {
        use std::io::{BufRead, BufReader, Write};
        let mut open = Vec::new();
        let mut seen = Vec::new();
        for _ in 0..range {
            let mut s = std::net::TcpStream::connect_timeout(&sock(NODE_IP, 30080), TIMEOUT)
                .expect("connect");
            s.set_read_timeout(Some(TIMEOUT)).expect("timeout");
            s.write_all(b"hi\n").expect("send");
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line).expect("read");
            seen.push(
                line.split_whitespace()
                    .nth(1)
                    .unwrap_or_default()
                    .to_string(),
            );
            open.push(s);
        }
        // The range is used up while all of them are open: one more cannot get a port.
        let overflow = tcp_request(sock(NODE_IP, 30080), Duration::from_millis(500));
        (seen, overflow)
    });
    // What the backend saw: each flow from node1's underlay address, on a port of the range,
    // no port twice.
    let mut ports = std::collections::BTreeSet::new();
    for s in &seen {
        let from: SocketAddr = s
            .parse()
            .unwrap_or_else(|e| panic!("the backend reported {s:?}: {e}"));
        assert_eq!(
            from.ip(),
            IpAddr::V4(NODE1_UNDERLAY),
            "the remote backend must see node1's address"
        );
        assert!(
            (SNAT_PORTS.0..=SNAT_PORTS.1).contains(&from.port()),
            "SNAT port {} outside the range {SNAT_PORTS:?}",
            from.port()
        );
        ports.insert(from.port());
    }
    assert_eq!(
        (seen.len(), ports.len()),
        (range, range),
        "{range} open flows must hold {range} distinct SNAT ports: {ports:?}"
    );
    assert!(
        overflow.is_err(),
        "a flow beyond the SNAT range must not get through: {overflow:?}"
    );
    assert!(
        lab.counter("snat_failed") > 0,
        "the refused flow is counted as snat_failed"
    );
}

/// externalTrafficPolicy Local: only local endpoints, the client address preserved; a node
/// without a local endpoint drops (no refusal); the health-check node port says which.
#[test]
fn local_policy_keeps_the_client_address_and_health_checks_tell_the_load_balancer() {
    if !require_root() {
        return;
    }
    let local_spec =
        |hc: u16| format!("  externalTrafficPolicy: Local\n  healthCheckNodePort: {hc}\n");
    let yaml = service(
        "near",
        "LoadBalancer",
        "10.96.0.10",
        "TCP",
        80,
        TCP_PORT,
        30080,
        &local_spec(32001),
        "status:\n  loadBalancer:\n    ingress: [{ip: 198.51.100.20}]\n",
        &[local(), remote()],
    ) + &service(
        "far",
        "LoadBalancer",
        "10.96.0.11",
        "TCP",
        80,
        TCP_PORT,
        30081,
        &local_spec(32002),
        "",
        &[remote()],
    );
    let lab = Lab::start("nsl", &yaml, 1500, "192.0.2.1:30081/TCP");
    let (near, lb, far) = lab.outside(|| {
        let near: Vec<_> = (0..20)
            .map(|_| tcp_request(sock(NODE_IP, 30080), TIMEOUT))
            .collect();
        let lb: Vec<_> = (0..10)
            .map(|_| tcp_request(sock(Ipv4Addr::new(198, 51, 100, 20), 80), TIMEOUT))
            .collect();
        let far = tcp_request(sock(NODE_IP, 30081), Duration::from_millis(700));
        (near, lb, far)
    });
    for a in near.into_iter().chain(lb) {
        let a = a.unwrap_or_else(|e| panic!("{e}\n{}", lab.agent.log_text()));
        assert_eq!(
            a.backend, "backend-1",
            "Local policy uses local endpoints only"
        );
        assert_eq!(
            seen_ip(&a),
            IpAddr::V4(CLIENT_IP),
            "client address preserved"
        );
    }
    let err = far.expect_err("no local endpoint: the node must not serve it");
    assert!(
        err.contains("timed out")
            || err.contains("WouldBlock")
            || err.contains("Resource temporarily"),
        "dropped, not refused: {err}"
    );
    // The health-check node ports, as a cloud load balancer probes them.
    let (near_hc, far_hc) = lab.outside(|| {
        (
            xlb_tests::http::get(sock(NODE_IP, 32001), TIMEOUT),
            xlb_tests::http::get(sock(NODE_IP, 32002), TIMEOUT),
        )
    });
    let near_hc = near_hc.expect("near health check");
    assert!(near_hc.starts_with("HTTP/1.1 200"), "{near_hc}");
    assert!(near_hc.contains("\"localEndpoints\": 1"), "{near_hc}");
    assert!(near_hc.contains("\"name\": \"near\""), "{near_hc}");
    let far_hc = far_hc.expect("far health check");
    assert!(far_hc.starts_with("HTTP/1.1 503"), "{far_hc}");
    assert!(far_hc.contains("\"localEndpoints\": 0"), "{far_hc}");
}
