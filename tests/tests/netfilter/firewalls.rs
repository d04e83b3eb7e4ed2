//! Nodes whose rules drop conntrack-INVALID packets: kube-proxy's leftover `KUBE-FORWARD`
//! chain (with a host firewall's INPUT rules), an nftables host firewall (`table inet
//! filter`), a Calico-like chain per interface. With each, in each family, every path
//! through xlb's tc datapath (pod → ClusterIP to a local and a remote backend, pod →
//! NodePort, external client → NodePort with a local and with a remote, SNATed backend, a
//! pod reaching itself through its Service) is served over TCP and UDP; each request's
//! replies are counted by the firewall's ESTABLISHED rules (netfilter saw them as replies
//! of the flow it tracked, not bypassed), and its INVALID rules drop nothing.

use xlb_tests::{
    netfilter::{Counters, Firewall},
    twonode::Lab,
};

use crate::{Frontends, V4, V6, ask, lab, log_tail, paths, wait_served};

/// Requests per path and protocol.
const REQUESTS: usize = 5;

/// The interfaces a per-interface firewall guards: node1's pod veths and its uplink and
/// underlay.
fn guarded(lab: &Lab) -> Vec<String> {
    let pods = lab.topo.backends.iter().chain([&lab.topo.client]);
    pods.map(|p| p.host_if.clone())
        .chain(["up0".to_string(), "ul1".to_string()])
        .collect()
}

/// Every path of `family`'s frontends served with `firewall` on node1, each counted.
fn served_through(prefix: &str, firewall: Firewall, family: &Frontends) {
    let Some(lab) = lab(prefix, &[]) else {
        return;
    };
    wait_served(&lab, &paths(family));
    install(&lab, firewall);
    let (bad, report) = check_paths(&lab, firewall, family);
    assert_eq!(
        bad,
        0,
        "{firewall:?}: {bad} paths not served through the firewall, or their replies not \
         counted as ESTABLISHED (at least {REQUESTS}) or some counted INVALID:\n{report}\n\
         --- rules:\n{}\n{}",
        firewall.listing(&lab.topo.node),
        log_tail(&lab.agent.log_text())
    );
}

/// Installs `firewall` on node1, guarding [`guarded`]'s interfaces.
pub fn install(lab: &Lab, firewall: Firewall) {
    let interfaces = guarded(lab);
    let interfaces: Vec<&str> = interfaces.iter().map(String::as_str).collect();
    firewall
        .install(&lab.topo.node, &interfaces)
        .unwrap_or_else(|e| panic!("{firewall:?}: {e}"));
}

/// [`REQUESTS`] requests over TCP and over UDP along every path of `family`, each counted
/// by `firewall` (installed on node1): how many paths went wrong (not served, replies not
/// counted as ESTABLISHED at least once per request, or something counted INVALID) and a
/// report line per path and protocol.
pub fn check_paths(lab: &Lab, firewall: Firewall, family: &Frontends) -> (usize, String) {
    let node = &lab.topo.node;
    let mut report = Vec::new();
    let mut bad = 0;
    for path in &paths(family) {
        for protocol in ["TCP", "UDP"] {
            let before = firewall.counters(node).expect("counters");
            let served = ask(lab, path, protocol, REQUESTS);
            let seen: Counters = firewall.counters(node).expect("counters").since(before);
            let ok = served.is_ok() && seen.established >= REQUESTS as u64 && seen.invalid == 0;
            bad += usize::from(!ok);
            report.push(format!(
                "{} {} over {protocol}: {}; ESTABLISHED accepted +{}, INVALID dropped +{}",
                if ok { "ok " } else { "BAD" },
                path.what,
                served.map_or_else(|e| format!("FAILED ({e})"), |()| "served".into()),
                seen.established,
                seen.invalid,
            ));
        }
    }
    (bad, report.join("\n"))
}

#[test]
fn kube_forward_invalid_drop_serves_every_ipv4_path() {
    served_through("nfk4", Firewall::KubeForward, &V4);
}

#[test]
fn kube_forward_invalid_drop_serves_every_ipv6_path() {
    served_through("nfk6", Firewall::KubeForward, &V6);
}

#[test]
fn nft_inet_firewall_serves_every_ipv4_path() {
    served_through("nfn4", Firewall::NftInet, &V4);
}

#[test]
fn nft_inet_firewall_serves_every_ipv6_path() {
    served_through("nfn6", Firewall::NftInet, &V6);
}

#[test]
fn calico_like_interface_chains_serve_every_ipv4_path() {
    served_through("nfc4", Firewall::CalicoLike, &V4);
}

#[test]
fn calico_like_interface_chains_serve_every_ipv6_path() {
    served_through("nfc6", Firewall::CalicoLike, &V6);
}
