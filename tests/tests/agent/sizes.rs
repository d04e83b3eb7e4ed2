//! Map sizes. The address filters are sized from the map capacities (four bits per address
//! the maps can hold): an agent with a larger backend map gets larger filters, the programs
//! read them at that size, and a service's flows and their replies still pass both. A size
//! nobody asked for follows the pins: a filter pinned at another size keeps it; an agent
//! started without `--service-map-max` on a service map an earlier agent pinned at another
//! size (an older default) keeps that size, and its per-service arrays theirs, and serves;
//! one that asks for another size is refused, naming the map and both sizes.

use std::{net::Ipv4Addr, path::Path, time::Duration};

use aya::maps::MapData;
use lb_common::{FilterSize, MAP_ADDR_FILTER, MAP_SVC, MAP_SVC_STATS};
use xlb_tests::{
    require_root,
    scenario::{Scenario, TCP_PORT, sock},
    services::service_yaml,
    topology::pod_ip,
};

const WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);

/// An agent (`extra` flags) serving web on two backends, programmed.
fn web(prefix: &str, extra: &[&str]) -> Scenario {
    let b: Vec<Ipv4Addr> = (2..=3).map(pod_ip).collect();
    let yaml = service_yaml("web", WEB, 80, "TCP", TCP_PORT, &b);
    let mut s = Scenario::start_with(prefix, 2, &yaml, extra).expect("scenario");
    s.wait_backends("10.96.0.10:80/TCP", 2, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("web programmed: {e}\n{}", s.agent.log_text()));
    s
}

/// The agent's flags for web's file and the lab's pods, and `extra`.
fn flags(s: &Scenario, extra: &[&str]) -> Vec<String> {
    let file = format!("file:{}", s.yaml.display());
    ["--source", &file, "--pod-interfaces", "xv-*"]
        .iter()
        .chain(extra)
        .map(|a| a.to_string())
        .collect()
}

/// The max entries of map `name` pinned under `pins`.
fn entries(pins: &Path, name: &str) -> u32 {
    MapData::from_pin(pins.join(name))
        .and_then(|m| m.info())
        .unwrap_or_else(|e| panic!("the pinned {name}: {e}"))
        .max_entries()
}

/// Ten requests to web, each answered by a backend: a new flow to the frontend (its filter
/// bit), the backend's reply (the backend filter's bit) and each next packet.
fn answered(s: &mut Scenario) {
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
fn filters_sized_for_a_larger_backend_map_pass_service_flows_and_their_replies() {
    if !require_root() {
        return;
    }
    // 2^20 backends: the backends' filter of 2^22 bits, the frontends' at the default 2^20
    // (the default service capacity): two filters of two sizes, their bits numbered apart.
    let mut s = web("xf", &["--backend-map-max", "1048576"]);
    assert_eq!(
        entries(&s.agent.pins, MAP_ADDR_FILTER),
        FilterSize::split(20, 22).entries(),
        "the backends' filter is sized for 2^20 backends, the frontends' for the services"
    );
    answered(&mut s);
}

#[test]
fn a_filter_pinned_at_another_size_keeps_it_and_still_passes_service_flows() {
    if !require_root() {
        return;
    }
    let mut s = web("xg", &[]);
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
    let args = flags(&s, &["--backend-map-max", "1048576"]);
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
    assert_eq!(
        entries(&pins, MAP_ADDR_FILTER),
        FilterSize::DEFAULT.entries(),
        "kept at its size"
    );
    answered(&mut s);
}

#[test]
fn a_service_map_pinned_at_another_size_is_kept_unless_a_flag_asks_and_then_refused() {
    if !require_root() {
        return;
    }
    // An earlier agent's sizes: 4× today's default service map.
    let old = (4 * lb_common::SVC_MAP_CAPACITY).to_string();
    let mut s = web("xz", &["--service-map-max", &old]);
    let pins = s.agent.pins.clone();
    let stats = entries(&pins, MAP_SVC_STATS);
    // No size asked for: the pinned ones stay, and the agent serves.
    let args = flags(&s, &[]);
    s.agent
        .restart_with(&args, s.workdir.join("agent2.log"))
        .expect("restart");
    // This agent's own first sync (the pins still serve whether or not it runs).
    s.agent
        .wait_log(" synced ", 1, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("the agent runs on the pinned sizes: {e}"));
    s.agent
        .wait_log("keep their sizes", 1, Duration::from_secs(1))
        .expect("said so");
    assert_eq!(entries(&pins, MAP_SVC).to_string(), old, "service map kept");
    assert_eq!(entries(&pins, MAP_SVC_STATS), stats, "counters kept");
    answered(&mut s);
    // Another size asked for: refused, the map and both sizes named, nothing changed.
    let asked = lb_common::SVC_MAP_CAPACITY.to_string();
    let args = flags(&s, &["--service-map-max", &asked]);
    s.agent
        .restart_with(&args, s.workdir.join("agent3.log"))
        .expect("restart");
    let said = format!("map {MAP_SVC} pinned in");
    s.agent
        .wait_log(&said, 1, Duration::from_secs(10))
        .expect("refused, naming the map");
    let log = s.agent.log_text();
    assert!(
        log.contains(&format!("holds {old} entries, {asked} were asked for")),
        "{log}"
    );
    assert_eq!(entries(&pins, MAP_SVC).to_string(), old, "still its size");
}
