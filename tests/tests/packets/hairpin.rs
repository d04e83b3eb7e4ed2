//! Hairpin in both families through BPF_PROG_TEST_RUN on the loaded tc program: a pod
//! reaching itself through its own Service is SNATed to the family's hairpin address (it
//! would take a packet from its own address for one it sent itself), and its reply to that
//! address comes back from the ClusterIP. Without a hairpin address the source is kept.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use lb_userspace::{model::IpFamily, packet::TCP_SYN};
use xlb_tests::{
    datapath::LoadedDatapath,
    require_root,
    services::{service_yaml, service6_yaml},
    suites::packets::{FAMILIES, Family, frame},
    unique_tag,
};

const SNAT_PORTS: std::ops::RangeInclusive<u16> = 40000..=40100;

/// One family's hairpin table: the Service, a second one on the same endpoint, the pod
/// (that endpoint), another pod, the hairpin address.
struct Hairpin {
    vip: IpAddr,
    vip_b: IpAddr,
    pod: IpAddr,
    other: IpAddr,
    hairpin: IpAddr,
}

fn table(f: &Family) -> Hairpin {
    match f.family {
        IpFamily::V4 => Hairpin {
            vip: Ipv4Addr::new(10, 96, 0, 40).into(),
            vip_b: Ipv4Addr::new(10, 96, 0, 41).into(),
            pod: Ipv4Addr::new(10, 244, 2, 2).into(),
            other: Ipv4Addr::new(10, 244, 3, 2).into(),
            hairpin: Ipv4Addr::new(169, 254, 42, 1).into(),
        },
        IpFamily::V6 => Hairpin {
            vip: Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x40).into(),
            vip_b: Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x41).into(),
            pod: Ipv6Addr::new(0xfd00, 0x10, 0x244, 2, 0, 0, 0, 2).into(),
            other: Ipv6Addr::new(0xfd00, 0x10, 0x244, 3, 0, 0, 0, 2).into(),
            hairpin: Ipv6Addr::new(0xfd00, 0xa9fe, 0x2a, 0, 0, 0, 0, 1).into(),
        },
    }
}

/// The datapath with `self` and `again` on the one endpoint `t.pod`, with `hairpin` (or
/// none) as the family's hairpin address.
fn loaded(tag: &str, t: &Hairpin, hairpin: Option<IpAddr>) -> LoadedDatapath {
    let mut dp = LoadedDatapath::load(tag).expect("load the eBPF object");
    let mut cfg = lb_common::NodeConfig {
        snat_port_min: *SNAT_PORTS.start(),
        snat_port_max: *SNAT_PORTS.end(),
        ..Default::default()
    };
    match hairpin {
        Some(IpAddr::V4(a)) => cfg.hairpin_addr_be = u32::from_ne_bytes(a.octets()),
        Some(IpAddr::V6(a)) => cfg.hairpin6_addr_be = bytemuck::cast(a.octets()),
        None => {}
    }
    dp.configure(&cfg).expect("config");
    let yaml = match (t.vip, t.vip_b, t.pod) {
        (IpAddr::V4(v), IpAddr::V4(b), IpAddr::V4(p)) => {
            service_yaml("self", v, 80, "TCP", 8080, &[p])
                + &service_yaml("again", b, 80, "TCP", 8080, &[p])
        }
        (IpAddr::V6(v), IpAddr::V6(b), IpAddr::V6(p)) => {
            service6_yaml("self", v, 80, "TCP", 8080, &[p])
                + &service6_yaml("again", b, 80, "TCP", 8080, &[p])
        }
        _ => panic!("one family"),
    };
    let loaded = lb_userspace::source::file::parse("hairpin.yaml", &yaml).expect("yaml");
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    dp.program(&loaded.model).expect("program maps");
    dp
}

#[test]
fn a_pod_reaching_itself_is_snated_to_the_hairpin_address() {
    if !require_root() {
        return;
    }
    for f in FAMILIES {
        let t = table(&f);
        let tag = unique_tag(&format!("xlph{}", f.name().to_ascii_lowercase()));
        let mut dp = loaded(&tag, &t, Some(t.hairpin));
        reaches_itself(&f, &t, &mut dp);
    }
}

fn reaches_itself(f: &Family, t: &Hairpin, dp: &mut LoadedDatapath) {
    let pod = SocketAddr::new(t.pod, 41000);
    let frontend = SocketAddr::new(t.vip, 80);
    // DNAT to the pod itself; SNAT to the hairpin address, the client's port kept (its
    // reply tuple is free); the pod's answer to the hairpin address back from the
    // ClusterIP; `xlb list` shows the flow SNATed.
    let src = f.snated_flow(dp, pod, frontend, SocketAddr::new(t.pod, 8080));
    assert_eq!(
        src,
        SocketAddr::new(t.hairpin, 41000),
        "{}",
        f.row("SNAT to the hairpin address, the port kept")
    );

    // The same pod port to a second Service on itself: that reply tuple is taken, so the
    // port comes from the SNAT range.
    let what = f.row("second hairpin flow");
    let syn = frame(false, pod, SocketAddr::new(t.vip_b, 80), TCP_SYN, b"");
    let again = f.through(dp, &syn, &what);
    assert_eq!(again.src.ip(), t.hairpin, "{what}");
    assert!(SNAT_PORTS.contains(&again.src.port()), "{what}: {again:?}");

    // Another client of the Service keeps its own address.
    let what = f.row("another client");
    let other = SocketAddr::new(t.other, 41000);
    let syn = frame(false, other, frontend, TCP_SYN, b"");
    assert_eq!(f.through(dp, &syn, &what).src, other, "{what}");
}

#[test]
fn without_a_hairpin_address_a_pod_reaching_itself_keeps_its_source() {
    if !require_root() {
        return;
    }
    for f in FAMILIES {
        let t = table(&f);
        let tag = unique_tag(&format!("xlpk{}", f.name().to_ascii_lowercase()));
        let mut dp = loaded(&tag, &t, None);
        let pod = SocketAddr::new(t.pod, 41000);
        let what = f.row("SYN");
        let syn = frame(false, pod, SocketAddr::new(t.vip, 80), TCP_SYN, b"");
        let out = f.through(&mut dp, &syn, &what);
        assert_eq!(
            (out.src, out.dst),
            (pod, SocketAddr::new(t.pod, 8080)),
            "{what}"
        );
    }
}
