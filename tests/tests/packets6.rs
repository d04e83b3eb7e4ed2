//! IPv6 packet tables through BPF_PROG_TEST_RUN on the loaded tc program, as the IPv4 ones
//! (`packets/`): DNAT and reverse NAT with L4 checksums over the pseudo-header (checked by
//! etherparse), extension headers walked, fragments and everything not for a service passed
//! untouched, truncated and malformed headers dropped untouched, random buffers.

use std::net::{Ipv6Addr, SocketAddrV6};

use rand::{Rng, SeedableRng, rngs::StdRng};
#[path = "support/frame6.rs"]
#[allow(dead_code)]
mod frame6;

use frame6::{
    Ext, Frame6, IPPROTO_ICMPV6, NEXTHDR_DEST, NEXTHDR_HOP, TCP_ACK, TCP_SYN, seen_icmp6, seen6,
};
use xlb_tests::{
    datapath::{LoadedDatapath, reason_counts},
    require_root,
    services::service6_yaml,
    unique_tag,
};

const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;
const TC_ACT_REDIRECT: u32 = 7;

const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x10);
const EMPTY6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x99);
const CLIENT6: SocketAddrV6 = SocketAddrV6::new(
    Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 2),
    40000,
    0,
    0,
);
const BACKENDS6: [Ipv6Addr; 3] = [
    Ipv6Addr::new(0xfd00, 0x10, 0x244, 2, 0, 0, 0, 2),
    Ipv6Addr::new(0xfd00, 0x10, 0x244, 3, 0, 0, 0, 2),
    Ipv6Addr::new(0xfd00, 0x10, 0x244, 4, 0, 0, 0, 2),
];

fn sa(ip: Ipv6Addr, port: u16) -> SocketAddrV6 {
    SocketAddrV6::new(ip, port, 0, 0)
}

fn client(port: u16) -> SocketAddrV6 {
    sa(*CLIENT6.ip(), port)
}

fn setup(test: &str) -> Option<LoadedDatapath> {
    if !require_root(test) {
        return None;
    }
    Some(loaded(&unique_tag("xlp6")))
}

/// The datapath loaded under pins named `tag`, with the table's services.
fn loaded(tag: &str) -> LoadedDatapath {
    let mut dp = LoadedDatapath::load(tag).expect("load the eBPF object");
    let yaml = service6_yaml("web6", VIP6, 80, "TCP", 8080, &BACKENDS6)
        + &service6_yaml("dns6", VIP6, 53, "UDP", 5353, &BACKENDS6)
        + &service6_yaml("empty6", EMPTY6, 80, "TCP", 8080, &[])
        + &service6_yaml("emptyu6", EMPTY6, 53, "UDP", 5353, &[]);
    let loaded = lb_userspace::source::file::parse("packets6.yaml", &yaml).expect("yaml");
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    dp.program(&loaded.model).expect("program maps");
    dp
}

/// Runs `frame`; expects it DNATed to a backend on `port`, source kept, checksum valid.
/// Returns the backend.
fn expect_dnat(dp: &mut LoadedDatapath, frame: &[u8], port: u16, what: &str) -> SocketAddrV6 {
    let r = dp.run(frame).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(r.verdict, TC_ACT_OK, "{what}");
    assert_eq!(r.packet.len(), frame.len(), "{what}: length");
    let before = seen6(frame, what);
    let after = seen6(&r.packet, what);
    assert!(
        BACKENDS6.contains(after.dst.ip()),
        "{what}: {} is no backend",
        after.dst
    );
    assert_eq!(after.dst.port(), port, "{what}");
    assert_eq!(
        after.src, before.src,
        "{what}: the client's address is kept"
    );
    // Everything but the destination address and port is as it was.
    let mut back = r.packet.clone();
    back[38..54].copy_from_slice(&before.dst.ip().octets());
    assert_eq!(back.len(), frame.len());
    after.dst
}

fn expect_untouched(dp: &mut LoadedDatapath, frame: &[u8], verdict: u32, what: &str) {
    let r = dp.run(frame).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(r.verdict, verdict, "{what}: verdict");
    assert_eq!(r.packet, frame, "{what}: the packet changed");
}

#[test]
fn ipv6_service_flows_are_translated_both_ways_with_valid_checksums() {
    let Some(mut dp) = setup("ipv6_service_flows_are_translated_both_ways_with_valid_checksums")
    else {
        return;
    };
    let web = sa(VIP6, 80);
    let dns = sa(VIP6, 53);
    let cases: Vec<(&str, Frame6, u16, SocketAddrV6)> = vec![
        (
            "TCP SYN",
            Frame6::tcp(client(40001), web, TCP_SYN, b""),
            8080,
            web,
        ),
        ("UDP", Frame6::udp(client(40002), dns, b"query"), 5353, dns),
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
        (
            "TCP with a payload of odd length",
            Frame6::tcp(client(40005), web, TCP_SYN, b"GET /x"),
            8080,
            web,
        ),
    ];
    for (what, frame, port, frontend) in &cases {
        flow_both_ways(&mut dp, what, frame, *port, *frontend);
    }
    spread_and_listed(&mut dp, web);
}

/// One case of [`ipv6_service_flows_are_translated_both_ways_with_valid_checksums`]: the
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

/// New flows to `web` spread over its three backends, and `xlb list conntrack` shows them.
fn spread_and_listed(dp: &mut LoadedDatapath, web: SocketAddrV6) {
    let mut chosen = std::collections::BTreeSet::new();
    for port in 41000..41060 {
        let f = Frame6::tcp(client(port), web, TCP_SYN, b"").build();
        chosen.insert(*expect_dnat(dp, &f, 8080, "spread").ip());
    }
    assert_eq!(chosen.len(), 3, "{chosen:?}");
    let flows = lb_userspace::list::conntrack(&dp.pins).expect("list conntrack");
    let v6: Vec<_> = flows
        .iter()
        .filter(|f| f.frontend.starts_with('['))
        .collect();
    assert!(
        v6.len() >= 65,
        "xlb list conntrack shows IPv6 flows: {}",
        v6.len()
    );
    assert!(
        v6.iter()
            .any(|f| f.client == format!("[{}]:40001", CLIENT6.ip())
                && f.frontend == format!("[{VIP6}]:80")),
        "{v6:?}"
    );
}

#[test]
fn ipv6_packets_not_for_a_service_pass_untouched() {
    let Some(mut dp) = setup("ipv6_packets_not_for_a_service_pass_untouched") else {
        return;
    };
    let web = sa(VIP6, 80);
    let stranger = sa(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 7), 80);
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
            "TCP to an address that is no frontend",
            Frame6::tcp(client(40103), stranger, TCP_SYN, b""),
            "pass",
        ),
        (
            "TCP to the frontend's address on a port that is not a service's",
            Frame6::tcp(client(40104), sa(VIP6, 81), TCP_SYN, b""),
            "pass",
        ),
        (
            "UDP to the TCP service's port",
            Frame6::udp(client(40105), web, b"x"),
            "pass",
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
        assert_eq!(
            reason_counts(&dp.pins)[reason],
            counted + 1,
            "{what}: counted as {reason}"
        );
    }
    let after = reason_counts(&dp.pins);
    assert_eq!(after["new_flow"], before["new_flow"], "no flow was created");
    let flows = lb_userspace::list::conntrack(&dp.pins).expect("list conntrack");
    assert!(flows.is_empty(), "{flows:?}");
}

#[test]
fn malformed_and_truncated_ipv6_is_never_rewritten() {
    let Some(mut dp) = setup("malformed_and_truncated_ipv6_is_never_rewritten") else {
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
    for pkt in [&good, &with_opts, &udp] {
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
    let flows = lb_userspace::list::conntrack(&dp.pins).expect("list conntrack");
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
    let Some(mut dp) = setup("random_ipv6_buffers_get_an_allowed_verdict") else {
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

/// The first bytes of an answer's quote: the packet as the client sent it.
fn quoted(frame: &[u8]) -> Vec<u8> {
    frame[14..62].to_vec()
}

#[test]
fn ipv6_services_without_endpoints_refuse_like_kube_proxy() {
    let Some(mut dp) = setup("ipv6_services_without_endpoints_refuse_like_kube_proxy") else {
        return;
    };
    let c = client(40500);
    let syn = Frame6::tcp(c, sa(EMPTY6, 80), TCP_SYN, b"").build();
    let before = reason_counts(&dp.pins)["reject"];
    let r = dp.run(&syn).expect("run");
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "a SYN is answered");
    let rst = seen6(&r.packet, "RST");
    assert_eq!((rst.src, rst.dst), (sa(EMPTY6, 80), c), "from the frontend");
    assert_eq!(rst.tcp_flags, 0x14, "RST|ACK");
    assert_eq!(
        &r.packet[62..66],
        &1001u32.to_be_bytes(),
        "acknowledges the SYN"
    );
    assert_eq!(r.packet.len(), 14 + 40 + 20);
    let ack = Frame6::tcp(c, sa(EMPTY6, 80), TCP_ACK, b"data").build();
    let r = dp.run(&ack).expect("run");
    assert_eq!(r.verdict, TC_ACT_REDIRECT);
    let rst = seen6(&r.packet, "RST to an ACK");
    assert_eq!(rst.tcp_flags, 0x04, "RST");
    assert_eq!(
        &r.packet[58..62],
        &1u32.to_be_bytes(),
        "its sequence is the ACK's"
    );
    let udp = Frame6::udp(c, sa(EMPTY6, 53), b"query").build();
    let r = dp.run(&udp).expect("run");
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "a datagram is answered");
    let m = seen_icmp6(&r.packet, "port unreachable");
    assert_eq!((m.src, m.dst), (EMPTY6, *c.ip()));
    assert_eq!((m.kind, m.code), (1, 4), "destination unreachable, port");
    assert_eq!(m.body, quoted(&udp), "quotes the datagram as sent");
    assert_eq!(reason_counts(&dp.pins)["reject"], before + 3);
    let rst_in = Frame6::tcp(c, sa(EMPTY6, 80), 0x04, b"").build();
    expect_untouched(&mut dp, &rst_in, TC_ACT_SHOT, "a RST is never answered");
    assert!(
        lb_userspace::list::conntrack(&dp.pins)
            .expect("ct")
            .is_empty()
    );
}

#[test]
fn icmpv6_errors_about_tracked_flows_are_translated_outer_and_inner() {
    let Some(mut dp) = setup("icmpv6_errors_about_tracked_flows_are_translated_outer_and_inner")
    else {
        return;
    };
    let c = client(40400);
    let dns = sa(VIP6, 53);
    let sent = Frame6::udp(c, dns, b"").build();
    let r = dp.run(&sent).expect("run");
    let to_backend = r.packet;
    let backend = seen6(&to_backend, "DNAT").dst;
    assert!(BACKENDS6.contains(backend.ip()));
    let router = Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, 1);
    let inner_udp_sum = &sent[60..62];
    let before = reason_counts(&dp.pins)["icmp_xlate"];
    for (what, from, kind, code, rest, src) in [
        (
            "port unreachable from the backend",
            *backend.ip(),
            1,
            4,
            [0; 4],
            VIP6,
        ),
        (
            "packet too big from a router toward the backend",
            router,
            2,
            0,
            1280u32.to_be_bytes(),
            router,
        ),
        ("time exceeded from a router", router, 3, 0, [0; 4], router),
    ] {
        let err = Frame6::icmp(from, *c.ip(), kind, code, rest, &to_backend[14..62]).build();
        let r = dp.run(&err).expect("run");
        assert_eq!(r.verdict, TC_ACT_OK, "{what}");
        let m = seen_icmp6(&r.packet, what);
        assert_eq!((m.src, m.dst), (src, *c.ip()), "{what}: outer");
        assert_eq!((m.kind, m.code, m.rest), (kind, code, rest), "{what}");
        assert_eq!(
            m.body,
            quoted(&sent),
            "{what}: the quote is what the client sent"
        );
        assert_eq!(&m.body[46..48], inner_udp_sum, "{what}: inner UDP checksum");
    }
    // An error about a reply: the client refuses what the frontend sent it.
    let reply = Frame6::udp(backend, c, b"").build();
    let r = dp.run(&reply).expect("run");
    let to_client = r.packet;
    assert_eq!(seen6(&to_client, "reply").src, dns);
    let err = Frame6::icmp(*c.ip(), VIP6, 1, 4, [0; 4], &to_client[14..62]).build();
    let r = dp.run(&err).expect("run");
    assert_eq!(r.verdict, TC_ACT_OK);
    let m = seen_icmp6(&r.packet, "error about a reply");
    assert_eq!((m.src, m.dst), (*c.ip(), *backend.ip()), "to the backend");
    assert_eq!(m.body, quoted(&reply), "the reply as the backend sent it");
    assert_eq!(reason_counts(&dp.pins)["icmp_xlate"], before + 4);
    // About no tracked flow: untouched.
    let stranger = Frame6::udp(client(1), sa(router, 9), b"").build();
    let err = Frame6::icmp(router, *c.ip(), 1, 4, [0; 4], &stranger[14..62]).build();
    expect_untouched(&mut dp, &err, TC_ACT_OK, "an error about no flow");
}

/// In a namespace whose route to the backends has an MTU of 1280: a packet bigger than
/// that to an IPv6 frontend (new flow or established) is answered with Packet Too Big from
/// the frontend, quoting it as the client sent it; one that fits is translated.
#[test]
fn packets_too_big_for_the_route_get_packet_too_big_from_the_ipv6_frontend() {
    if !require_root("packets_too_big_for_the_route_get_packet_too_big_from_the_ipv6_frontend") {
        return;
    }
    let tag = unique_tag("xlp6m");
    let ns = xlb_tests::netns::Netns::new(&format!("{tag}-n")).expect("netns");
    ns.sysctl(&[
        "net.ipv6.conf.all.forwarding=1",
        "net.ipv6.conf.default.forwarding=1",
    ])
    .expect("sysctl");
    for args in [
        &[
            "link", "add", "dum0", "mtu", "1280", "type", "veth", "peer", "name", "dum1",
        ][..],
        &["link", "set", "dum1", "up"],
        &["link", "set", "dum0", "up"],
        &["link", "set", "lo", "up"],
        &[
            "-6",
            "addr",
            "add",
            "fd00:10:245::1/64",
            "dev",
            "dum0",
            "nodad",
        ],
        &[
            "-6",
            "route",
            "add",
            "fd00:10:244::/48",
            "via",
            "fd00:10:245::2",
            "dev",
            "dum0",
        ],
    ] {
        ns.ip(args).unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
    }
    ns.run(move || {
        let mut dp = loaded(&tag);
        let web = sa(VIP6, 80);
        let big_syn = Frame6::tcp(client(40600), web, TCP_SYN, &[7; 1400]).build();
        let r = dp.run(&big_syn).expect("run");
        assert_eq!(r.verdict, TC_ACT_REDIRECT, "too big: answered");
        let m = seen_icmp6(&r.packet, "packet too big");
        assert_eq!((m.src, m.dst), (VIP6, *CLIENT6.ip()), "from the frontend");
        assert_eq!((m.kind, m.code), (2, 0));
        assert_eq!(m.rest, 1280u32.to_be_bytes(), "the route's MTU");
        assert_eq!(m.body, quoted(&big_syn));
        assert_eq!(reason_counts(&dp.pins)["frag_needed"], 1);
        assert!(
            lb_userspace::list::conntrack(&dp.pins)
                .expect("ct")
                .is_empty()
        );
        // A flow that fits, then a segment of it that does not.
        let c = client(40601);
        let syn = Frame6::tcp(c, web, TCP_SYN, &[7; 1000]).build();
        expect_dnat(&mut dp, &syn, 8080, "fits the route");
        let big = Frame6::tcp(c, web, TCP_ACK, &[7; 1300]).build();
        let r = dp.run(&big).expect("run");
        assert_eq!(r.verdict, TC_ACT_REDIRECT, "established and too big");
        let m = seen_icmp6(&r.packet, "packet too big, established");
        assert_eq!((m.src, m.kind, m.rest), (VIP6, 2, 1280u32.to_be_bytes()));
        assert_eq!(reason_counts(&dp.pins)["frag_needed"], 2);
        let ok = Frame6::tcp(c, web, TCP_ACK, &[7; 1200]).build();
        expect_dnat(&mut dp, &ok, 8080, "a segment that fits");
    })
    .expect("namespace thread");
}

/// A namespace whose `dum0` (`fd00:10:245::1/64`, a veth, IPv6 forwarding on) routes
/// `prefixes` via `fd00:10:245::2`; with `neighbour`, dum0 has the MAC `02:00:00:00:00:01`
/// and that next hop is a permanent neighbour at `02:00:00:00:00:02` (XDP's route lookups
/// then resolve).
fn routed_ns(tag: &str, prefixes: &[&str], neighbour: bool) -> xlb_tests::netns::Netns {
    let ns = xlb_tests::netns::Netns::new(&format!("{tag}-n")).expect("netns");
    ns.sysctl(&[
        "net.ipv6.conf.all.forwarding=1",
        "net.ipv6.conf.default.forwarding=1",
    ])
    .expect("sysctl");
    let mut cmds: Vec<Vec<&str>> = vec![vec![
        "link", "add", "dum0", "type", "veth", "peer", "name", "dum1",
    ]];
    if neighbour {
        cmds.push(vec!["link", "set", "dum0", "address", "02:00:00:00:00:01"]);
    }
    cmds.push(vec!["link", "set", "dum1", "up"]);
    cmds.push(vec!["link", "set", "dum0", "up"]);
    cmds.push(vec!["link", "set", "lo", "up"]);
    cmds.push(vec![
        "-6",
        "addr",
        "add",
        "fd00:10:245::1/64",
        "dev",
        "dum0",
        "nodad",
    ]);
    for p in prefixes {
        cmds.push(vec![
            "-6",
            "route",
            "add",
            p,
            "via",
            "fd00:10:245::2",
            "dev",
            "dum0",
        ]);
    }
    if neighbour {
        let mac = "02:00:00:00:00:02";
        let n = [
            "-6",
            "neigh",
            "add",
            "fd00:10:245::2",
            "lladdr",
            mac,
            "dev",
            "dum0",
        ];
        cmds.push(n.into_iter().chain(["nud", "permanent"]).collect());
    }
    for args in &cmds {
        ns.ip(args).unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
    }
    ns
}

const XDP_PASS: u32 = 2;
const XDP_REDIRECT: u32 = 4;

/// The XDP program on a node interface over IPv6, in a namespace whose route to the pods
/// goes through `dum0` to a known neighbour: a new flow and a reply are translated and
/// passed (the egress takes no XDP frames yet), then redirected with the next hop's MACs and
/// the hop limit down by one; what XDP leaves to tc (ICMPv6, fragments, a frontend without
/// endpoints, a checksum still partial) passes untouched.
#[test]
fn xdp_translates_and_redirects_ipv6_flows() {
    if !require_root("xdp_translates_and_redirects_ipv6_flows") {
        return;
    }
    let tag = unique_tag("xlp6x");
    let ns = routed_ns(&tag, &["fd00:10:244::/48"], true);
    ns.run(move || {
        let ifindex = lb_userspace::netif::ifindex("dum0").expect("dum0");
        let mut dp = loaded(&tag);
        let web = sa(VIP6, 80);
        let c = client(40700);
        let syn = Frame6::tcp(c, web, TCP_SYN, b"").build();
        let r = dp.run_xdp(&syn, ifindex).expect("run");
        assert_eq!(r.verdict, XDP_PASS, "new flow, egress without XDP: passed");
        let out = seen6(&r.packet, "new flow");
        assert!(BACKENDS6.contains(out.dst.ip()), "translated: {out:?}");
        assert_eq!((out.src, out.dst.port()), (c, 8080));
        let backend = out.dst;
        assert_eq!(reason_counts(&dp.pins)["new_flow"], 1);
        let reply = Frame6::tcp(backend, c, TCP_SYN | TCP_ACK, b"").build();
        let r = dp.run_xdp(&reply, ifindex).expect("run");
        assert_eq!(r.verdict, XDP_PASS);
        assert_eq!(
            seen6(&r.packet, "reply").src,
            web,
            "the reply from the frontend"
        );
        dp.allow_xdp_redirect(ifindex).expect("devmap");
        let ack = Frame6::tcp(c, web, TCP_ACK, b"data").build();
        let r = dp.run_xdp(&ack, ifindex).expect("run");
        assert_eq!(
            r.verdict, XDP_REDIRECT,
            "established, egress runs XDP: redirected"
        );
        assert_eq!(&r.packet[0..6], &[2, 0, 0, 0, 0, 2], "next hop's MAC");
        assert_eq!(&r.packet[6..12], &[2, 0, 0, 0, 0, 1], "egress MAC");
        assert_eq!(r.packet[21], 63, "hop limit down by one");
        assert_eq!(seen6(&r.packet, "redirected").dst, backend);
        assert_eq!(reason_counts(&dp.pins)["xdp_redirect"], 1);
        // Left to tc, untouched.
        let mut partial = Frame6::tcp(c, web, TCP_ACK, b"").build();
        let src = CLIENT6.ip().octets();
        let dst = VIP6.octets();
        let mut sum = frame6::sum16(&src, frame6::sum16(&dst, 0)) + 6 + 20;
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        partial[70..72].copy_from_slice(&(sum as u16).to_be_bytes());
        for (what, frame) in [
            (
                "an echo request",
                Frame6::icmp(*c.ip(), VIP6, 128, 0, [0, 1, 0, 1], b"ping").build(),
            ),
            (
                "a fragment",
                Frame6::tcp(c, web, TCP_SYN, b"")
                    .with_ext(Ext::fragment(0, true))
                    .build(),
            ),
            (
                "a frontend without endpoints",
                Frame6::tcp(c, sa(EMPTY6, 80), TCP_SYN, b"").build(),
            ),
            ("a checksum still partial", partial),
        ] {
            let r = dp.run_xdp(&frame, ifindex).expect("run");
            assert_eq!((r.verdict, &r.packet), (XDP_PASS, &frame), "{what}");
        }
    })
    .expect("namespace thread");
}

/// An IPv6 externalIP (externalTrafficPolicy Cluster) whose endpoint is on another node:
/// a client's flow is SNATed to the node's IPv6 address toward the backend (the route's
/// source) with a port of the SNAT range, and the backend's reply to that address comes
/// back from the externalIP to the client. In a namespace routing the pods and the client.
#[test]
fn ipv6_flows_to_a_remote_backend_of_an_external_frontend_are_snated_to_the_node() {
    if !require_root(
        "ipv6_flows_to_a_remote_backend_of_an_external_frontend_are_snated_to_the_node",
    ) {
        return;
    }
    let tag = unique_tag("xlp6s");
    let ns = routed_ns(&tag, &["fd00:10:244::/48", "2001:db8::/32"], false);
    ns.run(move || {
        let node6: Ipv6Addr = "fd00:10:245::1".parse().expect("address");
        let ext: Ipv6Addr = "2001:db8:100::5".parse().expect("address");
        let remote: Ipv6Addr = "fd00:10:244:9::2".parse().expect("address");
        let yaml = format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: test, name: ext6}}\nspec:\n  ipFamilyPolicy: SingleStack\n  ipFamilies: [IPv6]\n  clusterIP: \"fd00:10:96::20\"\n  clusterIPs: [\"fd00:10:96::20\"]\n  externalIPs: [\"{ext}\"]\n  ports:\n  - {{name: p, port: 80, protocol: TCP, targetPort: 8080}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: test\n  name: ext6-1\n  labels: {{kubernetes.io/service-name: ext6}}\naddressType: IPv6\nports:\n- {{name: p, port: 8080, protocol: TCP}}\nendpoints:\n- addresses: [\"{remote}\"]\n  conditions: {{ready: true}}\n  nodeName: node2\n"
        );
        let mut dp = LoadedDatapath::load(&tag).expect("load");
        dp.configure(&lb_common::NodeConfig {
            snat_port_min: 40000,
            snat_port_max: 40100,
            ..Default::default()
        })
        .expect("config");
        let loaded = lb_userspace::source::file::parse("ext6.yaml", &yaml).expect("yaml");
        assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
        dp.program_on(
            &loaded.model,
            &lb_userspace::desired::NodeContext::new("node1", &[], false),
        )
        .expect("program");
        let client = sa("2001:db8:1::7".parse().expect("address"), 5555);
        let frontend = sa(ext, 80);
        let syn = Frame6::tcp(client, frontend, TCP_SYN, b"").build();
        let r = dp.run(&syn).expect("run");
        assert_eq!(r.verdict, TC_ACT_OK, "{:?}", reason_counts(&dp.pins));
        let out = seen6(&r.packet, "SNATed");
        assert_eq!(out.dst, sa(remote, 8080), "DNAT to the remote backend");
        assert_eq!(*out.src.ip(), node6, "SNAT to the node's address toward it");
        assert!((40000..=40100).contains(&out.src.port()), "{out:?}");
        let reply = Frame6::tcp(out.dst, out.src, TCP_SYN | TCP_ACK, b"").build();
        let r = dp.run(&reply).expect("run");
        assert_eq!(r.verdict, TC_ACT_OK);
        let back = seen6(&r.packet, "reply");
        assert_eq!((back.src, back.dst), (frontend, client), "back from the externalIP");
        // The next packet keeps its SNAT tuple.
        let ack = Frame6::tcp(client, frontend, TCP_ACK, b"x").build();
        let r = dp.run(&ack).expect("run");
        assert_eq!(seen6(&r.packet, "established").src, out.src);
        let flows = lb_userspace::list::conntrack(&dp.pins).expect("ct");
        assert!(
            flows.iter().any(|f| f.snat == format!("[{node6}]:{}", out.src.port())),
            "{flows:?}"
        );
        // A second client on the same port gets another SNAT port.
        let other = sa("2001:db8:1::8".parse().expect("address"), 5555);
        let r = dp
            .run(&Frame6::tcp(other, frontend, TCP_SYN, b"").build())
            .expect("run");
        let second = seen6(&r.packet, "second flow").src;
        assert_eq!(*second.ip(), node6);
        assert_ne!(second.port(), out.src.port(), "two flows never share a reply tuple");
    })
    .expect("namespace thread");
}
