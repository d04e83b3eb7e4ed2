//! The Maglev table lookup at tc (`select::xlb_maglev_slot`), programmed as the agent
//! programs it (`--lb-algorithm maglev`): an external frontend's new flow goes to the
//! backend its table holds for the flow's hash (`lb_common::flow_hash`), the same backend on
//! two nodes that learnt the backends in opposite orders; the same Service's ClusterIP
//! still picks at random, and a Service annotated `random` is not flagged.

use std::net::{Ipv4Addr, SocketAddrV4};

use lb_common::{FAMILY_V4, IPPROTO_TCP, SCOPE_EXTERNAL, SVC_F_MAGLEV, SvcKey, flow_hash};
use lb_userspace::{
    desired::{NodeContext, maglev},
    model::LbAlgorithm,
    packet::{PacketBuilder, TCP_SYN, parse},
    source::file,
};
use xlb_tests::{
    datapath::LoadedDatapath,
    require_root,
    services::service_yaml,
    suites::packets::{TC_ACT_OK, VIP},
    unique_tag,
};

/// The table size of this test (one of the sizes the agent accepts).
const M: u32 = 1021;
/// The Service's externalIP.
const EXT: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 7);

fn backends() -> Vec<Ipv4Addr> {
    (1..=10).map(|i| Ipv4Addr::new(10, 244, 2, i)).collect()
}

fn key(ip: Ipv4Addr) -> SvcKey {
    SvcKey {
        addr_be: [u32::from_ne_bytes(ip.octets()), 0, 0, 0],
        port_be: 80u16.to_be(),
        proto: IPPROTO_TCP,
        family: FAMILY_V4,
        scope: SCOPE_EXTERNAL,
        _pad0: 0,
        _pad1: 0,
    }
}

/// A datapath programmed with web (ClusterIP VIP, externalIP EXT) on `backends` (on this
/// node), in that order, and `other` (annotated `random`) beside it, by a node with `--lb-algorithm maglev`.
fn node(tag: &str, backends: &[Ipv4Addr]) -> LoadedDatapath {
    let ext = |y: String| {
        y.replacen(
            "spec:\n",
            &format!("spec:\n  externalIPs: [\"{EXT}\"]\n"),
            1,
        )
    };
    let other = service_yaml(
        "other",
        Ipv4Addr::new(10, 96, 0, 11),
        80,
        "TCP",
        8080,
        backends,
    )
    .replacen("spec:\n", "spec:\n  externalIPs: [\"203.0.113.8\"]\n", 1)
    .replacen(
        "name: other}",
        "name: other, annotations: {service.cilium.io/lb-algorithm: random}}",
        1,
    );
    // The backends on this node: no SNAT (TestRun has no route to SNAT toward).
    let yaml = (ext(service_yaml("web", VIP, 80, "TCP", 8080, backends)) + &other).replace(
        "  conditions: {ready: true}",
        "  nodeName: node1\n  conditions: {ready: true}",
    );
    let loaded = file::parse("maglev.yaml", &yaml).expect("yaml");
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    let mut dp = LoadedDatapath::load(&unique_tag(tag)).expect("load the eBPF object");
    let mut ctx = NodeContext::new("node1", &[], false);
    ctx.lb.algorithm = LbAlgorithm::Maglev;
    ctx.lb.maglev_size = M;
    dp.program_on(&loaded.model, &ctx).expect("program maps");
    dp
}

/// The backend a SYN from `client` to `vip` reaches (its rewritten destination).
fn reached(dp: &mut LoadedDatapath, client: SocketAddrV4, vip: Ipv4Addr) -> Ipv4Addr {
    let syn = PacketBuilder::tcp(client, SocketAddrV4::new(vip, 80))
        .flags(TCP_SYN)
        .build();
    let r = dp.run_ingress(&syn).expect("run");
    assert_eq!(
        r.verdict,
        TC_ACT_OK,
        "{client}: {:?}",
        xlb_tests::datapath::reason_counts(&dp.pins)
    );
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
    if !require_root() {
        return;
    }
    let mut reversed = backends();
    reversed.reverse();
    let mut node1 = node("xlbmg1", &backends());
    let mut node2 = node("xlbmg2", &reversed);
    // The table as every node computes it, by backend name (independent of slot order).
    let names: Vec<String> = backends().iter().map(|a| format!("{a}:8080/TCP")).collect();
    let (sorted, table) = maglev::table(
        &names,
        M,
        lb_userspace::desired::DEFAULT_MAGLEV_SEED.as_bytes(),
    );
    let state = node1.state();
    let entry = &state.services[&key(EXT)];
    assert!(entry.flags & SVC_F_MAGLEV != 0, "the externalIP is flagged");
    assert_eq!(
        state.maglev[&entry.svc_id].size(),
        M,
        "its table is programmed"
    );
    assert_eq!(
        state.services[&key(VIP)].flags & SVC_F_MAGLEV,
        0,
        "the ClusterIP picks at random"
    );
    let other = &state.services[&key(Ipv4Addr::new(203, 0, 113, 8))];
    assert_eq!(other.flags & SVC_F_MAGLEV, 0, "annotated random");
    assert_eq!(
        state.maglev.len(),
        1,
        "one table: {:?}",
        state.maglev.keys()
    );
    let mut seen = std::collections::BTreeSet::new();
    for c in clients() {
        let h = flow_hash(
            &[u32::from_ne_bytes(c.ip().octets()), 0, 0, 0],
            &[u32::from_ne_bytes(EXT.octets()), 0, 0, 0],
            c.port().to_be(),
            80u16.to_be(),
            IPPROTO_TCP,
        );
        let name = &sorted[table[(h % M) as usize] as usize];
        let want: Ipv4Addr = name
            .split(':')
            .next()
            .and_then(|a| a.parse().ok())
            .expect("ip");
        let got = reached(&mut node1, c, EXT);
        assert_eq!(got, want, "{c}: entry {} of the table", h % M);
        assert_eq!(reached(&mut node2, c, EXT), want, "{c}: the other node");
        seen.insert(got);
    }
    assert_eq!(seen.len(), 10, "200 flows over 10 backends: {seen:?}");
}
