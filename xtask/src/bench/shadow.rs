//! Bench `shadow`: what one look of `xlb agent --shadow` costs at scale.
//!
//! kube-proxy's live rules are made with xlb's own kube-proxy emitters (`lb_userspace::emit`,
//! what `xlb emit` writes) for a synthetic model, in the text the node's tools print: the
//! iptables mode's restore payload as `iptables-save` output, the nftables mode's table as
//! `nft -j list table ip kube-proxy` prints it (JSON, [`super::nft_json::listing`]). One look is
//! `lb_userspace::shadow::look` on that text: each family's text parsed, then every frontend
//! traced through it and compared with xlb's desired answer, as the agent does every
//! `--shadow-interval`. Nothing is read from or written to the node: no root, no namespace.
//!
//! Per size and mode: the look's time (median [min–max] of a few trials), the parse's part
//! of it, the per-service cost, the look against the 10 s default interval, and the peak RSS
//! the look adds (VmHWM reset through `/proc/self/clear_refs` before, read after).

use std::{
    net::{IpAddr, Ipv4Addr},
    time::Instant,
};

use anyhow::{Result, bail};
use lb_userspace::{
    datapath::netfilter::LiveText,
    desired::NodeContext,
    emit::{self, Mode},
    model::{IpFamily, Model, NodeSettings},
    shadow::{self, live},
};

use super::{
    Summary,
    fixture::{SVC_PORT, TARGET_PORT, backend_ip, parse_model, reset_peak_rss, status_kb, vip},
    report::{self, Section, Series},
    verdict,
};

/// Services per look, and trials of each.
const SIZES: [(usize, usize); 3] = [(1_000, 5), (10_000, 3), (30_000, 1)];
/// A size is skipped when its look, extrapolated from the two sizes before it, would take
/// longer than this (seconds).
const MAX_LOOK_S: f64 = 60.0;
/// The default `--shadow-interval` (seconds).
const INTERVAL_S: f64 = 10.0;
/// The target: one look at 10,000 services in at most this (seconds).
const TARGET_S: f64 = 2.0;
const TARGET_SERVICES: usize = 10_000;
/// Every this many services is a NodePort (the rest are ClusterIP services).
const NODE_PORT_EVERY: usize = 16;
/// The node's address (NodePorts are served on it).
const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 5);

/// Endpoints of synthetic service `i`: 3 to 10, cycling.
fn endpoints(i: usize) -> usize {
    3 + i % 8
}

/// Service `i` (a ClusterIP, every [`NODE_PORT_EVERY`]th a NodePort) and its EndpointSlice.
fn service_yaml(i: usize) -> String {
    let (kind, node_port) = if i.is_multiple_of(NODE_PORT_EVERY) {
        (
            "NodePort",
            format!(", nodePort: {}", 30_000 + i / NODE_PORT_EVERY),
        )
    } else {
        ("ClusterIP", String::new())
    };
    let mut y = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: bench, name: s{i}}}\nspec:\n  type: {kind}\n  clusterIP: {}\n  ports:\n  - {{name: p, port: {SVC_PORT}, protocol: TCP, targetPort: {TARGET_PORT}{node_port}}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: bench\n  name: s{i}-1\n  labels: {{kubernetes.io/service-name: s{i}}}\naddressType: IPv4\nports:\n- {{name: p, port: {TARGET_PORT}, protocol: TCP}}\nendpoints:\n",
        vip(i)
    );
    for k in 0..endpoints(i) {
        y.push_str(&format!(
            "- addresses: [\"{}\"]\n  conditions: {{ready: true}}\n",
            backend_ip(i, k)
        ));
    }
    y
}

/// The model of services `0..n`, parsed in chunks through the agent's file source.
fn shadow_model(n: usize) -> Result<Model> {
    let mut m = Model::default();
    for start in (0..n).step_by(5_000) {
        let yaml: String = (start..(start + 5_000).min(n)).map(service_yaml).collect();
        let part = parse_model(&yaml)?;
        m.services.extend(part.services);
        m.slices.extend(part.slices);
    }
    Ok(m)
}

/// kube-proxy's IPv4 state for `m` in `mode`, as the node's tools would print it; and its
/// size in KiB.
fn live_text(mode: Mode, m: &Model, node: &NodeSettings) -> (LiveText, usize) {
    let opts = emit::WriterOptions::default();
    let text = match mode {
        Mode::Nftables => LiveText {
            iptables: None,
            nft: Some(super::nft_json::listing(&emit::nftables::emit(
                m, node, &opts,
            ))),
        },
        _ => LiveText {
            iptables: Some(("iptables-save", emit::render(mode, m, node, &opts))),
            nft: None,
        },
    };
    let kib = text
        .iptables
        .as_ref()
        .map(|t| &t.1)
        .or(text.nft.as_ref())
        .map_or(0, |t| t.len() / 1024);
    (text, kib)
}

/// One size and mode's results.
struct Look {
    services: usize,
    mode: Mode,
    kib: usize,
    compared: usize,
    divergences: usize,
    look_s: Summary,
    parse_s: f64,
    peak_mib: Summary,
}

fn measure(services: usize, trials: usize, mode: Mode) -> Result<Look> {
    let m = shadow_model(services)?;
    let node = NodeContext::new("node1", &[IpAddr::V4(NODE_IP)], false);
    let settings = NodeSettings {
        family: IpFamily::V4,
        ..node.node.clone()
    };
    let (text, kib) = live_text(mode, &m, &settings);
    let (mut secs, mut peak) = (Vec::new(), Vec::new());
    let (mut compared, mut divergences) = (0, 0);
    for _ in 0..trials {
        reset_peak_rss()?;
        let rss0 = status_kb("self", "VmRSS")?;
        let t = Instant::now();
        let c = shadow::look(&m, &node, &[(IpFamily::V4, &text)], None);
        secs.push(t.elapsed().as_secs_f64());
        peak.push(status_kb("self", "VmHWM")?.saturating_sub(rss0) as f64 / 1024.0);
        if let Some(e) = c.errors.first() {
            bail!("{} at {services}: {e}", mode.name());
        }
        (compared, divergences) = (c.compared, c.divergences.len());
        drop(c);
    }
    // The parse's part of a look, once.
    let t = Instant::now();
    let parsed = live::parse(IpFamily::V4, &text, None);
    let parse_s = t.elapsed().as_secs_f64();
    drop(parsed);
    let l = Look {
        services,
        mode,
        kib,
        compared,
        divergences,
        look_s: Summary::of(&secs),
        parse_s,
        peak_mib: Summary::of(&peak),
    };
    println!(
        "shadow {} {services} services ({kib} KiB): look {} s (parse {:.3} s), {compared} compared, {divergences} divergent, peak +{} MiB",
        mode.name(),
        l.look_s.show(3),
        l.parse_s,
        l.peak_mib.show(1)
    );
    Ok(l)
}

/// The look at `services`, extrapolated from the two sizes before it (`t = a · n^b`).
fn extrapolate(done: &[&Look], services: usize) -> Option<f64> {
    let [.., a, b] = done else { return None };
    let exp =
        (b.look_s.median / a.look_s.median).ln() / (b.services as f64 / a.services as f64).ln();
    Some(b.look_s.median * (services as f64 / b.services as f64).powf(exp.max(1.0)))
}

/// Runs the bench; returns its report section.
pub fn run() -> Result<Section> {
    let mut looks: Vec<Look> = Vec::new();
    let mut skipped = Vec::new();
    for (services, trials) in SIZES {
        for mode in [Mode::Iptables, Mode::Nftables] {
            let done: Vec<&Look> = looks.iter().filter(|l| l.mode == mode).collect();
            if let Some(est) = extrapolate(&done, services)
                && est > MAX_LOOK_S
            {
                println!(
                    "shadow {} {services} services: skipped (≈ {est:.0} s a look extrapolated)",
                    mode.name()
                );
                skipped.push(format!(
                    "{} at {services} services (≈ {est:.0} s a look, extrapolated from the sizes before)",
                    mode.name()
                ));
                continue;
            }
            looks.push(measure(services, trials, mode)?);
        }
    }
    render(&looks, &skipped)
}

fn render(looks: &[Look], skipped: &[String]) -> Result<Section> {
    let mut body = format!(
        "One look of `xlb agent --shadow` (`shadow::look`: kube-proxy's live text parsed, every frontend traced \
         through it and compared with xlb's answer) on IPv4 ClusterIP services with {{3..10}} endpoints each, every \
         {NODE_PORT_EVERY}th a NodePort too (frontend-origin pairs compared: one per ClusterIP, two per NodePort). \
         kube-proxy's rules are xlb's own emitters' (`xlb emit iptables`, `xlb emit nftables`) in the text \
         the node's tools print (`iptables-save`; `nft -j list table ip kube-proxy`, libnftables' JSON, rendered by \
         the bench's `nft_json::listing`), fed to the look as if read live: nothing read from the node, no root. \
         Look: median [min–max] of the trials (5 at 1,000 services, 3 at 10,000, 1 at 30,000); parse: \
         the text parsed and indexed (one run), the rest of the look is tracing and comparing; per service = \
         look ÷ services; interval = look ÷ the default {INTERVAL_S:.0} s `--shadow-interval`; peak RSS = \
         VmHWM growth during the look (reset through `/proc/self/clear_refs` just before).\n\n"
    );
    let headers: Vec<String> = [
        "services",
        "mode",
        "live text (KiB)",
        "compared",
        "divergent",
        "look (s)",
        "parse (s)",
        "per service (µs)",
        "look / 10 s interval",
        "peak RSS growth (MiB)",
        "verdict",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows: Vec<Vec<String>> = looks
        .iter()
        .map(|l| {
            let v = if l.services == TARGET_SERVICES {
                format!(
                    "≤ {TARGET_S:.0} s: **{}**",
                    verdict(l.look_s.median <= TARGET_S)
                )
            } else {
                format!("< interval: **{}**", verdict(l.look_s.median < INTERVAL_S))
            };
            vec![
                l.services.to_string(),
                l.mode.name().to_string(),
                l.kib.to_string(),
                l.compared.to_string(),
                l.divergences.to_string(),
                l.look_s.show(3),
                format!("{:.3}", l.parse_s),
                format!("{:.1}", l.look_s.median * 1e6 / l.services as f64),
                format!("{:.3}", l.look_s.median / INTERVAL_S),
                l.peak_mib.show(1),
                v,
            ]
        })
        .collect();
    body.push_str(&report::table(&headers, &rows));
    for s in skipped {
        body.push_str(&format!("\nSkipped: {s}.\n"));
    }
    body.push_str(&targets(looks));
    body.push_str(
        "\nBefore this bench a look grew with services² in two places, both fixed with it: \
         `shadow::prune`'s nftables subset scanned every big map and kept every element naming the \
         packet's port (all services on port 80: every element, and every service chain) for each \
         frontend (now the maps and big sets are indexed once per look, and a subset takes the chains \
         reachable from the base chains and only the maps they name); and the text reader nft's listing \
         had then rescanned a set's whole `elements = {` block at every listed line (it read each line once \
         afterwards; the listing is now read as `nft -j` JSON with serde, `emit::nft_json`). \
         nftables at 1,000 services went from 28.8 s a look to the figure above.\n",
    );
    let series: Vec<Series> = [Mode::Iptables, Mode::Nftables]
        .iter()
        .map(|mode| Series {
            name: format!("{} mode", mode.name()),
            points: looks
                .iter()
                .filter(|l| l.mode == *mode)
                .map(|l| (l.services as f64, l.look_s.median))
                .collect(),
        })
        .collect();
    let plot = "bench-shadow.svg";
    report::line_plot_scaled(
        plot,
        "One shadow look (seconds, log-log)",
        "services",
        "seconds",
        &series,
        true,
    )?;
    body.push_str(&format!("\n![shadow look]({plot})\n"));
    Ok(Section {
        title: "shadow: one look at kube-proxy's live rules".into(),
        body,
    })
}

/// The target line per mode, with the growth from 1,000 to 10,000 services.
fn targets(looks: &[Look]) -> String {
    let mut s = format!(
        "\n**Target**: one look at {TARGET_SERVICES} services in ≤ {TARGET_S:.0} s (a fifth of the default \
         interval), in a release build.\n\n"
    );
    for mode in [Mode::Iptables, Mode::Nftables] {
        let of = |n: usize| {
            looks
                .iter()
                .find(|l| l.mode == mode && l.services == n)
                .map(|l| l.look_s.median)
        };
        let Some(l) = looks
            .iter()
            .find(|l| l.mode == mode && l.services == TARGET_SERVICES)
        else {
            s.push_str(&format!("* {}: not measured.\n", mode.name()));
            continue;
        };
        let t = l.look_s.median;
        let growth = of(1_000).map_or(String::new(), |t1| {
            format!(
                "; 10× the services cost {:.1}× the time (linear: 10×)",
                t / t1
            )
        });
        let close = if t <= TARGET_S {
            String::new()
        } else {
            format!(
                "; what would close it: the parse and index of the live text is {:.0}% of it ({:.2} s), \
                 tracing and comparing the rest",
                100.0 * l.parse_s / t,
                l.parse_s
            )
        };
        s.push_str(&format!(
            "* {}: {t:.3} s: **{}**{growth}{close}.\n",
            mode.name(),
            verdict(t <= TARGET_S)
        ));
    }
    s
}
