//! The Maglev table lookup at tc (`select::xlb_maglev_slot`): a frontend flagged
//! `SVC_F_MAGLEV` sends each new flow to the backend its table holds for the flow's hash,
//! as the agent's table (`desired::maglev`) and the shared hash (`lb_common::flow_hash`)
//! say, on every node alike; without the flag it picks at random. The table and the flag
//! are written into the programmed maps here, as the agent will write them.

use std::net::{Ipv4Addr, SocketAddrV4};

use aya::maps::{Array, HashMap, MapData};
use lb_common::{
    FAMILY_V4, IPPROTO_TCP, MAGLEV_ROW_SLOTS, MAP_MAGLEV, MAP_SVC, MaglevRow, SCOPE_EXTERNAL,
    SVC_F_MAGLEV, SvcKey, SvcValue, flow_hash,
};
use lb_userspace::{
    desired::maglev,
    packet::{PacketBuilder, TCP_SYN, parse},
};
use xlb_tests::{
    datapath::LoadedDatapath,
    suites::packets::{BACKENDS, TC_ACT_OK, VIP, setup},
};

/// The table size of this test (one of the sizes the agent accepts).
const M: u32 = 1021;
/// The row the test's table goes into.
const ROW: u32 = 5;

fn key(slot: u16) -> SvcKey {
    SvcKey {
        addr_be: [u32::from_ne_bytes(VIP.octets()), 0, 0, 0],
        port_be: 80u16.to_be(),
        slot,
        proto: IPPROTO_TCP,
        family: FAMILY_V4,
        scope: SCOPE_EXTERNAL,
        _pad: 0,
    }
}

/// The web frontend's backends by slot (1..=count), as programmed.
fn slots(dp: &LoadedDatapath) -> Vec<Ipv4Addr> {
    let state = dp.state();
    let count = state.services[&key(0)].count;
    (1..=count)
        .map(|n| {
            let id = state.services[&key(n)].backend_id;
            Ipv4Addr::from(state.backends[&id].addr_be[0].to_ne_bytes())
        })
        .collect()
}

/// Writes the Maglev table of the web frontend's backends into row [`ROW`] and flags its
/// service entry; the table in slot terms, entry by entry.
fn turn_on(dp: &mut LoadedDatapath) -> Vec<u16> {
    let by_slot = slots(dp);
    let names: Vec<String> = by_slot.iter().map(|a| format!("{a}:8080")).collect();
    let (sorted, table) = maglev::table(&names, M, b"xlb");
    let slot_of = |i: u32| {
        let name = &sorted[i as usize];
        names
            .iter()
            .position(|n| n == name)
            .expect("a backend's name") as u16
            + 1
    };
    let entries: Vec<u16> = table.iter().map(|i| slot_of(*i)).collect();
    let mut row: MaglevRow = bytemuck::Zeroable::zeroed();
    row.size = M;
    row.slots[..entries.len()].copy_from_slice(&entries);
    // Through the pins, as another process (the agent) writes them.
    let pinned = |name: &str| {
        let map = MapData::from_pin(dp.pins.join(name)).expect("pinned map");
        aya::maps::Map::from_map_data(map).expect("map")
    };
    let mut rows: Array<MapData, MaglevRow> = Array::try_from(pinned(MAP_MAGLEV)).expect("array");
    rows.set(ROW, row, 0).expect("write the row");
    let mut svc: HashMap<MapData, SvcKey, SvcValue> =
        HashMap::try_from(pinned(MAP_SVC)).expect("hash");
    let mut v = svc.get(&key(0), 0).expect("the web frontend");
    v.flags |= SVC_F_MAGLEV;
    v.backend_id = ROW;
    svc.insert(key(0), v, 0).expect("flag it");
    entries
}

/// The backend a SYN from `client` reaches (its rewritten destination).
fn reached(dp: &mut LoadedDatapath, client: SocketAddrV4) -> Ipv4Addr {
    let syn = PacketBuilder::tcp(client, SocketAddrV4::new(VIP, 80))
        .flags(TCP_SYN)
        .build();
    let r = dp.run_ingress(&syn).expect("run");
    assert_eq!(r.verdict, TC_ACT_OK, "{client}");
    *parse(&r.packet).expect("parses").dst.ip()
}

/// 200 client tuples: 50 addresses × 4 ports.
fn clients() -> Vec<SocketAddrV4> {
    (0..200u32)
        .map(|i| {
            let ip = Ipv4Addr::new(192, 0, 2, (i / 4) as u8 + 1);
            SocketAddrV4::new(ip, 40000 + (i % 4) as u16 * 1111)
        })
        .collect()
}

#[test]
fn maglev_frontends_send_each_flow_to_the_backend_its_table_holds() {
    let Some(mut node1) = setup("maglev_frontends_send_each_flow") else {
        return;
    };
    let Some(mut node2) = setup("maglev_frontends_send_each_flow_node2") else {
        return;
    };
    let entries = turn_on(&mut node1);
    assert_eq!(turn_on(&mut node2), entries, "both nodes compute one table");
    assert!(entries.len() as u32 == M && (M as usize) <= MAGLEV_ROW_SLOTS);
    let by_slot = slots(&node1);
    let mut seen = std::collections::BTreeSet::new();
    for c in clients() {
        let h = flow_hash(
            &[u32::from_ne_bytes(c.ip().octets()), 0, 0, 0],
            &[u32::from_ne_bytes(VIP.octets()), 0, 0, 0],
            c.port().to_be(),
            80u16.to_be(),
            IPPROTO_TCP,
        );
        let want = by_slot[entries[(h % M) as usize] as usize - 1];
        let got = reached(&mut node1, c);
        assert_eq!(got, want, "{c}: entry {} of the table", h % M);
        assert_eq!(reached(&mut node2, c), want, "{c}: the other node");
        seen.insert(got);
    }
    assert_eq!(
        seen.len(),
        BACKENDS.len(),
        "200 flows over 3 backends: {seen:?}"
    );
}
