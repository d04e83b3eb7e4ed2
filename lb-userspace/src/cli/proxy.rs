//! `xlb proxy userspace`: kube-proxy's userspace proxy, for comparison with xlb's datapath
//! (`xlb-compare` in the `xlb-lab` crate runs it beside the other modes).

use anyhow::{Result, bail};
use lb_userspace::emit::Mode;

use super::{source_file, stop_flag};

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
