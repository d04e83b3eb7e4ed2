//! The same north-south table through the XDP program, in both families.

use std::net::SocketAddr;

use lb_userspace::packet::{TCP_ACK, TCP_SYN};
use xlb_tests::suites::packets::{IcmpError, frame, seen};
use xlb_tests::suites::packets_north_south::{
    NorthSouth, SNAT_MAX, SNAT_MIN, node1_config, on_node1,
};
use xlb_tests::{
    datapath::{LoadedDatapath, RunResult, service_packets},
    require_root,
};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const XDP_REDIRECT: u32 = 4;

/// The XDP program on a node interface, through BPF_PROG_TEST_RUN: what it takes on itself
/// (translation, redirect with the next hop's MAC) and what it leaves to tc untouched.
#[test]
fn xdp_rewrites_follow_the_table() {
    if !require_root() {
        return;
    }
    on_node1("xpx", run_xdp_table);
}

/// XDP run on `packet` as received on `ifindex`; failures name the family and `desc`.
fn run(
    n: &NorthSouth,
    dp: &mut LoadedDatapath,
    ifindex: u32,
    desc: &str,
    packet: &[u8],
) -> RunResult {
    dp.run_xdp(packet, ifindex)
        .unwrap_or_else(|e| panic!("{}: test run: {e}", n.row(desc)))
}

fn in_snat_range(port: u16) -> bool {
    (SNAT_MIN..=SNAT_MAX).contains(&port)
}

fn run_xdp_table(n: &NorthSouth, dp: &mut LoadedDatapath, ifindex: u32) {
    let np = n.np(30001);
    let remote = SocketAddr::new(n.remote_pod, 8080);
    let tcp = |src, dst, flags, payload: &[u8]| frame(false, src, dst, flags, payload);

    // 1. A new NodePort flow to a remote backend, egress not in the redirect map: its
    //    destination translated and passed to the stack (netfilter sees client → backend, as
    //    under kube-proxy); tc egress then SNATs it.
    let desc = "new flow, egress without XDP → DNATed and passed; SNATed at tc egress";
    let what = n.row(desc);
    let r = run(n, dp, ifindex, desc, &tcp(n.ext, np, TCP_SYN, b""));
    assert_eq!(r.verdict, XDP_PASS, "{what}");
    assert_eq!(
        service_packets(&dp.pins),
        1,
        "{what}: the first packet counted once"
    );
    let p = seen(&r.packet, &what);
    assert_eq!(
        (p.src, p.dst),
        (n.ext, remote),
        "{what}: as netfilter sees it"
    );
    let r = dp.run_egress(&r.packet).expect("egress run");
    let p = seen(&r.packet, &what);
    assert_eq!(p.dst, remote, "{what}");
    assert_eq!(p.src.ip(), n.underlay, "{what}");
    assert!(in_snat_range(p.src.port()), "{what}: {p:?}");
    let snat = p.src;

    // 2. The reply to the SNAT address: un-SNATed and passed (the client is routed via
    //    dum0), its frontend restored at tc egress.
    let desc = "reply of the SNATed flow → to the client, then from the frontend at egress";
    let what = n.row(desc);
    let r = run(n, dp, ifindex, desc, &tcp(remote, snat, TCP_ACK, b""));
    assert_eq!(r.verdict, XDP_PASS, "{what}");
    let p = seen(&r.packet, &what);
    assert_eq!(
        (p.src, p.dst),
        (remote, n.ext),
        "{what}: as netfilter sees it"
    );
    let r = dp.run_egress(&r.packet).expect("egress run");
    let p = seen(&r.packet, &what);
    assert_eq!((p.src, p.dst), (np, n.ext), "{what}");

    // 3. With the egress interface in the redirect map: a new flow is redirected, both sides
    //    translated at once, with the next hop's MACs, and so is its next packet.
    dp.allow_xdp_redirect(ifindex).expect("devmap");
    let client = SocketAddr::new(n.ext.ip(), 5010);
    for (desc, flags) in [
        (
            "new flow, egress runs XDP → redirected with the next hop's MAC",
            TCP_SYN,
        ),
        ("its established packet → redirected the same way", TCP_ACK),
    ] {
        let what = n.row(desc);
        let r = run(n, dp, ifindex, desc, &tcp(client, np, flags, b"x"));
        assert_eq!(r.verdict, XDP_REDIRECT, "{what}");
        assert_eq!(
            &r.packet[0..6],
            &[2, 0, 0, 0, 0, 2],
            "{what}: destination MAC"
        );
        assert_eq!(&r.packet[6..12], &[2, 0, 0, 0, 0, 1], "{what}: source MAC");
        let p = seen(&r.packet, &what);
        assert_eq!((p.src.ip(), p.dst), (n.underlay, remote), "{what}");
        assert!(
            in_snat_range(p.src.port()) && p.src != snat,
            "{what}: a SNAT port of its own: {p:?}"
        );
    }
    // The flow of 1. found its way out into the stack: its entry keeps that until its
    // once-a-second refresh (no route lookup per packet), so it is still passed translated.
    let desc = "established flow whose entry says the stack → DNATed and passed";
    let what = n.row(desc);
    let r = run(n, dp, ifindex, desc, &tcp(n.ext, np, TCP_ACK, b"x"));
    assert_eq!(r.verdict, XDP_PASS, "{what}");
    let p = seen(&r.packet, &what);
    assert_eq!((p.src, p.dst), (n.ext, remote), "{what}");
    // Its entry forgets the way out with its once-a-second refresh: the packet that
    // refreshes it still goes into the stack, the next one finds the redirect.
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let ack = tcp(n.ext, np, TCP_ACK, b"x");
    let desc = "the packet that refreshes the entry → still into the stack";
    let verdict = run(n, dp, ifindex, desc, &ack).verdict;
    assert_eq!(verdict, XDP_PASS, "{}", n.row(desc));
    let desc = "established flow after its refresh, egress runs XDP → redirected";
    let what = n.row(desc);
    let r = run(n, dp, ifindex, desc, &ack);
    assert_eq!(r.verdict, XDP_REDIRECT, "{what}");
    let p = seen(&r.packet, &what);
    assert_eq!(
        (p.src, p.dst),
        (snat, remote),
        "{what}: both sides translated"
    );

    left_to_tc(n, dp, ifindex, snat);
    // 4. Source ranges are enforced in XDP too.
    let desc = "LoadBalancer IP, client outside the ranges → dropped in XDP";
    let lb = SocketAddr::new(n.lb_ip, 80);
    let verdict = run(n, dp, ifindex, desc, &tcp(n.outsider, lb, TCP_SYN, b"")).verdict;
    assert_eq!(verdict, XDP_DROP, "{}", n.row(desc));
}

/// What XDP leaves to tc, untouched.
fn left_to_tc(n: &NorthSouth, dp: &mut LoadedDatapath, ifindex: u32, snat: SocketAddr) {
    let np = n.np(30001);
    let remote = SocketAddr::new(n.remote_pod, 8080);
    let from = |port| SocketAddr::new(n.ext.ip(), port);
    let sent_to_backend = frame(true, snat, remote, 0, b"");
    for (desc, packet) in [
        (
            "checksum still partial (CHECKSUM_PARTIAL from a veth sender) → tc",
            n.f.partial_checksum(&frame(false, from(5002), np, TCP_SYN, b"")),
        ),
        (
            "service without a local endpoint (Local policy) → tc drops it",
            frame(false, n.ext, n.np(30004), TCP_SYN, b""),
        ),
        (
            "ICMP → tc translates it",
            n.f.icmp_error(
                n.remote_pod,
                n.underlay,
                IcmpError::PortUnreachable,
                n.f.quote(&sent_to_backend),
            ),
        ),
        (
            "too big for the route → tc answers fragmentation needed (Packet Too Big)",
            frame(false, from(5003), np, TCP_SYN, &[1u8; 1600]),
        ),
    ] {
        let what = n.row(desc);
        let r = run(n, dp, ifindex, desc, &packet);
        assert_eq!(r.verdict, XDP_PASS, "{what}");
        assert_eq!(r.packet, packet, "{what}: must be untouched");
    }
}

/// XDP's way out per backend (`fib::backend_hop`): with no rule by source (the agent's
/// routing flags, [`node1_config`]) new flows from distinct clients to one remote backend
/// take the way kept for the backend, not a lookup of their own; a route change is seen
/// within the second; a rule by source makes the agent clear its family's flag, and each
/// flow's own route is honoured again.
#[test]
fn xdp_keeps_the_way_out_per_backend_and_honours_route_changes_and_rules() {
    if !require_root() {
        return;
    }
    on_node1("xpw", way_out_table);
}

/// `ip` in this thread's namespace (a child inherits it); panics with its stderr.
fn ip(args: &str) {
    let out = std::process::Command::new("ip")
        .args(args.split(' '))
        .output()
        .expect("ip");
    assert!(
        out.status.success(),
        "ip {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn way_out_table(n: &NorthSouth, dp: &mut LoadedDatapath, ifindex: u32) {
    // One CPU throughout: the way out is kept per CPU.
    crate::state::on_cpu(0, || way_out_rows(n, dp, ifindex)).expect("CPU 0");
}

fn way_out_rows(n: &NorthSouth, dp: &mut LoadedDatapath, ifindex: u32) {
    let v = match n.f.family {
        lb_userspace::model::IpFamily::V4 => "-4",
        lb_userspace::model::IpFamily::V6 => "-6",
    };
    let flag = match n.f.family {
        lb_userspace::model::IpFamily::V4 => lb_common::CFG_F_ROUTES_BY_DST,
        lb_userspace::model::IpFamily::V6 => lb_common::CFG_F_ROUTES6_BY_DST,
    };
    assert_ne!(
        node1_config().flags & flag,
        0,
        "{}: no rule by source here: routes by destination",
        n.row("the agent's flags")
    );
    dp.allow_xdp_redirect(ifindex).expect("devmap");
    let np = n.np(30001);
    let remote = SocketAddr::new(n.remote_pod, 8080);
    // A new flow from the `k`th distinct client: redirected out of dum0 to the next hop
    // whose MAC ends in `hop`, DNATed to node2's pod (and SNATed).
    let new_flow = |dp: &mut LoadedDatapath, k: u8, hop: u8, desc: &str| {
        let what = n.row(desc);
        let client = SocketAddr::new(n.f.outside(30 + k), 6000);
        let r = run(
            n,
            dp,
            ifindex,
            desc,
            &frame(false, client, np, TCP_SYN, b""),
        );
        assert_eq!(r.verdict, XDP_REDIRECT, "{what}");
        assert_eq!(&r.packet[0..6], &[2, 0, 0, 0, 0, hop], "{what}: next hop");
        assert_eq!(seen(&r.packet, &what).dst, remote, "{what}");
    };
    new_flow(
        dp,
        0,
        2,
        "first new flow to the backend → its route, next hop 2",
    );
    new_flow(dp, 1, 2, "a new client → the way kept for the backend");
    // node2's pods move behind hop 3: a new flow from a new client within the second still
    // takes the way kept for the backend (a lookup of its own would find hop 3) ...
    let pods = n.pods();
    let (hop3, hop4) = (n.underlay_host(3), n.underlay_host(4));
    ip(&format!(
        "{v} neigh add {hop3} lladdr 02:00:00:00:00:03 dev dum0 nud permanent"
    ));
    ip(&format!("{v} route replace {pods} via {hop3}"));
    new_flow(
        dp,
        2,
        2,
        "route changed, within the second → the way kept (hop 2)",
    );
    // ... and after it, the new route.
    std::thread::sleep(std::time::Duration::from_millis(1200));
    new_flow(
        dp,
        3,
        3,
        "route changed, a second later → the new route (hop 3)",
    );
    // A rule by source (a CNI's per-pod policy routing): client 4 is routed by table 100,
    // via hop 4. The agent's flags go (it re-reads them on the rule's event), and each new
    // flow's route is looked up with its source.
    let client4 = n.f.outside(34);
    let host = match n.f.family {
        lb_userspace::model::IpFamily::V4 => 32,
        lb_userspace::model::IpFamily::V6 => 128,
    };
    ip(&format!(
        "{v} neigh add {hop4} lladdr 02:00:00:00:00:04 dev dum0 nud permanent"
    ));
    ip(&format!("{v} route add {pods} via {hop4} table 100"));
    ip(&format!("{v} rule add from {client4}/{host} lookup 100"));
    let cfg = node1_config();
    assert_eq!(
        cfg.flags & flag,
        0,
        "{}: a rule by source clears the family's flag",
        n.row("the agent's flags")
    );
    dp.configure(&cfg).expect("config");
    new_flow(dp, 4, 4, "rule by source → the client's own route (hop 4)");
    new_flow(dp, 5, 3, "another client → the main table (hop 3)");
    ip(&format!("{v} rule del from {client4}/{host} lookup 100"));
    dp.configure(&node1_config()).expect("config");
}
