//! Packet tests for the north-south rewrites, through the loaded tc program
//! (BPF_PROG_TEST_RUN) as a table: NodePort DNAT + SNAT to a remote backend and its reverse,
//! a local backend keeping the client, Local policy without local endpoints, source ranges,
//! hairpin, ICMP inner-header translation and fragmentation needed.
//!
//! The program runs in a namespace of its own whose routes it consults (`bpf_fib_lookup`):
//! node1's underlay `10.0.0.1/24` on a veth (peer in the same namespace) with MTU 1280, and node2's pods
//! (10.245.0.0/16) behind `10.0.0.2`.

use std::net::{Ipv4Addr, SocketAddrV4};

use lb_common::NodeConfig;
use lb_userspace::{
    desired::NodeContext,
    packet::{PacketBuilder, TCP_ACK, icmp_error, parse, parse_icmp},
    source::file,
};
use xlb_tests::{
    datapath::LoadedDatapath, netns::Netns, require_root, services::service_on_nodes, unique_tag,
};

#[path = "support/checksums.rs"]
mod checksums;
use checksums::Udp;

const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;
const TC_ACT_REDIRECT: u32 = 7;

const NODE: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const UNDERLAY: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const EXT: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 10), 5000);
const OUTSIDER: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(203, 0, 113, 9), 5000);
const LOCAL_POD: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 2);
const REMOTE_POD: Ipv4Addr = Ipv4Addr::new(10, 245, 1, 2);
const HAIRPIN: Ipv4Addr = Ipv4Addr::new(169, 254, 42, 1);
const SNAT_MIN: u16 = 61000;
const SNAT_MAX: u16 = 61099;

/// A LoadBalancer Service (port 80 → 8080, nodePort `np`, `spec` lines, `status` block) and
/// its slice, as YAML.
fn svc(
    name: &str,
    vip: &str,
    proto: &str,
    np: u16,
    spec: &str,
    status: &str,
    eps: &[(Ipv4Addr, &str)],
) -> String {
    service_on_nodes(
        name,
        "LoadBalancer",
        vip,
        proto,
        80,
        8080,
        Some(np),
        spec,
        status,
        eps,
    )
}

fn services() -> String {
    let remote = [(REMOTE_POD, "node2")];
    let local = [(LOCAL_POD, "node1")];
    svc("far", "10.96.0.1", "TCP", 30001, "", "", &remote)
        + &svc("farudp", "10.96.0.2", "UDP", 30002, "", "", &remote)
        + &svc("near", "10.96.0.3", "TCP", 30003, "", "", &local)
        + &svc(
            "only-remote-local",
            "10.96.0.4",
            "TCP",
            30004,
            "  externalTrafficPolicy: Local\n",
            "",
            &remote,
        )
        + &svc(
            "ranged",
            "10.96.0.5",
            "TCP",
            30005,
            "  loadBalancerSourceRanges: [192.0.2.0/24]\n",
            "status:\n  loadBalancer:\n    ingress: [{ip: 198.51.100.5}]\n",
            &local,
        )
        + &svc("self", "10.96.0.6", "TCP", 30006, "", "", &local)
}

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

/// Loads the datapath in a namespace of its own (see the module comment), programs it as
/// node1's agent would (SNAT ports `SNAT_MIN..=snat_max`, the hairpin address) and runs
/// `table` on it there, with the index of `dum0`.
fn on_node1(prefix: &str, snat_max: u16, table: fn(&mut LoadedDatapath, u32)) {
    let tag = unique_tag(prefix);
    let ns = Netns::new(&format!("{tag}-node")).expect("netns");
    ns.sysctl(&["net.ipv4.ip_forward=1"]).expect("sysctl");
    for args in [
        &[
            "link", "add", "dum0", "mtu", "1280", "type", "veth", "peer", "name", "dum1", "mtu",
            "1280",
        ][..],
        &["link", "set", "dum0", "address", "02:00:00:00:00:01"],
        &["link", "set", "dum1", "up"],
        &["addr", "add", "10.0.0.1/24", "dev", "dum0"],
        &["link", "set", "dum0", "up"],
        &["link", "set", "lo", "up"],
        &["route", "add", "10.245.0.0/16", "via", "10.0.0.2"],
        &["route", "add", "10.244.2.2/32", "dev", "dum0"],
        &["route", "add", "192.0.2.0/24", "via", "10.0.0.2"],
        &[
            "neigh",
            "add",
            "10.0.0.2",
            "lladdr",
            "02:00:00:00:00:02",
            "dev",
            "dum0",
            "nud",
            "permanent",
        ],
    ] {
        ns.ip(args).unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
    }
    ns.run(move || {
        let ifindex = lb_userspace::netif::ifindex("dum0").expect("dum0");
        let mut dp = LoadedDatapath::load(&tag).expect("load");
        dp.configure(&NodeConfig {
            snat_port_min: SNAT_MIN,
            snat_port_max: snat_max,
            hairpin_addr_be: u32::from_ne_bytes(HAIRPIN.octets()),
            ..NodeConfig::default()
        })
        .expect("config");
        let loaded = file::parse("ns.yaml", &services()).expect("yaml");
        assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
        dp.program_on(
            &loaded.model,
            // With the socket hooks' entries (loopback NodePorts, internal scopes), which
            // tc and XDP must never use.
            &NodeContext::new("node1", &[NODE], true),
        )
        .expect("program");
        table(&mut dp, ifindex);
    })
    .expect("table thread");
}

#[test]
fn north_south_rewrites_follow_the_table() {
    if !require_root("north_south_rewrites_follow_the_table") {
        return;
    }
    on_node1("xpn", SNAT_MAX, run_table);
}

fn run_table(dp: &mut LoadedDatapath, _ifindex: u32) {
    let np = |port: u16| SocketAddrV4::new(NODE, port);
    let remote = SocketAddrV4::new(REMOTE_POD, 8080);
    let local = SocketAddrV4::new(LOCAL_POD, 8080);
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
    // The quoted header of an error about the UDP flow, as the backend sends it.
    let sent_to_backend = PacketBuilder::udp(udp_snat, remote).payload(b"q").build();

    let table = [
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
    ];
    for c in &table {
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
    assert_eq!(counts["icmp_xlate"], 1, "{counts:?}");
    assert_eq!(counts["frag_needed"], 1, "{counts:?}");
    assert_eq!(counts["no_backend"], 1, "{counts:?}");
}

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const XDP_REDIRECT: u32 = 4;

/// The XDP program on a node interface, through BPF_PROG_TEST_RUN: what it takes on itself
/// (translation, redirect with the next hop's MAC) and what it leaves to tc untouched.
#[test]
fn xdp_rewrites_follow_the_table() {
    if !require_root("xdp_rewrites_follow_the_table") {
        return;
    }
    on_node1("xpx", SNAT_MAX, run_xdp_table);
}

fn run_xdp_table(dp: &mut LoadedDatapath, ifindex: u32) {
    let np = |port: u16| SocketAddrV4::new(NODE, port);
    let remote = SocketAddrV4::new(REMOTE_POD, 8080);
    let run = |dp: &mut LoadedDatapath, desc: &str, packet: &[u8]| {
        dp.run_xdp(packet, ifindex)
            .unwrap_or_else(|e| panic!("{desc}: test run: {e}"))
    };

    // 1. A new NodePort flow to a remote backend, egress not in the redirect map: translated
    //    (DNAT + SNAT) and passed to the stack.
    let desc = "new flow, egress without XDP → translated and passed";
    let r = run(dp, desc, &PacketBuilder::tcp(EXT, np(30001)).build());
    assert_eq!(r.verdict, XDP_PASS, "{desc}");
    let p = parse(&r.packet).expect("parses");
    assert_eq!(p.dst, remote, "{desc}");
    assert_eq!(*p.src.ip(), UNDERLAY, "{desc}");
    assert!(
        (SNAT_MIN..=SNAT_MAX).contains(&p.src.port()),
        "{desc}: {p:?}"
    );
    assert!(p.ip_checksum_ok && p.l4_checksum_ok, "{desc}: checksums");
    checksums::assert_valid(&r.packet, Udp::Computed, desc);
    let snat = p.src;

    // 2. The reply to the SNAT address: reverse-translated (the client is routed via dum0).
    let desc = "reply of the SNATed flow → frontend to client";
    let r = run(
        dp,
        desc,
        &PacketBuilder::tcp(remote, snat).flags(TCP_ACK).build(),
    );
    assert_eq!(r.verdict, XDP_PASS, "{desc}");
    let p = parse(&r.packet).expect("parses");
    assert_eq!((p.src, p.dst), (np(30001), EXT), "{desc}");
    assert!(p.ip_checksum_ok && p.l4_checksum_ok, "{desc}: checksums");
    checksums::assert_valid(&r.packet, Udp::Computed, desc);

    // 3. With the egress interface in the redirect map: redirected, MACs of the next hop.
    dp.allow_xdp_redirect(ifindex).expect("devmap");
    let desc = "established flow, egress runs XDP → redirected with the next hop's MAC";
    let r = run(
        dp,
        desc,
        &PacketBuilder::tcp(EXT, np(30001))
            .flags(TCP_ACK)
            .payload(b"x")
            .build(),
    );
    assert_eq!(r.verdict, XDP_REDIRECT, "{desc}");
    assert_eq!(
        &r.packet[0..6],
        &[2, 0, 0, 0, 0, 2],
        "{desc}: destination MAC"
    );
    assert_eq!(&r.packet[6..12], &[2, 0, 0, 0, 0, 1], "{desc}: source MAC");
    let p = parse(&r.packet).expect("parses");
    assert_eq!((p.src, p.dst), (snat, remote), "{desc}");
    assert!(p.ip_checksum_ok && p.l4_checksum_ok, "{desc}: checksums");
    checksums::assert_valid(&r.packet, Udp::Computed, desc);

    // 4. What XDP leaves to tc, untouched.
    let mut partial = PacketBuilder::tcp(SocketAddrV4::new(*EXT.ip(), 5002), np(30001)).build();
    let pseudo = {
        let mut sum = 0u32;
        for w in partial[26..34].chunks(2) {
            sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
        }
        sum += 6 + 20;
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum as u16
    };
    partial[50..52].copy_from_slice(&pseudo.to_be_bytes());
    for (desc, packet) in [
        (
            "checksum still partial (CHECKSUM_PARTIAL from a veth sender) → tc",
            partial,
        ),
        (
            "service without a local endpoint (Local policy) → tc drops it",
            PacketBuilder::tcp(EXT, np(30004)).build(),
        ),
        (
            "ICMP → tc translates it",
            icmp_error(
                REMOTE_POD,
                UNDERLAY,
                3,
                3,
                0,
                &PacketBuilder::udp(snat, remote).build()[14..42],
            ),
        ),
        (
            "too big for the route → tc answers fragmentation needed",
            PacketBuilder::tcp(SocketAddrV4::new(*EXT.ip(), 5003), np(30001))
                .payload(&[1u8; 1600])
                .build(),
        ),
    ] {
        let r = run(dp, desc, &packet);
        assert_eq!(r.verdict, XDP_PASS, "{desc}");
        assert_eq!(r.packet, packet, "{desc}: must be untouched");
    }

    // 5. Source ranges are enforced in XDP too.
    let desc = "LoadBalancer IP, client outside the ranges → dropped in XDP";
    let r = run(
        dp,
        desc,
        &PacketBuilder::tcp(
            OUTSIDER,
            SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 5), 80),
        )
        .build(),
    );
    assert_eq!(r.verdict, XDP_DROP, "{desc}");
}

/// A SNAT port is held while its flow lives, and goes to a new flow once the old one is over
/// (here: closing and idle, its timestamps aged through the map): with a one-port range, the
/// second flow is refused, then takes the port, and the old flow's forward entry is gone.
#[test]
fn a_finished_flow_gives_its_snat_port_back() {
    if !require_root("a_finished_flow_gives_its_snat_port_back") {
        return;
    }
    on_node1("xpr", SNAT_MIN, reuse_table);
}

fn reuse_table(dp: &mut LoadedDatapath, _ifindex: u32) {
    use aya::maps::{HashMap, MapData};
    use lb_common::{CT_F_CLOSING, CtKey, CtValue, MAP_CT};

    let np = SocketAddrV4::new(NODE, 30001);
    let first = SocketAddrV4::new(*EXT.ip(), 7001);
    let second = SocketAddrV4::new(*EXT.ip(), 7002);
    let r = dp.run(&PacketBuilder::tcp(first, np).build()).expect("run");
    assert_eq!(r.verdict, TC_ACT_OK, "the first flow takes the only port");
    let p = parse(&r.packet).expect("parses");
    assert_eq!(p.src, SocketAddrV4::new(UNDERLAY, SNAT_MIN));
    let r = dp
        .run(&PacketBuilder::tcp(second, np).build())
        .expect("run");
    assert_eq!(
        r.verdict, TC_ACT_SHOT,
        "a live flow holds its port: the second flow is refused"
    );
    let mut ct: HashMap<MapData, CtKey, CtValue> = HashMap::try_from(
        lb_userspace::datapath::kernel::open_pinned(&dp.pins, MAP_CT).expect("pin"),
    )
    .expect("conntrack map");
    // Makes every entry look idle since boot.
    let age = |ct: &mut HashMap<MapData, CtKey, CtValue>| {
        let entries: Vec<(CtKey, CtValue)> = ct.iter().map(|kv| kv.expect("entry")).collect();
        assert_eq!(entries.len(), 2, "one flow, two entries: {entries:?}");
        for (k, v) in &entries {
            let aged = CtValue {
                last_seen_ns: 0,
                created_ns: 0,
                ..*v
            };
            ct.insert(k, aged, 0).expect("age the entry");
        }
        entries
    };
    // Half-closed (the client's FIN only) and idle: the backend may still be sending, so the
    // port stays with the flow.
    let r = dp
        .run(&PacketBuilder::tcp(first, np).flags(0x11).build())
        .expect("run");
    assert_eq!(r.verdict, TC_ACT_OK, "FIN of the first flow's client");
    age(&mut ct);
    let r = dp
        .run(&PacketBuilder::tcp(second, np).build())
        .expect("run");
    assert_eq!(r.verdict, TC_ACT_SHOT, "a half-closed flow keeps its port");
    // The backend's FIN closes the other way: over, once idle.
    let backend = SocketAddrV4::new(REMOTE_POD, 8080);
    let snat = SocketAddrV4::new(UNDERLAY, SNAT_MIN);
    let r = dp
        .run(&PacketBuilder::tcp(backend, snat).flags(0x11).build())
        .expect("run");
    assert_eq!(r.verdict, TC_ACT_OK, "FIN of the first flow's backend");
    for (k, v) in age(&mut ct) {
        assert!(
            v.flags & CT_F_CLOSING != 0,
            "each direction's FIN marked its entry closing: {k:?} {v:?}"
        );
    }
    let r = dp
        .run(&PacketBuilder::tcp(second, np).build())
        .expect("run");
    assert_eq!(
        r.verdict, TC_ACT_OK,
        "the finished flow's port is free again"
    );
    let p = parse(&r.packet).expect("parses");
    assert_eq!(p.src, SocketAddrV4::new(UNDERLAY, SNAT_MIN));
    let firsts = ct
        .iter()
        .filter_map(Result::ok)
        .filter(|(k, _)| k.dir == 0 && u16::from_be(k.sport_be) == first.port())
        .count();
    assert_eq!(firsts, 0, "the old flow's forward entry was removed");
}
