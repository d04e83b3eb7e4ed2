//! Refusals (no endpoints), ICMPv6 errors about tracked flows, Packet Too Big.

use super::*;

/// The first bytes of an answer's quote: the packet as the client sent it.
fn quoted(frame: &[u8]) -> Vec<u8> {
    frame[14..62].to_vec()
}

#[test]
fn icmpv6_errors_about_tracked_flows_are_translated_outer_and_inner() {
    let Some(mut dp) = setup() else {
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
    // Each error translated at ingress (its destination side); at egress the three about
    // packets toward the backend (their source side: the frontend), not the one about a reply
    // of a flow that is not SNATed (no source to restore there).
    assert_eq!(reason_counts(&dp.pins)["icmp_xlate"], before + 4 + 3);
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
    if !require_root() {
        return;
    }
    let tag = unique_tag("xlp6m");
    let ns = super::routed::routed_ns(&tag, &["fd00:10:244::/48"], false, Some("1280"));
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
            lb_userspace::list::conntrack(&xlb_tests::pins(&dp.pins))
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
