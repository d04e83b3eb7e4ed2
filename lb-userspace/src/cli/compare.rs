//! `xlb compare`, `xlb proxy userspace` and the labs' hidden `xlb client`: kube-proxy's modes
//! side by side with xlb's datapath.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use lb_userspace::emit::Mode;

use super::{source_file, stop_flag};

/// Run the same services through xlb's datapath and kube-proxy's iptables, nftables and
/// userspace modes, each in its own namespaces, and show side by side what each did.
#[derive(clap::Args)]
pub struct CompareArgs {
    /// `file:PATH` (Kubernetes YAML, or a kube-proxy conformance case).
    #[arg(long)]
    source: String,
    /// Requests per flow and mode (enough that random balancing reaches every backend).
    #[arg(long, default_value_t = 40)]
    requests: usize,
    /// This node's name when the file has no TestConfig header.
    #[arg(long, default_value = "node1")]
    node_name: String,
}

/// Run kube-proxy's userspace proxy (for comparison): accept on each service port's proxy
/// port (see `xlb emit userspace`) and splice to backends round-robin.
#[derive(clap::Args)]
pub struct ProxyArgs {
    /// Only `userspace` (the other modes are kernel rules, not a process).
    mode: Mode,
    /// `file:PATH`.
    #[arg(long)]
    source: String,
    /// First proxy port.
    #[arg(long, default_value_t = 36000)]
    port_range_start: u16,
    /// Last proxy port.
    #[arg(long, default_value_t = 39999)]
    port_range_end: u16,
}

#[derive(Subcommand)]
pub enum ClientCommand {
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

pub fn run(args: CompareArgs) -> Result<()> {
    let opts = lb_userspace::compare::CompareOptions {
        source: source_file(&args.source)?,
        node_name: args.node_name,
        requests: args.requests,
        modes: lb_userspace::compare::Impl::ALL.to_vec(),
        xlb: std::env::current_exe().context("the xlb binary's path")?,
        tag: format!("xcmp{}", std::process::id()),
    };
    let report = lb_userspace::compare::compare(&opts)?;
    print!("{}", report.render());
    println!(
        "{} flows, {} where the modes disagree",
        report.flows.len(),
        report.disagreements().len()
    );
    Ok(())
}

pub fn run_proxy(args: ProxyArgs) -> Result<()> {
    if args.mode != Mode::Userspace {
        bail!(
            "xlb proxy runs kube-proxy's userspace mode only; {} mode is rules (see xlb emit {})",
            args.mode.name(),
            args.mode.name()
        );
    }
    let range = lb_userspace::emit::userspace::PortRange {
        start: args.port_range_start,
        end: args.port_range_end,
    };
    lb_userspace::proxy::userspace::run(
        source_file(&args.source)?,
        lb_userspace::model::NodeSettings::default(),
        range,
        &*stop_flag()?,
    )?;
    Ok(())
}

pub fn run_client(what: ClientCommand) -> Result<()> {
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
