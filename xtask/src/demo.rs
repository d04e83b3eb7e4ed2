//! `cargo xtask run`: the demo. Builds a node namespace with a client pod and three backend
//! pods, all dual-stack (TCP and UDP echo servers on both families that answer with their
//! name and the peer they saw), runs
//! `xlb agent` in the node namespace on the services file, drives traffic to every ClusterIP
//! from the client pod and from the node itself (client processes in the demo's own cgroup,
//! where the agent attaches its socket hooks), and prints which backend answered, once a
//! second. Everything it created is removed on exit, on Ctrl-C (or SIGTERM, SIGHUP) and on
//! error (the guards' Drop).

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
    agent::Agent, cgroup::Cgroup, echo::EchoServer, netns::Netns, probe, topology::Topology,
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
            for ip in &svc.cluster_ips {
                out.push(Frontend {
                    name: format!(
                        "{id}:{}",
                        if port.name.is_empty() {
                            port.port.to_string()
                        } else {
                            port.name.to_string()
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

/// `PER_ROUND` requests to `f` from a client process in `cg` and `ns`, as
/// `backend=count …`.
fn spread(cg: &Cgroup, ns: &Netns, f: &Frontend) -> Result<String> {
    let mode = if f.protocol == Protocol::Udp {
        "udp"
    } else {
        "tcp"
    };
    let lines = probe::run(
        cg,
        ns,
        &[mode.into(), f.addr.to_string(), PER_ROUND.to_string()],
    )
    .map_err(|e| anyhow!(e))?;
    let mut by = BTreeMap::<String, usize>::new();
    for l in &lines {
        *by.entry(l.backend().unwrap_or("FAILED").to_string())
            .or_default() += 1;
    }
    Ok(by
        .iter()
        .map(|(b, n)| format!("{b}={n}"))
        .collect::<Vec<_>>()
        .join(" "))
}

/// What the demo built and where to look.
fn banner(tag: &str, topo: &Topology, services: &Path, pins: &Path, agent: &Agent) {
    println!("xlb demo");
    println!("  namespaces : {tag}-node (xlb agent), {tag}-client, {tag}-backend-{{1,2,3}}");
    let both = |ip: std::net::Ipv4Addr, ip6: Option<std::net::Ipv6Addr>| match ip6 {
        Some(ip6) => format!("{ip} {ip6}"),
        None => ip.to_string(),
    };
    println!(
        "  client pod : {}   backends: {}",
        both(topo.client.ip, topo.client.ip6),
        topo.backends
            .iter()
            .map(|b| format!("{} {}", b.name, both(b.ip, b.ip6)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "  services   : {} (edit it: xlb re-reads it within a second)",
        services.display()
    );
    println!(
        "  pinned maps: {}   e.g. bpftool map dump pinned {}/{}",
        pins.display(),
        pins.display(),
        lb_common::MAP_SVC
    );
    println!(
        "  inspect    : target/debug/xlb list services --bpffs {}",
        pins.display()
    );
    println!("  agent log  : {}", agent.log.display());
    if let Some(cg) = &agent.cgroup {
        println!(
            "  cgroup     : {} (the socket hooks serve the processes in it: bpftool cgroup show {})",
            cg.path.display(),
            cg.path.display()
        );
    }
}

pub fn run(xlb: &Path, services: &Path, duration: Option<u64>) -> Result<()> {
    if !xlb_tests::is_root() {
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
    let mut topo = Topology::build(&tag, 3).map_err(|e| anyhow!(e))?;
    topo.dual_stack().map_err(|e| anyhow!(e))?;
    let mut servers = Vec::new();
    for pod in &topo.backends {
        servers.push(
            EchoServer::start(&pod.ns, &pod.name, TCP_PORT, UDP_PORT).map_err(|e| anyhow!(e))?,
        );
        if let Some(ip6) = pod.ip6 {
            let at = IpAddr::V6(ip6);
            let server = EchoServer::start_at(&pod.ns, &pod.name, at, TCP_PORT, UDP_PORT);
            servers.push(server.map_err(|e| anyhow!(e))?);
        }
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

    banner(&tag, &topo, &services, &pins, &agent);
    println!("  Ctrl-C stops and removes everything.\n");

    let started = Instant::now();
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed)
        && duration.is_none_or(|d| started.elapsed() < Duration::from_secs(d))
    {
        let round_start = Instant::now();
        let fronts = frontends(&services).unwrap_or_default();
        let cg = agent
            .cgroup
            .as_ref()
            .ok_or(anyhow!("the agent has no cgroup"))?;
        let mut counts = Vec::new();
        for f in &fronts {
            counts.push((spread(cg, &topo.client.ns, f)?, spread(cg, &topo.node, f)?));
        }
        round += 1;
        println!("[{:>4}s] round {round}", started.elapsed().as_secs());
        for (f, (pod, node)) in fronts.iter().zip(counts) {
            println!(
                "  {:<20} {:<27} from the pod: {pod}   from the node: {node}",
                f.name,
                format!("{}/{}", f.addr, f.protocol),
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
