//! Helpers shared by the `packets` test files.

use std::net::{Ipv4Addr, SocketAddrV4};

use crate::{datapath::LoadedDatapath, require_root, services::service_yaml, unique_tag};
use lb_userspace::source::file;

pub const TC_ACT_OK: u32 = 0;
pub const TC_ACT_SHOT: u32 = 2;
pub const TC_ACT_REDIRECT: u32 = 7;

pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
pub const EMPTY_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 99);
pub const CLIENT: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 244, 1, 2), 40000);
pub const BACKENDS: [Ipv4Addr; 3] = [
    Ipv4Addr::new(10, 244, 2, 2),
    Ipv4Addr::new(10, 244, 3, 2),
    Ipv4Addr::new(10, 244, 4, 2),
];

pub fn setup() -> Option<LoadedDatapath> {
    if !require_root() {
        return None;
    }
    let mut dp = LoadedDatapath::load(&unique_tag("xlbp")).expect("load the eBPF object");
    let loaded = file::parse("packets.yaml", &base_services()).expect("yaml");
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    dp.program(&loaded.model).expect("program maps");
    Some(dp)
}

/// The table's services: web (VIP:80/TCP) and dns (VIP:53/UDP) on three backends, empty
/// (EMPTY_VIP:80/TCP) on none.
pub fn base_services() -> String {
    service_yaml("web", VIP, 80, "TCP", 8080, &BACKENDS)
        + &service_yaml("dns", VIP, 53, "UDP", 5353, &BACKENDS)
        + &service_yaml("empty", EMPTY_VIP, 80, "TCP", 8080, &[])
}
