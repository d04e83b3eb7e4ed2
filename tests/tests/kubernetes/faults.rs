//! API server faults (down at start, errors, unavailable) never change a working datapath.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use xlb_tests::suites::kubernetes::{
    Cluster, FRONTEND, SERVICES, SLICES, WEB, launch, ready, service, serving, slice,
};
use xlb_tests::{apiserver::Fault, require_root, topology::pod_ip};

/// Requests for `path` that arrived after `since`: how many, the shortest gap between two,
/// and the longest time without one (up to now).
fn tries_since(c: &Cluster, path: &str, since: Instant) -> (usize, Duration, Duration) {
    let mut at: Vec<Instant> = vec![since];
    at.extend(
        c.api
            .served()
            .into_iter()
            .filter(|s| s.is_for(path) && s.at >= since)
            .map(|s| s.at),
    );
    let gaps: Vec<Duration> = at
        .windows(2)
        .skip(1)
        .map(|w| w[1].saturating_duration_since(w[0]))
        .collect();
    let silence = at
        .windows(2)
        .map(|w| w[1].saturating_duration_since(w[0]))
        .chain(at.last().map(|l| l.elapsed()))
        .max()
        .unwrap_or_default();
    let shortest = gaps.into_iter().min().unwrap_or(Duration::MAX);
    (at.len() - 1, shortest, silence)
}

/// How many failures of `what` ("Services", "EndpointSlices", "Node") the agent logged.
fn logged_failures(c: &Cluster, what: &str) -> usize {
    c.agent
        .log_text()
        .lines()
        .filter(|l| l.contains(&format!("watch of {what}:")))
        .count()
}

#[test]
fn the_agent_waits_for_an_api_server_down_at_start() {
    if !require_root() {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
    let mut c = launch(
        "xd",
        false,
        |api| {
            api.apply_yaml(&service("web", WEB, "")).expect("svc");
            api.apply_yaml(&slice("web", &ready(&b))).expect("slice");
            // Once up, the agent's RBAC lacks EndpointSlices for a while.
            api.inject("EndpointSlice", Fault::Forbidden);
        },
        &[],
    );
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    c.agent
        .wait_for(Duration::ZERO, |rows| rows.is_empty())
        .expect("the agent runs and programs nothing while the API server is down");
    c.api.up().expect("api server up");
    let up = Instant::now();
    c.wait_server("the Services list served", Duration::from_secs(40), |api| {
        api.served()
            .iter()
            .any(|s| s.is_for(SERVICES) && !s.is_watch() && s.status == 200)
    });
    eprintln!("first list {:?} after the API server came up", up.elapsed());
    std::thread::sleep(Duration::from_secs(10).saturating_sub(started.elapsed()));
    // 10 s of failures (refused, then 403): a doubling backoff from 0.8 s tries 3 to 5
    // times; one reset by every list attempt would try about 8 times.
    let failures = logged_failures(&c, "EndpointSlices");
    let forbidden = c.lists(SLICES).iter().filter(|s| s.status == 403).count();
    eprintln!("EndpointSlices: {failures} failures logged in 10 s, {forbidden} of them 403");
    assert!(
        (2..=5).contains(&failures) && forbidden >= 1,
        "{failures} EndpointSlice failures in 10 s ({forbidden} 403s): no backoff\n{}",
        c.agent.log_text()
    );
    assert!(
        lb_userspace::list::services(&xlb_tests::pins(&c.agent.pins))
            .expect("rows")
            .is_empty(),
        "Services were programmed without their EndpointSlices"
    );
    c.api.clear_fault("EndpointSlice");
    let cleared = Instant::now();
    c.agent
        .wait_for(Duration::from_secs(40), |rows| {
            rows.iter()
                .any(|r| r.frontend == FRONTEND && r.backends.len() == 3)
        })
        .expect("converged once the API server answers");
    eprintln!("programmed {:?} after the 403 ended", cleared.elapsed());
    c.request().expect("traffic");
}

/// Injects `fault` on EndpointSlices while web moves to `b` (a change only a relist brings),
/// checks for `window` that the datapath stays and the agent asks again with backoff, then
/// clears it and waits for the change.
fn through_fault(c: &mut Cluster, fault: Fault, b: &[Ipv4Addr], window: Duration) {
    let before = c.backends_of();
    c.api.inject("EndpointSlice", fault);
    let since = Instant::now();
    c.api.apply_unseen(&slice("web", &ready(b))).expect("slice");
    std::thread::sleep(window);
    assert_eq!(c.backends_of(), before, "{fault:?} changed the datapath");
    let (tries, gap, silence) = tries_since(c, SLICES, since);
    eprintln!(
        "{fault:?}: {tries} EndpointSlice requests in {window:?}, {gap:?} apart at least, {silence:?} at most"
    );
    assert!(tries >= 1, "{fault:?}: the agent stopped asking");
    assert!(
        tries <= 12,
        "{fault:?}: {tries} requests in {window:?} is no backoff"
    );
    match fault {
        Fault::Unavailable => assert!(
            silence < Duration::from_millis(2500),
            "503s: {silence:?} without asking again (a recovered server waits as long)"
        ),
        Fault::TooManyRequests { retry_after_secs } => assert!(
            gap >= Duration::from_secs(retry_after_secs.into()) - Duration::from_millis(100),
            "Retry-After {retry_after_secs} s not honoured: {gap:?}"
        ),
        _ => {}
    }
    c.api.clear_fault("EndpointSlice");
    let cleared = Instant::now();
    c.agent
        .wait_for(Duration::from_secs(40), |rows| {
            rows.iter()
                .any(|r| r.frontend == FRONTEND && r.backends.len() == b.len())
        })
        .unwrap_or_else(|e| panic!("never converged after {fault:?}: {e}"));
    eprintln!(
        "{fault:?}: converged {:?} after it ended",
        cleared.elapsed()
    );
}

#[test]
fn api_errors_never_change_a_working_datapath() {
    if !require_root() {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
    let (mut c, load) = serving("xf", &b);
    let window = Duration::from_millis(2500);
    through_fault(&mut c, Fault::Forbidden, &b[..2], window);
    let throttled = Fault::TooManyRequests {
        retry_after_secs: 1,
    };
    through_fault(&mut c, throttled, &b, window);
    through_fault(&mut c, Fault::InternalError, &b[..2], window);
    load.stop().expect_no_failures("403, 429 and 500");
}

#[test]
fn an_unavailable_or_down_api_server_never_changes_a_working_datapath() {
    if !require_root() {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
    let (mut c, load) = serving("xu", &b);
    // Long enough for 503s to show that the client's retries stay a few seconds apart.
    through_fault(&mut c, Fault::Unavailable, &b[..2], Duration::from_secs(8));

    // The API server down: nothing changes; up again: the change made meanwhile arrives.
    c.api.down().expect("down");
    c.api
        .apply_yaml(&slice("web", &ready(&b[..1])))
        .expect("slice");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        c.backends_of().len(),
        2,
        "the API server down changed the datapath"
    );
    c.api.up().expect("up");
    let up = Instant::now();
    c.agent
        .wait_for(Duration::from_secs(40), |rows| {
            rows.iter()
                .any(|r| r.frontend == FRONTEND && r.backends.len() == 1)
        })
        .expect("converged after the API server came back");
    eprintln!(
        "converged {:?} after the API server came back",
        up.elapsed()
    );
    load.stop()
        .expect_no_failures("503s and the API server down");
}
