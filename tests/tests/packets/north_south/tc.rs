//! North-south packet tables at tc, in both families: NodePorts, externalIPs and
//! LoadBalancer IPs, SNAT, ICMP errors, fragmentation needed (ICMPv6: Packet Too Big).

use std::net::SocketAddr;

use lb_userspace::packet::{TCP_ACK, TCP_SYN};
use xlb_tests::frame6::NEXTHDR_DEST;
use xlb_tests::suites::packets::{IcmpError, frame, seen, seen_icmp};
use xlb_tests::suites::packets_north_south::{
    NorthSouth, SNAT_MAX, SNAT_MIN, TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, on_node1,
};
use xlb_tests::{datapath::LoadedDatapath, require_root};

/// What a case expects.
#[derive(Debug)]
enum Expect {
    /// TC_ACT_OK, rewritten to `src` → `dst` (`src` port 0: any port of the SNAT range),
    /// every checksum valid.
    Rewritten { src: SocketAddr, dst: SocketAddr },
    /// TC_ACT_SHOT.
    Drop,
    /// TC_ACT_OK: an ICMP error of `kind` now from `src` to the client, quoting `quote`
    /// (what the client sent).
    Icmp {
        src: std::net::IpAddr,
        kind: IcmpError,
        quote: Vec<u8>,
    },
    /// TC_ACT_REDIRECT: fragmentation needed (ICMPv6: Packet Too Big) with MTU `mtu` from
    /// `src` to the sender, quoting the packet as the client sent it.
    TooBig { src: std::net::IpAddr, mtu: u16 },
}

struct Case {
    desc: &'static str,
    packet: Vec<u8>,
    expect: Expect,
}

/// Runs a case (failures name the family and the case); returns the rewritten source (for
/// SNAT ports).
fn check(n: &NorthSouth, dp: &mut LoadedDatapath, c: &Case) -> Option<SocketAddr> {
    let what = n.row(c.desc);
    let r = dp
        .run(&c.packet)
        .unwrap_or_else(|e| panic!("{what}: test run: {e}"));
    match &c.expect {
        Expect::Drop => {
            assert_eq!(r.verdict, TC_ACT_SHOT, "{what}");
            None
        }
        Expect::Rewritten { src, dst } => {
            assert_eq!(r.verdict, TC_ACT_OK, "{what}");
            let p = seen(&r.packet, &what);
            assert_eq!(p.dst, *dst, "{what}: destination");
            assert_snat_source(&what, p.src, *src);
            Some(p.src)
        }
        Expect::Icmp { src, kind, quote } => {
            assert_eq!(r.verdict, TC_ACT_OK, "{what}");
            let m = seen_icmp(&r.packet, &what);
            assert_eq!((m.src, m.dst), (*src, n.ext.ip()), "{what}: outer header");
            assert_eq!((m.kind, m.rest), n.f.icmp_kind(*kind), "{what}");
            assert_eq!(&m.quote, quote, "{what}: the quote is what the client sent");
            None
        }
        Expect::TooBig { src, mtu } => {
            assert_eq!(r.verdict, TC_ACT_REDIRECT, "{what}");
            let m = seen_icmp(&r.packet, &what);
            let input = seen(&c.packet, &what);
            assert_eq!(
                (m.kind, m.rest),
                n.f.icmp_kind(IcmpError::TooBig(*mtu)),
                "{what}"
            );
            assert_eq!((m.src, m.dst), (*src, input.src.ip()), "{what}");
            assert_eq!(
                m.quote,
                n.f.quote(&c.packet),
                "{what}: quotes the packet as the client sent it"
            );
            None
        }
    }
}

/// `got` is `want`, or (`want` port 0) `want`'s address with a port of the SNAT range.
fn assert_snat_source(what: &str, got: SocketAddr, want: SocketAddr) {
    assert_eq!(got.ip(), want.ip(), "{what}: source address");
    if want.port() == 0 {
        assert!(
            (SNAT_MIN..=SNAT_MAX).contains(&got.port()),
            "{what}: SNAT port {} outside {SNAT_MIN}-{SNAT_MAX}",
            got.port()
        );
    } else {
        assert_eq!(got.port(), want.port(), "{what}: source port");
    }
}

fn tcp(src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    frame(false, src, dst, TCP_SYN, b"")
}

fn ack(src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    frame(false, src, dst, TCP_ACK, b"")
}

#[test]
fn north_south_rewrites_follow_the_table() {
    if !require_root() {
        return;
    }
    on_node1("xpn", run_table);
}

fn run_table(n: &NorthSouth, dp: &mut LoadedDatapath, _ifindex: u32) {
    let remote = SocketAddr::new(n.remote_pod, 8080);
    let snat_any = SocketAddr::new(n.underlay, 0);

    let snat = check(
        n,
        dp,
        &Case {
            desc: "NodePort, remote backend → DNAT to it + SNAT to the node's underlay address",
            packet: tcp(n.ext, n.np(30001)),
            expect: Expect::Rewritten {
                src: snat_any,
                dst: remote,
            },
        },
    )
    .expect("snat");
    let udp_snat = check(
        n,
        dp,
        &Case {
            desc: "UDP NodePort, remote backend → DNAT + SNAT",
            packet: frame(true, n.ext, n.np(30002), 0, b"q"),
            expect: Expect::Rewritten {
                src: snat_any,
                dst: remote,
            },
        },
    )
    .expect("snat");

    for c in flow_cases(n, snat)
        .iter()
        .chain(&range_cases(n))
        .chain(&error_cases(n, udp_snat))
    {
        check(n, dp, c);
    }

    // The SNATed TCP flow closes both ways; the client then reuses its port for a new
    // connection: a new flow (a new SNAT port: the old one is held until the flow has been
    // idle a while), not the closing one.
    for (desc, packet) in [
        (
            "FIN from the client",
            frame(false, n.ext, n.np(30001), 0x11, b""),
        ),
        (
            "FIN from the backend",
            frame(false, remote, snat, 0x11, b""),
        ),
    ] {
        let verdict = dp.run(&packet).expect("run").verdict;
        assert_eq!(verdict, TC_ACT_OK, "{}", n.row(desc));
    }
    let reopened = check(
        n,
        dp,
        &Case {
            desc: "SYN on the closed flow's tuple → a new flow",
            packet: tcp(n.ext, n.np(30001)),
            expect: Expect::Rewritten {
                src: snat_any,
                dst: remote,
            },
        },
    )
    .expect("snat");
    let what = n.row("the reopened flow has its own SNAT port");
    assert_ne!(reopened, snat, "{what}");
    let counts = xlb_tests::datapath::reason_counts(&dp.pins);
    let what = n.row("counters");
    assert_eq!(counts["src_denied"], 1, "{what}: {counts:?}");
    // The error about the SNATed flow: its destination side at ingress, its source side
    // (the quote's destination: the NodePort) at egress.
    assert_eq!(counts["icmp_xlate"], 2, "{what}: {counts:?}");
    assert_eq!(counts["frag_needed"], 1, "{what}: {counts:?}");
    assert_eq!(counts["no_backend"], 1, "{what}: {counts:?}");
}

/// The SNATed flow and its reply, local backends, Local policy, loopback NodePorts.
fn flow_cases(n: &NorthSouth, snat: SocketAddr) -> Vec<Case> {
    let remote = SocketAddr::new(n.remote_pod, 8080);
    let local = SocketAddr::new(n.local_pod, 8080);
    let lo = SocketAddr::new(n.f.loopback(), 30003);
    vec![
        Case {
            desc: "later packet of the SNATed flow: same backend, same SNAT port",
            packet: ack(n.ext, n.np(30001)),
            expect: Expect::Rewritten {
                src: snat,
                dst: remote,
            },
        },
        Case {
            desc: "reply to the SNAT address → from the NodePort, to the client",
            packet: ack(remote, snat),
            expect: Expect::Rewritten {
                src: n.np(30001),
                dst: n.ext,
            },
        },
        Case {
            desc: "NodePort, local backend (Cluster policy) → DNAT, client address kept",
            packet: tcp(n.ext, n.np(30003)),
            expect: Expect::Rewritten {
                src: n.ext,
                dst: local,
            },
        },
        Case {
            desc: "Local policy without a local endpoint → dropped (the internal scope the socket hooks use for the node's own traffic is never a packet's)",
            packet: tcp(n.ext, n.np(30004)),
            expect: Expect::Drop,
        },
        Case {
            desc: "a packet to the loopback address:NodePort (IPv4: a frontend for the node's own sockets only; IPv6: none, as kube-proxy) → not translated",
            packet: tcp(n.ext, lo),
            expect: Expect::Rewritten {
                src: n.ext,
                dst: lo,
            },
        },
    ]
}

/// LoadBalancer source ranges, a reused client port, hairpin.
fn range_cases(n: &NorthSouth) -> Vec<Case> {
    let local = SocketAddr::new(n.local_pod, 8080);
    let lb = SocketAddr::new(n.lb_ip, 80);
    let at = |port| SocketAddr::new(n.ext.ip(), port);
    let cluster = SocketAddr::new(n.f.cluster_ip(6), 80);
    let pod = SocketAddr::new(n.local_pod, 6000);
    vec![
        Case {
            desc: "LoadBalancer IP, client inside loadBalancerSourceRanges → DNAT",
            packet: tcp(at(5004), lb),
            expect: Expect::Rewritten {
                src: at(5004),
                dst: local,
            },
        },
        Case {
            desc: "the client's port of a live flow to the same backend, to another frontend → only the source port is remapped (the reply tuples would clash)",
            packet: tcp(n.ext, lb),
            expect: Expect::Rewritten {
                src: at(0),
                dst: local,
            },
        },
        Case {
            desc: "LoadBalancer IP, client outside loadBalancerSourceRanges → dropped",
            packet: tcp(n.outsider, lb),
            expect: Expect::Drop,
        },
        Case {
            desc: "NodePort of the same Service ignores the source ranges",
            packet: tcp(n.outsider, n.np(30005)),
            expect: Expect::Rewritten {
                src: n.outsider,
                dst: local,
            },
        },
        Case {
            desc: "hairpin: a pod to its own Service → SNAT to the hairpin address",
            packet: tcp(pod, cluster),
            expect: Expect::Rewritten {
                src: SocketAddr::new(n.hairpin, 6000),
                dst: local,
            },
        },
        Case {
            desc: "hairpin reply → from the ClusterIP, back to the pod",
            packet: ack(local, SocketAddr::new(n.hairpin, 6000)),
            expect: Expect::Rewritten {
                src: cluster,
                dst: pod,
            },
        },
    ]
}

/// ICMP errors about the SNATed UDP flow (the quoted header as the backend sends it) and
/// fragmentation needed.
fn error_cases(n: &NorthSouth, udp_snat: SocketAddr) -> Vec<Case> {
    let remote = SocketAddr::new(n.remote_pod, 8080);
    let sent_to_backend = frame(true, udp_snat, remote, 0, b"q");
    let sent = frame(true, n.ext, n.np(30002), 0, b"q");
    let unreachable = IcmpError::PortUnreachable;
    vec![
        Case {
            desc: "port unreachable from the backend about the SNATed UDP flow → outer and inner translated",
            packet: n.f.icmp_error(
                n.remote_pod,
                n.underlay,
                unreachable,
                n.f.quote(&sent_to_backend),
            ),
            expect: Expect::Icmp {
                src: n.node,
                kind: unreachable,
                quote: n.f.quote(&sent).to_vec(),
            },
        },
        Case {
            desc: "DF packet too big for the route to the backend → fragmentation needed (Packet Too Big) from the NodePort",
            packet: frame(
                false,
                SocketAddr::new(n.ext.ip(), 5001),
                n.np(30001),
                TCP_SYN,
                &[7u8; 1400],
            ),
            expect: Expect::TooBig {
                src: n.node,
                mtu: 1280,
            },
        },
    ]
}

/// Each tc hook rewrites its own side, as netfilter's NAT does (DNAT and the un-SNAT of a
/// reply before routing, SNAT and the un-DNAT of a reply after it): what ingress leaves is
/// what the node's netfilter sees, client → backend and backend → client.
#[test]
fn ingress_rewrites_destinations_and_egress_sources() {
    if !require_root() {
        return;
    }
    on_node1("xps", split_table);
}

/// One step of [`split_table`]: `hook` run on `packet` must leave `src` → `dst` (a `src`
/// port 0: any port of the SNAT range), checksums valid. Returns the packet it left.
fn step(
    n: &NorthSouth,
    dp: &mut LoadedDatapath,
    desc: &str,
    egress: bool,
    packet: &[u8],
    (src, dst): (SocketAddr, SocketAddr),
) -> Vec<u8> {
    let what = n.row(desc);
    let r = if egress {
        dp.run_egress(packet)
    } else {
        dp.run_ingress(packet)
    }
    .unwrap_or_else(|e| panic!("{what}: test run: {e}"));
    assert_eq!(r.verdict, TC_ACT_OK, "{what}");
    let p = seen(&r.packet, &what);
    assert_eq!(p.dst, dst, "{what}: destination");
    assert_snat_source(&what, p.src, src);
    r.packet
}

fn split_table(n: &NorthSouth, dp: &mut LoadedDatapath, _ifindex: u32) {
    let np = n.np(30001);
    let remote = SocketAddr::new(n.remote_pod, 8080);
    let local = SocketAddr::new(n.local_pod, 8080);
    let client = n.ext;
    // A SNATed flow (remote backend, Cluster policy).
    let syn = tcp(client, np);
    let desc = "SNATed request at ingress: DNAT only";
    let seen_in = step(n, dp, desc, false, &syn, (client, remote));
    let desc = "SNATed request at egress: SNAT to the node";
    let snat_any = SocketAddr::new(n.underlay, 0);
    let out = step(n, dp, desc, true, &seen_in, (snat_any, remote));
    let snat = seen(&out, desc).src;
    // A later packet of it that carries IPv4 options / an IPv6 destination options header
    // (which a DSR option also makes the header longer with): still SNATed at egress.
    let what = n.row("a SNATed packet with IP options (IPv6: an extension header)");
    let r = dp.run_ingress(&ack(client, np)).expect("ingress run");
    let with_options = n.f.with_options(&r.packet, &[NEXTHDR_DEST]);
    let r = dp.run_egress(&with_options).expect("egress run");
    assert_eq!(r.verdict, TC_ACT_OK, "{what}");
    assert_eq!(
        seen(&r.packet, &what).src,
        snat,
        "{what}: gets its flow's SNAT source at egress"
    );
    let reply = ack(remote, snat);
    let desc = "its reply at ingress: un-SNAT only";
    let seen_in = step(n, dp, desc, false, &reply, (remote, client));
    let desc = "its reply at egress: un-DNAT";
    step(n, dp, desc, true, &seen_in, (np, client));
    // Egress leaves alone what is not a tracked flow's, and a request that is not SNATed.
    let plain = tcp(client, SocketAddr::new(n.f.stranger(99), 80));
    let r = dp.run_egress(&plain).expect("egress run");
    assert_eq!(
        (r.verdict, &r.packet),
        (TC_ACT_OK, &plain),
        "{}",
        n.row("non-service at egress")
    );
    // A local backend (no SNAT): egress leaves its request as ingress left it, and restores
    // the NodePort on its reply, which ingress left alone.
    let lclient = SocketAddr::new(client.ip(), 40777);
    let lnp = n.np(30003);
    let desc = "local request at ingress";
    let seen_in = step(n, dp, desc, false, &tcp(lclient, lnp), (lclient, local));
    let r = dp.run_egress(&seen_in).expect("egress run");
    assert_eq!(
        r.packet,
        seen_in,
        "{}",
        n.row("a request that is not SNATed leaves as ingress left it")
    );
    let lreply = ack(local, lclient);
    let r = dp.run_ingress(&lreply).expect("ingress run");
    assert_eq!(
        r.packet,
        lreply,
        "{}",
        n.row("a reply to its own client is left to egress")
    );
    let desc = "local reply at egress: un-DNAT";
    step(n, dp, desc, true, &lreply, (lnp, lclient));
}
