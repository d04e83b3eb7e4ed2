//! DNAT and reverse NAT, packets not for a service, malformed and random input.

use rand::{Rng, SeedableRng, rngs::StdRng};

use super::*;

/// Flows behind extension headers (those of both families without, and the spread of new
/// flows: packets/families.rs), listed by `xlb list conntrack`.
#[test]
fn ipv6_flows_behind_extension_headers_are_translated_both_ways() {
    let Some(mut dp) = setup() else {
        return;
    };
    let web = sa(VIP6, 80);
    let dns = sa(VIP6, 53);
    let cases: Vec<(&str, Frame6, u16, SocketAddrV6)> = vec![
        (
            "TCP behind hop-by-hop, destination options and routing headers",
            Frame6::tcp(client(40003), web, TCP_SYN, b"")
                .with_ext(Ext::options(NEXTHDR_HOP))
                .with_ext(Ext::options(NEXTHDR_DEST))
                .with_ext(Ext::routing()),
            8080,
            web,
        ),
        (
            "UDP behind a destination options header",
            Frame6::udp(client(40004), dns, b"query with options")
                .with_ext(Ext::options(NEXTHDR_DEST)),
            5353,
            dns,
        ),
    ];
    for (what, frame, port, frontend) in &cases {
        flow_both_ways(&mut dp, what, frame, *port, *frontend);
    }
    let flows = lb_userspace::list::conntrack(&xlb_tests::pins(&dp.pins)).expect("list conntrack");
    assert!(
        flows
            .iter()
            .any(|f| f.client == format!("[{}]:40003", CLIENT6.ip())
                && f.frontend == format!("[{VIP6}]:80")),
        "xlb list conntrack shows the IPv6 flow: {flows:?}"
    );
}

/// One case of [`ipv6_flows_behind_extension_headers_are_translated_both_ways`]: the
/// first packet DNATed to a backend's `port`, the backend's reply from `frontend` again,
/// the flow's next packet to the same backend, each counted.
fn flow_both_ways(
    dp: &mut LoadedDatapath,
    what: &str,
    frame: &Frame6,
    port: u16,
    frontend: SocketAddrV6,
) {
    let before = reason_counts(&dp.pins);
    let backend = expect_dnat(dp, &frame.build(), port, what);
    let after = reason_counts(&dp.pins);
    assert_eq!(after["new_flow"], before["new_flow"] + 1, "{what}: counted");
    // The backend's reply: the frontend as its source again, the client kept.
    let c = sa(frame.src, u16::from_be_bytes([frame.l4[0], frame.l4[1]]));
    let reply = if frame.proto == 6 {
        Frame6::tcp(backend, c, TCP_SYN | TCP_ACK, b"")
    } else {
        Frame6::udp(backend, c, b"answer")
    };
    let reply = frame
        .ext
        .iter()
        .fold(reply, |f, e| f.with_ext(e.clone()))
        .build();
    let r = dp.run(&reply).expect("run");
    assert_eq!(r.verdict, TC_ACT_OK, "{what}: reply");
    let seen = seen6(&r.packet, &format!("{what}: reply"));
    assert_eq!(seen.src, frontend, "{what}: reply from the frontend");
    assert_eq!(seen.dst, c, "{what}: reply to the client");
    assert_eq!(
        reason_counts(&dp.pins)["reverse_nat"],
        after["reverse_nat"] + 1
    );
    // The flow's next packet goes to the same backend, from its entry.
    let next = if frame.proto == 6 {
        Frame6::tcp(c, frontend, TCP_ACK, b"more")
    } else {
        Frame6::udp(c, frontend, b"again")
    };
    let again = expect_dnat(dp, &next.build(), port, what);
    assert_eq!(again, backend, "{what}: the flow keeps its backend");
    assert_eq!(
        reason_counts(&dp.pins)["established"],
        after["established"] + 1,
        "{what}"
    );
}

#[test]
fn ipv6_packets_not_for_a_service_pass_untouched() {
    let Some(mut dp) = setup() else {
        return;
    };
    let web = sa(VIP6, 80);
    let mut too_many = Frame6::tcp(client(40100), web, TCP_SYN, b"");
    for _ in 0..7 {
        too_many = too_many.with_ext(Ext::options(NEXTHDR_DEST));
    }
    let solicited = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00, 0x10);
    let mut ns_body = VIP6.octets().to_vec();
    ns_body.extend([1, 1, 2, 0, 0, 0, 0, 1]);
    let before = reason_counts(&dp.pins);
    for (what, frame, reason) in [
        (
            "a first fragment to the frontend",
            Frame6::tcp(client(40101), web, TCP_SYN, b"").with_ext(Ext::fragment(0, true)),
            "fragment",
        ),
        (
            "a later fragment",
            Frame6::udp(client(40102), sa(VIP6, 53), b"tail").with_ext(Ext::fragment(8, false)),
            "fragment",
        ),
        (
            "a neighbour solicitation for the frontend",
            Frame6::icmp(*CLIENT6.ip(), solicited, 135, 0, [0; 4], &ns_body),
            "pass",
        ),
        (
            "an echo request to the frontend",
            Frame6::icmp(*CLIENT6.ip(), VIP6, 128, 0, [0, 1, 0, 1], b"ping"),
            "pass",
        ),
        ("more extension headers than are walked", too_many, "pass"),
        (
            "TCP to ::1",
            Frame6::tcp(client(40106), sa(Ipv6Addr::LOCALHOST, 80), TCP_SYN, b""),
            "pass",
        ),
    ] {
        let counted = reason_counts(&dp.pins)[reason];
        expect_untouched(&mut dp, &frame.build(), TC_ACT_OK, what);
        // Counted twice: by tc ingress, and by tc egress on what ingress passed.
        assert_eq!(
            reason_counts(&dp.pins)[reason],
            counted + 2,
            "{what}: counted as {reason} at ingress and at egress"
        );
    }
    let after = reason_counts(&dp.pins);
    assert_eq!(after["new_flow"], before["new_flow"], "no flow was created");
    let flows = lb_userspace::list::conntrack(&xlb_tests::pins(&dp.pins)).expect("list conntrack");
    assert!(flows.is_empty(), "{flows:?}");
}

#[test]
fn malformed_and_truncated_ipv6_is_never_rewritten() {
    let Some(mut dp) = setup() else {
        return;
    };
    let good = Frame6::tcp(client(40200), sa(VIP6, 80), TCP_SYN, b"").build();
    let mut v4_nibble = good.clone();
    v4_nibble[14] = 0x40;
    let mut long_payload = good.clone();
    long_payload[18..20].copy_from_slice(&200u16.to_be_bytes());
    let mut cut_tcp = good.clone();
    cut_tcp[18..20].copy_from_slice(&12u16.to_be_bytes());
    let with_opts = Frame6::tcp(client(40201), sa(VIP6, 80), TCP_SYN, b"")
        .with_ext(Ext::options(NEXTHDR_HOP))
        .build();
    let mut ext_past_end = with_opts.clone();
    ext_past_end[55] = 40; // hop-by-hop header of 328 bytes
    let mut malformed = reason_counts(&dp.pins)["malformed"];
    for (what, pkt) in [
        ("version 4 in an IPv6 frame", v4_nibble),
        ("payload length beyond the frame", long_payload),
        ("payload length cuts the TCP header", cut_tcp),
        ("an extension header beyond the payload", ext_past_end),
    ] {
        expect_untouched(&mut dp, &pkt, TC_ACT_SHOT, what);
        malformed += 1;
        assert_eq!(reason_counts(&dp.pins)["malformed"], malformed, "{what}");
    }
    let udp = Frame6::udp(client(40202), sa(VIP6, 53), &[7; 20])
        .with_ext(Ext::options(NEXTHDR_DEST))
        .build();
    let mut ran = 0;
    // A plain TCP SYN and UDP datagram cut short: packets/families.rs.
    for pkt in [&with_opts, &udp] {
        for len in 0..pkt.len() {
            let cut = &pkt[..len];
            match dp.run(cut) {
                // BPF_PROG_TEST_RUN refuses frames shorter than Ethernet + IPv6 headers.
                Err(e) => assert!(len < 54, "len {len}: refused: {e}"),
                Ok(r) => {
                    ran += 1;
                    assert_eq!(
                        r.verdict, TC_ACT_SHOT,
                        "len {len}: a cut packet is malformed"
                    );
                    assert_eq!(r.packet, cut, "len {len}: rewritten");
                }
            }
        }
    }
    assert!(ran > 40, "{ran}");
    let flows = lb_userspace::list::conntrack(&xlb_tests::pins(&dp.pins)).expect("list conntrack");
    assert!(flows.is_empty(), "no flow from a broken packet: {flows:?}");
}

/// Whether a buffer may be service traffic (then it may be rewritten or answered).
fn may_be_service(buf: &[u8]) -> bool {
    if buf.len() < 54 {
        return false;
    }
    let addr = |o: usize| Ipv6Addr::from(<[u8; 16]>::try_from(&buf[o..o + 16]).unwrap_or([0; 16]));
    let (src, dst) = (addr(22), addr(38));
    [VIP6, EMPTY6].contains(&dst) || BACKENDS6.contains(&src) || buf[20] == IPPROTO_ICMPV6
}

/// 5,000 random IPv6 buffers: one byte of a service packet changed, random bytes behind an
/// IPv6 Ethernet type, or a well-formed frame between strangers. Each gets an allowed
/// verdict and keeps its length; what cannot be service traffic comes out byte-identical.
#[test]
fn random_ipv6_buffers_get_an_allowed_verdict() {
    let Some(mut dp) = setup() else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(0x6d6);
    let template = Frame6::tcp(client(40300), sa(VIP6, 80), TCP_SYN, &[0; 24])
        .with_ext(Ext::options(NEXTHDR_DEST))
        .build();
    for i in 0..5000 {
        let buf = match i % 3 {
            0 => {
                let mut b = template.clone();
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
                let (a, b) = (s(&mut rng), s(&mut rng));
                let payload: Vec<u8> = (0..rng.random_range(0..64)).map(|_| rng.random()).collect();
                if rng.random() {
                    Frame6::tcp(a, b, rng.random(), &payload).build()
                } else {
                    Frame6::udp(a, b, &payload).build()
                }
            }
        };
        let r = dp.run(&buf).unwrap_or_else(|e| panic!("buffer {i}: {e}"));
        assert!(
            [TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT].contains(&r.verdict),
            "buffer {i}: verdict {}",
            r.verdict
        );
        if r.verdict != TC_ACT_REDIRECT {
            assert_eq!(r.packet.len(), buf.len(), "buffer {i}: length");
        }
        if !may_be_service(&buf) {
            assert_ne!(r.verdict, TC_ACT_REDIRECT, "buffer {i}: answered");
            assert_eq!(r.packet, buf, "buffer {i}: rewritten");
        }
    }
}
