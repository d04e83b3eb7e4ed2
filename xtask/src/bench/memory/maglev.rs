//! The Maglev rows of bench `memory`: what a frontend's Maglev table (`--lb-algorithm
//! maglev`, M = 16381) costs in the kernel and in the agent, at [`FRONTENDS`] externalIP
//! frontends.
//!
//! Kernel: `XLB_MAGLEV_V2` is a hash without preallocation, so an element is allocated as a
//! table is written. The same services are programmed through the agent's sync path as a
//! node with `--lb-algorithm random` (no table), then `maglev` (a table per externalIP
//! frontend): per table, the growth of the map's own accounting (`bytes_memlock`, which for
//! such a hash counts the elements written) and of the pages the kernel took for them
//! (`SUnreclaim` in /proc/meminfo: `kmalloc` blocks too large for a slab cache are counted
//! there). System-wide, so other work on the machine moves it a little; medians over
//! [`KERNEL_TRIALS`] fresh maps.
//!
//! Agent: the real agent on the same services file with `--lb-algorithm random` and
//! `maglev`: VmRSS and the heap in use it logs after its full sync ("memory given back"),
//! per Maglev frontend; once with backends of its own per frontend (a table each), once with
//! [`SHARED`] externalIPs per service (its frontends share one table).

use std::{path::Path, time::Duration, time::Instant};

use anyhow::{Context, Result, bail};
use lb_common::{MAGLEV_MAP_CAPACITY, MAP_MAGLEV, MaglevRow};
use lb_userspace::{desired::NodeContext, model::LbAlgorithm};

use super::{map_mem, settled_rss};
use crate::bench::{
    Summary,
    agent::{Objects, Source, start_agent_on, wait_synced},
    fixture::{Capacities, Datapath, external_services_yaml, parse_model},
    report,
};

/// Maglev frontends of each measurement (half the map's default capacity).
const FRONTENDS: usize = 4096;
/// Endpoints of each service.
const ENDPOINTS: usize = 2;
/// Frontends (externalIPs of one service) sharing a table in the shared case.
const SHARED: usize = 4;
/// Trials of each agent measurement.
const TRIALS: usize = 3;
/// Trials of the kernel measurement (more: `SUnreclaim` is the whole machine's, and another
/// process freeing or allocating meanwhile moves a trial).
const KERNEL_TRIALS: usize = 5;
/// Cilium's table of the same size: 16381 32-bit backend IDs.
const CILIUM_TABLE: usize = 16381 * 4;

/// What was measured, per Maglev frontend (bytes).
pub(super) struct Measured {
    /// `bytes_memlock` growth of the map per table written.
    pub memlock: Summary,
    /// `SUnreclaim` growth per table written.
    pub pages: Summary,
    /// The map's `bytes_memlock` with no table.
    empty_memlock: u64,
    max_entries: u64,
    /// Agent VmRSS and heap growth per frontend: a table each, and [`SHARED`] per table.
    own: AgentDelta,
    shared: AgentDelta,
}

/// The agent's growth per Maglev frontend, `maglev` against `random`, paired by trial.
struct AgentDelta {
    rss: Summary,
    heap: Summary,
    /// Tables the agent wrote (its map's `bytes_memlock` growth ÷ the kernel's per table).
    tables: f64,
}

/// Runs the Maglev measurements.
pub(super) fn run(xlb: &Path) -> Result<Measured> {
    let mut memlock = Vec::new();
    let mut pages = Vec::new();
    let mut empty = (0, 0);
    let model = parse_model(&external_services_yaml(0..FRONTENDS, ENDPOINTS, 1))?;
    for t in 0..KERNEL_TRIALS {
        let (m, p, e) = kernel_trial(&model)?;
        println!(
            "maglev kernel trial {t}: {FRONTENDS} tables: {m:.0} B memlock, {p:.0} B pages (SUnreclaim) per table"
        );
        memlock.push(m);
        pages.push(p);
        empty = e;
    }
    let memlock = Summary::of(&memlock);
    let own = agent_deltas(xlb, FRONTENDS, 1, memlock.median)?;
    let shared = agent_deltas(xlb, FRONTENDS / SHARED, SHARED, memlock.median)?;
    Ok(Measured {
        memlock,
        pages: Summary::of(&pages),
        empty_memlock: empty.0,
        max_entries: empty.1,
        own,
        shared,
    })
}

/// One kernel trial on fresh maps: per table, the growth of the map's `bytes_memlock` and
/// of `SUnreclaim` from `random` to `maglev`; the empty map's memlock and max entries.
fn kernel_trial(model: &lb_userspace::model::Model) -> Result<(f64, f64, (u64, u64))> {
    // The previous trial's maps are freed after their last descriptor closes.
    settled_slab()?;
    let mut dp = Datapath::load(Capacities::default())?;
    let empty = map_mem(&dp.pins, MAP_MAGLEV)?;
    let random = NodeContext::default();
    let mut maglev = NodeContext::default();
    maglev.lb.algorithm = LbAlgorithm::Maglev;
    dp.program_on(model, &random)?;
    let before = (map_mem(&dp.pins, MAP_MAGLEV)?.memlock, settled_slab()?);
    dp.program_on(model, &maglev)?;
    let after = (map_mem(&dp.pins, MAP_MAGLEV)?.memlock, settled_slab()?);
    let tables = dp.current().maglev.len();
    if tables != FRONTENDS {
        bail!("{tables} Maglev tables programmed, {FRONTENDS} expected");
    }
    drop(dp);
    let n = FRONTENDS as f64;
    Ok((
        (after.0 as f64 - before.0 as f64) / n,
        (after.1 as f64 - before.1 as f64) / n,
        (empty.memlock, empty.max_entries),
    ))
}

/// `SUnreclaim` of /proc/meminfo in bytes.
fn slab() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo")?;
    text.lines()
        .find_map(|l| l.strip_prefix("SUnreclaim:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .context("SUnreclaim missing in /proc/meminfo")
}

/// [`slab`] once it settles: read every 200 ms until it has not moved by more than 1 MiB
/// for a second (at most 10 s; the kernel frees a closed map's elements after a grace
/// period).
fn settled_slab() -> Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = slab()?;
    let mut steady = 0;
    while steady < 5 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        let now = slab()?;
        steady = if now.abs_diff(last) <= 1 << 20 {
            steady + 1
        } else {
            0
        };
        last = now;
    }
    Ok(last)
}

/// What one agent run measured.
struct AgentMem {
    rss: u64,
    heap: u64,
    maglev_memlock: u64,
}

/// The agent on `services` services with `externals` externalIPs each, `random` against
/// `maglev`, [`TRIALS`] times: the growth per Maglev frontend.
fn agent_deltas(
    xlb: &Path,
    services: usize,
    externals: usize,
    memlock_per_table: f64,
) -> Result<AgentDelta> {
    let objects = Objects {
        yaml: external_services_yaml(0..services, ENDPOINTS, externals),
        // An entry per frontend, an externalIP's in both scopes at most.
        service_entries: services * (1 + 2 * externals),
        backends: services * ENDPOINTS,
    };
    // A ClusterIP frontend and the externalIPs' per service.
    let frontends = services * (1 + externals);
    let maglev_frontends = (services * externals) as f64;
    let (mut rss, mut heap, mut tables) = (Vec::new(), Vec::new(), Vec::new());
    for t in 0..TRIALS {
        let r = agent_mem(xlb, &objects, frontends, "random")?;
        let m = agent_mem(xlb, &objects, frontends, "maglev")?;
        let per = |a: u64, b: u64| (b as f64 - a as f64) / maglev_frontends;
        rss.push(per(r.rss, m.rss));
        heap.push(per(r.heap, m.heap));
        let written = (m.maglev_memlock as f64 - r.maglev_memlock as f64) / memlock_per_table;
        tables.push(written);
        println!(
            "maglev agent trial {t}: {services} services × {externals} externalIPs: random {} KiB RSS, {} KiB heap; maglev {} KiB RSS, {} KiB heap; {written:.0} tables in its map",
            r.rss / 1024,
            r.heap / 1024,
            m.rss / 1024,
            m.heap / 1024
        );
    }
    let tables = Summary::of(&tables).median;
    if (tables - maglev_frontends).abs() > maglev_frontends * 0.01 {
        bail!("the agent wrote {tables:.0} Maglev tables, {maglev_frontends} expected");
    }
    Ok(AgentDelta {
        rss: Summary::of(&rss),
        heap: Summary::of(&heap),
        tables,
    })
}

/// One agent run with `--lb-algorithm algorithm`, once synced and settled.
fn agent_mem(xlb: &Path, objects: &Objects, frontends: usize, algorithm: &str) -> Result<AgentMem> {
    let (mut run, log, started) =
        start_agent_on(Source::File, xlb, objects, &["--lb-algorithm", algorithm])?;
    wait_synced(&mut run, &log, frontends, started)?;
    let pid = run.child.id().to_string();
    let rss = settled_rss(&pid)? * 1024;
    let heap = heap_in_use(&log)?;
    let maglev_memlock = map_mem(&run.pins, MAP_MAGLEV)?.memlock;
    Ok(AgentMem {
        rss,
        heap,
        maglev_memlock,
    })
}

/// The heap in use the agent logged last after a full sync (`memory given back
/// heap_in_use_kib=…`), in bytes; waits for it at most 10 s.
fn heap_in_use(log: &Path) -> Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let last: Option<u64> = text
            .lines()
            .rev()
            .filter(|l| l.contains("memory given back"))
            .filter_map(|l| {
                let v = l.split("heap_in_use_kib=").nth(1)?;
                v.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
            })
            .next();
        if let Some(kib) = last {
            return Ok(kib * 1024);
        }
        if Instant::now() > deadline {
            bail!("the agent logged no heap in use:\n{text}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The Maglev table and paragraph of the section.
pub(super) fn write(body: &mut String, m: &Measured) {
    let row = std::mem::size_of::<MaglevRow>() as f64;
    let element = m.memlock.median;
    // kmalloc serves a size above 8 KiB from the page allocator, in a block of 2^order pages.
    let block = (element.round() as u64).next_power_of_two();
    let order = (block / 4096).trailing_zeros();
    let block = block as f64;
    let full = MAGLEV_MAP_CAPACITY as f64;
    let mib = |b: f64| b / (1024.0 * 1024.0);
    let headers: Vec<String> = [
        "Maglev (M = 16381)",
        "what it measures",
        "B per Maglev frontend",
        "÷ the row (32,776 B)",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let ratio = |s: &Summary| format!("{:.2}", s.median / row);
    let agent_rows = [
        (
            "agent VmRSS, a table per frontend",
            format!("{FRONTENDS} externalIP frontends, backends of their own"),
            &m.own.rss,
        ),
        (
            "agent heap in use, a table per frontend",
            "its log after the full sync".into(),
            &m.own.heap,
        ),
        (
            "agent VmRSS, 4 frontends per table",
            format!("{} services × {SHARED} externalIPs", FRONTENDS / SHARED),
            &m.shared.rss,
        ),
        (
            "agent heap in use, 4 frontends per table",
            "its log after the full sync".into(),
            &m.shared.heap,
        ),
    ];
    let mut rows = vec![
        vec![
            format!("kernel: {MAP_MAGLEV}'s accounting"),
            format!("`bytes_memlock`, {FRONTENDS} tables written − 0"),
            m.memlock.show(0),
            ratio(&m.memlock),
        ],
        vec![
            "kernel: pages taken".into(),
            format!("/proc/meminfo `SUnreclaim`, {FRONTENDS} tables written − 0"),
            m.pages.show(0),
            ratio(&m.pages),
        ],
        vec![
            "kernel: from the element's layout".into(),
            format!("a {element:.0} B element → an order-{order} kmalloc block"),
            format!("{block:.0}"),
            format!("{:.2}", block / row),
        ],
    ];
    for (what, how, s) in agent_rows {
        rows.push(vec![what.into(), how, s.show(0), ratio(s)]);
    }
    rows.push(vec![
        "Cilium's table (computed)".into(),
        "16381 × 4 B backend IDs".into(),
        CILIUM_TABLE.to_string(),
        format!("{:.2}", CILIUM_TABLE as f64 / row),
    ]);
    body.push_str(&format!(
        "\n**Maglev tables** (`--lb-algorithm maglev`, M = 16381): the kernel rows program {FRONTENDS} \
         externalIP services × {ENDPOINTS} endpoints through the agent's sync path into fresh maps as a \
         node with `random`, then `maglev` ({KERNEL_TRIALS} trials; `SUnreclaim` is the whole machine's, so \
         other work moves a trial); the agent rows run `xlb agent` on the same services file with \
         `--lb-algorithm random` and `maglev` ({TRIALS} trials each) and divide the growth by its Maglev \
         frontends (it wrote {:.0} and {:.0} tables into its map, by its `bytes_memlock`):\n\n",
        m.own.tables, m.shared.tables
    ));
    body.push_str(&report::table(&headers, &rows));
    body.push_str(&format!(
        "\nEach external frontend using Maglev (a NodePort on each node address, an externalIP, a \
         LoadBalancer IP) has its own element in `{MAP_MAGLEV}`, a hash without preallocation keyed by \
         service index, whose value is a 32,776 B row: the size and 16,384 two-byte slots, half \
         Cilium's 16381 × 4 B = 64 KiB of 32-bit backend IDs per service. The map's accounting \
         (`bytes_memlock`, {} B empty, max entries {}) grows by {element:.0} B a table: the row, its \
         8 B key, the element's 48 B header and the allocator's 8 B list node. That is {:.0} B over 32 \
         KiB, and the kernel allocates an element above 8 KiB as a block of whole pages rounded up to \
         a power of two (order {order}: {} pages): the pages it takes are {:.0} B a table, {:.2}× what the \
         map reports, as much as Cilium's 64 KiB. The default `--maglev-map-max`, {MAGLEV_MAP_CAPACITY} tables, is {:.0} MiB by the \
         map's accounting when full and {:.0} MiB of pages ({FRONTENDS} frontends: {:.0} MiB). No \
         element with 16,381 two-byte entries fits in 32 KiB beside the hash's 64 B; a row at 32 KiB \
         would take an array of rows (preallocated, every row up front) or rows of at most 16,348 \
         slots. In the agent a table is an `Arc<[u16]>` of M entries (32 KiB), computed once per set \
         of backends and size and shared by every frontend with those backends (a Service's NodePorts \
         on every node address, its externalIPs) and by the journal and programmed copies: {:.0} B of \
         RSS per frontend when each has its own backends, {:.0} B when {SHARED} share a table.\n",
        m.empty_memlock,
        m.max_entries,
        element - 32768.0,
        1u32 << order,
        m.pages.median,
        m.pages.median / element,
        mib(full * element),
        mib(full * m.pages.median),
        mib(FRONTENDS as f64 * m.pages.median),
        m.own.rss.median,
        m.shared.rss.median,
    ));
}
