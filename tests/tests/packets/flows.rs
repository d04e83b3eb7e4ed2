//! Service flows in both families: translated both ways with valid checksums, behind
//! optional headers (IPv4 options, IPv6 extension headers), spread over the backends, and
//! ended when the client talks to its backend itself.

use std::net::SocketAddr;

use lb_userspace::packet::{TCP_ACK, TCP_SYN};
use xlb_tests::datapath::{LoadedDatapath, reason_counts};
use xlb_tests::frame6::{NEXTHDR_DEST, NEXTHDR_HOP, NEXTHDR_ROUTING};
use xlb_tests::suites::packets::{Family, TC_ACT_OK, frame, in_both_families, seen};

/// A service's flows are translated both ways in both families: the first packet DNATed to
/// a backend on the target port (the client's address kept, checksums valid), the backend's
/// reply from the frontend again, the flow's next packet to the same backend, each counted.
#[test]
fn service_flows_are_translated_both_ways_with_valid_checksums() {
    in_both_families(flows_both_ways);
}

fn flows_both_ways(f: &Family, dp: &mut LoadedDatapath) {
    let rows = [
        Flow::new("TCP SYN", false, b"", &[]),
        Flow::new("UDP", true, b"query", &[]),
        Flow::new("TCP with a payload of odd length", false, b"GET /x", &[]),
    ];
    for (i, row) in rows.iter().enumerate() {
        both_ways(f, dp, row, f.client(40001 + i as u16));
    }
}

/// A row of the flow tables: TCP to the frontend's port 80 (backends' 8080) or UDP to 53
/// (5353), the first packet's payload, its optional headers (IPv6 extension header types;
/// IPv4 four option bytes for each), which every packet of the flow carries.
struct Flow {
    what: &'static str,
    udp: bool,
    payload: &'static [u8],
    exts: &'static [u8],
}

impl Flow {
    const fn new(
        what: &'static str,
        udp: bool,
        payload: &'static [u8],
        exts: &'static [u8],
    ) -> Self {
        Self {
            what,
            udp,
            payload,
            exts,
        }
    }
}

/// One row from `c`: the first packet DNATed to a backend on the target port (the client's
/// address kept, checksums valid), the backend's reply from the frontend again, the flow's
/// next packet to the same backend, each counted; the optional headers kept throughout.
fn both_ways(f: &Family, dp: &mut LoadedDatapath, row: &Flow, c: SocketAddr) {
    let what = f.row(row.what);
    let (port, target) = if row.udp { (53, 5353) } else { (80, 8080) };
    let frontend = SocketAddr::new(f.vip, port);
    let exts = row.exts;
    let with = |from, to, flags, payload: &[u8]| {
        f.with_options(&frame(row.udp, from, to, flags, payload), exts)
    };
    let before = reason_counts(&dp.pins);
    let first = with(c, frontend, TCP_SYN, row.payload);
    let out = kept_options(f, dp, &first, exts, &what);
    assert!(
        f.backends.contains(&out.dst.ip()) && out.dst.port() == target,
        "{what}: {} is no backend on {target}",
        out.dst
    );
    assert_eq!(out.src, c, "{what}: the client's address is kept");
    let after = reason_counts(&dp.pins);
    assert_eq!(after["new_flow"], before["new_flow"] + 1, "{what}: counted");
    // The backend's reply: the frontend as its source again, the client kept.
    let reply = with(out.dst, c, TCP_SYN | TCP_ACK, b"answer");
    let back = kept_options(f, dp, &reply, exts, &format!("{what}: reply"));
    assert_eq!((back.src, back.dst), (frontend, c), "{what}: the reply");
    assert_eq!(
        reason_counts(&dp.pins)["reverse_nat"],
        after["reverse_nat"] + 1,
        "{what}: reply counted"
    );
    // The flow's next packet goes to the same backend, from its entry.
    let next = with(c, frontend, TCP_ACK, b"more");
    let again = kept_options(f, dp, &next, exts, &format!("{what}: next"));
    assert_eq!(again.dst, out.dst, "{what}: the flow keeps its backend");
    assert_eq!(
        reason_counts(&dp.pins)["established"],
        after["established"] + 1,
        "{what}: next counted"
    );
}

/// Flows whose every packet carries optional headers after the fixed IP header (IPv4
/// options, which the direct path's fixed offsets cannot read, so they go through the
/// load/store and checksum helpers; IPv6 extension headers, walked) are translated both
/// ways as the plain ones, the headers kept, and listed by `xlb list conntrack`.
#[test]
fn flows_behind_optional_headers_are_translated_both_ways() {
    in_both_families(behind_options);
}

fn behind_options(f: &Family, dp: &mut LoadedDatapath) {
    let rows = [
        Flow::new(
            "TCP behind hop-by-hop, destination options and routing headers",
            false,
            b"odd",
            &[NEXTHDR_HOP, NEXTHDR_DEST, NEXTHDR_ROUTING],
        ),
        Flow::new(
            "UDP behind a destination options header",
            true,
            b"odd",
            &[NEXTHDR_DEST],
        ),
    ];
    for (i, row) in rows.iter().enumerate() {
        both_ways(f, dp, row, f.client(40003 + i as u16));
    }
    let flows = lb_userspace::list::conntrack(&xlb_tests::pins(&dp.pins)).expect("list conntrack");
    let (client, frontend) = (f.client(40003).to_string(), SocketAddr::new(f.vip, 80));
    assert!(
        flows
            .iter()
            .any(|r| r.client == client && r.frontend == frontend.to_string()),
        "{}: xlb list conntrack shows the flow: {flows:?}",
        f.name()
    );
}

/// Runs `pkt` (with `exts`' optional headers): passed on, its length and its optional
/// headers as they were, every checksum valid; what it says.
fn kept_options(
    f: &Family,
    dp: &mut LoadedDatapath,
    pkt: &[u8],
    exts: &[u8],
    what: &str,
) -> lb_userspace::trace::frame::Seen {
    let r = dp.run(pkt).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(r.verdict, TC_ACT_OK, "{what}");
    assert_eq!(r.packet.len(), pkt.len(), "{what}: length");
    let opts = f.l4_at()..f.l4_at() + exts.len() * f.option_bytes();
    assert_eq!(
        r.packet[opts.clone()],
        pkt[opts],
        "{what}: the optional headers are kept"
    );
    seen(&r.packet, what)
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
