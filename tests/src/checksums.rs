//! One assertion over a whole frame's checksums, by etherparse's full computation (independent
//! of the datapath's incremental updates): the IPv4 header's, the TCP, UDP or ICMP one, an ICMP
//! error's quoted header, and the rule that a UDP checksum of 0 stays 0. The frames'
//! builder and parser (`lb_userspace::packet`) use etherparse too; this is the check a packet
//! test makes of an output frame of any of those kinds in one call.

use etherparse::{Ipv4HeaderSlice, NetSlice, SlicedPacket, TransportSlice};

/// How a frame's UDP checksum may be: computed, or 0 ("none", which a rewrite must keep).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Udp {
    Computed,
    None,
}

/// Asserts that `frame` (Ethernet, IPv4, then TCP, UDP or ICMP) carries the IPv4 header
/// checksum and the TCP, UDP or ICMP checksum etherparse computes for it; for an ICMP error,
/// the quoted IPv4 header's too. `udp` says whether a UDP checksum of 0 is expected.
pub fn assert_valid(frame: &[u8], udp: Udp, what: &str) {
    let sliced = SlicedPacket::from_ethernet(frame)
        .unwrap_or_else(|e| panic!("{what}: etherparse cannot read the frame: {e}"));
    let Some(NetSlice::Ipv4(ip)) = &sliced.net else {
        panic!("{what}: not IPv4 for etherparse");
    };
    let header = ip.header();
    assert_ipv4_header(&header, what);
    let (src, dst) = (header.source(), header.destination());
    match &sliced.transport {
        Some(TransportSlice::Tcp(tcp)) => {
            let want = tcp
                .calc_checksum_ipv4(src, dst)
                .unwrap_or_else(|e| panic!("{what}: TCP checksum: {e}"));
            assert_eq!(tcp.checksum(), want, "{what}: TCP checksum (etherparse)");
        }
        Some(TransportSlice::Udp(u)) => {
            let carried = u.checksum();
            if udp == Udp::None {
                assert_eq!(carried, 0, "{what}: a UDP checksum of 0 must stay 0");
                return;
            }
            let want = u
                .to_header()
                .calc_checksum_ipv4_raw(src, dst, u.payload())
                .unwrap_or_else(|e| panic!("{what}: UDP checksum: {e}"));
            assert_eq!(carried, want, "{what}: UDP checksum (etherparse)");
        }
        Some(TransportSlice::Icmpv4(icmp)) => {
            let want = icmp.icmp_type().calc_checksum(icmp.payload());
            assert_eq!(icmp.checksum(), want, "{what}: ICMP checksum (etherparse)");
            let quoted = Ipv4HeaderSlice::from_slice(icmp.payload())
                .unwrap_or_else(|e| panic!("{what}: the quoted IPv4 header: {e}"));
            assert_ipv4_header(&quoted, &format!("{what}: quoted"));
        }
        other => panic!("{what}: no TCP, UDP or ICMP for etherparse: {other:?}"),
    }
}

fn assert_ipv4_header(h: &Ipv4HeaderSlice<'_>, what: &str) {
    assert_eq!(
        h.header_checksum(),
        h.to_header().calc_header_checksum(),
        "{what}: IPv4 header checksum (etherparse)"
    );
}

/// Asserts that no SCTP server of the lab dropped a packet for its CRC32c (each checks
/// every packet with the `crc32c` crate, independent of xlb's incremental update), and
/// that none had a packet refused by its own socket (a fault of the lab, not of xlb).
pub fn assert_no_bad_sctp_checksums(servers: &[xlb_lab::sctp::SctpServer]) {
    let bad: Vec<u64> = servers.iter().map(|s| s.bad_checksums()).collect();
    assert!(
        bad.iter().all(|b| *b == 0),
        "servers dropped packets for their checksum: {bad:?}"
    );
    let failed: Vec<String> = servers.iter().filter_map(|s| s.failure()).collect();
    assert!(failed.is_empty(), "the lab's SCTP servers: {failed:?}");
}
