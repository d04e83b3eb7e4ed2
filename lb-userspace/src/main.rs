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
    cleanup, desired, list,
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
        /// Smallest interval between two syncs from the API server, in milliseconds.
        #[arg(long, env = "XLB_MIN_SYNC_PERIOD_MS", default_value_t = 100)]
        min_sync_period_ms: u64,
        /// Glob(s) of pod-facing interfaces to attach to, comma-separated (e.g. `veth*,lxc*`).
        #[arg(long, env = "XLB_POD_INTERFACES", default_value = "")]
        pod_interfaces: String,
        /// Node interfaces where replies from remote backends arrive, comma-separated.
        #[arg(long, env = "XLB_NODE_INTERFACES", value_delimiter = ',')]
        node_interfaces: Vec<String>,
        /// Pin directory on bpffs.
        #[arg(long, env = "XLB_BPFFS", default_value = DEFAULT_BPFFS_DIR)]
        bpffs: PathBuf,
        /// Poll interval for the source file and interfaces, in milliseconds.
        #[arg(long, env = "XLB_POLL_MS", default_value_t = 100)]
        poll_ms: u64,
                /// Where to serve /healthz and /livez ("" to disable).
        #[arg(long, env = "XLB_HEALTHZ_BIND_ADDRESS", default_value = "0.0.0.0:10256")]
        healthz_bind_address: String,
        /// Where to serve /metrics ("" to disable).
        #[arg(long, env = "XLB_METRICS_BIND_ADDRESS", default_value = "127.0.0.1:10249")]
        metrics_bind_address: String,
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
    /// Detach and unpin everything xlb installed.
    Cleanup {
        #[arg(long, default_value = DEFAULT_BPFFS_DIR)]
        bpffs: PathBuf,
    },
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

fn main() -> Result<()> {
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
            pod_interfaces,
            node_interfaces,
                        bpffs,
            poll_ms,
            healthz_bind_address,
            metrics_bind_address,
            cleanup: false,
        } => {
            let source = source.context("--source file:PATH or --source kubernetes is required")?;
            let source = if source == "kubernetes" {
                SourceSpec::Kubernetes(KubeOptions {
                    kubeconfig,
                    service_proxy_name,
                    node_name: node_name(hostname_override),
                    min_sync: Duration::from_millis(min_sync_period_ms),
                })
            } else {
                SourceSpec::File(source_file(&source)?)
            };
            let opts = AgentOptions {
                source,
                pod_interfaces,
                node_interfaces,
                bpffs,
                                poll: Duration::from_millis(poll_ms.max(10)),
                healthz_addr: bind_address(&healthz_bind_address)?,
                metrics_addr: bind_address(&metrics_bind_address)?,
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
    }
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
