//! Bench `sync`: the control plane.
//!
//! * **cold full sync**: N services × M endpoints from an empty set of maps to programmed,
//!   through the agent's own path (`desired::compute` on the model, then `sync::apply` with
//!   `KernelMaps`), with the peak RSS that sync adds (VmHWM reset through
//!   `/proc/self/clear_refs` before, read after). The model is parsed from YAML beforehand
//!   (the source's work, reported apart).
//! * **kube-proxy, same services**: `iptables-restore` of a kube-proxy-shaped ruleset and
//!   `nft -f` of kube-proxy's nftables shape, each into a fresh network namespace (via
//!   `nsenter --net=/run/netns/NAME`, never the root namespace), generated from the same
//!   model by xlb's kube-proxy emitters (`lb_userspace::emit`).
//! * **one endpoint change → visible**: one service's slice loses an endpoint and gains a new
//!   one; the time from the model holding the change to the service and backend maps showing
//!   it (read back from the pinned maps, what the datapath reads), p50 and p99.

use std::{
    fs::File,
    net::{Ipv4Addr, SocketAddrV4},
    process::Stdio,
    time::Instant,
};

use anyhow::{Context, Result, bail};
use lb_userspace::{
    emit::{self, Mode},
    model::NodeSettings,
};
use xlb_tests::{netns::Netns, services::service_yaml, unique_tag};

use super::{
    Summary,
    fixture::{
        Capacities, Datapath, Probe, SVC_PORT, TARGET_PORT, addr_add, backend_ip, model,
        parse_model, reset_peak_rss, status_kb, vip,
    },
    percentile,
    report::{self, Section, Series},
    verdict,
};

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
/// Endpoint-change runs: (services × 10 endpoints, changes).
const CHANGES: [(usize, usize); 2] = [(100, 300), (10_000, 100)];

/// One cold full sync configuration's results.
struct Cold {
    services: usize,
    endpoints: usize,
    parse_s: f64,
    compute_s: Summary,
    apply_s: Summary,
    total_s: Summary,
    peak_mib: Summary,
    hwm_mib: f64,
    /// Map writes (and deletes) of one sync.
    writes: usize,
}

/// Timings of one kube-proxy-style load.
struct Rules {
    services: usize,
    seconds: Summary,
    rules: usize,
}

/// Endpoint change latency at one size.
struct Change {
    services: usize,
    total_ms: Vec<f64>,
    compute_ms: Vec<f64>,
    apply_ms: Vec<f64>,
}

fn cold(services: usize, endpoints: usize) -> Result<Cold> {
    let t = Instant::now();
    let m = model(services, |_| endpoints)?;
    let parse_s = t.elapsed().as_secs_f64();
    let (mut compute, mut apply, mut total, mut peak) = (vec![], vec![], vec![], vec![]);
    let mut hwm_mib = 0.0;
    let mut writes = 0;
    for _ in 0..COLD_TRIALS {
        let mut dp = Datapath::load(Capacities::for_services(services, services * endpoints))?;
        reset_peak_rss()?;
        let rss0 = status_kb("self", "VmRSS")?;
        let t = dp.program(&m)?;
        let hwm = status_kb("self", "VmHWM")?;
        compute.push(t.compute.as_secs_f64());
        apply.push(t.apply.as_secs_f64());
        total.push((t.compute + t.apply).as_secs_f64());
        peak.push(hwm.saturating_sub(rss0) as f64 / 1024.0);
        hwm_mib = hwm as f64 / 1024.0;
        writes = t.writes + t.deletes;
        let programmed = dp.current().services.keys().filter(|k| k.slot == 0).count();
        if programmed != services {
            bail!("cold sync programmed {programmed} of {services} services");
        }
    }
    let c = Cold {
        services,
        endpoints,
        parse_s,
        compute_s: Summary::of(&compute),
        apply_s: Summary::of(&apply),
        total_s: Summary::of(&total),
        peak_mib: Summary::of(&peak),
        hwm_mib,
        writes,
    };
    println!(
        "cold {services} × {endpoints}: {} s (compute {} s, apply {} s), peak +{} MiB",
        c.total_s.show(3),
        c.compute_s.show(3),
        c.apply_s.show(3),
        c.peak_mib.show(1)
    );
    Ok(c)
}

/// Loads `text` with `program args` (reading stdin) inside a fresh namespace; seconds taken.
fn load_rules(program: &str, args: &[&str], text: &str) -> Result<f64> {
    let ns = Netns::new(&unique_tag("xlbk")).map_err(anyhow::Error::msg)?;
    let path = std::env::temp_dir().join(format!("{}.rules", ns.name));
    std::fs::write(&path, text)?;
    let input = File::open(&path)?;
    let mut cmd = ns.command(program);
    cmd.args(args)
        .stdin(Stdio::from(input))
        .stdout(Stdio::null());
    let t = Instant::now();
    let out = cmd
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("start {program}"))?;
    let secs = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&path);
    if !out.status.success() {
        bail!(
            "{program} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(secs)
}

/// kube-proxy's ruleset for `services` ClusterIP services × 2 endpoints, as xlb's emitter
/// writes it (the same text kube-proxy's first sync would restore), with the default node
/// settings (no nfacct objects exist in the bench's namespaces).
fn kube_proxy_rules(mode: Mode, services: usize) -> Result<String> {
    let m = model(services, |_| 2)?;
    let opts = emit::Options::default();
    assert!(!opts.host.nfacct_invalid_dropped && !opts.host.nfacct_localhost_nodeports);
    Ok(emit::render(mode, &m, &NodeSettings::default(), &opts))
}

fn rules(program: &str, args: &[&str], sizes: &[(usize, usize)], mode: Mode) -> Result<Vec<Rules>> {
    let mut out = Vec::new();
    for &(services, trials) in sizes {
        let text = kube_proxy_rules(mode, services)?;
        let rules = text
            .lines()
            .filter(|l| l.starts_with("-A ") || l.starts_with("add rule"))
            .count();
        let mut secs = Vec::new();
        for _ in 0..trials {
            secs.push(load_rules(program, args, &text)?);
        }
        let r = Rules {
            services,
            seconds: Summary::of(&secs),
            rules,
        };
        println!(
            "{program} {services} × 2 ({rules} rules): {} s",
            r.seconds.show(2)
        );
        out.push(r);
    }
    Ok(out)
}

/// `t = a · n^b` through the last two points; (a, b).
fn power_fit(points: &[(f64, f64)]) -> (f64, f64) {
    let [.., (n1, t1), (n2, t2)] = points else {
        return (0.0, 1.0);
    };
    let b = (t2 / t1).ln() / (n2 / n1).ln();
    (t2 / n2.powf(b), b)
}

fn change(services: usize, changes: usize) -> Result<Change> {
    const ENDPOINTS: usize = 10;
    let mut m = model(services, |_| ENDPOINTS)?;
    let mut dp = Datapath::load(Capacities::for_services(
        services,
        services * (ENDPOINTS + 1),
    ))?;
    dp.program(&m)?;
    let probe = Probe::open(&dp.pins)?;
    let mut current: Vec<Vec<Ipv4Addr>> = (0..services)
        .map(|i| (0..ENDPOINTS).map(|k| backend_ip(i, k)).collect())
        .collect();
    let mut c = Change {
        services,
        total_ms: vec![],
        compute_ms: vec![],
        apply_ms: vec![],
    };
    for n in 0..changes {
        let i = (n * 7_919 + 13) % services;
        let removed = current[i].remove(0);
        let added = addr_add(Ipv4Addr::new(10, 160, 0, 0), n as u32);
        current[i].push(added);
        let part = parse_model(&service_yaml(
            &format!("s{i}"),
            vip(i),
            SVC_PORT,
            "TCP",
            TARGET_PORT,
            &current[i],
        ))?;
        m.slices.extend(part.slices);
        // The model holds the change: from here to visible in the maps.
        let t0 = Instant::now();
        let t = dp.program(&m)?;
        let now = probe.backends(vip(i), SVC_PORT)?;
        let total = t0.elapsed();
        if !now.contains(&SocketAddrV4::new(added, TARGET_PORT))
            || now.contains(&SocketAddrV4::new(removed, TARGET_PORT))
        {
            bail!("endpoint change {n} not visible in the maps: {now:?}");
        }
        c.total_ms.push(total.as_secs_f64() * 1e3);
        c.compute_ms.push(t.compute.as_secs_f64() * 1e3);
        c.apply_ms.push(t.apply.as_secs_f64() * 1e3);
    }
    println!(
        "endpoint change at {services} services: p50 {:.3} ms, p99 {:.3} ms",
        percentile(&c.total_ms, 50.0),
        percentile(&c.total_ms, 99.0)
    );
    Ok(c)
}

/// Runs the bench; returns its report section.
pub fn run() -> Result<Section> {
    let mut colds = Vec::new();
    for (s, e) in COLD {
        colds.push(cold(s, e)?);
    }
    let ipt = rules(
        "iptables-restore",
        &["--noflush"],
        &IPTABLES,
        Mode::Iptables,
    )?;
    let nft = rules("nft", &["-f", "-"], &NFT, Mode::Nftables)?;
    let mut changes = Vec::new();
    for (s, n) in CHANGES {
        changes.push(change(s, n)?);
    }
    render(&colds, &ipt, &nft, &changes)
}

fn render(colds: &[Cold], ipt: &[Rules], nft: &[Rules], changes: &[Change]) -> Result<Section> {
    let mut body = String::from(
        "**Cold full sync** into empty kernel maps through the agent's path (`desired::compute` + \
         `sync::apply` with `KernelMaps`), median [min–max] of 3 trials; peak RSS = VmHWM growth during \
         the sync (reset through `/proc/self/clear_refs` just before); VmHWM = the bench process's peak \
         with the model held. The model is parsed from Kubernetes YAML before timing (parse column, once).\n\n",
    );
    let headers: Vec<String> = [
        "services × endpoints",
        "map writes",
        "sync total (s)",
        "compute (s)",
        "apply (s)",
        "peak RSS added (MiB)",
        "VmHWM (MiB)",
        "YAML parse (s)",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows: Vec<Vec<String>> = colds
        .iter()
        .map(|c| {
            vec![
                format!("{} × {}", c.services, c.endpoints),
                c.writes.to_string(),
                c.total_s.show(3),
                c.compute_s.show(3),
                c.apply_s.show(3),
                c.peak_mib.show(1),
                format!("{:.0}", c.hwm_mib),
                format!("{:.2}", c.parse_s),
            ]
        })
        .collect();
    body.push_str(&report::table(&headers, &rows));

    let xlb_2: Vec<(f64, f64)> = colds
        .iter()
        .filter(|c| c.endpoints == 2)
        .map(|c| (c.services as f64, c.total_s.median))
        .collect();
    let xlb_at = |n: usize| {
        colds
            .iter()
            .find(|c| c.services == n && c.endpoints == 2)
            .map(|c| c.total_s.median)
    };
    body.push_str(
        "\n**The same services the way kube-proxy loads them**, × 2 endpoints, each into a fresh network \
         namespace: `iptables-restore --noflush` (iptables 1.8.9, nf_tables backend) and `nft -f` of \
         kube-proxy's rules for the same services as `xlb emit iptables|nftables` writes them. The time \
         includes starting the process. Ratios: that time ÷ xlb's cold sync of the same services in this run.\n\n",
    );
    let headers: Vec<String> = [
        "loader",
        "services × 2",
        "rules",
        "time (s)",
        "÷ xlb cold sync",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut rows = Vec::new();
    for (name, set) in [("iptables-restore", ipt), ("nft -f", nft)] {
        for r in set {
            rows.push(vec![
                name.to_string(),
                r.services.to_string(),
                r.rules.to_string(),
                r.seconds.show(2),
                xlb_at(r.services)
                    .map_or("–".into(), |x| format!("{:.0}×", r.seconds.median / x)),
            ]);
        }
    }
    let ipt_pts: Vec<(f64, f64)> = ipt
        .iter()
        .map(|r| (r.services as f64, r.seconds.median))
        .collect();
    let nft_pts: Vec<(f64, f64)> = nft
        .iter()
        .map(|r| (r.services as f64, r.seconds.median))
        .collect();
    let xlb_10k = xlb_at(10_000).unwrap_or(f64::NAN);
    let mut at_10k = Vec::new();
    for (name, pts) in [("iptables-restore", &ipt_pts), ("nft -f", &nft_pts)] {
        let (a, b) = power_fit(pts);
        let t = a * 10_000f64.powf(b);
        at_10k.push(t);
        rows.push(vec![
            format!("{name} (extrapolated)"),
            "10000".into(),
            "–".into(),
            format!("{t:.1} (t = a·n^{b:.2} through the two largest)"),
            format!("{:.0}×", t / xlb_10k),
        ]);
    }
    let ipt_10k = at_10k[0];
    body.push_str(&report::table(&headers, &rows));

    body.push_str(
        "\n**One endpoint change → visible**: a service's EndpointSlice loses one of its 10 endpoints and \
         gains a new one; timed from the model holding the change to the pinned service and backend maps \
         (what the datapath reads) showing the new backend and not the old: the agent's whole \
         `desired::compute` + `sync::apply` + a read-back probe.\n\n",
    );
    let headers: Vec<String> = [
        "services × 10",
        "changes",
        "p50 (ms)",
        "p99 (ms)",
        "max (ms)",
        "compute p50 (ms)",
        "apply p50 (ms)",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows: Vec<Vec<String>> = changes
        .iter()
        .map(|c| {
            vec![
                c.services.to_string(),
                c.total_ms.len().to_string(),
                format!("{:.3}", percentile(&c.total_ms, 50.0)),
                format!("{:.3}", percentile(&c.total_ms, 99.0)),
                format!("{:.3}", percentile(&c.total_ms, 100.0)),
                format!("{:.3}", percentile(&c.compute_ms, 50.0)),
                format!("{:.3}", percentile(&c.apply_ms, 50.0)),
            ]
        })
        .collect();
    body.push_str(&report::table(&headers, &rows));

    let speedup = ipt_10k / xlb_10k;
    let measured = ipt
        .iter()
        .rev()
        .find_map(|r| xlb_at(r.services).map(|x| (r.services, r.seconds.median / x)));
    let p99s: Vec<(usize, f64)> = changes
        .iter()
        .map(|c| (c.services, percentile(&c.total_ms, 99.0)))
        .collect();
    let change_ok = p99s.iter().all(|(_, p)| *p < 1.0);
    body.push_str(&format!(
        "\n**Targets**\n\n\
         * full sync at 10,000 services ≥ 100× faster than iptables-restore of the same services: **{}** \
         ({speedup:.0}× against the extrapolated {ipt_10k:.1} s; measured side by side at {} services: {:.0}×).\n\
         * one endpoint change < 1 ms p99, at 100 and at 10,000 services: **{}** ({}).\n",
        verdict(speedup >= 100.0),
        measured.map_or(0, |m| m.0),
        measured.map_or(0.0, |m| m.1),
        verdict(change_ok),
        p99s.iter().map(|(s, p)| format!("p99 {p:.3} ms at {s}")).collect::<Vec<_>>().join(", "),
    ));

    let plot = "bench-sync.svg";
    report::line_plot_scaled(
        plot,
        "Programming N services × 2 endpoints (seconds, log-log)",
        "services",
        "seconds",
        &[
            Series {
                name: "xlb cold sync (compute + apply)".into(),
                points: xlb_2,
            },
            Series {
                name: "iptables-restore".into(),
                points: ipt_pts,
            },
            Series {
                name: "nft -f".into(),
                points: nft_pts,
            },
        ],
        true,
    )?;
    body.push_str(&format!("\n![sync time]({plot})\n"));
    Ok(Section {
        title: "sync: control plane".into(),
        body,
    })
}
