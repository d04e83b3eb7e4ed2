//! Packet tests: crafted packets through the loaded tc program (BPF_PROG_TEST_RUN), as a
//! table of cases, Katran-style.

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    time::Duration,
};

use lb_userspace::{
    packet::{PacketBuilder, TCP_ACK, parse},
    source::file,
};
use rand::{Rng, SeedableRng, rngs::StdRng};
use xlb_tests::{datapath::LoadedDatapath, require_root, services::service_yaml, unique_tag};

#[path = "support/checksums.rs"]
mod checksums;
use checksums::Udp;

const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;
const TC_ACT_REDIRECT: u32 = 7;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const EMPTY_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 99);
/// The fuzz's LoadBalancer: its ClusterIP and ingress IP.
const LB_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 20);
const LB_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 5);
const CLIENT: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 244, 1, 2), 40000);
const BACKENDS: [Ipv4Addr; 3] = [
    Ipv4Addr::new(10, 244, 2, 2),
    Ipv4Addr::new(10, 244, 3, 2),
    Ipv4Addr::new(10, 244, 4, 2),
];

fn setup(test: &str) -> Option<LoadedDatapath> {
    if !require_root(test) {
        return None;
    }
    let mut dp = LoadedDatapath::load(&unique_tag("xlbp")).expect("load the eBPF object");
    let loaded = file::parse("packets.yaml", &base_services()).expect("yaml");
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    dp.program(&loaded.model).expect("program maps");
    Some(dp)
}

/// The table's services: web (VIP:80/TCP) and dns (VIP:53/UDP) on three backends, empty
/// (EMPTY_VIP:80/TCP) on none.
fn base_services() -> String {
    service_yaml("web", VIP, 80, "TCP", 8080, &BACKENDS)
        + &service_yaml("dns", VIP, 53, "UDP", 5353, &BACKENDS)
        + &service_yaml("empty", EMPTY_VIP, 80, "TCP", 8080, &[])
}

/// What a case expects of the program.
#[derive(Debug)]
enum Expect {
    /// TC_ACT_OK and the packet unchanged.
    PassUntouched,
    /// TC_ACT_SHOT.
    Drop,
    /// TC_ACT_REDIRECT back to the sender: a TCP RST from the frontend.
    Refused,
    /// TC_ACT_OK, destination rewritten to one of the backends on `port`, checksums valid.
    Dnat { port: u16 },
    /// TC_ACT_OK, source rewritten to `from`, checksums valid.
    ReverseNat { from: SocketAddrV4 },
}

struct Case {
    desc: &'static str,
    packet: Vec<u8>,
    expect: Expect,
}

fn check(dp: &mut LoadedDatapath, case: &Case) -> Option<SocketAddrV4> {
    let r = dp
        .run(&case.packet)
        .unwrap_or_else(|e| panic!("{}: test run: {e}", case.desc));
    let out = parse(&r.packet);
    match case.expect {
        Expect::PassUntouched => {
            assert_eq!(r.verdict, TC_ACT_OK, "{}", case.desc);
            assert_eq!(r.packet, case.packet, "{}: packet changed", case.desc);
            None
        }
        Expect::Drop => {
            assert_eq!(r.verdict, TC_ACT_SHOT, "{}", case.desc);
            None
        }
        Expect::Refused => {
            assert_eq!(r.verdict, TC_ACT_REDIRECT, "{}", case.desc);
            let p = out.unwrap_or_else(|| panic!("{}: output does not parse", case.desc));
            let input = parse(&case.packet).expect("input parses");
            assert_eq!(
                (p.src, p.dst),
                (input.dst, input.src),
                "{}: RST goes back",
                case.desc
            );
            assert!(
                p.ip_checksum_ok && p.l4_checksum_ok,
                "{}: checksums",
                case.desc
            );
            checksums::assert_valid(&r.packet, Udp::Computed, case.desc);
            assert_eq!(r.packet[47] & 0x04, 0x04, "{}: RST flag", case.desc);
            None
        }
        Expect::Dnat { port } => {
            assert_eq!(r.verdict, TC_ACT_OK, "{}", case.desc);
            let p = out.unwrap_or_else(|| panic!("{}: output does not parse", case.desc));
            let input = parse(&case.packet).expect("input parses");
            assert!(
                BACKENDS.contains(p.dst.ip()),
                "{}: dst {} is not a backend",
                case.desc,
                p.dst
            );
            assert_eq!(p.dst.port(), port, "{}", case.desc);
            assert_eq!(p.src, input.src, "{}: source must be kept", case.desc);
            assert!(p.ip_checksum_ok, "{}: IPv4 checksum", case.desc);
            assert!(p.l4_checksum_ok, "{}: L4 checksum", case.desc);
            checksums::assert_valid(&r.packet, udp_mode(&input), case.desc);
            Some(p.dst)
        }
        Expect::ReverseNat { from } => {
            assert_eq!(r.verdict, TC_ACT_OK, "{}", case.desc);
            let p = out.unwrap_or_else(|| panic!("{}: output does not parse", case.desc));
            let input = parse(&case.packet).expect("input parses");
            assert_eq!(p.src, from, "{}", case.desc);
            assert_eq!(p.dst, input.dst, "{}: destination must be kept", case.desc);
            assert!(
                p.ip_checksum_ok && p.l4_checksum_ok,
                "{}: checksums",
                case.desc
            );
            checksums::assert_valid(&r.packet, udp_mode(&input), case.desc);
            Some(p.src)
        }
    }
}

/// The UDP checksum a rewrite of `input` must carry: none when the input had none.
fn udp_mode(input: &lb_userspace::packet::Parsed) -> Udp {
    if input.udp_checksum_zero {
        Udp::None
    } else {
        Udp::Computed
    }
}

/// `icmp` with its quoted IPv4 header's checksum off by one bit and the ICMP checksum made
/// right again over that, so only the quoted header is wrong.
fn quoted_sum_off(icmp: &[u8]) -> Vec<u8> {
    let mut f = icmp.to_vec();
    f[42 + 11] ^= 0x01;
    f[36..38].copy_from_slice(&[0, 0]);
    let sum = lb_userspace::packet::checksum(&f[34..], 0);
    f[36..38].copy_from_slice(&sum.to_be_bytes());
    f
}

/// The independent check fails on a frame whose checksum is off by one bit, in every field it
/// checks (no root needed).
#[test]
fn the_independent_checksum_check_rejects_every_wrong_sum() {
    let tcp = PacketBuilder::tcp(CLIENT, SocketAddrV4::new(VIP, 80))
        .payload(b"GET /")
        .build();
    let udp = PacketBuilder::udp(CLIENT, SocketAddrV4::new(VIP, 53))
        .payload(b"query")
        .build();
    let icmp = lb_userspace::packet::icmp_error(BACKENDS[0], *CLIENT.ip(), 3, 3, 0, &udp[14..42]);
    let no_sum = PacketBuilder::udp(CLIENT, SocketAddrV4::new(VIP, 53))
        .without_udp_checksum()
        .build();
    for (frame, udp_mode) in [
        (&tcp, Udp::Computed),
        (&udp, Udp::Computed),
        (&icmp, Udp::Computed),
        (&no_sum, Udp::None),
    ] {
        checksums::assert_valid(frame, udp_mode, "as built");
    }
    let flip = |frame: &[u8], at: usize| {
        let mut f = frame.to_vec();
        f[at] ^= 0x01;
        f
    };
    for (what, frame, udp_mode) in [
        ("IPv4 header", flip(&tcp, 25), Udp::Computed),
        ("TCP", flip(&tcp, 51), Udp::Computed),
        ("UDP", flip(&udp, 41), Udp::Computed),
        (
            "UDP checksum 0 where one is due",
            no_sum.clone(),
            Udp::Computed,
        ),
        ("UDP checksum where 0 must stay", udp.clone(), Udp::None),
        ("ICMP", flip(&icmp, 37), Udp::Computed),
        ("quoted IPv4 header", quoted_sum_off(&icmp), Udp::Computed),
    ] {
        let caught = std::panic::catch_unwind(|| checksums::assert_valid(&frame, udp_mode, what));
        assert!(caught.is_err(), "{what}: a wrong checksum went unnoticed");
    }
}

#[test]
fn rewrites_follow_the_table() {
    let Some(mut dp) = setup("rewrites_follow_the_table") else {
        return;
    };
    let vip80 = SocketAddrV4::new(VIP, 80);
    let vip53 = SocketAddrV4::new(VIP, 53);

    // New flows: DNAT to a backend with valid checksums.
    let syn = PacketBuilder::tcp(CLIENT, vip80).build();
    let chosen = check(
        &mut dp,
        &Case {
            desc: "TCP SYN to ClusterIP → DNAT",
            packet: syn.clone(),
            expect: Expect::Dnat { port: 8080 },
        },
    )
    .expect("backend");
    let udp = PacketBuilder::udp(CLIENT, vip53).payload(b"query").build();
    let udp_backend = check(
        &mut dp,
        &Case {
            desc: "UDP to ClusterIP → DNAT",
            packet: udp,
            expect: Expect::Dnat { port: 5353 },
        },
    )
    .expect("backend");

    let table = vec![
        Case {
            desc: "later packet of the TCP flow keeps its backend",
            packet: PacketBuilder::tcp(CLIENT, vip80)
                .flags(TCP_ACK)
                .payload(b"GET /")
                .build(),
            expect: Expect::Dnat { port: 8080 },
        },
        Case {
            desc: "reply from the backend → source is the ClusterIP again",
            packet: PacketBuilder::tcp(chosen, CLIENT)
                .flags(TCP_ACK)
                .payload(b"200 OK")
                .build(),
            expect: Expect::ReverseNat { from: vip80 },
        },
        Case {
            desc: "UDP reply → source is the ClusterIP again",
            packet: PacketBuilder::udp(udp_backend, CLIENT)
                .payload(b"answer")
                .build(),
            expect: Expect::ReverseNat { from: vip53 },
        },
        Case {
            desc: "UDP without checksum: rewritten, checksum stays 0",
            packet: PacketBuilder::udp(SocketAddrV4::new(*CLIENT.ip(), 40001), vip53)
                .without_udp_checksum()
                .build(),
            expect: Expect::Dnat { port: 5353 },
        },
        Case {
            desc: "packet to a non-service address passes untouched",
            packet: PacketBuilder::tcp(
                CLIENT,
                SocketAddrV4::new(Ipv4Addr::new(10, 244, 2, 2), 8080),
            )
            .build(),
            expect: Expect::PassUntouched,
        },
        Case {
            desc: "ClusterIP on a port the service does not have passes untouched",
            packet: PacketBuilder::tcp(CLIENT, SocketAddrV4::new(VIP, 81)).build(),
            expect: Expect::PassUntouched,
        },
        Case {
            desc: "ClusterIP:80 over UDP (service is TCP) passes untouched",
            packet: PacketBuilder::udp(CLIENT, vip80).build(),
            expect: Expect::PassUntouched,
        },
        Case {
            desc: "service without backends → refused (RST back to the client)",
            packet: PacketBuilder::tcp(CLIENT, SocketAddrV4::new(EMPTY_VIP, 80)).build(),
            expect: Expect::Refused,
        },
        Case {
            desc: "a RST to a service without backends is not answered → dropped",
            packet: PacketBuilder::tcp(CLIENT, SocketAddrV4::new(EMPTY_VIP, 80))
                .flags(0x04)
                .build(),
            expect: Expect::Drop,
        },
    ];
    for case in &table {
        let got = check(&mut dp, case);
        if case.desc.starts_with("later packet") {
            assert_eq!(got, Some(chosen), "{}", case.desc);
        }
    }
    let udp_zero = parse(&dp.run(&table[3].packet).expect("run").packet).expect("parses");

    // Every verdict above bumped its reason's counter.
    let counts = xlb_tests::datapath::reason_counts(&dp.pins);
    assert_eq!(counts["new_flow"], 3, "{counts:?}");
    assert_eq!(counts["established"], 2, "{counts:?}");
    assert_eq!(counts["reverse_nat"], 2, "{counts:?}");
    assert_eq!(counts["reject"], 1, "{counts:?}");
    assert_eq!(counts["no_backend"], 1, "{counts:?}");
    assert_eq!(counts["pass"], 3, "{counts:?}");
    let web = lb_userspace::list::services(&dp.pins).expect("services");
    let web = web
        .iter()
        .find(|r| r.frontend == "10.96.0.10:80/TCP")
        .expect("web");
    assert_eq!(
        web.packets, 3,
        "SYN, later packet and reply of the web flow"
    );
    assert!(
        udp_zero.udp_checksum_zero,
        "a zero UDP checksum must stay zero"
    );
}

#[test]
fn new_flows_spread_over_all_backends() {
    let Some(mut dp) = setup("new_flows_spread_over_all_backends") else {
        return;
    };
    let mut seen = std::collections::BTreeMap::new();
    for port in 20000..20300u16 {
        let pkt = PacketBuilder::tcp(
            SocketAddrV4::new(*CLIENT.ip(), port),
            SocketAddrV4::new(VIP, 80),
        )
        .build();
        let r = dp.run(&pkt).expect("run");
        assert_eq!(r.verdict, TC_ACT_OK);
        let p = parse(&r.packet).expect("parses");
        checksums::assert_valid(&r.packet, Udp::Computed, "new flow");
        *seen.entry(*p.dst.ip()).or_insert(0) += 1;
    }
    for b in BACKENDS {
        let n = seen.get(&b).copied().unwrap_or(0);
        assert!(n >= 45, "backend {b} got {n} of 300 new flows: {seen:?}");
    }
}

/// The kernel's BPF_PROG_TEST_RUN refuses frames shorter than an Ethernet header, and
/// IPv4/IPv6 frames shorter than their fixed IP header, before the program runs.
fn kernel_refuses(buf: &[u8]) -> bool {
    buf.len() < 14
        || (buf[12..14] == [0x08, 0x00] && buf.len() < 34)
        || (buf[12..14] == [0x86, 0xdd] && buf.len() < 54)
}

#[test]
fn truncated_packets_are_never_rewritten() {
    let Some(mut dp) = setup("truncated_packets_are_never_rewritten") else {
        return;
    };
    let tcp = PacketBuilder::tcp(CLIENT, SocketAddrV4::new(VIP, 80)).build();
    let udp = PacketBuilder::udp(CLIENT, SocketAddrV4::new(VIP, 53))
        .payload(&[7; 30])
        .build();
    let mut ran = 0;
    for pkt in [&tcp, &udp] {
        for len in 0..=60.min(pkt.len() - 1) {
            let cut = &pkt[..len];
            match dp.run(cut) {
                Err(e) => assert!(kernel_refuses(cut), "len {len}: kernel refused: {e}"),
                Ok(r) => {
                    ran += 1;
                    assert!(
                        !kernel_refuses(cut),
                        "len {len}: expected the kernel to refuse it"
                    );
                    // The IPv4 total length now exceeds the frame: malformed, dropped.
                    assert_eq!(r.verdict, TC_ACT_SHOT, "len {len}: verdict {}", r.verdict);
                    assert_eq!(
                        &r.packet[..],
                        cut,
                        "len {len}: truncated packet was rewritten"
                    );
                }
            }
        }
    }
    assert!(ran >= 40, "only {ran} truncated frames reached the program");
}

#[test]
fn malformed_headers_are_dropped_untouched() {
    let Some(mut dp) = setup("malformed_headers_are_dropped_untouched") else {
        return;
    };
    let good = PacketBuilder::tcp(CLIENT, SocketAddrV4::new(VIP, 80)).build();
    let mut ihl4 = good.clone();
    ihl4[14] = 0x44;
    let mut v6_in_v4 = good.clone();
    v6_in_v4[14] = 0x65;
    let mut short_total = good.clone();
    short_total[16..18].copy_from_slice(&30u16.to_be_bytes()); // IP + 10 bytes: TCP cut
    let mut long_total = good.clone();
    long_total[16..18].copy_from_slice(&1500u16.to_be_bytes());
    for (desc, pkt) in [
        ("IHL below 5", ihl4),
        ("version 6 in an IPv4 frame", v6_in_v4),
        ("total length cuts the TCP header", short_total),
        ("total length beyond the frame", long_total),
    ] {
        let r = dp.run(&pkt).expect("run");
        assert_eq!(r.verdict, TC_ACT_SHOT, "{desc}");
        assert_eq!(r.packet, pkt, "{desc}: rewritten");
    }
    let mut frag = good.clone();
    frag[20] = 0x20; // more fragments
    let r = dp.run(&frag).expect("run");
    assert_eq!(
        (r.verdict, &r.packet),
        (TC_ACT_OK, &frag),
        "fragment passes untouched"
    );
}

/// A random buffer for the fuzz below, by `i % 4`: 0 and 2 start like a service packet (so
/// the parser goes deep) with one byte changed; 1 is random bytes; 3 is a well-formed IPv4
/// TCP, UDP or ICMP frame between random addresses no service, backend or client has, with a
/// random payload.
fn random_buffer(rng: &mut StdRng, i: usize, template: &[u8]) -> Vec<u8> {
    if i % 4 == 3 {
        return random_non_service_frame(rng);
    }
    let len = rng.random_range(14..=template.len() + 64);
    let mut buf: Vec<u8> = (0..len).map(|_| rng.random()).collect();
    if i.is_multiple_of(2) {
        let keep = rng.random_range(14..template.len()).min(len);
        buf[..keep].copy_from_slice(&template[..keep]);
        let flip = rng.random_range(14..len.max(15)).min(len - 1);
        buf[flip] = rng.random();
    }
    buf
}

/// An address in 172.16.0.0/12 or 192.168.0.0/16: never a frontend, backend or client here.
fn stranger(rng: &mut StdRng) -> Ipv4Addr {
    if rng.random() {
        Ipv4Addr::new(172, rng.random_range(16..32), rng.random(), rng.random())
    } else {
        Ipv4Addr::new(192, 168, rng.random(), rng.random())
    }
}

fn random_non_service_frame(rng: &mut StdRng) -> Vec<u8> {
    let mut end = || SocketAddrV4::new(stranger(rng), rng.random());
    let (src, dst) = (end(), end());
    let payload: Vec<u8> = (0..rng.random_range(0..40)).map(|_| rng.random()).collect();
    match rng.random_range(0..3) {
        0 => PacketBuilder::tcp(src, dst)
            .flags(rng.random())
            .payload(&payload)
            .build(),
        1 => PacketBuilder::udp(src, dst).payload(&payload).build(),
        _ => {
            let quoted = PacketBuilder::udp(dst, src).payload(&payload).build();
            lb_userspace::packet::icmp_error(
                *src.ip(),
                *dst.ip(),
                3,
                rng.random_range(0..16),
                1280,
                &quoted[14..42],
            )
        }
    }
}

/// True when the program may rightly rewrite or answer `buf`: an IPv4 frame to a frontend's
/// address or from a backend (a reply), or ICMP that mentions a frontend, backend or client
/// address (it may quote a flow). Anything else must come out as it went in.
fn may_be_service(buf: &[u8]) -> bool {
    if buf.len() < 34 || buf[12..14] != [0x08, 0x00] {
        return false;
    }
    let addr = |o: usize| Ipv4Addr::new(buf[o], buf[o + 1], buf[o + 2], buf[o + 3]);
    let (src, dst) = (addr(26), addr(30));
    let known = [VIP, EMPTY_VIP, *CLIENT.ip()]
        .into_iter()
        .chain(BACKENDS)
        .collect::<Vec<_>>();
    let mentions = |a: &Ipv4Addr| buf[34..].windows(4).any(|w| w == a.octets());
    [VIP, EMPTY_VIP, LB_VIP, LB_IP].contains(&dst)
        || BACKENDS.contains(&src)
        || (buf[23] == 1 && known.iter().any(mentions))
}

/// 10,000 random buffers: each gets an allowed verdict and keeps its length; a buffer that
/// is not service traffic comes out byte-identical and is never answered; and no map but the
/// per-flow state and the counters changes (every other map dumped through bpf(2) before and
/// after, byte by byte).
#[test]
fn random_buffers_get_an_allowed_verdict() {
    let Some(mut dp) = setup("random_buffers_get_an_allowed_verdict") else {
        return;
    };
    // Every agent map holds something: a LoadBalancer with source ranges, an XDP target.
    let yaml = base_services()
        + &xlb_tests::services::service_on_nodes(
            "lb",
            "LoadBalancer",
            "10.96.0.20",
            "TCP",
            80,
            8080,
            None,
            "  loadBalancerSourceRanges: [10.244.0.0/16, 192.0.2.0/24]\n",
            &format!("status:\n  loadBalancer:\n    ingress: [{{ip: {LB_IP}}}]\n"),
            &[(BACKENDS[0], "node1")],
        );
    dp.program(&file::parse("fuzz.yaml", &yaml).expect("yaml").model)
        .expect("program");
    dp.allow_xdp_redirect(1).expect("XDP target");
    let before = xlb_tests::datapath::dump_agent_maps(&dp.pins).expect("dump the maps");
    let empty: Vec<&&str> = before
        .iter()
        .filter(|(_, e)| e.is_empty())
        .map(|(n, _)| n)
        .collect();
    assert!(
        empty.is_empty(),
        "maps the dump would compare empty: {empty:?}"
    );
    let mut rng = StdRng::seed_from_u64(0x71b);
    let template = PacketBuilder::tcp(CLIENT, SocketAddrV4::new(VIP, 80))
        .payload(&[0; 40])
        .build();
    let (mut ran, mut untouched) = (0, 0);
    for i in 0..10_000 {
        let buf = random_buffer(&mut rng, i, &template);
        let len = buf.len();
        match dp.run(&buf) {
            Err(e) => assert!(kernel_refuses(&buf), "buffer {i} ({len} bytes): {e}"),
            Ok(r) => {
                ran += 1;
                assert!(
                    [TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT].contains(&r.verdict),
                    "buffer {i}: verdict {}",
                    r.verdict
                );
                if r.verdict != TC_ACT_REDIRECT {
                    assert_eq!(r.packet.len(), buf.len(), "buffer {i}: length changed");
                }
                if !may_be_service(&buf) {
                    untouched += 1;
                    assert_ne!(
                        r.verdict, TC_ACT_REDIRECT,
                        "buffer {i}: a non-service buffer was answered: {buf:02x?}"
                    );
                    assert_eq!(
                        r.packet, buf,
                        "buffer {i}: a non-service buffer was changed (verdict {})",
                        r.verdict
                    );
                }
            }
        }
    }
    assert!(
        ran >= 9_000,
        "only {ran} of 10,000 buffers reached the program"
    );
    assert!(
        untouched >= 4_000,
        "only {untouched} non-service buffers checked"
    );
    let after = xlb_tests::datapath::dump_agent_maps(&dp.pins).expect("dump the maps");
    let changed: Vec<&str> = before
        .iter()
        .filter(|(name, entries)| after.get(*name) != Some(*entries))
        .map(|(name, _)| *name)
        .collect();
    assert!(
        changed.is_empty(),
        "the datapath changed maps that are not per-flow state or counters: {changed:?}"
    );
}

#[test]
fn a_removed_backend_keeps_tcp_flows_and_rebalances_udp() {
    let Some(mut dp) = setup("a_removed_backend_keeps_tcp_flows_and_rebalances_udp") else {
        return;
    };
    let web = SocketAddrV4::new(VIP, 80);
    let dns = SocketAddrV4::new(VIP, 53);
    let first = |dp: &mut LoadedDatapath, pkt: &[u8]| {
        let r = dp.run(pkt).expect("run");
        assert_eq!(r.verdict, TC_ACT_OK);
        parse(&r.packet).expect("parses").dst
    };
    let tcp_backend = first(&mut dp, &PacketBuilder::tcp(CLIENT, web).build());
    let udp_backend = first(&mut dp, &PacketBuilder::udp(CLIENT, dns).build());

    // Each flow's backend leaves its service.
    let others = |gone: &SocketAddrV4| {
        BACKENDS
            .iter()
            .copied()
            .filter(|b| b != gone.ip())
            .collect::<Vec<_>>()
    };
    let yaml = service_yaml("web", VIP, 80, "TCP", 8080, &others(&tcp_backend))
        + &service_yaml("dns", VIP, 53, "UDP", 5353, &others(&udp_backend));
    dp.program(&file::parse("t.yaml", &yaml).expect("yaml").model)
        .expect("reprogram");

    let later_tcp = PacketBuilder::tcp(CLIENT, web)
        .flags(TCP_ACK)
        .payload(b"more")
        .build();
    assert_eq!(
        first(&mut dp, &later_tcp),
        tcp_backend,
        "an established TCP flow keeps its backend"
    );
    let later_udp = PacketBuilder::udp(CLIENT, dns).payload(b"again").build();
    let moved = first(&mut dp, &later_udp);
    assert_ne!(
        moved, udp_backend,
        "a UDP flow to a removed backend must move"
    );
    assert!(BACKENDS.contains(moved.ip()));
    assert_eq!(
        first(&mut dp, &later_udp),
        moved,
        "and then stay on its new backend"
    );
    let counts = xlb_tests::datapath::reason_counts(&dp.pins);
    assert_eq!(counts["backend_gone"], 1, "{counts:?}");
}

/// The refusal a client gets from a service without endpoints, byte by byte.
#[test]
fn services_without_endpoints_refuse_like_kube_proxy() {
    let Some(mut dp) = setup("services_without_endpoints_refuse_like_kube_proxy") else {
        return;
    };
    let empty = SocketAddrV4::new(EMPTY_VIP, 80);
    let sum_ok = |bytes: &[u8], pseudo: u32| lb_userspace::packet::checksum(bytes, pseudo) == 0;

    // SYN with options and payload: RST|ACK acknowledging seq + payload + SYN, options gone.
    let mut syn = PacketBuilder::tcp(CLIENT, empty).payload(b"early").build();
    syn[38..42].copy_from_slice(&7000u32.to_be_bytes());
    let r = dp.run(&syn).expect("run");
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(r.packet.len(), 54, "Ethernet + IPv4 + TCP, nothing else");
    assert_eq!(&r.packet[0..6], &syn[6..12], "back to the sender's MAC");
    let p = parse(&r.packet).expect("parses");
    assert_eq!((p.src, p.dst), (empty, CLIENT));
    assert!(p.ip_checksum_ok && p.l4_checksum_ok);
    checksums::assert_valid(&r.packet, Udp::Computed, "RST|ACK to a SYN");
    assert_eq!(r.packet[47], 0x14, "RST|ACK");
    assert_eq!(
        u32::from_be_bytes([r.packet[42], r.packet[43], r.packet[44], r.packet[45]]),
        7000 + 5 + 1
    );

    // A segment with ACK set: RST whose seq is that ack, no ACK flag.
    let mut ack = PacketBuilder::tcp(CLIENT, empty).flags(TCP_ACK).build();
    ack[42..46].copy_from_slice(&0xdead_beefu32.to_be_bytes());
    let r = dp.run(&ack).expect("run");
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    assert_eq!(r.packet[47], 0x04, "RST alone");
    checksums::assert_valid(&r.packet, Udp::Computed, "RST to an ACK");
    assert_eq!(&r.packet[38..42], &0xdead_beefu32.to_be_bytes());

    // A RST is never answered.
    let rst = PacketBuilder::tcp(CLIENT, empty).flags(0x04).build();
    assert_eq!(dp.run(&rst).expect("run").verdict, TC_ACT_SHOT);

    // UDP: ICMP port unreachable from the frontend, quoting the datagram's IP header + 8 bytes.
    let dns = service_yaml("none", EMPTY_VIP, 53, "UDP", 5353, &[]);
    let mut model = file::parse("t.yaml", &dns).expect("yaml").model;
    let base = file::parse(
        "t.yaml",
        &(service_yaml("empty", EMPTY_VIP, 80, "TCP", 8080, &[])),
    )
    .expect("yaml")
    .model;
    model.services.extend(base.services);
    model.slices.extend(base.slices);
    dp.program(&model).expect("program");
    let udp = PacketBuilder::udp(CLIENT, SocketAddrV4::new(EMPTY_VIP, 53))
        .payload(b"query payload")
        .build();
    let r = dp.run(&udp).expect("run");
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    let o = &r.packet;
    assert_eq!(o.len(), 14 + 20 + 8 + 28);
    assert_eq!(o[23], 1, "ICMP");
    assert_eq!(&o[26..30], &EMPTY_VIP.octets(), "from the frontend");
    assert_eq!(&o[30..34], &CLIENT.ip().octets(), "to the client");
    assert!(sum_ok(&o[14..34], 0), "IPv4 checksum");
    assert_eq!(
        (o[34], o[35]),
        (3, 3),
        "destination unreachable / port unreachable"
    );
    assert!(sum_ok(&o[34..], 0), "ICMP checksum");
    checksums::assert_valid(o, Udp::Computed, "ICMP port unreachable");
    assert_eq!(
        &o[42..70],
        &udp[14..42],
        "the quoted IP header and UDP header"
    );
}

/// Sets sessionAffinity ClientIP with `timeout_s` (0 = off) on the frontend VIP:80/TCP.
fn set_affinity(dp: &mut LoadedDatapath, timeout_s: u32) {
    use lb_userspace::datapath::writer::MapWriter;
    let state = dp.state();
    let (k, v) = state
        .services
        .iter()
        .find(|(k, _)| {
            k.slot == 0
                && u16::from_be(k.port_be) == 80
                && k.addr_be[0] == u32::from_ne_bytes(VIP.octets())
        })
        .map(|(k, v)| (*k, *v))
        .expect("web entry");
    let v = lb_common::SvcValue {
        affinity_timeout_s: timeout_s,
        ..v
    };
    dp.maps.put_svc(&k, &v).expect("write entry");
}

#[test]
fn client_ip_affinity_keeps_a_client_on_its_backend_until_it_expires() {
    let Some(mut dp) = setup("client_ip_affinity_keeps_a_client_on_its_backend_until_it_expires")
    else {
        return;
    };
    let web = SocketAddrV4::new(VIP, 80);
    let backend_of = |dp: &mut LoadedDatapath, client: Ipv4Addr, port: u16| {
        let r = dp
            .run(&PacketBuilder::tcp(SocketAddrV4::new(client, port), web).build())
            .expect("run");
        assert_eq!(r.verdict, TC_ACT_OK);
        *parse(&r.packet).expect("parses").dst.ip()
    };
    // Off: one client's new connections spread.
    let spread: std::collections::BTreeSet<Ipv4Addr> = (0..30)
        .map(|i| backend_of(&mut dp, *CLIENT.ip(), 30000 + i))
        .collect();
    assert!(
        spread.len() > 1,
        "without affinity one client must reach several backends"
    );

    // On: every client sticks to its first backend.
    set_affinity(&mut dp, 1);
    let clients: Vec<Ipv4Addr> = (10..22).map(|i| Ipv4Addr::new(10, 244, 9, i)).collect();
    let first: Vec<Ipv4Addr> = clients
        .iter()
        .map(|c| backend_of(&mut dp, *c, 40000))
        .collect();
    for (c, b) in clients.iter().zip(&first) {
        for port in 40001..40011 {
            assert_eq!(
                backend_of(&mut dp, *c, port),
                *b,
                "client {c} left its backend"
            );
        }
    }
    // After the timeout without packets, new connections are balanced again.
    std::thread::sleep(Duration::from_millis(2100));
    let moved = clients
        .iter()
        .zip(&first)
        .filter(|(c, b)| backend_of(&mut dp, **c, 41000) != **b)
        .count();
    assert!(
        moved > 0,
        "affinity never expired (12 clients all re-picked their old backend)"
    );

    // Switching it off takes effect at once.
    set_affinity(&mut dp, 0);
    let spread: std::collections::BTreeSet<Ipv4Addr> = (0..30)
        .map(|i| backend_of(&mut dp, clients[0], 42000 + i))
        .collect();
    assert!(
        spread.len() > 1,
        "affinity still applied after it was switched off"
    );
}

/// `frame` with 4 bytes of IP options (NOP, NOP, NOP, EOL) after its IPv4 header: IHL 6,
/// total length and IPv4 checksum adjusted (the L4 checksum does not cover options).
fn with_ip_options(frame: &[u8]) -> Vec<u8> {
    let mut p = frame[..34].to_vec();
    p.extend_from_slice(&[1, 1, 1, 0]);
    p.extend_from_slice(&frame[34..]);
    p[14] = 0x46;
    let tot = u16::from_be_bytes([p[16], p[17]]) + 4;
    p[16..18].copy_from_slice(&tot.to_be_bytes());
    p[24..26].copy_from_slice(&[0, 0]);
    let c = lb_userspace::packet::checksum(&p[14..38], 0);
    p[24..26].copy_from_slice(&c.to_be_bytes());
    p
}

/// The frame with its IP options taken out again (for `parse`, which reads IHL 5 only).
fn without_ip_options(frame: &[u8]) -> Vec<u8> {
    assert_eq!(frame[14], 0x46, "options kept");
    assert_eq!(
        lb_userspace::packet::checksum(&frame[14..38], 0),
        0,
        "IPv4 checksum over the header with its options"
    );
    let mut p = frame[..34].to_vec();
    p.extend_from_slice(&frame[38..]);
    p[14] = 0x45;
    let tot = u16::from_be_bytes([p[16], p[17]]) - 4;
    p[16..18].copy_from_slice(&tot.to_be_bytes());
    p[24..26].copy_from_slice(&[0, 0]);
    let c = lb_userspace::packet::checksum(&p[14..34], 0);
    p[24..26].copy_from_slice(&c.to_be_bytes());
    p
}

/// Packets with IP options cannot be read at the fixed offsets of the direct path: they go
/// through the load/store and checksum helpers, with the same result.
#[test]
fn packets_with_ip_options_are_translated_through_the_helpers() {
    let Some(mut dp) = setup("packets_with_ip_options_are_translated_through_the_helpers") else {
        return;
    };
    let vip80 = SocketAddrV4::new(VIP, 80);
    let vip53 = SocketAddrV4::new(VIP, 53);
    let run = |dp: &mut LoadedDatapath, frame: &[u8]| {
        let r = dp.run(&with_ip_options(frame)).expect("run");
        assert_eq!(r.verdict, TC_ACT_OK);
        parse(&without_ip_options(&r.packet)).expect("parses")
    };
    let syn = run(&mut dp, &PacketBuilder::tcp(CLIENT, vip80).build());
    assert!(BACKENDS.contains(syn.dst.ip()) && syn.dst.port() == 8080);
    assert!(syn.l4_checksum_ok, "TCP checksum after DNAT");
    let reply = run(
        &mut dp,
        &PacketBuilder::tcp(syn.dst, CLIENT)
            .flags(TCP_ACK)
            .payload(b"hi")
            .build(),
    );
    assert_eq!((reply.src, reply.dst), (vip80, CLIENT));
    assert!(reply.l4_checksum_ok, "TCP checksum after reverse NAT");
    let udp = run(
        &mut dp,
        &PacketBuilder::udp(CLIENT, vip53).payload(b"odd").build(),
    );
    assert!(BACKENDS.contains(udp.dst.ip()) && udp.dst.port() == 5353);
    assert!(udp.l4_checksum_ok && !udp.udp_checksum_zero, "UDP checksum");
    let counts = xlb_tests::datapath::reason_counts(&dp.pins);
    assert_eq!(counts["new_flow"], 2, "{counts:?}");
    assert_eq!(counts["reverse_nat"], 1, "{counts:?}");
}

/// An established packet needs only its conntrack entry (which names the backend, the
/// counters' indices and whether the service has affinity): a TCP flow keeps its backend
/// even once its service is gone from the service map, as kube-proxy's conntrack keeps it,
/// and its packets still count toward the service.
#[test]
fn an_established_tcp_flow_needs_only_its_conntrack_entry() {
    let Some(mut dp) = setup("an_established_tcp_flow_needs_only_its_conntrack_entry") else {
        return;
    };
    let web = SocketAddrV4::new(VIP, 80);
    let r = dp
        .run(&PacketBuilder::tcp(CLIENT, web).build())
        .expect("run");
    let backend = parse(&r.packet).expect("parses").dst;
    let before = lb_userspace::list::services(&dp.pins).expect("services");
    let id = before
        .iter()
        .find(|r| r.frontend == "10.96.0.10:80/TCP")
        .expect("web")
        .id;
    // Every service goes: the service map is empty.
    dp.program(&lb_userspace::model::Model::default())
        .expect("reprogram");
    assert!(dp.state().services.is_empty());
    let later = PacketBuilder::tcp(CLIENT, web)
        .flags(TCP_ACK)
        .payload(b"more")
        .build();
    let r = dp.run(&later).expect("run");
    assert_eq!(r.verdict, TC_ACT_OK);
    let p = parse(&r.packet).expect("parses");
    assert_eq!(p.dst, backend, "the flow keeps its backend");
    assert!(p.ip_checksum_ok && p.l4_checksum_ok);
    let reply = PacketBuilder::tcp(backend, CLIENT).flags(TCP_ACK).build();
    let p = parse(&dp.run(&reply).expect("run").packet).expect("parses");
    assert_eq!(p.src, web, "its replies still come from the frontend");
    let counts = xlb_tests::datapath::reason_counts(&dp.pins);
    assert_eq!(counts["established"], 1, "{counts:?}");
    assert_eq!(counts["reverse_nat"], 1, "{counts:?}");
    // A new flow to the removed frontend is not translated.
    let new = PacketBuilder::tcp(SocketAddrV4::new(*CLIENT.ip(), 40999), web).build();
    let r = dp.run(&new).expect("run");
    assert_eq!(
        r.packet, new,
        "a new flow to a removed service passes untouched"
    );
    // The flow's packets were counted under its service index (the counter array slot).
    let maps = lb_userspace::datapath::kernel::KernelMaps::open(&dp.pins).expect("maps");
    assert_eq!(
        maps.service_counter(id).packets,
        3,
        "SYN, later packet, reply"
    );
}
