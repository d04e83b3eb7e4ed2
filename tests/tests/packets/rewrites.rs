//! Packet tables through BPF_PROG_TEST_RUN: the rewrites, their verdicts, counters and
//! checksums, in both families (behind optional headers, the spread of new flows:
//! packets/flows.rs); the independent checksum check itself.

use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::checksums::{self, Udp};
use lb_userspace::{
    model::IpFamily,
    packet::{PacketBuilder, TCP_ACK, TCP_SYN, parse},
};
use xlb_tests::datapath::{LoadedDatapath, reason_counts};
use xlb_tests::frame6::Frame6;
use xlb_tests::suites::packets::{
    BACKENDS, CLIENT, CLIENT6, Family, TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, VIP, VIP6, frame,
    in_both_families, seen, seen_icmp,
};

/// What a row expects of the program.
#[derive(Debug)]
enum Expect {
    /// TC_ACT_SHOT, untouched.
    Drop,
    /// TC_ACT_REDIRECT back to the sender: a TCP RST from the frontend.
    Refused,
    /// TC_ACT_OK, destination rewritten to one of the backends on `port`, the source kept.
    Dnat { port: u16 },
    /// TC_ACT_OK, source rewritten to `from`, the destination kept.
    ReverseNat { from: SocketAddr },
}

struct Row {
    desc: &'static str,
    packet: Vec<u8>,
    expect: Expect,
}

/// Runs a row (its failure names `f` and the row); every output's checksums checked by
/// etherparse. The rewritten address (the backend, or the reply's new source).
fn check(f: &Family, dp: &mut LoadedDatapath, row: &Row) -> Option<SocketAddr> {
    let what = f.row(row.desc);
    let r = dp
        .run(&row.packet)
        .unwrap_or_else(|e| panic!("{what}: test run: {e}"));
    let input = seen(&row.packet, &format!("{what}: input"));
    match row.expect {
        Expect::Drop => {
            assert_eq!((r.verdict, &r.packet), (TC_ACT_SHOT, &row.packet), "{what}");
            None
        }
        Expect::Refused => {
            assert_eq!(r.verdict, TC_ACT_REDIRECT, "{what}");
            let p = seen(&r.packet, &what);
            assert_eq!(
                (p.src, p.dst),
                (input.dst, input.src),
                "{what}: RST goes back"
            );
            assert_eq!(r.packet[f.l4_at() + 13] & 0x04, 0x04, "{what}: RST flag");
            None
        }
        Expect::Dnat { port } => {
            assert_eq!(r.verdict, TC_ACT_OK, "{what}");
            let p = seen(&r.packet, &what);
            assert!(
                f.backends.contains(&p.dst.ip()),
                "{what}: dst {} is not a backend",
                p.dst
            );
            assert_eq!(p.dst.port(), port, "{what}");
            assert_eq!(p.src, input.src, "{what}: source must be kept");
            Some(p.dst)
        }
        Expect::ReverseNat { from } => {
            assert_eq!(r.verdict, TC_ACT_OK, "{what}");
            let p = seen(&r.packet, &what);
            assert_eq!(p.src, from, "{what}");
            assert_eq!(p.dst, input.dst, "{what}: destination must be kept");
            Some(p.src)
        }
    }
}

/// `icmp` with its quoted IPv4 header's checksum off by one bit and the ICMP checksum made
/// right again over that, so only the quoted header is wrong.
fn quoted_sum_off(icmp: &[u8]) -> Vec<u8> {
    let mut f = icmp.to_vec();
    f[42 + 11] ^= 0x01;
    f[36..38].copy_from_slice(&[0, 0]);
    let sum = lb_userspace::packet::checksum(&f[34..], 0);
    f[36..38].copy_from_slice(&sum.to_be_bytes());
    f
}

/// The independent check fails on a frame whose checksum is off by one bit, in every field it
/// checks (no root needed).
#[test]
fn the_independent_checksum_check_rejects_every_wrong_sum() {
    let tcp = PacketBuilder::tcp(CLIENT, SocketAddrV4::new(VIP, 80))
        .payload(b"GET /")
        .build();
    let udp = PacketBuilder::udp(CLIENT, SocketAddrV4::new(VIP, 53))
        .payload(b"query")
        .build();
    let icmp = lb_userspace::packet::icmp_error(BACKENDS[0], *CLIENT.ip(), 3, 3, 0, &udp[14..42]);
    let no_sum = PacketBuilder::udp(CLIENT, SocketAddrV4::new(VIP, 53))
        .without_udp_checksum()
        .build();
    for (frame, udp_mode) in [
        (&tcp, Udp::Computed),
        (&udp, Udp::Computed),
        (&icmp, Udp::Computed),
        (&no_sum, Udp::None),
    ] {
        checksums::assert_valid(frame, udp_mode, "as built");
    }
    let flip = |frame: &[u8], at: usize| {
        let mut f = frame.to_vec();
        f[at] ^= 0x01;
        f
    };
    for (what, frame, udp_mode) in [
        ("IPv4 header", flip(&tcp, 25), Udp::Computed),
        ("TCP", flip(&tcp, 51), Udp::Computed),
        ("UDP", flip(&udp, 41), Udp::Computed),
        (
            "UDP checksum 0 where one is due",
            no_sum.clone(),
            Udp::Computed,
        ),
        ("UDP checksum where 0 must stay", udp.clone(), Udp::None),
        ("ICMP", flip(&icmp, 37), Udp::Computed),
        ("quoted IPv4 header", quoted_sum_off(&icmp), Udp::Computed),
    ] {
        let caught = std::panic::catch_unwind(|| checksums::assert_valid(&frame, udp_mode, what));
        assert!(caught.is_err(), "{what}: a wrong checksum went unnoticed");
    }
}

/// The same check over IPv6 (no root needed): a TCP, UDP and ICMPv6 frame as built pass,
/// each with its checksum off by one bit fails, and so does a UDP checksum of 0 (which
/// IPv6 does not allow).
#[test]
fn the_independent_checksum_check_rejects_every_wrong_ipv6_sum() {
    let sa = |p: u16| SocketAddrV6::new(VIP6, p, 0, 0);
    let tcp = Frame6::tcp(CLIENT6, sa(80), TCP_SYN, b"GET /").build();
    let udp = Frame6::udp(CLIENT6, sa(53), b"query").build();
    let icmp = Frame6::icmp(VIP6, *CLIENT6.ip(), 1, 4, [0; 4], &udp[14..62]).build();
    seen(&tcp, "TCP as built");
    seen(&udp, "UDP as built");
    seen_icmp(&icmp, "ICMPv6 as built");
    let flip = |frame: &[u8], at: usize| {
        let mut f = frame.to_vec();
        f[at] ^= 0x01;
        f
    };
    let mut zero = udp.clone();
    zero[60..62].copy_from_slice(&[0, 0]);
    for (what, frame, icmp) in [
        ("TCP", flip(&tcp, 71), false),
        ("UDP", flip(&udp, 61), false),
        ("UDP checksum 0", zero, false),
        ("ICMPv6", flip(&icmp, 57), true),
    ] {
        let caught = std::panic::catch_unwind(|| {
            if icmp {
                seen_icmp(&frame, what);
            } else {
                seen(&frame, what);
            }
        });
        assert!(caught.is_err(), "{what}: a wrong checksum went unnoticed");
    }
}

/// New flows, their later packets and replies, a service without backends, in both
/// families: each row's verdict and rewrite, and each verdict's reason counter and the web
/// service's packet counter.
#[test]
fn rewrites_follow_the_table() {
    in_both_families(rewrites);
}

fn rewrites(f: &Family, dp: &mut LoadedDatapath) {
    let (vip80, vip53) = (SocketAddr::new(f.vip, 80), SocketAddr::new(f.vip, 53));
    let c = f.client(40000);
    let first = [
        Row {
            desc: "TCP SYN to ClusterIP → DNAT",
            packet: frame(false, c, vip80, TCP_SYN, b""),
            expect: Expect::Dnat { port: 8080 },
        },
        Row {
            desc: "UDP to ClusterIP → DNAT",
            packet: frame(true, c, vip53, 0, b"query"),
            expect: Expect::Dnat { port: 5353 },
        },
    ];
    let chosen = check(f, dp, &first[0]).expect("backend");
    let udp_backend = check(f, dp, &first[1]).expect("backend");
    for row in later_packets(f, chosen, udp_backend) {
        let got = check(f, dp, &row);
        if row.desc.starts_with("later packet") {
            assert_eq!(got, Some(chosen), "{}", f.row(row.desc));
        }
    }
    let zero_rows = u64::from(f.family == IpFamily::V4);
    if zero_rows == 1 {
        udp_without_checksum(dp);
    }
    counted(f, dp, zero_rows);
}

/// After the first TCP and UDP packets (to `chosen` and `udp_backend`): later packets,
/// replies, a service without backends.
fn later_packets(f: &Family, chosen: SocketAddr, udp_backend: SocketAddr) -> Vec<Row> {
    let (vip80, vip53) = (SocketAddr::new(f.vip, 80), SocketAddr::new(f.vip, 53));
    let (c, empty) = (f.client(40000), SocketAddr::new(f.empty, 80));
    vec![
        Row {
            desc: "later packet of the TCP flow keeps its backend",
            packet: frame(false, c, vip80, TCP_ACK, b"GET /"),
            expect: Expect::Dnat { port: 8080 },
        },
        Row {
            desc: "reply from the backend → source is the ClusterIP again",
            packet: frame(false, chosen, c, TCP_ACK, b"200 OK"),
            expect: Expect::ReverseNat { from: vip80 },
        },
        Row {
            desc: "UDP reply → source is the ClusterIP again",
            packet: frame(true, udp_backend, c, 0, b"answer"),
            expect: Expect::ReverseNat { from: vip53 },
        },
        Row {
            desc: "service without backends → refused (RST back to the client)",
            packet: frame(false, c, empty, TCP_SYN, b""),
            expect: Expect::Refused,
        },
        Row {
            desc: "a RST to a service without backends is not answered → dropped",
            packet: frame(false, c, empty, 0x04, b""),
            expect: Expect::Drop,
        },
    ]
}

/// IPv4 only (IPv6 has no UDP checksum of 0, RFC 8200 §8.1): a datagram without checksum is
/// DNATed and its checksum stays 0, as a new flow and again as an established one.
fn udp_without_checksum(dp: &mut LoadedDatapath) {
    let packet = PacketBuilder::udp(
        SocketAddrV4::new(*CLIENT.ip(), 40001),
        SocketAddrV4::new(VIP, 53),
    )
    .without_udp_checksum()
    .build();
    for what in ["new", "established"] {
        let what = format!("IPv4: UDP without checksum, {what}: rewritten, checksum stays 0");
        let r = dp.run(&packet).expect("run");
        assert_eq!(r.verdict, TC_ACT_OK, "{what}");
        let p = parse(&r.packet).unwrap_or_else(|| panic!("{what}: output does not parse"));
        assert!(
            BACKENDS.contains(p.dst.ip()) && p.dst.port() == 5353,
            "{what}: {p:?}"
        );
        assert!(
            p.udp_checksum_zero,
            "{what}: a zero UDP checksum must stay zero"
        );
        checksums::assert_valid(&r.packet, Udp::None, &what);
    }
}

/// Every verdict of [`rewrites_follow_the_table`] bumped its reason's counter, and the web
/// service's packet counter (`zero_rows`: 1 with the IPv4 rows of a UDP datagram without
/// checksum, a new flow and an established packet more).
fn counted(f: &Family, dp: &LoadedDatapath, zero_rows: u64) {
    let counts = reason_counts(&dp.pins);
    let what = f.name();
    assert_eq!(counts["new_flow"], 2 + zero_rows, "{what}: {counts:?}");
    assert_eq!(counts["established"], 1 + zero_rows, "{what}: {counts:?}");
    // Each reply twice: its destination side at ingress (nothing to restore: not SNATed),
    // its source at egress.
    assert_eq!(counts["reply_in"], 2, "{what}: {counts:?}");
    assert_eq!(counts["reverse_nat"], 2, "{what}: {counts:?}");
    assert_eq!(counts["snat_out"], 0, "{what}: {counts:?}");
    assert_eq!(counts["reject"], 1, "{what}: {counts:?}");
    assert_eq!(counts["no_backend"], 1, "{what}: {counts:?}");
    // At egress, every packet ingress passed on that has no source to restore: the new
    // flows and the established packets (packets for no service: packets/robust.rs).
    assert_eq!(counts["pass"], 3 + 2 * zero_rows, "{what}: {counts:?}");
    let services = lb_userspace::list::services(&xlb_tests::pins(&dp.pins)).expect("services");
    let web = Family::tcp_frontend(f.vip, 80);
    let web = services
        .iter()
        .find(|r| r.frontend == web)
        .unwrap_or_else(|| panic!("{what}: {web} listed"));
    assert_eq!(
        web.packets, 3,
        "{what}: SYN, later packet and reply of the web flow"
    );
}
