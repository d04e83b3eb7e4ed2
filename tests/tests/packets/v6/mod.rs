//! IPv6 packet tables through BPF_PROG_TEST_RUN on the loaded tc program, as the IPv4 ones
//! (`packets/`): DNAT and reverse NAT with L4 checksums over the pseudo-header (checked by
//! etherparse), extension headers walked, fragments and everything not for a service passed
//! untouched, truncated and malformed headers dropped untouched, random buffers.
//!
//! One binary, a module per topic: `flows` (translation, non-service, malformed, random
//! buffers), `refusals` (no endpoints, ICMPv6 errors, Packet Too Big), `routed` (XDP and
//! SNAT in a routed namespace), `hairpin`, `ranges` (loadBalancerSourceRanges).

mod flows;
mod hairpin;
mod ranges;
mod refusals;
mod routed;

use std::net::{Ipv6Addr, SocketAddrV6};

use xlb_tests::frame6;

use frame6::{
    Ext, Frame6, IPPROTO_ICMPV6, NEXTHDR_DEST, NEXTHDR_HOP, TCP_ACK, TCP_SYN, seen_icmp6, seen6,
};
use xlb_tests::{
    datapath::{LoadedDatapath, reason_counts},
    require_root,
    suites::packets::{
        BACKENDS6, CLIENT6, EMPTY6, TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, VIP6, services6,
    },
    unique_tag,
};

fn sa(ip: Ipv6Addr, port: u16) -> SocketAddrV6 {
    SocketAddrV6::new(ip, port, 0, 0)
}

fn client(port: u16) -> SocketAddrV6 {
    sa(*CLIENT6.ip(), port)
}

fn setup() -> Option<LoadedDatapath> {
    if !require_root() {
        return None;
    }
    Some(loaded(&unique_tag("xlp6")))
}

/// The datapath loaded under pins named `tag`, with the table's services.
fn loaded(tag: &str) -> LoadedDatapath {
    let mut dp = LoadedDatapath::load(tag).expect("load the eBPF object");
    let loaded = lb_userspace::source::file::parse("packets6.yaml", &services6()).expect("yaml");
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    dp.program(&loaded.model).expect("program maps");
    dp
}

/// Runs `frame`; expects it DNATed to a backend on `port`, source kept, checksum valid.
/// Returns the backend.
fn expect_dnat(dp: &mut LoadedDatapath, frame: &[u8], port: u16, what: &str) -> SocketAddrV6 {
    let r = dp.run(frame).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(r.verdict, TC_ACT_OK, "{what}");
    assert_eq!(r.packet.len(), frame.len(), "{what}: length");
    let before = seen6(frame, what);
    let after = seen6(&r.packet, what);
    assert!(
        BACKENDS6.contains(after.dst.ip()),
        "{what}: {} is no backend",
        after.dst
    );
    assert_eq!(after.dst.port(), port, "{what}");
    assert_eq!(
        after.src, before.src,
        "{what}: the client's address is kept"
    );
    // Everything but the destination address and port is as it was.
    let mut back = r.packet.clone();
    back[38..54].copy_from_slice(&before.dst.ip().octets());
    assert_eq!(back.len(), frame.len());
    after.dst
}

fn expect_untouched(dp: &mut LoadedDatapath, frame: &[u8], verdict: u32, what: &str) {
    let r = dp.run(frame).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(r.verdict, verdict, "{what}: verdict");
    assert_eq!(r.packet, frame, "{what}: the packet changed");
}
