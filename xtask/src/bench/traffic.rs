//! Bench `traffic`: real TCP through each implementation, in namespaces.
//!
//! One lab per (implementation, number of services): a node namespace, a client pod and one
//! backend pod with an echo server (`compare::install`). The measured service is the last
//! one in kube-proxy's rule order (namespace `zzz`); the others are fillers with endpoints
//! that no pod serves. The load generator runs in the client pod, bounded in time:
//! * new connections per second: connect, one request, its response, close, in a loop;
//! * requests per second on one kept connection;
//! * first-packet latency: how long `connect()` takes (SYN to SYN-ACK through the datapath),
//!   p50 and p99 over every new connection.
//!
//! "direct" sends to the pod's own address: the floor.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    io::{BufRead, BufReader, Write},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Result, anyhow};
use lb_userspace::{
    compare::{Impl, LabSpec, install},
    model::NodeSettings,
    source::file,
};
use xlb_tests::unique_tag;

use super::{
    percentile,
    report::{self, Section, Series},
    verdict,
};

const SIZES: [usize; 3] = [1, 1_000, 10_000];
/// The userspace proxy binds a port per service: measured up to this many services.
const USERSPACE_MAX: usize = 1_000;
const PHASE: Duration = Duration::from_millis(1500);
const MEASURED_VIP: Ipv4Addr = Ipv4Addr::new(10, 94, 0, 1);
const BACKEND: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 2);
const PORT: u16 = 8080;

/// Which path the traffic takes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Route {
    Direct,
    Via(Impl),
}

impl Route {
    fn name(self) -> &'static str {
        match self {
            Route::Direct => "direct to pod",
            Route::Via(i) => i.name(),
        }
    }
}

/// What one measurement of a path gives.
pub(super) struct Measured {
    pub conns_per_s: f64,
    pub reqs_per_s: f64,
    pub connect_p50_us: f64,
    pub connect_p99_us: f64,
    pub failures: usize,
}

/// `n` services: `n - 1` fillers, then the measured one (last in kube-proxy's order).
fn services_yaml(n: usize) -> String {
    let mut y = String::new();
    for i in 0..n.saturating_sub(1) {
        let vip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 0)) + i as u32 + 1);
        let a = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 250, 0, 0)) + 2 * i as u32);
        let b = Ipv4Addr::from(u32::from(a) + 1);
        y.push_str(
            &xlb_tests::services::service_yaml(&format!("f{i}"), vip, 80, "TCP", PORT, &[a, b])
                .replace("namespace: test", "namespace: fill"),
        );
    }
    y.push_str(
        &xlb_tests::services::service_yaml("measured", MEASURED_VIP, 80, "TCP", PORT, &[BACKEND])
            .replace("namespace: test", "namespace: zzz"),
    );
    y
}

/// New connections, then requests on a kept connection, to `target`, each for `PHASE`. Must
/// run in the client's namespace.
pub(super) fn measure(target: SocketAddr) -> Measured {
    let mut connect_us = Vec::new();
    let mut conns = 0usize;
    let mut failures = 0usize;
    let one = |connect_us: &mut Vec<f64>| -> std::io::Result<()> {
        let t = Instant::now();
        let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(1))?;
        connect_us.push(t.elapsed().as_secs_f64() * 1e6);
        s.set_read_timeout(Some(Duration::from_secs(1)))?;
        s.write_all(b"x\n")?;
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line)?;
        Ok(())
    };
    let start = Instant::now();
    while start.elapsed() < PHASE {
        match one(&mut connect_us) {
            Ok(()) => conns += 1,
            Err(_) => failures += 1,
        }
    }
    let conns_per_s = conns as f64 / start.elapsed().as_secs_f64();
    let mut reqs = 0usize;
    let start = Instant::now();
    if let Ok(s) = TcpStream::connect_timeout(&target, Duration::from_secs(1)) {
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let mut w = s.try_clone().ok();
        let mut r = BufReader::new(s);
        let mut line = String::new();
        while start.elapsed() < PHASE {
            line.clear();
            let ok = w.as_mut().is_some_and(|w| w.write_all(b"x\n").is_ok())
                && r.read_line(&mut line).is_ok_and(|n| n > 0);
            if !ok {
                failures += 1;
                break;
            }
            reqs += 1;
        }
    }
    Measured {
        conns_per_s,
        reqs_per_s: reqs as f64 / start.elapsed().as_secs_f64(),
        connect_p50_us: percentile(&connect_us, 50.0),
        connect_p99_us: percentile(&connect_us, 99.0),
        failures,
    }
}

fn run_one(path: Route, n: usize, xlb: &Path) -> Result<Measured> {
    let tag = unique_tag("xlbt");
    let dir = std::env::temp_dir().join(format!("{tag}-src"));
    std::fs::create_dir_all(&dir)?;
    let src = dir.join("services.yaml");
    std::fs::write(&src, services_yaml(n))?;
    let model = file::load(&src).map_err(|e| anyhow!("{e}"))?.model;
    let mut settings = NodeSettings {
        node_name: "node1".into(),
        ..NodeSettings::default()
    };
    settings.host.nfacct_invalid_dropped = false;
    settings.host.nfacct_localhost_nodeports = false;
    let pods: BTreeMap<Ipv4Addr, BTreeSet<u16>> = [(BACKEND, [PORT].into())].into();
    let vip = SocketAddr::from((MEASURED_VIP, 80));
    let mode = match path {
        Route::Direct => None,
        Route::Via(i) => Some(i),
    };
    let lab = install(&LabSpec {
        mode,
        tag: &tag,
        source: &src,
        xlb,
        model: &model,
        settings: &settings,
        pods: &pods,
        frontends: &[vip],
    })
    .map_err(anyhow::Error::msg)?;
    let target = if path == Route::Direct {
        SocketAddr::from((BACKEND, PORT))
    } else {
        vip
    };
    // Warm up (ARP, the proxy's listeners) before measuring.
    lab.topo
        .client
        .ns
        .run(move || {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline
                && TcpStream::connect_timeout(&target, Duration::from_millis(200)).is_err()
            {
                std::thread::sleep(Duration::from_millis(50));
            }
        })
        .map_err(anyhow::Error::msg)?;
    let m = lab
        .topo
        .client
        .ns
        .run(move || measure(target))
        .map_err(anyhow::Error::msg)?;
    drop(lab);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(m)
}

/// Runs the bench; returns its report section.
pub fn run(xlb: &Path) -> Result<Section> {
    let paths = [
        Route::Direct,
        Route::Via(Impl::Ebpf),
        Route::Via(Impl::Iptables),
        Route::Via(Impl::Nftables),
        Route::Via(Impl::Userspace),
    ];
    let mut results: BTreeMap<(Route, usize), Measured> = BTreeMap::new();
    for &n in &SIZES {
        for &p in &paths {
            if p == Route::Via(Impl::Userspace) && n > USERSPACE_MAX {
                continue;
            }
            let m = run_one(p, n, xlb)?;
            println!(
                "{:>14} {n:>6} services: {:.0} conn/s, {:.0} req/s, connect p50 {:.0} µs p99 {:.0} µs, {} failures",
                p.name(),
                m.conns_per_s,
                m.reqs_per_s,
                m.connect_p50_us,
                m.connect_p99_us,
                m.failures
            );
            results.insert((p, n), m);
        }
    }
    let mut body = format!(
        "Real TCP from a client pod to one echo backend, through each path, in namespaces built for the run (`compare::install`). \
         The measured service is last in kube-proxy's rule order; the other services are fillers. Each phase runs {:.1} s: \
         *new conn/s* = connect + one request + response + close in a loop; *req/s* = requests on one kept connection; \
         *connect* = the time `connect()` takes (first packet → SYN-ACK), p50/p99 in µs. The userspace proxy is measured up to \
         {USERSPACE_MAX} services (it binds a port per service). One trial per cell: these are single runs on a shared 2-core VM.\n\n",
        PHASE.as_secs_f64()
    );
    let headers: Vec<String> = [
        "path",
        "services",
        "new conn/s",
        "req/s (kept)",
        "connect p50 (µs)",
        "connect p99 (µs)",
        "failures",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|((p, n), m)| {
            vec![
                p.name().to_string(),
                n.to_string(),
                format!("{:.0}", m.conns_per_s),
                format!("{:.0}", m.reqs_per_s),
                format!("{:.0}", m.connect_p50_us),
                format!("{:.0}", m.connect_p99_us),
                m.failures.to_string(),
            ]
        })
        .collect();
    body.push_str(&report::table(&headers, &rows));

    let get = |p: Route, n: usize| results.get(&(p, n));
    let ebpf = Route::Via(Impl::Ebpf);
    let ipt = Route::Via(Impl::Iptables);
    body.push_str(
        "\n**Ratios** (new conn/s ÷ direct at the same size; ≥ 0.91 = within 1.1× of direct):\n\n",
    );
    let mut worst: f64 = f64::INFINITY;
    for &n in &SIZES {
        let direct = get(Route::Direct, n).map_or(f64::NAN, |m| m.conns_per_s);
        let mut line = format!("* {n} services:");
        for p in &paths[1..] {
            if let Some(m) = get(*p, n) {
                let r = m.conns_per_s / direct;
                if *p == ebpf {
                    worst = worst.min(r);
                }
                let _ = write!(line, " {} {:.2}×;", p.name(), r);
            }
        }
        body.push_str(&line);
        body.push('\n');
    }
    let flat = |p: Route| {
        let a = get(p, SIZES[0]).map_or(f64::NAN, |m| m.conns_per_s);
        let b = get(p, SIZES[SIZES.len() - 1]).map_or(f64::NAN, |m| m.conns_per_s);
        b / a
    };
    let ebpf_flat = flat(ebpf);
    let ipt_flat = flat(ipt);
    let _ = write!(
        body,
        "\n**Targets**\n\n* xlb within 1.1× of direct-to-pod (new conn/s): **{}** (worst xlb ÷ direct = {worst:.2}×).\n\
         * xlb flat in the number of services: **{}** (conn/s at {} ÷ at 1 = {ebpf_flat:.2}×).\n\
         * iptables falling as services grow: {} (conn/s at {} ÷ at 1 = {ipt_flat:.2}×).\n\n![traffic](bench-traffic.svg)\n",
        verdict(worst >= 1.0 / 1.1),
        verdict(ebpf_flat >= 0.9),
        SIZES[SIZES.len() - 1],
        if ipt_flat < 0.9 {
            "**shown**"
        } else {
            "**not visible here**"
        },
        SIZES[SIZES.len() - 1],
    );
    let series: Vec<Series> = paths
        .iter()
        .map(|p| Series {
            name: p.name().to_string(),
            points: SIZES
                .iter()
                .filter_map(|&n| get(*p, n).map(|m| (n as f64, m.conns_per_s)))
                .collect(),
        })
        .collect();
    report::line_plot(
        "bench-traffic.svg",
        "new connections per second",
        "services",
        "conn/s",
        &series,
    )?;
    Ok(Section {
        title: "traffic: real TCP through each path".into(),
        body,
    })
}
