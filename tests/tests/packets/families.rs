//! The packet tables both families share: each case is one body run over IPv4 and IPv6
//! ([`FAMILIES`]), each family on a datapath of its own with its table's services.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use lb_userspace::packet::{TCP_ACK, TCP_SYN};
use xlb_tests::datapath::{LoadedDatapath, reason_counts};
use xlb_tests::suites::packets::{
    FAMILIES, Family, TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, frame, seen, seen_icmp,
};

const TCP_RST: u8 = 0x04;

/// Runs `case` over each family, on a datapath of its own with that family's services
/// (nothing, after the notice, without root).
fn in_both_families(case: fn(&Family, &mut LoadedDatapath)) {
    for f in FAMILIES {
        let Some(mut dp) = f.setup() else {
            return;
        };
        case(&f, &mut dp);
    }
}

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
    let (src, dst, kind, quote) = seen_icmp(&r.packet, &format!("{name}: port unreachable"));
    assert_eq!((src, dst), (f.empty, f.client), "{name}: from the frontend");
    assert_eq!(kind, f.port_unreachable, "{name}: port unreachable");
    assert_eq!(quote, quoted, "{name}: quotes the datagram as sent");
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

/// After a takeover (kube-proxy's flows adopted) or when a pod's process moves into the
/// socket hooks' cgroup, a client's socket talks to a backend itself on a port an earlier
/// translated flow used: that flow's entries must go, or the backend's answers would come
/// back from the frontend and the socket (connected to the backend) refuse them. In both
/// families, over UDP and TCP.
#[test]
fn a_client_talking_to_the_backend_itself_ends_the_translated_flow_on_its_port() {
    in_both_families(client_talks_to_the_backend);
}

fn client_talks_to_the_backend(f: &Family, dp: &mut LoadedDatapath) {
    let translated = |dp: &mut LoadedDatapath, pkt: &[u8], what: &str| {
        let r = dp.run(pkt).expect("run");
        assert_eq!(r.verdict, TC_ACT_OK, "{what}");
        seen(&r.packet, what)
    };
    let cases = [("UDP", 53, true), ("TCP", 80, false)];
    for (i, (proto, port, udp)) in cases.into_iter().enumerate() {
        let what = format!("{} {proto}", f.name());
        let what = what.as_str();
        let frontend = SocketAddr::new(f.vip, port);
        let client = f.client(45000 + i as u16);
        let build = |from, to, flags| frame(udp, from, to, flags, b"q");
        // A translated flow, answered: its replies come from the frontend.
        let backend = translated(dp, &build(client, frontend, TCP_SYN), what).dst;
        let answer = translated(dp, &build(backend, client, TCP_SYN | TCP_ACK), what);
        assert_eq!(answer.src, frontend, "{what}: the translated flow's answer");
        let before = reason_counts(&dp.pins)["ct_superseded"];
        // A packet that cannot begin a flow, straight to the backend, leaves it alone.
        if !udp {
            let ack = build(client, backend, TCP_ACK);
            assert_eq!(dp.run(&ack).expect("run").packet, ack, "{what}");
            let answer = translated(dp, &build(backend, client, TCP_ACK), what);
            assert_eq!(answer.src, frontend, "{what}: an ACK ends nothing");
        }
        // The client's new socket, translated at connect, sends to the backend itself.
        let direct = build(client, backend, TCP_SYN);
        let r = dp.run(&direct).expect("run");
        assert_eq!(
            (r.verdict, &r.packet),
            (TC_ACT_OK, &direct),
            "{what}: passed untouched"
        );
        let counts = reason_counts(&dp.pins);
        assert_eq!(counts["ct_superseded"], before + 1, "{what}: {counts:?}");
        // Its answer reaches the socket as the backend sent it.
        let answer = build(backend, client, TCP_SYN | TCP_ACK);
        assert_eq!(
            dp.run(&answer).expect("run").packet,
            answer,
            "{what}: the backend's answer is no longer the frontend's"
        );
        // And the client's next packet to the frontend is a new flow.
        let again = translated(dp, &build(client, frontend, TCP_SYN), what);
        assert!(f.backends.contains(&again.dst.ip()), "{what}: {again:?}");
    }
}

/// Packets that are no service's pass untouched in both families, each counted as `pass`
/// by tc ingress and again by tc egress, and no flow is created.
#[test]
fn packets_not_for_a_service_pass_untouched() {
    in_both_families(not_for_a_service);
}

fn not_for_a_service(f: &Family, dp: &mut LoadedDatapath) {
    let stranger = match f.vip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7)),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 7)),
    };
    // (what, UDP, destination)
    let rows = [
        (
            "TCP to an address that is no frontend",
            false,
            (stranger, 80),
        ),
        (
            "TCP to a backend's own address",
            false,
            (f.backends[0], 8080),
        ),
        (
            "TCP to the frontend's address on a port that is not a service's",
            false,
            (f.vip, 81),
        ),
        ("UDP to the TCP service's port", true, (f.vip, 80)),
    ];
    let before = reason_counts(&dp.pins);
    for (i, (what, udp, to)) in rows.into_iter().enumerate() {
        let what = format!("{}: {what}", f.name());
        let pkt = frame(udp, f.client(40100 + i as u16), to.into(), TCP_SYN, b"");
        let counted = reason_counts(&dp.pins)["pass"];
        let r = dp.run(&pkt).expect("run");
        assert_eq!(
            (r.verdict, &r.packet),
            (TC_ACT_OK, &pkt),
            "{what}: passed untouched"
        );
        assert_eq!(
            reason_counts(&dp.pins)["pass"],
            counted + 2,
            "{what}: counted as pass at ingress and at egress"
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

/// A service's flows are translated both ways in both families: the first packet DNATed to
/// a backend on the target port (the client's address kept, checksums valid), the backend's
/// reply from the frontend again, the flow's next packet to the same backend, each counted.
#[test]
fn service_flows_are_translated_both_ways_with_valid_checksums() {
    in_both_families(flows_both_ways);
}

fn flows_both_ways(f: &Family, dp: &mut LoadedDatapath) {
    // (what, UDP, frontend port, backend port, payload)
    let rows: [(&str, bool, u16, u16, &[u8]); 3] = [
        ("TCP SYN", false, 80, 8080, b""),
        ("UDP", true, 53, 5353, b"query"),
        (
            "TCP with a payload of odd length",
            false,
            80,
            8080,
            b"GET /x",
        ),
    ];
    for (i, (what, udp, port, target, payload)) in rows.into_iter().enumerate() {
        let what = format!("{}: {what}", f.name());
        let c = f.client(40001 + i as u16);
        let frontend = SocketAddr::new(f.vip, port);
        let before = reason_counts(&dp.pins);
        let first = frame(udp, c, frontend, TCP_SYN, payload);
        let r = dp.run(&first).expect("run");
        assert_eq!(r.verdict, TC_ACT_OK, "{what}");
        assert_eq!(r.packet.len(), first.len(), "{what}: length");
        let out = seen(&r.packet, &what);
        assert!(
            f.backends.contains(&out.dst.ip()) && out.dst.port() == target,
            "{what}: {} is no backend on {target}",
            out.dst
        );
        assert_eq!(out.src, c, "{what}: the client's address is kept");
        let after = reason_counts(&dp.pins);
        assert_eq!(after["new_flow"], before["new_flow"] + 1, "{what}: counted");
        // The backend's reply: the frontend as its source again, the client kept.
        let reply = frame(udp, out.dst, c, TCP_SYN | TCP_ACK, b"answer");
        let r = dp.run(&reply).expect("run");
        assert_eq!(r.verdict, TC_ACT_OK, "{what}: reply");
        let back = seen(&r.packet, &format!("{what}: reply"));
        assert_eq!((back.src, back.dst), (frontend, c), "{what}: the reply");
        assert_eq!(
            reason_counts(&dp.pins)["reverse_nat"],
            after["reverse_nat"] + 1,
            "{what}: reply counted"
        );
        // The flow's next packet goes to the same backend, from its entry.
        let next = frame(udp, c, frontend, TCP_ACK, b"more");
        let r = dp.run(&next).expect("run");
        assert_eq!(r.verdict, TC_ACT_OK, "{what}: next");
        let again = seen(&r.packet, &format!("{what}: next"));
        assert_eq!(again.dst, out.dst, "{what}: the flow keeps its backend");
        assert_eq!(
            reason_counts(&dp.pins)["established"],
            after["established"] + 1,
            "{what}: next counted"
        );
    }
}

/// 300 new flows to web spread over its three backends in both families (each gets at
/// least 45), every rewrite with valid checksums, and `xlb list conntrack` shows them.
#[test]
fn new_flows_spread_over_all_backends_and_are_listed() {
    in_both_families(spread_and_listed);
}

fn spread_and_listed(f: &Family, dp: &mut LoadedDatapath) {
    let web = SocketAddr::new(f.vip, 80);
    let mut seen_by = std::collections::BTreeMap::new();
    for port in 20000..20300u16 {
        let pkt = frame(false, f.client(port), web, TCP_SYN, b"");
        let r = dp.run(&pkt).expect("run");
        assert_eq!(r.verdict, TC_ACT_OK, "{}", f.name());
        let out = seen(&r.packet, &format!("{}: new flow", f.name()));
        *seen_by.entry(out.dst.ip()).or_insert(0) += 1;
    }
    for b in f.backends {
        let n = seen_by.get(&b).copied().unwrap_or(0);
        assert!(
            n >= 45,
            "{}: backend {b} got {n} of 300: {seen_by:?}",
            f.name()
        );
    }
    let flows = lb_userspace::list::conntrack(&xlb_tests::pins(&dp.pins)).expect("list conntrack");
    let web = web.to_string();
    let listed = flows.iter().filter(|r| r.frontend == web).count();
    assert!(listed >= 300, "{}: xlb list conntrack: {flows:?}", f.name());
    let first = f.client(20000).to_string();
    assert!(
        flows.iter().any(|r| r.client == first),
        "{}: {first} listed: {flows:?}",
        f.name()
    );
}

/// A TCP SYN and a UDP datagram cut at every length in both families: what the kernel
/// runs (from a whole Ethernet and IP header on) is malformed, dropped untouched, and no
/// flow is created.
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
    let mut ran = 0;
    for pkt in [&tcp, &udp] {
        for len in 0..pkt.len() {
            let cut = &pkt[..len];
            match dp.run(cut) {
                // BPF_PROG_TEST_RUN refuses frames shorter than Ethernet and the IP header.
                Err(e) => assert!(len < f.l4_at(), "{name}: len {len}: refused: {e}"),
                Ok(r) => {
                    ran += 1;
                    assert!(len >= f.l4_at(), "{name}: len {len}: the kernel ran it");
                    // The IP header's length now exceeds the frame: malformed, dropped.
                    assert_eq!(r.verdict, TC_ACT_SHOT, "{name}: len {len}: malformed");
                    assert_eq!(r.packet, cut, "{name}: len {len}: rewritten");
                }
            }
        }
    }
    assert!(
        ran >= 40,
        "{name}: only {ran} cut frames reached the program"
    );
    let flows = lb_userspace::list::conntrack(&xlb_tests::pins(&dp.pins)).expect("list conntrack");
    assert!(
        flows.is_empty(),
        "{name}: no flow from a cut packet: {flows:?}"
    );
}
