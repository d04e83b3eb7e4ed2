//! A map size nobody asked for follows the pins: an agent started without
//! `--service-map-max` on a service map an earlier agent pinned at another size (an older
//! default) keeps that size, and its per-service arrays theirs, and serves; one that asks
//! for another size is refused, naming the map and both sizes.

use std::{net::Ipv4Addr, time::Duration};

use aya::maps::MapData;
use lb_common::MAP_SVC;
use xlb_tests::{
    require_root,
    scenario::{Scenario, TCP_PORT, sock},
    services::service_yaml,
    topology::pod_ip,
};

const WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 11);

fn entries(pins: &std::path::Path, name: &str) -> u32 {
    MapData::from_pin(pins.join(name))
        .and_then(|m| m.info())
        .unwrap_or_else(|e| panic!("the pinned {name}: {e}"))
        .max_entries()
}

#[test]
fn a_service_map_pinned_at_another_size_is_kept_unless_a_flag_asks_and_then_refused() {
    if !require_root() {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=3).map(pod_ip).collect();
    let yaml = service_yaml("web", WEB, 80, "TCP", TCP_PORT, &b);
    // An earlier agent's sizes: 4× today's default service map.
    let old = (4 * lb_common::SVC_MAP_CAPACITY).to_string();
    let mut s =
        Scenario::start_with("xz", 2, &yaml, &["--service-map-max", &old]).expect("scenario");
    s.wait_backends("10.96.0.11:80/TCP", 2, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("web programmed: {e}\n{}", s.agent.log_text()));
    let pins = s.agent.pins.clone();
    let stats = entries(&pins, lb_common::MAP_SVC_STATS);
    let file = format!("file:{}", s.yaml.display());
    let flags = |extra: &[&str]| -> Vec<String> {
        ["--source", &file, "--pod-interfaces", "xv-*"]
            .iter()
            .chain(extra)
            .map(|a| a.to_string())
            .collect()
    };
    // No size asked for: the pinned ones stay, and the agent serves.
    let args = flags(&[]);
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
    s.wait_backends("10.96.0.11:80/TCP", 2, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("web programmed again: {e}\n{}", s.agent.log_text()));
    assert_eq!(entries(&pins, MAP_SVC).to_string(), old, "service map kept");
    assert_eq!(
        entries(&pins, lb_common::MAP_SVC_STATS),
        stats,
        "counters kept"
    );
    let answers = s
        .ask_tcp(sock(WEB, 80), 10)
        .unwrap_or_else(|e| panic!("web answers: {e}"));
    assert!(
        answers.iter().all(|a| a.starts_with("backend-")),
        "{answers:?}"
    );
    // Another size asked for: refused, the map and both sizes named, nothing changed.
    let asked = lb_common::SVC_MAP_CAPACITY.to_string();
    let args = flags(&["--service-map-max", &asked]);
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
