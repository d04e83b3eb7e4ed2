//! NetworkPolicy still applies: a CNI enforces it with rules on pod addresses in the node's
//! FORWARD hook, so a rule that rejects what goes to one backend pod blocks the requests
//! xlb sends that backend (netfilter sees them addressed to it), while the other backend
//! keeps answering.

use std::time::Duration;

use xlb_tests::{
    client::{tcp_request, udp_request},
    netns::run,
    scenario::{Scenario, sock},
    suites::traffic::{DNS, WEB, backends, yaml},
};

/// The policy rule's comment, to find its counter.
const POLICY: &str = "policy: deny ingress to backend-2";

/// The packets the policy rule rejected so far.
fn rejected(s: &Scenario) -> u64 {
    let out = run(s
        .topo
        .node
        .command("iptables-save")
        .args(["-c", "-t", "filter"]))
    .expect("iptables-save");
    let save = String::from_utf8_lossy(&out.stdout);
    save.lines()
        .filter(|l| l.contains(POLICY))
        .filter_map(|l| l.strip_prefix('[')?.split(':').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn a_forward_rule_on_a_backend_address_blocks_what_xlb_sends_it() {
    let test = "a_forward_rule_on_a_backend_address_blocks_what_xlb_sends_it";
    let all = backends(2);
    let Some(s) = Scenario::started(test, "nfp", &yaml(&all, &all), 2, "10.96.0.10:80/TCP") else {
        return;
    };
    let denied = s.topo.backends[1].ip;
    let rule = format!(
        "*filter\n-A FORWARD -d {denied}/32 -m comment --comment \"{POLICY}\" -j REJECT\nCOMMIT\n"
    );
    s.topo
        .node
        .feed("iptables-restore", &["--noflush"], &rule)
        .expect("policy rule");
    let answers = s
        .topo
        .client
        .ns
        .run(|| {
            let t = Duration::from_secs(1);
            (0..16)
                .flat_map(|_| [tcp_request(sock(WEB, 80), t), udp_request(sock(DNS, 53), t)])
                .collect::<Vec<_>>()
        })
        .expect("client thread");
    let answered: Vec<String> = answers
        .iter()
        .filter_map(|a| a.as_ref().ok().map(|a| a.backend.clone()))
        .collect();
    let failed = answers.len() - answered.len();
    assert!(
        answered.iter().all(|b| b == "backend-1"),
        "backend-2's address is rejected in FORWARD, yet it answered: {answered:?}"
    );
    assert!(
        !answered.is_empty(),
        "backend-1 must keep answering: {answers:?}\n{}",
        s.agent.log_text()
    );
    assert!(
        failed > 0 && rejected(&s) > 0,
        "xlb sent nothing to backend-2 that the policy rule rejected ({failed} requests \
         failed, rule counted {}): netfilter did not see them",
        rejected(&s)
    );
}
