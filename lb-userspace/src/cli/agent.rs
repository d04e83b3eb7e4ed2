//! `xlb agent`: its flags, and how flags, the environment and the config file combine into
//! the agent's options (a flag or its variable wins, then the config file, then the default).

use std::{path::PathBuf, time::Duration};

use anyhow::{Context, Result};
use lb_userspace::{
    DEFAULT_BPFFS_DIR,
    agent::{
        self, AgentOptions, DatapathOptions, InterfaceOptions, NodeOptions, ServerOptions,
        SocketOptions, SourceSpec,
    },
    config::{AgentConfig, KernelConntrack},
    datapath::{attach::XdpSetting, socket::SocketLb},
    serve::status::{PROXY_MODE, Status},
    source::kube::KubeOptions,
};

use super::{bind_address, node_name, port_range, source_file, stop_flag};

/// Load and attach the datapath, then keep its maps in sync with the source.
#[derive(clap::Args)]
pub struct AgentArgs {
    /// Where services come from: `file:PATH` (Kubernetes YAML) or `kubernetes`.
    #[arg(long, env = "XLB_SOURCE")]
    pub source: Option<String>,
    /// kubeconfig for `--source kubernetes` (default: in-cluster, then $KUBECONFIG).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Serve only Services labelled service.kubernetes.io/service-proxy-name=NAME.
    #[arg(long, env = "XLB_SERVICE_PROXY_NAME")]
    pub service_proxy_name: Option<String>,
    /// This node's name (default: $NODE_NAME, else the hostname).
    #[arg(long, env = "XLB_HOSTNAME_OVERRIDE")]
    pub hostname_override: Option<String>,
    /// Smallest interval between two syncs (of either source), in milliseconds
    /// [default: 100, or the config file's minSyncPeriod].
    #[arg(long, env = "XLB_MIN_SYNC_PERIOD_MS")]
    pub min_sync_period_ms: Option<u64>,
    /// A KubeProxyConfiguration-style YAML file (hostnameOverride, clusterCIDR,
    /// nodePortAddresses, minSyncPeriod, healthz/metrics bind addresses, conntrack);
    /// flags override it; an unknown key is an error.
    #[arg(long, env = "XLB_CONFIG")]
    pub config: Option<PathBuf>,
    /// Glob(s) of pod-facing interfaces to attach to, comma-separated (e.g. `veth*,lxc*`).
    #[arg(long, env = "XLB_POD_INTERFACES", default_value = "")]
    pub pod_interfaces: String,
    /// Node interfaces where NodePort traffic and replies from remote backends arrive,
    /// comma-separated.
    #[arg(long, env = "XLB_NODE_INTERFACES", value_delimiter = ',')]
    pub node_interfaces: Vec<String>,
    /// Addresses NodePorts are served on, IPv4 and IPv6 (default: the node interfaces'
    /// addresses of both families, IPv6 ones global).
    #[arg(long, env = "XLB_NODEPORT_ADDRESSES", value_delimiter = ',')]
    pub nodeport_addresses: Vec<std::net::IpAddr>,
    /// Pin directory on bpffs.
    #[arg(long, env = "XLB_BPFFS", default_value = DEFAULT_BPFFS_DIR)]
    pub bpffs: PathBuf,
    /// How often the source file and the interfaces are looked at when inotify or rtnetlink
    /// is unavailable, in milliseconds (with both, nothing is polled).
    #[arg(long, env = "XLB_POLL_MS", default_value_t = 100)]
    pub poll_ms: u64,
    /// Where to serve /healthz and /livez ("" to disable) [default: 0.0.0.0:10256].
    #[arg(long, env = "XLB_HEALTHZ_BIND_ADDRESS")]
    pub healthz_bind_address: Option<String>,
    /// Where to serve /metrics ("" to disable) [default: 127.0.0.1:10249].
    #[arg(long, env = "XLB_METRICS_BIND_ADDRESS")]
    pub metrics_bind_address: Option<String>,
    /// Adds per-service series to /metrics (packets and bytes per service port), for at
    /// most MAX service ports in name order [MAX default: 10000]; without it /metrics has
    /// node-level series only. A scrape then reads every service port's name and counters.
    #[arg(
        long,
        env = "XLB_METRICS_PER_SERVICE",
        value_name = "MAX",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "10000"
    )]
    pub metrics_per_service: Option<usize>,
    /// Source ports for flows SNATed to the node (externalTrafficPolicy Cluster to a
    /// remote backend), `MIN-MAX`; keep it outside net.ipv4.ip_local_port_range.
    #[arg(long, env = "XLB_SNAT_PORT_RANGE", default_value = "61000-65535")]
    pub snat_port_range: String,
    /// The source a pod reaching itself through a service is SNATed to ("" to disable).
    #[arg(long, env = "XLB_HAIRPIN_ADDRESS", default_value = "169.254.42.1")]
    pub hairpin_address: String,
    /// The source a pod reaching itself through a service over IPv6 is SNATed to ("" to
    /// disable): routed through the pod's default route, so its replies come back to tc.
    #[arg(long, env = "XLB_HAIRPIN_ADDRESS6", default_value = "fd00:a9fe:2a::1")]
    pub hairpin_address6: String,
    /// XDP on the node interfaces: `native` (in the driver, generic where the driver
    /// cannot), `generic`, or `off` (tc does everything; the same behaviour, slower).
    #[arg(long, env = "XLB_XDP", value_enum, default_value_t = XdpSetting::Off)]
    pub xdp: XdpSetting,
    /// Connect-time load balancing in cgroup socket hooks: `all` (the node's processes,
    /// hostNetwork pods and pods' sockets), `host` (only the agent's network namespace;
    /// pods are left to tc), or `off` (the node itself does not reach services).
    #[arg(long, env = "XLB_SOCKET_LB", value_enum, default_value_t = SocketLb::All)]
    pub socket_lb: SocketLb,
    /// The cgroup v2 directory the socket hooks attach to: every process below it is
    /// served [default: the cgroup v2 root from the mounts, e.g. /sys/fs/cgroup].
    #[arg(long, env = "XLB_CGROUP_PATH")]
    pub cgroup_path: Option<PathBuf>,
    /// Conntrack flows per CPU (kube-proxy's --conntrack-max-per-core; 0: use the
    /// minimum) [default: 32768, or the config file's conntrack.maxPerCore].
    #[arg(long, env = "XLB_CONNTRACK_MAX_PER_CORE")]
    pub conntrack_max_per_core: Option<u32>,
    /// Conntrack flows at least (kube-proxy's --conntrack-min) [default: 131072, or the
    /// config file's conntrack.min]. The map holds two entries a flow.
    #[arg(long, env = "XLB_CONNTRACK_MIN")]
    pub conntrack_min: Option<u32>,
    /// Service map entries (a frontend takes one per scope) [default: 65536, or the size
    /// of the map pinned by an earlier agent].
    #[arg(long, env = "XLB_SERVICE_MAP_MAX")]
    pub service_map_max: Option<u32>,
    /// Slot array entries: every frontend's backend slots, 4 bytes each, in ranges of a
    /// power of two (a frontend of 10 backends takes 16).
    #[arg(long, env = "XLB_SLOT_MAP_MAX", default_value_t = lb_common::SLOT_MAP_CAPACITY)]
    pub slot_map_max: u32,
    /// Service ports (frontends) the per-service arrays (names, counters) hold [default:
    /// --service-map-max, at least 65536; or the size pinned by an earlier agent].
    #[arg(long, env = "XLB_SERVICE_PORTS_MAX")]
    pub service_ports_max: Option<u32>,
    /// Backend map entries.
    #[arg(long, env = "XLB_BACKEND_MAP_MAX", default_value_t = lb_common::BACKEND_MAP_CAPACITY)]
    pub backend_map_max: u32,
    /// ClientIP affinity entries (one per client and service).
    #[arg(long, env = "XLB_AFFINITY_MAP_MAX", default_value_t = lb_common::AFFINITY_MAP_CAPACITY)]
    pub affinity_map_max: u32,
    /// How a NodePort, externalIP or LoadBalancer frontend picks the backend of a new flow:
    /// `random` (kube-proxy's), or `maglev` (consistent hashing of the 5-tuple: every node
    /// picks the same backend, as Cilium's loadBalancer.algorithm=maglev). A Service's
    /// annotation service.cilium.io/lb-algorithm overrides it. ClusterIP traffic picks at
    /// random either way.
    #[arg(long, env = "XLB_LB_ALGORITHM", value_enum, default_value_t = LbAlgorithmArg::Random)]
    pub lb_algorithm: LbAlgorithmArg,
    /// Entries of each Maglev table (a prime: 251, 509, 1021, 2039, 4093, 8191 or 16381,
    /// Cilium's default); about 100 × a Service's largest backend count keeps every
    /// backend's share within 1%.
    #[arg(long, env = "XLB_MAGLEV_TABLE_SIZE", default_value_t = lb_userspace::desired::maglev::DEFAULT_TABLE_SIZE)]
    pub maglev_table_size: u32,
    /// The seed of the Maglev permutations: every node of the cluster must use the same.
    #[arg(long, env = "XLB_MAGLEV_HASH_SEED", default_value = lb_userspace::desired::DEFAULT_MAGLEV_SEED)]
    pub maglev_hash_seed: String,
    /// How a flow of a NodePort, externalIP or LoadBalancer frontend (externalTrafficPolicy
    /// Cluster) reaches a backend on another node: `snat` (to this node, kube-proxy's),
    /// `dsr` (direct server return, IPv4 TCP and UDP: the backend sees the client and its
    /// node answers it directly; every node must run xlb), or `hybrid` (DSR for TCP, SNAT
    /// for UDP), as Cilium's loadBalancer.mode.
    #[arg(long, env = "XLB_LB_MODE", value_enum, default_value_t = lb_userspace::agent::LbMode::Snat)]
    pub lb_mode: lb_userspace::agent::LbMode,
    /// Maglev tables the map holds (one per frontend using Maglev; 64 KiB of kernel memory
    /// each, allocated as written). A frontend past it picks at random and is reported.
    #[arg(long, env = "XLB_MAGLEV_MAP_MAX", default_value_t = lb_common::MAGLEV_MAP_CAPACITY)]
    pub maglev_map_max: u32,
    /// The programs' own debug log: `debug` logs each packet's decision (reason, action,
    /// the packet as it leaves) into this log under target `xlb::bpf`; `off` costs the
    /// programs a flag test. Meant for a while, on a node under study: one line per packet.
    #[arg(long, env = "XLB_BPF_LOG", value_enum, default_value_t = BpfLog::Off)]
    pub bpf_log: BpfLog,
    /// Take over from a running (or stopped) kube-proxy on this node: its flows (from the
    /// kernel's conntrack) become xlb's before xlb's programs attach, then its rules are
    /// removed, so no connection breaks.
    #[arg(long, env = "XLB_TAKEOVER_FROM", value_enum)]
    pub takeover_from: Option<TakeoverFrom>,
    /// Shadow mode, beside a running kube-proxy: load nothing, change nothing; read
    /// kube-proxy's live rules (iptables, nftables or IPVS, both families) every
    /// --shadow-interval and report where they and xlb would treat a service differently
    /// for longer than --shadow-grace (`xlb shadow report`, /shadow and /metrics).
    #[arg(long, env = "XLB_SHADOW", conflicts_with = "takeover_from")]
    pub shadow: bool,
    /// Seconds between two looks at kube-proxy's state in shadow mode.
    #[arg(
        long,
        env = "XLB_SHADOW_INTERVAL",
        default_value_t = 10.0,
        value_name = "SECONDS"
    )]
    pub shadow_interval: f64,
    /// Seconds a divergence lasts before shadow mode reports it (kube-proxy's sync period).
    #[arg(
        long,
        env = "XLB_SHADOW_GRACE",
        default_value_t = 30.0,
        value_name = "SECONDS"
    )]
    pub shadow_grace: f64,
    /// Where shadow mode writes its report (JSON).
    #[arg(long, env = "XLB_SHADOW_REPORT", default_value = lb_userspace::shadow::DEFAULT_REPORT)]
    pub shadow_report: PathBuf,
    /// Remove everything xlb installed and exit.
    #[arg(long)]
    pub cleanup: bool,
}

/// `--takeover-from`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TakeoverFrom {
    KubeProxy,
}

/// `--lb-algorithm` (the model's `LbAlgorithm`, which the Service annotation also names).
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LbAlgorithmArg {
    Random,
    Maglev,
}

impl From<LbAlgorithmArg> for lb_userspace::model::LbAlgorithm {
    fn from(a: LbAlgorithmArg) -> Self {
        match a {
            LbAlgorithmArg::Random => Self::Random,
            LbAlgorithmArg::Maglev => Self::Maglev,
        }
    }
}

/// `--bpf-log`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BpfLog {
    Off,
    Debug,
}

/// `--lb-algorithm`, `--maglev-table-size`, `--maglev-hash-seed`, checked.
fn lb_settings(
    algorithm: LbAlgorithmArg,
    size: u32,
    seed: String,
) -> Result<lb_userspace::desired::LbSettings> {
    use lb_userspace::desired::maglev::TABLE_SIZES;
    let algorithm = algorithm.into();
    if !TABLE_SIZES.contains(&size) {
        anyhow::bail!("--maglev-table-size {size}: not one of the accepted primes {TABLE_SIZES:?}");
    }
    if seed.is_empty() {
        anyhow::bail!("--maglev-hash-seed: empty");
    }
    Ok(lb_userspace::desired::LbSettings {
        algorithm,
        maglev_size: size,
        maglev_seed: seed.into(),
    })
}

/// Runs the agent (or, with `--cleanup`, removes what it installed).
pub fn run(args: AgentArgs) -> Result<()> {
    if args.cleanup {
        return super::list::cleanup(&args.bpffs);
    }
    let opts = options(args)?;
    agent::run(&opts, &*stop_flag()?)?;
    Ok(())
}

/// The agent's options from its flags and the config file they name.
/// The map sizes `args` and `config` ask for on `cpus` CPUs.
fn map_sizes(
    args: &AgentArgs,
    config: &AgentConfig,
    cpus: u32,
) -> lb_userspace::datapath::sizes::MapSizes {
    let (per_core, min) = (args.conntrack_max_per_core, args.conntrack_min);
    let services = args.service_map_max.unwrap_or(lb_common::SVC_MAP_CAPACITY);
    lb_userspace::datapath::sizes::MapSizes {
        conntrack: config.conntrack_entries(per_core, min, cpus),
        services,
        slots: args.slot_map_max.max(1),
        backends: args.backend_map_max,
        affinity: args.affinity_map_max,
        service_ports: (args.service_ports_max)
            .unwrap_or_else(|| lb_userspace::datapath::sizes::service_ports_for(services)),
        maglev: args.maglev_map_max.max(1),
        filter: None,
        services_asked: args.service_map_max.is_some(),
        service_ports_asked: args.service_ports_max.is_some(),
    }
}

fn options(args: AgentArgs) -> Result<AgentOptions> {
    let source = (args.source.as_deref())
        .context("--source file:PATH or --source kubernetes is required")?;
    let config = match &args.config {
        Some(path) => AgentConfig::load(path)?,
        None => AgentConfig::default(),
    };
    let (per_core, min) = (args.conntrack_max_per_core, args.conntrack_min);
    let cpus = aya::util::nr_cpus().map_or(1, |n| n as u32);
    let map_sizes = map_sizes(&args, &config, cpus);
    let kernel_conntrack = config.kernel_conntrack(per_core, min, cpus);
    let lb = lb_settings(
        args.lb_algorithm,
        args.maglev_table_size,
        args.maglev_hash_seed,
    )?;
    let nodeport_addresses = config.node_port_addresses(args.nodeport_addresses);
    let min_sync = config.min_sync_or(args.min_sync_period_ms);
    let healthz_bind_address = config.healthz(args.healthz_bind_address);
    let metrics_bind_address = config.metrics(args.metrics_bind_address);
    let node_name = node_name(config.hostname(args.hostname_override));
    let source = if source == "kubernetes" {
        SourceSpec::Kubernetes(KubeOptions {
            kubeconfig: args.kubeconfig,
            service_proxy_name: args.service_proxy_name,
            node_name: node_name.clone(),
            min_sync,
        })
    } else {
        SourceSpec::File(source_file(source)?)
    };
    let status = Status::new(
        PROXY_MODE,
        &configz(&Effective {
            config: &config,
            node_name: &node_name,
            node_port_addresses: &nodeport_addresses,
            min_sync,
            healthz: &healthz_bind_address,
            metrics: &metrics_bind_address,
            conntrack: &kernel_conntrack,
            per_core,
            min,
        }),
    );
    Ok(AgentOptions {
        source,
        node: NodeOptions {
            name: node_name,
            node_port_addresses: nodeport_addresses,
            lb,
        },
        datapath: DatapathOptions {
            bpffs: args.bpffs,
            map_sizes,
            snat_ports: port_range(&args.snat_port_range)?,
            hairpin_address: optional_address(&args.hairpin_address, "--hairpin-address", "IPv4")?,
            hairpin_address6: optional_address(
                &args.hairpin_address6,
                "--hairpin-address6",
                "IPv6",
            )?,
            bpf_log: args.bpf_log == BpfLog::Debug,
            lb_mode: args.lb_mode,
            kernel_conntrack,
        },
        interfaces: InterfaceOptions {
            pod_interfaces: args.pod_interfaces,
            node_interfaces: args.node_interfaces,
            xdp: args.xdp,
        },
        sockets: SocketOptions {
            socket_lb: args.socket_lb,
            cgroup_path: args.cgroup_path,
        },
        servers: ServerOptions {
            healthz_addr: bind_address(&healthz_bind_address)?,
            metrics_addr: bind_address(&metrics_bind_address)?,
            metrics_per_service: args.metrics_per_service,
            status,
        },
        poll: Duration::from_millis(args.poll_ms.max(10)),
        min_sync,
        takeover_from_kube_proxy: args.takeover_from == Some(TakeoverFrom::KubeProxy),
        shadow: match args.shadow {
            true => Some(agent::ShadowOptions {
                interval: seconds(args.shadow_interval, "--shadow-interval")?,
                grace: seconds(args.shadow_grace, "--shadow-grace")?,
                report: args.shadow_report,
            }),
            false => None,
        },
    })
}

/// What `/configz` shows: the settings in force, after flags, the file and defaults.
struct Effective<'a> {
    config: &'a AgentConfig,
    node_name: &'a str,
    node_port_addresses: &'a [std::net::IpAddr],
    min_sync: Duration,
    healthz: &'a str,
    metrics: &'a str,
    conntrack: &'a KernelConntrack,
    per_core: Option<u32>,
    min: Option<u32>,
}

/// The effective configuration as kube-proxy's `/configz` shows its own: a
/// KubeProxyConfiguration under the group name, in its field names.
fn configz(e: &Effective<'_>) -> serde_json::Value {
    use lb_userspace::{config::go_duration, datapath::sizes};
    let ct = e.config.conntrack.clone().unwrap_or_default();
    let secs = |s: u64| go_duration(Duration::from_secs(s));
    serde_json::json!({
        "kubeproxy.config.k8s.io": {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": PROXY_MODE,
            "hostnameOverride": e.node_name,
            "clusterCIDR": e.config.cluster_cidr.clone().unwrap_or_default(),
            "nodePortAddresses": e.node_port_addresses,
            "minSyncPeriod": go_duration(e.min_sync),
            "healthzBindAddress": e.healthz,
            "metricsBindAddress": e.metrics,
            "conntrack": {
                "maxPerCore": e.per_core.or(ct.max_per_core).unwrap_or(sizes::CONNTRACK_MAX_PER_CORE),
                "min": e.min.or(ct.min).unwrap_or(sizes::CONNTRACK_MIN),
                "tcpEstablishedTimeout": secs(e.conntrack.tcp_established_s),
                "tcpCloseWaitTimeout": secs(e.conntrack.tcp_close_wait_s),
                "tcpBeLiberal": e.conntrack.tcp_be_liberal,
                "udpTimeout": secs(e.conntrack.udp_s),
                "udpStreamTimeout": secs(e.conntrack.udp_stream_s),
            },
        }
    })
}

/// A flag's seconds as a duration (at least a tenth of a second).
fn seconds(s: f64, flag: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| *d >= Duration::from_millis(100))
        .with_context(|| format!("{flag} {s}: give at least 0.1 seconds"))
}

/// An address flag's value (`family` names the kind in the error); empty: none.
fn optional_address<T: std::str::FromStr>(text: &str, flag: &str, family: &str) -> Result<Option<T>>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    if text.is_empty() {
        return Ok(None);
    }
    text.parse()
        .map(Some)
        .with_context(|| format!("{flag} {text:?} is not an {family} address"))
}
