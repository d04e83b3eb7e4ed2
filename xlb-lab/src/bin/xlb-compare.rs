//! `xlb-compare`: the same services through xlb's datapath and kube-proxy's iptables,
//! nftables and userspace modes, each in its own lab (network namespaces, a cgroup of its
//! own), and side by side what each did. It runs `xlb` (the agent, the userspace proxy) and
//! `xlb-probe` (the clients) as processes: both beside this binary, or `--xlb` /
//! `$XLB_BIN` and `$XLB_PROBE`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Parser;
use xlb_lab::compare::{CompareOptions, Impl, compare};

/// Run the same services through xlb's datapath and kube-proxy's iptables, nftables and
/// userspace modes, each in its own namespaces, and show side by side what each did.
#[derive(Parser)]
#[command(name = "xlb-compare", version)]
struct Args {
    /// `file:PATH` (Kubernetes YAML, or a kube-proxy conformance case).
    #[arg(long)]
    source: String,
    /// Requests per flow and mode (enough that random balancing reaches every backend).
    #[arg(long, default_value_t = 40)]
    requests: usize,
    /// This node's name when the file has no TestConfig header.
    #[arg(long, default_value = "node1")]
    node_name: String,
    /// The `xlb` binary (default: `$XLB_BIN`, else `xlb` beside this binary).
    #[arg(long, env = "XLB_BIN")]
    xlb: Option<PathBuf>,
}

fn source_file(source: &str) -> Result<PathBuf> {
    match source.split_once(':') {
        Some(("file", path)) if !path.is_empty() => Ok(PathBuf::from(path)),
        _ => bail!("unsupported --source {source:?}: expected file:PATH"),
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let xlb = match args.xlb {
        Some(p) => p,
        None => std::env::current_exe()
            .context("this binary's path")?
            .with_file_name("xlb"),
    };
    if !xlb.exists() {
        bail!(
            "{} not found: build it (`cargo xtask build`) or pass --xlb",
            xlb.display()
        );
    }
    let opts = CompareOptions {
        source: source_file(&args.source)?,
        node_name: args.node_name,
        requests: args.requests,
        modes: Impl::ALL.to_vec(),
        xlb,
        tag: format!("xcmp{}", std::process::id()),
    };
    let report = compare(&opts)?;
    print!("{}", report.render());
    println!(
        "{} flows, {} where the modes disagree",
        report.flows.len(),
        report.disagreements().len()
    );
    Ok(())
}
