//! North-south traffic on two nodes (`xlb_tests::twonode`): an external client on node1's
//! uplink reaches NodePort, externalIP and LoadBalancer frontends whose backends live on node1
//! or on node2 (across an underlay). Every answer says which client address the backend saw.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::Duration,
};

use xlb_tests::{
    capture::Capture,
    client::{Answer, tcp_request, tcp_upload, udp_request},
    require_root,
    scenario::{TCP_PORT, UDP_PORT, sock},
    services::service_on_nodes,
    topology::{NODE1_UNDERLAY, pod_ip, remote_pod_ip},
    twonode::{Lab, SNAT_PORTS, web_node_port},
};

const TIMEOUT: Duration = Duration::from_secs(2);
const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);

/// A backend endpoint: its address and node.
type Ep = (Ipv4Addr, &'static str);

fn local() -> Ep {
    (pod_ip(2), "node1")
}

fn remote() -> Ep {
    (remote_pod_ip(1), "node2")
}

/// A Service of `kind` with one port and its EndpointSlice, as YAML (`node_port` 0: none).
#[allow(clippy::too_many_arguments)]
fn service(
    name: &str,
    kind: &str,
    cluster_ip: &str,
    proto: &str,
    port: u16,
    target: u16,
    node_port: u16,
    spec: &str,
    status: &str,
    eps: &[Ep],
) -> String {
    service_on_nodes(
        name,
        kind,
        cluster_ip,
        proto,
        port,
        target,
        (node_port != 0).then_some(node_port),
        spec,
        status,
        eps,
    )
}

fn seen_ip(a: &Answer) -> IpAddr {
    a.seen_client
        .parse::<SocketAddr>()
        .map(|s| s.ip())
        .unwrap_or_else(|e| panic!("bad seen address {:?}: {e}", a.seen_client))
}

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
    if !require_root("cluster_policy_snats_only_flows_to_remote_backends") {
        return;
    }
    let yaml = web_node_port(&[local(), remote()])
        + &service(
            "dns",
            "NodePort",
            "10.96.0.53",
            "UDP",
            53,
            UDP_PORT,
            30053,
            "",
            "",
            &[local(), remote()],
        );
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
    let flows = lb_userspace::list::conntrack(&lab.agent.pins).expect("conntrack");
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
    if !require_root("snat_ports_never_collide_and_a_full_range_is_refused_cleanly") {
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
    if !require_root(
        "local_policy_keeps_the_client_address_and_health_checks_tell_the_load_balancer",
    ) {
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
            http_get(sock(NODE_IP, 32001)),
            http_get(sock(NODE_IP, 32002)),
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

/// One GET; the whole response as text.
fn http_get(to: SocketAddr) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&to, TIMEOUT)
        .map_err(|e| format!("connect {to}: {e}"))?;
    s.set_read_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

/// loadBalancerSourceRanges: a client inside the ranges gets through, one outside is
/// dropped (and counted); the NodePort of the same Service ignores the ranges, as in
/// kube-proxy.
#[test]
fn source_ranges_admit_only_listed_clients_on_load_balancer_ips() {
    if !require_root("source_ranges_admit_only_listed_clients_on_load_balancer_ips") {
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
    if !require_root("a_pod_reaches_itself_through_its_service") {
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
    if !require_root("icmp_errors_from_backends_reach_the_client_translated") {
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
    if !require_root("path_mtu_discovery_works_through_a_node_port") {
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

/// One Service per frontend type and backend place: ClusterIP (from a pod), NodePort,
/// externalIP and LoadBalancer, each to a local or a remote backend.
fn matrix_services() -> String {
    let mut y = String::new();
    for (i, (place, ep)) in [("local", local()), ("remote", remote())]
        .into_iter()
        .enumerate()
    {
        let i = i as u16;
        y += &service(
            &format!("m-{place}"),
            "LoadBalancer",
            &format!("10.96.1.{}", 10 + i),
            "TCP",
            80,
            TCP_PORT,
            30100 + i,
            &format!("  externalIPs: [198.51.100.{}]\n", 40 + i),
            &format!(
                "status:\n  loadBalancer:\n    ingress: [{{ip: 198.51.100.{}}}]\n",
                50 + i
            ),
            &[ep],
        );
    }
    y
}

/// The frontends of [`matrix_services`] for backend place `i` (0 local, 1 remote), with
/// whether the client is the pod (ClusterIP) or the external client.
fn matrix_frontends(i: u8) -> [(&'static str, SocketAddr, bool); 4] {
    [
        (
            "ClusterIP",
            sock(Ipv4Addr::new(10, 96, 1, 10 + i), 80),
            true,
        ),
        ("NodePort", sock(NODE_IP, 30100 + i as u16), false),
        (
            "externalIP",
            sock(Ipv4Addr::new(198, 51, 100, 40 + i), 80),
            false,
        ),
        (
            "LoadBalancer",
            sock(Ipv4Addr::new(198, 51, 100, 50 + i), 80),
            false,
        ),
    ]
}

/// Checksum offload on or off on every veth changes nothing: a 10 MB upload through each
/// frontend type, to a local and to a remote backend, arrives with its SHA-256, with tc only
/// and with XDP.
#[test]
fn checksum_offload_on_or_off_changes_nothing() {
    if !require_root("checksum_offload_on_or_off_changes_nothing") {
        return;
    }
    for xdp in ["off", "native"] {
        let lab = Lab::start_with(
            "nsk",
            &matrix_services(),
            1500,
            "198.51.100.51:80/TCP",
            &["--xdp", xdp],
        );
        if xdp != "off" {
            lab.enable_napi_for_redirects();
        }
        for offload in [true, false] {
            lab.set_offload(offload);
            for (i, want) in [(0u8, "backend-1"), (1, "n2-backend-1")] {
                for (kind, to, from_pod) in matrix_frontends(i) {
                    let run = move || tcp_upload(to, 10 << 20, Duration::from_secs(20));
                    let r = if from_pod {
                        lab.topo.client.ns.run(run).expect("pod thread")
                    } else {
                        lab.outside(run)
                    };
                    let what = format!("xdp {xdp}, offload {offload}, {kind} {to} → {want}");
                    let up = r.unwrap_or_else(|e| panic!("{what}: {e}\n{}", lab.agent.log_text()));
                    assert_eq!(up.answer.backend, want, "{what}");
                    assert!(up.sha256_matches, "{what}: the bytes arrived changed");
                }
            }
        }
        if xdp != "off" {
            assert!(
                lab.counter("xdp_redirect") > 0,
                "with offload off, XDP itself forwards the remote flows"
            );
        }
    }
}

/// XDP in native and in generic mode carries NodePort traffic for new and established flows
/// and the replies of SNATed flows, redirecting them itself (`xdp_redirect`), with the same
/// client addresses as tc.
#[test]
fn xdp_native_and_generic_forward_node_port_flows() {
    if !require_root("xdp_native_and_generic_forward_node_port_flows") {
        return;
    }
    for mode in ["native", "generic"] {
        let yaml = web_node_port(&[local(), remote()])
            + &service(
                "dns",
                "NodePort",
                "10.96.0.53",
                "UDP",
                53,
                UDP_PORT,
                30053,
                "",
                "",
                &[remote()],
            );
        let lab = Lab::start_with("nsx", &yaml, 1500, "192.0.2.1:30053/UDP", &["--xdp", mode]);
        lab.enable_napi_for_redirects();
        // Complete checksums (no offload) on the way in, so XDP takes the packets itself.
        lab.set_offload(false);
        let log = lab.agent.log_text();
        assert!(
            log.contains("attached XDP"),
            "{mode}: XDP not attached:\n{log}"
        );
        let capture = Capture::start(&lab.ext.ns, "eth0").expect("capture");
        let answers = lab.outside(|| {
            let mut out = Vec::new();
            for _ in 0..30 {
                out.push(tcp_request(sock(NODE_IP, 30080), TIMEOUT));
                out.push(udp_request(sock(NODE_IP, 30053), TIMEOUT));
            }
            out
        });
        capture.finish().expect("capture").assert_inbound_only_from(
            &[sock(NODE_IP, 30080), sock(NODE_IP, 30053)],
            60,
            &format!("{mode}: replies at the external client"),
        );
        let mut reached = std::collections::BTreeSet::new();
        for a in answers {
            let a = a.unwrap_or_else(|e| panic!("{mode}: {e}\n{}", lab.agent.log_text()));
            let want = if a.backend == "backend-1" {
                IpAddr::V4(CLIENT_IP)
            } else {
                IpAddr::V4(NODE1_UNDERLAY)
            };
            assert_eq!(seen_ip(&a), want, "{mode}: {a:?}");
            reached.insert(a.backend);
        }
        assert_eq!(reached.len(), 2, "{mode}: {reached:?}");
        assert!(
            lab.counter("xdp_redirect") > 0,
            "{mode}: XDP redirected nothing\n{}",
            lab.agent.log_text()
        );
    }
}

/// No endpoints: NodePort and LoadBalancer frontends refuse at once too (TCP RST, ICMP port
/// unreachable from the frontend), as kube-proxy's REJECT does.
#[test]
fn node_ports_and_load_balancer_ips_without_endpoints_refuse_at_once() {
    if !require_root("node_ports_and_load_balancer_ips_without_endpoints_refuse_at_once") {
        return;
    }
    let empty = |name: &str, vip: &str, proto: &str, np: u16, lb: &str| {
        service(
            name,
            "LoadBalancer",
            vip,
            proto,
            80,
            TCP_PORT,
            np,
            "",
            &format!("status:\n  loadBalancer:\n    ingress: [{{ip: {lb}}}]\n"),
            &[],
        )
    };
    let yaml = empty("tcp", "10.96.0.60", "TCP", 30060, "198.51.100.60")
        + &empty("udp", "10.96.0.61", "UDP", 30061, "198.51.100.61");
    let lab = Lab::start("nse", &yaml, 1500, "198.51.100.61:80/UDP");
    let results = lab.outside(|| {
        [
            sock(NODE_IP, 30060),
            sock(Ipv4Addr::new(198, 51, 100, 60), 80),
        ]
        .map(|to| {
            let t = std::time::Instant::now();
            (to, tcp_request(to, TIMEOUT), t.elapsed())
        })
        .into_iter()
        .chain(
            [
                sock(NODE_IP, 30061),
                sock(Ipv4Addr::new(198, 51, 100, 61), 80),
            ]
            .map(|to| {
                let t = std::time::Instant::now();
                (to, udp_request(to, TIMEOUT), t.elapsed())
            }),
        )
        .collect::<Vec<_>>()
    });
    for (to, r, took) in results {
        let err = r.expect_err("no endpoints");
        assert!(err.contains("refused"), "{to}: must be refused: {err}");
        assert!(
            took < Duration::from_millis(500),
            "{to}: refusal took {took:?}"
        );
    }
    assert!(lab.counter("reject") >= 4, "the refusals are counted");
}
