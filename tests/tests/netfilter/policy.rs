//! NetworkPolicy still applies: a CNI enforces it with rules on pod addresses in the node's
//! FORWARD hook, so a rule that rejects what goes to one backend pod blocks the requests
//! xlb sends that backend (netfilter sees them addressed to it), while the other backend
//! keeps answering; both families. And the rejection reaches the client as under
//! kube-proxy: a TCP reset or an ICMP port unreachable about the flow, which the client's
//! socket takes as "connection refused" at once (a control checks that under kube-proxy's
//! own rules).

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use xlb_tests::{
    client::{Answer, tcp_request, udp_request},
    netns::run,
    topology::{pod_ip, pod_ip6},
    twonode::Lab,
};

use crate::{Frontends, V4, V6, lab, log_tail, paths, wait_served};

/// The policy rules' comment, to find their counters.
const POLICY: &str = "policy: deny ingress to backend-1";

/// Rejects, first thing in node1's FORWARD, what goes to node1's backend pod in `family`:
/// TCP with a reset, the rest with an ICMP port unreachable.
fn deny_backend_1(lab: &Lab, family: &Frontends) {
    let (restore, denied) = match family.both {
        IpAddr::V4(_) => ("iptables-restore", format!("{}/32", pod_ip(2))),
        IpAddr::V6(_) => ("ip6tables-restore", format!("{}/128", pod_ip6(2))),
    };
    let rules = format!(
        "*filter\n\
         -I FORWARD 1 -d {denied} -m comment --comment \"{POLICY}\" -j REJECT\n\
         -I FORWARD 1 -d {denied} -p tcp -m comment --comment \"{POLICY}\" -j REJECT --reject-with tcp-reset\n\
         COMMIT\n"
    );
    lab.topo
        .node
        .feed(restore, &["--noflush"], &rules)
        .expect("policy rules");
}

/// The packets the policy rules rejected so far (both families).
fn rejected(lab: &Lab) -> u64 {
    let mut n = 0;
    for save in ["iptables-save", "ip6tables-save"] {
        let out = run(lab.topo.node.command(save).args(["-c", "-t", "filter"])).expect(save);
        let text = String::from_utf8_lossy(&out.stdout);
        n += text
            .lines()
            .filter(|l| l.contains(POLICY))
            .filter_map(|l| l.strip_prefix('[')?.split(':').next()?.parse::<u64>().ok())
            .sum::<u64>();
    }
    n
}

/// 16 TCP and 16 UDP requests from the client pod to the `both` Service of `family`.
fn requests(lab: &Lab, family: &Frontends) -> Vec<Result<Answer, String>> {
    let (tcp, udp) = (
        SocketAddr::new(family.both, 80),
        SocketAddr::new(family.both, 53),
    );
    lab.topo
        .client
        .ns
        .run(move || {
            let t = Duration::from_secs(1);
            (0..16)
                .flat_map(|_| [tcp_request(tcp, t), udp_request(udp, t)])
                .collect::<Vec<_>>()
        })
        .expect("client thread")
}

/// The policy blocks backend-1, n2-backend-1 keeps answering, and the rules counted what
/// they rejected; with `refusals`, every failed request was refused (not timed out).
fn policy_applies(lab: &Lab, family: &Frontends, refusals: bool) {
    // The lab serves before the policy: pod → ClusterIP reaches backend-1.
    wait_served(lab, &paths(family)[..1]);
    deny_backend_1(lab, family);
    let answers = requests(lab, family);
    let answered: Vec<&str> = answers
        .iter()
        .filter_map(|a| a.as_ref().ok().map(|a| a.backend.as_str()))
        .collect();
    let errors: Vec<&String> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
    let what = format!("{} (policy on backend-1's address)", family.both);
    assert!(
        answered.iter().all(|b| *b == "n2-backend-1"),
        "{what}: backend-1's address is rejected in FORWARD, yet it answered: {answered:?}"
    );
    assert!(
        !answered.is_empty(),
        "{what}: n2-backend-1 must keep answering: {answers:?}\n{}",
        log_tail(&lab.agent.log_text())
    );
    let counted = rejected(lab);
    assert!(
        !errors.is_empty() && counted > 0,
        "{what}: xlb sent nothing to backend-1 that the policy rejected ({} requests failed, \
         the rules counted {counted}): netfilter did not see them",
        errors.len()
    );
    if refusals {
        let slow: Vec<&&String> = errors.iter().filter(|e| !e.contains("refused")).collect();
        assert!(
            slow.is_empty(),
            "{what}: the policy's reset or port unreachable must reach the client as a \
             refusal of its own flow, as under kube-proxy; {} of {} rejected requests \
             ended otherwise: {slow:?}\n{}",
            slow.len(),
            errors.len(),
            log_tail(&lab.agent.log_text())
        );
    }
}

#[test]
fn a_forward_rule_on_a_backend_address_blocks_what_xlb_sends_it() {
    for (prefix, family) in [("nfp4", &V4), ("nfp6", &V6)] {
        let Some(lab) = lab(prefix, &[]) else {
            return;
        };
        policy_applies(&lab, family, false);
    }
}

#[test]
fn a_policy_rejection_reaches_the_client_as_a_refusal() {
    for (prefix, family) in [("nfr4", &V4), ("nfr6", &V6)] {
        let Some(lab) = lab(prefix, &[]) else {
            return;
        };
        policy_applies(&lab, family, true);
    }
}

#[test]
fn control_a_policy_rejection_is_a_refusal_under_kube_proxy() {
    for (prefix, family) in [("nfrc4", &V4), ("nfrc6", &V6)] {
        let Some(mut lab) = lab(prefix, &[]) else {
            return;
        };
        crate::control::kube_proxy_instead(&mut lab);
        policy_applies(&lab, family, true);
    }
}
