//! kube-proxy beside xlb: its rules for the same services loaded with iptables-restore and
//! nft -f in fresh namespaces, and its nftables partial sync of one endpoint change.

use std::{fs::File, net::Ipv4Addr, process::Stdio, time::Instant};

use anyhow::{Context, Result, bail};
use lb_userspace::{
    emit::{self, Mode},
    model::NodeSettings,
};
use xlb_tests::{netns::Netns, services::service_yaml, unique_tag};

use super::Rules;
use crate::bench::{
    Summary,
    fixture::{SVC_PORT, TARGET_PORT, addr_add, backend_ip, model, parse_model, vip},
    percentile,
};

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
    let opts = emit::WriterOptions::default();
    assert!(!opts.host.nfacct_invalid_dropped && !opts.host.nfacct_localhost_nodeports);
    Ok(emit::render(mode, &m, &NodeSettings::default(), &opts))
}

pub(super) fn rules(
    program: &str,
    args: &[&str],
    sizes: &[(usize, usize)],
    mode: Mode,
) -> Result<Vec<Rules>> {
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
pub(super) fn power_fit(points: &[(f64, f64)]) -> (f64, f64) {
    let [.., (n1, t1), (n2, t2)] = points else {
        return (0.0, 1.0);
    };
    let b = (t2 / t1).ln() / (n2 / n1).ln();
    (t2 / n2.powf(b), b)
}

/// kube-proxy's nftables partial sync of one endpoint change, against a table holding
/// `services` × 2 endpoints loaded in a fresh namespace: the transaction kube-proxy sends
/// (the new endpoint chain and its rules, the service chain flushed and rewritten, the old
/// endpoint chain deleted), made by diffing xlb's kube-proxy nftables output of the
/// service before and after, run with `nft -f`. Seconds per change.
pub(super) fn nft_partial(services: usize, changes: usize) -> Result<Vec<f64>> {
    let mut m = model(services, |_| 2)?;
    let node = NodeSettings::default();
    let opts = emit::WriterOptions::default();
    let ns = Netns::new(&unique_tag("xlbp")).map_err(anyhow::Error::msg)?;
    let full = emit::render(Mode::Nftables, &m, &node, &opts);
    let t = Instant::now();
    nft_in(&ns, &full)?;
    println!(
        "nft -f of {services} × 2 (the table to change): {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let mut out = Vec::new();
    for n in 0..changes {
        let i = (n * 7_919 + 13) % services;
        let before = emit::render(Mode::Nftables, &m, &node, &opts);
        let ips = [
            backend_ip(i, 1),
            addr_add(Ipv4Addr::new(10, 160, 0, 0), n as u32),
        ];
        let part = parse_model(&service_yaml(
            &format!("s{i}"),
            vip(i),
            SVC_PORT,
            "TCP",
            TARGET_PORT,
            &ips,
        ))?;
        m.slices.extend(part.slices);
        let after = emit::render(Mode::Nftables, &m, &node, &opts);
        let tx = partial_transaction(&before, &after, &format!("/s{i}/"));
        let t = Instant::now();
        nft_in(&ns, &tx)?;
        out.push(t.elapsed().as_secs_f64());
    }
    println!(
        "kube-proxy nftables partial sync at {services} × 2: p50 {:.3} s",
        percentile(&out, 50.0)
    );
    Ok(out)
}

/// The nft transaction taking service `marker`'s chains from `before` to `after`: new
/// chains and their rules added, the service chain flushed and rewritten, chains gone
/// deleted (after nothing jumps to them).
fn partial_transaction(before: &str, after: &str, marker: &str) -> String {
    let ours = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| l.contains(marker))
            .map(str::to_string)
            .collect()
    };
    let (old, new) = (ours(before), ours(after));
    let chains = |ls: &[String]| -> Vec<String> {
        ls.iter()
            .filter_map(|l| l.strip_prefix("add chain ip kube-proxy "))
            .map(|c| c.split_whitespace().next().unwrap_or("").to_string())
            .collect()
    };
    let (old_chains, new_chains) = (chains(&old), chains(&new));
    let mut tx = String::new();
    for c in new_chains.iter().filter(|c| !old_chains.contains(c)) {
        tx.push_str(&format!("add chain ip kube-proxy {c}\n"));
    }
    for c in new_chains.iter().filter(|c| old_chains.contains(c)) {
        tx.push_str(&format!("flush chain ip kube-proxy {c}\n"));
    }
    for l in new.iter().filter(|l| l.starts_with("add rule ")) {
        tx.push_str(l);
        tx.push('\n');
    }
    for c in old_chains.iter().filter(|c| !new_chains.contains(c)) {
        tx.push_str(&format!("delete chain ip kube-proxy {c}\n"));
    }
    tx
}

/// `nft -f -` of `text` in `ns`.
fn nft_in(ns: &Netns, text: &str) -> Result<()> {
    use std::io::Write;
    let mut child = ns
        .command("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("start nft")?;
    child
        .stdin
        .take()
        .context("nft stdin")?
        .write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "nft failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
