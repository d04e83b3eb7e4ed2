//! Packet tables through BPF_PROG_TEST_RUN: the rewrites and their checksums (in both
//! families, behind optional headers, the spread of new flows: packets/flows.rs).

use std::net::SocketAddrV4;

use crate::checksums::{self, Udp};
use lb_userspace::packet::{PacketBuilder, TCP_ACK, parse};
use xlb_tests::datapath::LoadedDatapath;
use xlb_tests::suites::packets::{
    BACKENDS, CLIENT, EMPTY_VIP, TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, VIP, setup,
};

/// What a case expects of the program.
#[derive(Debug)]
enum Expect {
    /// TC_ACT_SHOT.
    Drop,
    /// TC_ACT_REDIRECT back to the sender: a TCP RST from the frontend.
    Refused,
    /// TC_ACT_OK, destination rewritten to one of the backends on `port`, checksums valid.
    Dnat { port: u16 },
    /// TC_ACT_OK, source rewritten to `from`, checksums valid.
    ReverseNat { from: SocketAddrV4 },
}

struct Case {
    desc: &'static str,
    packet: Vec<u8>,
    expect: Expect,
}

fn check(dp: &mut LoadedDatapath, case: &Case) -> Option<SocketAddrV4> {
    let r = dp
        .run(&case.packet)
        .unwrap_or_else(|e| panic!("{}: test run: {e}", case.desc));
    let out = parse(&r.packet);
    match case.expect {
        Expect::Drop => {
            assert_eq!(r.verdict, TC_ACT_SHOT, "{}", case.desc);
            None
        }
        Expect::Refused => {
            assert_eq!(r.verdict, TC_ACT_REDIRECT, "{}", case.desc);
            let p = out.unwrap_or_else(|| panic!("{}: output does not parse", case.desc));
            let input = parse(&case.packet).expect("input parses");
            assert_eq!(
                (p.src, p.dst),
                (input.dst, input.src),
                "{}: RST goes back",
                case.desc
            );
            assert!(
                p.ip_checksum_ok && p.l4_checksum_ok,
                "{}: checksums",
                case.desc
            );
            checksums::assert_valid(&r.packet, Udp::Computed, case.desc);
            assert_eq!(r.packet[47] & 0x04, 0x04, "{}: RST flag", case.desc);
            None
        }
        Expect::Dnat { port } => {
            assert_eq!(r.verdict, TC_ACT_OK, "{}", case.desc);
            let p = out.unwrap_or_else(|| panic!("{}: output does not parse", case.desc));
            let input = parse(&case.packet).expect("input parses");
            assert!(
                BACKENDS.contains(p.dst.ip()),
                "{}: dst {} is not a backend",
                case.desc,
                p.dst
            );
            assert_eq!(p.dst.port(), port, "{}", case.desc);
            assert_eq!(p.src, input.src, "{}: source must be kept", case.desc);
            assert!(p.ip_checksum_ok, "{}: IPv4 checksum", case.desc);
            assert!(p.l4_checksum_ok, "{}: L4 checksum", case.desc);
            checksums::assert_valid(&r.packet, udp_mode(&input), case.desc);
            Some(p.dst)
        }
        Expect::ReverseNat { from } => {
            assert_eq!(r.verdict, TC_ACT_OK, "{}", case.desc);
            let p = out.unwrap_or_else(|| panic!("{}: output does not parse", case.desc));
            let input = parse(&case.packet).expect("input parses");
            assert_eq!(p.src, from, "{}", case.desc);
            assert_eq!(p.dst, input.dst, "{}: destination must be kept", case.desc);
            assert!(
                p.ip_checksum_ok && p.l4_checksum_ok,
                "{}: checksums",
                case.desc
            );
            checksums::assert_valid(&r.packet, udp_mode(&input), case.desc);
            Some(p.src)
        }
    }
}

/// The UDP checksum a rewrite of `input` must carry: none when the input had none.
fn udp_mode(input: &lb_userspace::packet::Parsed) -> Udp {
    if input.udp_checksum_zero {
        Udp::None
    } else {
        Udp::Computed
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

#[test]
fn rewrites_follow_the_table() {
    let Some(mut dp) = setup() else {
        return;
    };
    let vip80 = SocketAddrV4::new(VIP, 80);
    let vip53 = SocketAddrV4::new(VIP, 53);

    // New flows: DNAT to a backend with valid checksums.
    let syn = PacketBuilder::tcp(CLIENT, vip80).build();
    let chosen = check(
        &mut dp,
        &Case {
            desc: "TCP SYN to ClusterIP → DNAT",
            packet: syn.clone(),
            expect: Expect::Dnat { port: 8080 },
        },
    )
    .expect("backend");
    let udp = PacketBuilder::udp(CLIENT, vip53).payload(b"query").build();
    let udp_backend = check(
        &mut dp,
        &Case {
            desc: "UDP to ClusterIP → DNAT",
            packet: udp,
            expect: Expect::Dnat { port: 5353 },
        },
    )
    .expect("backend");

    let table = later_packets(chosen, udp_backend);
    for case in &table {
        let got = check(&mut dp, case);
        if case.desc.starts_with("later packet") {
            assert_eq!(got, Some(chosen), "{}", case.desc);
        }
    }
    let udp_zero = parse(&dp.run(&table[3].packet).expect("run").packet).expect("parses");

    counted(&dp, udp_zero);
}

/// After the first TCP and UDP packets (to `chosen` and `udp_backend`): later packets,
/// replies, a service without backends.
fn later_packets(chosen: SocketAddrV4, udp_backend: SocketAddrV4) -> Vec<Case> {
    let vip80 = SocketAddrV4::new(VIP, 80);
    let vip53 = SocketAddrV4::new(VIP, 53);
    vec![
        Case {
            desc: "later packet of the TCP flow keeps its backend",
            packet: PacketBuilder::tcp(CLIENT, vip80)
                .flags(TCP_ACK)
                .payload(b"GET /")
                .build(),
            expect: Expect::Dnat { port: 8080 },
        },
        Case {
            desc: "reply from the backend → source is the ClusterIP again",
            packet: PacketBuilder::tcp(chosen, CLIENT)
                .flags(TCP_ACK)
                .payload(b"200 OK")
                .build(),
            expect: Expect::ReverseNat { from: vip80 },
        },
        Case {
            desc: "UDP reply → source is the ClusterIP again",
            packet: PacketBuilder::udp(udp_backend, CLIENT)
                .payload(b"answer")
                .build(),
            expect: Expect::ReverseNat { from: vip53 },
        },
        Case {
            desc: "UDP without checksum: rewritten, checksum stays 0",
            packet: PacketBuilder::udp(SocketAddrV4::new(*CLIENT.ip(), 40001), vip53)
                .without_udp_checksum()
                .build(),
            expect: Expect::Dnat { port: 5353 },
        },
        Case {
            desc: "service without backends → refused (RST back to the client)",
            packet: PacketBuilder::tcp(CLIENT, SocketAddrV4::new(EMPTY_VIP, 80)).build(),
            expect: Expect::Refused,
        },
        Case {
            desc: "a RST to a service without backends is not answered → dropped",
            packet: PacketBuilder::tcp(CLIENT, SocketAddrV4::new(EMPTY_VIP, 80))
                .flags(0x04)
                .build(),
            expect: Expect::Drop,
        },
    ]
}

/// Every verdict of [`rewrites_follow_the_table`] bumped its reason's counter, and the web
/// service's packet counter.
fn counted(dp: &LoadedDatapath, udp_zero: lb_userspace::packet::Parsed) {
    let counts = xlb_tests::datapath::reason_counts(&dp.pins);
    assert_eq!(counts["new_flow"], 3, "{counts:?}");
    assert_eq!(counts["established"], 2, "{counts:?}");
    // Each reply twice: its destination side at ingress (nothing to restore: not SNATed),
    // its source at egress.
    assert_eq!(counts["reply_in"], 2, "{counts:?}");
    assert_eq!(counts["reverse_nat"], 2, "{counts:?}");
    assert_eq!(counts["snat_out"], 0, "{counts:?}");
    assert_eq!(counts["reject"], 1, "{counts:?}");
    assert_eq!(counts["no_backend"], 1, "{counts:?}");
    // At egress, every packet ingress passed on that has no source to restore: the 3 new
    // flows and the 2 established packets (packets for no service: packets/robust.rs).
    assert_eq!(counts["pass"], 5, "{counts:?}");
    let web = lb_userspace::list::services(&xlb_tests::pins(&dp.pins)).expect("services");
    let web = web
        .iter()
        .find(|r| r.frontend == "10.96.0.10:80/TCP")
        .expect("web");
    assert_eq!(
        web.packets, 3,
        "SYN, later packet and reply of the web flow"
    );
    assert!(
        udp_zero.udp_checksum_zero,
        "a zero UDP checksum must stay zero"
    );
}
