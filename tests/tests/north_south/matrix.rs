//! Every frontend kind under checksum offload on and off, XDP native and generic, and
//! refusal without endpoints.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::Duration,
};

use xlb_tests::suites::north_south::{
    CLIENT_IP, NODE_IP, TIMEOUT, local, remote, seen_ip, service,
};
use xlb_tests::{
    capture::Capture,
    client::{tcp_request, tcp_upload, udp_request},
    require_root,
    scenario::{TCP_PORT, sock},
    topology::NODE1_UNDERLAY,
    twonode::{Lab, dns_node_port, web_node_port},
};

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
    if !require_root() {
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
    if !require_root() {
        return;
    }
    for mode in ["native", "generic"] {
        let yaml = web_node_port(&[local(), remote()]) + &dns_node_port(&[remote()]);
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
    if !require_root() {
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
