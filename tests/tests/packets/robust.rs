//! Packets that are no service's, malformed, truncated and random, in both families:
//! never rewritten wrongly, always an allowed verdict, counted, no flow created.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use lb_userspace::{
    model::IpFamily,
    packet::{PacketBuilder, TCP_SYN},
    source::file,
};
use rand::{Rng, SeedableRng, rngs::StdRng};
use xlb_tests::datapath::{LoadedDatapath, reason_counts};
use xlb_tests::frame6::{Frame6, IPPROTO_ICMPV6, NEXTHDR_DEST, NEXTHDR_HOP};
use xlb_tests::suites::packets::{
    BACKENDS, BACKENDS6, CLIENT, EMPTY_VIP, EMPTY6, FAMILIES, Family, TC_ACT_OK, TC_ACT_REDIRECT,
    TC_ACT_SHOT, VIP, VIP6, base_services, frame, in_both_families, services6, setup,
};

/// The fuzz's LoadBalancer: its ClusterIP and ingress IP.
const LB_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 20);
const LB_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 5);

/// Packets that are no service's pass untouched in both families, each counted (as
/// `pass`, or `fragment` for a fragment, whose ports are not all there) by tc ingress and
/// again by tc egress, and no flow is created.
#[test]
fn packets_not_for_a_service_pass_untouched() {
    in_both_families(not_for_a_service);
}

fn not_for_a_service(f: &Family, dp: &mut LoadedDatapath) {
    let tcp =
        |i: u16, to: (IpAddr, u16)| frame(false, f.client(40100 + i), to.into(), TCP_SYN, b"");
    let udp = |i: u16, to: (IpAddr, u16), payload: &[u8]| {
        frame(true, f.client(40100 + i), to.into(), 0, payload)
    };
    // (what, packet, the reason it is counted under)
    let mut rows = vec![
        (
            "TCP to an address that is no frontend",
            tcp(0, (f.stranger(7), 80)),
            "pass",
        ),
        (
            "TCP to a backend's own address",
            tcp(1, (f.backends[0], 8080)),
            "pass",
        ),
        (
            "TCP to the frontend's address on a port that is not a service's",
            tcp(2, (f.vip, 81)),
            "pass",
        ),
        (
            "UDP to the TCP service's port",
            udp(3, (f.vip, 80), b""),
            "pass",
        ),
        (
            "TCP to the loopback address",
            tcp(4, (f.loopback(), 80)),
            "pass",
        ),
        (
            "an echo request to the frontend",
            f.echo_request(f.client, f.vip),
            "pass",
        ),
        (
            "a first fragment to the frontend",
            f.fragment(&tcp(6, (f.vip, 80)), 0, true),
            "fragment",
        ),
        (
            "a later fragment",
            f.fragment(&udp(7, (f.vip, 53), b"tail"), 8, false),
            "fragment",
        ),
    ];
    if f.family == IpFamily::V6 {
        let solicited = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00, 0x10);
        let mut ns_body = VIP6.octets().to_vec();
        ns_body.extend([1, 1, 2, 0, 0, 0, 0, 1]);
        rows.extend([
            (
                "a neighbour solicitation for the frontend (IPv6 only: IPv4 asks with ARP, \
                 which is no IP packet)",
                xlb_tests::suites::packets::icmp(
                    f.client,
                    solicited.into(),
                    (135, 0),
                    [0; 4],
                    &ns_body,
                ),
                "pass",
            ),
            (
                "more extension headers than are walked (IPv6 only: IPv4's options are one \
                 header of a length it states)",
                f.with_options(&tcp(9, (f.vip, 80)), &[NEXTHDR_DEST; 7]),
                "pass",
            ),
        ]);
    }
    let before = reason_counts(&dp.pins);
    for (what, pkt, reason) in rows {
        let what = f.row(what);
        let counted = reason_counts(&dp.pins)[reason];
        let r = dp.run(&pkt).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            (r.verdict, &r.packet),
            (TC_ACT_OK, &pkt),
            "{what}: passed untouched"
        );
        assert_eq!(
            reason_counts(&dp.pins)[reason],
            counted + 2,
            "{what}: counted as {reason} at ingress and at egress"
        );
    }
    let after = reason_counts(&dp.pins);
    assert_eq!(
        after["new_flow"],
        before["new_flow"],
        "{}: no flow",
        f.name()
    );
    let flows = lb_userspace::list::conntrack(&xlb_tests::pins(&dp.pins)).expect("list conntrack");
    assert!(flows.is_empty(), "{}: {flows:?}", f.name());
}

/// Headers that contradict themselves or the frame, in both families: dropped untouched,
/// counted `malformed`.
#[test]
fn malformed_headers_are_dropped_untouched() {
    in_both_families(malformed);
}

fn malformed(f: &Family, dp: &mut LoadedDatapath) {
    let good = frame(false, f.client(40200), (f.vip, 80).into(), TCP_SYN, b"");
    let edit = |at: usize, bytes: &[u8]| {
        let mut p = good.clone();
        p[at..at + bytes.len()].copy_from_slice(bytes);
        p
    };
    // The IP length field, and what it counts besides the payload after the fixed header:
    // IPv4's total length (at 16) the header too, IPv6's payload length (at 18) not.
    let (len_at, header, other_version) = match f.family {
        IpFamily::V4 => (16, 20u16, 0x65),
        IpFamily::V6 => (18, 0, 0x40),
    };
    let mut rows = vec![
        (
            "the other family's version in the header",
            edit(14, &[other_version]),
        ),
        (
            "IP length beyond the frame",
            edit(len_at, &(header + 200).to_be_bytes()),
        ),
        (
            "IP length cuts the TCP header",
            edit(len_at, &(header + 10).to_be_bytes()),
        ),
    ];
    match f.family {
        IpFamily::V4 => rows.push((
            "IHL below 5 (IPv4 only: IPv6's fixed header has no length field)",
            edit(14, &[0x44]),
        )),
        IpFamily::V6 => {
            let mut past_end = f.with_options(&good, &[NEXTHDR_HOP]);
            past_end[55] = 40; // a hop-by-hop header of 328 bytes
            rows.push((
                "an extension header beyond the payload (IPv6 only: IPv4's options are \
                 within its header length, the IHL row)",
                past_end,
            ));
        }
    }
    for (what, pkt) in rows {
        let what = f.row(what);
        let before = reason_counts(&dp.pins)["malformed"];
        let r = dp.run(&pkt).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            (r.verdict, &r.packet),
            (TC_ACT_SHOT, &pkt),
            "{what}: dropped untouched"
        );
        assert_eq!(
            reason_counts(&dp.pins)["malformed"],
            before + 1,
            "{what}: counted malformed"
        );
    }
}

/// A TCP SYN and a UDP datagram, plain and behind optional headers, cut at every length in
/// both families: what the kernel runs (from a whole Ethernet and fixed IP header on) is
/// malformed, dropped untouched, and no flow is created.
#[test]
fn truncated_packets_are_never_rewritten() {
    in_both_families(truncated);
}

fn truncated(f: &Family, dp: &mut LoadedDatapath) {
    let name = f.name();
    let tcp = frame(
        false,
        f.client(40200),
        SocketAddr::new(f.vip, 80),
        TCP_SYN,
        b"",
    );
    let udp = frame(
        true,
        f.client(40201),
        SocketAddr::new(f.vip, 53),
        0,
        &[7; 30],
    );
    let packets = [
        ("TCP", tcp.clone()),
        ("UDP", udp.clone()),
        (
            "TCP behind a hop-by-hop header",
            f.with_options(&tcp, &[NEXTHDR_HOP]),
        ),
        (
            "UDP behind a destination options header",
            f.with_options(&udp, &[NEXTHDR_DEST]),
        ),
    ];
    let mut ran = 0;
    for (what, pkt) in &packets {
        for len in 0..pkt.len() {
            let cut = &pkt[..len];
            let what = format!("{name}: {what} cut to {len} bytes");
            match dp.run(cut) {
                // BPF_PROG_TEST_RUN refuses frames shorter than Ethernet and the IP header.
                Err(e) => assert!(len < f.l4_at(), "{what}: refused: {e}"),
                Ok(r) => {
                    ran += 1;
                    assert!(len >= f.l4_at(), "{what}: the kernel ran it");
                    // The IP header's length now exceeds the frame: malformed, dropped.
                    assert_eq!(r.verdict, TC_ACT_SHOT, "{what}: malformed");
                    assert_eq!(r.packet, cut, "{what}: rewritten");
                }
            }
        }
    }
    assert!(
        ran >= 100,
        "{name}: only {ran} cut frames reached the program"
    );
    let flows = lb_userspace::list::conntrack(&xlb_tests::pins(&dp.pins)).expect("list conntrack");
    assert!(
        flows.is_empty(),
        "{name}: no flow from a cut packet: {flows:?}"
    );
}

/// The kernel's BPF_PROG_TEST_RUN refuses frames shorter than an Ethernet header, and
/// IPv4/IPv6 frames shorter than their fixed IP header, before the program runs.
fn kernel_refuses(buf: &[u8]) -> bool {
    buf.len() < 14
        || (buf[12..14] == [0x08, 0x00] && buf.len() < 34)
        || (buf[12..14] == [0x86, 0xdd] && buf.len() < 54)
}

/// A random IPv4 buffer for the fuzz below, by `i % 4`: 0 and 2 start like a service packet (so
/// the parser goes deep) with one byte changed; 1 is random bytes; 3 is a well-formed IPv4
/// TCP, UDP or ICMP frame between random addresses no service, backend or client has, with a
/// random payload.
fn random_buffer4(rng: &mut StdRng, i: usize, template: &[u8]) -> Vec<u8> {
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
fn may_be_service4(buf: &[u8]) -> bool {
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

/// A random IPv6 buffer for the fuzz below, by `i % 3`: 0 is a service packet behind a
/// destination options header with one byte changed; 1 is random bytes behind an IPv6
/// Ethernet type and version; 2 is a well-formed TCP or UDP frame between random
/// addresses in 2001:db8::/32 (no frontend, backend or client), with a random payload.
fn random_buffer6(rng: &mut StdRng, i: usize, template: &[u8]) -> Vec<u8> {
    let sa = |ip, port| SocketAddrV6::new(ip, port, 0, 0);
    match i % 3 {
        0 => {
            let mut b = template.to_vec();
            let at = rng.random_range(14..b.len());
            b[at] = rng.random();
            b
        }
        1 => {
            let mut b: Vec<u8> = (0..rng.random_range(54..200))
                .map(|_| rng.random())
                .collect();
            b[12..14].copy_from_slice(&[0x86, 0xdd]);
            b[14] = 0x60 | (b[14] & 0x0f);
            b
        }
        _ => {
            let s = |rng: &mut StdRng| {
                sa(
                    Ipv6Addr::new(0x2001, 0xdb8, rng.random(), 0, 0, 0, 0, rng.random()),
                    rng.random(),
                )
            };
            let (a, b) = (s(rng), s(rng));
            let payload: Vec<u8> = (0..rng.random_range(0..64)).map(|_| rng.random()).collect();
            if rng.random() {
                Frame6::tcp(a, b, rng.random(), &payload).build()
            } else {
                Frame6::udp(a, b, &payload).build()
            }
        }
    }
}

/// True when the program may rightly rewrite or answer an IPv6 `buf`: to a frontend's
/// address, from a backend (a reply), or ICMPv6 (it may quote a flow).
fn may_be_service6(buf: &[u8]) -> bool {
    if buf.len() < 54 || buf[12..14] != [0x86, 0xdd] {
        return false;
    }
    let addr = |o: usize| Ipv6Addr::from(<[u8; 16]>::try_from(&buf[o..o + 16]).unwrap_or([0; 16]));
    let (src, dst) = (addr(22), addr(38));
    let lb: [Ipv6Addr; 2] = [LB6_VIP, LB6_IP];
    [VIP6, EMPTY6].contains(&dst)
        || lb.contains(&dst)
        || BACKENDS6.contains(&src)
        || buf[20] == IPPROTO_ICMPV6
}

/// The fuzz's IPv6 LoadBalancer: its ClusterIP and ingress IP.
const LB6_VIP: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x20);
const LB6_IP: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 0x20);

/// The fuzz's services: the tables' of both families, LoadBalancers with source ranges of
/// both families (the IPv4 one picking by Maglev): every agent map holds something.
fn fuzz_services() -> String {
    base_services()
        + &services6()
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
        )
        .replacen(
            "name: lb}",
            "name: lb, annotations: {service.cilium.io/lb-algorithm: maglev}}",
            1,
        )
        + &format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: ns, name: lb6}}\nspec:\n  type: LoadBalancer\n  ipFamilies: [IPv6]\n  clusterIP: \"{LB6_VIP}\"\n  loadBalancerSourceRanges: [\"2001:db8:1::/48\"]\n  ports: [{{name: p, port: 80, protocol: TCP}}]\nstatus:\n  loadBalancer:\n    ingress: [{{ip: \"{LB6_IP}\"}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{namespace: ns, name: lb6-1, labels: {{kubernetes.io/service-name: lb6}}}}\naddressType: IPv6\nports: [{{name: p, port: 8080, protocol: TCP}}]\nendpoints: [{{addresses: [\"fd00:10:244::20\"], nodeName: node1}}]\n"
        )
}

/// 10,000 random buffers of each family (one byte of a service packet changed, random
/// bytes behind the family's Ethernet type, a well-formed frame between strangers): each
/// gets an allowed verdict and keeps its length; a buffer that is not service traffic
/// comes out byte-identical and is never answered; and no map but the per-flow state and
/// the counters changes (every other map dumped through bpf(2) before and after, byte by
/// byte).
#[test]
fn random_buffers_get_an_allowed_verdict() {
    let Some(mut dp) = setup() else {
        return;
    };
    dp.program(
        &file::parse("fuzz.yaml", &fuzz_services())
            .expect("yaml")
            .model,
    )
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
    for f in FAMILIES {
        fuzz(&f, &mut dp);
    }
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

/// A family's random buffer: the `i`-th, from a service packet `template`.
type Generator = fn(&mut StdRng, usize, &[u8]) -> Vec<u8>;
/// Whether a family's buffer may rightly be rewritten or answered.
type Judge = fn(&[u8]) -> bool;

/// One family's 10,000 buffers of [`random_buffers_get_an_allowed_verdict`].
fn fuzz(f: &Family, dp: &mut LoadedDatapath) {
    let name = f.name();
    let (mut rng, template, gen_buf, may_be): (_, _, Generator, Judge) = match f.family {
        IpFamily::V4 => (
            StdRng::seed_from_u64(0x71b),
            PacketBuilder::tcp(CLIENT, SocketAddrV4::new(VIP, 80))
                .payload(&[0; 40])
                .build(),
            random_buffer4,
            may_be_service4,
        ),
        IpFamily::V6 => (
            StdRng::seed_from_u64(0x6d6),
            f.with_options(
                &frame(
                    false,
                    f.client(40300),
                    (f.vip, 80).into(),
                    TCP_SYN,
                    &[0; 24],
                ),
                &[NEXTHDR_DEST],
            ),
            random_buffer6,
            may_be_service6,
        ),
    };
    let (mut ran, mut untouched) = (0, 0);
    for i in 0..10_000 {
        let buf = gen_buf(&mut rng, i, &template);
        let len = buf.len();
        match dp.run(&buf) {
            Err(e) => assert!(
                kernel_refuses(&buf),
                "{name}: buffer {i} ({len} bytes): {e}"
            ),
            Ok(r) => {
                ran += 1;
                assert!(
                    [TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT].contains(&r.verdict),
                    "{name}: buffer {i}: verdict {}",
                    r.verdict
                );
                if r.verdict != TC_ACT_REDIRECT {
                    assert_eq!(
                        r.packet.len(),
                        buf.len(),
                        "{name}: buffer {i}: length changed"
                    );
                }
                if !may_be(&buf) {
                    untouched += 1;
                    assert_ne!(
                        r.verdict, TC_ACT_REDIRECT,
                        "{name}: buffer {i}: a non-service buffer was answered: {buf:02x?}"
                    );
                    assert_eq!(
                        r.packet, buf,
                        "{name}: buffer {i}: a non-service buffer was changed (verdict {})",
                        r.verdict
                    );
                }
            }
        }
    }
    assert!(
        ran >= 9_000,
        "{name}: only {ran} of 10,000 buffers reached the program"
    );
    assert!(
        untouched >= 3_000,
        "{name}: only {untouched} non-service buffers checked"
    );
}
