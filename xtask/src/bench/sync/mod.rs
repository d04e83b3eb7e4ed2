//! Bench `sync`: the control plane.
//!
//! * **cold full sync**: N services × M endpoints from an empty set of maps to programmed,
//!   through the agent's own path (`reconcile::Incremental::full` on the model, then
//!   `sync::apply_fresh` with `KernelMaps`, its writes batched), with the peak RSS that sync adds (VmHWM reset through
//!   `/proc/self/clear_refs` before, read after). The model is parsed from YAML beforehand
//!   (the source's work, reported apart).
//! * **kube-proxy, same services**: `iptables-restore` of a kube-proxy-shaped ruleset and
//!   `nft -f` of kube-proxy's nftables shape, each into a fresh network namespace (via
//!   `nsenter --net=/run/netns/NAME`, never the root namespace), generated from the same
//!   model by xlb's kube-proxy emitters (`lb_userspace::emit`).
//! * **one endpoint change → visible**: one service's slice loses an endpoint and gains a new
//!   one; the time from the source's event to the service and backend maps showing it (read
//!   back from the pinned maps, what the datapath reads), p50 and p99, at 100, 10,000 and
//!   100,000 services; beside it kube-proxy's nftables partial sync of the same change.
//! * **the agent**: RSS after its first sync and its CPU while idle.

mod change;
mod cold;
mod kube_proxy;
mod render;

use anyhow::Result;
use lb_userspace::emit::Mode;

use super::{Summary, report::Section};

/// (services, endpoints each) of the cold full syncs.
const COLD: [(usize, usize); 5] = [
    (1_000, 2),
    (5_000, 2),
    (10_000, 2),
    (10_000, 10),
    (100_000, 2),
];
const COLD_TRIALS: usize = 3;
/// Services × 2 endpoints restored with iptables-restore (10,000 takes ~90 s here: the
/// 10,000 figure is extrapolated from these).
const IPTABLES: [(usize, usize); 3] = [(1_000, 3), (2_500, 2), (5_000, 1)];
/// Services × 2 endpoints loaded with nft -f, and trials (5,000 takes ~8 s here: the
/// 10,000 figure is extrapolated too).
const NFT: [(usize, usize); 3] = [(1_000, 3), (2_500, 2), (5_000, 1)];
/// Endpoint-change runs: (services, endpoints each, changes).
const CHANGES: [(usize, usize, usize); 3] = [(100, 10, 300), (10_000, 10, 300), (100_000, 2, 300)];
/// kube-proxy's nftables partial syncs: services × 2 endpoints in the table, and changes.
const NFT_PARTIAL: (usize, usize) = (10_000, 5);
/// The agents whose RSS and idle CPU are measured: services × endpoints (the per-service
/// arrays are sized from the service map, which the bench sizes for the services).
const AGENT: [(usize, usize); 2] = [(10_000, 10), (100_000, 2)];
const IDLE_S: u64 = 20;
/// Pod veths created at once in the agent's namespace (attach latency, then idle with them).
const VETHS: usize = 250;

/// One cold full sync configuration's results.
pub(super) struct Cold {
    pub(super) services: usize,
    pub(super) endpoints: usize,
    pub(super) parse_s: f64,
    pub(super) compute_s: Summary,
    pub(super) apply_s: Summary,
    pub(super) total_s: Summary,
    pub(super) peak_mib: Summary,
    pub(super) hwm_mib: f64,
    /// Map writes (and deletes) of one sync.
    pub(super) writes: usize,
}

/// Timings of one kube-proxy-style load.
pub(super) struct Rules {
    pub(super) services: usize,
    pub(super) seconds: Summary,
    pub(super) rules: usize,
}

/// Endpoint change latency at one size.
pub(super) struct Change {
    pub(super) services: usize,
    pub(super) endpoints: usize,
    pub(super) total_ms: Vec<f64>,
    pub(super) compute_ms: Vec<f64>,
    pub(super) apply_ms: Vec<f64>,
}

/// The agent on a file of services: RSS, time to the first sync, idle CPU.
pub(super) struct AgentIdle {
    pub(super) services: usize,
    pub(super) endpoints: usize,
    pub(super) rss_mib: f64,
    pub(super) synced_s: f64,
    pub(super) idle_pct: f64,
    pub(super) attach_s: f64,
}

/// The sizes `XLB_BENCH_SCALES` names (`10000x10,100000x2`): a quick look at the cold syncs
/// and the agent's RSS of those sizes only, printed; `None` when unset (the full run).
fn quick_scales() -> Result<Option<Vec<(usize, usize)>>> {
    let Ok(list) = std::env::var("XLB_BENCH_SCALES") else {
        return Ok(None);
    };
    let scale = |s: &str| -> Option<(usize, usize)> {
        let (n, e) = s.trim().split_once('x')?;
        Some((n.parse().ok()?, e.parse().ok()?))
    };
    list.split(',')
        .map(|s| scale(s).ok_or_else(|| anyhow::anyhow!("XLB_BENCH_SCALES={list}: expected SxE,…")))
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// [`run`] for `scales` only: their cold syncs and the agent's RSS and time to its first
/// sync (no veths, no idle time); docs/benchmarks.md is left alone.
fn quick(xlb: &std::path::Path, scales: &[(usize, usize)]) -> Result<()> {
    for &(s, e) in scales {
        cold::cold(s, e)?;
        let m = super::memory::agent_run(
            super::agent::Source::File,
            xlb,
            s,
            e,
            std::time::Duration::ZERO,
            0,
        )?;
        println!(
            "agent {s} × {e}: RSS {:.1} MiB, VmHWM {:.1} MiB, synced in {:.2} s",
            m.rss_kb as f64 / 1024.0,
            m.hwm_kb as f64 / 1024.0,
            m.synced_s
        );
    }
    println!("bench sync: the sizes XLB_BENCH_SCALES names only, docs/benchmarks.md left alone");
    Ok(())
}

/// Runs the bench; returns its report section (none for a quick look at some sizes).
pub fn run(xlb: &std::path::Path) -> Result<Option<Section>> {
    if let Some(scales) = quick_scales()? {
        quick(xlb, &scales)?;
        return Ok(None);
    }
    let mut colds = Vec::new();
    for (s, e) in COLD {
        colds.push(cold::cold(s, e)?);
    }
    let ipt = kube_proxy::rules(
        "iptables-restore",
        &["--noflush"],
        &IPTABLES,
        Mode::Iptables,
    )?;
    let nft = kube_proxy::rules("nft", &["-f", "-"], &NFT, Mode::Nftables)?;
    let mut changes = Vec::new();
    for (s, e, n) in CHANGES {
        changes.push(change::change(s, e, n)?);
    }
    let partial = kube_proxy::nft_partial(NFT_PARTIAL.0, NFT_PARTIAL.1)?;
    let mut agents = Vec::new();
    for (services, endpoints) in AGENT {
        let m = super::memory::agent_run(
            super::agent::Source::File,
            xlb,
            services,
            endpoints,
            std::time::Duration::from_secs(IDLE_S),
            VETHS,
        )?;
        let a = AgentIdle {
            services,
            endpoints,
            rss_mib: m.rss_kb as f64 / 1024.0,
            synced_s: m.synced_s,
            idle_pct: m.idle_pct,
            attach_s: m.attach_s,
        };
        println!(
            "agent {services} × {endpoints}: RSS {:.0} MiB, synced in {:.1} s, {VETHS} veths attached {:.3} s after the last appeared, idle {:.3}% of a core",
            a.rss_mib, a.synced_s, a.attach_s, a.idle_pct
        );
        agents.push(a);
    }
    render::render(&colds, &ipt, &nft, &changes, &partial, &agents).map(Some)
}
