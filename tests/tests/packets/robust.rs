//! Truncated, malformed and random packets: never rewritten wrongly, always an allowed verdict.

use std::net::{Ipv4Addr, SocketAddrV4};

use lb_userspace::{packet::PacketBuilder, source::file};
use rand::{Rng, SeedableRng, rngs::StdRng};
use xlb_tests::suites::packets::{
    BACKENDS, CLIENT, EMPTY_VIP, TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, VIP, base_services, setup,
};
/// The fuzz's LoadBalancer: its ClusterIP and ingress IP.
const LB_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 20);
const LB_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 5);

/// The kernel's BPF_PROG_TEST_RUN refuses frames shorter than an Ethernet header, and
/// IPv4/IPv6 frames shorter than their fixed IP header, before the program runs.
fn kernel_refuses(buf: &[u8]) -> bool {
    buf.len() < 14
        || (buf[12..14] == [0x08, 0x00] && buf.len() < 34)
        || (buf[12..14] == [0x86, 0xdd] && buf.len() < 54)
}

#[test]
fn malformed_headers_are_dropped_untouched() {
    let Some(mut dp) = setup() else {
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
    let Some(mut dp) = setup() else {
        return;
    };
    // Every agent map holds something: LoadBalancers with source ranges of both families (the
    // IPv4 one picking by Maglev), an XDP target.
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
        )
        .replacen(
            "name: lb}",
            "name: lb, annotations: {service.cilium.io/lb-algorithm: maglev}}",
            1,
        )
        + "---\napiVersion: v1\nkind: Service\nmetadata: {namespace: ns, name: lb6}\nspec:\n  type: LoadBalancer\n  ipFamilies: [IPv6]\n  clusterIP: \"fd00:10:96::20\"\n  loadBalancerSourceRanges: [\"2001:db8:1::/48\"]\n  ports: [{name: p, port: 80, protocol: TCP}]\nstatus:\n  loadBalancer:\n    ingress: [{ip: \"2001:db8:100::20\"}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {namespace: ns, name: lb6-1, labels: {kubernetes.io/service-name: lb6}}\naddressType: IPv6\nports: [{name: p, port: 8080, protocol: TCP}]\nendpoints: [{addresses: [\"fd00:10:244::20\"], nodeName: node1}]\n";
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
