//! Bench `datapath`: ns per packet through the loaded tc and XDP programs by
//! `BPF_PROG_TEST_RUN`, at 1, 1,000, 10,000 and 100,000 services of 2 to 10 backends each.
//!
//! Two methods, both reported, for each hook:
//!
//! * **distinct** (the one the targets use): each of [`FLOWS`] distinct packets runs once
//!   (`repeat = 1`) and the kernel's own `duration` for that one run is taken; a trial's
//!   number is the median over the packets. Every case runs this way, the floor included,
//!   so the harness's fixed cost (timer reads, `local_bh_disable`) is in all of them alike.
//!   A *new flow* is the first packet of its 5-tuple (a SYN) after the conntrack map was
//!   emptied; *established* is each flow's next packet (an ACK on the same 5-tuple: a
//!   conntrack hit); *reply* is the backend's answer for each flow; with 16,384 flows spread over all services the lookups
//!   do not sit in one hot cache line.
//! * **hot** (`repeat = N` on one packet): the program rewrites the packet in place and the
//!   kernel feeds the rewritten packet to the next repeat, so a plain repeat would measure
//!   one DNAT and then N−1 non-service packets. Two services that are each other's backend
//!   (A:80 → B:8080, B:8080 → A:80) make every repeat a real conntrack hit with a real
//!   rewrite (established: A→B→A…; reply: the two reply entries restore each other). New
//!   flows cannot be measured this way (the second repeat is no longer new).
//!
//! Everything runs in a network namespace of its own whose `dum0` (a veth, forwarding on)
//! routes the backends, clients and cycle services to a next hop with a permanent neighbour
//! entry, so XDP's route lookups succeed and it translates every service packet (passing it
//! to the stack: `dum0` is not in the redirect map). The node config says what the agent's
//! would of the namespace's routing (no rule by source: XDP keeps a remote backend's way
//! out per backend, `Datapath::configure_routing`). Each hook's floor is an empty program of
//! the same kind (`xlb_tc_pass`, `xlb_xdp_pass`), run the same way in the same trial.
//!
//! The per-reason counters are checked after every case: each run must have been counted
//! under the expected verdict (new flow, established, reverse NAT, pass).
//!
//! IPv6 rows (`ipv6.rs`): as many IPv6 services as IPv4 ones in the same maps, the same
//! distinct flows over IPv6 through tc and XDP, in the same trials, with their ratio to IPv4.
//!
//! SCTP rows (`sctp.rs`): as many SCTP services as TCP ones (each TCP service's ClusterIP
//! and backends, its port rewritten so each packet's CRC32c is updated), the same distinct
//! flows as SCTP packets through tc, in the same trials, with their ratio to TCP.
//!
//! Maglev rows (`maglev.rs`): a new flow through tc to frontends with a Maglev table, beside
//! random choice on the same flows in the same trial.
//!
//! `XLB_BENCH_SCALES=1,10000` (and `XLB_BENCH_TRIALS=N`) runs a quick subset and leaves
//! `docs/benchmarks.md` alone; `XLB_BENCH_OBJECT=PATH` loads another build of lb-ebpf (two
//! builds compared by alternating runs of the quick subset).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use anyhow::{Result, anyhow, bail};
use lb_common::{R_ESTABLISHED, R_NEW_FLOW, R_PASS, R_REPLY_IN, R_REVERSE_NAT};
use lb_userspace::packet::{PacketBuilder, TCP_ACK, parse};
use xlb_lab::netns::Netns;
use xlb_tests::{services::service_yaml, unique_tag};

mod ipv6;
mod maglev;
mod report_section;
mod sctp;

use report_section::render;

use super::{
    Summary,
    fixture::{
        Capacities, Datapath, PROG_EGRESS, PROG_INGRESS, PROG_PASS, PROG_XDP, PROG_XDP_PASS,
        SVC_PORT, TARGET_PORT, addr_add, backends_2_to_10, extend_model, parse_model,
        protocol_services_yaml, vip,
    },
    report::Section,
};

/// A hook measured: its program, its floor and the verdict both return for a packet that
/// goes on.
#[derive(Clone, Copy)]
struct Hook {
    name: &'static str,
    prog: &'static str,
    floor: &'static str,
    ok: u32,
}

const HOOKS: [Hook; 2] = [
    Hook {
        name: "tc",
        prog: PROG_INGRESS,
        floor: PROG_PASS,
        ok: 0,
    },
    Hook {
        name: "XDP",
        prog: PROG_XDP,
        floor: PROG_XDP_PASS,
        ok: 2,
    },
];

/// The hooks the IPv6 rows run through: both.
const HOOKS6: [Hook; 2] = HOOKS;

/// Service counts measured.
const SCALES: [usize; 4] = [1, 1_000, 10_000, 100_000];

/// The scales and trials to run: all, or the quick subset the environment asks for (and
/// whether it is the full run, whose report goes to docs/benchmarks.md).
fn plan() -> Result<(Vec<usize>, usize, bool)> {
    let trials = match std::env::var("XLB_BENCH_TRIALS") {
        Ok(t) => t
            .parse()
            .map_err(|e| anyhow!("XLB_BENCH_TRIALS={t}: {e}"))?,
        Err(_) => TRIALS,
    };
    match std::env::var("XLB_BENCH_SCALES") {
        Ok(list) => {
            let scales = list
                .split(',')
                .map(|n| n.trim().parse::<usize>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| anyhow!("XLB_BENCH_SCALES={list}: {e}"))?;
            Ok((scales, trials, false))
        }
        Err(_) => Ok((SCALES.to_vec(), trials, trials == TRIALS)),
    }
}
/// Distinct flows per trial (≥ 4,000 so conntrack does not sit in cache).
const FLOWS: usize = 16_384;
/// Trials per scale.
const TRIALS: usize = 5;
/// Repeats of the hot method.
const HOT_REPEAT: u32 = 200_000;

/// The cycle services of the hot method.
const CYCLE_A: Ipv4Addr = Ipv4Addr::new(10, 95, 0, 1);
const CYCLE_B: Ipv4Addr = Ipv4Addr::new(10, 95, 0, 2);
const CYCLE_CLIENT: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 250, 0, 1), 12345);

/// Case names, in table order (distinct method).
const CASES: [&str; 7] = [
    "floor (pass-only program)",
    "non-service",
    "new flow",
    "established",
    "reply (ingress)",
    "egress non-service",
    "egress reply (reverse NAT)",
];
/// Case names of the hot method.
const HOT_CASES: [&str; 4] = [
    "floor (pass-only program)",
    "non-service",
    "established",
    "reply (ingress)",
];

/// Results at one service count.
struct Scale {
    services: usize,
    svc_entries: usize,
    backends: usize,
    program_s: f64,
    /// Per hook of [`HOOKS`], per case of [`CASES`]: trial medians of ns per packet.
    distinct: Vec<Vec<Summary>>,
    /// Per hook, per case of [`HOT_CASES`].
    hot: Vec<Vec<Summary>>,
    /// Per hook of [`HOOKS6`], per case of [`CASES`]: the same over IPv6.
    distinct6: Vec<Vec<Summary>>,
    /// Per case of [`CASES`], through tc: the same over SCTP (`sctp.rs`).
    distinct_sctp: Vec<Summary>,
    /// A new flow through tc, random choice and Maglev on the same flows (`maglev.rs`).
    maglev: [Summary; 2],
}

/// The two services that are each other's backend.
fn cycle_yaml() -> String {
    service_yaml("cycle-a", CYCLE_A, 80, "TCP", 8080, &[CYCLE_B])
        + &service_yaml("cycle-b", CYCLE_B, 8080, "TCP", 80, &[CYCLE_A])
}

/// Whether XDP would leave `p` (a TCP frame) to tc: its complete checksum happens to equal
/// the folded pseudo-header sum, which is what a `CHECKSUM_PARTIAL` packet carries (1 in
/// 65,536; see `xdp.rs`).
fn looks_partial(p: &[u8]) -> bool {
    let w = |o: usize| u32::from(u16::from_be_bytes([p[o], p[o + 1]]));
    let l4_len = (u16::from_be_bytes([p[16], p[17]]) as u32).saturating_sub(20);
    let mut sum = w(26) + w(28) + w(30) + w(32) + u32::from(p[23]) + l4_len;
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    w(50) == sum
}

/// The frame `b` builds, with a payload byte added until XDP would not mistake its
/// checksum for a partial one: every bench packet is one XDP handles itself.
fn unambiguous(b: PacketBuilder) -> Vec<u8> {
    let mut p = b.build();
    let mut pad = 0u8;
    while looks_partial(&p) {
        pad += 1;
        p = b.clone().payload(&[pad]).build();
    }
    p
}

/// The backend's answer to a DNATed frame of a flow from a client.
type ReplyOf = fn(&[u8], SocketAddr) -> Result<Vec<u8>>;

/// Pre-built packets of one scale and family.
struct Flows {
    clients: Vec<SocketAddr>,
    /// Each flow's first packet (a SYN).
    to_service: Vec<Vec<u8>>,
    /// Each flow's next packet (an ACK on the same 5-tuple).
    later: Vec<Vec<u8>>,
    non_service: Vec<Vec<u8>>,
    /// Builds each flow's reply from its DNATed first packet.
    reply: ReplyOf,
}

/// The backend's answer to a DNATed IPv4 frame `out` of a flow from `client`.
fn reply4(out: &[u8], client: SocketAddr) -> Result<Vec<u8>> {
    let SocketAddr::V4(client) = client else {
        bail!("an IPv6 client in the IPv4 flows");
    };
    let Some(p) = parse(out) else {
        bail!("a DNATed packet does not parse");
    };
    if p.dst.port() != TARGET_PORT {
        bail!("new flow DNATed to {} (expected port {TARGET_PORT})", p.dst);
    }
    Ok(unambiguous(
        PacketBuilder::tcp(p.dst, client).flags(TCP_ACK),
    ))
}

impl Flows {
    fn empty(reply: ReplyOf) -> Self {
        Flows {
            clients: Vec::with_capacity(FLOWS),
            to_service: Vec::with_capacity(FLOWS),
            later: Vec::with_capacity(FLOWS),
            non_service: Vec::with_capacity(FLOWS),
            reply,
        }
    }

    fn new(services: usize) -> Self {
        let mut f = Flows::empty(reply4);
        for j in 0..FLOWS {
            let client = SocketAddrV4::new(
                addr_add(Ipv4Addr::new(10, 244, 0, 0), j as u32),
                20_000 + (j % 40_000) as u16,
            );
            // Spread the flows over all services (a prime stride).
            let svc = (j * 7_919) % services;
            let frontend = SocketAddrV4::new(vip(svc), SVC_PORT);
            f.to_service
                .push(unambiguous(PacketBuilder::tcp(client, frontend)));
            f.later.push(unambiguous(
                PacketBuilder::tcp(client, frontend).flags(TCP_ACK),
            ));
            let other = addr_add(Ipv4Addr::new(10, 200, 0, 0), j as u32);
            f.non_service.push(unambiguous(PacketBuilder::tcp(
                client,
                SocketAddrV4::new(other, SVC_PORT),
            )));
            f.clients.push(SocketAddr::V4(client));
        }
        f
    }
}

/// Runs `prog` of `hook` once on `packet` (`repeat` times).
fn run_one(
    dp: &mut Datapath,
    hook: Hook,
    prog: &str,
    packet: &[u8],
    repeat: u32,
    ifindex: u32,
) -> Result<super::fixture::Run> {
    if hook.ok == 0 {
        dp.run(prog, packet, repeat)
    } else {
        dp.run_xdp(prog, packet, repeat, ifindex)
    }
}

/// Runs `prog` once on each packet; returns the median of the kernel-reported ns and the
/// output packets. Fails unless every verdict lets the packet go on and `reason` counted
/// them all.
fn each(
    dp: &mut Datapath,
    hook: Hook,
    prog: &str,
    packets: &[Vec<u8>],
    reason: Option<u32>,
    ifindex: u32,
) -> Result<(f64, Vec<Vec<u8>>)> {
    let before = match reason {
        Some(r) => dp.reason_count(r)?,
        None => 0,
    };
    let mut ns = Vec::with_capacity(packets.len());
    let mut outs = Vec::with_capacity(packets.len());
    for p in packets {
        let r = run_one(dp, hook, prog, p, 1, ifindex)?;
        if r.verdict != hook.ok {
            bail!("{prog}: verdict {} (expected {})", r.verdict, hook.ok);
        }
        ns.push(r.duration.as_nanos() as f64);
        outs.push(r.packet);
    }
    if let Some(r) = reason {
        let counted = dp.reason_count(r)? - before;
        if counted != packets.len() as u64 {
            bail!(
                "{prog}: reason {r} counted {counted} of {} packets: the case is not what it claims",
                packets.len()
            );
        }
    }
    Ok((super::percentile(&ns, 50.0), outs))
}

/// One trial of the distinct method on `hook`; ns per packet per case of [`CASES`].
fn distinct_trial(dp: &mut Datapath, hook: Hook, f: &Flows, ifindex: u32) -> Result<Vec<f64>> {
    dp.clear_ct()?;
    let (floor, _) = each(dp, hook, hook.floor, &f.to_service, None, ifindex)?;
    let (non_service, _) = each(dp, hook, hook.prog, &f.non_service, Some(R_PASS), ifindex)?;
    let (new_flow, outs) = each(
        dp,
        hook,
        hook.prog,
        &f.to_service,
        Some(R_NEW_FLOW),
        ifindex,
    )?;
    let mut replies = Vec::with_capacity(outs.len());
    for (out, client) in outs.iter().zip(&f.clients) {
        replies.push((f.reply)(out, *client)?);
    }
    // Answered, then continued once: assured, as a real flow is from its third packet (the
    // move to the assured table is a one-off per flow, not what "established" measures).
    each(dp, hook, hook.prog, &replies, Some(R_REPLY_IN), ifindex)?;
    each(dp, hook, hook.prog, &f.later, Some(R_ESTABLISHED), ifindex)?;
    let (established, _) = each(dp, hook, hook.prog, &f.later, Some(R_ESTABLISHED), ifindex)?;
    let (reply, passed) = each(dp, hook, hook.prog, &replies, Some(R_REPLY_IN), ifindex)?;
    // tc egress (after either hook: XDP passes these replies to the stack) on what the hook
    // passed: the reply's source restored, and a packet with nothing to restore.
    let tc = HOOKS[0];
    let (egress_non_service, _) = each(dp, tc, PROG_EGRESS, &f.non_service, Some(R_PASS), 0)?;
    let (egress_reply, _) = each(dp, tc, PROG_EGRESS, &passed, Some(R_REVERSE_NAT), 0)?;
    Ok(vec![
        floor,
        non_service,
        new_flow,
        established,
        reply,
        egress_non_service,
        egress_reply,
    ])
}

/// Runs `prog` on `packet` with `repeat`; the kernel's per-run average in ns, after checking
/// that at least `repeat - slack` runs were counted under `reason`.
fn hot(
    dp: &mut Datapath,
    hook: Hook,
    prog: &str,
    packet: &[u8],
    reason: Option<(u32, u64)>,
    ifindex: u32,
) -> Result<f64> {
    let before = match reason {
        Some((r, _)) => dp.reason_count(r)?,
        None => 0,
    };
    let r = run_one(dp, hook, prog, packet, HOT_REPEAT, ifindex)?;
    if let Some((code, slack)) = reason {
        let counted = dp.reason_count(code)? - before;
        if counted + slack < HOT_REPEAT as u64 {
            bail!("hot {prog}: reason {code} counted {counted} of {HOT_REPEAT} repeats");
        }
    }
    Ok(r.duration.as_nanos() as f64)
}

/// One trial of the hot method on `hook`; ns per packet per case of [`HOT_CASES`].
fn hot_trial(dp: &mut Datapath, hook: Hook, f: &Flows, ifindex: u32) -> Result<Vec<f64>> {
    let to_a = PacketBuilder::tcp(CYCLE_CLIENT, SocketAddrV4::new(CYCLE_A, 80)).build();
    let from_b = PacketBuilder::tcp(SocketAddrV4::new(CYCLE_B, 8080), CYCLE_CLIENT)
        .flags(TCP_ACK)
        .build();
    let floor = hot(dp, hook, hook.floor, &f.to_service[0], None, ifindex)?;
    let non_service = hot(
        dp,
        hook,
        hook.prog,
        &f.non_service[0],
        Some((R_PASS, 0)),
        ifindex,
    )?;
    // The first two repeats may create the cycle's two flows.
    let established = hot(
        dp,
        hook,
        hook.prog,
        &to_a,
        Some((R_ESTABLISHED, 2)),
        ifindex,
    )?;
    let reply = hot(dp, hook, hook.prog, &from_b, Some((R_REPLY_IN, 0)), ifindex)?;
    Ok(vec![floor, non_service, established, reply])
}

/// Per case, the summary over trials of the per-trial numbers.
fn summarize(trials: &[Vec<f64>]) -> Vec<Summary> {
    let cases = trials.first().map_or(0, Vec::len);
    (0..cases)
        .map(|c| Summary::of(&trials.iter().map(|t| t[c]).collect::<Vec<_>>()))
        .collect()
}

/// The namespace the bench runs in: `dum0` (10.0.0.1/24, a veth, forwarding on) routes the
/// backends (10.128.0.0/9), the clients (10.244.0.0/16, 10.250.0.0/16) and the cycle
/// services (10.95.0.0/16) via 10.0.0.2, a permanent neighbour.
fn namespace() -> Result<Netns> {
    let ns = Netns::new(&format!("{}-node", unique_tag("xlbd"))).map_err(|e| anyhow!(e))?;
    ns.sysctl(&["net.ipv4.ip_forward=1"])
        .map_err(|e| anyhow!(e))?;
    let cmds: [&[&str]; 9] = [
        &[
            "link", "add", "dum0", "type", "veth", "peer", "name", "dum1",
        ],
        &["link", "set", "dum1", "up"],
        &["addr", "add", "10.0.0.1/24", "dev", "dum0"],
        &["link", "set", "dum0", "up"],
        &["route", "add", "10.128.0.0/9", "via", "10.0.0.2"],
        &["route", "add", "10.244.0.0/16", "via", "10.0.0.2"],
        &["route", "add", "10.250.0.0/16", "via", "10.0.0.2"],
        &["route", "add", "10.95.0.0/16", "via", "10.0.0.2"],
        &[
            "neigh",
            "add",
            "10.0.0.2",
            "lladdr",
            "02:00:00:00:00:02",
            "dev",
            "dum0",
            "nud",
            "permanent",
        ],
    ];
    for args in cmds {
        ns.ip(args).map_err(|e| anyhow!("ip {args:?}: {e}"))?;
    }
    ns.sysctl(&["net.ipv6.conf.all.forwarding=1"])
        .map_err(|e| anyhow!(e))?;
    let gw6 = [
        "lladdr",
        "02:00:00:00:00:02",
        "dev",
        "dum0",
        "nud",
        "permanent",
    ];
    let neigh: Vec<&str> = ["-6", "neigh", "add", "fe80::2"]
        .into_iter()
        .chain(gw6)
        .collect();
    ns.ip(&neigh).map_err(|e| anyhow!("ip {neigh:?}: {e}"))?;
    for prefix in ipv6::ROUTES6 {
        let args = [
            "-6", "route", "add", prefix, "via", "fe80::2", "dev", "dum0",
        ];
        ns.ip(&args).map_err(|e| anyhow!("ip {args:?}: {e}"))?;
    }
    Ok(ns)
}

/// Runs the bench; returns its report section, and whether it is the full run (written to
/// docs/benchmarks.md).
pub fn run() -> Result<(Section, bool)> {
    let (scales, trials, full) = plan()?;
    let ns = namespace()?;
    let scales = ns
        .run(move || -> Result<Vec<Scale>> {
            let ifindex =
                lb_userspace::datapath::netif::ifindex("dum0").ok_or_else(|| anyhow!("no dum0"))?;
            measure(&scales, trials, ifindex)
        })
        .map_err(|e| anyhow!(e))??;
    drop(ns);
    Ok((render(&scales, trials, full)?, full))
}

/// Every scale, every trial, both hooks (interleaved within a trial).
fn measure(scales: &[usize], trials: usize, ifindex: u32) -> Result<Vec<Scale>> {
    let max = scales.iter().copied().max().unwrap_or(1);
    // Both families' services: as many IPv6 ones as IPv4 ones, and as many SCTP ones.
    let slots: usize = 3 * (0..max).map(backends_2_to_10).sum::<usize>() + 2;
    let caps = Capacities::for_services(3 * max + 2, slots);
    println!(
        "loading the object with {} = {:?}, {} = {:?} entries (same maps at every scale)",
        lb_common::MAP_SVC,
        caps.svc,
        lb_common::MAP_BACKEND,
        caps.backends
    );
    let mut dp = Datapath::load(caps)?;
    let flags = dp.configure_routing()?;
    println!("node config flags {flags:#x} (routing by destination: XDP's way out per backend)");
    let mut model = parse_model(&cycle_yaml())?;
    let mut have = 0;
    let mut out = Vec::new();
    for &n in scales {
        extend_model(&mut model, have..n, backends_2_to_10)?;
        let v6 = parse_model(&ipv6::services_yaml6(have..n, backends_2_to_10))?;
        model.services.extend(v6.services);
        model.slices.extend(v6.slices);
        let sc = parse_model(&protocol_services_yaml("SCTP", have..n, backends_2_to_10))?;
        model.services.extend(sc.services);
        model.slices.extend(sc.slices);
        have = n;
        let t = dp.program(&model)?;
        let cur = dp.current();
        let svc_entries = cur.services.len();
        let backends = cur.backends.len();
        println!(
            "{n} services: programmed {svc_entries} service-map entries, {backends} backends in {:.2} s",
            (t.compute + t.apply).as_secs_f64()
        );
        let f = Flows::new(n);
        let f6 = ipv6::flows6(n);
        let fs = sctp::flows_sctp(n);
        let mut ds = Vec::new();
        let mut d = vec![Vec::new(); HOOKS.len()];
        let mut h = vec![Vec::new(); HOOKS.len()];
        let mut d6 = vec![Vec::new(); HOOKS6.len()];
        let mut mg = Vec::new();
        for trial in 0..trials {
            let (random, with_maglev) = maglev::trial(&mut dp, &f, n, ifindex)?;
            mg.push(vec![random, with_maglev]);
            println!("  trial {trial} tc new flow: random {random} ns, Maglev {with_maglev} ns");
            for (i, hook) in HOOKS6.iter().enumerate() {
                d6[i].push(distinct_trial(&mut dp, *hook, &f6, ifindex)?);
                println!(
                    "  trial {trial} {} IPv6: distinct {:?} ns",
                    hook.name,
                    d6[i][trial].iter().map(|x| *x as u64).collect::<Vec<_>>()
                );
            }
            // SCTP through tc only: XDP passes it to tc.
            ds.push(distinct_trial(&mut dp, HOOKS[0], &fs, ifindex)?);
            println!(
                "  trial {trial} tc SCTP: distinct {:?} ns",
                ds[trial].iter().map(|x| *x as u64).collect::<Vec<_>>()
            );
            for (i, hook) in HOOKS.iter().enumerate() {
                d[i].push(distinct_trial(&mut dp, *hook, &f, ifindex)?);
                h[i].push(hot_trial(&mut dp, *hook, &f, ifindex)?);
                println!(
                    "  trial {trial} {}: distinct {:?} ns, hot {:?} ns",
                    hook.name,
                    d[i][trial].iter().map(|x| *x as u64).collect::<Vec<_>>(),
                    h[i][trial]
                        .iter()
                        .map(|x| x.round() as u64)
                        .collect::<Vec<_>>()
                );
            }
        }
        out.push(Scale {
            services: n,
            svc_entries,
            backends,
            program_s: (t.compute + t.apply).as_secs_f64(),
            distinct: d.iter().map(|t| summarize(t)).collect(),
            hot: h.iter().map(|t| summarize(t)).collect(),
            distinct6: d6.iter().map(|t| summarize(t)).collect(),
            distinct_sctp: summarize(&ds),
            maglev: {
                let m = summarize(&mg);
                [m[0], m[1]]
            },
        });
    }
    Ok(out)
}
