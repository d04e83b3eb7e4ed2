//! The Maglev table lookup at tc (`select::xlb_maglev_slot`), programmed as the agent
//! programs it (`--lb-algorithm maglev`), in both families: an external frontend's new flow
//! goes to the backend its table holds for the flow's hash (`lb_common::flow_hash`), the
//! same backend on two nodes that learnt the backends in opposite orders; the same
//! Service's ClusterIP still picks at random, and a Service annotated `random` is not
//! flagged.

use std::net::{IpAddr, SocketAddr};

use lb_common::{
    IPPROTO_TCP, SVC_F_MAGLEV, flow_hash,
    user::{addr_words, frontend_key},
};
use lb_userspace::{
    desired::{NodeContext, maglev},
    model::LbAlgorithm,
    packet::TCP_SYN,
    source::file,
};
use xlb_tests::{
    datapath::LoadedDatapath,
    require_root,
    suites::packets::{FAMILIES, Family, TC_ACT_OK, frame, seen, service_of},
    unique_tag,
};

/// The table size of this test (one of the sizes the agent accepts).
const M: u32 = 1021;

/// The family's Maglev table: web's externalIP, the other Service's ClusterIP and
/// externalIP, the ten backends (pods 1 to 10 of the pod network's subnet 2).
struct Table {
    ext: IpAddr,
    other: IpAddr,
    other_ext: IpAddr,
    backends: Vec<IpAddr>,
}

fn table(f: &Family) -> Table {
    Table {
        ext: f.stranger(7),
        other: f.cluster_ip(11),
        other_ext: f.stranger(8),
        backends: (1..=10).map(|i| f.pod(2, i)).collect(),
    }
}

/// A datapath programmed with web (ClusterIP `f.vip`, externalIP `t.ext`) on `backends`
/// (on this node), in that order, and `other` (annotated `random`) beside it, by a node
/// with `--lb-algorithm maglev`.
fn node(f: &Family, t: &Table, tag: &str, backends: &[IpAddr]) -> LoadedDatapath {
    let ext = |y: String, ip: IpAddr| {
        y.replacen("spec:\n", &format!("spec:\n  externalIPs: [\"{ip}\"]\n"), 1)
    };
    let other = ext(
        service_of("other", t.other, 80, "TCP", 8080, backends),
        t.other_ext,
    )
    .replacen(
        "name: other}",
        "name: other, annotations: {service.cilium.io/lb-algorithm: random}}",
        1,
    );
    // The backends on this node: no SNAT (TestRun has no route to SNAT toward).
    let yaml = (ext(service_of("web", f.vip, 80, "TCP", 8080, backends), t.ext) + &other).replace(
        "  conditions: {ready: true}",
        "  nodeName: node1\n  conditions: {ready: true}",
    );
    let loaded = file::parse("maglev.yaml", &yaml).expect("yaml");
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    let tag = unique_tag(&format!("{tag}{}", f.name().to_ascii_lowercase()));
    let mut dp = LoadedDatapath::load(&tag).unwrap_or_else(|e| panic!("{}: load: {e}", f.name()));
    let mut ctx = NodeContext::new("node1", &[], false);
    ctx.lb.algorithm = LbAlgorithm::Maglev;
    ctx.lb.maglev_size = M;
    dp.program_on(&loaded.model, &ctx).expect("program maps");
    dp
}

/// The backend a SYN from `client` to `frontend`:80 reaches (its rewritten destination).
fn reached(f: &Family, dp: &mut LoadedDatapath, client: SocketAddr, frontend: IpAddr) -> IpAddr {
    let what = f.row(&format!("SYN from {client}"));
    let syn = frame(false, client, SocketAddr::new(frontend, 80), TCP_SYN, b"");
    let r = dp
        .run_ingress(&syn)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(
        r.verdict,
        TC_ACT_OK,
        "{what}: {:?}",
        xlb_tests::datapath::reason_counts(&dp.pins)
    );
    seen(&r.packet, &what).dst.ip()
}

/// 200 client tuples from outside the cluster: 50 addresses × 4 ports.
fn clients(f: &Family) -> Vec<SocketAddr> {
    (0..200u32)
        .map(|i| SocketAddr::new(f.outside((i / 4) as u8 + 1), 40000 + (i % 4) as u16 * 1111))
        .collect()
}

#[test]
fn maglev_frontends_send_each_flow_to_the_backend_its_table_holds() {
    if !require_root() {
        return;
    }
    for f in &FAMILIES {
        maglev_table(f);
    }
}

fn maglev_table(f: &Family) {
    let t = table(f);
    let mut reversed = t.backends.clone();
    reversed.reverse();
    let mut node1 = node(f, &t, "xlbmg1", &t.backends);
    let mut node2 = node(f, &t, "xlbmg2", &reversed);
    // The table as every node computes it, by backend name (independent of slot order).
    let named: Vec<(String, IpAddr)> = t
        .backends
        .iter()
        .map(|a| (format!("{}/TCP", SocketAddr::new(*a, 8080)), *a))
        .collect();
    let names: Vec<String> = named.iter().map(|(n, _)| n.clone()).collect();
    let (sorted, table) = maglev::table(
        &names,
        M,
        lb_userspace::desired::DEFAULT_MAGLEV_SEED.as_bytes(),
    );
    let state = node1.state();
    let key = |ip: IpAddr| frontend_key(ip, 80, IPPROTO_TCP);
    let entry = &state.services[&key(t.ext)];
    assert!(
        entry.flags & SVC_F_MAGLEV != 0,
        "{}",
        f.row("the externalIP is flagged")
    );
    assert_eq!(
        state.maglev[&entry.svc_id].size(),
        M,
        "{}",
        f.row("its table is programmed")
    );
    assert_eq!(
        state.services[&key(f.vip)].flags & SVC_F_MAGLEV,
        0,
        "{}",
        f.row("the ClusterIP picks at random")
    );
    let other = &state.services[&key(t.other_ext)];
    assert_eq!(
        other.flags & SVC_F_MAGLEV,
        0,
        "{}",
        f.row("annotated random")
    );
    assert_eq!(
        state.maglev.len(),
        1,
        "{}: {:?}",
        f.row("one table"),
        state.maglev.keys()
    );
    let mut seen = std::collections::BTreeSet::new();
    for c in clients(f) {
        let h = flow_hash(
            &addr_words(c.ip()).0,
            &addr_words(t.ext).0,
            c.port().to_be(),
            80u16.to_be(),
            IPPROTO_TCP,
        );
        let name = &sorted[table[(h % M) as usize] as usize];
        let want = named
            .iter()
            .find_map(|(n, a)| (n == name).then_some(*a))
            .expect("a backend's name");
        let got = reached(f, &mut node1, c, t.ext);
        let what = f.row(&format!("{c}"));
        assert_eq!(got, want, "{what}: entry {} of the table", h % M);
        assert_eq!(
            reached(f, &mut node2, c, t.ext),
            want,
            "{what}: the other node"
        );
        seen.insert(got);
    }
    assert_eq!(
        seen.len(),
        10,
        "{}: {seen:?}",
        f.row("200 flows over 10 backends")
    );
}
