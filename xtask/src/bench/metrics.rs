//! Bench `metrics`: what one `GET /metrics` costs the real agent (time and size) at 100,000
//! services × 2 and 10,000 × 10, with default flags and with every service port's series
//! (`--metrics-per-service=1000000`), and `/healthz`'s latency while scrapes run back to
//! back. The client runs in the agent's namespace, one fresh connection a request, as
//! Prometheus and kubelet do.

use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use xlb_tests::http::{get_path, ok_body};

use super::{
    Summary,
    agent::{AgentRun, Source, start_agent, wait_synced},
    percentile,
    report::{self, Section},
    verdict,
};

/// Services × endpoints of each agent run.
const SIZES: [(usize, usize); 2] = [(100_000, 2), (10_000, 10)];
/// The size whose `/healthz` is probed under scrapes.
const PROBED: (usize, usize) = (10_000, 10);
/// Sequential scrapes measured per run.
const SCRAPES: usize = 20;
/// Scrapes back to back in one burst, and the least time and bursts probed.
const BURST: usize = 4;
const PROBE_FOR: Duration = Duration::from_secs(3);
const MIN_BURSTS: usize = 25;
/// The flag that gives every service port its series.
const PER_SERVICE: &str = "--metrics-per-service=1000000";

const METRICS: &str = "127.0.0.1:10249";
const HEALTHZ: &str = "127.0.0.1:10256";

/// What scrapes of one agent measured.
struct Cost {
    services: usize,
    endpoints: usize,
    per_service: bool,
    /// Milliseconds a scrape took.
    ms: Summary,
    bytes: usize,
    samples: usize,
}

/// `/healthz` while scrapes ran back to back.
struct Probed {
    per_service: bool,
    probes: usize,
    p50: f64,
    p99: f64,
    max: f64,
    scrapes: usize,
}

fn addr(a: &str) -> std::net::SocketAddr {
    a.parse()
        .unwrap_or_else(|_| unreachable!("a literal address"))
}

/// One scrape from inside the agent's namespace: (milliseconds, body).
fn scrape(run: &AgentRun) -> Result<(f64, String)> {
    run.ns
        .run(|| {
            let started = Instant::now();
            let r = get_path(addr(METRICS), "/metrics", Duration::from_secs(60))?;
            let ms = started.elapsed().as_secs_f64() * 1e3;
            ok_body(&r).map(|b| (ms, b.to_string()))
        })
        .map_err(anyhow::Error::msg)?
        .map_err(anyhow::Error::msg)
}

/// Waits (at most 60 s) for `/healthz` to answer 200: the agent's first sync has returned
/// (its log says `synced` before the sync's bookkeeping is compacted).
fn wait_healthy(run: &AgentRun) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = run
            .ns
            .run(|| get_path(addr(HEALTHZ), "/healthz", Duration::from_secs(5)))
            .map_err(anyhow::Error::msg)?;
        if r.as_deref().is_ok_and(|r| r.starts_with("HTTP/1.1 200")) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("/healthz not 200 60 s after the sync: {r:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn cost(run: &AgentRun, services: usize, endpoints: usize, per_service: bool) -> Result<Cost> {
    // The first scrape opens the pinned maps; it is measured with the rest.
    let mut ms = Vec::new();
    let mut last = String::new();
    for _ in 0..SCRAPES {
        let (t, body) = scrape(run)?;
        ms.push(t);
        last = body;
    }
    let samples = last.lines().filter(|l| !l.starts_with('#')).count();
    if last.contains("backend=\"") {
        bail!("a per-backend series in /metrics");
    }
    Ok(Cost {
        services,
        endpoints,
        per_service,
        ms: Summary::of(&ms),
        bytes: last.len(),
        samples,
    })
}

/// `/healthz` probed every millisecond (fresh connections) while bursts of [`BURST`]
/// scrapes run back to back on another thread, for [`PROBE_FOR`] and [`MIN_BURSTS`] bursts.
fn probed(run: &AgentRun, per_service: bool) -> Result<Probed> {
    let scraping = Arc::new(AtomicBool::new(true));
    let flag = scraping.clone();
    let scraper = run.ns.spawn(move || {
        let started = Instant::now();
        let mut n = 0;
        let mut failed = None;
        while n < MIN_BURSTS * BURST || started.elapsed() < PROBE_FOR {
            for _ in 0..BURST {
                if let Err(e) = get_path(addr(METRICS), "/metrics", Duration::from_secs(60)) {
                    failed = Some(e);
                }
                n += 1;
            }
        }
        flag.store(false, Ordering::Relaxed);
        (n, failed)
    });
    let flag = scraping.clone();
    let probes = run
        .ns
        .run(move || {
            let mut ms = Vec::new();
            let mut failed = None;
            while flag.load(Ordering::Relaxed) {
                let started = Instant::now();
                match get_path(addr(HEALTHZ), "/healthz", Duration::from_secs(5)) {
                    Ok(r) if r.starts_with("HTTP/1.1 200") => {
                        ms.push(started.elapsed().as_secs_f64() * 1e3)
                    }
                    Ok(r) => failed = Some(format!("{r:.200}")),
                    Err(e) => failed = Some(e),
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            (ms, failed)
        })
        .map_err(anyhow::Error::msg)?;
    let (scrapes, scrape_failed) = scraper
        .join()
        .map_err(|_| anyhow!("scraper panicked"))?
        .map_err(anyhow::Error::msg)?;
    if let Some(e) = scrape_failed {
        bail!("a scrape failed: {e}");
    }
    let (ms, failed) = probes;
    if let Some(e) = failed {
        bail!("/healthz failed during the scrapes: {e}");
    }
    Ok(Probed {
        per_service,
        probes: ms.len(),
        p50: percentile(&ms, 50.0),
        p99: percentile(&ms, 99.0),
        max: percentile(&ms, 100.0),
        scrapes,
    })
}

/// Runs the bench with the release `xlb`; returns its report section.
pub fn run(xlb: &Path) -> Result<Section> {
    let mut costs = Vec::new();
    let mut probes = Vec::new();
    for (services, endpoints) in SIZES {
        for per_service in [false, true] {
            let extra: &[&str] = if per_service { &[PER_SERVICE] } else { &[] };
            let (mut run, log, started) =
                start_agent(Source::File, xlb, services, endpoints, extra)?;
            wait_synced(&mut run, &log, services, started)
                .with_context(|| format!("agent at {services} × {endpoints}"))?;
            wait_healthy(&run)?;
            let c = cost(&run, services, endpoints, per_service)?;
            println!(
                "metrics: {services} × {endpoints}{}: {} ms, {} bytes, {} samples",
                if per_service { " per service" } else { "" },
                c.ms.show(2),
                c.bytes,
                c.samples
            );
            costs.push(c);
            if (services, endpoints) == PROBED {
                let p = probed(&run, per_service)?;
                println!(
                    "healthz under scrapes{}: {} probes, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, {} scrapes",
                    if per_service { " (per service)" } else { "" },
                    p.probes,
                    p.p50,
                    p.p99,
                    p.max,
                    p.scrapes
                );
                probes.push(p);
            }
        }
    }
    Ok(Section {
        title: "metrics: /metrics cost and /healthz under scrapes".into(),
        body: body(&costs, &probes),
    })
}

fn flags(per_service: bool) -> String {
    if per_service {
        format!("`{PER_SERVICE}`")
    } else {
        "default".into()
    }
}

fn body(costs: &[Cost], probes: &[Probed]) -> String {
    let mut body = format!(
        "The real agent (`xlb agent --source file:…`, release build) in its own network namespace, attached to no \
         interface, each size and flag set a fresh agent; the client in the same namespace, a fresh connection a \
         request. **One scrape**: {SCRAPES} sequential `GET /metrics` once the agent has synced every service. \
         Before (issue [scale]), one scrape at 10,000 × 10 took 145 s and returned 14.7 MB (a series per backend, \
         the service map read three times, every conntrack entry walked, all on the thread that served \
         `/healthz`, which did not answer meanwhile).\n\n"
    );
    let headers: Vec<String> = [
        "services × endpoints",
        "flags",
        "time (ms)",
        "size (KB)",
        "samples",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows: Vec<Vec<String>> = costs
        .iter()
        .map(|c| {
            vec![
                format!("{} × {}", c.services, c.endpoints),
                flags(c.per_service),
                c.ms.show(2),
                format!("{:.1}", c.bytes as f64 / 1000.0),
                c.samples.to_string(),
            ]
        })
        .collect();
    body.push_str(&report::table(&headers, &rows));
    body.push_str(&format!(
        "\n**`/healthz` under scrapes** at {} × {}: bursts of {BURST} scrapes back to back on one thread, for at \
         least {} s and {MIN_BURSTS} bursts; meanwhile `/healthz` probed every millisecond on another.\n\n",
        PROBED.0,
        PROBED.1,
        PROBE_FOR.as_secs()
    ));
    let headers: Vec<String> = [
        "flags",
        "probes",
        "p50 (ms)",
        "p99 (ms)",
        "max (ms)",
        "scrapes meanwhile",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows: Vec<Vec<String>> = probes
        .iter()
        .map(|p| {
            vec![
                flags(p.per_service),
                p.probes.to_string(),
                format!("{:.2}", p.p50),
                format!("{:.2}", p.p99),
                format!("{:.2}", p.max),
                p.scrapes.to_string(),
            ]
        })
        .collect();
    body.push_str(&report::table(&headers, &rows));
    targets(&mut body, costs, probes);
    body
}

fn targets(body: &mut String, costs: &[Cost], probes: &[Probed]) {
    body.push_str("\n**Targets**\n\n");
    for c in costs.iter().filter(|c| !c.per_service) {
        let ok = c.ms.median <= 50.0 && c.bytes <= 200_000;
        body.push_str(&format!(
            "* `/metrics` with default flags at {} × {}: ≤ 50 ms and ≤ 200 KB: **{}** ({:.2} ms, {:.1} KB; \
             {} samples, none per service or backend){}.\n",
            c.services,
            c.endpoints,
            verdict(ok),
            c.ms.median,
            c.bytes as f64 / 1000.0,
            c.samples,
            if ok {
                ""
            } else {
                "; what would close it: see the time of each part with the agent's debug log"
            }
        ));
    }
    let per: Vec<&Cost> = costs.iter().filter(|c| c.per_service).collect();
    if let [a, b] = per[..] {
        let per_k = |c: &Cost| c.ms.median / (c.services as f64 / 1000.0);
        body.push_str(&format!(
            "* With `{PER_SERVICE}` (reported): {:.2} ms per 1,000 service ports at {} services, {:.2} at {} \
             ({:.2}×): linear in the service ports (one batched read of the names, one of the per-service \
             counter array, two samples a service port).\n",
            per_k(a),
            a.services,
            per_k(b),
            b.services,
            per_k(a) / per_k(b).max(1e-9)
        ));
    }
    for p in probes {
        body.push_str(&format!(
            "* `/healthz` p99 < 10 ms while scrapes run back to back at {} × {}, {}: **{}** ({:.2} ms over {} probes){}.\n",
            PROBED.0,
            PROBED.1,
            match p.per_service {
                true => format!("with `{PER_SERVICE}`"),
                false => "default flags".into(),
            },
            verdict(p.p99 < 10.0),
            p.p99,
            p.probes,
            if p.p99 < 10.0 {
                ""
            } else {
                "; what would close it: the health listener's thread at a higher priority than the \
                 metrics thread, or the scrape's encoding split into slices that yield"
            }
        ));
    }
}
