//! SCTP at tc, both families: a table of chunk types through DNAT and reverse NAT with a
//! `targetPort` other than the port, each packet's checksum (CRC32c, which covers the ports
//! but no address) checked by an independent implementation (the `crc32c` crate); refusal
//! without endpoints as kube-proxy's REJECT.

use std::net::{IpAddr, SocketAddr};

use etherparse::{IpNumber, Ipv4Header, Ipv6Header, SlicedPacket};
use lb_userspace::source::file;
use xlb_tests::datapath::{LoadedDatapath, reason_counts};
use xlb_tests::services::{service_yaml, service6_yaml};
use xlb_tests::suites::packets::{
    BACKENDS, BACKENDS6, EMPTY_VIP, EMPTY6, FAMILIES, IcmpError, TC_ACT_OK, TC_ACT_REDIRECT, VIP,
    VIP6, base_services, seen_icmp, services6, setup,
};

const SIG_PORT: u16 = 38412;
const SIG_TARGET: u16 = 9999;

const DATA: u8 = 0;
const INIT: u8 = 1;
const INIT_ACK: u8 = 2;
const ABORT: u8 = 6;
const SHUTDOWN: u8 = 7;
const SHUTDOWN_ACK: u8 = 8;
const COOKIE_ECHO: u8 = 10;
const COOKIE_ACK: u8 = 11;
const SHUTDOWN_COMPLETE: u8 = 14;

/// An SCTP packet with one chunk of `kind` (a body of `body` bytes) in Ethernet and IP,
/// its checksum computed.
fn frame(from: SocketAddr, to: SocketAddr, vtag: u32, kind: u8, body: usize) -> Vec<u8> {
    let mut sctp = Vec::new();
    sctp.extend(from.port().to_be_bytes());
    sctp.extend(to.port().to_be_bytes());
    sctp.extend(vtag.to_be_bytes());
    sctp.extend([0u8; 4]);
    let len = 4 + body;
    sctp.extend([kind, 0]);
    sctp.extend((len as u16).to_be_bytes());
    sctp.extend((0..body).map(|i| (i * 7 + kind as usize) as u8));
    sctp.resize(sctp.len() + (4 - len % 4) % 4, 0);
    let crc = crc32c::crc32c(&sctp);
    sctp[8..12].copy_from_slice(&crc.to_le_bytes());
    let mut out = vec![0u8; 12];
    match (from.ip(), to.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            out.extend([0x08, 0x00]);
            let mut ip = Ipv4Header::new(
                sctp.len() as u16,
                64,
                IpNumber::SCTP,
                s.octets(),
                d.octets(),
            )
            .expect("header");
            ip.header_checksum = ip.calc_header_checksum();
            ip.write(&mut out).expect("write");
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            out.extend([0x86, 0xdd]);
            let ip = Ipv6Header {
                payload_length: sctp.len() as u16,
                next_header: IpNumber::SCTP,
                hop_limit: 64,
                source: s.octets(),
                destination: d.octets(),
                ..Default::default()
            };
            ip.write(&mut out).expect("write");
        }
        _ => panic!("mixed families"),
    }
    out.extend(sctp);
    out
}

/// Where the checksum of `frame`'s SCTP packet sits.
fn csum_at(frame: &[u8]) -> usize {
    14 + if frame[12] == 0x08 { 20 } else { 40 } + 8
}

/// The frame's SCTP packet: its ends and its checksum, and whether that is right.
struct Seen {
    src: SocketAddr,
    dst: SocketAddr,
    crc: u32,
    crc_ok: bool,
}

fn seen(frame: &[u8], what: &str) -> Seen {
    let sliced = SlicedPacket::from_ethernet(frame).unwrap_or_else(|e| panic!("{what}: {e}"));
    let net = sliced
        .net
        .as_ref()
        .unwrap_or_else(|| panic!("{what}: no IP"));
    let (src, dst, sctp): (IpAddr, IpAddr, &[u8]) = match net {
        etherparse::NetSlice::Ipv4(v4) => {
            let h = v4.header();
            assert_eq!(
                h.header_checksum(),
                h.to_header().calc_header_checksum(),
                "{what}: IPv4 checksum"
            );
            (
                h.source_addr().into(),
                h.destination_addr().into(),
                v4.payload().payload,
            )
        }
        etherparse::NetSlice::Ipv6(v6) => (
            v6.header().source_addr().into(),
            v6.header().destination_addr().into(),
            v6.payload().payload,
        ),
        other => panic!("{what}: {other:?}"),
    };
    let crc = u32::from_le_bytes([sctp[8], sctp[9], sctp[10], sctp[11]]);
    let mut zeroed = sctp.to_vec();
    zeroed[8..12].fill(0);
    Seen {
        src: SocketAddr::new(src, u16::from_be_bytes([sctp[0], sctp[1]])),
        dst: SocketAddr::new(dst, u16::from_be_bytes([sctp[2], sctp[3]])),
        crc,
        crc_ok: crc32c::crc32c(&zeroed) == crc,
    }
}

/// The packet tables' services of both families, and in each family an SCTP Service on the
/// frontend's address with three backends and one on the empty frontend's with none; SCTP
/// is served (no error for it).
fn with_sctp() -> Option<LoadedDatapath> {
    let mut dp = setup()?;
    let yaml = base_services()
        + &services6()
        + &service_yaml("sig", VIP, SIG_PORT, "SCTP", SIG_TARGET, &BACKENDS)
        + &service_yaml("sig-empty", EMPTY_VIP, SIG_PORT, "SCTP", SIG_TARGET, &[])
        + &service6_yaml("sig6", VIP6, SIG_PORT, "SCTP", SIG_TARGET, &BACKENDS6)
        + &service6_yaml("sig6-empty", EMPTY6, SIG_PORT, "SCTP", SIG_TARGET, &[]);
    let loaded = file::parse("sctp.yaml", &yaml).expect("yaml");
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    let (_, errors) = lb_userspace::desired::compute(
        &loaded.model,
        &mut lb_userspace::reconcile::Ids::default(),
        lb_userspace::desired::Limits::default(),
    );
    assert!(errors.is_empty(), "SCTP is served: {errors:?}");
    dp.program(&loaded.model).expect("program");
    Some(dp)
}

/// One packet through tc ingress and egress: accepted, its length kept; as it leaves.
fn through(dp: &mut LoadedDatapath, pkt: &[u8], what: &str) -> Seen {
    let r = dp.run(pkt).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(r.verdict, TC_ACT_OK, "{what}");
    assert_eq!(r.packet.len(), pkt.len(), "{what}: length");
    seen(&r.packet, what)
}

#[test]
fn sctp_associations_are_translated_both_ways_with_their_checksums_right() {
    let Some(mut dp) = with_sctp() else {
        return;
    };
    for (i, fam) in FAMILIES.iter().enumerate() {
        let name = fam.name();
        let sig = SocketAddr::new(fam.vip, SIG_PORT);
        let client = SocketAddr::new(fam.client, 47000);
        let before = reason_counts(&dp.pins);
        let init = through(&mut dp, &frame(client, sig, 0, INIT, 16), name);
        assert!(
            fam.backends.contains(&init.dst.ip()),
            "{name} INIT: {}",
            init.dst
        );
        assert_eq!(init.dst.port(), SIG_TARGET, "{name} INIT: targetPort");
        assert_eq!(init.src, client, "{name} INIT: the client kept");
        assert!(init.crc_ok, "{name} INIT: CRC32c after the port changed");
        let backend = init.dst;
        // The association's chunks in order (forward: client → frontend), bodies of odd
        // lengths, one long.
        let table: [(&str, bool, u8, usize); 8] = [
            ("INIT ACK", false, INIT_ACK, 20),
            ("COOKIE ECHO", true, COOKIE_ECHO, 33),
            ("COOKIE ACK", false, COOKIE_ACK, 0),
            ("DATA", true, DATA, 1400),
            ("DATA back", false, DATA, 9),
            ("SHUTDOWN", true, SHUTDOWN, 4),
            ("SHUTDOWN ACK", false, SHUTDOWN_ACK, 0),
            ("SHUTDOWN COMPLETE", true, SHUTDOWN_COMPLETE, 0),
        ];
        for (what, forward, kind, body) in table {
            let what = format!("{name} {what}");
            let pkt = if forward {
                frame(client, sig, 0x0102_0304, kind, body)
            } else {
                frame(backend, client, 0x0a0b_0c0d, kind, body)
            };
            let out = through(&mut dp, &pkt, &what);
            assert!(out.crc_ok, "{what}: CRC32c");
            if forward {
                assert_eq!((out.src, out.dst), (client, backend), "{what}");
            } else {
                assert_eq!(
                    (out.src, out.dst),
                    (sig, client),
                    "{what}: from the frontend"
                );
            }
        }
        let counts = reason_counts(&dp.pins);
        let more = |r: &str| counts[r] - before[r];
        assert_eq!(more("new_flow"), 1, "{name}: {counts:?}");
        assert_eq!(more("established"), 4, "{name}: {counts:?}");
        assert_eq!(more("reverse_nat"), 4, "{name}: {counts:?}");

        // A closed association's port starts over with the next INIT.
        let again = through(&mut dp, &frame(client, sig, 0, INIT, 16), name);
        assert!(again.crc_ok && fam.backends.contains(&again.dst.ip()));
        assert_eq!(
            reason_counts(&dp.pins)["new_flow"] - before["new_flow"],
            2,
            "{name}"
        );

        // Another association: a checksum the kernel computes later (zero) stays zero; a
        // wrong one stays wrong (never made right by the rewrite); ABORT ends it.
        let client = SocketAddr::new(fam.client, 47100 + i as u16);
        let backend = through(&mut dp, &frame(client, sig, 0, INIT, 16), name).dst;
        let mut pending = frame(client, sig, 0x0102_0304, DATA, 40);
        let at = csum_at(&pending);
        pending[at..at + 4].fill(0);
        let out = through(&mut dp, &pending, &format!("{name} DATA, checksum pending"));
        assert_eq!(
            (out.crc, out.dst),
            (0, backend),
            "{name}: a pending checksum stays 0"
        );
        let mut bad = frame(client, sig, 0x0102_0304, DATA, 40);
        bad[at] ^= 0x5a;
        let out = through(&mut dp, &bad, &format!("{name} DATA, checksum wrong"));
        assert!(!out.crc_ok, "{name}: a wrong checksum stays wrong");
        through(&mut dp, &frame(client, sig, 0x0102_0304, ABORT, 0), name);
        let before = reason_counts(&dp.pins)["new_flow"];
        through(&mut dp, &frame(client, sig, 0, INIT, 16), name);
        assert_eq!(
            reason_counts(&dp.pins)["new_flow"],
            before + 1,
            "{name}: after ABORT"
        );
    }
}

#[test]
fn sctp_without_endpoints_is_refused_and_other_ports_pass_untouched() {
    let Some(mut dp) = with_sctp() else {
        return;
    };
    for fam in FAMILIES {
        let name = fam.name();
        let client = SocketAddr::new(fam.client, 47200);
        // As kube-proxy's REJECT: ICMP port unreachable from the frontend.
        let init = frame(client, SocketAddr::new(fam.empty, SIG_PORT), 0, INIT, 16);
        let r = dp.run_ingress(&init).expect("run");
        assert_eq!(r.verdict, TC_ACT_REDIRECT, "{name}: refused");
        let m = seen_icmp(&r.packet, &format!("{name}: refused"));
        assert_eq!((m.src, m.dst), (fam.empty, fam.client), "{name}");
        assert_eq!(m.kind, fam.port_unreachable, "{name}: port unreachable");
        assert_eq!(m.quote, fam.quote(&init), "{name}: quotes the INIT as sent");

        // An SCTP port the service does not have, and an address no service has.
        let elsewhere = fam.stranger(9);
        for to in [
            SocketAddr::new(fam.vip, SIG_PORT + 1),
            SocketAddr::new(elsewhere, SIG_PORT),
        ] {
            let pkt = frame(client, to, 0, INIT, 16);
            let r = dp.run(&pkt).expect("run");
            assert_eq!((r.verdict, &r.packet), (TC_ACT_OK, &pkt), "{to}: untouched");
        }
    }
}

/// ICMP errors about an SCTP flow, both families: the backend's port unreachable (or
/// ICMPv6 destination unreachable) quoting the INIT as the backend got it reaches the
/// client from the frontend, quoting the INIT as the client sent it (the frontend and its
/// port), as netfilter's NAT translates a related packet. The quote's first 8 SCTP bytes
/// are the ports and the verification tag; its CRC32c lies beyond them.
#[test]
fn icmp_errors_quoting_an_sctp_flow_are_translated_both_ways() {
    let Some(mut dp) = with_sctp() else {
        return;
    };
    for fam in FAMILIES {
        let name = fam.name();
        let client = SocketAddr::new(fam.client, 47300);
        let vip = SocketAddr::new(fam.vip, SIG_PORT);
        let init = frame(client, vip, 0, INIT, 16);
        let r = dp.run(&init).expect("run");
        assert_eq!(r.verdict, TC_ACT_OK, "{name}: INIT");
        let sent = seen(&r.packet, name);
        assert!(
            fam.backends.contains(&sent.dst.ip()),
            "{name}: {}",
            sent.dst
        );
        let backend = sent.dst.ip();
        let quote = fam.quote(&r.packet);
        let error = fam.icmp_error(backend, fam.client, IcmpError::PortUnreachable, quote);
        let before = reason_counts(&dp.pins)["icmp_xlate"];
        let out = dp.run(&error).expect("run");
        assert_eq!(out.verdict, TC_ACT_OK, "{name}: ICMP error");
        let m = seen_icmp(&out.packet, &format!("{name}: ICMP error"));
        assert_eq!((m.src, m.dst), (fam.vip, fam.client), "{name}: outer");
        assert_eq!(
            m.quote,
            fam.quote(&init),
            "{name}: quotes the INIT as the client sent it"
        );
        // Each hook translates its side (ingress the destination's, egress the source's).
        assert_eq!(
            reason_counts(&dp.pins)["icmp_xlate"],
            before + 2,
            "{name}: counted at ingress and at egress"
        );
    }
}
