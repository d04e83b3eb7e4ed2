//! Helpers shared by the `traffic` test files.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use crate::{
    client::{Answer, tcp_request, udp_request},
    require_root,
    scenario::{Scenario, TCP_PORT, UDP_PORT, sock},
    services::service_yaml,
    topology::pod_ip,
};

pub const WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
pub const DNS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 53);
pub const TIMEOUT: Duration = Duration::from_secs(2);

pub fn backends(n: u8) -> Vec<Ipv4Addr> {
    (1..=n).map(|k| pod_ip(k + 1)).collect()
}

pub fn yaml(web: &[Ipv4Addr], dns: &[Ipv4Addr]) -> String {
    service_yaml("web", WEB, 80, "TCP", TCP_PORT, web)
        + &service_yaml("dns", DNS, 53, "UDP", UDP_PORT, dns)
}

pub fn spread(answers: &[Answer]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for a in answers {
        *m.entry(a.backend.clone()).or_insert(0) += 1;
    }
    m
}

/// The usual start: the root check, `n` backend pods behind the web and dns services, and the
/// agent synced on web. `None` (after a loud notice) where the test cannot run.
pub fn synced(prefix: &str, n: u8) -> Option<Scenario> {
    if !require_root() {
        return None;
    }
    let all = backends(n);
    let mut s = Scenario::start(prefix, n.into(), &yaml(&all, &all)).expect("scenario");
    s.wait_backends("10.96.0.10:80/TCP", n.into(), Duration::from_secs(30))
        .expect("initial sync");
    Some(s)
}

/// A request's start time and result.
pub type Timed = (Instant, Result<Answer, String>);

/// Requests in a loop from the client pod until stopped; returns every result with its time.
pub fn traffic(
    s: &Scenario,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<Vec<Timed>, String>> {
    s.topo.client.ns.spawn(move || {
        let mut out = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            out.push((Instant::now(), tcp_request(sock(WEB, 80), TIMEOUT)));
            out.push((Instant::now(), udp_request(sock(DNS, 53), TIMEOUT)));
        }
        out
    })
}
