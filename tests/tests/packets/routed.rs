//! In a namespace that routes the pods, in both families: XDP translates and redirects a
//! ClusterIP's flows, and an external frontend's flow to a remote backend is SNATed to the
//! node's address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use lb_userspace::{
    model::IpFamily,
    packet::{TCP_ACK, TCP_SYN},
};
use xlb_tests::{
    datapath::{LoadedDatapath, reason_counts},
    require_root,
    suites::packets::{FAMILIES, Family, frame, seen},
    unique_tag,
};

const XDP_PASS: u32 = 2;
const XDP_REDIRECT: u32 = 4;
const SNAT_MIN: u16 = 40000;

/// The XDP program on a node interface, in both families, in a namespace whose route to the
/// pods goes through `dum0` to a known neighbour: a new flow and a reply are translated and
/// passed (the egress takes no XDP frames yet), then a new flow is redirected with the next
/// hop's MACs and the TTL / hop limit down by one; what XDP leaves to tc (ICMP, fragments,
/// a frontend without endpoints, a checksum still partial) passes untouched.
#[test]
fn xdp_translates_and_redirects_flows() {
    if !require_root() {
        return;
    }
    for f in FAMILIES {
        let tag = unique_tag(&format!("xlpx{}", f.name().to_ascii_lowercase()));
        let ns = f.routed_ns(&tag, &[], true, None);
        ns.run(move || xdp(&f, &tag)).expect("namespace thread");
    }
}

fn xdp(f: &Family, tag: &str) {
    let ifindex = lb_userspace::datapath::netif::ifindex("dum0").expect("dum0");
    let mut dp = f.setup_tagged(tag);
    let dp = &mut dp;
    let web = SocketAddr::new(f.vip, 80);
    let c = f.client(40700);
    let what = f.row("new flow, egress without XDP");
    let r = dp
        .run_xdp(&frame(false, c, web, TCP_SYN, b""), ifindex)
        .expect("run");
    assert_eq!(r.verdict, XDP_PASS, "{what}: passed");
    let out = seen(&r.packet, &what);
    assert!(f.backends.contains(&out.dst.ip()), "{what}: {out:?}");
    assert_eq!((out.src, out.dst.port()), (c, 8080), "{what}");
    let backend = out.dst;
    assert_eq!(reason_counts(&dp.pins)["new_flow"], 1, "{what}");
    let what = f.row("reply");
    let reply = frame(false, backend, c, TCP_SYN | TCP_ACK, b"");
    let r = dp.run_xdp(&reply, ifindex).expect("run");
    assert_eq!(r.verdict, XDP_PASS, "{what}");
    // Into the stack as netfilter sees it under kube-proxy (from the backend); tc egress
    // restores the frontend.
    assert_eq!(
        seen(&r.packet, &what).src,
        backend,
        "{what}: passed as sent"
    );
    let r = dp.run_egress(&r.packet).expect("egress run");
    assert_eq!(
        seen(&r.packet, &what).src,
        web,
        "{what}: from the frontend after tc egress"
    );
    dp.allow_xdp_redirect(ifindex).expect("devmap");
    // A new flow, now that the egress runs XDP: redirected, and so is its next packet.
    let c2 = f.client(40701);
    let ttl_at = match f.family {
        IpFamily::V4 => 22,
        IpFamily::V6 => 21,
    };
    for (n, (what, flags)) in [("new flow", TCP_SYN), ("established", TCP_ACK)]
        .into_iter()
        .enumerate()
    {
        let what = f.row(&format!("{what}, egress runs XDP"));
        let r = dp
            .run_xdp(&frame(false, c2, web, flags, b"data"), ifindex)
            .expect("run");
        assert_eq!(r.verdict, XDP_REDIRECT, "{what}: redirected");
        assert_eq!(
            &r.packet[0..6],
            &[2, 0, 0, 0, 0, 2],
            "{what}: next hop's MAC"
        );
        assert_eq!(&r.packet[6..12], &[2, 0, 0, 0, 0, 1], "{what}: egress MAC");
        assert_eq!(r.packet[ttl_at], 63, "{what}: TTL / hop limit down by one");
        let out = seen(&r.packet, &what);
        assert!(f.backends.contains(&out.dst.ip()), "{what}: {out:?}");
        assert_eq!(
            reason_counts(&dp.pins)["xdp_redirect"],
            n as u64 + 1,
            "{what}"
        );
    }
    // The first flow's entry keeps the stack as its way out until its once-a-second
    // refresh: still passed, translated, with no route lookup.
    let what = f.row("established into the stack");
    let r = dp
        .run_xdp(&frame(false, c, web, TCP_ACK, b"data"), ifindex)
        .expect("run");
    assert_eq!(r.verdict, XDP_PASS, "{what}: passed");
    assert_eq!(seen(&r.packet, &what).dst, backend, "{what}");
    // Left to tc, untouched.
    let rows = [
        ("an echo request", f.echo_request(f.client, f.vip)),
        (
            "a fragment",
            f.fragment(&frame(false, c, web, TCP_SYN, b""), 0, true),
        ),
        (
            "a frontend without endpoints",
            frame(false, c, SocketAddr::new(f.empty, 80), TCP_SYN, b""),
        ),
        (
            "a checksum still partial (CHECKSUM_PARTIAL from a veth sender)",
            f.partial_checksum(&frame(false, c, web, TCP_ACK, b"")),
        ),
    ];
    for (what, pkt) in rows {
        let what = f.row(what);
        let r = dp.run_xdp(&pkt, ifindex).expect("run");
        assert_eq!(
            (r.verdict, &r.packet),
            (XDP_PASS, &pkt),
            "{what}: left to tc"
        );
    }
}

/// One family's externalIP table: the externalIP, its ClusterIP, the endpoint on node2,
/// two clients outside the cluster, and their prefix (routed via the next hop).
struct External {
    ext: IpAddr,
    cluster: IpAddr,
    remote: IpAddr,
    clients: [IpAddr; 2],
    prefix: &'static str,
}

fn external(f: &Family) -> External {
    match f.family {
        IpFamily::V4 => External {
            ext: Ipv4Addr::new(198, 51, 100, 5).into(),
            cluster: Ipv4Addr::new(10, 96, 0, 20).into(),
            remote: Ipv4Addr::new(10, 244, 9, 2).into(),
            clients: [
                Ipv4Addr::new(192, 0, 2, 7).into(),
                Ipv4Addr::new(192, 0, 2, 8).into(),
            ],
            prefix: "192.0.2.0/24",
        },
        IpFamily::V6 => External {
            ext: Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 5).into(),
            cluster: Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x20).into(),
            remote: Ipv6Addr::new(0xfd00, 0x10, 0x244, 9, 0, 0, 0, 2).into(),
            clients: [
                Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 7).into(),
                Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 8).into(),
            ],
            prefix: "2001:db8::/32",
        },
    }
}

/// Runs `table` for each family (nothing, after the notice, without root) in a namespace
/// of its own routing the pods and the external clients of [`external`], with the pin tag.
fn in_external_ns(prefix: &str, table: fn(&Family, &External, &str)) {
    if !require_root() {
        return;
    }
    for f in FAMILIES {
        let tag = unique_tag(&format!("{prefix}{}", f.name().to_ascii_lowercase()));
        let t = external(&f);
        let ns = f.routed_ns(&tag, &[t.prefix], false, None);
        ns.run(move || table(&f, &t, &tag))
            .expect("namespace thread");
    }
}

/// An externalIP (externalTrafficPolicy Cluster) whose endpoint is on another node, in both
/// families: a client's flow is SNATed to the node's address toward the backend (the
/// route's source) with a port of the SNAT range, and the backend's reply to that address
/// comes back from the externalIP to the client. In a namespace routing the pods and the
/// client.
#[test]
fn flows_to_a_remote_backend_of_an_external_frontend_are_snated_to_the_node() {
    in_external_ns("xlps", snat_to_the_node);
}

/// The datapath under pins `tag` with `t`'s externalIP Service, programmed as node1's
/// agent would (its endpoint on node2), SNAT ports 40000 to `snat_max`.
fn external_dp(f: &Family, t: &External, tag: &str, snat_max: u16) -> LoadedDatapath {
    let family = f.name();
    let yaml = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: test, name: ext}}\nspec:\n  ipFamilyPolicy: SingleStack\n  ipFamilies: [{family}]\n  clusterIP: \"{c}\"\n  clusterIPs: [\"{c}\"]\n  externalIPs: [\"{ext}\"]\n  ports:\n  - {{name: p, port: 80, protocol: TCP, targetPort: 8080}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: test\n  name: ext-1\n  labels: {{kubernetes.io/service-name: ext}}\naddressType: {family}\nports:\n- {{name: p, port: 8080, protocol: TCP}}\nendpoints:\n- addresses: [\"{remote}\"]\n  conditions: {{ready: true}}\n  nodeName: node2\n",
        c = t.cluster,
        ext = t.ext,
        remote = t.remote,
    );
    let mut dp = LoadedDatapath::load(tag).expect("load");
    dp.configure(&lb_common::NodeConfig {
        snat_port_min: SNAT_MIN,
        snat_port_max: snat_max,
        ..Default::default()
    })
    .expect("config");
    let loaded = lb_userspace::source::file::parse("ext.yaml", &yaml).expect("yaml");
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    dp.program_on(
        &loaded.model,
        &lb_userspace::desired::NodeContext::new("node1", &[], false),
    )
    .expect("program");
    dp
}

fn snat_to_the_node(f: &Family, t: &External, tag: &str) {
    let mut dp = external_dp(f, t, tag, 40100);
    let dp = &mut dp;
    let node = f.routed_node().0;
    let client = SocketAddr::new(t.clients[0], 5555);
    let frontend = SocketAddr::new(t.ext, 80);
    // DNAT to the remote backend, SNAT to the node's address toward it (a port of the
    // range), the reply back from the externalIP, `xlb list` showing it.
    let src = f.snated_flow(dp, client, frontend, SocketAddr::new(t.remote, 8080));
    let what = f.row("SNAT to the node");
    assert_eq!(
        src.ip(),
        node,
        "{what}: the node's address toward the backend"
    );
    assert!((40000..=40100).contains(&src.port()), "{what}: {src}");
    // A second client on the same port gets another SNAT port.
    let what = f.row("second flow");
    let other = SocketAddr::new(t.clients[1], 5555);
    let syn = frame(false, other, frontend, TCP_SYN, b"");
    let second = f.through(dp, &syn, &what).src;
    assert_eq!(second.ip(), node, "{what}");
    assert_ne!(
        second.port(),
        src.port(),
        "{what}: two flows never share a reply tuple"
    );
}

/// A SNAT port is held while its flow lives and goes to a new flow once the old one is
/// over (here: closing both ways and idle, its timestamps aged through the map), in both
/// families: with a one-port range, the second flow is refused, then takes the port, and
/// the old flow's forward entry is gone.
#[test]
fn a_finished_flow_gives_its_snat_port_back() {
    in_external_ns("xlpr", snat_reuse);
}

/// Every entry of the family's conntrack table made to look idle for 20 s (past a closed
/// flow's reuse time, 10 s, short of an open TCP flow's, 24 h; not "since boot": a machine
/// up for more than a day would see even a half-closed flow as over); each entry's
/// (direction, source port, flags) before.
fn aged(f: &Family, dp: &LoadedDatapath) -> Vec<(u8, u16, u16)> {
    use aya::maps::{HashMap, MapData};
    use lb_common::{CtKey, CtKey6, CtValue, CtValue6, MAP_CT, MAP_CT6};
    let idle_since =
        lb_userspace::datapath::clock::monotonic_coarse_ns().saturating_sub(20_000_000_000);
    let pins = xlb_tests::pins(&dp.pins);
    macro_rules! age {
        ($map:expr, $k:ty, $v:ty) => {{
            let mut ct: HashMap<MapData, $k, $v> =
                HashMap::try_from(pins.map($map).expect("pin")).expect("conntrack map");
            let entries: Vec<($k, $v)> = ct.iter().map(|kv| kv.expect("entry")).collect();
            for (k, v) in &entries {
                let mut aged = *v;
                aged.last_seen_ns = idle_since;
                aged.created_ns = idle_since;
                ct.insert(k, aged, 0).expect("age the entry");
            }
            entries
                .iter()
                .map(|(k, v)| (k.dir, u16::from_be(k.sport_be), v.flags))
                .collect()
        }};
    }
    match f.family {
        IpFamily::V4 => age!(MAP_CT, CtKey, CtValue),
        IpFamily::V6 => age!(MAP_CT6, CtKey6, CtValue6),
    }
}

fn snat_reuse(f: &Family, t: &External, tag: &str) {
    use lb_common::CT_F_CLOSING;
    const TC_ACT_SHOT: u32 = 2;
    let mut dp = external_dp(f, t, tag, SNAT_MIN);
    let dp = &mut dp;
    let frontend = SocketAddr::new(t.ext, 80);
    let (first, second) = (
        SocketAddr::new(t.clients[0], 7001),
        SocketAddr::new(t.clients[0], 7002),
    );
    let snat = SocketAddr::new(f.routed_node().0, SNAT_MIN);
    let what = f.row("the first flow takes the only port");
    let out = f.through(dp, &frame(false, first, frontend, TCP_SYN, b""), &what);
    assert_eq!(out.src, snat, "{what}");
    let refused = |dp: &mut LoadedDatapath, what: &str| {
        let r = dp
            .run(&frame(false, second, frontend, TCP_SYN, b""))
            .expect("run");
        assert_eq!(r.verdict, TC_ACT_SHOT, "{}", f.row(what));
    };
    refused(dp, "a live flow holds its port: the second flow is refused");
    let four = |entries: &[(u8, u16, u16)]| {
        assert_eq!(
            entries.len(),
            4,
            "{}: one SNATed flow, four entries (forward, reply and the two egress ones): {entries:?}",
            f.name()
        );
    };
    // Half-closed (the client's FIN only) and idle: the backend may still be sending, so the
    // port stays with the flow.
    f.through(
        dp,
        &frame(false, first, frontend, 0x11, b""),
        &f.row("the client's FIN"),
    );
    four(&aged(f, dp));
    refused(dp, "a half-closed flow keeps its port");
    // The backend's FIN closes the other way: over, once idle.
    let backend = SocketAddr::new(t.remote, 8080);
    f.through(
        dp,
        &frame(false, backend, snat, 0x11, b""),
        &f.row("the backend's FIN"),
    );
    let entries = aged(f, dp);
    four(&entries);
    for e in &entries {
        assert!(
            e.2 & CT_F_CLOSING != 0,
            "{}: each direction's FIN marked its entry closing: {e:?}",
            f.name()
        );
    }
    let what = f.row("the finished flow's port is free again");
    let out = f.through(dp, &frame(false, second, frontend, TCP_SYN, b""), &what);
    assert_eq!(out.src, snat, "{what}");
    let firsts = aged(f, dp)
        .iter()
        .filter(|(dir, sport, _)| *dir == 0 && *sport == first.port())
        .count();
    assert_eq!(
        firsts,
        0,
        "{}",
        f.row("the old flow's forward entry was removed")
    );
}
