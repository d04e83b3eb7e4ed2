//! kube-proxy's nftables cases: sorted transactions and packet flows.

use std::time::Duration;

use xlb_tests::suites::conformance::{
    assert_text, build_model, case, check_flows, schedule, sections,
};

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

pub(crate) fn nftables_case(name: &str) {
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
