//! Bench `datapath`: ns per packet through the loaded tc program by `BPF_PROG_TEST_RUN`,
//! at 1, 1,000, 10,000 and 100,000 services of 2 to 10 backends each.
//!
//! Two methods, both reported:
//!
//! * **distinct** (the one the targets use): each of [`FLOWS`] distinct packets runs once
//!   (`repeat = 1`) and the kernel's own `duration` for that one run is taken; a trial's
//!   number is the median over the packets. Every case runs this way, the floor included,
//!   so the harness's fixed cost (timer reads, `local_bh_disable`) is in all of them alike.
//!   A *new flow* is the first packet of its 5-tuple after the conntrack map was emptied; the
//!   *established* case is the same packets again (a conntrack hit each); *reply* is the
//!   backend's answer for each flow; with 16,384 flows spread over all services the lookups
//!   do not sit in one hot cache line.
//! * **hot** (`repeat = N` on one packet): the program rewrites the packet in place and the
//!   kernel feeds the rewritten packet to the next repeat, so a plain repeat would measure
//!   one DNAT and then N−1 non-service packets. Two services that are each other's backend
//!   (A:80 → B:8080, B:8080 → A:80) make every repeat a real conntrack hit with a real
//!   rewrite (established: A→B→A…; reply: the two reply entries restore each other). New
//!   flows cannot be measured this way (the second repeat is no longer new).
//!
//! The per-reason counters are checked after every case: each run must have been counted
//! under the expected verdict (new flow, established, reverse NAT, pass).

use std::net::{Ipv4Addr, SocketAddrV4};

use anyhow::{Result, bail};
use lb_common::{R_ESTABLISHED, R_NEW_FLOW, R_PASS, R_REVERSE_NAT};
use lb_userspace::packet::{PacketBuilder, TCP_ACK, parse};
use xlb_tests::services::service_yaml;

use super::{
    Summary,
    fixture::{
        Capacities, Datapath, PROG_INGRESS, PROG_PASS, SVC_PORT, TARGET_PORT, addr_add,
        backends_2_to_10, extend_model, parse_model, vip,
    },
    report::{self, Section, Series},
    verdict,
};

/// Service counts measured.
const SCALES: [usize; 4] = [1, 1_000, 10_000, 100_000];
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
const CASES: [&str; 5] = [
    "floor (pass-only program)",
    "non-service",
    "new flow",
    "established",
    "reply (reverse NAT)",
];
/// Case names of the hot method.
const HOT_CASES: [&str; 4] = [
    "floor (pass-only program)",
    "non-service",
    "established",
    "reply (reverse NAT)",
];

/// Results at one service count.
struct Scale {
    services: usize,
    svc_entries: usize,
    backends: usize,
    program_s: f64,
    /// Per case of [`CASES`]: trial medians of ns per packet.
    distinct: Vec<Summary>,
    /// Per case of [`HOT_CASES`].
    hot: Vec<Summary>,
}

/// The two services that are each other's backend.
fn cycle_yaml() -> String {
    service_yaml("cycle-a", CYCLE_A, 80, "TCP", 8080, &[CYCLE_B])
        + &service_yaml("cycle-b", CYCLE_B, 8080, "TCP", 80, &[CYCLE_A])
}

/// Pre-built packets of one scale.
struct Flows {
    clients: Vec<SocketAddrV4>,
    to_service: Vec<Vec<u8>>,
    non_service: Vec<Vec<u8>>,
}

impl Flows {
    fn new(services: usize) -> Self {
        let mut f = Flows {
            clients: Vec::with_capacity(FLOWS),
            to_service: Vec::with_capacity(FLOWS),
            non_service: Vec::with_capacity(FLOWS),
        };
        for j in 0..FLOWS {
            let client = SocketAddrV4::new(
                addr_add(Ipv4Addr::new(10, 244, 0, 0), j as u32),
                20_000 + (j % 40_000) as u16,
            );
            // Spread the flows over all services (a prime stride).
            let svc = (j * 7_919) % services;
            f.to_service
                .push(PacketBuilder::tcp(client, SocketAddrV4::new(vip(svc), SVC_PORT)).build());
            let other = addr_add(Ipv4Addr::new(10, 200, 0, 0), j as u32);
            f.non_service
                .push(PacketBuilder::tcp(client, SocketAddrV4::new(other, SVC_PORT)).build());
            f.clients.push(client);
        }
        f
    }
}

/// Runs `prog` once on each packet; returns the median of the kernel-reported ns and the
/// output packets. Fails unless every verdict is TC_ACT_OK and `reason` counted them all.
fn each(
    dp: &mut Datapath,
    prog: &str,
    packets: &[Vec<u8>],
    reason: Option<u32>,
) -> Result<(f64, Vec<Vec<u8>>)> {
    let before = match reason {
        Some(r) => dp.reason_count(r)?,
        None => 0,
    };
    let mut ns = Vec::with_capacity(packets.len());
    let mut outs = Vec::with_capacity(packets.len());
    for p in packets {
        let r = dp.run(prog, p, 1)?;
        if r.verdict != 0 {
            bail!("{prog}: verdict {} (expected TC_ACT_OK)", r.verdict);
        }
        ns.push(r.duration.as_nanos() as f64);
        outs.push(r.packet);
    }
    if let Some(r) = reason {
        let counted = dp.reason_count(r)? - before;
        if counted != packets.len() as u64 {
            bail!(
                "reason {r} counted {counted} of {} packets: the case is not what it claims",
                packets.len()
            );
        }
    }
    Ok((super::percentile(&ns, 50.0), outs))
}

/// One trial of the distinct method; ns per packet per case of [`CASES`].
fn distinct_trial(dp: &mut Datapath, f: &Flows) -> Result<Vec<f64>> {
    dp.clear_ct()?;
    let (floor, _) = each(dp, PROG_PASS, &f.to_service, None)?;
    let (non_service, _) = each(dp, PROG_INGRESS, &f.non_service, Some(R_PASS))?;
    let (new_flow, outs) = each(dp, PROG_INGRESS, &f.to_service, Some(R_NEW_FLOW))?;
    let mut replies = Vec::with_capacity(outs.len());
    for (out, client) in outs.iter().zip(&f.clients) {
        let Some(p) = parse(out) else {
            bail!("a DNATed packet does not parse");
        };
        if p.dst.port() != TARGET_PORT {
            bail!("new flow DNATed to {} (expected port {TARGET_PORT})", p.dst);
        }
        replies.push(PacketBuilder::tcp(p.dst, *client).flags(TCP_ACK).build());
    }
    let (established, _) = each(dp, PROG_INGRESS, &f.to_service, Some(R_ESTABLISHED))?;
    let (reply, _) = each(dp, PROG_INGRESS, &replies, Some(R_REVERSE_NAT))?;
    Ok(vec![floor, non_service, new_flow, established, reply])
}

/// Runs `prog` on `packet` with `repeat`; the kernel's per-run average in ns, after checking
/// that at least `repeat - slack` runs were counted under `reason`.
fn hot(dp: &mut Datapath, prog: &str, packet: &[u8], reason: Option<(u32, u64)>) -> Result<f64> {
    let before = match reason {
        Some((r, _)) => dp.reason_count(r)?,
        None => 0,
    };
    let r = dp.run(prog, packet, HOT_REPEAT)?;
    if let Some((code, slack)) = reason {
        let counted = dp.reason_count(code)? - before;
        if counted + slack < HOT_REPEAT as u64 {
            bail!("hot {prog}: reason {code} counted {counted} of {HOT_REPEAT} repeats");
        }
    }
    Ok(r.duration.as_nanos() as f64)
}

/// One trial of the hot method; ns per packet per case of [`HOT_CASES`].
fn hot_trial(dp: &mut Datapath, f: &Flows) -> Result<Vec<f64>> {
    let to_a = PacketBuilder::tcp(CYCLE_CLIENT, SocketAddrV4::new(CYCLE_A, 80)).build();
    let from_b = PacketBuilder::tcp(SocketAddrV4::new(CYCLE_B, 8080), CYCLE_CLIENT)
        .flags(TCP_ACK)
        .build();
    let floor = hot(dp, PROG_PASS, &f.to_service[0], None)?;
    let non_service = hot(dp, PROG_INGRESS, &f.non_service[0], Some((R_PASS, 0)))?;
    // The first two repeats may create the cycle's two flows.
    let established = hot(dp, PROG_INGRESS, &to_a, Some((R_ESTABLISHED, 2)))?;
    let reply = hot(dp, PROG_INGRESS, &from_b, Some((R_REVERSE_NAT, 0)))?;
    Ok(vec![floor, non_service, established, reply])
}

/// Per case, the summary over trials of the per-trial numbers.
fn summarize(trials: &[Vec<f64>]) -> Vec<Summary> {
    let cases = trials.first().map_or(0, Vec::len);
    (0..cases)
        .map(|c| Summary::of(&trials.iter().map(|t| t[c]).collect::<Vec<_>>()))
        .collect()
}

/// Runs the bench; returns its report section.
pub fn run() -> Result<Section> {
    let max = SCALES[SCALES.len() - 1];
    let slots: usize = (0..max).map(backends_2_to_10).sum::<usize>() + 2;
    let caps = Capacities::for_services(max + 2, slots);
    println!(
        "loading the object with {} = {:?}, {} = {:?} entries (same maps at every scale)",
        lb_common::MAP_SVC,
        caps.svc,
        lb_common::MAP_BACKEND,
        caps.backends
    );
    let mut dp = Datapath::load(caps)?;
    let mut model = parse_model(&cycle_yaml())?;
    let mut have = 0;
    let mut scales = Vec::new();
    for &n in &SCALES {
        extend_model(&mut model, have..n, backends_2_to_10)?;
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
        let mut d = Vec::new();
        let mut h = Vec::new();
        for trial in 0..TRIALS {
            d.push(distinct_trial(&mut dp, &f)?);
            h.push(hot_trial(&mut dp, &f)?);
            println!(
                "  trial {trial}: distinct {:?} ns, hot {:?} ns",
                d[trial].iter().map(|x| *x as u64).collect::<Vec<_>>(),
                h[trial]
                    .iter()
                    .map(|x| x.round() as u64)
                    .collect::<Vec<_>>()
            );
        }
        scales.push(Scale {
            services: n,
            svc_entries,
            backends,
            program_s: (t.compute + t.apply).as_secs_f64(),
            distinct: summarize(&d),
            hot: summarize(&h),
        });
    }
    drop(dp);
    render(&scales)
}

fn render(scales: &[Scale]) -> Result<Section> {
    let mut body = String::new();
    body.push_str(&format!(
        "ns per packet through `xlb_tc_ingress` by `BPF_PROG_TEST_RUN`, median [min–max] of {TRIALS} trials. \
         Services have 2 to 10 backends (`2 + i % 9`); the maps are loaded once with room for the largest \
         scale (`map_max_entries`: the default 262,144-entry service map cannot hold 100,000 services × 2–10 \
         backends), and every scale is programmed through `desired::compute` + `sync::apply` into those same maps.\n\n"
    ));
    body.push_str(&format!(
        "**Distinct method** (targets): {FLOWS} distinct flows per trial, each packet run once (`repeat = 1`), \
         the kernel-reported duration of that run, median over the packets. *New flow* = first packet of its \
         5-tuple after the conntrack map was emptied (conntrack created, backend picked, DNAT); *established* = \
         the same packets again (conntrack hit); *reply* = each backend's answer (reverse NAT); *non-service* = \
         TCP to an address that is no ClusterIP; *floor* = `xlb_tc_pass`, a program that only returns TC_ACT_OK, \
         on the same packets. Every case's verdict counter is checked to have counted every packet.\n\n"
    ));
    let mut headers = vec![
        "services".to_string(),
        "svc entries".into(),
        "backends".into(),
        "programmed in".into(),
    ];
    headers.extend(CASES.iter().map(|c| c.to_string()));
    let mut rows = Vec::new();
    for s in scales {
        let mut r = vec![
            s.services.to_string(),
            s.svc_entries.to_string(),
            s.backends.to_string(),
            format!("{:.2} s", s.program_s),
        ];
        r.extend(s.distinct.iter().map(|x| x.show(0)));
        rows.push(r);
    }
    body.push_str(&report::table(&headers, &rows));

    body.push_str(&format!(
        "\n**Hot method**: one packet, `repeat = {HOT_REPEAT}`, the kernel's per-run average; established and \
         reply go through two services that are each other's backend, so every repeat is a real conntrack hit \
         with a real rewrite (a plain repeat would see the already-rewritten packet). Everything stays in cache: \
         this is the program's instruction cost, the distinct method is closer to traffic.\n\n"
    ));
    let mut headers = vec!["services".to_string()];
    headers.extend(HOT_CASES.iter().map(|c| c.to_string()));
    let rows: Vec<Vec<String>> = scales
        .iter()
        .map(|s| {
            let mut r = vec![s.services.to_string()];
            r.extend(s.hot.iter().map(|x| x.show(1)));
            r
        })
        .collect();
    body.push_str(&report::table(&headers, &rows));

    // Ratios, from the medians of this run.
    let first = &scales[0];
    let last = &scales[scales.len() - 1];
    body.push_str("\n**Ratios** (medians of this run):\n\n");
    let mut headers = vec!["ratio".to_string()];
    headers.extend(CASES[1..].iter().map(|c| c.to_string()));
    let mut rows = Vec::new();
    let mut scale_ok = true;
    for s in &scales[1..] {
        let mut r = vec![format!("{} / 1 service", s.services)];
        for c in 1..CASES.len() {
            let ratio = s.distinct[c].median / first.distinct[c].median;
            if s.services == last.services && ratio > 1.2 {
                scale_ok = false;
            }
            r.push(format!("{ratio:.2}×"));
        }
        rows.push(r);
    }
    for s in scales {
        let mut r = vec![format!("÷ floor at {}", s.services)];
        for c in 1..CASES.len() {
            r.push(format!(
                "{:.2}×",
                s.distinct[c].median / s.distinct[0].median
            ));
        }
        rows.push(r);
    }
    for s in scales {
        let mut r = vec![format!("− floor at {} (ns)", s.services)];
        for c in 1..CASES.len() {
            r.push(format!(
                "{:.0}",
                s.distinct[c].median - s.distinct[0].median
            ));
        }
        rows.push(r);
    }
    body.push_str(&report::table(&headers, &rows));

    let worst_scale = (1..CASES.len())
        .map(|c| (CASES[c], last.distinct[c].median / first.distinct[c].median))
        .fold(("", 0.0f64), |a, b| if b.1 > a.1 { b } else { a });
    let new_ratio = last.distinct[2].median / last.distinct[0].median;
    let new_ratio_1 = first.distinct[2].median / first.distinct[0].median;
    body.push_str(&format!(
        "\n**Targets**\n\n\
         * cost at {} services within 1.2× the cost at 1, every case: **{}** (worst: {} at {:.2}×).\n\
         * new-flow cost within 5× the floor: **{}** ({:.2}× at 1 service, {:.2}× at {} services; \
         {:.0} ns vs {:.0} ns floor).\n",
        last.services,
        verdict(scale_ok),
        worst_scale.0,
        worst_scale.1,
        verdict(new_ratio <= 5.0 && new_ratio_1 <= 5.0),
        new_ratio_1,
        new_ratio,
        last.services,
        last.distinct[2].median,
        last.distinct[0].median,
    ));

    let series: Vec<Series> = CASES
        .iter()
        .enumerate()
        .map(|(c, name)| Series {
            name: name.to_string(),
            points: scales
                .iter()
                .map(|s| (s.services as f64, s.distinct[c].median))
                .collect(),
        })
        .collect();
    let plot = "bench-datapath.svg";
    report::line_plot(
        plot,
        "xlb_tc_ingress, ns per packet (distinct flows, median)",
        "services",
        "ns per packet",
        &series,
    )?;
    body.push_str(&format!("\n![datapath ns per packet]({plot})\n"));
    Ok(Section {
        title: "datapath: ns per packet (BPF_PROG_TEST_RUN)".into(),
        body,
    })
}
