//! The datapath bench's report section: the tables, the multiples, the targets and the plot.

use anyhow::Result;

use super::{
    CASES, FLOWS, HOOKS, HOT_CASES, HOT_REPEAT, Scale,
    ipv6::{CASES6, SERVICES6},
};
use crate::bench::{
    report::{self, Section, Series},
    verdict,
};

/// One target line: `name`: **met**/**MISSED** (`detail`), and for a missed one what would
/// close it.
fn target(out: &mut String, name: &str, ok: bool, detail: &str, closing: &str) {
    out.push_str(&format!("* {name}: **{}** ({detail})", verdict(ok)));
    if !ok && !closing.is_empty() {
        out.push_str(&format!(". What would close it: {closing}"));
    }
    out.push_str(".\n");
}

/// What the measurements say stands between a missed target and its limit.
fn closing(hook: &str, label: &str) -> &'static str {
    match (hook, label) {
        ("XDP", "hot established" | "hot reply") => {
            "the route is cached now (a per-CPU direct-mapped cache, `XLB_XDPRT`, refreshed \
             once a second), which took only about 20 ns off (190 → 168 ns): the route lookup \
             was not where XDP's time goes. XDP already spends about 36 ns more than tc on a \
             non-service packet, and an established one 110 ns more than tc's 58 for the same \
             NAT: the XDP path's own packet access (every field through bounds-checked loads of \
             `xdp_md`, the checksum-partial test, the TTL read and L2 rewrite) is to be profiled \
             instruction by instruction (`bpftool prog profile`); with a 5 ns floor, 10× leaves \
             50 ns for the whole NAT (Katran's own 75 ns is 10.7× here)"
        }
        ("XDP", "hot non-service" | "distinct non-service") => {
            "XDP spends about 50 ns more than tc on the same non-service work in this harness (not \
             the length helper, not the checksum test: both were ruled out); to be profiled"
        }
        ("XDP", "distinct established") => {
            "XDP's own per-packet cost (see hot established), and at scale the per-CPU counter \
             arrays' two dependent misses each (a plain CPU-major array: one)"
        }
        (_, "distinct established") => {
            "at scale, the per-service and per-backend per-CPU counter arrays cost two dependent \
             misses each (pointer, then per-CPU data): counters in a plain CPU-major array (one \
             miss each) or accumulated in the conntrack entry; what remains is the conntrack \
             lookup's own misses"
        }
        (_, "distinct new flow") => {
            "a new flow reads the service hash, a slot in the same hash, the backend array, \
             inserts two LRU entries and bumps two counters: slots in an array (a hash only from \
             frontend to service), per-CPU LRU lists, cheaper counters"
        }
        (_, "scale established") => {
            "the counters above (their misses grow with the number of services and backends the \
             flows spread over)"
        }
        (_, "scale new flow") => "the slot hash and the counters above",
        _ => "",
    }
}

pub(super) fn render(scales: &[Scale], trials: usize, full: bool) -> Result<Section> {
    let mut body = String::new();
    intro(&mut body, trials);
    distinct_tables(&mut body, scales);
    hot_tables(&mut body, scales);
    multiples(&mut body, scales);
    ipv6_tables(&mut body, scales);
    targets(&mut body, scales);
    let series: Vec<Series> = HOOKS
        .iter()
        .enumerate()
        .flat_map(|(hi, hook)| {
            CASES.iter().enumerate().map(move |(c, name)| Series {
                name: format!("{} {name}", hook.name),
                points: scales
                    .iter()
                    .map(|s| (s.services as f64, s.distinct[hi][c].median))
                    .collect(),
            })
        })
        .collect();
    let plot = "bench-datapath.svg";
    if full {
        report::line_plot(
            plot,
            "xlb_tc_ingress and xlb_xdp, ns per packet (distinct flows, median)",
            "services",
            "ns per packet",
            &series,
        )?;
    }
    body.push_str(&format!("\n![datapath ns per packet]({plot})\n"));
    Ok(Section {
        title: "datapath: ns per packet (BPF_PROG_TEST_RUN)".into(),
        body,
    })
}

/// How the bench measures, and the distinct method.
fn intro(body: &mut String, trials: usize) {
    body.push_str(&format!(
        "ns per packet through `xlb_tc_ingress` and `xlb_xdp` by `BPF_PROG_TEST_RUN`, median [min–max] of {trials} trials, \
         in a network namespace whose `dum0` routes backends and clients to a resolved next hop (so XDP translates every \
         service packet and passes it to the stack; `dum0` is not in the redirect map). Services have 2 to 10 backends \
         (`2 + i % 9`); the maps are loaded once with room for the largest scale (`map_max_entries`), and every scale is \
         programmed through `desired::compute` + `sync::apply` into those same maps. Every multiple below is of the \
         empty program of the same hook (`xlb_tc_pass`, `xlb_xdp_pass`) measured the same way in the same trials.\n\n"
    ));
    body.push_str(&format!(
        "**Distinct method** (targets): {FLOWS} distinct flows per trial, each packet run once (`repeat = 1`), \
         the kernel-reported duration of that run, median over the packets. *New flow* = first packet of its \
         5-tuple (a SYN) after the conntrack map was emptied (conntrack created, backend picked, DNAT); \
         *established* = each flow's next packet (an ACK on the same 5-tuple: conntrack hit; earlier runs of this \
         bench sent the SYNs again, which also re-check the backend); *reply* = each backend's answer (reverse NAT); *non-service* = \
         TCP to an address that is no ClusterIP; *floor* = the hook's empty program on the same packets. Every \
         case's verdict counter is checked to have counted every packet.\n\n"
    ));
}

/// The distinct method's table, per hook.
fn distinct_tables(body: &mut String, scales: &[Scale]) {
    for (hi, hook) in HOOKS.iter().enumerate() {
        let mut headers = vec![
            format!("{} services", hook.name),
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
            r.extend(s.distinct[hi].iter().map(|x| x.show(0)));
            rows.push(r);
        }
        body.push_str(&report::table(&headers, &rows));
        body.push('\n');
    }
}

/// The hot method's table, per hook.
fn hot_tables(body: &mut String, scales: &[Scale]) {
    body.push_str(&format!(
        "**Hot method**: one packet, `repeat = {HOT_REPEAT}`, the kernel's per-run average; established and \
         reply go through two services that are each other's backend, so every repeat is a real conntrack hit \
         with a real rewrite (a plain repeat would see the already-rewritten packet). Everything stays in cache: \
         this is the program's instruction cost, the distinct method is closer to traffic.\n\n"
    ));
    for (hi, hook) in HOOKS.iter().enumerate() {
        let mut headers = vec![format!("{} services", hook.name)];
        headers.extend(HOT_CASES.iter().map(|c| c.to_string()));
        let rows: Vec<Vec<String>> = scales
            .iter()
            .map(|s| {
                let mut r = vec![s.services.to_string()];
                r.extend(s.hot[hi].iter().map(|x| x.show(1)));
                r
            })
            .collect();
        body.push_str(&report::table(&headers, &rows));
        body.push('\n');
    }
}

/// Multiples of the floor and scale ratios, from the medians of this run.
fn multiples(body: &mut String, scales: &[Scale]) {
    // Multiples of the floor and scale ratios, from the medians of this run.
    let first = &scales[0];
    body.push_str(
        "**Multiples** (medians of this run; ÷ floor = ÷ the same hook's empty program):\n\n",
    );
    let mut headers = vec!["multiple".to_string()];
    for hook in HOOKS {
        headers.extend(CASES[1..].iter().map(|c| format!("{} {c}", hook.name)));
    }
    let mut rows = Vec::new();
    for s in scales {
        let mut r = vec![format!("distinct ÷ floor at {}", s.services)];
        for hi in 0..HOOKS.len() {
            for c in 1..CASES.len() {
                r.push(format!(
                    "{:.1}×",
                    s.distinct[hi][c].median / s.distinct[hi][0].median
                ));
            }
        }
        rows.push(r);
    }
    for s in &scales[1..] {
        let mut r = vec![format!("distinct {} ÷ 1 service", s.services)];
        for hi in 0..HOOKS.len() {
            for c in 1..CASES.len() {
                r.push(format!(
                    "{:.2}×",
                    s.distinct[hi][c].median / first.distinct[hi][c].median
                ));
            }
        }
        rows.push(r);
    }
    body.push_str(&report::table(&headers, &rows));
    body.push('\n');
    let mut headers = vec!["multiple".to_string()];
    for hook in HOOKS {
        headers.extend(HOT_CASES[1..].iter().map(|c| format!("{} {c}", hook.name)));
    }
    let mut rows = Vec::new();
    for s in scales {
        let mut r = vec![format!("hot ÷ floor at {}", s.services)];
        for hi in 0..HOOKS.len() {
            for c in 1..HOT_CASES.len() {
                r.push(format!("{:.1}×", s.hot[hi][c].median / s.hot[hi][0].median));
            }
        }
        rows.push(r);
    }
    body.push_str(&report::table(&headers, &rows));
}

/// The targets, tc and XDP alike, at every scale measured.
fn targets(body: &mut String, scales: &[Scale]) {
    let first = &scales[0];
    let last = &scales[scales.len() - 1];
    // The targets, tc and XDP alike, at every scale measured.
    body.push_str("\n**Targets** (tc and XDP alike; the worst scale measured decides)\n\n");
    let worst = |hi: usize, c: usize, hot: bool| -> (f64, usize) {
        scales
            .iter()
            .map(|s| {
                let v = if hot {
                    s.hot[hi][c].median / s.hot[hi][0].median
                } else {
                    s.distinct[hi][c].median / s.distinct[hi][0].median
                };
                (v, s.services)
            })
            .fold((0.0, 0), |a, b| if b.0 > a.0 { b } else { a })
    };
    for (hi, hook) in HOOKS.iter().enumerate() {
        let h = hook.name;
        for (label, c, limit, hot) in [
            ("hot established", 2, 10.0, true),
            ("hot reply", 3, 10.0, true),
            ("hot non-service", 1, 6.0, true),
            ("distinct established", 3, 8.0, false),
            ("distinct new flow", 2, 10.0, false),
            ("distinct non-service", 1, 2.5, false),
        ] {
            let (v, at) = worst(hi, c, hot);
            target(
                body,
                &format!("{h} {label} ≤ {limit}× the floor"),
                v <= limit,
                &format!("{v:.1}× at {at} services"),
                closing(h, label),
            );
        }
        for (label, c) in [("established", 3), ("new flow", 2)] {
            let ratio = last.distinct[hi][c].median / first.distinct[hi][c].median;
            target(
                body,
                &format!(
                    "{h} distinct {label} at {} services within 1.3× of 1 service",
                    last.services
                ),
                ratio <= 1.3,
                &format!("{ratio:.2}×"),
                closing(h, &format!("scale {label}")),
            );
        }
    }
    target(
        body,
        &format!("the {} scale completes", last.services),
        true,
        "this run programmed and measured every scale",
        "",
    );
}

/// The IPv6 rows: per hook, each case's ns per packet and its ratio to the IPv4 case of the
/// same trial.
fn ipv6_tables(body: &mut String, scales: &[Scale]) {
    body.push_str(&format!(
        "\n**IPv6** (distinct method, {FLOWS} IPv6 flows over {SERVICES6} IPv6 ClusterIPs of 3 backends each, in \
         the same maps as the scale's IPv4 services; ratio = IPv6 / IPv4 median of the same hook, case and trial, \
         median [min–max] over the trials). IPv6 reads its headers (and walks its extension headers) through the load helper, \
         and reads the address filters by an address's first word (the bits the agent sets).\
         The IPv6 flows go to the same 256 services at every scale while the IPv4 ones spread over all of them: \
         at 1 service IPv6 is the harder case, at 10,000 and more its lookups stay warmer, so the smallest \
         scale is the fair comparison.\n\n"
    ));
    for (hi, hook) in HOOKS.iter().enumerate() {
        let mut headers = vec![format!("{} IPv6, services", hook.name)];
        headers.extend(CASES6.iter().map(|c| format!("{c} ns (× IPv4)")));
        let rows: Vec<Vec<String>> = scales
            .iter()
            .map(|s| {
                let mut r = vec![s.services.to_string()];
                for c in 0..CASES6.len() {
                    let v = &s.v6[hi][c];
                    let q = &s.v6_ratio[hi][c];
                    r.push(format!(
                        "{:.0} ({:.2}× [{:.2}–{:.2}])",
                        v.median, q.median, q.min, q.max
                    ));
                }
                r
            })
            .collect();
        body.push_str(&report::table(&headers, &rows));
        body.push('\n');
    }
    body.push_str("\n**IPv6 target** (the worst scale measured decides)\n\n");
    for (hi, hook) in HOOKS.iter().enumerate() {
        for (c, case) in CASES6.iter().enumerate() {
            let (v, at) = scales
                .iter()
                .map(|s| (s.v6_ratio[hi][c].median, s.services))
                .fold((0.0, 0), |a, b| if b.0 > a.0 { b } else { a });
            target(
                body,
                &format!("{} IPv6 {case} within 1.2× of IPv4", hook.name),
                v <= 1.2,
                &format!("{v:.2}× at {at} services"),
                closing6(hook.name),
            );
        }
    }
}

/// What stands between a missed IPv6 target and its limit, per hook.
fn closing6(hook: &str) -> &'static str {
    if hook == "XDP" {
        "XDP's IPv6 path looks its route up with `bpf_fib_lookup` for every packet (IPv4's has the \
         per-CPU route cache `XLB_XDPRT`, keyed by IPv4 addresses) and reads and writes every field \
         through `bpf_xdp_load_bytes`/`bpf_xdp_store_bytes`: a route cache keyed by IPv6 addresses \
         and in-place access at fixed offsets for packets without extension headers"
    } else {
        "tc's IPv6 path reads its headers through `bpf_skb_load_bytes` and rewrites through the \
         store helpers (IPv4 reads and writes in place at fixed offsets: `parse_direct`, \
         `nat::in_place`): the same direct path for IPv6 packets without extension headers; \
         and the address filters hash an IPv6 address by its first word only (what the agent \
         sets), so IPv6 addresses of one /32 share a bit: a fold of all four words on both sides"
    }
}
