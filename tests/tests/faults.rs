//! Faults: a second agent on the same pins, interfaces that are re-created, an agent killed
//! in the middle of a sync, `ip netns exec` hiding bpffs, and user errors.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use xlb_tests::{
    client::tcp_request,
    require_root,
    scenario::{Scenario, TCP_PORT, sock},
    services::{service_yaml, write_atomic},
    topology::pod_ip,
};

const WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);

fn web(backends: &[Ipv4Addr]) -> String {
    service_yaml("web", WEB, 80, "TCP", TCP_PORT, backends)
}

fn started(prefix: &str, yaml: &str, backends: usize) -> Option<Scenario> {
    Scenario::started(prefix, yaml, backends, "10.96.0.10:80/TCP")
}

#[test]
fn a_second_agent_on_the_same_pins_refuses() {
    let Some(s) = started("xfl", &web(&[pod_ip(2)]), 1) else {
        return;
    };
    let args = vec![
        "--source".to_string(),
        format!("file:{}", s.yaml.display()),
        "--pod-interfaces".into(),
        "xv-*".into(),
        "--healthz-bind-address".into(),
        "".into(),
        "--metrics-bind-address".into(),
        "".into(),
    ];
    let mut second = xlb_tests::agent::Agent::start_with(
        &s.topo.node,
        &args,
        s.agent.pins.clone(),
        s.workdir.join("second.log"),
    )
    .expect("spawn");
    let err = second
        .wait_for(Duration::from_secs(5), |_| false)
        .expect_err("the second agent must exit");
    assert!(
        err.contains("in use by another xlb agent"),
        "unclear refusal: {err}"
    );
    // Its handle must not clean up the first agent's pins.
    second.pins = s.workdir.join("no-such-pins");
    drop(second);
    let r = s
        .topo
        .client
        .ns
        .run(|| tcp_request(sock(WEB, 80), Duration::from_secs(2)))
        .expect("client");
    assert!(r.is_ok(), "the first agent still serves: {r:?}");
}

#[test]
fn a_recreated_pod_interface_is_attached_again_within_100_ms() {
    let Some(s) = started("xfr", &web(&[pod_ip(2)]), 1) else {
        return;
    };
    let pod = &s.topo.backends[0];
    let what = format!("attached tc ingress (TCX, pinned) iface={}", pod.host_if);
    s.agent
        .wait_log(&what, 1, Duration::from_secs(5))
        .expect("first attach");
    let mut took = Vec::new();
    for round in 2..=4 {
        pod.recreate_veth(&s.topo.node).expect("recreate");
        took.push(
            s.agent
                .wait_log(&what, round, Duration::from_secs(5))
                .expect("re-attached"),
        );
    }
    for t in &took {
        assert!(*t < Duration::from_millis(100), "re-attach took {took:?}");
    }
    // And the datapath works through the new interface: the backend behind it answers.
    let r = s
        .topo
        .client
        .ns
        .run(|| tcp_request(sock(WEB, 80), Duration::from_secs(2)))
        .expect("client");
    assert!(r.is_ok(), "{r:?}\n{}", s.agent.log_text());
}

#[test]
fn a_service_without_an_endpoint_slice_is_not_a_sync_error() {
    let Some(s) = started("xfe", &web(&[pod_ip(2)]), 1) else {
        return;
    };
    let lonely = "---\napiVersion: v1\nkind: Service\nmetadata: {namespace: test, name: lonely}\nspec:\n  clusterIP: 10.96.0.99\n  ports: [{name: p, port: 80, protocol: TCP}]\n";
    write_atomic(&s.yaml, &(web(&[pod_ip(2)]) + lonely)).expect("write");
    s.agent
        .wait_log("services=2", 1, Duration::from_secs(5))
        .expect("synced");
    let line = s
        .agent
        .log_text()
        .lines()
        .find(|l| l.contains("synced") && l.contains("services=2"))
        .map(str::to_string)
        .expect("sync line");
    assert!(line.contains("errors=0"), "{line}");
}

#[test]
fn user_errors_are_one_line_without_a_backtrace() {
    if !require_root() {
        return;
    }
    let out = std::process::Command::new(xlb_tests::xlb_bin())
        .args([
            "agent",
            "--source",
            "file:/nonexistent/services.yaml",
            "--bpffs",
        ])
        .arg("/nonexistent-bpffs/xlb")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run xlb");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("xlb: error: "), "{err}");
    assert!(
        !err.contains("backtrace") && !err.contains("Stack") && err.lines().count() <= 3,
        "a user error must be short:\n{err}"
    );
}

#[test]
fn the_agent_mounts_bpffs_itself_under_ip_netns_exec() {
    if !require_root() {
        return;
    }
    let tag = xlb_tests::unique_tag("xfm");
    let ns = xlb_tests::netns::Netns::new(&format!("{tag}-node")).expect("netns");
    let dir = std::env::temp_dir().join(&tag);
    std::fs::create_dir_all(&dir).expect("workdir");
    let yaml = dir.join("services.yaml");
    write_atomic(&yaml, &web(&[pod_ip(2)])).expect("yaml");
    // `ip netns exec` remounts /sys (hiding /sys/fs/bpf and the cgroup mounts): the agent
    // must mount bpffs itself. Its pins live in that mount namespace and go with it.
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(xlb_tests::xlb_bin())
        .args(["agent", "--socket-lb", "off", "--source"])
        .arg(format!("file:{}", yaml.display()))
        .args([
            "--healthz-bind-address",
            "",
            "--metrics-bind-address",
            "",
            "--bpffs",
        ])
        .arg(format!("/sys/fs/bpf/{tag}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let stderr = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        use std::io::BufRead as _;
        let mut seen = String::new();
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            seen.push_str(&line);
            seen.push('\n');
            if line.contains("synced") {
                break;
            }
        }
        seen
    });
    // Generous: loading is the verifier's pass over every program, seconds when loaded.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !reader.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    let seen = reader.join().expect("reader");
    let _ = std::fs::remove_dir_all(&dir);
    // The pins went with the mount namespace; the names file beside them is on the host's
    // /run (an agent keeps it when it stops: `xlb cleanup` would remove it with the pins).
    let pins = std::path::PathBuf::from(format!("/sys/fs/bpf/{tag}"));
    let _ = std::fs::remove_file(lb_userspace::datapath::names_file::path(&pins));
    assert!(seen.contains("mounted one"), "{seen}");
    assert!(seen.contains("synced"), "{seen}");
}

/// Whether the web frontend's entry is in the pinned service map and its first slot names
/// a backend.
fn web_programmed(pins: &std::path::Path) -> bool {
    use aya::maps::{Array, HashMap, MapData};
    use lb_common::{MAP_SLOT, MAP_SVC, SvcKey, SvcValue};
    let pins = xlb_tests::pins(pins);
    let (Ok(map), Ok(slots)) = (pins.map(MAP_SVC), pins.map(MAP_SLOT)) else {
        return false;
    };
    let (Ok(svc), Ok(slots)) = (
        HashMap::<MapData, SvcKey, SvcValue>::try_from(map),
        Array::<MapData, u32>::try_from(slots),
    ) else {
        return false;
    };
    let key = lb_common::user::frontend_key(WEB, 80, lb_userspace::model::Protocol::Tcp);
    svc.get(&key, 0)
        .is_ok_and(|v| v.count == 1 && slots.get(&v.slot_base, 0).is_ok_and(|id| id != 0))
}

/// Fillers in the mid-sync kill test, and endpoints per filler: enough slots that writing
/// them (batched) takes a while.
const FILLERS: u32 = 8_000;
const FILLER_ENDPOINTS: u32 = 4;

/// `base` and FILLERS services of FILLER_ENDPOINTS endpoints each.
fn with_fillers(base: String) -> String {
    let mut big = base;
    for i in 0..FILLERS {
        let vip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 100, 0, 0)) + i);
        let eps: Vec<Ipv4Addr> = (0..FILLER_ENDPOINTS)
            .map(|k| {
                Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 250, 0, 0)) + i * FILLER_ENDPOINTS + k)
            })
            .collect();
        big.push_str(&service_yaml(
            &format!("f{i}"),
            vip,
            80,
            "TCP",
            TCP_PORT,
            &eps,
        ));
    }
    big
}

/// Watches the working service's entries in `pins` until the flag is set: (looks, looks
/// that found it missing).
fn watch_web(
    pins: std::path::PathBuf,
) -> (
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<(u64, u64)>,
) {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let watcher = std::thread::spawn(move || {
        let (mut checks, mut missing) = (0u64, 0u64);
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            checks += 1;
            if !web_programmed(&pins) {
                missing += 1;
            }
            // A look every half millisecond: thousands over the test, and a core left to
            // the agent on a two-core CI machine.
            std::thread::sleep(Duration::from_micros(500));
        }
        (checks, missing)
    });
    (stop, watcher)
}

/// Freezes the agent (SIGSTOP) once some of the fillers are written (slots of the slot
/// array past web's, which is the first range: slots go in before any entry names them),
/// then SIGKILLs it: (how many frontends it had programmed, when it was killed). Frozen,
/// the count is exact: the kill lands where the count says.
fn kill_mid_sync(s: &mut Scenario) -> (usize, Instant) {
    use aya::maps::{Array, MapData};
    let slot_array = || {
        xlb_tests::pins(&s.agent.pins)
            .map(lb_common::MAP_SLOT)
            .ok()
            .and_then(|m| Array::<MapData, u32>::try_from(m).ok())
    };
    let fillers_begun =
        |a: &Array<MapData, u32>| (1..64).any(|i| a.get(&i, 0).is_ok_and(|id| id != 0));
    let pid = s.agent.pid().expect("agent") as i32;
    // Reading thousands of services takes a debug build seconds; a loaded CI machine, more.
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut map = None;
    loop {
        assert!(
            Instant::now() < deadline,
            "the sync never started: {}",
            s.agent.log_text()
        );
        if map.is_none() {
            map = slot_array();
        }
        if map.as_ref().is_some_and(fillers_begun) {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let programmed =
        lb_userspace::list::services(&xlb_tests::pins(&s.agent.pins)).map_or(0, |r| r.len());
    // SAFETY: as above; a stopped process dies of SIGKILL.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    (programmed, Instant::now())
}

#[test]
fn an_agent_killed_in_the_middle_of_a_sync_converges_without_dropping_a_working_service() {
    let Some(mut s) = started("xfk", &web(&[pod_ip(2)]), 1) else {
        return;
    };
    let big = with_fillers(web(&[pod_ip(2)]));
    // Watch the working service's entries the whole time.
    let (stop, watcher) = watch_web(s.agent.pins.clone());
    write_atomic(&s.yaml, &big).expect("write");
    let (after_kill, killed_at) = kill_mid_sync(&mut s);
    assert!(
        after_kill < FILLERS as usize + 1,
        "the kill came after the sync had finished ({after_kill} frontends): make the sync longer"
    );
    s.agent
        .restart(s.workdir.join("agent-2.log"))
        .expect("restart");
    let want = format!("services={}", FILLERS + 1);
    let deadline = Instant::now() + Duration::from_secs(180);
    while !s.agent.log_text().contains(&want) {
        assert!(Instant::now() < deadline, "{}", s.agent.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (checks, missing) = watcher.join().expect("watcher");
    assert_eq!(
        missing,
        0,
        "the working service was missing in {missing} of {checks} looks (killed {:?} ago, {after_kill} programmed)",
        killed_at.elapsed()
    );
    assert!(checks > 100, "only {checks} looks");
    let r = s
        .topo
        .client
        .ns
        .run(|| tcp_request(sock(WEB, 80), Duration::from_secs(2)))
        .expect("client");
    assert!(r.is_ok(), "{r:?}");
}
