//! The same north-south table through the XDP program.

use std::net::{Ipv4Addr, SocketAddrV4};

use crate::checksums::{self, Udp};
use lb_userspace::packet::{PacketBuilder, TCP_ACK, TCP_SYN, icmp_error, parse};
use xlb_tests::suites::packets_north_south::{
    EXT, NODE, OUTSIDER, REMOTE_POD, SNAT_MAX, SNAT_MIN, UNDERLAY, on_node1,
};
use xlb_tests::{
    datapath::{LoadedDatapath, service_packets},
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

fn run_xdp_table(dp: &mut LoadedDatapath, ifindex: u32) {
    let np = |port: u16| SocketAddrV4::new(NODE, port);
    let remote = SocketAddrV4::new(REMOTE_POD, 8080);
    let run = |dp: &mut LoadedDatapath, desc: &str, packet: &[u8]| {
        dp.run_xdp(packet, ifindex)
            .unwrap_or_else(|e| panic!("{desc}: test run: {e}"))
    };

    // 1. A new NodePort flow to a remote backend, egress not in the redirect map: its
    //    destination translated and passed to the stack (netfilter sees client → backend, as
    //    under kube-proxy); tc egress then SNATs it.
    let desc = "new flow, egress without XDP → DNATed and passed; SNATed at tc egress";
    let r = run(dp, desc, &PacketBuilder::tcp(EXT, np(30001)).build());
    assert_eq!(r.verdict, XDP_PASS, "{desc}");
    assert_eq!(
        service_packets(&dp.pins),
        1,
        "{desc}: the first packet counted once"
    );
    let p = parse(&r.packet).expect("parses");
    assert_eq!(
        (p.src, p.dst),
        (EXT, remote),
        "{desc}: as netfilter sees it"
    );
    assert!(p.ip_checksum_ok && p.l4_checksum_ok, "{desc}: checksums");
    let r = dp.run_egress(&r.packet).expect("egress run");
    let p = parse(&r.packet).expect("parses");
    assert_eq!(p.dst, remote, "{desc}");
    assert_eq!(*p.src.ip(), UNDERLAY, "{desc}");
    assert!(
        (SNAT_MIN..=SNAT_MAX).contains(&p.src.port()),
        "{desc}: {p:?}"
    );
    assert!(p.ip_checksum_ok && p.l4_checksum_ok, "{desc}: checksums");
    checksums::assert_valid(&r.packet, Udp::Computed, desc);
    let snat = p.src;

    // 2. The reply to the SNAT address: un-SNATed and passed (the client is routed via
    //    dum0), its frontend restored at tc egress.
    let desc = "reply of the SNATed flow → to the client, then from the frontend at egress";
    let r = run(
        dp,
        desc,
        &PacketBuilder::tcp(remote, snat).flags(TCP_ACK).build(),
    );
    assert_eq!(r.verdict, XDP_PASS, "{desc}");
    let p = parse(&r.packet).expect("parses");
    assert_eq!(
        (p.src, p.dst),
        (remote, EXT),
        "{desc}: as netfilter sees it"
    );
    let r = dp.run_egress(&r.packet).expect("egress run");
    let p = parse(&r.packet).expect("parses");
    assert_eq!((p.src, p.dst), (np(30001), EXT), "{desc}");
    assert!(p.ip_checksum_ok && p.l4_checksum_ok, "{desc}: checksums");
    checksums::assert_valid(&r.packet, Udp::Computed, desc);

    // 3. With the egress interface in the redirect map: a new flow is redirected, both sides
    //    translated at once, with the next hop's MACs, and so is its next packet.
    dp.allow_xdp_redirect(ifindex).expect("devmap");
    let client = SocketAddrV4::new(*EXT.ip(), 5010);
    for (desc, flags) in [
        (
            "new flow, egress runs XDP → redirected with the next hop's MAC",
            TCP_SYN,
        ),
        ("its established packet → redirected the same way", TCP_ACK),
    ] {
        let r = run(
            dp,
            desc,
            &PacketBuilder::tcp(client, np(30001))
                .flags(flags)
                .payload(b"x")
                .build(),
        );
        assert_eq!(r.verdict, XDP_REDIRECT, "{desc}");
        assert_eq!(
            &r.packet[0..6],
            &[2, 0, 0, 0, 0, 2],
            "{desc}: destination MAC"
        );
        assert_eq!(&r.packet[6..12], &[2, 0, 0, 0, 0, 1], "{desc}: source MAC");
        let p = parse(&r.packet).expect("parses");
        assert_eq!((*p.src.ip(), p.dst), (UNDERLAY, remote), "{desc}");
        assert!(
            (SNAT_MIN..=SNAT_MAX).contains(&p.src.port()) && p.src != snat,
            "{desc}: a SNAT port of its own: {p:?}"
        );
        assert!(p.ip_checksum_ok && p.l4_checksum_ok, "{desc}: checksums");
        checksums::assert_valid(&r.packet, Udp::Computed, desc);
    }
    // The flow of 1. found its way out into the stack: its entry keeps that until its
    // once-a-second refresh (no route lookup per packet), so it is still passed translated.
    let desc = "established flow whose entry says the stack → DNATed and passed";
    let r = run(
        dp,
        desc,
        &PacketBuilder::tcp(EXT, np(30001))
            .flags(TCP_ACK)
            .payload(b"x")
            .build(),
    );
    assert_eq!(r.verdict, XDP_PASS, "{desc}");
    let p = parse(&r.packet).expect("parses");
    assert_eq!((p.src, p.dst), (EXT, remote), "{desc}");
    assert!(p.ip_checksum_ok && p.l4_checksum_ok, "{desc}: checksums");
    // Its entry forgets the way out with its once-a-second refresh: the packet that
    // refreshes it still goes into the stack, the next one finds the redirect.
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let ack = || {
        PacketBuilder::tcp(EXT, np(30001))
            .flags(TCP_ACK)
            .payload(b"x")
            .build()
    };
    let desc = "the packet that refreshes the entry → still into the stack";
    assert_eq!(run(dp, desc, &ack()).verdict, XDP_PASS, "{desc}");
    let desc = "established flow after its refresh, egress runs XDP → redirected";
    let r = run(dp, desc, &ack());
    assert_eq!(r.verdict, XDP_REDIRECT, "{desc}");
    let p = parse(&r.packet).expect("parses");
    assert_eq!(
        (p.src, p.dst),
        (snat, remote),
        "{desc}: both sides translated"
    );
    assert!(p.ip_checksum_ok && p.l4_checksum_ok, "{desc}: checksums");

    left_to_tc(dp, ifindex, snat);
    // 4. Source ranges are enforced in XDP too.
    let desc = "LoadBalancer IP, client outside the ranges → dropped in XDP";
    let r = run(
        dp,
        desc,
        &PacketBuilder::tcp(
            OUTSIDER,
            SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 5), 80),
        )
        .build(),
    );
    assert_eq!(r.verdict, XDP_DROP, "{desc}");
}

/// What XDP leaves to tc, untouched.
fn left_to_tc(dp: &mut LoadedDatapath, ifindex: u32, snat: SocketAddrV4) {
    let np = |port: u16| SocketAddrV4::new(NODE, port);
    let remote = SocketAddrV4::new(REMOTE_POD, 8080);
    let mut partial = PacketBuilder::tcp(SocketAddrV4::new(*EXT.ip(), 5002), np(30001)).build();
    let pseudo = {
        let mut sum = 0u32;
        for w in partial[26..34].chunks(2) {
            sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
        }
        sum += 6 + 20;
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum as u16
    };
    partial[50..52].copy_from_slice(&pseudo.to_be_bytes());
    for (desc, packet) in [
        (
            "checksum still partial (CHECKSUM_PARTIAL from a veth sender) → tc",
            partial,
        ),
        (
            "service without a local endpoint (Local policy) → tc drops it",
            PacketBuilder::tcp(EXT, np(30004)).build(),
        ),
        (
            "ICMP → tc translates it",
            icmp_error(
                REMOTE_POD,
                UNDERLAY,
                3,
                3,
                0,
                &PacketBuilder::udp(snat, remote).build()[14..42],
            ),
        ),
        (
            "too big for the route → tc answers fragmentation needed",
            PacketBuilder::tcp(SocketAddrV4::new(*EXT.ip(), 5003), np(30001))
                .payload(&[1u8; 1600])
                .build(),
        ),
    ] {
        let r = dp
            .run_xdp(&packet, ifindex)
            .unwrap_or_else(|e| panic!("{desc}: test run: {e}"));
        assert_eq!(r.verdict, XDP_PASS, "{desc}");
        assert_eq!(r.packet, packet, "{desc}: must be untouched");
    }
}
