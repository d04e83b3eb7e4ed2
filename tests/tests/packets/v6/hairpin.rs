//! IPv6 hairpin through BPF_PROG_TEST_RUN on the loaded tc program: a pod reaching itself
//! through its own Service is SNATed to the IPv6 hairpin address (it would take a packet
//! from its own address for one it sent itself), and its reply to that address comes back
//! from the ClusterIP. Without a hairpin address the source is kept, as for IPv4.

use std::net::{Ipv6Addr, SocketAddrV6};

use super::TC_ACT_OK;
use super::frame6::{Frame6, TCP_ACK, TCP_SYN, seen6};
use xlb_tests::{
    datapath::{LoadedDatapath, reason_counts},
    require_root,
    services::service6_yaml,
    unique_tag,
};

const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x40);
/// A second Service on the same endpoint.
const VIP6B: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x41);
const POD6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x244, 2, 0, 0, 0, 2);
const HAIRPIN6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xa9fe, 0x2a, 0, 0, 0, 0, 1);
const SNAT_PORTS: std::ops::RangeInclusive<u16> = 40000..=40100;

fn sa(ip: Ipv6Addr, port: u16) -> SocketAddrV6 {
    SocketAddrV6::new(ip, port, 0, 0)
}

/// The datapath with one Service whose one endpoint is `POD6`, configured with `hairpin`
/// as the IPv6 hairpin address (unspecified: none).
fn loaded(tag: &str, hairpin: Ipv6Addr) -> LoadedDatapath {
    let mut dp = LoadedDatapath::load(tag).expect("load the eBPF object");
    dp.configure(&lb_common::NodeConfig {
        snat_port_min: *SNAT_PORTS.start(),
        snat_port_max: *SNAT_PORTS.end(),
        hairpin6_addr_be: bytemuck::cast(hairpin.octets()),
        ..Default::default()
    })
    .expect("config");
    let yaml = service6_yaml("self6", VIP6, 80, "TCP", 8080, &[POD6])
        + &service6_yaml("again6", VIP6B, 80, "TCP", 8080, &[POD6]);
    let loaded = lb_userspace::source::file::parse("hairpin6.yaml", &yaml).expect("yaml");
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    dp.program(&loaded.model).expect("program maps");
    dp
}

#[test]
fn a_pod_reaching_itself_over_ipv6_is_snated_to_the_hairpin_address() {
    if !require_root() {
        return;
    }
    let mut dp = loaded(&unique_tag("xlp6h"), HAIRPIN6);
    let pod = sa(POD6, 41000);
    let frontend = sa(VIP6, 80);
    let r = dp
        .run(&Frame6::tcp(pod, frontend, TCP_SYN, b"").build())
        .expect("run");
    assert_eq!(r.verdict, TC_ACT_OK, "{:?}", reason_counts(&dp.pins));
    let out = seen6(&r.packet, "hairpin SYN");
    assert_eq!(out.dst, sa(POD6, 8080), "DNAT to the pod itself");
    assert_eq!(
        out.src,
        sa(HAIRPIN6, 41000),
        "SNAT to the hairpin address, the client's port kept (its reply tuple is free)"
    );

    // The pod's answer to the hairpin address comes back from the ClusterIP.
    let reply = Frame6::tcp(out.dst, out.src, TCP_SYN | TCP_ACK, b"").build();
    let r = dp.run(&reply).expect("run");
    assert_eq!(r.verdict, TC_ACT_OK);
    let back = seen6(&r.packet, "hairpin reply");
    assert_eq!(
        (back.src, back.dst),
        (frontend, pod),
        "back from the ClusterIP"
    );

    // The flow keeps its translation; `xlb list` shows it SNATed to the hairpin address.
    let r = dp
        .run(&Frame6::tcp(pod, frontend, TCP_ACK, b"x").build())
        .expect("run");
    assert_eq!(seen6(&r.packet, "established").src, out.src);
    let flows = lb_userspace::list::conntrack(&xlb_tests::pins(&dp.pins)).expect("ct");
    let snat = format!("[{HAIRPIN6}]:{}", out.src.port());
    assert!(flows.iter().any(|f| f.snat == snat), "{flows:?}");

    // The same pod port to a second Service on itself: that reply tuple is taken, so the
    // port comes from the SNAT range.
    let r = dp
        .run(&Frame6::tcp(pod, sa(VIP6B, 80), TCP_SYN, b"").build())
        .expect("run");
    let again = seen6(&r.packet, "second hairpin flow");
    assert_eq!(*again.src.ip(), HAIRPIN6);
    assert!(SNAT_PORTS.contains(&again.src.port()), "{again:?}");

    // Another client of the Service keeps its own address.
    let other = sa(Ipv6Addr::new(0xfd00, 0x10, 0x244, 3, 0, 0, 0, 2), 41000);
    let r = dp
        .run(&Frame6::tcp(other, frontend, TCP_SYN, b"").build())
        .expect("run");
    assert_eq!(seen6(&r.packet, "other client").src, other);
}

#[test]
fn without_an_ipv6_hairpin_address_a_pod_reaching_itself_keeps_its_source() {
    if !require_root() {
        return;
    }
    let mut dp = loaded(&unique_tag("xlp6k"), Ipv6Addr::UNSPECIFIED);
    let pod = sa(POD6, 41000);
    let r = dp
        .run(&Frame6::tcp(pod, sa(VIP6, 80), TCP_SYN, b"").build())
        .expect("run");
    assert_eq!(r.verdict, TC_ACT_OK, "{:?}", reason_counts(&dp.pins));
    let out = seen6(&r.packet, "SYN");
    assert_eq!((out.src, out.dst), (pod, sa(POD6, 8080)));
}
