//! kube-proxy's iptables cases: canonical sorting, partial syncs through an in-memory
//! iptables-restore, packet flows through the rule tracer.

use std::{collections::BTreeSet, time::Duration};

use lb_userspace::{
    emit::{
        iptables::{self, IptablesProxier, SyncOptions},
        restore::Tables,
        trace,
    },
    model::NodeSettings,
};
use xlb_tests::suites::conformance::{
    Case, assert_text, build_model, case, check_flows, model_at, schedule, sections,
};

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

pub(crate) fn iptables_case(name: &str) {
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
