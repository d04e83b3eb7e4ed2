//! The `xlb` command line: one module per subcommand; flags, the environment and the config
//! file combine in `agent` (and `lb_userspace::config`).

mod agent;
mod emit;
mod list;
mod proxy;
mod shadow;
mod trace;

use std::{
    path::PathBuf,
    sync::{Arc, atomic::AtomicBool},
};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

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

#[derive(Subcommand)]
enum Command {
    Agent(Box<agent::AgentArgs>),
    List(list::ListArgs),
    Desired(emit::DesiredArgs),
    Emit(Box<emit::EmitArgs>),
    Proxy(proxy::ProxyArgs),
    Cleanup(list::CleanupArgs),
    Trace(Box<trace::TraceArgs>),
    #[command(subcommand)]
    Shadow(shadow::ShadowCommand),
}

/// Parses the command line and runs the subcommand.
pub fn run() -> Result<()> {
    match Cli::parse().command {
        Command::Agent(args) => agent::run(*args),
        Command::List(args) => list::run(args),
        Command::Desired(args) => emit::run_desired(args),
        Command::Emit(args) => emit::run(*args),
        Command::Proxy(args) => proxy::run_proxy(args),
        Command::Cleanup(args) => list::run_cleanup(&args),
        Command::Trace(args) => trace::run(*args),
        Command::Shadow(cmd) => shadow::run(cmd),
    }
}

/// A flag set by SIGINT or SIGTERM.
fn stop_flag() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("install signal handler")?;
    }
    Ok(stop)
}

/// `MIN-MAX` as an inclusive port range (1 ≤ MIN ≤ MAX).
pub(crate) fn port_range(text: &str) -> anyhow::Result<std::ops::RangeInclusive<u16>> {
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
pub(crate) fn node_name(flag: Option<String>) -> String {
    flag.or_else(|| std::env::var("NODE_NAME").ok())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_default()
}

/// An optional `IP:PORT` ("" disables).
pub(crate) fn bind_address(s: &str) -> Result<Option<std::net::SocketAddr>> {
    if s.is_empty() {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .with_context(|| format!("{s:?} is not an IP:PORT bind address"))
}

pub(crate) fn source_file(source: &str) -> Result<PathBuf> {
    match source.split_once(':') {
        Some(("file", path)) if !path.is_empty() => Ok(PathBuf::from(path)),
        _ => bail!("unsupported --source {source:?}: expected file:PATH or kubernetes"),
    }
}
