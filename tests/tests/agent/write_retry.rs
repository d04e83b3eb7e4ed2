//! Failed writes retry per service: a service map that is full (sized small with
//! `--service-map-max`, the rest taken by entries another writer left) refuses a new
//! Service's writes. That Service is reported by name with the map and its limit, and
//! retried with backoff; a change to another Service meanwhile applies incrementally (no
//! full sync), and once the map has room the retry programs the first one. Its status
//! (failing, then programmed) is logged once each and shows in `xlb list services`.

use std::{
    net::Ipv4Addr,
    path::Path,
    time::{Duration, Instant},
};

use aya::maps::{HashMap, Map, MapData};
use lb_common::{MAP_SVC, SvcKey, SvcValue};
use xlb_tests::{
    client::tcp_request,
    datapath::foreign_frontend,
    require_root,
    scenario::{Scenario, TCP_PORT, sock},
    services::{service_yaml, write_atomic},
    topology::pod_ip,
};

const WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const API: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 11);
/// The service map's size: web's entry and room for the fillers.
const SVC_MAP: u32 = 16;

fn svc_map(pins: &Path) -> HashMap<MapData, SvcKey, SvcValue> {
    let data = MapData::from_pin(pins.join(MAP_SVC)).expect("the pinned service map");
    HashMap::try_from(Map::HashMap(data)).expect("a hash map")
}

/// Entries of frontends no Service has (203.0.113.1, ports from 1, without backends: no
/// test traffic goes there), inserted until the map is full; how many.
fn fill(pins: &Path) -> u16 {
    let mut map = svc_map(pins);
    for port in 1..=SVC_MAP as u16 + 1 {
        if map
            .insert(foreign_frontend(port), SvcValue::default(), 0)
            .is_err()
        {
            return port - 1;
        }
    }
    panic!("the service map never filled up");
}

/// Removes the fillers.
fn unfill(pins: &Path) {
    let mut map = svc_map(pins);
    let fillers: Vec<SvcKey> = map
        .keys()
        .filter_map(Result::ok)
        .filter(|k| k.addr_be[0] == u32::from_ne_bytes([203, 0, 113, 1]))
        .collect();
    for k in fillers {
        map.remove(&k).expect("remove a filler");
    }
}

/// The agent's "synced" lines.
fn syncs(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains(" synced services="))
        .collect()
}

#[test]
fn a_service_a_full_map_refuses_is_retried_while_the_others_sync_incrementally() {
    if !require_root() {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
    let web = |backends: &[Ipv4Addr]| service_yaml("web", WEB, 80, "TCP", TCP_PORT, backends);
    let api = service_yaml("api", API, 80, "TCP", TCP_PORT, &b);
    let size = SVC_MAP.to_string();
    let mut s =
        Scenario::start_with("xw", 3, &web(&b), &["--service-map-max", &size]).expect("scenario");
    s.wait_backends("10.96.0.10:80/TCP", 3, Duration::from_secs(10))
        .expect("web programmed");
    let fillers = fill(&s.agent.pins);
    eprintln!("{fillers} filler entries fill the service map of {SVC_MAP}");

    // api needs an entry: none is free.
    write_atomic(&s.yaml, &(web(&b) + &api)).expect("yaml");
    s.agent
        .wait_log("service=test/api:p", 2, Duration::from_secs(5))
        .expect("api reported, then retried");
    let log = s.agent.log_text();
    let reports: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("not programmed") && l.contains("service=test/api:p"))
        .collect();
    assert!(
        reports.iter().all(|l| l.contains(&format!("map {MAP_SVC}"))
            && l.contains(&format!("map is full (capacity {SVC_MAP})"))),
        "api is named with the map and its limit: {reports:#?}"
    );
    assert!(
        reports[0].contains("tries=1") && reports[1].contains("tries=2"),
        "{reports:#?}"
    );
    // Its status, told once (no API server here: the log and `xlb list services`).
    assert_eq!(
        log.matches("frontend failing").count(),
        1,
        "told once, not at every try:\n{log}"
    );
    let rows = lb_userspace::list::services(&xlb_tests::pins(&s.agent.pins)).expect("rows");
    assert!(
        rows.iter().any(|r| r.service == "test/api:p"
            && r.frontend == "-"
            && r.status.starts_with("WriteFailed since ")),
        "{rows:#?}"
    );

    // web loses a backend meanwhile: applied at once, incrementally, api still failing.
    let syncs_before = syncs(&log).len();
    write_atomic(&s.yaml, &(web(&b[..2]) + &api)).expect("yaml");
    let took = s
        .wait_backends("10.96.0.10:80/TCP", 2, Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("web's change: {e}\n{}", s.agent.log_text()));
    eprintln!("web's change applied in {took:?} while api fails");
    let answers = s.ask_tcp(sock(WEB, 80), 10).expect("web answers");
    assert!(
        answers.iter().all(|a| a != "backend-3"),
        "the removed backend got traffic: {answers:?}"
    );
    let log = s.agent.log_text();
    let all = syncs(&log);
    assert!(
        all[1..].iter().all(|l| l.contains("full=false")),
        "only the first sync is a full one: {all:#?}"
    );
    assert!(
        all[syncs_before..].iter().any(|l| l.contains("changed=1")),
        "web's change is a sync of its own: {all:#?}"
    );
    assert!(
        !lb_userspace::list::services(&xlb_tests::pins(&s.agent.pins))
            .expect("rows")
            .iter()
            .any(|r| r.frontend == "10.96.0.11:80/TCP"),
        "api cannot be programmed yet"
    );

    // Room again: api's next retry (the backoff is a few seconds by now) programs it.
    unfill(&s.agent.pins);
    let freed = Instant::now();
    s.wait_backends("10.96.0.11:80/TCP", 3, Duration::from_secs(35))
        .unwrap_or_else(|e| panic!("api after the map has room: {e}\n{}", s.agent.log_text()));
    eprintln!(
        "api programmed {:?} after the map had room",
        freed.elapsed()
    );
    s.agent
        .wait_log("programmed after failed writes", 1, Duration::from_secs(2))
        .expect("its recovery is logged");
    s.agent
        .wait_log(
            "frontend programmed after failing",
            1,
            Duration::from_secs(2),
        )
        .expect("its status's recovery is logged");
    let rows = lb_userspace::list::services(&xlb_tests::pins(&s.agent.pins)).expect("rows");
    assert!(rows.iter().all(|r| r.status == "programmed"), "{rows:#?}");
    s.topo
        .client
        .ns
        .run(|| tcp_request(sock(API, 80), Duration::from_secs(2)))
        .expect("client")
        .expect("api answers");
}
