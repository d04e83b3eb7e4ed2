//! `xlb compare`: the same services through each implementation, side by side. Every mode
//! gets its own lab (node namespace, a client pod, one pod per endpoint address running echo
//! servers on the endpoint ports): xlb's eBPF datapath (the agent as a process), kube-proxy's
//! iptables and nftables rules as xlb emits them (applied with iptables-restore / nft -f),
//! and kube-proxy's userspace mode (its rules plus `xlb proxy userspace`). The same flows run
//! through each; the report shows which backends each mode reached, or whether it refused
//! or dropped, and where modes disagree.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use thiserror::Error;

use crate::{
    emit::{self, Mode},
    lab::{
        client::{tcp_request, udp_request},
        echo::EchoServer,
        netns::{Netns, Reap, run},
        topology::Topology,
    },
    model::{Model, NodeSettings, Protocol},
    source::file,
};

/// The implementations compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Impl {
    Ebpf,
    Iptables,
    Nftables,
    Userspace,
}

impl Impl {
    pub const ALL: [Impl; 4] = [Impl::Ebpf, Impl::Iptables, Impl::Nftables, Impl::Userspace];

    pub fn name(self) -> &'static str {
        match self {
            Impl::Ebpf => "xlb-ebpf",
            Impl::Iptables => "iptables",
            Impl::Nftables => "nftables",
            Impl::Userspace => "userspace",
        }
    }
}

/// One flow: a client to a ClusterIP frontend.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Flow {
    pub service: String,
    pub frontend: SocketAddr,
    pub protocol: Protocol,
}

/// What a mode did with a flow's requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The backends (`ip:port`) that answered.
    Backends(BTreeSet<String>),
    /// Refused at once (TCP RST or ICMP port unreachable).
    Refused,
    /// Nothing came back (dropped).
    Dropped,
    /// Some requests failed otherwise.
    Failed(String),
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Backends(b) => {
                write!(f, "{}", b.iter().cloned().collect::<Vec<_>>().join(" "))
            }
            Outcome::Refused => f.write_str("REFUSED"),
            Outcome::Dropped => f.write_str("DROPPED"),
            Outcome::Failed(e) => write!(f, "FAILED ({e})"),
        }
    }
}

/// The comparison: every flow, every mode's outcome.
#[derive(Debug, Default)]
pub struct Report {
    pub flows: Vec<(Flow, BTreeMap<Impl, Outcome>)>,
}

impl Report {
    /// Flows where the modes did not all do the same.
    pub fn disagreements(&self) -> Vec<&Flow> {
        self.flows
            .iter()
            .filter(|(_, by)| {
                by.values()
                    .map(|o| o.to_string())
                    .collect::<BTreeSet<_>>()
                    .len()
                    > 1
            })
            .map(|(f, _)| f)
            .collect()
    }

    /// The side-by-side table.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (flow, by) in &self.flows {
            let agree = by
                .values()
                .map(|o| o.to_string())
                .collect::<BTreeSet<_>>()
                .len()
                == 1;
            let _ = writeln!(
                out,
                "{} {}/{} {}",
                flow.service,
                flow.frontend,
                flow.protocol,
                if agree { "agree" } else { "DISAGREE" }
            );
            for (m, o) in by {
                let _ = writeln!(out, "    {:<10} {o}", m.name());
            }
        }
        out
    }
}

#[derive(Debug, Error)]
pub enum CompareError {
    #[error(transparent)]
    Source(#[from] crate::source::SourceError),
    #[error("{mode}: {reason}")]
    Mode { mode: &'static str, reason: String },
}

/// What to compare.
#[derive(Clone, Debug)]
pub struct CompareOptions {
    pub source: PathBuf,
    /// This node's name when the file has no TestConfig header.
    pub node_name: String,
    pub requests: usize,
    pub modes: Vec<Impl>,
    /// The `xlb` binary (for the agent and the userspace proxy).
    pub xlb: PathBuf,
    /// A tag unique to this run (namespace and pin names embed it).
    pub tag: String,
}

/// The ClusterIP flows of `model` (IPv4, TCP and UDP).
pub fn flows(model: &Model) -> Vec<Flow> {
    let mut out = Vec::new();
    for (id, svc) in &model.services {
        for ip in svc.cluster_ips.iter().filter(|ip| ip.is_ipv4()) {
            for p in svc.ports.iter().filter(|p| p.protocol != Protocol::Sctp) {
                let service = if p.name.is_empty() {
                    id.to_string()
                } else {
                    format!("{id}:{}", p.name)
                };
                out.push(Flow {
                    service,
                    frontend: SocketAddr::new(*ip, p.port),
                    protocol: p.protocol,
                });
            }
        }
    }
    out
}

/// Every IPv4 endpoint address and the ports it serves.
fn endpoints(model: &Model) -> BTreeMap<Ipv4Addr, BTreeSet<u16>> {
    let mut out: BTreeMap<Ipv4Addr, BTreeSet<u16>> = BTreeMap::new();
    for slice in model.slices.values().flat_map(|s| s.values()) {
        for ep in &slice.endpoints {
            if let Some(IpAddr::V4(ip)) = ep.addresses.first() {
                out.entry(*ip)
                    .or_default()
                    .extend(slice.ports.iter().map(|p| p.port));
            }
        }
    }
    out
}

/// Runs every mode and returns the report.
pub fn compare(opts: &CompareOptions) -> Result<Report, CompareError> {
    let loaded = file::load(&opts.source)?;
    let mut settings = loaded
        .test_config
        .clone()
        .map(|t| t.settings)
        .unwrap_or_else(|| NodeSettings {
            node_name: opts.node_name.clone(),
            ..NodeSettings::default()
        });
    // The lab's namespaces have no nfacct objects (kube-proxy creates them at start).
    settings.host.nfacct_invalid_dropped = false;
    settings.host.nfacct_localhost_nodeports = false;
    let flows = flows(&loaded.model);
    let mut report = Report {
        flows: flows.iter().map(|f| (f.clone(), BTreeMap::new())).collect(),
    };
    for (i, mode) in opts.modes.iter().enumerate() {
        let tag = format!("{}{i}", opts.tag);
        let outcomes =
            run_mode(*mode, &tag, opts, &loaded.model, &settings, &flows).map_err(|reason| {
                CompareError::Mode {
                    mode: mode.name(),
                    reason,
                }
            })?;
        for ((_, by), o) in report.flows.iter_mut().zip(outcomes) {
            by.insert(*mode, o);
        }
    }
    Ok(report)
}

/// Removes a pin directory on drop.
struct Pins(PathBuf);

impl Drop for Pins {
    fn drop(&mut self) {
        let _ = crate::cleanup::cleanup(&self.0);
    }
}

fn spawn_xlb(ns: &Netns, xlb: &Path, args: &[String], log: &Path) -> Result<Reap, String> {
    let out = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    ns.command(xlb)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map(Reap)
        .map_err(|e| format!("{}: {e}", xlb.display()))
}

fn run_mode(
    mode: Impl,
    tag: &str,
    opts: &CompareOptions,
    model: &Model,
    settings: &NodeSettings,
    flows: &[Flow],
) -> Result<Vec<Outcome>, String> {
    let frontends: Vec<SocketAddr> = flows.iter().map(|f| f.frontend).collect();
    let lab = install(
        Some(mode),
        tag,
        &opts.source,
        &opts.xlb,
        model,
        settings,
        &endpoints(model),
        &frontends,
    )?;
    let flows = flows.to_vec();
    let requests = opts.requests.max(1);
    lab.topo
        .client
        .ns
        .run(move || flows.iter().map(|f| drive(f, requests)).collect::<Vec<_>>())
}

/// A lab with one implementation installed; everything is removed on drop.
pub struct Installed {
    // Drop order: processes and pins first, then servers, then namespaces.
    _guards: Vec<Reap>,
    _pins: Option<Pins>,
    _servers: Vec<EchoServer>,
    pub topo: Topology,
    work: PathBuf,
}

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

/// Builds a lab (a node namespace, a client pod, one pod per address of `pods` with echo
/// servers, TCP and UDP, on its ports) and installs `mode` for `model` in it (`None`: the
/// lab alone, for traffic straight to the pods). `frontends`
/// are routed into a sink so that unrewritten packets reach the FORWARD hook.
#[allow(clippy::too_many_arguments)]
pub fn install(
    mode: Option<Impl>,
    tag: &str,
    source_path: &Path,
    xlb: &Path,
    model: &Model,
    settings: &NodeSettings,
    pods: &BTreeMap<Ipv4Addr, BTreeSet<u16>>,
    frontends: &[SocketAddr],
) -> Result<Installed, String> {
    let eps = pods;
    let client_ip = (1..=254u8)
        .map(|i| Ipv4Addr::new(10, 255, 255, i))
        .find(|ip| !eps.contains_key(ip))
        .ok_or("no free client address")?;
    let pod_ips: Vec<Ipv4Addr> = eps.keys().copied().collect();
    let topo = Topology::with_pods(tag, client_ip, &pod_ips)?;
    let mut servers = Vec::new();
    for (pod, (ip, ports)) in topo.backends.iter().zip(eps) {
        for port in ports {
            servers.push(EchoServer::start(
                &pod.ns,
                &format!("{ip}:{port}"),
                *port,
                *port,
            )?);
        }
    }
    // A node in a cluster routes ClusterIPs somewhere (its default route), so a packet that no
    // rule rewrites reaches the FORWARD hook, where kube-proxy REJECTs. The lab's node has no
    // default route; a veth whose peer stays down (both ends in the node namespace: it never
    // carries a packet) stands in for it.
    topo.node.ip(&[
        "link",
        "add",
        "xv-void",
        "type",
        "veth",
        "peer",
        "name",
        "xv-void-peer",
    ])?;
    topo.node.ip(&["link", "set", "xv-void", "up"])?;
    for f in frontends {
        if let IpAddr::V4(ip) = f.ip() {
            let _ = topo
                .node
                .ip(&["route", "replace", &format!("{ip}/32"), "dev", "xv-void"]);
        }
    }
    let work = std::env::temp_dir().join(tag);
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let source = format!("file:{}", source_path.display());
    let mut _guards: Vec<Reap> = Vec::new();
    let mut _pins = None;
    match mode {
        None => {}
        Some(Impl::Ebpf) => {
            let pins = PathBuf::from(format!("/sys/fs/bpf/{tag}"));
            let args: Vec<String> = [
                "agent",
                "--source",
                &source,
                "--pod-interfaces",
                "xv-*",
                "--hostname-override",
                &settings.node_name,
                "--healthz-bind-address",
                "",
                "--metrics-bind-address",
                "",
                // The lab's flows come from pod namespaces (threads of this process, outside
                // any cgroup of ours): tc serves them, and no socket hook is attached.
                "--socket-lb",
                "off",
                "--bpffs",
            ]
            .iter()
            .map(|s| s.to_string())
            .chain([pins.display().to_string()])
            .collect();
            _guards.push(spawn_xlb(&topo.node, xlb, &args, &work.join("agent.log"))?);
            _pins = Some(Pins(pins.clone()));
            let want = frontends.len().min(1);
            let deadline = Instant::now() + Duration::from_secs(15);
            while crate::list::services(&pins).map_or(0, |r| r.len()) < want {
                if Instant::now() > deadline {
                    return Err(format!(
                        "agent never programmed the maps:\n{}",
                        std::fs::read_to_string(work.join("agent.log")).unwrap_or_default()
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // Interfaces are attached in the same loop iteration as the first sync.
            std::thread::sleep(Duration::from_millis(300));
        }
        Some(Impl::Iptables) => {
            topo.node.feed(
                "iptables-restore",
                &["--noflush"],
                &emit::render(Mode::Iptables, model, settings),
            )?;
            for (table, chain, target) in [
                ("nat", "PREROUTING", "KUBE-SERVICES"),
                ("nat", "OUTPUT", "KUBE-SERVICES"),
                ("nat", "POSTROUTING", "KUBE-POSTROUTING"),
                ("filter", "FORWARD", "KUBE-FORWARD"),
                ("filter", "FORWARD", "KUBE-SERVICES"),
                ("filter", "OUTPUT", "KUBE-SERVICES"),
            ] {
                run(topo
                    .node
                    .command("iptables")
                    .args(["-t", table, "-I", chain, "-j", target]))?;
            }
        }
        Some(Impl::Nftables) => {
            topo.node.feed(
                "nft",
                &["-f", "-"],
                &emit::render(Mode::Nftables, model, settings),
            )?;
        }
        Some(Impl::Userspace) => {
            let args: Vec<String> = ["proxy", "userspace", "--source", &source]
                .iter()
                .map(|s| s.to_string())
                .collect();
            _guards.push(spawn_xlb(&topo.node, xlb, &args, &work.join("proxy.log"))?);
            topo.node.feed(
                "iptables-restore",
                &["--noflush"],
                &emit::render(Mode::Userspace, model, settings),
            )?;
            run(topo.node.command("iptables").args([
                "-t",
                "nat",
                "-I",
                "PREROUTING",
                "-j",
                "KUBE-PORTALS-CONTAINER",
            ]))?;
            std::thread::sleep(Duration::from_millis(1000));
        }
    }
    Ok(Installed {
        _guards,
        _pins,
        _servers: servers,
        topo,
        work,
    })
}

/// Sends `requests` requests on fresh connections (sockets); classifies the result.
fn drive(flow: &Flow, requests: usize) -> Outcome {
    let mut backends = BTreeSet::new();
    for _ in 0..requests {
        let r = match flow.protocol {
            Protocol::Udp => udp_request(flow.frontend, Duration::from_millis(500)),
            _ => tcp_request(flow.frontend, Duration::from_millis(500)),
        };
        match r {
            Ok(a) => {
                backends.insert(a.backend);
            }
            Err(e) if e.contains("refused") => return Outcome::Refused,
            Err(e)
                if e.contains("timed out")
                    || e.contains("WouldBlock")
                    || e.contains("temporarily unavailable") =>
            {
                return if backends.is_empty() {
                    Outcome::Dropped
                } else {
                    Outcome::Failed(e)
                };
            }
            Err(e) => return Outcome::Failed(e),
        }
    }
    Outcome::Backends(backends)
}
