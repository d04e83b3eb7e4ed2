//! Bench `traffic`: real TCP through each implementation, in namespaces.
//!
//! Per number of services, one lab per implementation, all built before measuring: a node
//! namespace, a client pod and one backend pod with an echo server (`compare::install`; xlb's
//! labs run their socket hooks on a cgroup of the lab's own). The
//! measured service is the last one in kube-proxy's rule order (namespace `zzz`); the others
//! are fillers with endpoints that no pod serves. Every row's load generator is the same
//! process, `xlb-probe load`, in the client pod's or the node's namespace, and, for the
//! socket-hook rows, in the agent's cgroup (a thread of the bench could not join it); the
//! tc row has an xlb lab of its own (`--socket-lb host`). It is
//! bounded in time: a warm-up of at most 10 s, then
//! * new connections per second: connect, one request, its response, close, in a loop;
//! * requests per second on one kept connection;
//! * one bulk TCP stream's throughput (the client writes as fast as it can into the echo
//!   server's sink, which counts the bytes);
//! * first-packet latency: how long `connect()` takes (SYN to SYN-ACK through the datapath),
//!   p50 and p99 over every new connection.
//!
//! Rows are measured in turn, one generator at a time, for [`TRIALS`] rounds; the tables show
//! medians [min–max]. "direct" sends to the pod's own address: the floor.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    time::Duration,
};

use anyhow::{Result, anyhow};
use lb_userspace::{
    emit::Mode,
    model::{Model, NodeSettings, Protocol},
    source::file,
};
use xlb_lab::{
    compare::{Impl, Installed, LabSpec, Origin, install},
    load::Measured,
    probe,
    process::run_client,
};
use xlb_tests::unique_tag;

use super::{
    Summary,
    report::{self, Section, Series},
    verdict,
};

const SIZES: [usize; 3] = [1, 1_000, 10_000];
/// The userspace proxy binds a port per service: measured up to this many services.
const USERSPACE_MAX: usize = 1_000;
const PHASE: Duration = Duration::from_millis(1500);
const TRIALS: usize = 5;
/// A generator still running after this is killed (warm-up 10 s + three phases).
const GENERATOR_LIMIT: Duration = Duration::from_secs(30);
const MEASURED_VIP: Ipv4Addr = Ipv4Addr::new(10, 94, 0, 1);
const BACKEND: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 2);
const PORT: u16 = 8080;

/// Who generates the load, and which path it takes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Row {
    /// The pod straight to the backend pod's address: the floor.
    Direct,
    /// The same in xlb's lab: every packet passes the tc program on the pods' veths (as a
    /// flow the hooks translated does).
    DirectTc,
    /// The node straight to the backend pod's address: the floor of host → ClusterIP.
    HostDirect,
    /// pod → ClusterIP through xlb's tc program (an agent with `--socket-lb host`).
    Tc,
    /// pod → ClusterIP through the socket hooks (the generator in the agent's cgroup).
    SockPod,
    /// host → ClusterIP through the socket hooks (the generator in the agent's cgroup, in
    /// the node namespace).
    SockHost,
    Iptables,
    Nftables,
    Userspace,
}

/// The rows in the order a trial measures them: each ClusterIP path of xlb right after
/// the floor it is divided by.
const ROWS: [Row; 9] = [
    Row::Direct,
    Row::DirectTc,
    Row::SockPod,
    Row::Tc,
    Row::HostDirect,
    Row::SockHost,
    Row::Iptables,
    Row::Nftables,
    Row::Userspace,
];

impl Row {
    fn name(self) -> &'static str {
        match self {
            Row::Direct => "direct to pod",
            Row::DirectTc => "direct to pod, xlb's tc attached",
            Row::HostDirect => "host direct to pod",
            Row::Tc => "xlb tc (pod → ClusterIP)",
            Row::SockPod => "xlb socket hooks (pod → ClusterIP)",
            Row::SockHost => "xlb socket hooks (host → ClusterIP)",
            Row::Iptables => "iptables",
            Row::Nftables => "nftables",
            Row::Userspace => "userspace",
        }
    }

    /// The lab the row runs in (`None`: nothing installed).
    fn lab(self) -> Option<Impl> {
        match self {
            Row::Direct | Row::HostDirect => None,
            // Labs of their own: a flow tc translated leaves conntrack entries that a later
            // connection straight to the backend from the same client port would run into.
            Row::Tc => Some(Impl::EbpfHost),
            Row::DirectTc | Row::SockPod | Row::SockHost => Some(Impl::Ebpf),
            Row::Iptables => Some(Impl::KubeProxy(Mode::Iptables)),
            Row::Nftables => Some(Impl::KubeProxy(Mode::Nftables)),
            Row::Userspace => Some(Impl::KubeProxy(Mode::Userspace)),
        }
    }

    fn origin(self) -> Origin {
        match self {
            Row::HostDirect | Row::SockHost => Origin::Node,
            _ => Origin::Pod,
        }
    }

    /// Whether the generator joins the agent's cgroup (the socket hooks serve it).
    fn in_cgroup(self) -> bool {
        matches!(self, Row::SockPod | Row::SockHost)
    }

    fn target(self) -> SocketAddr {
        match self {
            Row::Direct | Row::DirectTc | Row::HostDirect => SocketAddr::from((BACKEND, PORT)),
            _ => SocketAddr::from((MEASURED_VIP, 80)),
        }
    }

    fn measured_at(self, n: usize) -> bool {
        self != Row::Userspace || n <= USERSPACE_MAX
    }
}

/// `n` services: `n - 1` fillers, then the measured one (last in kube-proxy's order).
fn services_yaml(n: usize) -> String {
    let mut y = String::new();
    for i in 0..n.saturating_sub(1) {
        let vip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 0)) + i as u32 + 1);
        let a = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 250, 0, 0)) + 2 * i as u32);
        let b = Ipv4Addr::from(u32::from(a) + 1);
        y.push_str(
            &xlb_tests::services::service_yaml(&format!("f{i}"), vip, 80, "TCP", PORT, &[a, b])
                .replace("namespace: test", "namespace: fill"),
        );
    }
    y.push_str(
        &xlb_tests::services::service_yaml("measured", MEASURED_VIP, 80, "TCP", PORT, &[BACKEND])
            .replace("namespace: test", "namespace: zzz"),
    );
    y
}

/// A lab for `mode` on the services file `src`.
fn build_lab(mode: Option<Impl>, src: &Path, model: &Model, xlb: &Path) -> Result<Installed> {
    let settings = NodeSettings {
        node_name: "node1".into(),
        ..NodeSettings::default()
    };
    // No nfacct objects in the bench's namespaces (the default).
    let options = lb_userspace::emit::WriterOptions::default();
    let pods: BTreeMap<IpAddr, BTreeSet<(u16, Protocol)>> =
        [(IpAddr::V4(BACKEND), [(PORT, Protocol::Tcp)].into())].into();
    let lab = install(&LabSpec {
        mode,
        tag: &unique_tag("xlbt"),
        source: src,
        xlb,
        model,
        settings: &settings,
        options: &options,
        pods: &pods,
        frontends: &[SocketAddr::from((MEASURED_VIP, 80))],
    })
    .map_err(anyhow::Error::msg)?;
    // The labs live through every trial: without reuse, the TIME_WAIT sockets of earlier
    // phases fill the generators' ephemeral ports and connect() slows to a crawl searching
    // for a free one.
    for origin in [Origin::Pod, Origin::Node] {
        lab.namespace(origin)
            .sysctl(&["net.ipv4.tcp_tw_reuse=1"])
            .map_err(anyhow::Error::msg)?;
    }
    Ok(lab)
}

/// One run of `row`'s generator (`xlb-probe load`) in its lab.
fn measure_row(row: Row, lab: &Installed, xlb: &Path) -> Result<Measured> {
    let cgroup = if row.in_cgroup() {
        Some(
            lab.cgroup
                .as_ref()
                .ok_or_else(|| anyhow!("no cgroup in xlb's lab"))?,
        )
    } else {
        None
    };
    let args = [
        "load".to_string(),
        "--phase-ms".into(),
        PHASE.as_millis().to_string(),
        row.target().to_string(),
    ];
    let out = run_client(
        &probe::bin_beside(xlb),
        lab.namespace(row.origin()),
        cgroup,
        &args,
        GENERATOR_LIMIT,
    )
    .map_err(|e| anyhow!("{}: {e}", row.name()))?;
    Measured::parse(out.trim()).map_err(|e| anyhow!("{}: {e}", row.name()))
}

type Results = BTreeMap<(Row, usize), Vec<Measured>>;

/// Every row at `n` services, [`TRIALS`] rounds, into `results`.
fn run_size(n: usize, xlb: &Path, results: &mut Results) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("{}-src", unique_tag("xlbt")));
    std::fs::create_dir_all(&dir)?;
    let src = dir.join("services.yaml");
    std::fs::write(&src, services_yaml(n))?;
    let model = file::load(&src).map_err(|e| anyhow!("{e}"))?.model;
    let rows: Vec<Row> = ROWS.into_iter().filter(|r| r.measured_at(n)).collect();
    let mut labs: BTreeMap<Option<Impl>, Installed> = BTreeMap::new();
    for mode in rows.iter().map(|r| r.lab()) {
        if let std::collections::btree_map::Entry::Vacant(e) = labs.entry(mode) {
            e.insert(build_lab(mode, &src, &model, xlb)?);
        }
    }
    for trial in 0..TRIALS {
        for &row in &rows {
            let m = measure_row(row, &labs[&row.lab()], xlb)?;
            println!(
                "{:>36} {n:>6} services, trial {trial}: {:.0} conn/s, {:.0} req/s, connect p50 {:.0} µs p99 {:.0} µs, {} failures",
                row.name(),
                m.conns_per_s,
                m.reqs_per_s,
                m.connect_p50_us,
                m.connect_p99_us,
                m.failures
            );
            results.entry((row, n)).or_default().push(m);
        }
    }
    drop(labs);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The median of one field over a cell's trials.
fn median(results: &Results, row: Row, n: usize, f: fn(&Measured) -> f64) -> f64 {
    results.get(&(row, n)).map_or(f64::NAN, |ms| {
        Summary::of(&ms.iter().map(f).collect::<Vec<_>>()).median
    })
}

fn conns(m: &Measured) -> f64 {
    m.conns_per_s
}

fn reqs(m: &Measured) -> f64 {
    m.reqs_per_s
}

fn bulk(m: &Measured) -> f64 {
    m.bulk_mb_per_s
}

/// The table of every cell.
fn table(results: &Results) -> String {
    let headers: Vec<String> = [
        "path",
        "services",
        "new conn/s",
        "req/s (kept)",
        "connect p50 (µs)",
        "connect p99 (µs)",
        "bulk MB/s (one stream)",
        "failures",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let stat = |ms: &[Measured], f: fn(&Measured) -> f64| {
        Summary::of(&ms.iter().map(f).collect::<Vec<_>>())
    };
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|((row, n), ms)| {
            vec![
                row.name().to_string(),
                n.to_string(),
                stat(ms, conns).show(0),
                stat(ms, reqs).show(0),
                format!("{:.0}", stat(ms, |m| m.connect_p50_us).median),
                format!("{:.0}", stat(ms, |m| m.connect_p99_us).median),
                stat(ms, bulk).show(0),
                ms.iter().map(|m| m.failures).sum::<usize>().to_string(),
            ]
        })
        .collect();
    report::table(&headers, &rows)
}

/// `row` ÷ `floor` at `n` services: the median over trials of the ratio of the two
/// measured one after the other in the same trial (slow drifts of a shared machine cancel).
fn ratio(results: &Results, row: Row, floor: Row, n: usize, f: fn(&Measured) -> f64) -> f64 {
    let (Some(a), Some(b)) = (results.get(&(row, n)), results.get(&(floor, n))) else {
        return f64::NAN;
    };
    let paired: Vec<f64> = a.iter().zip(b).map(|(a, b)| f(a) / f(b)).collect();
    Summary::of(&paired).median
}

/// The ratio lines: every ClusterIP path ÷ its floor (the pod's or the host's).
fn ratios(results: &Results) -> String {
    let mut body = String::from(
        "\n**Ratios** (median over trials of each trial's row ÷ its floor measured in the same trial, seconds apart: pod rows ÷ \
         direct to pod, the host row ÷ host direct to pod; ≥ 0.91 = within 1.1×):\n\n",
    );
    for &n in &SIZES {
        let mut line = format!("* {n} services, new conn/s:");
        let mut kept = String::from(" req/s (kept):");
        let mut stream = String::from(" bulk MB/s:");
        for row in ROWS
            .iter()
            .filter(|r| r.lab().is_some() && r.measured_at(n))
        {
            let floor = floor_of(*row);
            let _ = write!(
                line,
                " {} {:.2}×;",
                row.name(),
                ratio(results, *row, floor, n, conns)
            );
            let _ = write!(
                kept,
                " {} {:.2}×;",
                row.name(),
                ratio(results, *row, floor, n, reqs)
            );
            let _ = write!(
                stream,
                " {} {:.2}×;",
                row.name(),
                ratio(results, *row, floor, n, bulk)
            );
        }
        let _ = writeln!(body, "{line}{kept}{stream}");
    }
    body
}

fn floor_of(row: Row) -> Row {
    match row.origin() {
        Origin::Pod => Row::Direct,
        Origin::Node => Row::HostDirect,
    }
}

/// `row`'s new conn/s at the largest size ÷ at 1 service.
fn flatness(results: &Results, row: Row) -> f64 {
    median(results, row, SIZES[SIZES.len() - 1], conns) / median(results, row, SIZES[0], conns)
}

/// The lowest `row ÷ direct` over every size, for `f`.
fn worst(results: &Results, row: Row, f: fn(&Measured) -> f64) -> f64 {
    SIZES
        .iter()
        .map(|&n| ratio(results, row, floor_of(row), n, f))
        .fold(f64::INFINITY, f64::min)
}

/// The target lines.
fn targets(results: &Results) -> String {
    let last = SIZES[SIZES.len() - 1];
    let tc = worst(results, Row::Tc, conns);
    let sock_conns = worst(results, Row::SockPod, conns);
    let sock_reqs = worst(results, Row::SockPod, reqs);
    let sock_flat = flatness(results, Row::SockPod);
    let tc_bulk = worst(results, Row::Tc, bulk);
    let sock_bulk = worst(results, Row::SockPod, bulk);
    let ipt_flat = flatness(results, Row::Iptables);
    let sock_ok = sock_conns >= 1.0 && sock_reqs >= 1.0 && sock_flat >= 0.9;
    let mut body = format!(
        "\n**Targets**\n\n\
         * pod → ClusterIP through the socket hooks at least 1.0× of straight to the pod, new conn/s and kept-connection req/s, \
         flat from 1 to {last} services: **{}** (worst ÷ direct: {sock_conns:.2}× new conn/s, {sock_reqs:.2}× req/s; \
         conn/s at {last} ÷ at 1 = {sock_flat:.2}×).\n\
         * xlb's tc path within 1.1× of direct-to-pod (new conn/s): **{}** (worst ÷ direct = {tc:.2}×).\n\
         * xlb's tc path flat in the number of services: **{}** (conn/s at {last} ÷ at 1 = {:.2}×).\n\
         * one bulk TCP stream through a ClusterIP at least 0.97× of straight to the pod, tc and socket hooks: **{}** \
         (worst ÷ direct: tc {tc_bulk:.2}×, socket hooks {sock_bulk:.2}×){}.\n\
         * iptables falling as services grow: {} (conn/s at {last} ÷ at 1 = {ipt_flat:.2}×).\n",
        verdict(sock_ok),
        verdict(tc >= 1.0 / 1.1),
        verdict(flatness(results, Row::Tc) >= 0.9),
        flatness(results, Row::Tc),
        verdict(tc_bulk >= 0.97 && sock_bulk >= 0.97),
        if tc_bulk < 0.97 {
            ". What would close it for tc: every segment of the stream pays the conntrack \
             lookup, the NAT rewrite and its checksum fix-up on the way in and the reverse NAT \
             on the way back (the socket hooks pay nothing per packet); GRO-sized segments \
             (tc sees super-packets on veth) keep that to a few hundred ns per 64 KB, so what \
             is left is the per-packet work of the established path measured in bench \
             datapath, and the route MTU check on each new super-packet size"
        } else {
            ""
        },
        if ipt_flat < 0.9 {
            "**shown**"
        } else {
            "**not visible here**"
        },
    );
    if !sock_ok {
        body.push_str(&sock_gap(results));
    }
    let tc_failures: usize = SIZES
        .iter()
        .filter_map(|&n| results.get(&(Row::Tc, n)))
        .flatten()
        .map(|m| m.failures)
        .sum();
    if tc_failures > 0 {
        let _ = write!(
            body,
            "\n*The tc row's failures* ({tc_failures} in all, each a connect that timed out after 1 s, which is most of \
             its lost rate): the generator reuses TIME_WAIT tuples (`tcp_tw_reuse=1`, set so that the labs can live \
             through every trial without running out of ports). xlb takes a reused tuple's own closed-flow reply entry for \
             a clash with a live flow and remaps the source port from the SNAT range, which runs out (`snat_failed`) after \
             a few thousand reuses; kube-proxy's conntrack reuses the closed entry (no failures above). \
             `a_reused_tuple_through_a_cluster_ip_keeps_the_clients_port` (ignored, `tests/tests/traffic.rs`) reproduces \
             it. *What would close it*: replace a reply entry that belongs to the new flow's own client tuple instead of \
             remapping.\n"
        );
    }
    body
}

/// Where the socket hooks' gap to direct-to-pod comes from: the hooks against direct with
/// xlb's tc program attached (the same lab), and what would close the rest.
fn sock_gap(results: &Results) -> String {
    let of = |f: fn(&Measured) -> f64| {
        SIZES
            .iter()
            .map(|&n| ratio(results, Row::SockPod, Row::DirectTc, n, f))
            .fold(f64::INFINITY, f64::min)
    };
    let (c, r) = (of(conns), of(reqs));
    let tc_c = worst(results, Row::DirectTc, conns);
    let tc_r = worst(results, Row::DirectTc, reqs);
    format!(
        "\n*What would close the socket-hook target*: the hooks run once per connection; after `connect()` the flow is \
         plain pod-to-pod traffic that still passes xlb's tc program on both pods' veths (a conntrack and a service lookup \
         that miss, about 180 ns a packet in `bench datapath`), which the direct row's lab does not have. Direct to the pod \
         with that program attached is (worst over sizes) {tc_c:.2}× new conn/s and {tc_r:.2}× req/s of direct; the hooks' \
         row against it is {c:.2}× and {r:.2}×{}. Letting tc return before its lookups for packets of sockets the hooks \
         translated (a mark those sockets carry, or a destination prefilter ahead of the conntrack lookup), or attaching \
         no tc program to the veths of pods that all run in the hooks' cgroup, would close it.\n",
        if c >= 0.97 && r >= 0.97 {
            ": the gap is tc's per-packet cost, not the hooks"
        } else {
            ""
        }
    )
}

/// The calling thread pinned to one CPU while it lives: every thread and process it starts
/// meanwhile inherits the pin (echo servers and their connection threads, agents, proxies,
/// load generators), so every row's generator, server and the softirqs their packets raise
/// share one CPU, whatever else the machine runs. The previous mask comes back on drop.
struct Pinned(libc::cpu_set_t);

impl Pinned {
    /// Pins to the last CPU; `None` (nothing changed) where that fails.
    fn last_cpu() -> Option<(Self, usize)> {
        let cpu = std::thread::available_parallelism().ok()?.get() - 1;
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: a zeroed cpu_set_t is an empty set; the calls get its size and a valid
        // pointer, and affect only the calling thread (pid 0).
        unsafe {
            let mut old: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, size, &mut old) != 0 {
                return None;
            }
            let mut one: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut one);
            (libc::sched_setaffinity(0, size, &one) == 0).then_some((Pinned(old), cpu))
        }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: restores the mask read before, on the same thread.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.0) };
    }
}

/// Runs the bench; returns its report section.
pub fn run(xlb: &Path) -> Result<Section> {
    let mut results = Results::new();
    let pinned = Pinned::last_cpu();
    let placement = match &pinned {
        Some((_, cpu)) => format!(
            "Everything on the measured path runs on CPU {cpu} (the bench pins itself there before building the labs; \
             echo servers, agents, proxies and generators inherit it), so a row does not gain or lose by where the \
             scheduler puts its generator and server, and other work on the machine goes to the other CPU. "
        ),
        None => "Nothing is pinned (setting the CPU affinity failed). ".to_string(),
    };
    for &n in &SIZES {
        run_size(n, xlb, &mut results)?;
    }
    drop(pinned);
    let mut body = format!(
        "Real TCP to one echo backend through each path, in namespaces built for the run (`compare::install`; xlb's socket-hook \
         rows in a lab with `--socket-lb all`, its hooks on a cgroup of the lab's own, the tc row in one with `--socket-lb host`). The measured service is last in kube-proxy's rule order; \
         the other services are fillers. Every row's load generator is the same process (`xlb-probe load`): in the client pod, \
         or in the node namespace for the host rows; in the agent's cgroup for the socket-hook rows. Each phase runs {:.1} s: *new conn/s* = connect + one request + response + close in a \
         loop; *req/s* = requests on one kept connection; *connect* = the time `connect()` takes (first packet → SYN-ACK), \
         p50/p99 in µs. Median [min–max] of {TRIALS} trials, the rows of one size measured in turn in every trial (in the order \
         direct, direct with tc attached, pod hooks, tc, host direct, host hooks, iptables, nftables, userspace), all labs of that size up at once. The userspace proxy is measured up to {USERSPACE_MAX} services (it binds a port per service). \
         {placement}A shared 2-core VM: expect noise.\n\n",
        PHASE.as_secs_f64()
    );
    body.push_str(&table(&results));
    body.push_str(&ratios(&results));
    body.push_str(&targets(&results));
    body.push_str("\n![traffic](bench-traffic.svg)\n");
    let series: Vec<Series> = ROWS
        .iter()
        .map(|row| Series {
            name: row.name().to_string(),
            points: SIZES
                .iter()
                .filter(|&&n| results.contains_key(&(*row, n)))
                .map(|&n| (n as f64, median(&results, *row, n, conns)))
                .collect(),
        })
        .collect();
    report::line_plot(
        "bench-traffic.svg",
        "new connections per second",
        "services",
        "conn/s",
        &series,
    )?;
    Ok(Section {
        title: "traffic: real TCP through each path".into(),
        body,
    })
}
