//! Bench `pps` (also run by `northsouth`): what users buy XDP for. 64-byte UDP datagrams
//! (60 bytes on the veth, 64 on a wire with its FCS) from the external client to a NodePort
//! whose backend is on the other node, sent by a real traffic generator (netsniff-ng's
//! `trafgen`, zero-copy from a TX ring) and counted where they arrive: the backend pod's
//! `eth0`. The same two-node lab (`xlb_tests::twonode`) for every datapath, interleaved in
//! one run: xlb with native XDP on node1's interfaces, xlb with tc only, and kube-proxy's
//! own iptables and nftables rules for the same Service (`xlb emit`, applied on node1 after
//! its agent is stopped and cleaned up). The backend pod's namespace drops the datagrams
//! at its first netfilter hook (an nftables rule, [`sink`]) once its `eth0` has counted
//! them: nothing comes back and no socket lookup or port-unreachable is paid, the same in
//! every row, so what is measured is the forward path with the least fixed cost around it.
//!
//! The generator sends for a fixed time over 256 flows (source ports 10000 to
//! 10255: the steady state of established flows) as fast as it can, from one CPU; a veth
//! delivers on the sender's CPU, so on this VM the generator and the forwarding share it and
//! a row's rate is what one CPU does with both. CPU per packet is the machine's whole CPU
//! time (generator included) and its softirq share, from `/proc/stat`, over the packets
//! that arrived.
//!
//! trafgen runs with `--no-sock-mem --notouch-irq`: it touches neither the host's socket-memory sysctls nor IRQ
//! affinity. Every trial is bounded in time and packets.

use std::{
    fmt::Write as _,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use lb_userspace::emit::Mode;
use xlb_tests::{netns::Netns, services::service_on_nodes, topology::remote_pod_ip, twonode::Lab};

use super::{
    Summary,
    report::{self, Section},
    verdict,
};

/// How long a trial's generator sends (after a warm-up of [`WARM_UP`]).
const SECONDS: f64 = 4.0;
const WARM_UP: f64 = 0.5;
/// The most datagrams one run of the generator sends.
const CAP: u64 = 50_000_000;
const NODE_PORT: u16 = 30090;
/// The backend's port: its namespace drops what arrives there ([`sink`]).
const TARGET_PORT: u16 = 9;

/// The backend pod's sink, loaded with `nft -f -` into its namespace: the datagrams to
/// [`TARGET_PORT`] dropped at prerouting (raw priority, before any routing or socket
/// lookup). Without it the backend's kernel looks a socket up and answers each datagram
/// with a port-unreachable (rate-limited, but built and routed first), about a fifth of a
/// datagram's cost on this VM's profile, and those errors come back through node1's
/// datapath, differently in each row.
fn sink() -> String {
    format!(
        "table ip xlb_pps_sink {{\n  chain pre {{\n    type filter hook prerouting priority raw; \
         policy accept;\n    udp dport {TARGET_PORT} drop\n  }}\n}}\n"
    )
}
/// Targets: XDP ÷ kube-proxy's iptables rules, and XDP ÷ xlb tc.
const XDP_OVER_IPTABLES: f64 = 3.0;
const XDP_OVER_TC: f64 = 1.5;

/// One datapath on node1.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Datapath {
    XlbXdp,
    XlbTc,
    Iptables,
    Nftables,
}

const ROWS: [(Datapath, &str); 4] = [
    (Datapath::XlbXdp, "xlb, XDP native"),
    (Datapath::XlbTc, "xlb, tc"),
    (Datapath::Iptables, "kube-proxy iptables rules"),
    (Datapath::Nftables, "kube-proxy nftables rules"),
];

struct Trial {
    sent: u64,
    sent_pps: f64,
    delivered_pps: f64,
    delivered: u64,
    cpu_ns: f64,
    softirq_ns: f64,
}

fn yaml() -> String {
    service_on_nodes(
        "sink",
        "NodePort",
        "10.96.0.90",
        "UDP",
        90,
        TARGET_PORT,
        Some(NODE_PORT),
        "",
        "",
        &[(remote_pod_ip(1), "node2")],
    )
}

/// The trafgen packet: node1's uplink MAC, the client to the NodePort, 256 source ports.
fn trafgen_config(node_mac: &str) -> String {
    format!(
        "{{\n  eth(da={node_mac}),\n  ipv4(saddr=192.0.2.10, daddr=192.0.2.1, ttl=64),\n  \
         udp(sp=dinc(10000, 10255), dp={NODE_PORT}, csum=0),\n  fill(0x61, 18),\n}}\n"
    )
}

/// An interface's MAC as `ns` sees it.
fn mac(ns: &Netns, iface: &str) -> Result<String> {
    let out = ns
        .command("ip")
        .args(["-j", "link", "show", "dev", iface])
        .output()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("ip -j link show dev {iface}"))?;
    v[0]["address"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("no MAC for {iface}"))
}

/// Packets `iface` received (`dir` "rx") or sent ("tx"), as `ns` sees them.
fn packets(ns: &Netns, iface: &str, dir: &str) -> Result<u64> {
    let out = ns
        .command("ip")
        .args(["-j", "-s", "link", "show", "dev", iface])
        .output()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("ip -j -s link show dev {iface}"))?;
    v[0]["stats64"][dir]["packets"]
        .as_u64()
        .ok_or_else(|| anyhow!("no {dir} count for {iface}"))
}

fn rx_packets(ns: &Netns, iface: &str) -> Result<u64> {
    packets(ns, iface, "rx")
}

fn tx_packets(ns: &Netns, iface: &str) -> Result<u64> {
    packets(ns, iface, "tx")
}

/// The machine's CPU time so far, all of it and the softirq part, in nanoseconds.
fn cpu_ns() -> Result<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat
        .lines()
        .next()
        .ok_or_else(|| anyhow!("empty /proc/stat"))?;
    let ticks: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    if ticks.len() < 7 {
        bail!("/proc/stat: {line}");
    }
    // user nice system idle iowait irq softirq steal …: busy is all but idle and iowait.
    let busy: f64 = ticks
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, t)| t)
        .sum();
    let tick_ns = 1e9 / 100.0;
    Ok((busy * tick_ns, ticks[6] * tick_ns))
}

/// Runs trafgen in the client's namespace for `secs` seconds (stopped with SIGINT), at most
/// [`CAP`] datagrams.
fn trafgen(lab: &Lab, config: &Path, secs: f64) -> Result<Duration> {
    let t = Instant::now();
    let out = lab
        .ext
        .ns
        .command("timeout")
        .args(["-s", "INT", "-k", "5", &format!("{secs}")])
        .args(["trafgen", "--no-sock-mem", "--notouch-irq", "-q", "-C"])
        .args([
            "--cpus",
            "1",
            "--dev",
            "eth0",
            "--num",
            &CAP.to_string(),
            "--conf",
        ])
        .arg(config)
        .output()
        .context("trafgen (Debian's netsniff-ng: cargo xtask setup installs it)")?;
    // 124: stopped by the timeout, as meant. A full veth ring can make trafgen's last flush
    // fail and end it early: the rates come from the interfaces' counters over the time it
    // ran, so that run still counts.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let early = stderr.contains("Flushing TX_RING failed");
    if !out.status.success() && out.status.code() != Some(124) && !early {
        bail!("trafgen failed ({}): {}", out.status, stderr.trim());
    }
    Ok(t.elapsed())
}

/// What node1's netfilter and both nodes' links counted: for a trial where nothing arrived.
fn diagnose(lab: &Lab) -> String {
    let show = |ns: &Netns, cmd: &str, args: &[&str]| {
        ns.command(cmd).args(args).output().map_or_else(
            |e| format!("{cmd}: {e}\n"),
            |o| {
                format!(
                    "$ {cmd} {}\n{}",
                    args.join(" "),
                    String::from_utf8_lossy(&o.stdout)
                )
            },
        )
    };
    let node1 = &lab.topo.node;
    [
        show(node1, "iptables-save", &["-c"]),
        show(node1, "nft", &["list", "ruleset"]),
        show(node1, "ip", &["-s", "link"]),
        show(node1, "ip", &["route"]),
        show(&lab.remote.ns, "ip", &["-s", "link"]),
        show(&lab.remote.ns, "ip", &["route"]),
    ]
    .concat()
}

/// kube-proxy's rules of `mode` for the lab's Service (as `xlb emit` writes them, with
/// iptables' jumps from the built-in chains), applied on node1 once its agent is stopped
/// and its programs and pins are gone.
fn apply_kube_proxy(lab: &mut Lab, svc: &Path, mode: Mode) -> Result<()> {
    lab.agent.stop();
    let out = Command::new(xlb_tests::xlb_bin())
        .args(["cleanup", "--bpffs"])
        .arg(&lab.agent.pins)
        .output()?;
    if !out.status.success() {
        bail!("xlb cleanup: {}", String::from_utf8_lossy(&out.stderr));
    }
    let model = lb_userspace::source::file::load(svc)?.model;
    xlb_lab::compare::install_rules(
        &lab.topo.node,
        mode,
        &model,
        &lb_userspace::model::NodeSettings::default(),
        &lb_userspace::emit::WriterOptions::default(),
        &[lb_userspace::model::IpFamily::V4],
    )
    .map_err(|e| anyhow!("kube-proxy's {mode:?} rules: {e}"))
}

fn one(datapath: Datapath, dir: &Path) -> Result<Trial> {
    let xdp = if datapath == Datapath::XlbXdp {
        "native"
    } else {
        "off"
    };
    let mut lab = Lab::start_with(
        "xlbq",
        &yaml(),
        1500,
        &format!("192.0.2.1:{NODE_PORT}/UDP"),
        // The lab's default SNAT range is 100 ports: fewer than the generator's flows.
        &["--xdp", xdp, "--snat-port-range", "10000-65535"],
    );
    lab.enable_napi_for_redirects();
    let backend = &lab.remote.pods[0];
    backend
        .ns
        .feed("nft", &["-f", "-"], &sink())
        .map_err(|e| anyhow!("the backend's sink: {e}"))?;
    let svc = dir.join("svc.yaml");
    std::fs::write(&svc, yaml())?;
    match datapath {
        Datapath::Iptables => apply_kube_proxy(&mut lab, &svc, Mode::Iptables)?,
        Datapath::Nftables => apply_kube_proxy(&mut lab, &svc, Mode::Nftables)?,
        _ => {}
    }
    let config = dir.join("trafgen.cfg");
    std::fs::write(&config, trafgen_config(&mac(&lab.topo.node, "up0")?))?;
    let backend = &lab.remote.pods[0];
    // Neighbours along the path, and every flow's entries, before the count.
    trafgen(&lab, &config, WARM_UP)?;
    std::thread::sleep(Duration::from_millis(300));
    let client = &lab.ext.ns;
    let (sent0, before) = (
        tx_packets(client, "eth0")?,
        rx_packets(&backend.ns, "eth0")?,
    );
    let (cpu0, soft0) = cpu_ns()?;
    let took = trafgen(&lab, &config, SECONDS)?;
    std::thread::sleep(Duration::from_millis(200));
    let (cpu1, soft1) = cpu_ns()?;
    let sent = tx_packets(client, "eth0")?.saturating_sub(sent0);
    let delivered = rx_packets(&backend.ns, "eth0")?.saturating_sub(before);
    if delivered == 0 {
        bail!(
            "no datagram reached the backend ({sent} sent); node1 and node2:\n{}",
            diagnose(&lab)
        );
    }
    let secs = took.as_secs_f64();
    Ok(Trial {
        sent,
        sent_pps: sent as f64 / secs,
        delivered_pps: delivered as f64 / secs,
        delivered,
        cpu_ns: (cpu1 - cpu0) / delivered as f64,
        softirq_ns: (soft1 - soft0) / delivered as f64,
    })
}

/// Runs the bench: `trials` rounds of every row, interleaved; its report section.
pub fn run(trials: usize) -> Result<Section> {
    let dir = std::env::temp_dir().join(format!("xlb-bench-pps-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = measure(trials, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(section(trials, &result?))
}

fn measure(trials: usize, dir: &Path) -> Result<Vec<Vec<Trial>>> {
    let mut results: Vec<Vec<Trial>> = ROWS.iter().map(|_| Vec::new()).collect();
    for _ in 0..trials {
        for (i, (datapath, name)) in ROWS.iter().enumerate() {
            let t = one(*datapath, dir).with_context(|| name.to_string())?;
            println!(
                "{name:>28}: sent {:.0} pps, delivered {:.0} pps ({} of {}), CPU {:.0} ns/packet (softirq {:.0})",
                t.sent_pps, t.delivered_pps, t.delivered, t.sent, t.cpu_ns, t.softirq_ns
            );
            results[i].push(t);
        }
    }
    Ok(results)
}

fn section(trials: usize, results: &[Vec<Trial>]) -> Section {
    let stat =
        |i: usize, f: fn(&Trial) -> f64| Summary::of(&results[i].iter().map(f).collect::<Vec<_>>());
    let mut body = format!(
        "64-byte UDP datagrams (60 B on the veth) from the external client to NodePort `192.0.2.1:{NODE_PORT}` whose backend is on node2 \
         (externalTrafficPolicy Cluster: DNAT + SNAT on node1), generated by netsniff-ng's `trafgen` ({SECONDS} s a trial over 256 flows, one CPU, \
         as fast as it goes, after a {WARM_UP} s warm-up) and counted at the backend pod's `eth0`; the backend pod's namespace drops them at prerouting (an nftables rule), so nothing comes back and only the forward path is measured. \
         kube-proxy rows: node1's agent stopped and cleaned up, kube-proxy's iptables or nftables rules for the same Service (as `xlb emit` writes them, iptables with its jumps) applied there. \
         A veth delivers on the sender's CPU: the generator and node1's forwarding share one CPU, so a rate is what one CPU does with both. \
         CPU per packet: the whole machine's busy time (generator included) and its softirq part over the packets delivered. \
         Median [min–max] of {trials} trials, rows interleaved.\n\n",
    );
    let headers: Vec<String> = [
        "datapath",
        "delivered pps",
        "sent pps",
        "delivered of sent",
        "CPU ns/packet",
        "softirq ns/packet",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows: Vec<Vec<String>> = ROWS
        .iter()
        .enumerate()
        .map(|(i, (_, name))| {
            vec![
                name.to_string(),
                stat(i, |t| t.delivered_pps).show(0),
                stat(i, |t| t.sent_pps).show(0),
                format!(
                    "{:.1}%",
                    100.0 * stat(i, |t| t.delivered as f64 / t.sent.max(1) as f64).median
                ),
                stat(i, |t| t.cpu_ns).show(0),
                stat(i, |t| t.softirq_ns).show(0),
            ]
        })
        .collect();
    body.push_str(&report::table(&headers, &rows));
    let pps = |i: usize| stat(i, |t| t.delivered_pps).median;
    let over_ipt = pps(0) / pps(2);
    let over_tc = pps(0) / pps(1);
    let _ = write!(
        body,
        "\n**Ratios** (medians of this run): XDP ÷ iptables {over_ipt:.2}×, XDP ÷ nftables {:.2}×, XDP ÷ tc {over_tc:.2}×, \
         tc ÷ iptables {:.2}×. Cilium 1.8's published anchor on real NICs: kube-proxy ≈ 2.1 M/s, tc eBPF ≈ 3.6 M/s, XDP ≥ 10 M/s (generator-bound).\n\n\
         **Targets**\n\n* XDP ≥ {XDP_OVER_IPTABLES}× kube-proxy's iptables rules: **{}** ({over_ipt:.2}×).\n\
         * XDP ≥ {XDP_OVER_TC}× xlb tc: **{}** ({over_tc:.2}×).\n* CPU per packet reported: **met**.\n",
        pps(0) / pps(3),
        pps(1) / pps(2),
        verdict(over_ipt >= XDP_OVER_IPTABLES),
        verdict(over_tc >= XDP_OVER_TC),
    );
    if over_ipt < XDP_OVER_IPTABLES || over_tc < XDP_OVER_TC {
        body.push_str(
            "\nWhat holds the ratios here (a `perf record -a -g` of each row, 2026-12-07): on a veth every datagram is an skb \
             from the generator's socket on: the sender's transmit, node2's forward and the backend's receive cost the same \
             in every row and run on the generator's CPU, so a datapath saves only node1's share. In the XDP row node1's \
             program is about a tenth of a datagram's cost, and its interface first copies the generator's zero-copy skb \
             into a page with XDP's headroom (`skb_pp_cow_data`, `skb_copy_ubufs`, as much again); the redirected frame \
             becomes an skb again in node2's NAPI poll. tc and XDP skip node1's netfilter and conntrack, which cost the iptables row \
             about 0.4 µs of its 4.7 (CPU per datagram, an idle machine, 2026-12-07). The flows are established and SNATed, so XDP makes no route lookup here. What would \
             close it: frames that reach node1 without an skb, as a NIC's do: a generator of XDP frames (xdp-tools' \
             `xdp-trafficgen`; Debian's 1.3.1 cannot load on this kernel, which no longer has the `xdp_redirect_map_err` \
             tracepoint it attaches to) or a NIC with native XDP and a generator on another machine, which this VM lacks.\n",
        );
    }
    Section {
        title: "pps: 64-byte UDP to a NodePort, xlb XDP and tc beside kube-proxy's rules".into(),
        body,
    }
}
