//! kube-proxy's ipvs cases: virtual servers, ipsets, addresses and iptables rules.

use std::collections::BTreeSet;

use lb_userspace::emit::{
    ipvs::{self, IpvsState},
    restore::split_args,
};

use xlb_tests::suites::conformance::{case, model_at};

pub(crate) fn ipvs_case(name: &str) {
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
    check_virtual_servers(name, &st, &lines);
    check_ipsets(name, &st, &lines);
    check_jumps(name, &st, &lines);
}

/// The whole IPVS table, order-insensitive.
fn check_virtual_servers(name: &str, st: &IpvsState, lines: &[String]) {
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
}

/// Listed ipsets: exactly the listed entries.
fn check_ipsets(name: &str, st: &IpvsState, lines: &[String]) {
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
}

/// Jumps that must exist: IPTABLES <chain> -> <target> [match-set <set>] [src <cidr>].
fn check_jumps(name: &str, st: &IpvsState, lines: &[String]) {
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
