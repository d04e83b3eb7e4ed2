//! Slot ranges: a frontend whose backends outgrow its range of the slot array moves to a new
//! one (its flows keep their backends, new flows pick from the new range), and a range at
//! the array's very end serves like any other.

use std::net::{Ipv4Addr, SocketAddrV4};

use lb_common::user::frontend_key;
use lb_userspace::{
    datapath::sizes::MapSizes,
    model::Protocol,
    packet::{PacketBuilder, TCP_ACK, parse},
    source::file,
};
use xlb_tests::suites::packets::{BACKENDS, CLIENT, EMPTY_VIP, TC_ACT_OK, VIP, setup};
use xlb_tests::{datapath::LoadedDatapath, require_root, services::service_yaml, unique_tag};

/// web's backends after its scale-up: two more than its range of four holds.
const MORE: [Ipv4Addr; 5] = [
    BACKENDS[0],
    BACKENDS[1],
    BACKENDS[2],
    Ipv4Addr::new(10, 244, 5, 2),
    Ipv4Addr::new(10, 244, 6, 2),
];

/// A row of a table: what must hold, and the check (packets through `dp`).
type Row = (&'static str, Box<dyn Fn(&mut LoadedDatapath) -> bool>);

/// Where `packet`'s flow goes (the destination tc left it with).
fn dst(dp: &mut LoadedDatapath, packet: &[u8]) -> SocketAddrV4 {
    let r = dp.run(packet).expect("run");
    assert_eq!(r.verdict, TC_ACT_OK);
    parse(&r.packet).expect("parses").dst
}

/// The backends new flows from `ports` of the client reach at `to` (TCP SYNs, or UDP).
fn new_flows(
    dp: &mut LoadedDatapath,
    to: SocketAddrV4,
    udp: bool,
    ports: std::ops::Range<u16>,
) -> std::collections::BTreeSet<Ipv4Addr> {
    ports
        .map(|p| {
            let from = SocketAddrV4::new(*CLIENT.ip(), p);
            let pkt = match udp {
                true => PacketBuilder::udp(from, to).build(),
                false => PacketBuilder::tcp(from, to).build(),
            };
            *dst(dp, &pkt).ip()
        })
        .collect()
}

#[test]
fn a_frontend_that_moves_to_a_new_range_keeps_its_flows_and_picks_new_ones_from_it() {
    let Some(mut dp) = setup() else {
        return;
    };
    let web = SocketAddrV4::new(VIP, 80);
    let key = frontend_key(VIP, 80, Protocol::Tcp);
    let old = dp.state().services[&key].value;
    assert_eq!(old.count, 3, "three backends, a range of four");
    let first = dst(&mut dp, &PacketBuilder::tcp(CLIENT, web).build());

    // Five backends outgrow the range of four: web moves to a range of eight.
    let yaml = service_yaml("web", VIP, 80, "TCP", 8080, &MORE)
        + &service_yaml("dns", VIP, 53, "UDP", 5353, &BACKENDS)
        + &service_yaml("empty", EMPTY_VIP, 80, "TCP", 8080, &[]);
    dp.program(&file::parse("t.yaml", &yaml).expect("yaml").model)
        .expect("reprogram");
    let moved = dp.state().services[&key].value;
    assert_ne!(moved.slot_base, old.slot_base, "a new range");
    assert_eq!(moved.count, 5);

    let ack = PacketBuilder::tcp(CLIENT, web)
        .flags(TCP_ACK)
        .payload(b"more")
        .build();
    // (what, where it must go)
    let table: [Row; 2] = [
        (
            "the flow established before the move keeps its backend",
            Box::new(move |dp| dst(dp, &ack) == first),
        ),
        (
            "new flows pick from the new range: every backend, the two new ones among them",
            Box::new(move |dp| {
                new_flows(dp, web, false, 41000..41400) == MORE.iter().copied().collect()
            }),
        ),
    ];
    for (what, holds) in table {
        assert!(holds(&mut dp), "{what}");
    }
}

#[test]
fn a_range_at_the_end_of_the_slot_array_serves_its_frontend() {
    if !require_root() {
        return;
    }
    // Six slots: the first frontend placed (dns: placed in model order) takes a range of
    // four at 0..4, the second (web) the last two slots (4..6, the array's end) and serves
    // with the first two of its three backends.
    let sizes = MapSizes {
        slots: 6,
        ..MapSizes::default()
    };
    let mut dp = LoadedDatapath::load_sized(&unique_tag("xlbps"), &sizes).expect("load");
    let yaml = service_yaml("web", VIP, 80, "TCP", 8080, &BACKENDS)
        + &service_yaml("dns", VIP, 53, "UDP", 5353, &BACKENDS);
    dp.program(&file::parse("t.yaml", &yaml).expect("yaml").model)
        .expect("program");
    let state = dp.state();
    let range = |port, proto| {
        let e = &state.services[&frontend_key(VIP, port, proto)];
        (e.slot_base, e.count)
    };
    assert_eq!(range(53, Protocol::Udp), (0, 3));
    assert_eq!(
        range(80, Protocol::Tcp),
        (4, 2),
        "web's range ends where the array does"
    );
    // (frontend, UDP, the backends its new flows reach)
    let table = [
        (SocketAddrV4::new(VIP, 80), false, &BACKENDS[..2]),
        (SocketAddrV4::new(VIP, 53), true, &BACKENDS[..]),
    ];
    for (to, udp, want) in table {
        let got = new_flows(&mut dp, to, udp, 42000..42300);
        assert_eq!(got, want.iter().copied().collect(), "new flows to {to}");
    }
}
