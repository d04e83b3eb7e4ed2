//! `cargo xtask run`: the demo. Builds a node namespace with a client pod and three backend
//! pods, all dual-stack (TCP and UDP echo servers on both families that answer with their
//! name and the peer they saw), runs
//! `xlb agent` in the node namespace on the services file, drives traffic to every ClusterIP
//! from the client pod and from the node itself (client processes in the demo's own cgroup,
//! where the agent attaches its socket hooks), and prints which backend answered, once a
//! second. Everything it created is removed on exit, on Ctrl-C (or SIGTERM, SIGHUP) and on
//! error (the guards' Drop).

use std::{
    collections::{BTreeMap, BTreeSet},
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
    let mut why = BTreeSet::new();
    for l in &lines {
        *by.entry(l.backend().unwrap_or("FAILED").to_string())
            .or_default() += 1;
        if let probe::Line::Err { message, .. } = l {
            why.insert(message.clone());
        }
    }
    let mut out = by
        .iter()
        .map(|(b, n)| format!("{b}={n}"))
        .collect::<Vec<_>>()
        .join(" ");
    if !why.is_empty() {
        out += &format!(" ({})", why.into_iter().collect::<Vec<_>>().join("; "));
    }
    Ok(out)
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

/// Rounds the demo's `--takeover` runs on kube-proxy's rules before xlb starts.
const KUBE_PROXY_ROUNDS: u64 = 3;
/// Long-lived TCP connections the `--takeover` demo keeps open from the client pod.
const STREAMS: usize = 4;

/// kube-proxy's rules (iptables mode, as `xlb emit` writes them, with its jumps) for
/// both families of the services file, applied in the node namespace; the ClusterIPs
/// routed as a node's default route would (so the node's own packets reach nat OUTPUT).
fn apply_kube_proxy(node: &Netns, services: &Path) -> Result<()> {
    let model = file::load(services)?.model;
    let settings = lb_userspace::model::NodeSettings::default();
    let families = [
        lb_userspace::model::IpFamily::V4,
        lb_userspace::model::IpFamily::V6,
    ];
    let options = lb_userspace::emit::WriterOptions::default();
    xlb_lab::compare::install_rules(
        node,
        lb_userspace::emit::Mode::Iptables,
        &model,
        &settings,
        &options,
        &families,
    )
    .map_err(|e| anyhow!("kube-proxy's rules: {e}"))?;
    let fronts: Vec<SocketAddr> = frontends(services)?.iter().map(|f| f.addr).collect();
    xlb_lab::compare::route_to_void(node, &fronts).map_err(|e| anyhow!(e))
}

/// Long-lived TCP connections from the client pod to the first TCP frontend: opened once,
/// asked on each tick of the returned sender; each answer is (answered on the backend it
/// first had, of how many).
struct Streams {
    tick: std::sync::mpsc::Sender<()>,
    answers: std::sync::mpsc::Receiver<Result<(usize, usize), String>>,
}

impl Streams {
    fn open(ns: &Netns, to: SocketAddr) -> Self {
        let (tick, ticks) = std::sync::mpsc::channel::<()>();
        let (answer, answers) = std::sync::mpsc::channel();
        // The thread ends when the demo drops the sender.
        let _ = ns.spawn(move || {
            let mut conns = Vec::new();
            let mut first = Vec::new();
            for _ in 0..STREAMS {
                let c = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(2))
                    .and_then(|c| c.set_read_timeout(Some(Duration::from_secs(2))).map(|_| c));
                match c {
                    Ok(c) => conns.push(c),
                    Err(e) => {
                        let _ = answer.send(Err(format!("connect {to}: {e}")));
                        return;
                    }
                }
            }
            while ticks.recv().is_ok() {
                let now: Vec<Option<String>> = conns
                    .iter_mut()
                    .map(|c| xlb_tests::client::ask_tcp(c).ok())
                    .collect();
                if first.is_empty() {
                    first = now.clone();
                }
                let same = now
                    .iter()
                    .zip(&first)
                    .filter(|(a, b)| a.is_some() && a == b)
                    .count();
                if answer.send(Ok((same, conns.len()))).is_err() {
                    return;
                }
            }
        });
        Self { tick, answers }
    }

    /// One round: `same/total on their first backend`, or why not.
    fn ask(&self) -> String {
        if self.tick.send(()).is_err() {
            return "FAILED (the streams' thread ended)".into();
        }
        match self.answers.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok((same, n))) if same == n => {
                format!("{same}/{n} answered, each by its first backend")
            }
            Ok(Ok((same, n))) => format!("FAILED: {same}/{n} answered by their first backend"),
            Ok(Err(e)) => format!("FAILED: {e}"),
            Err(_) => "FAILED: no answer".into(),
        }
    }
}

/// The agent's flags: the services file, the pods' interfaces, and with `takeover`,
/// `--takeover-from kube-proxy`.
fn agent_args(services: &Path, takeover: bool) -> Vec<String> {
    let mut args = vec![
        "--source".to_string(),
        format!("file:{}", services.display()),
        "--pod-interfaces".into(),
        "xv-*".into(),
    ];
    if takeover {
        args.extend(["--takeover-from".into(), "kube-proxy".into()]);
    }
    args
}

pub fn run(xlb: &Path, services: &Path, duration: Option<u64>, takeover: bool) -> Result<()> {
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
    let client_cg = Cgroup::new(&format!("{tag}-clients")).map_err(|e| anyhow!(e))?;
    let mut streams = None;
    if takeover {
        apply_kube_proxy(&topo.node, &services)?;
        println!(
            "xlb demo --takeover: kube-proxy's iptables rules first (as `xlb emit iptables` writes them)"
        );
        let first_tcp = frontends(&services)?
            .into_iter()
            .find(|f| f.protocol == Protocol::Tcp && f.addr.is_ipv4());
        streams = first_tcp.map(|f| Streams::open(&topo.client.ns, f.addr));
    }
    let start_agent = || -> Result<Agent> {
        let mut agent = Agent::start_with(
            &topo.node,
            &agent_args(&services, takeover),
            pins.clone(),
            workdir.join("agent.log"),
        )
        .map_err(|e| anyhow!(e))?;
        agent
            .wait_for(Duration::from_secs(15), |rows| !rows.is_empty())
            .map_err(|e| anyhow!(e))?;
        if takeover {
            agent
                .wait_log("took over from kube-proxy", 1, Duration::from_secs(20))
                .map_err(|e| anyhow!("{e}\n{}", agent.log_text()))?;
        }
        Ok(agent)
    };
    let mut agent = if takeover { None } else { Some(start_agent()?) };
    if let Some(a) = &agent {
        banner(&tag, &topo, &services, &pins, a);
    }
    println!("  Ctrl-C stops and removes everything.\n");

    let started = Instant::now();
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed)
        && duration.is_none_or(|d| started.elapsed() < Duration::from_secs(d))
    {
        if agent.is_none() && round >= KUBE_PROXY_ROUNDS {
            println!("\nstarting xlb agent --takeover-from kube-proxy (the connections stay open)");
            let a = start_agent()?;
            banner(&tag, &topo, &services, &pins, &a);
            agent = Some(a);
        }
        let round_start = Instant::now();
        let fronts = frontends(&services).unwrap_or_default();
        let cg = agent
            .as_ref()
            .and_then(|a| a.cgroup.as_ref())
            .unwrap_or(&client_cg);
        let mut counts = Vec::new();
        for f in &fronts {
            counts.push((spread(cg, &topo.client.ns, f)?, spread(cg, &topo.node, f)?));
        }
        round += 1;
        let through = if agent.is_some() {
            "xlb"
        } else {
            "kube-proxy's rules"
        };
        println!(
            "[{:>4}s] round {round}, through {through}",
            started.elapsed().as_secs()
        );
        if let Some(s) = &streams {
            println!("  long-lived TCP connections from the pod: {}", s.ask());
        }
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
    drop(streams);
    drop(agent);
    drop(client_cg);
    drop(servers);
    drop(topo);
    let _ = std::fs::remove_dir_all(&workdir);
    Ok(())
}
