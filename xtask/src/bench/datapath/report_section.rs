//! The datapath bench's report section: the tables, the multiples, the targets and the plot.

use anyhow::Result;

use super::{CASES, FLOWS, HOOKS, HOOKS6, HOT_CASES, HOT_REPEAT, Scale};
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
            "an established packet into the stack now does tc's steps and no more (its way out \
             kept in the conntrack entry: no route lookup, TTL read or redirect-map probe; the \
             frame's length read once), and in ns XDP is at or below tc on these packets; the \
             multiple is of XDP's own floor, about half tc's, so the same work is a larger \
             multiple. What remains is the work both hooks do and Katran does not: the conntrack \
             lookup, the NAT rewrite with its L3 and L4 checksum fix-ups, two counters"
        }
        ("XDP", "hot non-service" | "distinct non-service") => {
            "at one service XDP is below tc; the address filters are sized by the loader to the \
             map capacities (four bits an address: 2^23 bits for this bench's 2^21 backends, \
             where a fixed 2^20 were about 44% set), so few non-service packets fall into the \
             conntrack lookups at any scale; what remains is the parse and the two filter reads"
        }
        (_, "distinct established") => {
            "the per-service and per-backend counters are off an assured flow's packets (its \
             counts wait in the conntrack entry the packet has read, and reach the rows once a \
             second); what remains is the conntrack lookup's own misses, the NAT rewrite with \
             its checksum fix-ups, and the atomic add of the pending counts"
        }
        (_, "distinct new flow") => {
            "a new flow reads its frontend's entry in the service hash, its slot in the slot \
             array and its backend in the backend array (one line each, no second hash walk since \
             the slot ranges), inserts two LRU entries and bumps two counters; per-CPU LRU lists \
             (`BPF_F_NO_COMMON_LRU`) were measured and made a new flow slower (each insert \
             rotates its CPU's lists), so what is left is those misses and the LRU inserts"
        }
        (_, "scale established") => {
            "the counters were a miss each, growing with the services and backends the flows \
             spread over (1.9× with per-CPU arrays, about 1.5× with the CPU-major rows, 1.2× \
             to 1.3× with the counts kept in the conntrack entry); what remains is the \
             conntrack lookup's misses in a table of 16,384 flows over 1.8 million backends"
        }
        (_, "scale new flow") => {
            "the slot hash (two reads of a hash of 1.4 million entries) is gone with the slot \
             ranges; what grows with the services is the frontend hash's miss, the slot's and the \
             backend's (a line each, out of cache at scale) and the LRU inserts"
        }
        _ => "",
    }
}

pub(super) fn render(scales: &[Scale], trials: usize, full: bool) -> Result<Section> {
    let mut body = String::new();
    intro(&mut body, trials);
    distinct_tables(&mut body, scales);
    hot_tables(&mut body, scales);
    multiples(&mut body, scales);
    findings(&mut body);
    ipv6_tables(&mut body, scales);
    sctp_table(&mut body, scales);
    maglev_table(&mut body, scales);
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
            "xlb_tc_ingress, xlb_xdp and xlb_tc_egress, ns per packet (distinct flows, median)",
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
        "ns per packet through `xlb_tc_ingress` and `xlb_xdp` (and `xlb_tc_egress` after either) by `BPF_PROG_TEST_RUN`, median [min–max] of {trials} trials, \
         in a network namespace whose `dum0` routes backends and clients to a resolved next hop (so XDP translates every \
         service packet and passes it to the stack; `dum0` is not in the redirect map). Services have 2 to 10 backends \
         (`2 + i % 9`); the maps are loaded once with room for the largest scale (`map_max_entries`), and every scale is \
         programmed through `reconcile::recompute` + `sync::apply` into those same maps; each scale holds that many \
         IPv4 services and as many IPv6 ones (the IPv6 rows below), so *svc entries* counts both. Every multiple below is of the \
         empty program of the same hook (`xlb_tc_pass`, `xlb_xdp_pass`) measured the same way in the same trials.\n\n"
    ));
    body.push_str(&format!(
        "**Distinct method** (targets): {FLOWS} distinct flows per trial, each packet run once (`repeat = 1`), \
         the kernel-reported duration of that run, median over the packets. *New flow* = first packet of its \
         5-tuple (a SYN) after the conntrack map was emptied (conntrack created, backend picked, DNAT); \
         *established* = each flow's next packet (an ACK on the same 5-tuple: conntrack hit; earlier runs of this \
         bench sent the SYNs again, which also re-check the backend); *reply (ingress)* = each backend's answer at the hook \
         (its destination side: nothing to restore for these flows, which are not SNATed); *egress reply* = `xlb_tc_egress` \
         on what the hook passed of that answer (its source restored to the frontend: reverse NAT); *egress non-service* = \
         `xlb_tc_egress` on the non-service packets (a reply costs the hook's reply plus the egress reply; the egress \
         columns run tc's program after either hook, and are divided by that hook's floor in the multiples); *non-service* = \
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

/// Where the time goes, as measured by taking one thing away at a time (not recomputed by
/// each run: how it was measured is written with it).
fn findings(body: &mut String) {
    body.push_str(
        "\n**Where the time goes** (measured on 2026-12-02, scales 1 and 100,000, one trial each, \
         the same bench, run one after the other: the counters as `PERCPU_ARRAY` slots, as \
         `XLB_SVCSTAT_V3`/`XLB_BESTAT_V3` rows of a CPU-major plain array, and a build whose \
         `reason::count_service` returns at once):\n\n\
         | distinct, ns | tc established | tc egress reply | XDP established | tc new flow | tc non-service |\n\
         |---|---|---|---|---|---|\n\
         | 100,000 services, per-CPU arrays | 762 | 731 | 831 | 2715 | 291 |\n\
         | 100,000 services, CPU-major rows | 611 | 622 | 551 | 2134 | 310 |\n\
         | 100,000 services, counters off | 421 | 421 | 491 | 2414 | 301 |\n\
         | ÷ 1 service, per-CPU arrays | 1.90× | 2.02× | 1.84× | 2.85× | 2.65× |\n\
         | ÷ 1 service, CPU-major rows | 1.56× | 1.68× | 1.41× | 2.24× | 2.58× |\n\
         | ÷ 1 service, counters off | 1.20× | 1.17× | 1.22× | 2.59× | 2.01× |\n\n\
         * **Established packets at scale: the per-service and per-backend counters.** As \
         `PERCPU_ARRAY` slots each cost the slot's pointer, then this CPU's data: two dependent \
         cache misses once the flows spread over 1.2 million backends and 100,000 services. \
         Now each is a row of a plain array laid out CPU-major (`cpu × stride + index`, the \
         stride a load-time global): one computed address, one miss; established at 100,000 \
         services went from 1.9× to about 1.5× of 1 service. Without counters it is 1.2×, \
         inside the 1.3× target. Now an assured flow's packets are counted in its conntrack \
         entry (`pending`, the entry's padding word: one atomic add in the line the packet \
         has read) and reach the rows at the entry's refresh once a second, its FIN or RST, \
         half full, or a delete by the datapath (`conntrack::count`). On 2026-12-07 (the quick \
         subset, scales 1 and 100,000, 3 trials a run, the two builds' runs alternating on a \
         shared machine: two clean runs before, four after; ns at 1 → 100,000 services): tc \
         established 481–511 → 741–812 (1.54×–1.59×) before, 490–491 → 591–621 \
         (1.21×–1.26×) after; XDP established 461–521 → 731–741 (1.42×–1.59×) before, \
         470–481 → 601–651 (1.25×–1.35×) after; tc egress reply 1.49×–1.50× before, \
         1.22×–1.33× after. At 1 service the difference is within the runs' spread. The last \
         second of a flow that ends without FIN or RST (UDP, an idle TCP flow the agent's \
         collector deletes) is never counted; `xlb list` adds the pending counts of the \
         assured tables to the rows, the metrics show the rows.\n\
         * **New flows at scale: not the counters** (2.85× → 2.59× without them): the service \
         hash read twice (frontend, then the slot, in one hash of 1.4 million entries), the \
         backend, two LRU inserts and the assured table's remove (since then the slot is \
         read from an array of its own: the slot ranges).\n\
         * **Non-service at scale: not the counters either** (none is counted): the address \
         filters' false positives sent such a packet to the conntrack lookups while the filters \
         had one size (2^20 bits, about 44% set at 1.2 million backend addresses); they are now \
         sized by the loader, four bits per address the maps hold.\n\
         * **XDP against tc.** Before this stop an XDP packet looked its route up (`fib::hop`: \
         a per-CPU cache of 256 slots, so every one of 16,384 distinct clients missed and ran \
         `bpf_fib_lookup` with the neighbour, about 130 ns), read the TTL and probed the \
         redirect map even when it then went into the stack, and a new flow looked its route \
         up twice. The way out is now kept in the conntrack entry (`CT_F_XDP_STACK`, forgotten \
         once a second): an established packet into the stack does tc's steps and nothing \
         else. A new flow to a remote backend takes the way out kept for its backend \
         (`XLB_XDPBE`: one lookup per backend, ingress interface and CPU a second, where the \
         agent finds no rule by source), so at one service it costs what tc's does; at scale \
         this bench's flows each go to a backend of their own (16,384 of 1.8 million), each \
         new to that cache, and still pay the lookup (tc needs none for a packet of up to 576 \
         bytes). A flow's first reply looks its way out up once.\n",
    );
}

/// The IPv6 rows: per hook of [`HOOKS6`], the distinct cases over IPv6 and each one's ratio
/// to the same case over IPv4 in the same trials.
fn ipv6_tables(body: &mut String, scales: &[Scale]) {
    body.push_str(
        "\n**IPv6** (the same distinct method: as many IPv6 services as IPv4 ones, in the same maps, \
         the same number of flows spread the same way, IPv6 TCP frames built with etherparse; run in \
         the same trials as the IPv4 rows; ÷ IPv4 = this case's median over the IPv4 one's):\n\n",
    );
    for (hi, hook) in HOOKS6.iter().enumerate() {
        let v4 = HOOKS.iter().position(|h| h.name == hook.name).unwrap_or(0);
        let mut headers = vec![format!("{} IPv6 services", hook.name)];
        for c in CASES {
            headers.push(c.to_string());
            headers.push("÷ IPv4".into());
        }
        let rows: Vec<Vec<String>> = scales
            .iter()
            .map(|s| {
                let mut r = vec![s.services.to_string()];
                for c in 0..CASES.len() {
                    r.push(s.distinct6[hi][c].show(0));
                    r.push(format!(
                        "{:.2}×",
                        s.distinct6[hi][c].median / s.distinct[v4][c].median
                    ));
                }
                r
            })
            .collect();
        body.push_str(&report::table(&headers, &rows));
        body.push('\n');
    }
}

/// The SCTP rows through tc, each case with its ratio to TCP's in the same trials.
fn sctp_table(body: &mut String, scales: &[Scale]) {
    body.push_str(
        "\n**SCTP** through tc (the same distinct method: as many SCTP services as TCP ones, on \
         the TCP services' ClusterIPs and backends, port 80 → 8080, so every translated packet's \
         CRC32c is updated for the rewritten port: five table steps, `lb_common::crc32c`; a flow \
         is an INIT, the backend's DATA, then the client's DATA; XDP passes SCTP to tc, so there \
         is no XDP row; ÷ TCP = this case's median over tc's TCP one in the same trials):\n\n",
    );
    let mut headers = vec!["tc SCTP services".to_string()];
    for c in CASES {
        headers.push(c.to_string());
        headers.push("÷ TCP".into());
    }
    let rows: Vec<Vec<String>> = scales
        .iter()
        .map(|s| {
            let mut r = vec![s.services.to_string()];
            for c in 0..CASES.len() {
                r.push(s.distinct_sctp[c].show(0));
                r.push(format!(
                    "{:.2}×",
                    s.distinct_sctp[c].median / s.distinct[0][c].median
                ));
            }
            r
        })
        .collect();
    body.push_str(&report::table(&headers, &rows));
    body.push('\n');
}

/// The Maglev rows: a new flow through tc, random choice and Maglev, with their ratio.
fn maglev_table(body: &mut String, scales: &[Scale]) {
    body.push_str(
        "\n**Maglev** new flow through tc (`--lb-algorithm maglev`, #24: the frontend's table \
         looked up by service index in `XLB_MAGLEV_V2` and read by `select::xlb_maglev_slot`, \
         a global BPF function, for the flow's `lb_common::flow_hash`; the first 8,192 IPv4 \
         TCP frontends (the map's default size) flagged, each with its own table of M = 16381 \
         entries written into the pinned maps as the agent does, and the flows to them, each \
         flow's backend checked against its entry; random = the same flows with random \
         choice, in the same trial):\n\n",
    );
    let headers: Vec<String> = [
        "tc services",
        "new flow, random",
        "new flow, Maglev",
        "÷ random",
    ]
    .iter()
    .map(|h| h.to_string())
    .collect();
    let rows: Vec<Vec<String>> = scales
        .iter()
        .map(|s| {
            vec![
                s.services.to_string(),
                s.maglev[0].show(0),
                s.maglev[1].show(0),
                format!("{:.2}×", s.maglev[1].median / s.maglev[0].median),
            ]
        })
        .collect();
    body.push_str(&report::table(&headers, &rows));
    body.push('\n');
}

/// What stands between the IPv6 rows and 1.2× of IPv4, per hook, as measured.
fn ipv6_closing(hook: &str) -> &'static str {
    if hook == "XDP" {
        "established packets and replies skip the route lookup as IPv4's do (the way out kept \
         in the flow's entry); what remains is what the tc path pays too: the non-service \
         packet's four-word fold of each address for the filters and its per-CPU tuple slot \
         (see tc), and at scale a new flow's IPv6 route lookup (`bpf_fib_lookup` with \
         `AF_INET6`: the fib6 tree, the neighbour table), dearer than IPv4's, for a remote \
         backend not yet in the way-out cache (kept per backend: none at one service)"
    } else {
        "the common packet is read in place (no extension-header walk): new flow, established \
         and reply are within 1.2× at every scale; the non-service case is not. At one service \
         it costs about 12 ns over IPv4's 53: the IPv4 parse's Ethernet type test it passes \
         first, the per-CPU slot its tuple lives in (40 bytes of addresses do not fit the \
         512-byte stack beside the IPv4 path's frame) and the four-word fold of each address \
         for the filters. At scale its ratio moves with IPv4's own figure from run to run (56 \
         to 79 ns at 10,000 services over this stop's runs); the filters' false positives are \
         not the difference (computed for these addresses: about one client in ten for either \
         family). The IPv6 tuple on the stack, once the IPv4 path's frame leaves room for it, \
         would take most of the fixed cost"
    }
}

/// The worst IPv6 ÷ IPv4 ratio over the service cases (non-service, new flow,
/// established, reply) and scales, for hook `hi` of [`HOOKS6`]: (ratio, case, services).
fn worst_ipv6_ratio(scales: &[Scale], hi: usize) -> (f64, &'static str, usize) {
    let v4 = HOOKS
        .iter()
        .position(|h| h.name == HOOKS6[hi].name)
        .unwrap_or(0);
    let mut worst = (0.0, "", 0);
    for s in scales {
        for (c, name) in CASES.iter().enumerate().skip(1) {
            let r = s.distinct6[hi][c].median / s.distinct[v4][c].median;
            if r > worst.0 {
                worst = (r, *name, s.services);
            }
        }
    }
    worst
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
    xdp_against_tc(body, scales);
    katran(body, scales);
    for (hi, hook) in HOOKS6.iter().enumerate() {
        let (v, case, at) = worst_ipv6_ratio(scales, hi);
        target(
            body,
            &format!(
                "{} IPv6 within 1.2× of the IPv4 figures (every distinct case)",
                hook.name
            ),
            v <= 1.2,
            &format!("worst {v:.2}×: {case} at {at} services"),
            ipv6_closing(hook.name),
        );
    }
    let (worst, at) = scales
        .iter()
        .map(|s| (s.maglev[1].median / s.maglev[0].median, s.services))
        .fold((0.0, 0), |a, b| if b.0 > a.0 { b } else { a });
    target(
        body,
        "tc Maglev new flow within 1.1× of random (every scale)",
        worst <= 1.1,
        &format!("worst {worst:.2}× at {at} services"),
        "a new flow pays a hash lookup of its table and a read in it behind a global \
         function call; at scale the tables (8,192 rows, 64 KiB of pages each) are out of \
         cache. Katran's layout, one preallocated array of rows (no hash; 8,192 × 32 KiB = \
         256 MiB up front), was measured and left most of the cost (1.34× / 1.25× at 10,000 \
         / 100,000 against the hash's 1.38× / 1.34×): what stays is the row's two lines (its \
         size and the slot), each in its own page out of the TLB, and with the size out of \
         the row too (one line) about 1.26× / 1.21×: fewer pages per table (a smaller M for \
         small services, one-byte slots) or huge pages are next",
    );
    target(
        body,
        &format!("the {} scale completes", last.services),
        true,
        "this run programmed and measured every scale",
        "",
    );
}

/// XDP below tc in ns on every service case (distinct and hot) at every scale: the worst
/// XDP ÷ tc ratio of the medians.
fn xdp_against_tc(body: &mut String, scales: &[Scale]) {
    let (tc, xdp) = (0, 1);
    let mut worst = (0.0, String::new(), 0);
    for s in scales {
        for (c, name) in CASES.iter().enumerate().take(5).skip(1) {
            let r = s.distinct[xdp][c].median / s.distinct[tc][c].median;
            if r > worst.0 {
                worst = (r, format!("distinct {name}"), s.services);
            }
        }
        for (c, name) in HOT_CASES.iter().enumerate().skip(1) {
            let r = s.hot[xdp][c].median / s.hot[tc][c].median;
            if r > worst.0 {
                worst = (r, format!("hot {name}"), s.services);
            }
        }
    }
    let (r, case, at) = worst;
    target(
        body,
        "XDP below tc in ns (every case but the egress ones, every scale)",
        r < 1.0,
        &format!("worst XDP ÷ tc {r:.2}×: {case} at {at} services"),
        xdp_closing(&case),
    );
}

/// What stands between XDP and tc in the case that decides [`xdp_against_tc`].
fn xdp_closing(case: &str) -> &'static str {
    match case {
        "distinct new flow" => {
            "a new flow to a remote backend needs its way out (egress interface, next hop, MTU) \
             to learn whether XDP can redirect it, which tc never needs for a packet of up to 576 \
             bytes. It is kept per backend (`XLB_XDPBE`, looked up once a second per backend, \
             ingress interface and CPU), so where the flows share backends XDP's new flow costs \
             what tc's does (1 service); at 100,000 services this bench's 16,384 flows each go \
             to a backend of their own among 1.8 million, new to the cache, and each pays \
             `bpf_fib_lookup` with the neighbour (about 130 ns). Keeping the way out per next \
             hop (backends behind one node share it: the agent would name each backend's node \
             route) would close it"
        }
        "distinct reply (ingress)" => {
            "a flow's first reply looks its way out up once (the bench replies once per flow; \
             later replies go by the flag in the entry). Predicting it at the flow's creation \
             (the reply leaves by the interface the client came in by) would close it"
        }
        _ => {
            "XDP does tc's steps for a packet into the stack; what differs is the test run's own \
             cost per hook (the floors), which the multiples divide out"
        }
    }
}

/// Katran's XDP multiples measured on this machine (the figures over its floor):
/// new flow ≤ 9.6× at 1 service and ≤ 21× at 10,000, established ≤ 7.5× and ≤ 15×, hot
/// established ≤ 13×.
fn katran(body: &mut String, scales: &[Scale]) {
    let xdp = 1;
    let at = |n: usize| scales.iter().find(|s| s.services == n);
    for (label, c, n, limit) in [
        ("distinct new flow", 2, 1, 9.6),
        ("distinct new flow", 2, 10_000, 21.0),
        ("distinct established", 3, 1, 7.5),
        ("distinct established", 3, 10_000, 15.0),
    ] {
        let Some(s) = at(n) else { continue };
        let v = s.distinct[xdp][c].median / s.distinct[xdp][0].median;
        target(
            body,
            &format!("XDP {label} at {n} services ≤ Katran's {limit}× the floor"),
            v <= limit,
            &format!("{v:.1}×"),
            closing("XDP", label),
        );
    }
    let v = scales
        .iter()
        .map(|s| s.hot[xdp][2].median / s.hot[xdp][0].median)
        .fold(0.0, f64::max);
    target(
        body,
        "XDP hot established ≤ Katran's 13× the floor (every scale)",
        v <= 13.0,
        &format!("{v:.1}×"),
        closing("XDP", "hot established"),
    );
}
