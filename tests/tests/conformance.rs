//! kube-proxy conformance: the cases in `shared/conformance/kube-proxy/cases` (beside the
//! workspace), one test per case. Each case's `TestConfig` header gives the node settings;
//! the emitters' output is normalised as the cases' README says and compared with the
//! expected file, or traced packet by packet for `packet-flow` cases.
//!
//! Multi-step cases run a stateful proxier against an in-memory `iptables-restore`
//! ([`lb_userspace::emit::restore::Tables`]), so partial syncs, stale-chain deletion and
//! the failed restore of iptables-03 step 9 happen as they would on a node. Where a case's
//! objects carry no `present-in-steps` annotation, the step schedule its header describes
//! is transcribed in [`schedule`] (input only; expectations always come from the files).

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    time::Duration,
};

use lb_userspace::{
    emit::{
        iptables::{self, IptablesProxier, SyncOptions},
        restore::Tables,
        trace,
    },
    model::{Model, NodeSettings, Protocol, ServiceRef},
    source::{file, testconfig::TestConfig},
};

fn cases_dir() -> PathBuf {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/conformance/kube-proxy/cases");
    assert!(
        dir.is_dir(),
        "conformance cases not found at {} (expected shared/conformance/kube-proxy/cases beside the workspace)",
        dir.display()
    );
    dir
}

struct Case {
    name: String,
    text: String,
    expected: String,
    config: TestConfig,
}

fn case(name: &str) -> Case {
    let dir = cases_dir();
    let input = dir.join(format!("{name}.input.yaml"));
    let text =
        std::fs::read_to_string(&input).unwrap_or_else(|e| panic!("{}: {e}", input.display()));
    let exp_path = dir.join(format!("{name}.expected.txt"));
    let expected = std::fs::read_to_string(&exp_path)
        .unwrap_or_else(|e| panic!("{}: {e}", exp_path.display()));
    let loaded = file::parse(name, &text).unwrap_or_else(|e| panic!("{name}: {e}"));
    let config = loaded
        .test_config
        .unwrap_or_else(|| panic!("{name}: no TestConfig document"));
    Case {
        name: name.to_string(),
        text,
        expected,
        config,
    }
}

/// The model of `step` (objects annotated with present-in-steps are filtered).
fn model_at(c: &Case, step: Option<u32>) -> Model {
    let loaded =
        file::parse_step(&c.name, &c.text, step).unwrap_or_else(|e| panic!("{}: {e}", c.name));
    for e in &loaded.errors {
        eprintln!(
            "{}: input error (left out, as kube-proxy would ignore it): {e}",
            c.name
        );
    }
    loaded.model
}

/// Expected-file sections: `(step number, body)`; a file without `### step` headers is one
/// section with no number.
fn sections(expected: &str) -> Vec<(Option<u32>, String)> {
    let mut out: Vec<(Option<u32>, String)> = Vec::new();
    let mut cur: Option<(Option<u32>, String)> = None;
    for line in expected.lines() {
        if let Some(rest) = line.strip_prefix("### step ") {
            if let Some(c) = cur.take() {
                out.push(c);
            }
            let n = rest
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|d| d.parse().ok());
            cur = Some((n, String::new()));
            continue;
        }
        let c = cur.get_or_insert((None, String::new()));
        c.1.push_str(line);
        c.1.push('\n');
    }
    out.extend(cur);
    out
}

// ---------------------------------------------------------------- iptables normalisation

fn chain_rank(chain: &str) -> (u8, String) {
    match chain {
        "KUBE-NODEPORTS" => (0, String::new()),
        "KUBE-SERVICES" => (1, String::new()),
        c if c.starts_with("KUBE-") => (2, c.to_string()),
        c => (3, c.to_string()),
    }
}

fn service_key(rule: &str) -> String {
    let args = lb_userspace::emit::restore::split_args(rule);
    let Some(i) = args.iter().position(|a| a == "--comment") else {
        return String::new();
    };
    let c = args
        .get(i + 1)
        .map(|s| s.trim_start_matches('"'))
        .unwrap_or("");
    c.split([' ', ':']).next().unwrap_or("").to_string()
}

/// The README's canonical form of an iptables-restore payload (upstream `sortIPTablesRules`).
fn sort_restore(text: &str) -> String {
    struct T {
        name: String,
        chains: Vec<String>,
        rules: Vec<String>,
        deletes: Vec<String>,
    }
    let mut tables: Vec<T> = Vec::new();
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(n) = line.strip_prefix('*') {
            tables.push(T {
                name: n.to_string(),
                chains: vec![],
                rules: vec![],
                deletes: vec![],
            });
            continue;
        }
        let Some(t) = tables.last_mut() else { continue };
        if line == "COMMIT" {
            continue;
        } else if let Some(d) = line.strip_prefix(':') {
            t.chains
                .push(d.split_whitespace().next().unwrap_or("").to_string());
        } else if line.starts_with("-X ") {
            t.deletes.push(line.to_string());
        } else {
            t.rules.push(line.to_string());
        }
    }
    tables.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = String::new();
    for t in &mut tables {
        out.push_str(&format!("*{}\n", t.name));
        t.chains.sort_by_key(|c| chain_rank(c));
        for c in &t.chains {
            out.push_str(&format!(":{c} - [0:0]\n"));
        }
        let mut chains_in_rules: Vec<String> = Vec::new();
        for r in &t.rules {
            let c = r.split_whitespace().nth(1).unwrap_or("").to_string();
            if !chains_in_rules.contains(&c) {
                chains_in_rules.push(c);
            }
        }
        chains_in_rules.sort_by_key(|c| chain_rank(c));
        for c in &chains_in_rules {
            let mut rules: Vec<&String> = t
                .rules
                .iter()
                .filter(|r| r.split_whitespace().nth(1) == Some(c.as_str()))
                .collect();
            if c == "KUBE-NODEPORTS" || c == "KUBE-SERVICES" {
                let last = rules
                    .iter()
                    .position(|r| r.contains("NOTE: this must be the last rule in this chain"))
                    .map(|i| rules.remove(i));
                rules.sort_by_key(|r| service_key(r));
                rules.extend(last);
            }
            for r in rules {
                out.push_str(r);
                out.push('\n');
            }
        }
        for d in &t.deletes {
            out.push_str(d);
            out.push('\n');
        }
        out.push_str("COMMIT\n");
    }
    out
}

fn assert_text(case: &str, what: &str, got: &str, want: &str) {
    if got != want {
        let mut diff = String::new();
        let g: Vec<&str> = got.lines().collect();
        let w: Vec<&str> = want.lines().collect();
        for l in &w {
            if !g.contains(l) {
                diff.push_str(&format!("- {l}\n"));
            }
        }
        for l in &g {
            if !w.contains(l) {
                diff.push_str(&format!("+ {l}\n"));
            }
        }
        panic!(
            "{case} {what}: output differs (- expected only, + emitted only)\n{diff}\n--- emitted:\n{got}\n--- expected:\n{want}"
        );
    }
}

// ---------------------------------------------------------------- step schedules

/// How a case's inputs change from step to step.
enum Step {
    /// The objects annotated for this step.
    Annotated(u32),
    /// Everything in the file.
    All,
    /// Everything but EndpointSlices (iptables-21..28 step 2: "EndpointSlice deleted").
    WithoutSlices,
    /// iptables-16: objects by the header's step list.
    LargeCluster(u32),
}

fn svc_ref(ns: &str, name: &str) -> ServiceRef {
    ServiceRef {
        namespace: ns.into(),
        name: name.into(),
    }
}

fn build_model(c: &Case, step: &Step) -> Model {
    match step {
        Step::Annotated(n) => model_at(c, Some(*n)),
        Step::All => model_at(c, None),
        Step::WithoutSlices => {
            let mut m = model_at(c, None);
            m.slices.clear();
            m
        }
        Step::LargeCluster(n) => {
            // Header of iptables-16: step 2 adds svc3's slice; step 4 adds Service ns4/svc4
            // and its slice; step 5 deletes the Service (the slice stays).
            let mut m = model_at(c, None);
            if *n < 2 {
                m.slices.remove(&svc_ref("ns3", "svc3"));
            }
            if *n < 4 {
                m.services.remove(&svc_ref("ns4", "svc4"));
                m.slices.remove(&svc_ref("ns4", "svc4"));
            }
            if *n >= 5 {
                m.services.remove(&svc_ref("ns4", "svc4"));
            }
            m
        }
    }
}

fn schedule(c: &Case) -> Vec<Step> {
    let steps: BTreeSet<u32> = sections(&c.expected)
        .iter()
        .filter_map(|(n, _)| *n)
        .collect();
    if c.name.starts_with("iptables-16") {
        return (1..=7).map(Step::LargeCluster).collect();
    }
    if c.text
        .contains(lb_userspace::source::testconfig::PRESENT_IN_STEPS)
    {
        return steps.into_iter().map(Step::Annotated).collect();
    }
    if steps.len() == 2 {
        return vec![Step::All, Step::WithoutSlices];
    }
    vec![Step::All]
}

// ---------------------------------------------------------------- iptables driver

struct IptablesRun {
    /// Per step: the payload (None when the restore failed) and the tables after it.
    steps: Vec<(Option<String>, Tables)>,
}

fn run_iptables(c: &Case) -> IptablesRun {
    let node = &c.config.settings;
    let period = Duration::from_secs(c.config.sync_period_secs.unwrap_or(30));
    let mut proxier = IptablesProxier::new(period);
    let mut tables = Tables::new();
    let mut out = Vec::new();
    let now = Duration::from_secs(3600);
    for (i, step) in schedule(c).iter().enumerate() {
        let n = i as u32 + 1;
        let mut opts = SyncOptions {
            force_full: false,
            now,
        };
        if c.name.starts_with("iptables-03") && n == 9 {
            // Header: the test injects a foreign rule that keeps svc4's chain referenced.
            tables.append(
                "nat",
                "-A KUBE-SVC-X27LE4BHSL4DOUIK -j KUBE-SEP-AYCN5HPXMIRJNJXU",
            );
        }
        if c.name.starts_with("iptables-16") {
            // Header: steps 3 and 7 are forced full syncs; step 5 sets the last cleanup to
            // now, step 6 to one sync period (plus 1ns) ago.
            opts.force_full = n == 3 || n == 7;
            if n == 5 {
                proxier.set_last_cleanup(now);
            }
            if n == 6 {
                proxier.set_last_cleanup(now - period - Duration::from_nanos(1));
            }
        }
        let model = build_model(c, step);
        let existing = tables.chains("nat");
        let payload = proxier
            .sync(&model, node, &c.config.options, &existing, opts)
            .render();
        match tables.apply(&payload) {
            Ok(()) => {
                proxier.restored(true);
                out.push((Some(payload), tables.clone()));
            }
            Err(e) => {
                eprintln!(
                    "{} step {n}: iptables-restore refused the payload: {e}",
                    c.name
                );
                proxier.restored(false);
                out.push((None, tables.clone()));
            }
        }
    }
    IptablesRun { steps: out }
}

fn parse_flow(line: &str) -> Option<(String, trace::Packet, String)> {
    let rest = line.strip_prefix("FLOW ")?;
    let (name, rest) = rest.split_once(" | ")?;
    let (pkt, result) = rest.split_once(" => ").map_or((rest, ""), |(a, b)| (a, b));
    let (src, dst) = pkt.split_once(" -> ")?;
    let (dst, proto) = dst.rsplit_once('/')?;
    let (dst_ip, port) = dst.rsplit_once(':')?;
    let protocol = match proto {
        "TCP" => Protocol::Tcp,
        "UDP" => Protocol::Udp,
        "SCTP" => Protocol::Sctp,
        _ => return None,
    };
    Some((
        name.to_string(),
        trace::Packet {
            src: src.trim().parse().ok()?,
            dst: dst_ip.trim_matches(|c| c == '[' || c == ']').parse().ok()?,
            dport: port.parse().ok()?,
            protocol,
        },
        result.trim().to_string(),
    ))
}

fn check_flows(
    c: &Case,
    step: Option<u32>,
    body: &str,
    run: &dyn Fn(trace::Packet) -> (String, bool),
) {
    let mut failures = Vec::new();
    let mut count = 0;
    for line in body.lines().filter(|l| l.starts_with("FLOW ")) {
        let (name, pkt, want) =
            parse_flow(line).unwrap_or_else(|| panic!("{}: bad FLOW line {line:?}", c.name));
        count += 1;
        let (result, masq) = run(pkt);
        let got = if masq {
            format!("{result} [masq]")
        } else {
            result
        };
        let got = got.trim().to_string();
        if got != want {
            failures.push(format!(
                "step {step:?} {name}: expected {want:?}, got {got:?}"
            ));
        }
    }
    assert!(count > 0, "{}: no FLOW lines", c.name);
    assert!(
        failures.is_empty(),
        "{}: {} flow(s) differ:\n{}",
        c.name,
        failures.len(),
        failures.join("\n")
    );
}

fn iptables_case(name: &str) {
    let c = case(name);
    let compare = c.config.compare.clone();
    let run = run_iptables(&c);
    let secs = sections(&c.expected);
    let node: &NodeSettings = &c.config.settings;
    if compare.starts_with("sorted-restore-input") {
        for (n, body) in &secs {
            let idx = n.map_or(0, |n| n as usize - 1);
            let (payload, _) = &run.steps[idx];
            if body.trim().is_empty() {
                assert!(
                    payload.is_none(),
                    "{name} step {n:?}: expected a failed restore (no output recorded)"
                );
                continue;
            }
            let payload = payload
                .as_ref()
                .unwrap_or_else(|| panic!("{name} step {n:?}: restore failed"));
            assert_text(
                name,
                &format!("step {n:?}"),
                &sort_restore(payload),
                &sort_restore(body),
            );
        }
    } else if let Some(spec) = compare.strip_prefix("chain ") {
        let spec = spec.split_whitespace().next().unwrap_or("");
        let (table, chain) = spec
            .split_once('/')
            .unwrap_or_else(|| panic!("{name}: bad compare {compare}"));
        let (_, tables) = &run.steps[0];
        let got: String = tables
            .rules(table, chain)
            .iter()
            .map(|r| format!("{r}\n"))
            .collect();
        assert_text(name, spec, &got, &c.expected);
    } else if compare.starts_with("packet-flow") {
        for (n, body) in &secs {
            let idx = n.map_or(0, |n| n as usize - 1);
            let (_, tables) = &run.steps[idx];
            check_flows(&c, *n, body, &|pkt| {
                let t = trace::trace(tables, node, pkt);
                (t.result(), t.masquerade)
            });
        }
    } else if compare.starts_with("per-step assertions") {
        for (n, body) in &secs {
            let Some(n) = n else { continue };
            let payload = run.steps[*n as usize - 1]
                .0
                .clone()
                .unwrap_or_else(|| panic!("{name} step {n}: restore failed"));
            check_assertions(name, *n, &payload, body);
        }
    } else {
        panic!("{name}: unknown compare mode {compare:?}");
    }
}

fn check_assertions(name: &str, step: u32, payload: &str, body: &str) {
    let dnat: Vec<&str> = payload
        .lines()
        .filter(|l| l.starts_with("-A KUBE-SEP-") && l.contains("-j DNAT"))
        .collect();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("line containing ") {
            let (needle, want) = rest.split_once(": ").unwrap_or((rest, ""));
            let needle = format!("--to-destination {needle}:");
            let found: Vec<&&str> = dnat.iter().filter(|l| l.contains(&needle)).collect();
            if want == "<none>" {
                assert!(found.is_empty(), "{name} step {step}: unexpected {found:?}");
            } else {
                assert_eq!(
                    found,
                    vec![&want],
                    "{name} step {step}: line containing {needle}"
                );
            }
        } else if let Some(n) = line.strip_prefix("DNAT lines with --comment: ") {
            let got = dnat.iter().filter(|l| l.contains("--comment")).count();
            assert_eq!(got.to_string(), n, "{name} step {step}: {line}");
        } else if let Some(n) = line.strip_prefix("DNAT lines: ") {
            assert_eq!(dnat.len().to_string(), n, "{name} step {step}: {line}");
        } else if line == "output contains \"-X \": no" {
            assert!(!payload.contains("-X "), "{name} step {step}: {line}");
        } else if let Some(s) = line.strip_prefix("output contains: ") {
            assert!(payload.contains(s), "{name} step {step}: {line}");
        } else if !line.trim().is_empty() && !line.starts_with('#') {
            panic!("{name} step {step}: unknown assertion {line:?}");
        }
    }
}

// ---------------------------------------------------------------- nftables

/// The README's canonical form of a table dump (upstream `sortNFTablesTransaction`).
fn sort_nft(text: &str) -> String {
    let rank = |l: &str| match l.split_whitespace().nth(1) {
        Some("table") => 0,
        Some("chain") => 1,
        Some("rule") => 2,
        Some("set") => 3,
        Some("map") => 4,
        Some("element") => 5,
        _ => 6,
    };
    let mut lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .collect();
    let key = |l: &str| {
        (
            rank(l),
            l.split_whitespace().nth(4).unwrap_or("").to_string(),
        )
    };
    lines.sort_by(|a, b| {
        let (ka, kb) = (key(a), key(b));
        ka.cmp(&kb).then_with(|| {
            if ka.0 == 2 {
                std::cmp::Ordering::Equal
            } else {
                a.cmp(b)
            }
        })
    });
    lines.iter().map(|l| format!("{l}\n")).collect()
}

fn nftables_case(name: &str) {
    use lb_userspace::emit::nftables::{self, NftProxier};
    let c = case(name);
    let node = &c.config.settings;
    let compare = c.config.compare.clone();
    let mut proxier = NftProxier::default();
    let mut states = Vec::new();
    for (i, step) in schedule(&c).iter().enumerate() {
        // nftables-02 header: step 4 is "time passes (staleChains aged by 2s)".
        let now = if c.name.starts_with("nftables-02") && i + 1 >= 4 {
            Duration::from_secs(2)
        } else {
            Duration::ZERO
        };
        states.push(proxier.sync(&build_model(&c, step), node, &c.config.options, now));
    }
    for (n, body) in sections(&c.expected) {
        let idx = n.map_or(0, |n| n as usize - 1);
        let table = &states[idx];
        if compare.starts_with("sorted-nft-transaction") {
            assert_text(
                name,
                &format!("step {n:?}"),
                &sort_nft(&table.render()),
                &sort_nft(&body),
            );
        } else if compare.starts_with("packet-flow") {
            check_flows(&c, n, &body, &|pkt| nftables::trace(table, node, pkt));
        } else {
            panic!("{name}: unknown compare mode {compare:?}");
        }
    }
}

// ---------------------------------------------------------------- ipvs

fn ipvs_case(name: &str) {
    use lb_userspace::emit::{ipvs, restore::split_args};
    let c = case(name);
    let node = &c.config.settings;
    let st = ipvs::emit(&model_at(&c, None), node, &c.config.options);
    let strip = |l: &str| l.split(" #").next().unwrap_or("").trim_end().to_string();
    let lines: Vec<String> = c
        .expected
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .map(strip)
        .collect();
    // The whole IPVS table, order-insensitive.
    let mut want_vs: Vec<String> = Vec::new();
    for l in lines
        .iter()
        .filter(|l| l.starts_with("VS ") || l.starts_with("  RS "))
    {
        if l.starts_with("VS ") {
            want_vs.push(l.clone());
        } else if let Some(last) = want_vs.last_mut() {
            last.push('|');
            last.push_str(l.trim());
        }
    }
    let mut got_vs: Vec<String> = st
        .virtual_servers
        .iter()
        .map(|vs| {
            let hp = |ip: std::net::IpAddr, port: u16| match ip {
                std::net::IpAddr::V4(v) => format!("{v}:{port}"),
                std::net::IpAddr::V6(v) => format!("[{v}]:{port}"),
            };
            let mut s = format!(
                "VS {} {} scheduler={}",
                vs.protocol,
                hp(vs.ip, vs.port),
                vs.scheduler
            );
            let mut reals: Vec<String> = vs
                .reals
                .iter()
                .map(|r| format!("RS {} weight={}", hp(r.ip, r.port), r.weight))
                .collect();
            reals.sort();
            for r in reals {
                s.push('|');
                s.push_str(&r);
            }
            s
        })
        .collect();
    for v in &mut want_vs {
        let mut parts: Vec<String> = v.split('|').map(String::from).collect();
        parts[1..].sort();
        *v = parts.join("|");
    }
    want_vs.sort();
    got_vs.sort();
    assert_eq!(got_vs, want_vs, "{name}: IPVS table");
    // Listed ipsets: exactly the listed entries.
    let mut want_sets: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
    for l in lines.iter().filter_map(|l| l.strip_prefix("IPSET ")) {
        let (set, entry) = l.split_once(' ').unwrap_or((l, ""));
        want_sets
            .entry(set.to_string())
            .or_default()
            .insert(entry.trim().to_string());
    }
    for (set, want) in &want_sets {
        let got = st
            .ipsets
            .get(set)
            .map(|s| s.entries.clone())
            .unwrap_or_default();
        assert_eq!(&got, want, "{name}: ipset {set}");
    }
    // Jumps that must exist: IPTABLES <chain> -> <target> [match-set <set>] [src <cidr>].
    let all_rules: Vec<&String> = st
        .iptables
        .nat
        .rules
        .iter()
        .chain(st.iptables.filter.rules.iter())
        .collect();
    for l in lines.iter().filter_map(|l| l.strip_prefix("IPTABLES ")) {
        let w: Vec<&str> = l.split_whitespace().collect();
        let (chain, target) = (w[0], w[2]);
        let set = w.iter().position(|x| *x == "match-set").map(|i| w[i + 1]);
        let src = w.iter().position(|x| *x == "src").map(|i| w[i + 1]);
        let found = all_rules.iter().any(|r| {
            let a = split_args(r);
            let after = |k: &str| {
                a.iter()
                    .position(|x| x == k)
                    .and_then(|i| a.get(i + 1))
                    .map(String::as_str)
            };
            a.get(1).map(String::as_str) == Some(chain)
                && after("-j") == Some(target)
                && set.is_none_or(|s| after("--match-set") == Some(s))
                && src.is_none_or(|s| after("-s") == Some(s))
        });
        assert!(
            found,
            "{name}: no rule for IPTABLES {l}\n{}",
            st.iptables.render()
        );
    }
}

fn run_case(name: &str) {
    let mode = case(name).config.mode;
    match mode.as_str() {
        "iptables" => iptables_case(name),
        "nftables" => nftables_case(name),
        "ipvs" => ipvs_case(name),
        other => panic!("{name}: mode {other} not implemented yet"),
    }
}

macro_rules! cases {
    ($($f:ident => $name:literal,)*) => {
        $(#[test] fn $f() { run_case($name) })*

        #[test]
        fn every_case_file_has_a_test() {
            let ours: BTreeSet<&str> = [$($name),*].into_iter().collect();
            let mut missing = Vec::new();
            for e in std::fs::read_dir(cases_dir()).expect("read cases") {
                let n = e.expect("entry").file_name().to_string_lossy().into_owned();
                if let Some(case) = n.strip_suffix(".input.yaml") && !ours.contains(case) {
                    missing.push(case.to_string());
                }
            }
            assert!(missing.is_empty(), "cases without a test: {missing:?}");
        }
    };
}

cases! {
    iptables_01_overall => "iptables-01-overall",
    iptables_02_bad_ips => "iptables-02-bad-ips",
    iptables_03_sync_repeated => "iptables-03-sync-repeated",
    iptables_04_nodeports_kube_firewall_1 => "iptables-04-nodeports-kube-firewall-1",
    iptables_05_nodeports_kube_firewall_2 => "iptables-05-nodeports-kube-firewall-2",
    iptables_06_nodeports_kube_firewall_3 => "iptables-06-nodeports-kube-firewall-3",
    iptables_07_nodeports_kube_firewall_4 => "iptables-07-nodeports-kube-firewall-4",
    iptables_08_nodeports_kube_firewall_5 => "iptables-08-nodeports-kube-firewall-5",
    iptables_09_nodeports_kube_firewall_6 => "iptables-09-nodeports-kube-firewall-6",
    iptables_10_nodeports_kube_firewall_7 => "iptables-10-nodeports-kube-firewall-7",
    iptables_11_drop_invalid_1 => "iptables-11-drop-invalid-1",
    iptables_12_drop_invalid_2 => "iptables-12-drop-invalid-2",
    iptables_13_drop_invalid_3 => "iptables-13-drop-invalid-3",
    iptables_14_masquerade_rule_randomfully_false => "iptables-14-masquerade-rule-randomfully-false",
    iptables_15_masquerade_rule_randomfully_true => "iptables-15-masquerade-rule-randomfully-true",
    iptables_16_large_cluster_mode => "iptables-16-large-cluster-mode",
    iptables_17_flows_internal_external_masquerade_base => "iptables-17-flows-internal-external-masquerade-base",
    iptables_18_flows_internal_external_masquerade_no_local_detector => "iptables-18-flows-internal-external-masquerade-no-local-detector",
    iptables_19_flows_internal_external_masquerade_masquerade_all => "iptables-19-flows-internal-external-masquerade-masquerade-all",
    iptables_20_flows_internal_external_masquerade_masquerade_all_no_local_detector => "iptables-20-flows-internal-external-masquerade-masquerade-all-no-local-detector",
    iptables_21_flows_terminating_etp_local_1 => "iptables-21-flows-terminating-etp-local-1",
    iptables_22_flows_terminating_etp_local_2 => "iptables-22-flows-terminating-etp-local-2",
    iptables_23_flows_terminating_etp_local_3 => "iptables-23-flows-terminating-etp-local-3",
    iptables_24_flows_terminating_etp_local_4 => "iptables-24-flows-terminating-etp-local-4",
    iptables_25_flows_terminating_etp_cluster_1 => "iptables-25-flows-terminating-etp-cluster-1",
    iptables_26_flows_terminating_etp_cluster_2 => "iptables-26-flows-terminating-etp-cluster-2",
    iptables_27_flows_terminating_etp_cluster_3 => "iptables-27-flows-terminating-etp-cluster-3",
    iptables_28_flows_terminating_etp_cluster_4 => "iptables-28-flows-terminating-etp-cluster-4",
    iptables_29_flows_loadbalancer_source_ranges => "iptables-29-flows-loadbalancer-source-ranges",
    iptables_30_flows_no_endpoints_reject => "iptables-30-flows-no-endpoints-reject",
    ipvs_01_nodeport_ipv4_two_slices => "ipvs-01-nodeport-ipv4-two-slices",
    ipvs_02_nodeport_ipv4_udp => "ipvs-02-nodeport-ipv4-udp",
    ipvs_03_nodeport_ipv4_no_endpoints => "ipvs-03-nodeport-ipv4-no-endpoints",
    ipvs_04_nodeport_ipv4_sctp_multi_nodeip => "ipvs-04-nodeport-ipv4-sctp-multi-nodeip",
    ipvs_05_nodeport_ipv4_sctp_etp_local => "ipvs-05-nodeport-ipv4-sctp-etp-local",
    ipvs_06_nodeport_ipv6_two_slices => "ipvs-06-nodeport-ipv6-two-slices",
    ipvs_07_nodeport_ipv6_wrong_family_service => "ipvs-07-nodeport-ipv6-wrong-family-service",
    ipvs_08_nodeport_ipv6_no_endpoints => "ipvs-08-nodeport-ipv6-no-endpoints",
    ipvs_09_nodeport_ipv6_sctp_multi_nodeip => "ipvs-09-nodeport-ipv6-sctp-multi-nodeip",
    nftables_01_overall => "nftables-01-overall",
    nftables_02_sync_repeated => "nftables-02-sync-repeated",
    nftables_03_three_clusterip_services => "nftables-03-three-clusterip-services",
    nftables_04_service_without_endpoints => "nftables-04-service-without-endpoints",
    nftables_05_three_services_after_delete => "nftables-05-three-services-after-delete",
    nftables_06_flows_clusterip_general => "nftables-06-flows-clusterip-general",
    nftables_07_flows_no_endpoints_reject => "nftables-07-flows-no-endpoints-reject",
}

/// The one-shot emitter equals the first sync of the stateful proxier.
#[test]
fn one_shot_emit_is_the_first_full_sync() {
    let c = case("iptables-01-overall");
    let model = model_at(&c, None);
    let node = &c.config.settings;
    let mut p = IptablesProxier::default();
    let opts = &c.config.options;
    let synced = p.sync(&model, node, opts, &BTreeSet::new(), SyncOptions::default());
    assert_eq!(iptables::emit(&model, node, opts), synced);
}
