//! loadBalancerSourceRanges over IPv6 through BPF_PROG_TEST_RUN on the loaded tc program:
//! a dual-stack LoadBalancer with ranges of both families admits the IPv6 clients in its
//! IPv6 ranges (DNAT to a backend) and drops the rest, counted `src_denied`, as IPv4 does
//! with its own (unchanged) ranges; each family is checked against its own ranges only, as
//! kube-proxy's proxier per family sees only its family's (a family without ranges has no
//! firewall); the ClusterIP and NodePort ignore the ranges; one service's ranges admit no
//! client to another; `xlb list services` shows the ranges of each family; XDP drops the
//! clients outside them too.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

use lb_userspace::{
    desired::{self, Limits, NodeContext},
    packet::PacketBuilder,
    reconcile::Ids,
};
use xlb_tests::frame6::{Frame6, TCP_SYN, seen6};
use xlb_tests::suites::packets::{TC_ACT_OK, TC_ACT_SHOT};
use xlb_tests::{
    datapath::{LoadedDatapath, reason_counts},
    require_root, unique_tag,
};

const BACKEND6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 2);
const BACKEND4: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
/// `ranged`: ranges of both families.
const LB6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 0x30);
const LB4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 30);
const CLUSTER6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x30);
const NODE6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x245, 0, 0, 0, 0, 1);
/// `v4only`: IPv4 ranges alone.
const LB6_V4ONLY: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 0x31);
const LB4_V4ONLY: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 31);
/// `other`: IPv6 only, another range.
const LB6_OTHER: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 0x32);

/// A LoadBalancer Service `name` (port 80 → 8080, nodePort `np`) of `families`, with its
/// cluster IPs, LoadBalancer IPs and source ranges, one endpoint per family on node1.
fn lb(
    name: &str,
    families: &[&str],
    cluster: &[&str],
    ingress: &[&str],
    ranges: &[&str],
) -> String {
    let q = |v: &[&str]| {
        v.iter()
            .map(|s| format!("\"{s}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let np = 30000 + u16::from(name.as_bytes()[0]);
    let ingress: Vec<String> = ingress
        .iter()
        .map(|ip| format!("{{ip: \"{ip}\"}}"))
        .collect();
    let policy = if families.len() == 2 {
        "RequireDualStack"
    } else {
        "SingleStack"
    };
    let mut y = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: test, name: {name}}}\nspec:\n  type: LoadBalancer\n  ipFamilyPolicy: {policy}\n  ipFamilies: [{}]\n  clusterIP: \"{}\"\n  clusterIPs: [{}]\n  loadBalancerSourceRanges: [{}]\n  ports:\n  - {{name: p, port: 80, protocol: TCP, targetPort: 8080, nodePort: {np}}}\nstatus:\n  loadBalancer:\n    ingress: [{}]\n",
        families.join(", "),
        cluster[0],
        q(cluster),
        q(ranges),
        ingress.join(", ")
    );
    for family in families {
        let ep = if *family == "IPv6" {
            BACKEND6.to_string()
        } else {
            BACKEND4.to_string()
        };
        y.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: test\n  name: {name}-{family}\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: {family}\nports:\n- {{name: p, port: 8080, protocol: TCP}}\nendpoints:\n- addresses: [\"{ep}\"]\n  conditions: {{ready: true}}\n  nodeName: node1\n"
        ));
    }
    y
}

fn services() -> String {
    lb(
        "ranged",
        &["IPv6", "IPv4"],
        &["fd00:10:96::30", "10.96.0.30"],
        &["2001:db8:100::30", "198.51.100.30"],
        &["2001:db8:1::/48", "10.0.0.0/8", "2001:db8:7::42/128"],
    ) + &lb(
        "v4only",
        &["IPv6", "IPv4"],
        &["fd00:10:96::31", "10.96.0.31"],
        &["2001:db8:100::31", "198.51.100.31"],
        &["10.0.0.0/8"],
    ) + &lb(
        "other",
        &["IPv6"],
        &["fd00:10:96::32"],
        &["2001:db8:100::32"],
        &["2001:db8:2::/48"],
    )
}

/// The datapath with [`services`] programmed as node1's agent would (NodePorts on
/// [`NODE6`]); every frontend is programmed (nothing skipped).
fn loaded(tag: &str) -> LoadedDatapath {
    let mut dp = LoadedDatapath::load(tag).expect("load the eBPF object");
    let loaded = lb_userspace::source::file::parse("ranges6.yaml", &services()).expect("yaml");
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    let node = NodeContext::new("node1", &[NODE6.into()], false);
    let (_, errors) =
        desired::compute_on(&loaded.model, &node, &mut Ids::default(), Limits::default());
    assert!(
        errors.is_empty(),
        "every frontend is programmed: {errors:?}"
    );
    dp.program_on(&loaded.model, &node).expect("program maps");
    dp
}

fn v6(s: &str, port: u16) -> SocketAddrV6 {
    SocketAddrV6::new(s.parse().expect("IPv6 address"), port, 0, 0)
}

/// What a first packet must meet.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// DNATed to the backend's port 8080, the client kept.
    Admitted,
    /// Dropped, untouched, counted `src_denied`.
    Denied,
}

/// Runs `frame`, a new flow's first packet (`what` names the case), against `expect`.
fn check(
    dp: &mut LoadedDatapath,
    frame: &[u8],
    backend: std::net::IpAddr,
    expect: Expect,
    what: &str,
) {
    let before = reason_counts(&dp.pins);
    let r = dp.run(frame).unwrap_or_else(|e| panic!("{what}: {e}"));
    let after = reason_counts(&dp.pins);
    let denied = after["src_denied"] - before["src_denied"];
    match expect {
        Expect::Admitted => {
            assert_eq!(r.verdict, TC_ACT_OK, "{what}: verdict ({after:?})");
            assert_eq!(denied, 0, "{what}: not counted src_denied");
            assert_eq!(
                after["new_flow"],
                before["new_flow"] + 1,
                "{what}: a new flow"
            );
            let dst = if backend.is_ipv6() {
                std::net::SocketAddr::V6(seen6(&r.packet, what).dst)
            } else {
                let p = lb_userspace::packet::parse(&r.packet).expect("IPv4 frame");
                assert!(p.l4_checksum_ok && p.ip_checksum_ok, "{what}: checksums");
                std::net::SocketAddr::V4(p.dst)
            };
            assert_eq!(
                dst,
                std::net::SocketAddr::new(backend, 8080),
                "{what}: DNAT"
            );
        }
        Expect::Denied => {
            assert_eq!(r.verdict, TC_ACT_SHOT, "{what}: dropped");
            assert_eq!(r.packet, frame, "{what}: untouched");
            assert_eq!(denied, 1, "{what}: counted src_denied once");
            assert_eq!(after["new_flow"], before["new_flow"], "{what}: no flow");
        }
    }
}

#[test]
fn ipv6_source_ranges_admit_listed_clients_and_drop_the_rest_per_family() {
    if !require_root() {
        return;
    }
    let mut dp = loaded(&unique_tag("xlp6r"));
    for (what, frame, backend, expect) in &cases() {
        check(&mut dp, frame, *backend, *expect, what);
    }
    listed(&dp);
}

/// One case: what it shows, the first packet, the backend it goes to when admitted.
type Case = (&'static str, Vec<u8>, std::net::IpAddr, Expect);

/// A TCP SYN from IPv6 `src`:`port` to `dst`:`dport`.
fn tcp6(src: &str, port: u16, dst: Ipv6Addr, dport: u16) -> Vec<u8> {
    Frame6::tcp(
        v6(src, port),
        SocketAddrV6::new(dst, dport, 0, 0),
        TCP_SYN,
        b"",
    )
    .build()
}

/// A TCP SYN from IPv4 `src`:`port` to `dst`:80.
fn tcp4(src: Ipv4Addr, port: u16, dst: Ipv4Addr) -> Vec<u8> {
    PacketBuilder::tcp(SocketAddrV4::new(src, port), SocketAddrV4::new(dst, 80)).build()
}

/// The table: `ranged`'s IPv6 LoadBalancer IP against its IPv6 ranges, its other
/// frontends, then [`family_cases`].
fn cases() -> Vec<Case> {
    let be6 = BACKEND6.into();
    use Expect::{Admitted, Denied};
    vec![
        (
            "IPv6 client inside 2001:db8:1::/48 → DNAT",
            tcp6("2001:db8:1::7", 50001, LB6, 80),
            be6,
            Admitted,
        ),
        (
            "IPv6 client at the far end of 2001:db8:1::/48 → DNAT",
            tcp6("2001:db8:1:ffff:ffff:ffff:ffff:ffff", 50002, LB6, 80),
            be6,
            Admitted,
        ),
        (
            "IPv6 client just outside (2001:db8:0:ffff::1) → dropped",
            tcp6("2001:db8:0:ffff::1", 50003, LB6, 80),
            be6,
            Denied,
        ),
        (
            "IPv6 client just outside (2001:db8:2::1) → dropped",
            tcp6("2001:db8:2::1", 50004, LB6, 80),
            be6,
            Denied,
        ),
        (
            "IPv6 client whose first 32 bits match none of the IPv4 range's → dropped",
            tcp6("a00::1", 50005, LB6, 80),
            be6,
            Denied,
        ),
        (
            "IPv6 client of a /128 range → DNAT",
            tcp6("2001:db8:7::42", 50006, LB6, 80),
            be6,
            Admitted,
        ),
        (
            "IPv6 client next to the /128 range → dropped",
            tcp6("2001:db8:7::43", 50007, LB6, 80),
            be6,
            Denied,
        ),
        (
            "the ClusterIP ignores the ranges",
            tcp6("2001:db8:2::1", 50008, CLUSTER6, 80),
            be6,
            Admitted,
        ),
        (
            "the NodePort ignores the ranges",
            tcp6("2001:db8:2::1", 50009, NODE6, 30114),
            be6,
            Admitted,
        ),
    ]
    .into_iter()
    .chain(family_cases())
    .collect()
}

/// Each family against its own ranges only (IPv4's unchanged; IPv4 ranges alone leave
/// IPv6 open, as kube-proxy's IPv6 proxier then has no firewall), and one service's ranges
/// admitting no one to another.
fn family_cases() -> Vec<Case> {
    let (be6, be4) = (BACKEND6.into(), BACKEND4.into());
    use Expect::{Admitted, Denied};
    vec![
        (
            "IPv4 LoadBalancer IP, client inside 10.0.0.0/8 → DNAT",
            tcp4(Ipv4Addr::new(10, 1, 2, 3), 50010, LB4),
            be4,
            Admitted,
        ),
        (
            "IPv4 LoadBalancer IP, client outside → dropped",
            tcp4(Ipv4Addr::new(192, 0, 2, 9), 50011, LB4),
            be4,
            Denied,
        ),
        (
            "IPv4 ranges alone: an IPv6 client anywhere → DNAT (no IPv6 firewall)",
            tcp6("2001:db8:2::1", 50012, LB6_V4ONLY, 80),
            be6,
            Admitted,
        ),
        (
            "IPv4 ranges alone: the IPv4 side still drops outsiders",
            tcp4(Ipv4Addr::new(192, 0, 2, 9), 50013, LB4_V4ONLY),
            be4,
            Denied,
        ),
        (
            "another service's range admits no one here",
            tcp6("2001:db8:1::7", 50014, LB6_OTHER, 80),
            be6,
            Denied,
        ),
        (
            "that service's own range",
            tcp6("2001:db8:2::7", 50015, LB6_OTHER, 80),
            be6,
            Admitted,
        ),
    ]
}

/// `xlb list services`: each LoadBalancer frontend with the ranges of its family.
fn listed(dp: &LoadedDatapath) {
    let rows = lb_userspace::list::services(&xlb_tests::pins(&dp.pins)).expect("list services");
    let ranges = |frontend: String| {
        rows.iter()
            .find(|r| r.frontend == frontend)
            .unwrap_or_else(|| panic!("{frontend} listed: {rows:?}"))
            .source_ranges
            .clone()
    };
    assert_eq!(
        ranges(format!("[{LB6}]:80/TCP")),
        ["2001:db8:1::/48", "2001:db8:7::42/128"]
    );
    assert_eq!(ranges(format!("{LB4}:80/TCP")), ["10.0.0.0/8"]);
    assert!(ranges(format!("[{LB6_V4ONLY}]:80/TCP")).is_empty());
    assert!(ranges(format!("[{CLUSTER6}]:80/TCP")).is_empty());
    let usage = lb_userspace::list::map_usage(&xlb_tests::pins(&dp.pins)).expect("usage");
    let six = usage
        .iter()
        .find(|u| u.map == lb_common::MAP_SRC_RANGE6)
        .expect("the IPv6 trie is listed");
    assert_eq!(
        (six.entries, six.capacity),
        (3, lb_common::SRC_RANGE6_MAP_CAPACITY)
    );
}

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;

/// XDP checks the IPv6 ranges too: a client outside them is dropped there (counted
/// `src_denied`), one inside is not (translated and passed, or left to tc). In a namespace
/// of its own (its loopback as the ingress interface).
#[test]
fn xdp_drops_ipv6_clients_outside_the_source_ranges() {
    if !require_root() {
        return;
    }
    let tag = unique_tag("xlp6rx");
    let ns = xlb_tests::netns::Netns::new(&format!("{tag}-node")).expect("netns");
    ns.ip(&["link", "set", "lo", "up"]).expect("lo up");
    ns.run(move || {
        let ifindex = lb_userspace::datapath::netif::ifindex("lo").expect("lo");
        let mut dp = loaded(&tag);
        let outside = tcp6("2001:db8:2::1", 51001, LB6, 80);
        let before = reason_counts(&dp.pins);
        let r = dp.run_xdp(&outside, ifindex).expect("run");
        assert_eq!(
            (r.verdict, &r.packet),
            (XDP_DROP, &outside),
            "outside: dropped"
        );
        let after = reason_counts(&dp.pins);
        assert_eq!(after["src_denied"], before["src_denied"] + 1, "{after:?}");
        let inside = tcp6("2001:db8:1::7", 51002, LB6, 80);
        let r = dp.run_xdp(&inside, ifindex).expect("run");
        assert_eq!(r.verdict, XDP_PASS, "inside: not dropped");
        let counts = reason_counts(&dp.pins);
        assert_eq!(counts["src_denied"], after["src_denied"], "{counts:?}");
    })
    .expect("namespace thread");
}
