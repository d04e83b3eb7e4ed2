//! Refusals and ICMP in both families: a service without endpoints answered as
//! kube-proxy's REJECT (TCP RST, port unreachable), ICMP errors about tracked flows
//! translated outside and in the quote, a packet too big for its route answered from the
//! frontend (IPv4 fragmentation needed, ICMPv6 Packet Too Big).

use std::net::SocketAddr;

use lb_userspace::packet::{TCP_ACK, TCP_SYN};
use xlb_tests::datapath::{LoadedDatapath, reason_counts};
use xlb_tests::suites::packets::{
    FAMILIES, Family, IcmpError, TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, frame, in_both_families,
    seen, seen_icmp,
};
use xlb_tests::{require_root, unique_tag};

const TCP_RST: u8 = 0x04;

/// The refusal a client gets from a service without endpoints, byte by byte, in both
/// families.
#[test]
fn services_without_endpoints_refuse_like_kube_proxy() {
    in_both_families(refusals);
}

fn refusals(f: &Family, dp: &mut LoadedDatapath) {
    let name = f.name();
    let at = f.l4_at();
    let c = f.client(40500);
    let empty = SocketAddr::new(f.empty, 80);
    let before = reason_counts(&dp.pins)["reject"];

    // SYN with payload: RST|ACK from the frontend acknowledging seq + payload + SYN, and
    // nothing else in the frame.
    let mut syn = frame(false, c, empty, TCP_SYN, b"early");
    syn[at + 4..at + 8].copy_from_slice(&7000u32.to_be_bytes());
    let r = dp.run(&syn).expect("run");
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "{name}: a SYN is answered");
    assert_eq!(r.packet.len(), at + 20, "{name}: Ethernet + IP + TCP");
    assert_eq!(
        &r.packet[0..6],
        &syn[6..12],
        "{name}: back to the sender's MAC"
    );
    let rst = seen(&r.packet, &format!("{name}: RST|ACK to a SYN"));
    assert_eq!((rst.src, rst.dst), (empty, c), "{name}: from the frontend");
    assert_eq!(r.packet[at + 13], TCP_RST | TCP_ACK, "{name}: RST|ACK");
    assert_eq!(
        &r.packet[at + 8..at + 12],
        &(7000u32 + 5 + 1).to_be_bytes(),
        "{name}: acknowledges the SYN and its payload"
    );

    // A segment with ACK set: RST whose sequence is that acknowledgment, no ACK flag.
    let mut ack = frame(false, c, empty, TCP_ACK, b"data");
    ack[at + 8..at + 12].copy_from_slice(&0xdead_beefu32.to_be_bytes());
    let r = dp.run(&ack).expect("run");
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "{name}: an ACK is answered");
    seen(&r.packet, &format!("{name}: RST to an ACK"));
    assert_eq!(r.packet[at + 13], TCP_RST, "{name}: RST alone");
    assert_eq!(
        &r.packet[at + 4..at + 8],
        &0xdead_beefu32.to_be_bytes(),
        "{name}: its sequence is the ACK's"
    );

    // UDP: port unreachable from the frontend, quoting the datagram's IP header + 8 bytes.
    let udp = frame(true, c, SocketAddr::new(f.empty, 53), 0, b"query payload");
    let r = dp.run(&udp).expect("run");
    assert_eq!(r.verdict, TC_ACT_REDIRECT, "{name}: a datagram is answered");
    let quoted = &udp[14..at + 8];
    assert_eq!(r.packet.len(), at + 8 + quoted.len(), "{name}: length");
    let m = seen_icmp(&r.packet, &format!("{name}: port unreachable"));
    assert_eq!(
        (m.src, m.dst),
        (f.empty, f.client),
        "{name}: from the frontend"
    );
    assert_eq!(m.kind, f.port_unreachable, "{name}: port unreachable");
    assert_eq!(m.quote, quoted, "{name}: quotes the datagram as sent");
    assert_eq!(reason_counts(&dp.pins)["reject"], before + 3, "{name}");

    // A RST is never answered.
    let rst_in = frame(false, c, empty, TCP_RST, b"");
    let r = dp.run(&rst_in).expect("run");
    assert_eq!(
        (r.verdict, &r.packet),
        (TC_ACT_SHOT, &rst_in),
        "{name}: a RST is dropped untouched"
    );
    let flows = lb_userspace::list::conntrack(&xlb_tests::pins(&dp.pins)).expect("list conntrack");
    assert!(
        flows.is_empty(),
        "{name}: a refusal keeps no flow: {flows:?}"
    );
}

/// ICMP errors about a tracked UDP flow, in both families: from the backend or a router
/// about what the client sent (its outer destination and the quote's source translated
/// back: the client sees an error about the packet it sent to the frontend), from the
/// client about the frontend's reply (to the backend, quoting what the backend sent), each
/// checksum right (the quoted L4 checksum as it was sent); an error about no tracked flow
/// untouched.
#[test]
fn icmp_errors_about_tracked_flows_are_translated_outer_and_inner() {
    in_both_families(errors_about_tracked_flows);
}

fn errors_about_tracked_flows(f: &Family, dp: &mut LoadedDatapath) {
    let at = f.l4_at();
    let c = f.client(40400);
    let dns = SocketAddr::new(f.vip, 53);
    let sent = frame(true, c, dns, 0, b"");
    let to_backend = dp.run(&sent).expect("run").packet;
    let backend = seen(&to_backend, &f.row("DNAT")).dst;
    assert!(f.backends.contains(&backend.ip()), "{}", f.row("DNAT"));
    let router = f.stranger(1);
    let before = reason_counts(&dp.pins)["icmp_xlate"];
    // (what, from, error, the outer source the client sees)
    let rows = [
        (
            "port unreachable from the backend",
            backend.ip(),
            IcmpError::PortUnreachable,
            f.vip,
        ),
        (
            "too big from a router toward the backend",
            router,
            IcmpError::TooBig(1280),
            router,
        ),
        (
            "time exceeded from a router",
            router,
            IcmpError::TimeExceeded,
            router,
        ),
    ];
    for (what, from, error, src) in rows {
        let what = f.row(what);
        let err = f.icmp_error(from, f.client, error, f.quote(&to_backend));
        let r = dp.run(&err).expect("run");
        assert_eq!(r.verdict, TC_ACT_OK, "{what}");
        let m = seen_icmp(&r.packet, &what);
        assert_eq!((m.src, m.dst), (src, f.client), "{what}: outer");
        assert_eq!((m.kind, m.rest), f.icmp_kind(error), "{what}");
        assert_eq!(
            m.quote,
            f.quote(&sent),
            "{what}: the quote is what the client sent"
        );
        let quoted_sum = at - 14 + 6..at - 14 + 8;
        assert_eq!(
            m.quote[quoted_sum],
            sent[at + 6..at + 8],
            "{what}: the quoted UDP checksum"
        );
    }
    // An error about a reply: the client refuses what the frontend sent it.
    let reply = frame(true, backend, c, 0, b"");
    let to_client = dp.run(&reply).expect("run").packet;
    assert_eq!(seen(&to_client, &f.row("reply")).src, dns);
    let what = f.row("an error about a reply");
    let err = f.icmp_error(
        f.client,
        f.vip,
        IcmpError::PortUnreachable,
        f.quote(&to_client),
    );
    let r = dp.run(&err).expect("run");
    assert_eq!(r.verdict, TC_ACT_OK, "{what}");
    let m = seen_icmp(&r.packet, &what);
    assert_eq!(
        (m.src, m.dst),
        (f.client, backend.ip()),
        "{what}: to the backend"
    );
    assert_eq!(
        m.quote,
        f.quote(&reply),
        "{what}: the reply as the backend sent it"
    );
    // Each error translated at ingress (its destination side); at egress the three about
    // packets toward the backend (their source side: the frontend), not the one about a
    // reply of a flow that is not SNATed (no source to restore there).
    assert_eq!(
        reason_counts(&dp.pins)["icmp_xlate"],
        before + 4 + 3,
        "{}",
        f.name()
    );
    // About no tracked flow: untouched.
    let what = f.row("an error about no flow");
    let stranger = frame(true, f.client(1), SocketAddr::new(router, 9), 0, b"");
    let err = f.icmp_error(
        router,
        f.client,
        IcmpError::PortUnreachable,
        f.quote(&stranger),
    );
    let r = dp.run(&err).expect("run");
    assert_eq!((r.verdict, &r.packet), (TC_ACT_OK, &err), "{what}");
}

/// In a namespace whose route to the backends has an MTU of 1280, in both families: a
/// packet bigger than that which may not be fragmented (IPv4: don't-fragment set; IPv6:
/// always) to a frontend, new flow or established, is answered from the frontend
/// (fragmentation needed, Packet Too Big) with the route's MTU, quoting it as the client
/// sent it, no flow created for it; one that fits is translated.
#[test]
fn packets_too_big_for_the_route_are_answered_from_the_frontend() {
    if !require_root() {
        return;
    }
    for f in FAMILIES {
        let tag = unique_tag(&format!("xlpm{}", f.name().to_ascii_lowercase()));
        let ns = f.routed_ns(&tag, &[], false, Some("1280"));
        ns.run(move || too_big(&f, &tag)).expect("namespace thread");
    }
}

fn too_big(f: &Family, tag: &str) {
    let mut dp = f.setup_tagged(tag);
    let dp = &mut dp;
    let web = SocketAddr::new(f.vip, 80);
    let answered = |dp: &mut LoadedDatapath, pkt: &[u8], what: &str| {
        let what = f.row(what);
        let r = dp.run(pkt).expect("run");
        assert_eq!(r.verdict, TC_ACT_REDIRECT, "{what}: answered");
        let m = seen_icmp(&r.packet, &what);
        assert_eq!(
            (m.src, m.dst),
            (f.vip, f.client),
            "{what}: from the frontend"
        );
        assert_eq!(
            (m.kind, m.rest),
            f.icmp_kind(IcmpError::TooBig(1280)),
            "{what}: the route's MTU"
        );
        assert_eq!(m.quote, f.quote(pkt), "{what}: quotes it as sent");
    };
    let big_syn = frame(false, f.client(40600), web, TCP_SYN, &[7; 1400]);
    answered(dp, &big_syn, "a new flow too big");
    assert_eq!(reason_counts(&dp.pins)["frag_needed"], 1, "{}", f.name());
    let flows = lb_userspace::list::conntrack(&xlb_tests::pins(&dp.pins)).expect("ct");
    assert!(flows.is_empty(), "{}: no flow: {flows:?}", f.name());
    // A flow that fits, then a segment of it that does not.
    let c = f.client(40601);
    let fits = |dp: &mut LoadedDatapath, pkt: &[u8], what: &str| {
        let what = f.row(what);
        let r = dp.run(pkt).expect("run");
        assert_eq!(r.verdict, TC_ACT_OK, "{what}");
        let out = seen(&r.packet, &what);
        assert!(
            f.backends.contains(&out.dst.ip()) && out.dst.port() == 8080,
            "{what}: {out:?}"
        );
    };
    fits(
        dp,
        &frame(false, c, web, TCP_SYN, &[7; 1000]),
        "fits the route",
    );
    let big = frame(false, c, web, TCP_ACK, &[7; 1300]);
    answered(dp, &big, "an established segment too big");
    assert_eq!(reason_counts(&dp.pins)["frag_needed"], 2, "{}", f.name());
    let ok = frame(false, c, web, TCP_ACK, &[7; 1200]);
    fits(dp, &ok, "a segment that fits");
}
