//! Bench `memory`: what the kernel charges for each map (`bpftool map show`'s
//! `bytes_memlock`, the map's memory usage as the kernel computes it), per entry and per
//! service, backend and flow; the real agent's RSS at 10,000 services × 10 endpoints; and
//! a Maglev table's bytes per frontend, in the kernel and in the agent ([`maglev`]).

mod maglev;

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use lb_common::{
    ALL_MAPS, MAP_BACKEND, MAP_BACKEND_STATS, MAP_CT, MAP_MAGLEV, MAP_SLOT, MAP_SVC, MAP_SVC_STATS,
};
use lb_userspace::datapath::names_file;

use super::{
    Summary,
    agent::{AgentRun, Source, start_agent, wait_synced},
    fixture::{Capacities, Datapath, model, status_kb},
    report::{self, Section},
    verdict,
};

/// Services and endpoints each of the loaded state and of the agent run.
const SERVICES: usize = 10_000;
const ENDPOINTS: usize = 10;
/// Agent runs per size.
const AGENT_TRIALS: usize = 3;

/// One map as `bpftool map show` reports it.
struct MapMem {
    name: &'static str,
    kind: String,
    key: u64,
    value: u64,
    max_entries: u64,
    memlock: u64,
}

fn map_mem(pins: &Path, name: &'static str) -> Result<MapMem> {
    let out = Command::new("bpftool")
        .args(["-j", "map", "show", "pinned"])
        .arg(pins.join(name))
        .output()
        .context("run bpftool")?;
    if !out.status.success() {
        bail!(
            "bpftool map show {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("bpftool JSON")?;
    let num = |k: &str| {
        v.get(k)
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| anyhow!("bpftool: no {k} for {name}"))
    };
    Ok(MapMem {
        name,
        kind: v
            .get("type")
            .and_then(|t| t.as_str())
            .unwrap_or("?")
            .to_string(),
        key: num("bytes_key")?,
        value: num("bytes_value")?,
        max_entries: num("max_entries")?,
        memlock: num("bytes_memlock")?,
    })
}

fn all_maps(pins: &Path) -> Result<Vec<MapMem>> {
    ALL_MAPS.iter().map(|m| map_mem(pins, m)).collect()
}

/// Starts the agent on `services` × `endpoints`, waits for its first full sync; returns
/// (VmRSS, VmHWM) in KiB and the seconds from start to synced.
fn agent_rss(
    source: Source,
    xlb: &Path,
    services: usize,
    endpoints: usize,
) -> Result<(u64, u64, f64)> {
    let m = agent_run(source, xlb, services, endpoints, Duration::ZERO, 0)?;
    Ok((m.rss_kb, m.hwm_kb, m.synced_s))
}

/// What [`agent_run`] measured.
pub(super) struct AgentMeasured {
    pub rss_kb: u64,
    pub hwm_kb: u64,
    /// From start to the first sync.
    pub synced_s: f64,
    /// The share of one core used while idle, in percent.
    pub idle_pct: f64,
    /// From the last of the pod veths created to all of them attached.
    pub attach_s: f64,
}

/// [`agent_rss`]; then `veths` pod veth pairs created at once in its namespace (the time
/// from the last created to all attached), and the agent left idle for `idle` with them:
/// the share of one core it used meanwhile (utime + stime from `/proc/PID/stat`).
pub(super) fn agent_run(
    source: Source,
    xlb: &Path,
    services: usize,
    endpoints: usize,
    idle: Duration,
    veths: usize,
) -> Result<AgentMeasured> {
    let (mut run, log, started) = start_agent(source, xlb, services, endpoints, &[])?;
    wait_synced(&mut run, &log, services, started)?;
    let synced = started.elapsed().as_secs_f64();
    let pid = run.child.id().to_string();
    let rss = settled_rss(&pid)?;
    let hwm = status_kb(&pid, "VmHWM")?;
    let attach_s = match veths {
        0 => 0.0,
        _ => veth_attach(&run, &log, veths)?,
    };
    let idle_pct = match idle.is_zero() {
        true => 0.0,
        false => idle_cpu(&pid, idle)?,
    };
    drop(run);
    Ok(AgentMeasured {
        rss_kb: rss,
        hwm_kb: hwm,
        synced_s: synced,
        idle_pct,
        attach_s,
    })
}

/// VmRSS of `pid` once it settles: after a full sync the agent rebuilds its B-trees and
/// gives freed pages back (longer at 100,000 services than the 300 ms first waited), so it
/// is read every 200 ms until it has not changed by more than 1% for a second (at most 10 s).
fn settled_rss(pid: &str) -> Result<u64> {
    std::thread::sleep(Duration::from_millis(300));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = status_kb(pid, "VmRSS")?;
    let mut steady = 0;
    while steady < 5 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        let now = status_kb(pid, "VmRSS")?;
        steady = if now.abs_diff(last) * 100 <= last {
            steady + 1
        } else {
            0
        };
        last = now;
    }
    Ok(last)
}

/// Creates `veths` pod veth pairs at once in the agent's namespace; seconds from then to
/// the agent's log showing them all attached (at most 30).
fn veth_attach(run: &AgentRun, log: &Path, veths: usize) -> Result<f64> {
    let attached = || {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .matches("attached tc ingress")
            .count()
    };
    let batch: String = (0..veths)
        .map(|i| format!("link add xbv{i} type veth peer name xbp{i}\n"))
        .collect();
    let before = attached();
    run.ns
        .feed("ip", &["-b", "-"], &batch)
        .map_err(anyhow::Error::msg)?;
    let created = Instant::now();
    loop {
        let n = attached();
        if n >= before + veths {
            return Ok(created.elapsed().as_secs_f64());
        }
        if created.elapsed() > Duration::from_secs(30) {
            bail!("{} of {veths} veths attached after 30 s", n - before);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The share of one core (percent) process `pid` uses over `idle`.
fn idle_cpu(pid: &str, idle: Duration) -> Result<f64> {
    let t0 = (cpu_ticks(pid)?, Instant::now());
    std::thread::sleep(idle);
    let ticks = cpu_ticks(pid)? - t0.0;
    // USER_HZ is 100 on Linux.
    Ok(ticks as f64 / 100.0 / t0.1.elapsed().as_secs_f64() * 100.0)
}

/// utime + stime of process `pid` (every thread), in clock ticks.
fn cpu_ticks(pid: &str) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> Result<u64> {
        f.get(i)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("/proc/{pid}/stat: no field {i}"))
    };
    // utime and stime are fields 14 and 15 of stat(5): 11 and 12 after the state.
    Ok(field(11)? + field(12)?)
}

/// CPUs the per-CPU maps hold values for.
fn cpus() -> usize {
    aya::util::nr_cpus().unwrap_or(1)
}

/// Runs the bench with the release `xlb`; returns its report section.
pub fn run(xlb: &Path) -> Result<Section> {
    let mut dp = Datapath::load(Capacities::default())?;
    let empty = all_maps(&dp.pins)?;
    let m = model(SERVICES, |_| ENDPOINTS)?;
    dp.program(&m)?;
    let full = all_maps(&dp.pins)?;
    let names = names_file_bytes(&dp.pins)?;
    drop(dp);
    let maglev = maglev::run(xlb)?;
    let mut body = String::new();
    let per_entry = map_table(&mut body, &empty, &full, maglev.memlock.median);
    let get = |n: &str| per_entry.get(n).copied().unwrap_or(0.0);
    let units = Units::of(&get, names);
    units_table(&mut body, &units, get(MAP_CT));
    agent_table(&mut body, xlb)?;
    maglev::write(&mut body, &maglev);
    targets(&mut body, &units);
    let Units {
        per_backend,
        per_service,
        per_flow,
        ..
    } = units;
    let plot = "bench-memory.svg";
    // A Maglev table (32 KiB) is in its own table, off this plot's scale.
    let mut bars: Vec<(String, f64)> = ALL_MAPS
        .iter()
        .filter(|m| **m != MAP_MAGLEV)
        .map(|m| (format!("{m} entry"), get(m)))
        .collect();
    bars.push(("backend (slot + entry)".into(), per_backend));
    bars.push(("frontend port (its entry)".into(), per_service));
    bars.push(("flow (2 conntrack entries)".into(), per_flow));
    report::bar_plot(
        plot,
        "Kernel memory (bytes_memlock) per entry",
        "bytes",
        &bars,
    )?;
    body.push_str(&format!("\n![memory per entry]({plot})\n"));
    Ok(Section {
        title: "memory: bytes per entry and agent RSS".into(),
        body,
    })
}

/// Each map's memlock, empty and loaded; returns the bytes per entry by map name (the
/// Maglev map's: `maglev_table`, its growth per table written, measured apart).
fn map_table(
    body: &mut String,
    empty: &[MapMem],
    full: &[MapMem],
    maglev_table: f64,
) -> std::collections::BTreeMap<&'static str, f64> {
    body.push_str(&format!(
        "What the kernel charges for each map (`bpftool map show` → `bytes_memlock`, the kernel's own \
         accounting of the map's memory) with the default capacities, empty and with {SERVICES} services × \
         {ENDPOINTS} endpoints programmed through the agent's sync path. Preallocated maps cost the same \
         empty or full (the counter arrays included): per entry = memlock ÷ max_entries; the counter \
         arrays hold a row per CPU ({} here), so their entry is one CPU's counter. {MAP_MAGLEV} is not \
         preallocated (an element is allocated as a table is written): its per entry is its growth \
         per table written (the Maglev rows below).\n\n",
        cpus()
    ));
    let headers: Vec<String> = [
        "map",
        "type",
        "key+value (B)",
        "max entries",
        "memlock empty (B)",
        "memlock loaded (B)",
        "B per entry",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut per_entry = std::collections::BTreeMap::new();
    let mut rows = Vec::new();
    for (e, f) in empty.iter().zip(full) {
        // Not preallocated: an element is allocated (and counted) as a table is written.
        let (per, shown) = match f.name == MAP_MAGLEV {
            true => (maglev_table, format!("{maglev_table:.1} per table written")),
            false => {
                let per = f.memlock as f64 / f.max_entries.max(1) as f64;
                (per, format!("{per:.1}"))
            }
        };
        per_entry.insert(f.name, per);
        rows.push(vec![
            f.name.to_string(),
            f.kind.clone(),
            format!("{}+{}", f.key, f.value),
            f.max_entries.to_string(),
            e.memlock.to_string(),
            f.memlock.to_string(),
            shown,
        ]);
    }
    body.push_str(&report::table(&headers, &rows));

    per_entry
}

/// The names file's bytes per service port (a tmpfs file beside the pins: RAM, but not the
/// kernel's maps), as the sync path wrote it for `pins`.
fn names_file_bytes(pins: &Path) -> Result<f64> {
    let path = names_file::path(pins);
    let bytes = std::fs::metadata(&path)
        .with_context(|| format!("names file {}", path.display()))?
        .len();
    let names = names_file::read(pins)
        .with_context(|| format!("names file {}", path.display()))?
        .map_or(0, |n| n.len());
    Ok(bytes as f64 / names.max(1) as f64)
}

/// The units, counters apart and per CPU.
struct Units {
    /// A slot of the slot array.
    slot: f64,
    /// A frontend's entry in the service hash.
    entry: f64,
    /// A frontend port in the kernel: its entry (the names are in a file).
    per_service: f64,
    /// A service port's line in the names file (tmpfs).
    name_line: f64,
    per_backend: f64,
    svc_counters: f64,
    backend_counters: f64,
    per_flow: f64,
}

impl Units {
    fn of(get: &dyn Fn(&str) -> f64, name_line: f64) -> Self {
        let (slot, entry) = (get(MAP_SLOT), get(MAP_SVC));
        Self {
            slot,
            entry,
            per_service: entry,
            name_line,
            per_backend: slot + get(MAP_BACKEND),
            // A counter array's entry is one CPU's counter (a row per CPU).
            svc_counters: get(MAP_SVC_STATS),
            backend_counters: get(MAP_BACKEND_STATS),
            per_flow: 2.0 * get(MAP_CT),
        }
    }
}

/// What a service slot, a service port, a backend and a flow take.
fn units_table(body: &mut String, u: &Units, ct_entry: f64) {
    let Units {
        slot,
        entry,
        per_service,
        name_line,
        per_backend,
        svc_counters,
        backend_counters,
        per_flow,
    } = *u;
    let headers: Vec<String> = ["unit", "what it takes", "bytes"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let rows = vec![
        vec![
            format!("backend slot ({MAP_SLOT} element)"),
            "one slot-array element".into(),
            format!("{slot:.1}"),
        ],
        vec![
            format!("frontend entry ({MAP_SVC} entry)"),
            "one service-map entry".into(),
            format!("{entry:.1}"),
        ],
        vec![
            "frontend port (kernel)".into(),
            "its entry (no name: the names left the kernel)".into(),
            format!("{per_service:.1}"),
        ],
        vec![
            "service port's name (tmpfs, not kernel)".into(),
            format!(
                "its line in the agent's names file ({}/…jsonl)",
                names_file::DIR
            ),
            format!("{name_line:.1}"),
        ],
        vec![
            "service port's counters".into(),
            format!("one {MAP_SVC_STATS} slot, per CPU"),
            format!("{svc_counters:.1}"),
        ],
        vec![
            "backend".into(),
            "one slot + one backend-array entry".into(),
            format!("{per_backend:.1}"),
        ],
        vec![
            "backend's counters".into(),
            format!("one {MAP_BACKEND_STATS} slot, per CPU"),
            format!("{backend_counters:.1}"),
        ],
        vec![
            "conntrack entry".into(),
            format!("one {MAP_CT} entry"),
            format!("{ct_entry:.1}"),
        ],
        vec![
            "flow".into(),
            "forward + reply entries".into(),
            format!("{per_flow:.1}"),
        ],
    ];
    body.push('\n');
    body.push_str(&report::table(&headers, &rows));
}

/// The real agent's RSS at 1 and at SERVICES services.
fn agent_table(body: &mut String, xlb: &Path) -> Result<()> {
    let mut small = Vec::new();
    let mut big = Vec::new();
    let mut synced = Vec::new();
    let (mut api, mut api_synced) = (Vec::new(), Vec::new());
    for _ in 0..AGENT_TRIALS {
        let (rss, hwm, _) = agent_rss(Source::File, xlb, 1, 2)?;
        small.push((rss as f64, hwm as f64));
        let (rss, hwm, s) = agent_rss(Source::File, xlb, SERVICES, ENDPOINTS)?;
        big.push((rss as f64, hwm as f64));
        synced.push(s);
        println!(
            "agent: 1 service {} KiB RSS; {SERVICES} × {ENDPOINTS}: {rss} KiB RSS, {hwm} KiB peak, synced in {s:.2} s",
            small.last().map_or(0.0, |x| x.0)
        );
        let (rss, hwm, s) = agent_rss(Source::Api, xlb, SERVICES, ENDPOINTS)?;
        api.push((rss as f64, hwm as f64));
        api_synced.push(s);
        println!(
            "agent (API source): {SERVICES} × {ENDPOINTS}: {rss} KiB RSS, {hwm} KiB peak, synced in {s:.2} s"
        );
    }
    let mib = |xs: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| {
        Summary::of(&xs.iter().map(|x| f(x) / 1024.0).collect::<Vec<_>>())
    };
    // The largest the sync bench programs: one run (the per-service arrays are sized from
    // the service map: 131,072 service ports).
    let (rss_100k, hwm_100k, synced_100k) = agent_rss(Source::File, xlb, 100_000, 2)?;
    println!(
        "agent: 100000 × 2: {rss_100k} KiB RSS, {hwm_100k} KiB peak, synced in {synced_100k:.2} s"
    );
    let rss_small = mib(&small, |x| x.0);
    let rss_big = mib(&big, |x| x.0);
    let hwm_big = mib(&big, |x| x.1);
    let per_svc_rss = (rss_big.median - rss_small.median) * 1024.0 * 1024.0 / SERVICES as f64;
    body.push_str(&format!(
        "\n**Agent RSS** (`xlb agent --source file:…` in its own network namespace, attached to no interface, \
         {AGENT_TRIALS} runs; the API-source row: `--source kubernetes` listing and watching the same objects from the \
         in-repo API test server in the agent's namespace (the server runs in the bench process, not counted), read from /proc/PID/status once its log says `synced` for every service and VmRSS has settled (within 1% for a second)):\n\n"
    ));
    let headers: Vec<String> = [
        "services × endpoints",
        "VmRSS (MiB)",
        "VmHWM (MiB)",
        "start → synced (s)",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows = vec![
        vec![
            "1 × 2".into(),
            rss_small.show(1),
            mib(&small, |x| x.1).show(1),
            "–".into(),
        ],
        vec![
            format!("{SERVICES} × {ENDPOINTS}"),
            rss_big.show(1),
            hwm_big.show(1),
            Summary::of(&synced).show(2),
        ],
        vec![
            format!("{SERVICES} × {ENDPOINTS}, API source"),
            mib(&api, |x| x.0).show(1),
            mib(&api, |x| x.1).show(1),
            Summary::of(&api_synced).show(2),
        ],
        vec![
            "100000 × 2 (1 run)".into(),
            format!("{:.1}", rss_100k as f64 / 1024.0),
            format!("{:.1}", hwm_100k as f64 / 1024.0),
            format!("{synced_100k:.2}"),
        ],
    ];
    body.push_str(&report::table(&headers, &rows));
    body.push_str(&format!(
        "\nAgent RSS per service × {ENDPOINTS} endpoints: ≈ {:.0} bytes ((RSS at {SERVICES} − RSS at 1) ÷ {SERVICES}; \
         the compact model, the desired state (the agent's one copy of the maps) and its bookkeeping, the file source's digest).\n",
        per_svc_rss
    ));
    Ok(())
}

/// The targets.
fn targets(body: &mut String, u: &Units) {
    let Units {
        slot,
        entry,
        per_service,
        name_line,
        per_backend,
        ..
    } = *u;
    body.push_str(&format!(
        "\n**Targets** (the fast-path issue's; per-CPU counters apart, above)\n\n\
         * ≤ 64 B per backend: **{}** ({per_backend:.1} B = a {slot:.1} B element of the slot array + the \
         backend array's entry; a frontend's range is a power of two, so a frontend of n backends holds up \
         to 2n − 1 slots{}).\n\
         * ≤ 128 B per frontend port: **{}** ({per_service:.1} B = its {entry:.1} B service-hash entry; \
         its name is in the agent's names file on tmpfs, {name_line:.1} B a service port, counted apart{}).\n",
        verdict(per_backend <= 64.0),
        if per_backend <= 64.0 {
            ""
        } else {
            "; what would close it: a smaller backend entry (the address and port only, the flags and \
             generation apart)"
        },
        verdict(per_service <= 128.0),
        if per_service <= 128.0 {
            ""
        } else {
            "; what would close it: the service entry in a hash of compact IPv4 keys"
        },
    ));
}
