//! Direct server return (`--lb-mode dsr|hybrid`, IPv4): an external client reaches a
//! NodePort on node1 whose backend is on node2; node1 forwards the client's packets with
//! the client kept as source and the frontend in an IPv4 option on the packets node2 learns
//! the flow from; node2's agent records the flow and its backend's replies leave node2
//! straight to the client with the NodePort as source: none come back through node1.

use std::net::{IpAddr, SocketAddr};

use xlb_tests::suites::north_south::{CLIENT_IP, NODE_IP, TIMEOUT, remote, seen_ip};
use xlb_tests::{
    capture::Capture,
    client::{tcp_request, tcp_upload, udp_request},
    require_root,
    scenario::sock,
    topology::NODE1_UNDERLAY,
    twonode::{Lab, dns_node_port, web_node_port},
};

/// web (NodePort 30080/TCP) and dns (NodePort 30053/UDP), each on node2's pod only.
fn services() -> String {
    web_node_port(&[remote()]) + &dns_node_port(&[remote()])
}

/// The lab with node1's agent in `mode` and node2's agent, node2's own way to the client.
fn lab(prefix: &str, mode: &str) -> Lab {
    let mut lab = Lab::start_with(
        prefix,
        &services(),
        1500,
        "192.0.2.1:30053/UDP",
        &["--lb-mode", mode],
    );
    lab.direct_return("10.0.0.2:30053/UDP", &["--lb-mode", mode]);
    lab
}

#[test]
fn dsr_replies_leave_the_backends_node_straight_to_the_client() {
    if !require_root("dsr_replies_leave_the_backends_node_straight_to_the_client") {
        return;
    }
    let lab = lab("nsdsr", "dsr");
    let via_node1 = Capture::start(&lab.ext.ns, "eth0").expect("capture");
    let via_node2 = Capture::start(&lab.ext.ns, "eth1").expect("capture");
    let (tcp, udp, uploads) = lab.outside(|| {
        let tcp: Vec<_> = (0..20)
            .map(|_| tcp_request(sock(NODE_IP, 30080), TIMEOUT))
            .collect();
        let udp: Vec<_> = (0..20)
            .map(|_| udp_request(sock(NODE_IP, 30053), TIMEOUT))
            .collect();
        let uploads: Vec<_> = [1usize << 10, 1 << 20, 4 << 20]
            .into_iter()
            .map(|len| {
                tcp_upload(
                    sock(NODE_IP, 30080),
                    len,
                    std::time::Duration::from_secs(10),
                )
            })
            .collect();
        (tcp, udp, uploads)
    });
    // The backend saw the client itself: no SNAT.
    for a in tcp.iter().chain(&udp) {
        let a = a.as_ref().expect("an answer");
        assert_eq!(seen_ip(a), IpAddr::V4(CLIENT_IP), "{a:?}");
    }
    for u in &uploads {
        let u = u.as_ref().expect("an upload");
        assert!(u.sha256_matches, "{u:?}");
    }
    // Every reply came in on node2's link, from the NodePort; none on node1's.
    let node1 = via_node1.finish().expect("capture");
    let from_frontend: Vec<_> = node1
        .inbound()
        .filter(|p| p.src.ip() == IpAddr::V4(NODE_IP))
        .collect();
    assert!(
        from_frontend.is_empty(),
        "{} replies came back through node1, first {:?}",
        from_frontend.len(),
        from_frontend.first()
    );
    let node2 = via_node2.finish().expect("capture");
    node2.assert_inbound_only_from(
        &[
            SocketAddr::from((NODE_IP, 30080)),
            SocketAddr::from((NODE_IP, 30053)),
        ],
        60,
        "DSR replies",
    );
    // node1 added the option to 20 SYNs and 20 datagrams (and the uploads' SYNs); node2
    // learnt each flow from it.
    assert!(lab.counter("dsr_out") >= 43, "{}", lab.counter("dsr_out"));
    let node2_agent = lab.node2_agent.as_ref().expect("node2's agent");
    let learnt = xlb_tests::datapath::reason_counts(&node2_agent.pins)["dsr_in"];
    assert!(learnt >= 43, "node2 learnt {learnt} flows");
}

#[test]
fn hybrid_sends_tcp_direct_and_snats_udp() {
    if !require_root("hybrid_sends_tcp_direct_and_snats_udp") {
        return;
    }
    let lab = lab("nshyb", "hybrid");
    let (tcp, udp) = lab.outside(|| {
        (
            tcp_request(sock(NODE_IP, 30080), TIMEOUT),
            udp_request(sock(NODE_IP, 30053), TIMEOUT),
        )
    });
    assert_eq!(
        seen_ip(&tcp.expect("TCP answer")),
        IpAddr::V4(CLIENT_IP),
        "TCP by DSR"
    );
    assert_eq!(
        seen_ip(&udp.expect("UDP answer")),
        IpAddr::V4(NODE1_UNDERLAY),
        "UDP SNATed to node1"
    );
    // `xlb trace` says which way each goes.
    let client = CLIENT_IP.to_string();
    let tcp = lab.trace(&[
        "--from",
        &client,
        "--to",
        "192.0.2.1:30080",
        "--proto",
        "tcp",
    ]);
    assert!(
        tcp.contains("DSR (--lb-mode)") && tcp.contains("IPv4 option naming 192.0.2.1:30080"),
        "{tcp}"
    );
    let udp = lab.trace(&[
        "--from",
        &client,
        "--to",
        "192.0.2.1:30053",
        "--proto",
        "udp",
    ]);
    assert!(!udp.contains("DSR") && udp.contains("SNAT "), "{udp}");
}
