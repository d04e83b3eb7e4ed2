//! North-south packet tables at tc: NodePorts, externalIPs and LoadBalancer IPs, SNAT, ICMP
//! errors, fragmentation needed.

use std::net::{Ipv4Addr, SocketAddrV4};

use crate::checksums::{self, Udp};
use lb_userspace::packet::{PacketBuilder, TCP_ACK, icmp_error, parse, parse_icmp};
use xlb_tests::suites::packets_north_south::{
    EXT, HAIRPIN, LOCAL_POD, NODE, OUTSIDER, REMOTE_POD, SNAT_MAX, SNAT_MIN, TC_ACT_OK,
    TC_ACT_SHOT, UNDERLAY, on_node1,
};
use xlb_tests::{datapath::LoadedDatapath, require_root};
const TC_ACT_REDIRECT: u32 = 7;

/// What a case expects.
#[derive(Debug)]
enum Expect {
    /// TC_ACT_OK, rewritten to `src` → `dst` (`src` port 0: any port of the SNAT range).
    Rewritten {
        src: SocketAddrV4,
        dst: SocketAddrV4,
    },
    /// TC_ACT_SHOT.
    Drop,
    /// TC_ACT_OK: an ICMP error now from `src` to `dst`, quoting `inner_src` → `inner_dst`.
    Icmp {
        src: Ipv4Addr,
        dst: Ipv4Addr,
        inner_src: SocketAddrV4,
        inner_dst: SocketAddrV4,
    },
    /// TC_ACT_REDIRECT: fragmentation needed (MTU `mtu`) from `src`, quoting the packet.
    FragNeeded { src: Ipv4Addr, mtu: u16 },
}

struct Case {
    desc: &'static str,
    packet: Vec<u8>,
    expect: Expect,
}

/// Runs a case; returns the rewritten source (for SNAT ports).
fn check(dp: &mut LoadedDatapath, c: &Case) -> Option<SocketAddrV4> {
    let r = dp
        .run(&c.packet)
        .unwrap_or_else(|e| panic!("{}: test run: {e}", c.desc));
    match &c.expect {
        Expect::Drop => {
            assert_eq!(r.verdict, TC_ACT_SHOT, "{}", c.desc);
            None
        }
        Expect::Rewritten { src, dst } => {
            assert_eq!(r.verdict, TC_ACT_OK, "{}", c.desc);
            let p = parse(&r.packet).unwrap_or_else(|| panic!("{}: no parse", c.desc));
            assert_eq!(p.dst, *dst, "{}: destination", c.desc);
            assert_eq!(p.src.ip(), src.ip(), "{}: source address", c.desc);
            if src.port() == 0 {
                assert!(
                    (SNAT_MIN..=SNAT_MAX).contains(&p.src.port()),
                    "{}: SNAT port {} outside {SNAT_MIN}-{SNAT_MAX}",
                    c.desc,
                    p.src.port()
                );
            } else {
                assert_eq!(p.src.port(), src.port(), "{}: source port", c.desc);
            }
            assert!(
                p.ip_checksum_ok && p.l4_checksum_ok,
                "{}: checksums",
                c.desc
            );
            checksums::assert_valid(&r.packet, Udp::Computed, c.desc);
            Some(p.src)
        }
        Expect::Icmp {
            src,
            dst,
            inner_src,
            inner_dst,
        } => {
            assert_eq!(r.verdict, TC_ACT_OK, "{}", c.desc);
            let p = parse_icmp(&r.packet).unwrap_or_else(|| panic!("{}: no ICMP", c.desc));
            assert_eq!((p.src, p.dst), (*src, *dst), "{}: outer header", c.desc);
            assert_eq!(
                (p.inner_src, p.inner_dst),
                (*inner_src, *inner_dst),
                "{}: quoted header",
                c.desc
            );
            assert!(p.checksums_ok, "{}: checksums", c.desc);
            checksums::assert_valid(&r.packet, Udp::Computed, c.desc);
            None
        }
        Expect::FragNeeded { src, mtu } => {
            assert_eq!(r.verdict, TC_ACT_REDIRECT, "{}", c.desc);
            let p = parse_icmp(&r.packet).unwrap_or_else(|| panic!("{}: no ICMP", c.desc));
            let input = parse(&c.packet).expect("input");
            assert_eq!((p.typ, p.code, p.mtu), (3, 4, *mtu), "{}", c.desc);
            assert_eq!((p.src, p.dst), (*src, *input.src.ip()), "{}", c.desc);
            assert_eq!(
                (p.inner_src, p.inner_dst),
                (input.src, input.dst),
                "{}: quotes the packet as the client sent it",
                c.desc
            );
            assert!(p.checksums_ok, "{}: checksums", c.desc);
            checksums::assert_valid(&r.packet, Udp::Computed, c.desc);
            None
        }
    }
}

#[test]
fn north_south_rewrites_follow_the_table() {
    if !require_root() {
        return;
    }
    on_node1("xpn", run_table);
}

fn run_table(dp: &mut LoadedDatapath, _ifindex: u32) {
    let np = |port: u16| SocketAddrV4::new(NODE, port);
    let remote = SocketAddrV4::new(REMOTE_POD, 8080);
    let snat_any = SocketAddrV4::new(UNDERLAY, 0);

    let snat = check(
        dp,
        &Case {
            desc: "NodePort, remote backend → DNAT to it + SNAT to the node's underlay address",
            packet: PacketBuilder::tcp(EXT, np(30001)).build(),
            expect: Expect::Rewritten {
                src: snat_any,
                dst: remote,
            },
        },
    )
    .expect("snat");
    let udp_snat = check(
        dp,
        &Case {
            desc: "UDP NodePort, remote backend → DNAT + SNAT",
            packet: PacketBuilder::udp(EXT, np(30002)).payload(b"q").build(),
            expect: Expect::Rewritten {
                src: snat_any,
                dst: remote,
            },
        },
    )
    .expect("snat");

    for c in flow_cases(snat)
        .iter()
        .chain(&range_cases())
        .chain(&error_cases(udp_snat))
    {
        check(dp, c);
    }

    // The SNATed TCP flow closes both ways; the client then reuses its port for a new
    // connection: a new flow (a new SNAT port: the old one is held until the flow has been
    // idle a while), not the closing one.
    for (desc, packet) in [
        (
            "FIN from the client",
            PacketBuilder::tcp(EXT, np(30001)).flags(0x11).build(),
        ),
        (
            "FIN from the backend",
            PacketBuilder::tcp(remote, snat).flags(0x11).build(),
        ),
    ] {
        assert_eq!(dp.run(&packet).expect("run").verdict, TC_ACT_OK, "{desc}");
    }
    let reopened = check(
        dp,
        &Case {
            desc: "SYN on the closed flow's tuple → a new flow",
            packet: PacketBuilder::tcp(EXT, np(30001)).build(),
            expect: Expect::Rewritten {
                src: snat_any,
                dst: remote,
            },
        },
    )
    .expect("snat");
    assert_ne!(reopened, snat, "the reopened flow has its own SNAT port");
    let counts = xlb_tests::datapath::reason_counts(&dp.pins);
    assert_eq!(counts["src_denied"], 1, "{counts:?}");
    // The error about the SNATed flow: its destination side at ingress, its source side
    // (the quote's destination: the NodePort) at egress.
    assert_eq!(counts["icmp_xlate"], 2, "{counts:?}");
    assert_eq!(counts["frag_needed"], 1, "{counts:?}");
    assert_eq!(counts["no_backend"], 1, "{counts:?}");
}

/// The SNATed flow and its reply, local backends, Local policy, loopback NodePorts.
fn flow_cases(snat: SocketAddrV4) -> Vec<Case> {
    let np = |port: u16| SocketAddrV4::new(NODE, port);
    let remote = SocketAddrV4::new(REMOTE_POD, 8080);
    let local = SocketAddrV4::new(LOCAL_POD, 8080);
    vec![
        Case {
            desc: "later packet of the SNATed flow: same backend, same SNAT port",
            packet: PacketBuilder::tcp(EXT, np(30001)).flags(TCP_ACK).build(),
            expect: Expect::Rewritten {
                src: snat,
                dst: remote,
            },
        },
        Case {
            desc: "reply to the SNAT address → from the NodePort, to the client",
            packet: PacketBuilder::tcp(remote, snat).flags(TCP_ACK).build(),
            expect: Expect::Rewritten {
                src: np(30001),
                dst: EXT,
            },
        },
        Case {
            desc: "NodePort, local backend (Cluster policy) → DNAT, client address kept",
            packet: PacketBuilder::tcp(EXT, np(30003)).build(),
            expect: Expect::Rewritten {
                src: EXT,
                dst: local,
            },
        },
        Case {
            desc: "Local policy without a local endpoint → dropped (the internal scope the socket hooks use for the node's own traffic is never a packet's)",
            packet: PacketBuilder::tcp(EXT, np(30004)).build(),
            expect: Expect::Drop,
        },
        Case {
            desc: "a packet to 127.0.0.1:NodePort (a frontend for the node's own sockets only) → not translated",
            packet: PacketBuilder::tcp(EXT, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 30003)).build(),
            expect: Expect::Rewritten {
                src: EXT,
                dst: SocketAddrV4::new(Ipv4Addr::LOCALHOST, 30003),
            },
        },
    ]
}

/// LoadBalancer source ranges, a reused client port, hairpin.
fn range_cases() -> Vec<Case> {
    let np = |port: u16| SocketAddrV4::new(NODE, port);
    let local = SocketAddrV4::new(LOCAL_POD, 8080);
    vec![
        Case {
            desc: "LoadBalancer IP, client inside loadBalancerSourceRanges → DNAT",
            packet: PacketBuilder::tcp(
                SocketAddrV4::new(*EXT.ip(), 5004),
                SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 5), 80),
            )
            .build(),
            expect: Expect::Rewritten {
                src: SocketAddrV4::new(*EXT.ip(), 5004),
                dst: local,
            },
        },
        Case {
            desc: "the client's port of a live flow to the same backend, to another frontend → only the source port is remapped (the reply tuples would clash)",
            packet: PacketBuilder::tcp(EXT, SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 5), 80))
                .build(),
            expect: Expect::Rewritten {
                src: SocketAddrV4::new(*EXT.ip(), 0),
                dst: local,
            },
        },
        Case {
            desc: "LoadBalancer IP, client outside loadBalancerSourceRanges → dropped",
            packet: PacketBuilder::tcp(
                OUTSIDER,
                SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 5), 80),
            )
            .build(),
            expect: Expect::Drop,
        },
        Case {
            desc: "NodePort of the same Service ignores the source ranges",
            packet: PacketBuilder::tcp(OUTSIDER, np(30005)).build(),
            expect: Expect::Rewritten {
                src: OUTSIDER,
                dst: local,
            },
        },
        Case {
            desc: "hairpin: a pod to its own Service → SNAT to the hairpin address",
            packet: PacketBuilder::tcp(
                SocketAddrV4::new(LOCAL_POD, 6000),
                SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, 6), 80),
            )
            .build(),
            expect: Expect::Rewritten {
                src: SocketAddrV4::new(HAIRPIN, 6000),
                dst: local,
            },
        },
        Case {
            desc: "hairpin reply → from the ClusterIP, back to the pod",
            packet: PacketBuilder::tcp(local, SocketAddrV4::new(HAIRPIN, 6000))
                .flags(TCP_ACK)
                .build(),
            expect: Expect::Rewritten {
                src: SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, 6), 80),
                dst: SocketAddrV4::new(LOCAL_POD, 6000),
            },
        },
    ]
}

/// ICMP errors about the SNATed UDP flow (the quoted header as the backend sends it) and
/// fragmentation needed.
fn error_cases(udp_snat: SocketAddrV4) -> Vec<Case> {
    let np = |port: u16| SocketAddrV4::new(NODE, port);
    let remote = SocketAddrV4::new(REMOTE_POD, 8080);
    let sent_to_backend = PacketBuilder::udp(udp_snat, remote).payload(b"q").build();
    vec![
        Case {
            desc: "port unreachable from the backend about the SNATed UDP flow → outer and inner translated",
            packet: icmp_error(REMOTE_POD, UNDERLAY, 3, 3, 0, &sent_to_backend[14..42]),
            expect: Expect::Icmp {
                src: NODE,
                dst: *EXT.ip(),
                inner_src: EXT,
                inner_dst: np(30002),
            },
        },
        Case {
            desc: "DF packet too big for the route to the backend → fragmentation needed from the NodePort",
            packet: PacketBuilder::tcp(SocketAddrV4::new(*EXT.ip(), 5001), np(30001))
                .payload(&[7u8; 1400])
                .build(),
            expect: Expect::FragNeeded {
                src: NODE,
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
    dp: &mut LoadedDatapath,
    desc: &str,
    egress: bool,
    packet: &[u8],
    src: SocketAddrV4,
    dst: SocketAddrV4,
) -> Vec<u8> {
    let r = if egress {
        dp.run_egress(packet)
    } else {
        dp.run_ingress(packet)
    }
    .unwrap_or_else(|e| panic!("{desc}: test run: {e}"));
    assert_eq!(r.verdict, TC_ACT_OK, "{desc}");
    let p = parse(&r.packet).unwrap_or_else(|| panic!("{desc}: no parse"));
    assert_eq!(p.dst, dst, "{desc}: destination");
    assert_eq!(p.src.ip(), src.ip(), "{desc}: source address");
    if src.port() == 0 {
        assert!(
            (SNAT_MIN..=SNAT_MAX).contains(&p.src.port()),
            "{desc}: SNAT port {}",
            p.src.port()
        );
    } else {
        assert_eq!(p.src.port(), src.port(), "{desc}: source port");
    }
    assert!(p.ip_checksum_ok && p.l4_checksum_ok, "{desc}: checksums");
    checksums::assert_valid(&r.packet, Udp::Computed, desc);
    r.packet
}

fn split_table(dp: &mut LoadedDatapath, _ifindex: u32) {
    let np = SocketAddrV4::new(NODE, 30001);
    let remote = SocketAddrV4::new(REMOTE_POD, 8080);
    let local = SocketAddrV4::new(LOCAL_POD, 8080);
    let client = EXT;
    // A SNATed flow (remote backend, Cluster policy).
    let syn = PacketBuilder::tcp(client, np).build();
    let seen = step(
        dp,
        "SNATed request at ingress: DNAT only",
        false,
        &syn,
        client,
        remote,
    );
    let out = step(
        dp,
        "SNATed request at egress: SNAT to the node",
        true,
        &seen,
        SocketAddrV4::new(UNDERLAY, 0),
        remote,
    );
    let snat = parse(&out).expect("out").src;
    // A later packet of it that carries IP options (which a DSR option also makes the
    // header longer with): still SNATed at egress.
    let ack = PacketBuilder::tcp(client, np).flags(TCP_ACK).build();
    let r = dp.run_ingress(&ack).expect("ingress run");
    let with_options = ipv4_with_nop_options(&r.packet);
    let r = dp.run_egress(&with_options).expect("egress run");
    assert_eq!(r.verdict, TC_ACT_OK, "a SNATed packet with IP options");
    let sliced = etherparse::SlicedPacket::from_ethernet(&r.packet).expect("parses");
    let (Some(etherparse::NetSlice::Ipv4(ip)), Some(etherparse::TransportSlice::Tcp(tcp))) =
        (&sliced.net, &sliced.transport)
    else {
        panic!("not IPv4 TCP: {sliced:?}");
    };
    assert_eq!(
        (ip.header().source(), tcp.source_port()),
        (snat.ip().octets(), snat.port()),
        "a SNATed packet with IP options gets its flow's SNAT source at egress"
    );
    checksums::assert_valid(&r.packet, Udp::Computed, "SNATed packet with IP options");
    let reply = PacketBuilder::tcp(remote, snat).flags(TCP_ACK).build();
    let seen = step(
        dp,
        "its reply at ingress: un-SNAT only",
        false,
        &reply,
        remote,
        client,
    );
    step(dp, "its reply at egress: un-DNAT", true, &seen, np, client);
    // Egress leaves alone what is not a tracked flow's, and a request that is not SNATed.
    let plain = PacketBuilder::tcp(
        client,
        SocketAddrV4::new(Ipv4Addr::new(203, 0, 113, 99), 80),
    )
    .build();
    let r = dp.run_egress(&plain).expect("egress run");
    assert_eq!(
        (r.verdict, &r.packet),
        (TC_ACT_OK, &plain),
        "non-service at egress"
    );
    // A local backend (no SNAT): egress leaves its request as ingress left it, and restores
    // the NodePort on its reply, which ingress left alone.
    let lclient = SocketAddrV4::new(*client.ip(), 40777);
    let lnp = SocketAddrV4::new(NODE, 30003);
    let lsyn = PacketBuilder::tcp(lclient, lnp).build();
    let seen = step(dp, "local request at ingress", false, &lsyn, lclient, local);
    let r = dp.run_egress(&seen).expect("egress run");
    assert_eq!(
        r.packet, seen,
        "a request that is not SNATed leaves as ingress left it"
    );
    let lreply = PacketBuilder::tcp(local, lclient).flags(TCP_ACK).build();
    let r = dp.run_ingress(&lreply).expect("ingress run");
    assert_eq!(
        r.packet, lreply,
        "a reply to its own client is left to egress"
    );
    step(
        dp,
        "local reply at egress: un-DNAT",
        true,
        &lreply,
        lnp,
        lclient,
    );
}

/// `frame` (Ethernet, IPv4) with four NOP options after its IP header: the header length,
/// total length and header checksum made to match (etherparse).
fn ipv4_with_nop_options(frame: &[u8]) -> Vec<u8> {
    let (mut h, rest) = etherparse::Ipv4Header::from_slice(&frame[14..]).expect("IPv4 header");
    h.options = [1u8, 1, 1, 1].into();
    h.total_len += 4;
    h.header_checksum = h.calc_header_checksum();
    let mut p = frame[..14].to_vec();
    p.extend_from_slice(&h.to_bytes());
    p.extend_from_slice(rest);
    p
}
