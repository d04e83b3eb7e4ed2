//! `xlb shadow report`: what `xlb agent --shadow` found, from the report it writes.

use std::path::PathBuf;

use anyhow::{Context, Result};
use lb_userspace::shadow::{DEFAULT_REPORT, report::Report};

/// Shadow mode's findings (`xlb agent --shadow` beside kube-proxy).
#[derive(clap::Subcommand)]
pub enum ShadowCommand {
    /// Print the shadow agent's last report: kube-proxy's state found, the divergences past
    /// the grace period by service and reason, the rules not understood.
    Report(ReportArgs),
}

#[derive(clap::Args)]
pub struct ReportArgs {
    /// The report the agent writes (its --shadow-report).
    #[arg(long, env = "XLB_SHADOW_REPORT", default_value = DEFAULT_REPORT)]
    pub file: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Exit with status 3 when a divergence is reported (for scripts and probes).
    #[arg(long)]
    pub check: bool,
}

pub fn run(cmd: ShadowCommand) -> Result<()> {
    let ShadowCommand::Report(args) = cmd;
    let text = std::fs::read_to_string(&args.file).with_context(|| {
        format!(
            "no shadow report at {} (is `xlb agent --shadow` running, with this --shadow-report?)",
            args.file.display()
        )
    })?;
    let report: Report = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a shadow report", args.file.display()))?;
    if args.json {
        println!("{text}");
    } else {
        print!("{}", report.render());
    }
    if args.check && !report.divergences.is_empty() {
        std::process::exit(3);
    }
    Ok(())
}
