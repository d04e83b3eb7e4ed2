//! `cargo xtask run`: the demo. Builds a node namespace with a client pod and three backend
//! pods (TCP and UDP echo servers that answer with their name and the peer they saw), runs
//! `xlb agent` in the node namespace on the services file, drives traffic from the client to
//! every ClusterIP, and prints which backend answered, once a second. Everything it created is
//! removed on exit, on Ctrl-C and on error (the guards' Drop).

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow};
use lb_userspace::{model::Protocol, source::file};
use xlb_tests::{
    agent::Agent,
    client::{tcp_request, udp_request},
    echo::EchoServer,
    topology::Topology,
};

/// Requests per frontend per round.
const PER_ROUND: usize = 30;
const TCP_PORT: u16 = 8080;
const UDP_PORT: u16 = 5353;

struct Frontend {
    name: String,
    addr: SocketAddr,
    protocol: Protocol,
}

fn frontends(services: &Path) -> Result<Vec<Frontend>> {
    let loaded = file::load(services)?;
    let mut out = Vec::new();
    for (id, svc) in &loaded.model.services {
        for port in &svc.ports {
            for ip in svc
                .cluster_ips
                .iter()
                .filter(|ip| matches!(ip, IpAddr::V4(_)))
            {
                out.push(Frontend {
                    name: format!(
                        "{id}:{}",
                        if port.name.is_empty() {
                            port.port.to_string()
                        } else {
                            port.name.clone()
                        }
                    ),
                    addr: SocketAddr::new(*ip, port.port),
                    protocol: port.protocol,
                });
            }
        }
    }
    Ok(out)
}

pub fn run(xlb: &Path, services: &Path, duration: Option<u64>) -> Result<()> {
    if !xlb_tests::require_root("cargo xtask run") {
        return Err(anyhow!(
            "the demo needs root (BPF and network namespaces): sudo -E cargo xtask run"
        ));
    }
    // SAFETY: single-threaded here; the tests' support code reads it.
    unsafe { std::env::set_var("XLB_BIN", xlb) };
    let services =
        std::fs::canonicalize(services).with_context(|| services.display().to_string())?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed)).context("Ctrl-C handler")?;

    let tag = xlb_tests::unique_tag("xlbdemo");
    let topo = Topology::build(&tag, 3).map_err(|e| anyhow!(e))?;
    let mut servers = Vec::new();
    for pod in &topo.backends {
        servers.push(
            EchoServer::start(&pod.ns, &pod.name, TCP_PORT, UDP_PORT).map_err(|e| anyhow!(e))?,
        );
    }
    let workdir = std::env::temp_dir().join(&tag);
    std::fs::create_dir_all(&workdir)?;
    let pins = std::path::PathBuf::from(format!("/sys/fs/bpf/{tag}"));
    let mut agent = Agent::start(
        &topo.node,
        &services,
        "xv-*",
        pins.clone(),
        workdir.join("agent.log"),
    )
    .map_err(|e| anyhow!(e))?;
    agent
        .wait_for(Duration::from_secs(15), |rows| !rows.is_empty())
        .map_err(|e| anyhow!(e))?;

    println!("xlb demo");
    println!("  namespaces : {tag}-node (xlb agent), {tag}-client, {tag}-backend-{{1,2,3}}");
    println!(
        "  client pod : {}   backends: {}",
        topo.client.ip,
        topo.backends
            .iter()
            .map(|b| format!("{} {}", b.name, b.ip))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "  services   : {} (edit it: xlb re-reads it within a second)",
        services.display()
    );
    println!(
        "  pinned maps: {}   e.g. bpftool map dump pinned {}/XLB_SVC_V1",
        pins.display(),
        pins.display()
    );
    println!(
        "  inspect    : target/debug/xlb list services --bpffs {}",
        pins.display()
    );
    println!("  agent log  : {}", agent.log.display());
    println!("  Ctrl-C stops and removes everything.\n");

    let started = Instant::now();
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed)
        && duration.is_none_or(|d| started.elapsed() < Duration::from_secs(d))
    {
        let round_start = Instant::now();
        let fronts = frontends(&services).unwrap_or_default();
        let jobs: Vec<(SocketAddr, Protocol)> =
            fronts.iter().map(|f| (f.addr, f.protocol)).collect();
        let counts = topo
            .client
            .ns
            .run(move || {
                jobs.iter()
                    .map(|(addr, proto)| {
                        let mut by = BTreeMap::<String, usize>::new();
                        for _ in 0..PER_ROUND {
                            let r = match proto {
                                Protocol::Udp => udp_request(*addr, Duration::from_millis(300)),
                                _ => tcp_request(*addr, Duration::from_millis(300)),
                            };
                            let key = r.map(|a| a.backend).unwrap_or_else(|_| "FAILED".into());
                            *by.entry(key).or_default() += 1;
                        }
                        by
                    })
                    .collect::<Vec<_>>()
            })
            .map_err(|e| anyhow!(e))?;
        round += 1;
        println!("[{:>4}s] round {round}", started.elapsed().as_secs());
        for (f, by) in fronts.iter().zip(counts) {
            let spread: Vec<String> = by.iter().map(|(b, n)| format!("{b}={n}")).collect();
            println!(
                "  {:<28} {:<22} {}",
                f.name,
                format!("{}/{}", f.addr, f.protocol),
                spread.join("  ")
            );
        }
        if let Some(rest) = Duration::from_secs(1).checked_sub(round_start.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    println!("\nstopping: removing the agent's pins, the servers and the namespaces");
    drop(agent);
    drop(servers);
    drop(topo);
    let _ = std::fs::remove_dir_all(&workdir);
    Ok(())
}
