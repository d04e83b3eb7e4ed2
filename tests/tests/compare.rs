//! `xlb compare` on inputs that can run here, from the pod and from the node, to ClusterIPs
//! and NodePorts: xlb's datapath (the socket hooks; with `--socket-lb host`, tc for the pod)
//! and kube-proxy's iptables and nftables rules (as xlb emits them) reach the same backends and
//! refuse the same flows, and the userspace mode agrees wherever a service has endpoints,
//! except where kube-proxy is known to differ ([`known_difference`]).

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use lb_userspace::{emit::Mode, model::Protocol};
use xlb_lab::compare::{
    CompareOptions, Flow, Frontend, Impl, Origin, Outcome, Report, compare, outcomes_agree,
};
use xlb_tests::{require_root, unique_tag, xlb_bin};

/// Where a mode is known to do otherwise than xlb as deployed (`--socket-lb all`):
/// * kube-proxy's userspace proxy accepts a connection to a service without endpoints and
///   resets it (TCP), or takes the datagram and never answers (UDP), where xlb refuses;
/// * a datagram (or SCTP INIT) the node itself sends to a ClusterIP without endpoints is
///   REJECTed by kube-proxy's iptables and nftables rules in the output path, before it
///   leaves: the sender's send() fails with EPERM, where xlb's socket hook refuses its
///   connect() (ECONNREFUSED; SCTP: tc egress answers with ICMP port unreachable). A pod's
///   gets the ICMP port unreachable in both;
/// * the node's own SCTP association to its own NodePort address ([`known_gap`]);
/// * a pod to a NodePort with externalTrafficPolicy Local and no endpoint on this node:
///   kube-proxy's local-traffic detector (detect-local-mode ClusterCIDR) and xlb's socket
///   hooks send it to the cluster's endpoints; xlb's tc path (`--socket-lb host`) cannot
///   tell a local pod from an external client (no clusterCIDR) and drops it, as kube-proxy
///   drops external traffic;
/// * a TCP connection to an IPv6 service without endpoints: kube-proxy's REJECT answers the
///   SYN with an ICMPv6 port unreachable, which Linux takes as a soft error while connect()
///   still holds the socket (IPv4 takes it at once), so the client is refused only when it
///   retransmits the SYN a second later: past the probe's 500 ms, it shows as dropped.
///   xlb's socket hook refuses the connect() at once.
fn known_difference(flow: &Flow, mode: Impl, ebpf: &Outcome, other: &Outcome) -> bool {
    match mode {
        Impl::KubeProxy(Mode::Userspace) => !matches!(ebpf, Outcome::Backends(_)),
        Impl::KubeProxy(Mode::Iptables | Mode::Nftables) => {
            let node_udp_eperm = flow.origin == Origin::Node
                && flow.kind == Frontend::ClusterIp
                && matches!(flow.protocol, Protocol::Udp | Protocol::Sctp)
                && *ebpf == Outcome::Refused
                && matches!(other, Outcome::Failed(e) if e.contains("Operation not permitted"));
            let ipv6_tcp_reject = flow.frontend.is_ipv6()
                && flow.protocol == Protocol::Tcp
                && *ebpf == Outcome::Refused
                && *other == Outcome::Dropped;
            let sctp_gap = known_gap(flow) && *ebpf == Outcome::Dropped;
            node_udp_eperm || ipv6_tcp_reject || sctp_gap
        }
        Impl::EbpfHost => {
            flow.origin == Origin::Pod
                && flow.kind == Frontend::NodePort
                && matches!(ebpf, Outcome::Backends(_))
                && *other == Outcome::Dropped
        }
        Impl::Ebpf | Impl::KubeProxy(Mode::Ipvs) => false,
    }
}

/// Compares every mode on `source`: each does what xlb does, or differs only as
/// [`known_difference`] says.
fn check(source: PathBuf) -> Report {
    check_modes(source, &Impl::ALL)
}

/// [`check`] with `modes` (xlb's default mode, [`Impl::Ebpf`], among them) on every flow
/// a mode serves (kube-proxy's userspace mode is IPv4 only).
fn check_modes(source: PathBuf, modes: &[Impl]) -> Report {
    let opts = CompareOptions {
        source: source.clone(),
        node_name: "node1".into(),
        // Backend sets are compared: with 40 requests per flow the chance that random
        // selection misses one of 3 backends is 3 × (2/3)^40 ≈ 3e-7.
        requests: 40,
        modes: modes.to_vec(),
        xlb: xlb_bin(),
        tag: unique_tag("xq"),
    };
    let report = compare(&opts).unwrap_or_else(|e| panic!("{}: {e}", source.display()));
    assert!(!report.flows.is_empty(), "{}: no flows", source.display());
    for (flow, by) in &report.flows {
        let ebpf = &by[&Impl::Ebpf];
        for m in modes.iter().copied().filter(|m| *m != Impl::Ebpf) {
            let Some(other) = by.get(&m) else {
                assert!(!m.serves(flow), "{flow:?}: {} did not run it", m.name());
                continue;
            };
            assert!(
                outcomes_agree(flow, ebpf, other) || known_difference(flow, m, ebpf, other),
                "{}: {flow:?}: {} and xlb-ebpf differ\n{}",
                source.display(),
                m.name(),
                report.render()
            );
        }
    }
    report
}

fn case(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
        "../../shared/conformance/kube-proxy/cases/{name}.input.yaml"
    ))
}

#[test]
fn modes_agree_on_the_demo_services() {
    if !require_root() {
        return;
    }
    check(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/demo-services.yaml"));
}

#[test]
fn modes_agree_on_kube_proxys_overall_case() {
    if !require_root() {
        return;
    }
    check(case("iptables-01-overall"));
}

#[test]
fn modes_agree_on_refusing_a_service_without_endpoints() {
    if !require_root() {
        return;
    }
    check(case("iptables-30-flows-no-endpoints-reject"));
}

#[test]
fn the_four_origins_agree_on_cluster_ip_and_node_port_services() {
    if !require_root() {
        return;
    }
    let report = check(Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/compare-origins.yaml"));
    let table = report.render();
    let origins: BTreeSet<(Origin, Frontend)> = report
        .flows
        .iter()
        .map(|(f, _)| (f.origin, f.kind))
        .collect();
    assert_eq!(
        origins.len(),
        4,
        "pod and node, to ClusterIP and NodePort:\n{table}"
    );
    for (flow, by) in &report.flows {
        let want = if flow.service.starts_with("demo/empty:") {
            Outcome::Refused
        } else {
            let first = if flow.service.starts_with("demo/web:") {
                2
            } else {
                5
            };
            let port = if flow.protocol == Protocol::Tcp {
                8080
            } else {
                5353
            };
            Outcome::Backends(
                (first..first + 3)
                    .map(|k| format!("10.244.{k}.2:{port}"))
                    .collect(),
            )
        };
        assert_eq!(by[&Impl::Ebpf], want, "{flow:?}\n{table}");
    }
    // The paths the labels name: with --socket-lb all the hooks did everything (tc saw no
    // frontend at all); with host, tc served the pod.
    let counts = |m: Impl, c: &str| report.counters[&m].get(c).copied().unwrap_or(0);
    assert_eq!(counts(Impl::Ebpf, "new_flow"), 0, "{table}");
    assert!(counts(Impl::Ebpf, "sock_xlate") > 0, "{table}");
    assert!(counts(Impl::Ebpf, "sock_reject") > 0, "{table}");
    assert!(counts(Impl::EbpfHost, "new_flow") > 0, "{table}");
    assert!(counts(Impl::EbpfHost, "sock_xlate") > 0, "{table}");
}

/// Both families side by side: a dual-stack ClusterIP Service (IPv6 first), a dual-stack
/// NodePort Service and an IPv6-only Service without endpoints, each family's endpoints in
/// its own EndpointSlice. kube-proxy runs its second proxier for IPv6 (ip6tables, the
/// `ip6 kube-proxy` table); xlb serves both families from one agent, the pod's IPv6 flows
/// through the socket hooks and, with `--socket-lb host`, through tc, NodePorts on the
/// node's IPv6 address too. Every IPv6 flow reaches that family's endpoints only, from the
/// pod and from the node.
#[test]
fn modes_agree_over_both_families_on_dual_stack_services() {
    if !require_root() {
        return;
    }
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/compare-dual-stack.yaml");
    let report = check(source);
    let table = report.render();
    let v6 = report.flows.iter().filter(|(f, _)| f.frontend.is_ipv6());
    let v6: Vec<_> = v6.collect();
    assert_eq!(
        v6.len(),
        16,
        "8 IPv6 ClusterIP and 4 IPv6 NodePort flows… \n{table}"
    );
    for (flow, by) in v6 {
        let ebpf = &by[&Impl::Ebpf];
        assert!(
            !by.contains_key(&Impl::KubeProxy(Mode::Userspace)),
            "{table}"
        );
        match ebpf {
            Outcome::Backends(b) => assert!(
                b.len() == 3 && b.iter().all(|b| b.starts_with("[fd00:10:244:")),
                "{flow:?}: {b:?}\n{table}"
            ),
            Outcome::Refused => assert!(
                flow.service.starts_with("demo/empty6:"),
                "{flow:?}\n{table}"
            ),
            other => panic!("{flow:?}: {other}\n{table}"),
        }
    }
}

/// SCTP, which no socket hook sees: a pod's associations go through tc ingress, the node's
/// own through tc egress (its route to the ClusterIP leaves by the lab's void gateway);
/// kube-proxy's iptables and nftables rules DNAT them in PREROUTING and OUTPUT. Both
/// families, a ClusterIP and a NodePort, a Service without endpoints. (kube-proxy's
/// userspace mode has no SCTP.)
#[test]
fn modes_agree_on_sctp_services_from_the_pod_and_the_node() {
    if !require_root() {
        return;
    }
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/compare-sctp.yaml");
    let report = check(source);
    let table = report.render();
    let sctp: Vec<_> = report
        .flows
        .iter()
        .filter(|(f, _)| f.protocol == Protocol::Sctp)
        .collect();
    assert_eq!(sctp.len(), 12, "every flow is SCTP\n{table}");
    for (flow, by) in sctp {
        let ebpf = &by[&Impl::Ebpf];
        assert!(
            !by.contains_key(&Impl::KubeProxy(Mode::Userspace)),
            "{table}"
        );
        match ebpf {
            Outcome::Backends(b) => assert_eq!(b.len(), 3, "{flow:?}: {b:?}\n{table}"),
            Outcome::Refused => {
                assert!(flow.service.starts_with("telco/none"), "{flow:?}\n{table}")
            }
            other if known_gap(flow) => assert_eq!(*other, Outcome::Dropped, "{flow:?}\n{table}"),
            other => panic!("{flow:?}: {other}\n{table}"),
        }
    }
}

/// Where xlb serves less than kube-proxy, documented (docs/datapath.md § SCTP): the node's
/// own SCTP association to a NodePort on its own address goes over `lo`, where xlb has no
/// program (no socket hook runs for SCTP), so nothing translates it.
fn known_gap(flow: &Flow) -> bool {
    flow.protocol == Protocol::Sctp
        && flow.origin == Origin::Node
        && flow.kind == Frontend::NodePort
}
