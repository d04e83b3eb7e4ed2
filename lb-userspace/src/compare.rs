//! `xlb compare`: the same services through each implementation, side by side. Every mode
//! gets its own lab (node namespace, a client pod, one pod per endpoint address running echo
//! servers on the endpoint ports): xlb's eBPF datapath (the agent as a process), kube-proxy's
//! iptables and nftables rules as xlb emits them (applied with iptables-restore / nft -f),
//! and kube-proxy's userspace mode (its rules plus `xlb proxy userspace`). The same flows run
//! through each, from the four origins a service proxy serves: the client pod and the node
//! itself, each to ClusterIPs and to NodePorts on the node's address. Every flow's client is
//! an `xlb client` process in the pod's or the node's namespace; in xlb's labs it runs in
//! the cgroup the socket hooks are attached to (a lab cgroup, never the root). xlb runs
//! twice: with `--socket-lb all` (every socket through the hooks) and `--socket-lb host`
//! (the pod's packets through tc). The report shows which backends each mode reached, or
//! whether it refused or dropped, and where modes disagree.

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
        cgroup::Cgroup,
        client::{tcp_request, udp_request},
        echo::EchoServer,
        netns::{Netns, Reap, run},
        process::run_client,
        topology::Topology,
    },
    model::{Cidr, Model, NodeSettings, Protocol, select},
    source::file,
};

/// The implementations compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Impl {
    /// xlb as deployed by default (`--socket-lb all`): every client's socket, the pod's and
    /// the node's, is translated at connect by the socket hooks.
    Ebpf,
    /// xlb with `--socket-lb host`: the node's sockets through the hooks, the pod's packets
    /// through the tc program.
    EbpfHost,
    /// kube-proxy in one of its modes, as xlb emits it (ipvs is not run: it needs the IPVS
    /// kernel modules).
    KubeProxy(Mode),
}

impl Impl {
    pub const ALL: [Impl; 5] = [
        Impl::Ebpf,
        Impl::EbpfHost,
        Impl::KubeProxy(Mode::Iptables),
        Impl::KubeProxy(Mode::Nftables),
        Impl::KubeProxy(Mode::Userspace),
    ];

    /// The mode's name in the report for a flow from `origin`; xlb's names the path that
    /// serves it.
    pub fn label(self, origin: Origin) -> String {
        match (self, origin) {
            (Impl::EbpfHost, Origin::Pod) => format!("{} (tc)", self.name()),
            (Impl::Ebpf | Impl::EbpfHost, _) => format!("{} (socket hooks)", self.name()),
            _ => self.name().to_string(),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Impl::Ebpf => "xlb-ebpf",
            Impl::EbpfHost => "xlb-ebpf-host",
            Impl::KubeProxy(m) => m.name(),
        }
    }

    /// xlb's `--socket-lb` for this mode; `None` for kube-proxy's modes.
    fn socket_lb(self) -> Option<&'static str> {
        match self {
            Impl::Ebpf => Some("all"),
            Impl::EbpfHost => Some("host"),
            _ => None,
        }
    }
}

/// Where a flow starts (the article's four origins are these two, to each frontend kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Origin {
    /// The client pod.
    Pod,
    /// The node itself: a process in the node namespace.
    Node,
}

impl Origin {
    pub const ALL: [Origin; 2] = [Origin::Pod, Origin::Node];

    pub fn name(self) -> &'static str {
        match self {
            Origin::Pod => "pod",
            Origin::Node => "node",
        }
    }
}

/// The kind of frontend a flow goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Frontend {
    ClusterIp,
    /// A NodePort on the lab node's address.
    NodePort,
}

impl Frontend {
    pub fn name(self) -> &'static str {
        match self {
            Frontend::ClusterIp => "ClusterIP",
            Frontend::NodePort => "NodePort",
        }
    }
}

/// One flow: a client (in the pod or on the node) to a ClusterIP or NodePort frontend.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Flow {
    pub service: String,
    pub kind: Frontend,
    pub frontend: SocketAddr,
    pub protocol: Protocol,
    pub origin: Origin,
    /// ClientIP affinity services: the backends (`ip:port`) a flow may stick to (the port's
    /// endpoints under either traffic policy). A mode agrees when it answered from exactly
    /// one of them; `None` without affinity (the backend sets must be equal).
    pub eligible: Option<BTreeSet<String>>,
}

impl Flow {
    /// The flow's target as `xlb client flows` takes it: `tcp/IP:PORT` or `udp/IP:PORT`.
    pub fn target(&self) -> String {
        format!("{}/{}", self.protocol.lower(), self.frontend)
    }
}

/// Parses [`Flow::target`].
fn parse_target(text: &str) -> Result<(Protocol, SocketAddr), String> {
    let (proto, addr) = text
        .split_once('/')
        .ok_or_else(|| format!("{text:?}: expected tcp/IP:PORT or udp/IP:PORT"))?;
    let protocol = match proto {
        "tcp" => Protocol::Tcp,
        "udp" => Protocol::Udp,
        other => return Err(format!("{text:?}: protocol {other:?} is not tcp or udp")),
    };
    let addr = addr.parse().map_err(|e| format!("{text:?}: {e}"))?;
    Ok((protocol, addr))
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

impl std::str::FromStr for Outcome {
    type Err = String;

    /// Parses what [`Outcome`]'s `Display` writes (the line `xlb client flows` prints).
    fn from_str(line: &str) -> Result<Self, String> {
        Ok(match line.trim() {
            "REFUSED" => Outcome::Refused,
            "DROPPED" => Outcome::Dropped,
            l => match l.strip_prefix("FAILED (").and_then(|r| r.strip_suffix(')')) {
                Some(e) => Outcome::Failed(e.to_string()),
                None => Outcome::Backends(l.split_whitespace().map(String::from).collect()),
            },
        })
    }
}

/// The comparison: every flow, every mode's outcome.
#[derive(Debug, Default)]
pub struct Report {
    pub flows: Vec<(Flow, BTreeMap<Impl, Outcome>)>,
    /// xlb's datapath counters (`xlb list counters`) after each xlb lab's flows: which path
    /// (tc or the socket hooks) did the work.
    pub counters: BTreeMap<Impl, Counts>,
}

/// Counter values by reason name.
pub type Counts = BTreeMap<&'static str, u64>;

/// The counters the report shows: tc's new flows and refusals, the hooks' translations
/// and refusals.
const SHOWN_COUNTERS: [&str; 4] = ["new_flow", "reject", "sock_xlate", "sock_reject"];

impl Report {
    /// Flows where the modes did not all do the same.
    pub fn disagreements(&self) -> Vec<&Flow> {
        self.flows
            .iter()
            .filter(|(f, by)| !agree(f, by))
            .map(|(f, _)| f)
            .collect()
    }

    /// The side-by-side table: per flow, its service, frontend kind, frontend and origin,
    /// then each mode's outcome (xlb's with the path that served it).
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (flow, by) in &self.flows {
            let _ = writeln!(
                out,
                "{} {} {}/{} from {}: {}",
                flow.service,
                flow.kind.name(),
                flow.frontend,
                flow.protocol,
                flow.origin.name(),
                if agree(flow, by) { "agree" } else { "DISAGREE" }
            );
            for (m, o) in by {
                let _ = writeln!(out, "    {:<29} {}", m.label(flow.origin), shown(flow, o));
            }
        }
        for (m, counts) in &self.counters {
            let shown: Vec<String> = SHOWN_COUNTERS
                .iter()
                .map(|c| format!("{c}={}", counts.get(c).copied().unwrap_or(0)))
                .collect();
            let _ = writeln!(out, "{} counters: {}", m.name(), shown.join(" "));
        }
        out
    }
}

/// Whether every mode did the same with `flow`. For an affinity service (`flow.eligible`)
/// each mode must have answered from exactly one eligible backend, not necessarily the same
/// one: each stuck to its own pick. Otherwise the outcomes must be equal.
fn agree(flow: &Flow, by: &BTreeMap<Impl, Outcome>) -> bool {
    if let Some(eligible) = &flow.eligible
        && by.values().all(|o| sticks_to_one(o, eligible))
    {
        return true;
    }
    by.values()
        .map(|o| o.to_string())
        .collect::<BTreeSet<_>>()
        .len()
        <= 1
}

/// Whether two modes' outcomes for `flow` agree (as [`Report::disagreements`] judges).
pub fn outcomes_agree(flow: &Flow, a: &Outcome, b: &Outcome) -> bool {
    let by = BTreeMap::from([
        (Impl::Ebpf, a.clone()),
        (Impl::KubeProxy(Mode::Iptables), b.clone()),
    ]);
    agree(flow, &by)
}

/// The outcome answered from exactly one backend, and it is one of `eligible`.
fn sticks_to_one(outcome: &Outcome, eligible: &BTreeSet<String>) -> bool {
    matches!(outcome, Outcome::Backends(b) if b.len() == 1 && b.is_subset(eligible))
}

/// A mode's outcome in the report: for an affinity flow answered from backends, the
/// eligible set and what it stuck to (`one of {a b}: a`).
fn shown(flow: &Flow, outcome: &Outcome) -> String {
    match (&flow.eligible, outcome) {
        (Some(eligible), Outcome::Backends(_)) => format!(
            "one of {{{}}}: {outcome}",
            eligible.iter().cloned().collect::<Vec<_>>().join(" ")
        ),
        _ => outcome.to_string(),
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
    /// The `xlb` binary (the agent, the userspace proxy, the client processes).
    pub xlb: PathBuf,
    /// A tag unique to this run (namespace, pin and cgroup names embed it).
    pub tag: String,
}

/// The node's address in every lab when the input names none: NodePorts are served there
/// (kube-proxy's nodePortAddresses, xlb's `--nodeport-addresses`), on the node's `lo`.
pub const LAB_NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

/// `ip` when it is an IPv4 address other than loopback.
fn v4_not_loopback(ip: IpAddr) -> Option<Ipv4Addr> {
    match ip {
        IpAddr::V4(v) if !v.is_loopback() => Some(v),
        _ => None,
    }
}

/// The address NodePort flows go to: the first IPv4 address nodePortAddresses selects, else
/// the node IP; `None` when the settings name neither.
pub fn node_port_ip(settings: &NodeSettings) -> Option<Ipv4Addr> {
    match settings.node_port_ips() {
        Some(ips) => ips.into_iter().find_map(v4_not_loopback),
        None => settings.node_ip().and_then(v4_not_loopback),
    }
}

/// For each ClientIP-affinity service port (`ns/name:port` or `ns/name`, protocol) of
/// `model` on `settings`' node: the endpoints it may send to under either traffic policy.
fn affinity_backends(
    model: &Model,
    settings: &NodeSettings,
) -> BTreeMap<(String, Protocol), BTreeSet<String>> {
    select::service_ports(model, settings)
        .into_iter()
        .filter(|pv| pv.affinity_timeout().is_some())
        .map(|pv| {
            let c = &pv.categorized;
            let eligible = c.cluster.iter().chain(&c.local).map(|e| e.to_string());
            ((pv.name.clone(), pv.protocol()), eligible.collect())
        })
        .collect()
}

/// The flows of `model` (IPv4, TCP and UDP) on `settings`' node: each ClusterIP port, and
/// each NodePort on `node_port_ip`, from the pod and from the node.
pub fn flows(model: &Model, settings: &NodeSettings, node_port_ip: Option<Ipv4Addr>) -> Vec<Flow> {
    let affinity = affinity_backends(model, settings);
    let mut out = Vec::new();
    for (id, svc) in &model.services {
        for ip in svc.cluster_ips.iter().filter(|ip| ip.is_ipv4()) {
            for p in svc.ports.iter().filter(|p| p.protocol != Protocol::Sctp) {
                let service = if p.name.is_empty() {
                    id.to_string()
                } else {
                    format!("{id}:{}", p.name)
                };
                let mut frontends = vec![(Frontend::ClusterIp, SocketAddr::new(*ip, p.port))];
                if let (Some(np), Some(nip)) = (p.node_port, node_port_ip) {
                    frontends.push((Frontend::NodePort, SocketAddr::from((nip, np))));
                }
                for (kind, frontend) in frontends {
                    out.extend(Origin::ALL.map(|origin| Flow {
                        service: service.clone(),
                        kind,
                        frontend,
                        protocol: p.protocol,
                        origin,
                        eligible: affinity.get(&(service.clone(), p.protocol)).cloned(),
                    }));
                }
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

/// The node settings every lab uses: the file's TestConfig, else this node's name and
/// [`LAB_NODE_IP`] as node IP and only NodePort address.
fn lab_settings(loaded: &file::Loaded, node_name: &str) -> NodeSettings {
    match &loaded.test_config {
        Some(t) => t.settings.clone(),
        None => NodeSettings {
            node_name: node_name.to_string(),
            node_ips: vec![IpAddr::V4(LAB_NODE_IP)],
            local_addresses: vec![IpAddr::V4(LAB_NODE_IP)],
            node_port_addresses: vec![Cidr::host(IpAddr::V4(LAB_NODE_IP))],
            ..NodeSettings::default()
        },
    }
}

/// The writer options every lab uses: the file's TestConfig's, without nfacct counters
/// (the lab's namespaces have no nfacct objects; kube-proxy creates them at start).
pub fn lab_options(loaded: &file::Loaded) -> emit::Options {
    let mut options = loaded
        .test_config
        .as_ref()
        .map(|t| t.options.clone())
        .unwrap_or_default();
    options.host.nfacct_invalid_dropped = false;
    options.host.nfacct_localhost_nodeports = false;
    options
}

/// Runs every mode and returns the report.
pub fn compare(opts: &CompareOptions) -> Result<Report, CompareError> {
    let loaded = file::load(&opts.source)?;
    let settings = lab_settings(&loaded, &opts.node_name);
    let options = lab_options(&loaded);
    let flows = flows(&loaded.model, &settings, node_port_ip(&settings));
    let mut report = Report {
        flows: flows.iter().map(|f| (f.clone(), BTreeMap::new())).collect(),
        counters: BTreeMap::new(),
    };
    for (i, mode) in opts.modes.iter().enumerate() {
        let tag = format!("{}{i}", opts.tag);
        let (outcomes, counters) = run_mode(
            *mode,
            &tag,
            opts,
            &loaded.model,
            (&settings, &options),
            &flows,
        )
        .map_err(|reason| CompareError::Mode {
            mode: mode.name(),
            reason,
        })?;
        for ((_, by), o) in report.flows.iter_mut().zip(outcomes) {
            by.insert(*mode, o);
        }
        if let Some(c) = counters {
            report.counters.insert(*mode, c);
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

/// How long one request of a flow may take (connect, then the answer).
const REQUEST_TIMEOUT: Duration = Duration::from_millis(500);

/// Runs `flows` through a lab of `mode`: their outcomes, and xlb's counters after them.
fn run_mode(
    mode: Impl,
    tag: &str,
    opts: &CompareOptions,
    model: &Model,
    (settings, options): (&NodeSettings, &emit::Options),
    flows: &[Flow],
) -> Result<(Vec<Outcome>, Option<Counts>), String> {
    let frontends: Vec<SocketAddr> = flows.iter().map(|f| f.frontend).collect();
    let lab = install(&LabSpec {
        mode: Some(mode),
        tag,
        source: &opts.source,
        xlb: &opts.xlb,
        model,
        settings,
        options,
        pods: &endpoints(model),
        frontends: &frontends,
    })?;
    let requests = opts.requests.max(1);
    let mut outcomes = vec![Outcome::Failed("not run".into()); flows.len()];
    for origin in Origin::ALL {
        let (index, targets): (Vec<usize>, Vec<String>) = flows
            .iter()
            .enumerate()
            .filter(|(_, f)| f.origin == origin)
            .map(|(i, f)| (i, f.target()))
            .unzip();
        if index.is_empty() {
            continue;
        }
        let got = run_flows(&lab, &opts.xlb, origin, requests, targets)?;
        for (i, o) in index.into_iter().zip(got) {
            outcomes[i] = o;
        }
    }
    Ok((outcomes, lab.counters()))
}

/// Runs one origin's flows (`targets`) from an `xlb client flows` process in its namespace
/// (in xlb's labs, in the cgroup the socket hooks are attached to); one outcome per target.
fn run_flows(
    lab: &Installed,
    xlb: &Path,
    origin: Origin,
    requests: usize,
    targets: Vec<String>,
) -> Result<Vec<Outcome>, String> {
    let count = targets.len();
    let mut args = vec![
        "flows".to_string(),
        "--requests".into(),
        requests.to_string(),
    ];
    args.extend(targets);
    let limit = Duration::from_secs(10) + 2 * REQUEST_TIMEOUT * (requests * count) as u32;
    let out = run_client(
        xlb,
        lab.namespace(origin),
        lab.cgroup.as_ref(),
        &args,
        limit,
    )?;
    let outcomes = out
        .lines()
        .map(str::parse)
        .collect::<Result<Vec<Outcome>, String>>()?;
    if outcomes.len() != count {
        return Err(format!(
            "{} client: {} lines for {count} flows:\n{out}",
            origin.name(),
            outcomes.len()
        ));
    }
    Ok(outcomes)
}

/// What a lab is built for.
pub struct LabSpec<'a> {
    /// The implementation to install; `None`: the lab alone, for traffic straight to pods.
    pub mode: Option<Impl>,
    /// Unique to the lab: namespace, pin and cgroup names embed it.
    pub tag: &'a str,
    /// The services file the agent and the userspace proxy read.
    pub source: &'a Path,
    /// The `xlb` binary (agent, userspace proxy, client processes).
    pub xlb: &'a Path,
    pub model: &'a Model,
    /// The node: the emitters' settings; its node IP and NodePort address go on its `lo`.
    pub settings: &'a NodeSettings,
    /// The emitters' writer options.
    pub options: &'a emit::Options,
    /// One pod per address, with echo servers (TCP and UDP) on its ports.
    pub pods: &'a BTreeMap<Ipv4Addr, BTreeSet<u16>>,
    /// Routed into a sink, so that packets no rule rewrites reach the FORWARD hook.
    pub frontends: &'a [SocketAddr],
}

/// A lab with one implementation installed; everything is removed on drop.
pub struct Installed {
    // Drop order: processes and pins first, then the cgroup, servers, namespaces.
    guards: Vec<Reap>,
    pins: Option<Pins>,
    /// xlb's labs: the cgroup its socket hooks are attached to (`--cgroup-path`); a client
    /// process must join it to be served by the hooks.
    pub cgroup: Option<Cgroup>,
    _servers: Vec<EchoServer>,
    pub topo: Topology,
    work: PathBuf,
}

impl Installed {
    /// xlb's datapath counters, in xlb's labs.
    pub fn counters(&self) -> Option<Counts> {
        let pins = self.pins.as_ref()?;
        let rows = crate::list::counters(&pins.0).ok()?;
        Some(rows.iter().map(|r| (r.reason, r.packets)).collect())
    }

    /// The namespace a client of `origin` runs in.
    pub fn namespace(&self, origin: Origin) -> &Netns {
        match origin {
            Origin::Pod => &self.topo.client.ns,
            Origin::Node => &self.topo.node,
        }
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

/// The addresses the lab's node carries on `lo`: its node IP and NodePort address.
fn node_addresses(settings: &NodeSettings) -> BTreeSet<Ipv4Addr> {
    let node_ip = settings.node_ip().and_then(v4_not_loopback);
    node_ip.into_iter().chain(node_port_ip(settings)).collect()
}

/// Builds a lab (a node namespace with its node addresses, a client pod, one pod per
/// address of `spec.pods` with echo servers) and installs `spec.mode` in it.
pub fn install(spec: &LabSpec) -> Result<Installed, String> {
    let eps = spec.pods;
    let client_ip = (1..=254u8)
        .map(|i| Ipv4Addr::new(10, 255, 255, i))
        .find(|ip| !eps.contains_key(ip))
        .ok_or("no free client address")?;
    let node_ips = node_addresses(spec.settings);
    if let Some(ip) = node_ips.iter().find(|ip| eps.contains_key(ip)) {
        return Err(format!("the node address {ip} is also an endpoint's"));
    }
    let pod_ips: Vec<Ipv4Addr> = eps.keys().copied().collect();
    let topo = Topology::with_pods(spec.tag, client_ip, &pod_ips)?;
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
    for ip in &node_ips {
        topo.node
            .ip(&["addr", "add", &format!("{ip}/32"), "dev", "lo"])?;
    }
    route_to_void(&topo.node, spec.frontends)?;
    let work = std::env::temp_dir().join(spec.tag);
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let mut lab = Installed {
        guards: Vec::new(),
        pins: None,
        cgroup: None,
        _servers: servers,
        topo,
        work,
    };
    match spec.mode {
        None => {}
        Some(Impl::Ebpf | Impl::EbpfHost) => start_agent(spec, &mut lab)?,
        Some(Impl::KubeProxy(Mode::Iptables)) => {
            let payload = emit::iptables::emit(spec.model, spec.settings, spec.options);
            lab.topo
                .node
                .feed("iptables-restore", &["--noflush"], &payload.render())?;
            add_jumps(&lab.topo.node, &emit::iptables::jumps(&payload))?;
        }
        Some(Impl::KubeProxy(Mode::Nftables)) => {
            // The table carries its own hooks (prerouting, input, forward, output, postrouting).
            lab.topo.node.feed(
                "nft",
                &["-f", "-"],
                &emit::render(Mode::Nftables, spec.model, spec.settings, spec.options),
            )?;
        }
        Some(Impl::KubeProxy(Mode::Userspace)) => start_userspace(spec, &mut lab)?,
        Some(Impl::KubeProxy(Mode::Ipvs)) => {
            return Err("ipvs mode is not run in a lab (it needs the IPVS kernel modules)".into());
        }
    }
    Ok(lab)
}

/// A node in a cluster routes ClusterIPs somewhere (its default route), so a packet that no
/// rule rewrites reaches the FORWARD hook, where kube-proxy REJECTs. The lab's node has no
/// default route; a veth whose peer stays down (both ends in the node namespace: it never
/// carries a packet) stands in for it.
fn route_to_void(node: &Netns, frontends: &[SocketAddr]) -> Result<(), String> {
    node.ip(&[
        "link",
        "add",
        "xv-void",
        "type",
        "veth",
        "peer",
        "name",
        "xv-void-peer",
    ])?;
    node.ip(&["link", "set", "xv-void", "up"])?;
    for f in frontends {
        if let IpAddr::V4(ip) = f.ip() {
            let _ = node.ip(&["route", "replace", &format!("{ip}/32"), "dev", "xv-void"]);
        }
    }
    Ok(())
}

/// Adds kube-proxy's jumps into its chains, as it ensures them.
fn add_jumps(node: &Netns, jumps: &[emit::Jump]) -> Result<(), String> {
    for j in jumps {
        run(node.command("iptables").args(j.args()))?;
    }
    Ok(())
}

/// xlb's lab: the agent in the node namespace, attached to the pods' veths, with the socket
/// hooks on a cgroup of the lab's own (never the machine's root).
fn start_agent(spec: &LabSpec, lab: &mut Installed) -> Result<(), String> {
    let socket_lb = spec.mode.and_then(Impl::socket_lb).unwrap_or("all");
    let cgroup = Cgroup::new(spec.tag)?;
    let pins = PathBuf::from(format!("/sys/fs/bpf/{}", spec.tag));
    let mut args: Vec<String> = [
        "agent",
        "--source",
        &format!("file:{}", spec.source.display()),
        "--pod-interfaces",
        "xv-*",
        "--hostname-override",
        &spec.settings.node_name,
        "--healthz-bind-address",
        "",
        "--metrics-bind-address",
        "",
        "--socket-lb",
        socket_lb,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(["--cgroup-path".into(), cgroup.path.display().to_string()]);
    args.extend(["--bpffs".into(), pins.display().to_string()]);
    if let Some(ip) = node_port_ip(spec.settings) {
        args.extend(["--nodeport-addresses".into(), ip.to_string()]);
    }
    lab.cgroup = Some(cgroup);
    let log = lab.work.join("agent.log");
    lab.guards
        .push(spawn_xlb(&lab.topo.node, spec.xlb, &args, &log)?);
    lab.pins = Some(Pins(pins.clone()));
    let want = spec.frontends.len().min(1);
    let deadline = Instant::now() + Duration::from_secs(15);
    while crate::list::services(&pins).map_or(0, |r| r.len()) < want {
        if Instant::now() > deadline {
            return Err(format!(
                "agent never programmed the maps:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Interfaces are attached in the same loop iteration as the first sync (the socket
    // hooks before it).
    std::thread::sleep(Duration::from_millis(300));
    Ok(())
}

/// kube-proxy's userspace lab: `xlb proxy userspace` in the node namespace and its rules.
fn start_userspace(spec: &LabSpec, lab: &mut Installed) -> Result<(), String> {
    let args: Vec<String> = [
        "proxy",
        "userspace",
        "--source",
        &format!("file:{}", spec.source.display()),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let log = lab.work.join("proxy.log");
    lab.guards
        .push(spawn_xlb(&lab.topo.node, spec.xlb, &args, &log)?);
    lab.topo.node.feed(
        "iptables-restore",
        &["--noflush"],
        &emit::render(Mode::Userspace, spec.model, spec.settings, spec.options),
    )?;
    add_jumps(&lab.topo.node, &emit::userspace::JUMPS)?;
    std::thread::sleep(Duration::from_millis(1000));
    Ok(())
}

/// `xlb client flows --requests N TARGET…`: `requests` requests for each target
/// ([`Flow::target`]); one [`Outcome`] line per target, in order.
pub fn client_flows(requests: usize, targets: &[String]) -> Result<String, String> {
    let mut out = String::new();
    for t in targets {
        let (protocol, to) = parse_target(t)?;
        let _ = writeln!(out, "{}", drive(protocol, to, requests.max(1)));
    }
    Ok(out)
}

/// Sends `requests` requests on fresh connections (sockets); classifies the result.
fn drive(protocol: Protocol, to: SocketAddr, requests: usize) -> Outcome {
    let mut backends = BTreeSet::new();
    for _ in 0..requests {
        let r = match protocol {
            Protocol::Udp => udp_request(to, REQUEST_TIMEOUT),
            _ => tcp_request(to, REQUEST_TIMEOUT),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outcome_survives_its_line() {
        for o in [
            Outcome::Backends(["10.244.2.2:8080".into(), "10.244.3.2:8080".into()].into()),
            Outcome::Refused,
            Outcome::Dropped,
            Outcome::Failed("send to 10.96.0.30:53: Operation not permitted (os error 1)".into()),
        ] {
            assert_eq!(o.to_string().parse::<Outcome>(), Ok(o));
        }
    }

    fn affinity_flow(eligible: Option<&[&str]>) -> Flow {
        Flow {
            service: "demo/sticky:http".into(),
            kind: Frontend::ClusterIp,
            frontend: "10.96.0.40:80".parse().expect("addr"),
            protocol: Protocol::Tcp,
            origin: Origin::Pod,
            eligible: eligible.map(|e| e.iter().map(|s| s.to_string()).collect()),
        }
    }

    fn backends(b: &[&str]) -> Outcome {
        Outcome::Backends(b.iter().map(|s| s.to_string()).collect())
    }

    const ELIGIBLE: &[&str] = &["10.244.2.2:8080", "10.244.3.2:8080", "10.244.4.2:8080"];

    #[test]
    fn affinity_modes_agree_when_each_sticks_to_one_eligible_backend() {
        let flow = affinity_flow(Some(ELIGIBLE));
        let by = BTreeMap::from([
            (Impl::Ebpf, backends(&["10.244.2.2:8080"])),
            (
                Impl::KubeProxy(Mode::Iptables),
                backends(&["10.244.3.2:8080"]),
            ),
            (
                Impl::KubeProxy(Mode::Nftables),
                backends(&["10.244.4.2:8080"]),
            ),
        ]);
        assert!(agree(&flow, &by));
        let report = Report {
            flows: vec![(flow.clone(), by)],
            counters: BTreeMap::new(),
        };
        assert!(report.disagreements().is_empty());
        let table = report.render();
        assert!(table.contains(": agree"), "{table}");
        assert!(
            table.contains(
                "one of {10.244.2.2:8080 10.244.3.2:8080 10.244.4.2:8080}: 10.244.3.2:8080"
            ),
            "{table}"
        );
    }

    #[test]
    fn affinity_modes_disagree_on_two_backends_an_ineligible_one_or_a_refusal() {
        let flow = affinity_flow(Some(ELIGIBLE));
        let one = backends(&["10.244.2.2:8080"]);
        for other in [
            backends(&["10.244.2.2:8080", "10.244.3.2:8080"]),
            backends(&["10.244.9.2:8080"]),
            Outcome::Refused,
            Outcome::Dropped,
        ] {
            assert!(!outcomes_agree(&flow, &one, &other), "{other}");
        }
        // Refused everywhere is still agreement (an affinity service without endpoints).
        assert!(outcomes_agree(&flow, &Outcome::Refused, &Outcome::Refused));
    }

    #[test]
    fn without_affinity_the_backend_sets_must_be_equal() {
        let flow = affinity_flow(None);
        let a = backends(&["10.244.2.2:8080"]);
        let b = backends(&["10.244.3.2:8080"]);
        assert!(!outcomes_agree(&flow, &a, &b));
        assert!(outcomes_agree(&flow, &a, &a.clone()));
        assert_eq!(shown(&flow, &a), "10.244.2.2:8080");
    }

    #[test]
    fn affinity_flows_carry_the_ports_endpoints_as_eligible() {
        let yaml = "apiVersion: v1\nkind: Service\nmetadata: {namespace: t, name: s}\nspec:\n  clusterIP: 10.96.0.40\n  sessionAffinity: ClientIP\n  ports:\n  - {name: p, port: 80, protocol: TCP}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {namespace: t, name: s-1, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nports:\n- {name: p, port: 8080, protocol: TCP}\nendpoints:\n- {addresses: [10.244.2.2], conditions: {ready: true}, nodeName: node1}\n- {addresses: [10.244.3.2], conditions: {ready: false}, nodeName: node1}\n";
        let loaded = file::parse("aff.yaml", yaml).expect("yaml");
        let settings = lab_settings(&loaded, "node1");
        let got = flows(&loaded.model, &settings, None);
        assert_eq!(got.len(), 2);
        for f in got {
            assert_eq!(f.eligible, Some(["10.244.2.2:8080".to_string()].into()));
        }
    }

    #[test]
    fn a_flow_target_survives_its_text() {
        let flow = Flow {
            service: "demo/web:dns".into(),
            kind: Frontend::NodePort,
            frontend: "10.0.0.1:30053".parse().expect("addr"),
            protocol: Protocol::Udp,
            origin: Origin::Node,
            eligible: None,
        };
        assert_eq!(
            parse_target(&flow.target()),
            Ok((Protocol::Udp, flow.frontend))
        );
        assert!(parse_target("sctp/10.0.0.1:1").is_err());
    }

    #[test]
    fn node_ports_are_flows_from_both_origins_on_the_node_address() {
        let yaml = "apiVersion: v1\nkind: Service\nmetadata: {namespace: t, name: np}\nspec:\n  type: NodePort\n  clusterIP: 10.96.0.20\n  ports:\n  - {name: p, port: 80, protocol: TCP, nodePort: 30080}\n";
        let loaded = file::parse("np.yaml", yaml).expect("yaml");
        let settings = lab_settings(&loaded, "node1");
        assert_eq!(node_port_ip(&settings), Some(LAB_NODE_IP));
        let got: Vec<(Frontend, String, Origin)> =
            flows(&loaded.model, &settings, node_port_ip(&settings))
                .into_iter()
                .map(|f| (f.kind, f.frontend.to_string(), f.origin))
                .collect();
        assert_eq!(
            got,
            [
                (Frontend::ClusterIp, "10.96.0.20:80".into(), Origin::Pod),
                (Frontend::ClusterIp, "10.96.0.20:80".into(), Origin::Node),
                (Frontend::NodePort, "10.0.0.1:30080".into(), Origin::Pod),
                (Frontend::NodePort, "10.0.0.1:30080".into(), Origin::Node),
            ]
        );
    }
}
