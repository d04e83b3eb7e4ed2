//! A finished flow gives its SNAT port back.

use std::net::SocketAddrV4;

use lb_userspace::packet::{PacketBuilder, parse};
use xlb_tests::suites::packets_north_south::{
    EXT, NODE, REMOTE_POD, SNAT_MIN, TC_ACT_OK, TC_ACT_SHOT, UNDERLAY, on_node1,
};
use xlb_tests::{datapath::LoadedDatapath, require_root};

/// A SNAT port is held while its flow lives, and goes to a new flow once the old one is over
/// (here: closing and idle, its timestamps aged through the map): with a one-port range, the
/// second flow is refused, then takes the port, and the old flow's forward entry is gone.
#[test]
fn a_finished_flow_gives_its_snat_port_back() {
    if !require_root() {
        return;
    }
    on_node1("xpr", SNAT_MIN, reuse_table);
}

fn reuse_table(dp: &mut LoadedDatapath, _ifindex: u32) {
    use aya::maps::{HashMap, MapData};
    use lb_common::{CT_F_CLOSING, CtKey, CtValue, MAP_CT};

    let np = SocketAddrV4::new(NODE, 30001);
    let first = SocketAddrV4::new(*EXT.ip(), 7001);
    let second = SocketAddrV4::new(*EXT.ip(), 7002);
    let r = dp.run(&PacketBuilder::tcp(first, np).build()).expect("run");
    assert_eq!(r.verdict, TC_ACT_OK, "the first flow takes the only port");
    let p = parse(&r.packet).expect("parses");
    assert_eq!(p.src, SocketAddrV4::new(UNDERLAY, SNAT_MIN));
    let r = dp
        .run(&PacketBuilder::tcp(second, np).build())
        .expect("run");
    assert_eq!(
        r.verdict, TC_ACT_SHOT,
        "a live flow holds its port: the second flow is refused"
    );
    let mut ct: HashMap<MapData, CtKey, CtValue> =
        HashMap::try_from(xlb_tests::pins(&dp.pins).map(MAP_CT).expect("pin"))
            .expect("conntrack map");
    // Makes every entry look idle for 20 s: past a closed flow's reuse time (10 s), short of
    // an open TCP flow's (24 h). Not "since boot": a machine up for more than a day would
    // see even the half-closed flow as over.
    let idle_since =
        lb_userspace::datapath::clock::monotonic_coarse_ns().saturating_sub(20_000_000_000);
    let age = |ct: &mut HashMap<MapData, CtKey, CtValue>| {
        let entries: Vec<(CtKey, CtValue)> = ct.iter().map(|kv| kv.expect("entry")).collect();
        assert_eq!(
            entries.len(),
            4,
            "one SNATed flow, four entries (forward, reply and the two egress ones): {entries:?}"
        );
        for (k, v) in &entries {
            let aged = CtValue {
                last_seen_ns: idle_since,
                created_ns: idle_since,
                ..*v
            };
            ct.insert(k, aged, 0).expect("age the entry");
        }
        entries
    };
    // Half-closed (the client's FIN only) and idle: the backend may still be sending, so the
    // port stays with the flow.
    let r = dp
        .run(&PacketBuilder::tcp(first, np).flags(0x11).build())
        .expect("run");
    assert_eq!(r.verdict, TC_ACT_OK, "FIN of the first flow's client");
    age(&mut ct);
    let r = dp
        .run(&PacketBuilder::tcp(second, np).build())
        .expect("run");
    assert_eq!(r.verdict, TC_ACT_SHOT, "a half-closed flow keeps its port");
    // The backend's FIN closes the other way: over, once idle.
    let backend = SocketAddrV4::new(REMOTE_POD, 8080);
    let snat = SocketAddrV4::new(UNDERLAY, SNAT_MIN);
    let r = dp
        .run(&PacketBuilder::tcp(backend, snat).flags(0x11).build())
        .expect("run");
    assert_eq!(r.verdict, TC_ACT_OK, "FIN of the first flow's backend");
    for (k, v) in age(&mut ct) {
        assert!(
            v.flags & CT_F_CLOSING != 0,
            "each direction's FIN marked its entry closing: {k:?} {v:?}"
        );
    }
    let r = dp
        .run(&PacketBuilder::tcp(second, np).build())
        .expect("run");
    assert_eq!(
        r.verdict, TC_ACT_OK,
        "the finished flow's port is free again"
    );
    let p = parse(&r.packet).expect("parses");
    assert_eq!(p.src, SocketAddrV4::new(UNDERLAY, SNAT_MIN));
    let firsts = ct
        .iter()
        .filter_map(Result::ok)
        .filter(|(k, _)| k.dir == 0 && u16::from_be(k.sport_be) == first.port())
        .count();
    assert_eq!(firsts, 0, "the old flow's forward entry was removed");
}
