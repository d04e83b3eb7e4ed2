//! `xlb list` and `xlb cleanup`: the pinned maps in Kubernetes terms, and their removal.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::ValueEnum;
use lb_userspace::{DEFAULT_BPFFS_DIR, cleanup as clean, datapath::pins::Pins, list};

#[derive(Clone, Copy, ValueEnum)]
pub enum ListWhat {
    Services,
    Backends,
    Conntrack,
    Counters,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// Show what the pinned maps hold.
#[derive(clap::Args)]
pub struct ListArgs {
    what: ListWhat,
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[arg(long, default_value = DEFAULT_BPFFS_DIR)]
    bpffs: PathBuf,
}

/// Detach and unpin everything xlb installed; or, with `--kube-proxy`, remove kube-proxy's
/// rules instead.
#[derive(clap::Args)]
pub struct CleanupArgs {
    #[arg(long, default_value = DEFAULT_BPFFS_DIR)]
    pub bpffs: PathBuf,
    /// Remove kube-proxy's leftovers from this node's netfilter tables, as `kube-proxy
    /// --cleanup` does (its iptables chains and jumps of both families and backends, its
    /// nftables tables, `kube-ipvs0`); xlb's own pins are left alone.
    #[arg(long, conflicts_with = "hand_back")]
    pub kube_proxy: bool,
    /// Before removing xlb: write its live flows into the kernel's conntrack with their
    /// NAT (backend, masquerade source), so that kube-proxy's rules carry them on. Start
    /// kube-proxy and wait for its first sync, then hand back.
    #[arg(long)]
    pub hand_back: bool,
}

pub fn run_cleanup(args: &CleanupArgs) -> Result<()> {
    if args.kube_proxy {
        return cleanup_kube_proxy();
    }
    // The hand-back's notrack table lives until xlb is detached.
    let untracked = if args.hand_back {
        hand_back(&args.bpffs)?
    } else {
        None
    };
    cleanup(&args.bpffs)?;
    drop(untracked);
    if args.hand_back {
        // kube-proxy runs again: its own NAT chains keep the kernel's NAT hooks.
        lb_userspace::datapath::netfilter::release_nat_hooks()
            .context("removing the table that kept the kernel's NAT after a takeover")?;
    }
    Ok(())
}

/// `xlb cleanup --hand-back`'s first step: xlb's flows into the kernel's table; what keeps
/// their packets out of conntrack until xlb is detached.
fn hand_back(bpffs: &Path) -> Result<Option<lb_userspace::datapath::netfilter::Untracked>> {
    use lb_userspace::migrate::hand_back;
    if !bpffs.exists() {
        println!(
            "no xlb pins under {}: no flows to hand back",
            bpffs.display()
        );
        return Ok(None);
    }
    let context = || format!("handing back xlb's flows under {}", bpffs.display());
    let pins = Pins::open(bpffs).with_context(context)?;
    let mut done = hand_back::hand_back(&pins).with_context(context)?;
    let total: usize = done.flows.values().sum();
    if done.already > 0 {
        println!("{} flows were handed back already", done.already);
    }
    if total == 0 && done.failed == 0 && done.already == 0 {
        println!("no flows to hand back");
    } else {
        let by_proto: Vec<String> = done
            .flows
            .iter()
            .map(|((family, p), n)| {
                let name = lb_userspace::model::Protocol::from_number(*p)
                    .map_or_else(|| p.to_string(), |p| p.to_string());
                format!("{n} {name} over IPv{family}")
            })
            .collect();
        println!(
            "handed back {total} flows ({}) to the kernel's conntrack with their NAT",
            by_proto.join(", ")
        );
    }
    if let Some(first) = done.first_error {
        anyhow::bail!(
            "{} flows not handed back (xlb left in place): {first}",
            done.failed
        );
    }
    Ok(done.untracked.take())
}

/// `xlb cleanup --kube-proxy`: what was found, then removed; nothing found is said.
fn cleanup_kube_proxy() -> Result<()> {
    use lb_userspace::datapath::netfilter;
    let found = netfilter::find_kube_proxy().context("looking for kube-proxy's rules")?;
    if found.is_empty() {
        println!("no kube-proxy rules on this node: nothing to remove");
        return Ok(());
    }
    for what in found.describe() {
        println!("removing kube-proxy's {what}");
    }
    let errors = netfilter::remove_kube_proxy(&found);
    if let Some(first) = errors.first() {
        for e in &errors[1..] {
            eprintln!("xlb: {e}");
        }
        anyhow::bail!(
            "{} of kube-proxy's leftovers not removed: {first}",
            errors.len()
        );
    }
    let left = netfilter::find_kube_proxy().context("looking again for kube-proxy's rules")?;
    if !left.is_empty() {
        anyhow::bail!(
            "kube-proxy's rules are still there: {}",
            left.describe().join("; ")
        );
    }
    println!("kube-proxy's rules are gone");
    Ok(())
}

pub fn cleanup(bpffs: &Path) -> Result<()> {
    let removed =
        clean::cleanup(bpffs).with_context(|| format!("cleanup of {}", bpffs.display()))?;
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

pub fn run(args: ListArgs) -> Result<()> {
    let ctx = || format!("reading pinned maps in {}", args.bpffs.display());
    let pins = &Pins::open(&args.bpffs).with_context(ctx)?;
    let output = args.output;
    let named = !matches!(args.what, ListWhat::Counters);
    if let Some(why) = list::names_unavailable(pins).filter(|_| named) {
        eprintln!("xlb list: {why}");
    }
    match args.what {
        ListWhat::Services => show(&list::services(pins).with_context(ctx)?, output),
        ListWhat::Backends => show(&list::backends(pins).with_context(ctx)?, output),
        ListWhat::Conntrack => show(&list::conntrack(pins).with_context(ctx)?, output),
        ListWhat::Counters => show(&list::counters(pins).with_context(ctx)?, output),
    }
}
