//! `xlb`: the agent and the tools around it.

use std::{
    path::PathBuf,
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use lb_userspace::{
    DEFAULT_BPFFS_DIR,
    agent::{self, AgentOptions, SourceSpec},
    cleanup, desired, emit, list,
    model::{Cidr, IpFamily, LocalDetector, NodeSettings, node::MasqueradeMark},
    source::{file, kube::KubeOptions},
};

#[derive(Parser)]
#[command(
    name = "xlb",
    version,
    about = "Kubernetes Service load balancer on eBPF"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per run: the size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Load and attach the datapath, then keep its maps in sync with the source.
    Agent {
        /// Where services come from: `file:PATH` (Kubernetes YAML) or `kubernetes`.
        #[arg(long, env = "XLB_SOURCE")]
        source: Option<String>,
        /// kubeconfig for `--source kubernetes` (default: in-cluster, then $KUBECONFIG).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// Serve only Services labelled service.kubernetes.io/service-proxy-name=NAME.
        #[arg(long, env = "XLB_SERVICE_PROXY_NAME")]
        service_proxy_name: Option<String>,
        /// This node's name (default: $NODE_NAME, else the hostname).
        #[arg(long, env = "XLB_HOSTNAME_OVERRIDE")]
        hostname_override: Option<String>,
        /// Smallest interval between two syncs from the API server, in milliseconds
        /// [default: 100, or the config file's minSyncPeriod].
        #[arg(long, env = "XLB_MIN_SYNC_PERIOD_MS")]
        min_sync_period_ms: Option<u64>,
        /// A KubeProxyConfiguration-style YAML file (hostnameOverride, clusterCIDR,
        /// nodePortAddresses, minSyncPeriod, healthz/metrics bind addresses, conntrack);
        /// flags override it; an unknown key is an error.
        #[arg(long, env = "XLB_CONFIG")]
        config: Option<PathBuf>,
        /// Glob(s) of pod-facing interfaces to attach to, comma-separated (e.g. `veth*,lxc*`).
        #[arg(long, env = "XLB_POD_INTERFACES", default_value = "")]
        pod_interfaces: String,
        /// Node interfaces where NodePort traffic and replies from remote backends arrive,
        /// comma-separated.
        #[arg(long, env = "XLB_NODE_INTERFACES", value_delimiter = ',')]
        node_interfaces: Vec<String>,
        /// IPv4 addresses NodePorts are served on (default: the node interfaces' addresses).
        #[arg(long, env = "XLB_NODEPORT_ADDRESSES", value_delimiter = ',')]
        nodeport_addresses: Vec<std::net::Ipv4Addr>,
        /// Pin directory on bpffs.
        #[arg(long, env = "XLB_BPFFS", default_value = DEFAULT_BPFFS_DIR)]
        bpffs: PathBuf,
        /// Poll interval for the source file and interfaces, in milliseconds.
        #[arg(long, env = "XLB_POLL_MS", default_value_t = 100)]
        poll_ms: u64,
        /// Where to serve /healthz and /livez ("" to disable) [default: 0.0.0.0:10256].
        #[arg(long, env = "XLB_HEALTHZ_BIND_ADDRESS")]
        healthz_bind_address: Option<String>,
        /// Where to serve /metrics ("" to disable) [default: 127.0.0.1:10249].
        #[arg(long, env = "XLB_METRICS_BIND_ADDRESS")]
        metrics_bind_address: Option<String>,
        /// Source ports for flows SNATed to the node (externalTrafficPolicy Cluster to a
        /// remote backend), `MIN-MAX`; keep it outside net.ipv4.ip_local_port_range.
        #[arg(long, env = "XLB_SNAT_PORT_RANGE", default_value = "61000-65535")]
        snat_port_range: String,
        /// The source a pod reaching itself through a service is SNATed to ("" to disable).
        #[arg(long, env = "XLB_HAIRPIN_ADDRESS", default_value = "169.254.42.1")]
        hairpin_address: String,
        /// XDP on the node interfaces: `native` (in the driver, generic where the driver
        /// cannot), `generic`, or `off` (tc does everything; the same behaviour, slower).
        #[arg(long, env = "XLB_XDP", default_value = "off")]
        xdp: lb_userspace::datapath::attach::XdpSetting,
        /// Connect-time load balancing in cgroup socket hooks: `all` (the node's processes,
        /// hostNetwork pods and pods' sockets), `host` (only the agent's network namespace;
        /// pods are left to tc), or `off` (the node itself does not reach services).
        #[arg(long, env = "XLB_SOCKET_LB", default_value = "all")]
        socket_lb: lb_userspace::datapath::socket::SocketLb,
        /// The cgroup v2 directory the socket hooks attach to: every process below it is
        /// served [default: the cgroup v2 root from the mounts, e.g. /sys/fs/cgroup].
        #[arg(long, env = "XLB_CGROUP_PATH")]
        cgroup_path: Option<PathBuf>,
        /// Conntrack flows per CPU (kube-proxy's --conntrack-max-per-core; 0: use the
        /// minimum) [default: 32768, or the config file's conntrack.maxPerCore].
        #[arg(long, env = "XLB_CONNTRACK_MAX_PER_CORE")]
        conntrack_max_per_core: Option<u32>,
        /// Conntrack flows at least (kube-proxy's --conntrack-min) [default: 131072, or the
        /// config file's conntrack.min]. The map holds two entries a flow.
        #[arg(long, env = "XLB_CONNTRACK_MIN")]
        conntrack_min: Option<u32>,
        /// Service map entries (a frontend takes one, plus one per backend slot).
        #[arg(long, env = "XLB_SERVICE_MAP_MAX", default_value_t = lb_common::SVC_MAP_CAPACITY)]
        service_map_max: u32,
        /// Backend map entries.
        #[arg(long, env = "XLB_BACKEND_MAP_MAX", default_value_t = lb_common::BACKEND_MAP_CAPACITY)]
        backend_map_max: u32,
        /// ClientIP affinity entries (one per client and service).
        #[arg(long, env = "XLB_AFFINITY_MAP_MAX", default_value_t = lb_common::AFFINITY_MAP_CAPACITY)]
        affinity_map_max: u32,
        /// Remove everything xlb installed and exit.
        #[arg(long)]
        cleanup: bool,
    },
    /// Show what the pinned maps hold.
    List {
        what: ListWhat,
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
        #[arg(long, default_value = DEFAULT_BPFFS_DIR)]
        bpffs: PathBuf,
    },
    /// Print the maps a source would produce, without touching the kernel.
    Desired {
        /// `file:PATH`.
        #[arg(long)]
        source: String,
    },
    /// Print the rules kube-proxy would write in MODE for a source (nothing is applied).
    ///
    /// Node settings come from the flags; when the source file has a `kind: TestConfig`
    /// document (the kube-proxy conformance format), its settings are the defaults and
    /// flags given explicitly override them.
    Emit {
        mode: EmitMode,
        /// `file:PATH`.
        #[arg(long)]
        source: String,
        #[command(flatten)]
        node: NodeFlags,
    },
    /// Run kube-proxy's userspace proxy (for comparison): accept on each service port's proxy
    /// port (see `xlb emit userspace`) and splice to backends round-robin.
    Proxy {
        /// Only `userspace`.
        mode: ProxyMode,
        /// `file:PATH`.
        #[arg(long)]
        source: String,
        /// First proxy port.
        #[arg(long, default_value_t = 36000)]
        port_range_start: u16,
        /// Last proxy port.
        #[arg(long, default_value_t = 39999)]
        port_range_end: u16,
    },
    /// Run the same services through xlb's datapath and kube-proxy's iptables, nftables and
    /// userspace modes, each in its own namespaces, and show side by side what each did.
    Compare {
        /// `file:PATH` (Kubernetes YAML, or a kube-proxy conformance case).
        #[arg(long)]
        source: String,
        /// Requests per flow and mode (enough that random balancing reaches every backend).
        #[arg(long, default_value_t = 40)]
        requests: usize,
        /// This node's name when the file has no TestConfig header.
        #[arg(long, default_value = "node1")]
        node_name: String,
    },
    /// A lab's client process, for `xlb compare` and the benches (the socket hooks serve
    /// the processes of a cgroup, so their clients must be processes of their own).
    #[command(hide = true)]
    Client {
        #[command(subcommand)]
        what: ClientCommand,
    },
    /// Detach and unpin everything xlb installed.
    Cleanup {
        #[arg(long, default_value = DEFAULT_BPFFS_DIR)]
        bpffs: PathBuf,
    },
}

#[derive(Subcommand)]
enum ClientCommand {
    /// REQUESTS requests to each target (`tcp/IP:PORT`, `udp/IP:PORT`), a fresh socket each;
    /// one line per target: the backends that answered, REFUSED, DROPPED or FAILED (…).
    Flows {
        #[arg(long, default_value_t = 40)]
        requests: usize,
        targets: Vec<String>,
    },
    /// Waits until TARGET accepts, then new connections per second and requests per second
    /// on a kept connection, each for PHASE_MS; one line of `key=value`.
    Load {
        #[arg(long, default_value_t = 1500)]
        phase_ms: u64,
        target: std::net::SocketAddr,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum EmitMode {
    Iptables,
    Nftables,
    Ipvs,
    Userspace,
}

#[derive(Clone, Copy, ValueEnum)]
enum Family {
    Ipv4,
    Ipv6,
}

/// kube-proxy's node flags (all optional: unset keeps the default or the TestConfig value).
#[derive(clap::Args)]
struct NodeFlags {
    /// This node's name (`--hostname-override`): endpoints with this nodeName are local.
    #[arg(long)]
    node_name: Option<String>,
    /// The node's zone label, for topology hints.
    #[arg(long)]
    zone: Option<String>,
    /// The proxier's IP family.
    #[arg(long, value_enum)]
    ip_family: Option<Family>,
    /// Node IPs (comma-separated); the first of the family is used for DNAT/allow-from-node.
    #[arg(long, value_delimiter = ',')]
    node_ip: Vec<String>,
    /// Every local address of the node (comma-separated), for nodePortAddresses and LOCAL.
    #[arg(long, value_delimiter = ',')]
    local_address: Vec<String>,
    /// `--cluster-cidr`: pod traffic detection (detect-local-mode ClusterCIDR).
    #[arg(long)]
    cluster_cidr: Option<String>,
    /// No local-traffic detector at all (overrides --cluster-cidr and the TestConfig).
    #[arg(long)]
    no_local_detector: bool,
    /// `--masquerade-all`.
    #[arg(long)]
    masquerade_all: Option<bool>,
    /// `--iptables-masquerade-bit` (mark printed as kube-proxy does, e.g. 0x00004000).
    #[arg(long)]
    masquerade_bit: Option<u8>,
    /// `--nodeport-addresses` CIDRs (comma-separated; empty = all local addresses).
    #[arg(long, value_delimiter = ',')]
    nodeport_addresses: Vec<String>,
    /// `--iptables-localhost-nodeports`.
    #[arg(long)]
    localhost_nodeports: Option<bool>,
    /// Service CIDRs (nftables drops traffic to unallocated ClusterIPs in them).
    #[arg(long, value_delimiter = ',')]
    service_cidr: Vec<String>,
    /// `--ipvs-scheduler`.
    #[arg(long)]
    ipvs_scheduler: Option<String>,
}

impl NodeFlags {
    fn apply(&self, base: Option<NodeSettings>) -> Result<NodeSettings> {
        let mut s = base.unwrap_or_default();
        let ip = |raw: &String| {
            lb_userspace::source::convert::parse_ip(raw)
                .with_context(|| format!("{raw:?} is not an IP"))
        };
        let cidr = |raw: &String| {
            Cidr::parse_sloppy(raw).with_context(|| format!("{raw:?} is not a CIDR"))
        };
        if let Some(n) = &self.node_name {
            s.node_name = n.clone();
        }
        if let Some(z) = &self.zone {
            s.zone = Some(z.clone());
        }
        if let Some(f) = self.ip_family {
            s.family = match f {
                Family::Ipv4 => IpFamily::V4,
                Family::Ipv6 => IpFamily::V6,
            };
        }
        if !self.node_ip.is_empty() {
            s.node_ips = self.node_ip.iter().map(ip).collect::<Result<_>>()?;
        }
        if !self.local_address.is_empty() {
            s.local_addresses = self.local_address.iter().map(ip).collect::<Result<_>>()?;
        }
        if let Some(c) = &self.cluster_cidr {
            s.detector = LocalDetector::ClusterCidr(cidr(c)?);
        }
        if self.no_local_detector {
            s.detector = LocalDetector::None;
        }
        if let Some(m) = self.masquerade_all {
            s.masquerade_all = m;
        }
        if let Some(bit) = self.masquerade_bit {
            if bit > 31 {
                bail!("--masquerade-bit must be 0..=31");
            }
            s.mark = MasqueradeMark::from_bit(bit);
        }
        if !self.nodeport_addresses.is_empty() {
            s.node_port_addresses = self
                .nodeport_addresses
                .iter()
                .map(cidr)
                .collect::<Result<_>>()?;
        }
        if let Some(l) = self.localhost_nodeports {
            s.localhost_node_ports = l;
        }
        if !self.service_cidr.is_empty() {
            s.service_cidrs = self.service_cidr.iter().map(cidr).collect::<Result<_>>()?;
        }
        if let Some(sch) = &self.ipvs_scheduler {
            s.ipvs_scheduler = sch.clone();
        }
        Ok(s)
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum ProxyMode {
    Userspace,
}

#[derive(Clone, Copy, ValueEnum)]
enum ListWhat {
    Services,
    Backends,
    Conntrack,
    Counters,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

/// `MIN-MAX` as an inclusive port range (1 ≤ MIN ≤ MAX).
fn port_range(text: &str) -> anyhow::Result<std::ops::RangeInclusive<u16>> {
    let parsed = text
        .split_once('-')
        .and_then(|(a, b)| Some((a.trim().parse::<u16>().ok()?, b.trim().parse::<u16>().ok()?)));
    match parsed {
        Some((lo, hi)) if lo >= 1 && lo <= hi => Ok(lo..=hi),
        _ => anyhow::bail!(
            "--snat-port-range {text:?}: expected MIN-MAX with 1 <= MIN <= MAX <= 65535"
        ),
    }
}

/// The node's name: the flag, else $NODE_NAME (the DaemonSet sets it), else the hostname.
fn node_name(flag: Option<String>) -> String {
    flag.or_else(|| std::env::var("NODE_NAME").ok())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_default()
}

/// An optional `IP:PORT` ("" disables).
fn bind_address(s: &str) -> Result<Option<std::net::SocketAddr>> {
    if s.is_empty() {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .with_context(|| format!("{s:?} is not an IP:PORT bind address"))
}

fn source_file(source: &str) -> Result<PathBuf> {
    match source.split_once(':') {
        Some(("file", path)) if !path.is_empty() => Ok(PathBuf::from(path)),
        _ => bail!("unsupported --source {source:?}: expected file:PATH or kubernetes"),
    }
}

/// Errors are the user's to read: the message and its causes on one line, never a backtrace
/// (even with RUST_BACKTRACE set), and exit status 1.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xlb: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match Cli::parse().command {
        Command::Agent {
            bpffs,
            cleanup: true,
            ..
        } => run_cleanup(&bpffs),
        Command::Agent {
            source,
            kubeconfig,
            service_proxy_name,
            hostname_override,
            min_sync_period_ms,
            config,
            pod_interfaces,
            node_interfaces,
            nodeport_addresses,
            bpffs,
            poll_ms,
            healthz_bind_address,
            metrics_bind_address,
            snat_port_range,
            hairpin_address,
            xdp,
            socket_lb,
            cgroup_path,
            conntrack_max_per_core,
            conntrack_min,
            service_map_max,
            backend_map_max,
            affinity_map_max,
            cleanup: false,
        } => {
            let source = source.context("--source file:PATH or --source kubernetes is required")?;
            let config = match &config {
                Some(path) => lb_userspace::config::AgentConfig::load(path)?,
                None => lb_userspace::config::AgentConfig::default(),
            };
            let ct = config.conntrack.clone().unwrap_or_default();
            if ct.tcp_established_timeout.is_some()
                || ct.tcp_close_wait_timeout.is_some()
                || ct.tcp_be_liberal.is_some()
                || ct.udp_timeout.is_some()
                || ct.udp_stream_timeout.is_some()
            {
                tracing::warn!(
                    "config: conntrack timeouts are not used: xlb's conntrack is an LRU map without per-state timeouts (maxPerCore and min size it)"
                );
            }
            let cpus = aya::util::nr_cpus().map_or(1, |n| n as u32);
            let map_sizes = lb_userspace::datapath::sizes::MapSizes {
                conntrack: lb_userspace::datapath::sizes::conntrack_entries(
                    conntrack_max_per_core
                        .or(ct.max_per_core)
                        .unwrap_or(lb_userspace::datapath::sizes::CONNTRACK_MAX_PER_CORE),
                    conntrack_min
                        .or(ct.min)
                        .unwrap_or(lb_userspace::datapath::sizes::CONNTRACK_MIN),
                    cpus,
                ),
                services: service_map_max,
                backends: backend_map_max,
                affinity: affinity_map_max,
            };
            let hostname_override = hostname_override.or(config.hostname_override.clone());
            let nodeport_addresses = if nodeport_addresses.is_empty() {
                config.node_port_addresses.clone().unwrap_or_default()
            } else {
                nodeport_addresses
            };
            let min_sync = min_sync_period_ms
                .map(Duration::from_millis)
                .or(config.min_sync())
                .unwrap_or(Duration::from_millis(100));
            let healthz_bind_address = healthz_bind_address
                .or(config.healthz_bind_address.clone())
                .unwrap_or_else(|| "0.0.0.0:10256".into());
            let metrics_bind_address = metrics_bind_address
                .or(config.metrics_bind_address.clone())
                .unwrap_or_else(|| "127.0.0.1:10249".into());
            let node_name = node_name(hostname_override);
            let source = if source == "kubernetes" {
                SourceSpec::Kubernetes(KubeOptions {
                    kubeconfig,
                    service_proxy_name,
                    node_name: node_name.clone(),
                    min_sync,
                })
            } else {
                SourceSpec::File(source_file(&source)?)
            };
            let opts = AgentOptions {
                source,
                node_name,
                pod_interfaces,
                node_interfaces,
                node_port_addresses: nodeport_addresses,
                bpffs,
                poll: Duration::from_millis(poll_ms.max(10)),
                healthz_addr: bind_address(&healthz_bind_address)?,
                metrics_addr: bind_address(&metrics_bind_address)?,
                snat_ports: port_range(&snat_port_range)?,
                xdp,
                socket_lb,
                cgroup_path,
                map_sizes,
                hairpin_address: if hairpin_address.is_empty() {
                    None
                } else {
                    Some(hairpin_address.parse().with_context(|| {
                        format!("--hairpin-address {hairpin_address:?} is not an IPv4 address")
                    })?)
                },
            };
            let stop = Arc::new(AtomicBool::new(false));
            for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                signal_hook::flag::register(sig, Arc::clone(&stop))
                    .context("install signal handler")?;
            }
            agent::run(&opts, &stop)?;
            Ok(())
        }
        Command::Cleanup { bpffs } => run_cleanup(&bpffs),
        Command::Client { what } => run_client(what),
        Command::Compare {
            source,
            requests,
            node_name,
        } => {
            let opts = lb_userspace::compare::CompareOptions {
                source: source_file(&source)?,
                node_name,
                requests,
                modes: lb_userspace::compare::Impl::ALL.to_vec(),
                xlb: std::env::current_exe().context("the xlb binary's path")?,
                tag: format!("xcmp{}", std::process::id()),
            };
            let report = lb_userspace::compare::compare(&opts)?;
            print!("{}", report.render());
            let differ = report.disagreements();
            println!(
                "{} flows, {} where the modes disagree",
                report.flows.len(),
                differ.len()
            );
            Ok(())
        }
        Command::Proxy {
            mode: ProxyMode::Userspace,
            source,
            port_range_start,
            port_range_end,
        } => {
            let stop = Arc::new(AtomicBool::new(false));
            for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                signal_hook::flag::register(sig, Arc::clone(&stop))
                    .context("install signal handler")?;
            }
            let range = lb_userspace::emit::userspace::PortRange {
                start: port_range_start,
                end: port_range_end,
            };
            lb_userspace::proxy::userspace::run(
                source_file(&source)?,
                lb_userspace::model::NodeSettings::default(),
                range,
                &stop,
            )?;
            Ok(())
        }
        Command::Desired { source } => {
            let loaded = file::load(&source_file(&source)?)?;
            for e in &loaded.errors {
                eprintln!("warning: {e}");
            }
            let (d, problems) = desired::compute(
                &loaded.model,
                &mut desired::Ids::default(),
                desired::Limits::default(),
            );
            for p in &problems {
                eprintln!("warning: {p}");
            }
            print!("{}", d.dump());
            Ok(())
        }
        Command::List {
            what,
            output,
            bpffs,
        } => run_list(what, output, &bpffs),
        Command::Emit { mode, source, node } => {
            let loaded = file::load(&source_file(&source)?)?;
            for e in &loaded.errors {
                eprintln!("warning: {e}");
            }
            let settings = node.apply(loaded.test_config.map(|t| t.settings))?;
            let mode = match mode {
                EmitMode::Iptables => emit::Mode::Iptables,
                EmitMode::Nftables => emit::Mode::Nftables,
                EmitMode::Ipvs => emit::Mode::Ipvs,
                EmitMode::Userspace => emit::Mode::Userspace,
            };
            print!("{}", emit::render(mode, &loaded.model, &settings));
            Ok(())
        }
    }
}

fn run_client(what: ClientCommand) -> Result<()> {
    match what {
        ClientCommand::Flows { requests, targets } => {
            print!(
                "{}",
                lb_userspace::compare::client_flows(requests, &targets)
                    .map_err(anyhow::Error::msg)?
            );
        }
        ClientCommand::Load { phase_ms, target } => {
            use lb_userspace::lab::load;
            if !load::wait_ready(target, Duration::from_secs(10)) {
                bail!("{target} never accepted a connection within 10 s");
            }
            println!(
                "{}",
                load::measure(target, Duration::from_millis(phase_ms)).line()
            );
        }
    }
    Ok(())
}

fn run_cleanup(bpffs: &std::path::Path) -> Result<()> {
    let removed =
        cleanup::cleanup(bpffs).with_context(|| format!("cleanup of {}", bpffs.display()))?;
    println!(
        "removed {} link(s) and {} map(s) under {}",
        removed.links.len(),
        removed.maps.len(),
        bpffs.display()
    );
    Ok(())
}

fn show<T: list::TableRow + serde::Serialize>(rows: &[T], output: Output) -> Result<()> {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(rows)?),
        Output::Table => print!("{}", list::render(rows)),
    }
    Ok(())
}

fn run_list(what: ListWhat, output: Output, bpffs: &std::path::Path) -> Result<()> {
    let ctx = || format!("reading pinned maps in {}", bpffs.display());
    match what {
        ListWhat::Services => show(&list::services(bpffs).with_context(ctx)?, output),
        ListWhat::Backends => show(&list::backends(bpffs).with_context(ctx)?, output),
        ListWhat::Conntrack => show(&list::conntrack(bpffs).with_context(ctx)?, output),
        ListWhat::Counters => show(&list::counters(bpffs).with_context(ctx)?, output),
    }
}
