//! The address filters are sized from the map capacities (four bits per address the maps
//! can hold): an agent with a larger backend map gets larger filters, the programs read
//! them at that size, and a service's flows and their replies still pass both.

use std::{net::Ipv4Addr, time::Duration};

use aya::maps::MapData;
use lb_common::{FilterSize, MAP_ADDR_FILTER};
use xlb_tests::{
    require_root,
    scenario::{Scenario, TCP_PORT, sock},
    services::service_yaml,
    topology::pod_ip,
};

const WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);

#[test]
fn filters_sized_for_a_larger_backend_map_pass_service_flows_and_their_replies() {
    if !require_root() {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=3).map(pod_ip).collect();
    let yaml = service_yaml("web", WEB, 80, "TCP", TCP_PORT, &b);
    // 2^20 backends: filters of 2^22 bits (the default capacities keep 2^20).
    let mut s =
        Scenario::start_with("xf", 2, &yaml, &["--backend-map-max", "1048576"]).expect("scenario");
    s.wait_backends("10.96.0.10:80/TCP", 2, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("web programmed: {e}\n{}", s.agent.log_text()));
    let entries = MapData::from_pin(s.agent.pins.join(MAP_ADDR_FILTER))
        .and_then(|m| m.info())
        .expect("the pinned filter map")
        .max_entries();
    assert_eq!(
        entries,
        FilterSize::from_log2(22).entries(),
        "the filter map is sized for 2^20 backends"
    );
    // A new flow to the frontend (its filter bit), the backend's reply (the backend filter's
    // bit) and each next packet: ten requests, each answered by a backend.
    let answers = s
        .ask_tcp(sock(WEB, 80), 10)
        .unwrap_or_else(|e| panic!("web answers: {e}"));
    assert_eq!(answers.len(), 10);
    assert!(
        answers.iter().all(|a| a.starts_with("backend-")),
        "{answers:?}"
    );
}

#[test]
fn a_filter_pinned_at_another_size_keeps_it_and_still_passes_service_flows() {
    if !require_root() {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=3).map(pod_ip).collect();
    let yaml = service_yaml("web", WEB, 80, "TCP", TCP_PORT, &b);
    let mut s = Scenario::start("xg", 2, &yaml).expect("scenario");
    s.wait_backends("10.96.0.10:80/TCP", 2, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("web programmed: {e}\n{}", s.agent.log_text()));
    // As an earlier build left it: only the filters pinned (at the one size it had), every
    // other map and link gone, then an agent whose capacities ask for larger filters.
    s.agent.stop();
    let pins = s.agent.pins.clone();
    let _ = std::fs::remove_dir_all(pins.join("links"));
    for name in lb_common::ALL_MAPS
        .iter()
        .filter(|n| **n != MAP_ADDR_FILTER)
    {
        let _ = std::fs::remove_file(pins.join(name));
    }
    let args: Vec<String> = [
        "--source",
        &format!("file:{}", s.yaml.display()),
        "--pod-interfaces",
        "xv-*",
        "--backend-map-max",
        "1048576",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    s.agent
        .restart_with(&args, s.workdir.join("agent2.log"))
        .expect("restart");
    s.wait_backends("10.96.0.10:80/TCP", 2, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("web programmed again: {e}\n{}", s.agent.log_text()));
    s.agent
        .wait_log(
            "pinned address filters keep their size",
            1,
            Duration::from_secs(1),
        )
        .expect("said so");
    let entries = MapData::from_pin(pins.join(MAP_ADDR_FILTER))
        .and_then(|m| m.info())
        .expect("the pinned filter map")
        .max_entries();
    assert_eq!(entries, FilterSize::DEFAULT.entries(), "kept at its size");
    let answers = s
        .ask_tcp(sock(WEB, 80), 10)
        .unwrap_or_else(|e| panic!("web answers: {e}"));
    assert!(
        answers.iter().all(|a| a.starts_with("backend-")),
        "{answers:?}"
    );
}
