//! A differential test: Services and EndpointSlices generated from a seeded RNG (traffic
//! policies, endpoint condition mixes, ClientIP affinity, no endpoints, several ports, TCP,
//! UDP and SCTP) go through `xlb compare`'s machinery, and xlb's eBPF datapath (`--socket-lb
//! all`) must do what kube-proxy's iptables and nftables rules (as xlb emits them) do on
//! every flow, from the pod and from the node. A failure names its seed and carries the
//! YAML; `XLB_DIFF_SEED=N[,M…]` runs seeds of your choice instead of the fixed ones.

use std::{collections::BTreeSet, fmt::Write as _, time::Instant};

use lb_userspace::{
    emit::Mode,
    model::{Protocol, TrafficPolicy},
    source::file,
};
use rand::{Rng, SeedableRng, rngs::StdRng};
use xlb_lab::compare::{
    CompareOptions, Flow, Frontend, Impl, Origin, Outcome, compare, outcomes_agree,
};
use xlb_tests::{require_root, unique_tag, xlb_bin};

/// The seeds every run covers.
const SEEDS: [u64; 6] = [3, 8, 11, 14, 16, 21];
/// Services per seed: a few, to keep the run short.
const SERVICES: usize = 3;

/// An endpoint's conditions: (ready, serving, terminating).
const CONDITIONS: [(bool, bool, bool); 4] = [
    (true, true, false),   // ready
    (false, false, false), // not ready
    (false, true, true),   // terminating, still serving
    (false, false, true),  // terminating, not serving
];

fn policy(rng: &mut StdRng) -> &'static str {
    if rng.random_bool(0.5) {
        "Local"
    } else {
        "Cluster"
    }
}

/// One Service (service `i`) and, unless it has none, its EndpointSlice, as YAML.
fn service_yaml(rng: &mut StdRng, i: usize) -> String {
    let node_port = rng.random_bool(0.5);
    let ports: Vec<(String, &str, u16)> = (0..rng.random_range(1..=2))
        .map(|k| {
            let proto = ["TCP", "UDP", "SCTP"][rng.random_range(0..3)];
            (format!("p{k}"), proto, 8080 + k as u16)
        })
        .collect();
    let mut y = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{namespace: gen, name: s{i}}}\nspec:\n  type: {}\n  clusterIP: 10.96.1.{}\n  internalTrafficPolicy: {}\n",
        if node_port { "NodePort" } else { "ClusterIP" },
        10 + i,
        policy(rng),
    );
    if node_port {
        let _ = writeln!(y, "  externalTrafficPolicy: {}", policy(rng));
    }
    if rng.random_bool(0.35) {
        y.push_str("  sessionAffinity: ClientIP\n");
    }
    y.push_str("  ports:\n");
    for (k, (name, proto, target)) in ports.iter().enumerate() {
        let np = if node_port {
            format!(", nodePort: {}", 30100 + 10 * i + k)
        } else {
            String::new()
        };
        let _ = writeln!(
            y,
            "  - {{name: {name}, port: {}, protocol: {proto}, targetPort: {target}{np}}}",
            80 + k
        );
    }
    y.push_str(&slice_yaml(rng, i, &ports));
    y
}

/// Service `i`'s slice: no slice at all, an empty one, or up to four endpoints of mixed
/// conditions on this node or another.
fn slice_yaml(rng: &mut StdRng, i: usize, ports: &[(String, &str, u16)]) -> String {
    let count = rng.random_range(0..=4);
    if count == 0 && rng.random_bool(0.5) {
        return String::new();
    }
    let mut y = format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: gen\n  name: s{i}-1\n  labels: {{kubernetes.io/service-name: s{i}}}\naddressType: IPv4\nports:\n"
    );
    for (name, proto, target) in ports {
        let _ = writeln!(y, "- {{name: {name}, port: {target}, protocol: {proto}}}");
    }
    y.push_str(if count == 0 {
        "endpoints: []\n"
    } else {
        "endpoints:\n"
    });
    for j in 0..count {
        let (ready, serving, terminating) = CONDITIONS[rng.random_range(0..CONDITIONS.len())];
        let node = if rng.random_bool(0.6) {
            "node1"
        } else {
            "node2"
        };
        let _ = writeln!(
            y,
            "- {{addresses: [\"10.244.{}.{}\"], conditions: {{ready: {ready}, serving: {serving}, terminating: {terminating}}}, nodeName: {node}}}",
            10 + i,
            2 + j
        );
    }
    y
}

/// The generated input for `seed`.
fn generate(seed: u64) -> String {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..SERVICES)
        .map(|i| service_yaml(&mut rng, i))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// Where xlb is documented to differ from kube-proxy's rules; nothing else is excused:
/// * a datagram the node itself sends to a ClusterIP without endpoints is REJECTed by
///   iptables/nftables in the output path, so send() fails with EPERM, where xlb's socket
///   hook refuses the connect() (ECONNREFUSED) (`tests/tests/compare.rs`,
///   `known_difference`);
/// * where kube-proxy drops (a Local traffic policy without a local endpoint), xlb's socket
///   hook fails the connect() at once with EHOSTUNREACH: a socket cannot wait (docs/datapath.md,
///   "the call fails at once with `EHOSTUNREACH`"). kube-proxy's DROP is a timeout for a
///   pod, and for the node's own datagram (dropped in the output path) an EPERM from send();
/// * SCTP, which no socket hook sees: the node's own association that xlb drops at tc egress
///   (a Local policy without a local endpoint) is dropped by kube-proxy in the output path
///   (send() fails with EPERM); and the node's own association to a NodePort on its own
///   address crosses no xlb program (it goes over `lo`), where kube-proxy's OUTPUT rules
///   serve it (docs/datapath.md § SCTP);
/// * a pod to a NodePort with externalTrafficPolicy Local and no endpoint on this node
///   (`etp_local` names those services): xlb's socket hooks send it to the cluster's
///   endpoints, as kube-proxy does with a local-traffic detector (detect-local-mode
///   ClusterCIDR); the lab's rules have no cluster CIDR, so there kube-proxy treats it as
///   external traffic (`tests/tests/compare.rs`, `known_difference`; docs/kube-proxy-modes.md): it drops it,
///   or, with only a serving-terminating endpoint on this node (seed 21), sends it there
///   while xlb picks the ready remote one. Either way xlb answered from the cluster's
///   endpoints and kube-proxy did not refuse.
fn known_difference(
    flow: &Flow,
    ebpf: &Outcome,
    other: &Outcome,
    etp_local: &BTreeSet<String>,
) -> bool {
    let service = flow.service.split(':').next().unwrap_or_default();
    let pod_to_local_node_port = flow.origin == Origin::Pod
        && flow.kind == Frontend::NodePort
        && etp_local.contains(service)
        && matches!(ebpf, Outcome::Backends(_))
        && matches!(other, Outcome::Dropped | Outcome::Backends(_));
    let eperm = matches!(other, Outcome::Failed(e) if e.contains("Operation not permitted"));
    let node = flow.origin == Origin::Node;
    let node_udp = node && matches!(flow.protocol, Protocol::Udp | Protocol::Sctp);
    let refused_vs_eperm =
        node_udp && flow.kind == Frontend::ClusterIp && *ebpf == Outcome::Refused && eperm;
    let unreachable = matches!(ebpf, Outcome::Failed(e) if e.contains("No route to host"));
    let dropped = *other == Outcome::Dropped || (node_udp && eperm);
    // SCTP has no socket hook: the node's own association that xlb drops at tc egress is
    // one kube-proxy drops in the output path (EPERM).
    let sctp = flow.protocol == Protocol::Sctp;
    let node_sctp_dropped = node && sctp && *ebpf == Outcome::Dropped && dropped;
    // The node's own SCTP association to its own NodePort address crosses no xlb program
    // (`lo`): documented, docs/datapath.md § SCTP.
    let node_sctp_node_port =
        node && sctp && flow.kind == Frontend::NodePort && *ebpf == Outcome::Dropped;
    refused_vs_eperm
        || (unreachable && dropped)
        || pod_to_local_node_port
        || node_sctp_dropped
        || node_sctp_node_port
}

/// The services (`ns/name`) of `yaml` with externalTrafficPolicy Local.
fn etp_local_services(seed: u64, yaml: &str) -> BTreeSet<String> {
    let loaded =
        file::parse("generated.yaml", yaml).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{yaml}"));
    loaded
        .model
        .services
        .iter()
        .filter(|(_, s)| s.external_traffic_policy == TrafficPolicy::Local)
        .map(|(id, _)| id.to_string())
        .collect()
}

/// Runs one seed through xlb-ebpf, iptables and nftables; the disagreements, described.
fn run_seed(seed: u64) -> Vec<String> {
    let yaml = generate(seed);
    let etp_local = etp_local_services(seed, &yaml);
    let tag = unique_tag("xd");
    let path = std::env::temp_dir().join(format!("{tag}.yaml"));
    std::fs::write(&path, &yaml).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let opts = CompareOptions {
        source: path.clone(),
        node_name: "node1".into(),
        // With 30 requests the chance that random selection misses one of 4 backends is
        // 4 × (3/4)^30 ≈ 7e-4 per flow; backend sets are compared.
        requests: 30,
        modes: vec![
            Impl::Ebpf,
            Impl::KubeProxy(Mode::Iptables),
            Impl::KubeProxy(Mode::Nftables),
        ],
        xlb: xlb_bin(),
        tag,
    };
    let report = compare(&opts);
    let _ = std::fs::remove_file(&path);
    let report = report.unwrap_or_else(|e| panic!("seed {seed}: {e}\n{yaml}"));
    let mut bad = Vec::new();
    for (flow, by) in &report.flows {
        let ebpf = &by[&Impl::Ebpf];
        for m in [
            Impl::KubeProxy(Mode::Iptables),
            Impl::KubeProxy(Mode::Nftables),
        ] {
            let other = &by[&m];
            if !outcomes_agree(flow, ebpf, other)
                && !known_difference(flow, ebpf, other, &etp_local)
            {
                bad.push(format!(
                    "seed {seed}: {} {} {}/{} from {}: xlb-ebpf {ebpf}, {} {other}",
                    flow.service,
                    flow.kind.name(),
                    flow.frontend,
                    flow.protocol,
                    flow.origin.name(),
                    m.name()
                ));
            }
        }
    }
    if !bad.is_empty() {
        bad.push(format!("seed {seed} input:\n{yaml}\n{}", report.render()));
    }
    bad
}

/// `XLB_DIFF_SEED` (comma-separated), else [`SEEDS`].
fn seeds() -> Vec<u64> {
    let chosen: Vec<u64> = std::env::var("XLB_DIFF_SEED")
        .unwrap_or_default()
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    if chosen.is_empty() {
        SEEDS.to_vec()
    } else {
        chosen
    }
}

#[test]
fn generated_services_agree_between_xlb_and_kube_proxys_rules() {
    if !require_root() {
        return;
    }
    let started = Instant::now();
    let bad: Vec<String> = seeds().into_iter().flat_map(run_seed).collect();
    eprintln!("differential: {:?} in {:?}", seeds(), started.elapsed());
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_generator_is_deterministic_and_covers_the_features() {
    assert_eq!(generate(7), generate(7));
    // The fixed seeds between them cover every feature.
    let all: String = SEEDS.into_iter().map(generate).collect();
    for needle in [
        "internalTrafficPolicy: Local",
        "externalTrafficPolicy: Local",
        "externalTrafficPolicy: Cluster",
        "sessionAffinity: ClientIP",
        "endpoints: []",
        "terminating: true",
        "serving: true",
        "protocol: UDP",
        "protocol: TCP",
        "protocol: SCTP",
        "name: p1",
    ] {
        assert!(all.contains(needle), "{needle}");
    }
}

/// Seed 8's bug, without root: a NodePort with internal and external traffic policy Local
/// and only remote endpoints. kube-proxy's `UsesClusterEndpoints` holds for any externally
/// accessible port (the node's and pods' traffic short-circuits to the cluster endpoints),
/// so the `KUBE-SVC-` chain that `KUBE-EXT-` jumps to must exist; xlb once left it out and
/// iptables-restore failed.
#[test]
fn a_local_local_node_port_without_local_endpoints_declares_its_cluster_chain() {
    let yaml = "apiVersion: v1\nkind: Service\nmetadata: {namespace: gen, name: s1}\nspec:\n  type: NodePort\n  clusterIP: 10.96.1.11\n  internalTrafficPolicy: Local\n  externalTrafficPolicy: Local\n  ports:\n  - {name: p0, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30110}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {namespace: gen, name: s1-1, labels: {kubernetes.io/service-name: s1}}\naddressType: IPv4\nports:\n- {name: p0, port: 8080, protocol: TCP}\nendpoints:\n- {addresses: [\"10.244.11.3\"], conditions: {ready: true}, nodeName: node2}\n";
    let loaded = file::parse("local-local.yaml", yaml).expect("yaml");
    let settings = lb_userspace::model::NodeSettings {
        node_name: "node1".into(),
        ..Default::default()
    };
    let opts = lb_userspace::emit::WriterOptions::default();
    let rules = lb_userspace::emit::iptables::emit(&loaded.model, &settings, &opts).render();
    let declared: BTreeSet<&str> = rules
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let jumped: BTreeSet<&str> = rules
        .lines()
        .filter_map(|l| l.split(" -j ").nth(1))
        .filter_map(|t| t.split_whitespace().next())
        .filter(|t| t.starts_with("KUBE-SVC-"))
        .collect();
    assert!(!jumped.is_empty(), "{rules}");
    assert!(jumped.is_subset(&declared), "{rules}");
}
