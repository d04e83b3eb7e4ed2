//! Slot ranges, in both families: a frontend whose backends outgrow its range of the slot
//! array moves to a new one (its flows keep their backends, new flows pick from the new
//! range), and a range at the array's very end serves like any other.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use lb_common::user::frontend_key;
use lb_userspace::{
    datapath::sizes::MapSizes,
    model::Protocol,
    packet::{TCP_ACK, TCP_SYN},
};
use xlb_tests::suites::packets::{Family, TC_ACT_OK, frame, in_both_families, seen, service_of};
use xlb_tests::{datapath::LoadedDatapath, require_root, unique_tag};

/// A row of a table: what must hold, and the check (packets through `dp`).
type Row = (&'static str, Box<dyn Fn(&mut LoadedDatapath) -> bool>);

/// Where `packet`'s flow goes (the destination tc left it with).
fn dst(f: &Family, dp: &mut LoadedDatapath, packet: &[u8], what: &str) -> SocketAddr {
    let what = f.row(what);
    let r = dp.run(packet).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(r.verdict, TC_ACT_OK, "{what}");
    seen(&r.packet, &what).dst
}

/// The backends new flows from `ports` of the client reach at `to` (TCP SYNs, or UDP).
fn new_flows(
    f: &Family,
    dp: &mut LoadedDatapath,
    to: SocketAddr,
    udp: bool,
    ports: std::ops::Range<u16>,
) -> BTreeSet<IpAddr> {
    ports
        .map(|p| {
            let pkt = frame(udp, f.client(p), to, TCP_SYN, b"");
            dst(f, dp, &pkt, &format!("new flow from port {p} to {to}")).ip()
        })
        .collect()
}

/// web's backends after its scale-up: two more than its range of four holds.
fn more(f: &Family) -> Vec<IpAddr> {
    let mut all = f.backends.to_vec();
    all.extend([f.pod(5, 2), f.pod(6, 2)]);
    all
}

#[test]
fn a_frontend_that_moves_to_a_new_range_keeps_its_flows_and_picks_new_ones_from_it() {
    in_both_families(moves);
}

fn moves(f: &Family, dp: &mut LoadedDatapath) {
    let web = SocketAddr::new(f.vip, 80);
    let key = frontend_key(f.vip, 80, Protocol::Tcp);
    let old = dp.state().services[&key].value;
    assert_eq!(old.count, 3, "{}", f.row("three backends, a range of four"));
    let c = f.client(40000);
    let first = dst(f, dp, &frame(false, c, web, TCP_SYN, b""), "the first flow");

    // Five backends outgrow the range of four: web moves to a range of eight.
    let more = more(f);
    f.program(dp, &f.services(&more));
    let moved = dp.state().services[&key].value;
    assert_ne!(moved.slot_base, old.slot_base, "{}", f.row("a new range"));
    assert_eq!(moved.count, 5, "{}", f.row("five backends"));

    let ack = frame(false, c, web, TCP_ACK, b"more");
    let g = *f;
    let want: BTreeSet<IpAddr> = more.iter().copied().collect();
    // (what, where it must go)
    let table: [Row; 2] = [
        (
            "the flow established before the move keeps its backend",
            Box::new(move |dp| dst(&g, dp, &ack, "established") == first),
        ),
        (
            "new flows pick from the new range: every backend, the two new ones among them",
            Box::new(move |dp| new_flows(&g, dp, web, false, 41000..41400) == want),
        ),
    ];
    for (what, holds) in table {
        assert!(holds(dp), "{}", f.row(what));
    }
}

#[test]
fn a_range_at_the_end_of_the_slot_array_serves_its_frontend() {
    if !require_root() {
        return;
    }
    for f in &xlb_tests::suites::packets::FAMILIES {
        range_at_the_end(f);
    }
}

fn range_at_the_end(f: &Family) {
    // Six slots: the first frontend placed (dns: placed in model order) takes a range of
    // four at 0..4, the second (web) the last two slots (4..6, the array's end) and serves
    // with the first two of its three backends.
    let sizes = MapSizes {
        slots: 6,
        ..MapSizes::default()
    };
    let tag = unique_tag(&format!("xlbps{}", f.name().to_ascii_lowercase()));
    let mut dp = LoadedDatapath::load_sized(&tag, &sizes)
        .unwrap_or_else(|e| panic!("{}: load: {e}", f.name()));
    let yaml = service_of("web", f.vip, 80, "TCP", 8080, &f.backends)
        + &service_of("dns", f.vip, 53, "UDP", 5353, &f.backends);
    f.program(&mut dp, &yaml);
    let state = dp.state();
    let range = |port, proto| {
        let e = &state.services[&frontend_key(f.vip, port, proto)];
        (e.slot_base, e.count)
    };
    assert_eq!(range(53, Protocol::Udp), (0, 3), "{}", f.row("dns's range"));
    assert_eq!(
        range(80, Protocol::Tcp),
        (4, 2),
        "{}",
        f.row("web's range ends where the array does")
    );
    // (frontend, UDP, the backends its new flows reach)
    let table = [
        (SocketAddr::new(f.vip, 80), false, &f.backends[..2]),
        (SocketAddr::new(f.vip, 53), true, &f.backends[..]),
    ];
    for (to, udp, want) in table {
        let got = new_flows(f, &mut dp, to, udp, 42000..42300);
        assert_eq!(
            got,
            want.iter().copied().collect(),
            "{}",
            f.row(&format!("new flows to {to}"))
        );
    }
}
