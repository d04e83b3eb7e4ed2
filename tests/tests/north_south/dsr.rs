//! Direct server return (`--lb-mode dsr|hybrid`, both families): an external client reaches
//! a NodePort on node1 whose backend is on node2; node1 forwards the client's packets with
//! the client kept as source and the frontend in an IPv4 option or an IPv6 destination
//! option on the packets node2 learns the flow from; node2's agent records the flow and its backend's replies leave node2
//! straight to the client with the NodePort as source: none come back through node1.

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use xlb_tests::suites::north_south::{CLIENT_IP, NODE_IP, TIMEOUT, remote, seen_ip};
use xlb_tests::{
    capture::Capture,
    client::{tcp_download, tcp_request, tcp_upload, udp_request},
    require_root,
    scenario::{TCP_PORT, UDP_PORT, sock},
    services::{Port, dual_stack_service_on_nodes},
    topology::{NODE1_UNDERLAY, remote_pod_ip, remote_pod_ip6},
    twonode::{CLIENT6, Lab, NODE6, dns_node_port, web_node_port},
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

/// web and dns as dual-stack NodePorts (the same ports), on node2's pod only.
fn dual_stack_services() -> String {
    let on_node2 = (
        &[(remote_pod_ip(1), "node2")][..],
        &[(remote_pod_ip6(1), "node2")][..],
    );
    let service = |name: &str, ip4: &str, ip6: &str, port: Port| {
        dual_stack_service_on_nodes(
            name,
            "NodePort",
            (ip4.parse().expect("ip"), ip6.parse().expect("ip")),
            &[port],
            "",
            on_node2,
        )
    };
    service(
        "web",
        "10.96.0.10",
        "fd00:10:96::10",
        Port {
            name: "http",
            port: 80,
            protocol: "TCP",
            target: TCP_PORT,
            node_port: 30080,
        },
    ) + &service(
        "dns",
        "10.96.0.53",
        "fd00:10:96::53",
        Port {
            name: "dns",
            port: 53,
            protocol: "UDP",
            target: UDP_PORT,
            node_port: 30053,
        },
    )
}

/// In both families, node1 with XDP: 20 TCP requests, 20 UDP requests, SHA-256-checked uploads and
/// downloads of 1 KiB to 4 MiB, from the external client to node1's NodePorts whose only
/// backend is on node2. The backend sees the client itself, every reply arrives on the
/// client's link to node2 from the NodePort, none on its link to node1, and each flow
/// went by the option (node1 added it, node2 learnt the flow from it).
#[test]
fn dsr_replies_leave_the_backends_node_straight_to_the_client() {
    if !require_root() {
        return;
    }
    // node1 with XDP, complete checksums: XDP forwards the flows' other packets itself and
    // leaves a new DSR flow and the packets that carry the option to tc.
    let mut lab = Lab::start_dual_stack(
        "nsdsr",
        &dual_stack_services(),
        &format!("[{NODE6}]:30053/UDP"),
        &["--lb-mode", "dsr", "--xdp", "native"],
    );
    lab.enable_napi_for_redirects();
    lab.set_offload(false);
    lab.direct_return("10.0.0.2:30053/UDP", &["--lb-mode", "dsr"]);
    let mut flows = 0;
    for (node, client) in [
        (IpAddr::V4(NODE_IP), IpAddr::V4(CLIENT_IP)),
        (IpAddr::V6(NODE6), IpAddr::V6(CLIENT6)),
    ] {
        let via_node1 = Capture::start(&lab.ext.ns, "eth0").expect("capture");
        let via_node2 = Capture::start(&lab.ext.ns, "eth1").expect("capture");
        let web = SocketAddr::new(node, 30080);
        let dns = SocketAddr::new(node, 30053);
        let sizes = [1usize << 10, 1 << 20, 4 << 20];
        let (tcp, udp, uploads, downloads) = lab.outside(move || {
            let bulk = std::time::Duration::from_secs(10);
            let tcp: Vec<_> = (0..20).map(|_| tcp_request(web, TIMEOUT)).collect();
            let udp: Vec<_> = (0..20).map(|_| udp_request(dns, TIMEOUT)).collect();
            let uploads: Vec<_> = sizes.iter().map(|&n| tcp_upload(web, n, bulk)).collect();
            let downloads: Vec<_> = sizes.iter().map(|&n| tcp_download(web, n, bulk)).collect();
            (tcp, udp, uploads, downloads)
        });
        // The backend saw the client itself: no SNAT.
        for a in tcp.iter().chain(&udp) {
            let a = a.as_ref().unwrap_or_else(|e| panic!("{node}: {e}"));
            assert_eq!(seen_ip(a), client, "{a:?}");
        }
        for u in &uploads {
            let u = u.as_ref().unwrap_or_else(|e| panic!("{node}: {e}"));
            assert!(u.sha256_matches, "{u:?}");
            assert_eq!(seen_ip(&u.answer), client, "{u:?}");
        }
        for (d, len) in downloads.iter().zip(sizes) {
            let d = d.as_ref().unwrap_or_else(|e| panic!("{node}: {e}"));
            assert!(d.sha256_matches, "{node}: a download of {len} bytes: {d:?}");
        }
        // Every reply came in on node2's link, from the NodePort; none on node1's.
        let node1 = via_node1.finish().expect("capture");
        let from_frontend: Vec<_> = node1.inbound().filter(|p| p.src.ip() == node).collect();
        assert!(
            from_frontend.is_empty(),
            "{} replies came back through node1, first {:?}",
            from_frontend.len(),
            from_frontend.first()
        );
        let node2 = via_node2.finish().expect("capture");
        node2.assert_inbound_only_from(&[web, dns], 60, "DSR replies");
        // node1 added the option to 20 SYNs and 20 datagrams (and the bulk transfers'
        // SYNs); node2 learnt each flow from it.
        flows += 46;
        assert!(
            lab.counter("dsr_out") >= flows,
            "{node}: {}",
            lab.counter("dsr_out")
        );
        let node2_agent = lab.node2_agent.as_ref().expect("node2's agent");
        let learnt = xlb_tests::datapath::reason_counts(&node2_agent.pins)["dsr_in"];
        assert!(learnt >= flows, "{node}: node2 learnt {learnt} flows");
        // `xlb list conntrack`: node1's flows to the NodePorts went by DSR in the family's
        // option, node2's were learnt from it.
        let (sent, frontend) = if node.is_ipv6() {
            ("sent (IPv6 destination option, 24 B)", format!("[{node}]:"))
        } else {
            ("sent (IPv4 option, 8 B)", format!("{node}:"))
        };
        for (pins, want) in [(&lab.agent.pins, sent), (&node2_agent.pins, "learnt")] {
            let rows = lb_userspace::list::conntrack(&xlb_tests::pins(pins)).expect("conntrack");
            let to_node: Vec<_> = rows
                .iter()
                .filter(|r| r.frontend.starts_with(&frontend))
                .collect();
            assert!(
                to_node.len() >= 20 && to_node.iter().all(|r| r.dsr == want),
                "{node}: {want}: {to_node:?}"
            );
        }
        // The option counts in the path MTU: a datagram that fills the 1500-byte route
        // would not fit with it, so node1 answers with the MTU less the option, and a
        // datagram of that size is answered.
        let (option, learnt_mtu) = if node.is_ipv6() {
            (24, 1476)
        } else {
            (8, 1492)
        };
        let probe = lab.outside(move || pmtu_probe(dns, 1500));
        let (mtu, answered) = probe.unwrap_or_else(|e| panic!("{node}: {e}"));
        assert_eq!(
            mtu, learnt_mtu,
            "{node}: the client learnt the path MTU less the {option}-byte option"
        );
        assert!(
            answered,
            "{node}: a datagram of the learnt MTU was answered"
        );
        // `xlb trace` names the family's option and the frontend it carries.
        let (carrier, bytes) = if node.is_ipv6() {
            ("IPv6 destination option", 24)
        } else {
            ("IPv4 option", 8)
        };
        let trace = lab.trace(&[
            "--from",
            &client.to_string(),
            "--to",
            &web.to_string(),
            "--proto",
            "tcp",
        ]);
        assert!(
            trace.contains(&format!("{carrier} naming {web} ({bytes} bytes)")),
            "{trace}"
        );
    }
    assert!(lab.counter("frag_needed") >= 2, "one answer per family");
    assert!(
        lab.counter("xdp_redirect") > 0,
        "XDP forwarded the DSR flows' other packets"
    );
}

/// A UDP socket with don't-fragment on, connected to `to`: sends a datagram of `len` bytes
/// (IP header included) and waits for the ICMP error that tells the path MTU, then sends
/// one of the MTU its kernel learnt. Returns that MTU and whether the second was answered.
fn pmtu_probe(to: SocketAddr, len: usize) -> Result<(usize, bool), String> {
    use std::os::fd::AsRawFd as _;
    let (level, discover, mtu_opt, ip_hdr, any): (_, _, _, usize, SocketAddr) = if to.is_ipv6() {
        (
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_MTU,
            48,
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
        )
    } else {
        (
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_MTU,
            28,
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        )
    };
    let s = std::net::UdpSocket::bind(any).map_err(|e| e.to_string())?;
    s.connect(to).map_err(|e| format!("connect {to}: {e}"))?;
    let fd = s.as_raw_fd();
    // IP_PMTUDISC_DO and IPV6_PMTUDISC_DO are both 2.
    let on: libc::c_int = libc::IP_PMTUDISC_DO;
    // SAFETY: a valid socket and an int option of the right size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            discover,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(format!("set DF: {}", std::io::Error::last_os_error()));
    }
    let path_mtu = || -> Result<usize, String> {
        let mut v: libc::c_int = 0;
        let mut n = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: as above, `v` and `n` valid out-pointers.
        let r = unsafe {
            libc::getsockopt(
                fd,
                level,
                mtu_opt,
                (&mut v as *mut libc::c_int).cast(),
                &mut n,
            )
        };
        if r != 0 {
            return Err(format!("path MTU: {}", std::io::Error::last_os_error()));
        }
        Ok(v as usize)
    };
    let datagram = |total: usize| {
        let mut d = b"hello\n".to_vec();
        d.resize(total - ip_hdr, b'.');
        d
    };
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    s.send(&datagram(len))
        .map_err(|e| format!("send {len}: {e}"))?;
    let mut buf = [0u8; 512];
    // The ICMP error shows as EMSGSIZE on the connected socket (an answer would mean the
    // datagram fitted after all).
    if let Ok(n) = s.recv(&mut buf) {
        return Err(format!(
            "a {len}-byte datagram was answered: {:?}",
            String::from_utf8_lossy(&buf[..n])
        ));
    }
    let mtu = path_mtu()?;
    if mtu >= len {
        return Ok((mtu, false));
    }
    s.send(&datagram(mtu))
        .map_err(|e| format!("send {mtu}: {e}"))?;
    Ok((mtu, s.recv(&mut buf).is_ok()))
}

#[test]
fn hybrid_sends_tcp_direct_and_snats_udp() {
    if !require_root() {
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
