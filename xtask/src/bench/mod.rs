//! `cargo xtask bench NAME`: bounded benchmarks of the datapath, the control plane and memory.
//!
//! Every bench repeats its measurements over several trials, prints a table of medians with
//! min and max, computes ratios only from numbers measured in the same run, replaces its own
//! section of `docs/benchmarks.md` and draws an SVG plot into `docs/`.
//!
//! Benches run in a release build: a debug `xtask` rebuilds itself with `--release` and runs
//! that binary instead. Everything with traffic or rules lives in network namespaces named
//! after the run; pins go under `/sys/fs/bpf/<tag>`; both are removed on success and failure.
//! `shadow` is pure computation (kube-proxy's rules as text): it needs neither root, the
//! eBPF object nor the `xlb` binary.

mod agent;
mod datapath;
mod fixture;
mod memory;
mod metrics;
mod nft_json;
mod northsouth;
mod pps;
mod report;
mod shadow;
mod sync;
mod traffic;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result, bail};

use crate::build::{is_root, workspace_root};

/// The benches `all` runs, in priority order.
const ALL: [&str; 7] = [
    "datapath",
    "sync",
    "memory",
    "metrics",
    "traffic",
    "northsouth",
    "shadow",
];

/// Benches run by another one, which can also be run alone: `pps` (run by `northsouth`).
const PARTS: [&str; 1] = ["pps"];

/// The benches that need no root, no eBPF object and no `xlb` binary.
pub const PURE: [&str; 1] = ["shadow"];

/// Runs bench `name` (one of [`ALL`] or `all`); `xlb` is the release binary.
pub fn run(xlb: &Path, name: &str) -> Result<()> {
    if !ALL.contains(&name) && !PARTS.contains(&name) && name != "all" {
        bail!("unknown bench {name:?}: expected one of {ALL:?}, {PARTS:?} or \"all\"");
    }
    if !is_root() && !PURE.contains(&name) {
        bail!("benches need root (BPF maps, BPF_PROG_TEST_RUN, network namespaces)");
    }
    if cfg!(debug_assertions) {
        return rerun_release(xlb, name);
    }
    let names: Vec<&str> = if name == "all" {
        ALL.to_vec()
    } else {
        vec![name]
    };
    let command = format!("cargo xtask bench {name}");
    for bench in names {
        let started = Instant::now();
        println!("\n== bench {bench} ==");
        let section = match bench {
            "datapath" => {
                let (section, full) = datapath::run()?;
                if !full {
                    println!("{}", section.body);
                    println!("bench datapath: a quick subset, docs/benchmarks.md left alone");
                    continue;
                }
                section
            }
            "sync" => match sync::run(xlb)? {
                Some(section) => section,
                None => continue,
            },
            "traffic" => traffic::run(xlb)?,
            "northsouth" | "pps" => {
                let (trials, full) = trials(3)?;
                let mut sections = Vec::new();
                if bench == "northsouth" {
                    sections.push(("northsouth", northsouth::run()?.0));
                }
                sections.push(("pps", pps::run(trials)?));
                for (name, section) in sections {
                    match full {
                        true => report::write_section(name, &command, &section)?,
                        false => println!("{}", section.body),
                    }
                }
                match full {
                    true => println!(
                        "bench {bench}: {:.0} s; docs/benchmarks.md updated",
                        started.elapsed().as_secs_f64()
                    ),
                    false => println!("bench {bench}: fewer trials, docs/benchmarks.md left alone"),
                }
                continue;
            }
            "metrics" => metrics::run(xlb)?,
            "shadow" => shadow::run()?,
            _ => memory::run(xlb)?,
        };
        report::write_section(bench, &command, &section)?;
        println!(
            "bench {bench}: {:.0} s; docs/benchmarks.md updated",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// The target directory cargo builds into.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Builds `xtask` with `--release` and runs `xtask bench NAME` from that build (with
/// `XLB_BIN` = `xlb`, the agent binary the labs run).
fn rerun_release(xlb: &Path, name: &str) -> Result<()> {
    println!("xtask: benches run in release; building xtask --release");
    crate::build::run(
        Command::new("cargo")
            .args(["build", "--release", "--package", "xtask"])
            .env("XLB_EBPF_OBJECT", crate::build::ebpf_object()),
    )?;
    let exe = target_dir().join("release").join("xtask");
    let status = Command::new(&exe)
        .args(["bench", name])
        .env("XLB_BIN", xlb)
        .status()
        .with_context(|| format!("cannot start {}", exe.display()))?;
    if !status.success() {
        bail!("{} bench {name} failed with {status}", exe.display());
    }
    Ok(())
}

/// The trials a bench runs (`XLB_BENCH_TRIALS`, else `default`) and whether the run is the
/// full one, whose sections go to docs/benchmarks.md.
fn trials(default: usize) -> Result<(usize, bool)> {
    match std::env::var("XLB_BENCH_TRIALS") {
        Ok(t) => {
            let n: usize = t.parse().with_context(|| format!("XLB_BENCH_TRIALS={t}"))?;
            Ok((n.max(1), n == default))
        }
        Err(_) => Ok((default, true)),
    }
}

/// Median, min and max of a set of trial results.
#[derive(Clone, Copy, Debug, Default)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    /// Summarizes `xs` (empty → zeros).
    pub fn of(xs: &[f64]) -> Self {
        if xs.is_empty() {
            return Self::default();
        }
        let mut v = xs.to_vec();
        v.sort_by(f64::total_cmp);
        Self {
            median: percentile_sorted(&v, 50.0),
            min: v[0],
            max: v[v.len() - 1],
        }
    }

    /// `median [min–max]` with `digits` decimals.
    pub fn show(&self, digits: usize) -> String {
        format!(
            "{:.d$} [{:.d$}–{:.d$}]",
            self.median,
            self.min,
            self.max,
            d = digits
        )
    }
}

/// The `p`th percentile (nearest rank, 0..=100) of sorted values.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The `p`th percentile of unsorted values.
pub fn percentile(xs: &[f64], p: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    percentile_sorted(&v, p)
}

/// `met` or `MISSED`, for target lines.
pub fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}
