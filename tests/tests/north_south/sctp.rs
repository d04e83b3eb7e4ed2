//! SCTP from outside: an external client runs whole associations (`xlb_lab::sctp`) to a
//! dual-stack SCTP NodePort whose backends are one pod on node1 and one on node2, in both
//! families. A local backend sees the client; a remote one sees node1's underlay address
//! (SNAT, externalTrafficPolicy Cluster), and its replies come back through node1 to be
//! reverse-translated. Every packet either peer takes is checked against an independent
//! CRC32c, and `targetPort` differs from the NodePort, so each packet's checksum was
//! rewritten on the way.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use xlb_lab::sctp::{SctpServer, sctp_request};
use xlb_tests::{
    checksums::assert_no_bad_sctp_checksums,
    require_root,
    services::{Port, dual_stack_service_on_nodes},
    suites::north_south::{CLIENT_IP, NODE_IP, seen_ip},
    topology::{
        NODE1_UNDERLAY, NODE1_UNDERLAY6, NODE2_UNDERLAY, NODE2_UNDERLAY6, pod_ip, pod_ip6,
        remote_pod_ip, remote_pod_ip6,
    },
    twonode::{CLIENT6, Lab, NODE6},
};

const NODE_PORT: u16 = 30412;
const TARGET: u16 = 9000;
const TIMEOUT: Duration = Duration::from_secs(2);

fn yaml() -> String {
    let ports = [Port {
        name: "sig",
        port: 38412,
        protocol: "SCTP",
        target: TARGET,
        node_port: NODE_PORT,
    }];
    dual_stack_service_on_nodes(
        "sig",
        "NodePort",
        (
            "10.96.0.38".parse().expect("ip"),
            "fd00:10:96::38".parse().expect("ip"),
        ),
        &ports,
        "",
        (
            &[(pod_ip(2), "node1"), (remote_pod_ip(1), "node2")],
            &[(pod_ip6(2), "node1"), (remote_pod_ip6(1), "node2")],
        ),
    )
}

/// The dual-stack lab with SCTP servers on the local and the remote backend, both families.
fn sctp_lab(prefix: &str) -> (Lab, Vec<SctpServer>) {
    let lab = Lab::start_dual_stack(prefix, &yaml(), &format!("[{NODE6}]:{NODE_PORT}/SCTP"), &[]);
    let local = &lab.topo.backends[0];
    let remote = &lab.remote.pods[0];
    let mut servers = Vec::new();
    for (pod, v4, v6) in [
        (local, pod_ip(2), pod_ip6(2)),
        (remote, remote_pod_ip(1), remote_pod_ip6(1)),
    ] {
        for ip in [IpAddr::V4(v4), IpAddr::V6(v6)] {
            servers.push(SctpServer::start(&pod.ns, &pod.name, ip, TARGET).expect("SCTP server"));
        }
    }
    (lab, servers)
}

#[test]
fn external_sctp_associations_reach_local_and_remote_backends_in_both_families() {
    if !require_root() {
        return;
    }
    let (lab, servers) = sctp_lab("nss");
    let local = &lab.topo.backends[0];
    let remote = &lab.remote.pods[0];
    let (local_name, remote_name) = (local.name.clone(), remote.name.clone());
    for (to, client, snat) in [
        (
            SocketAddr::new(NODE_IP.into(), NODE_PORT),
            IpAddr::V4(CLIENT_IP),
            IpAddr::V4(NODE1_UNDERLAY),
        ),
        (
            SocketAddr::new(NODE6.into(), NODE_PORT),
            IpAddr::V6(CLIENT6),
            IpAddr::V6(NODE1_UNDERLAY6),
        ),
    ] {
        let answers = lab.outside(move || {
            (0..24)
                .map(|_| sctp_request(to, TIMEOUT))
                .collect::<Result<Vec<_>, _>>()
        });
        let answers = answers.unwrap_or_else(|e| panic!("{to}: {e}\n{}", lab.agent.log_text()));
        let mut reached = BTreeMap::new();
        for a in &answers {
            *reached.entry(a.backend.clone()).or_insert(0) += 1;
            let want = if a.backend == local_name {
                client
            } else if a.backend == remote_name {
                snat
            } else {
                panic!("{to}: answered by {}", a.backend)
            };
            assert_eq!(
                seen_ip(a),
                want,
                "{to}: {} saw {}",
                a.backend,
                a.seen_client
            );
        }
        assert_eq!(
            reached.len(),
            2,
            "{to}: 24 associations reached only {reached:?}"
        );
    }
    assert_no_bad_sctp_checksums(&servers);
}

/// The node's own associations (a host-network process on node1) to the SCTP ClusterIP,
/// both families. No socket hook runs for SCTP: node1's route to the service range leaves
/// by the underlay toward node2 (as a node's default route to its gateway), where tc egress
/// DNATs them and redirects them to a backend, on node1 or node2; tc ingress gives the
/// replies the frontend back. Node2 runs no agent and has no route for the service range:
/// a packet left untranslated is lost there.
#[test]
fn the_nodes_own_sctp_associations_reach_local_and_remote_backends_in_both_families() {
    if !require_root() {
        return;
    }
    let (lab, servers) = sctp_lab("nso");
    let node = &lab.topo.node;
    node.ip(&[
        "route",
        "add",
        "10.96.0.0/16",
        "via",
        &NODE2_UNDERLAY.to_string(),
    ])
    .expect("IPv4 route to the service range");
    node.ip(&[
        "-6",
        "route",
        "add",
        "fd00:10:96::/64",
        "via",
        &NODE2_UNDERLAY6.to_string(),
    ])
    .expect("IPv6 route to the service range");
    let names = [
        lab.topo.backends[0].name.clone(),
        lab.remote.pods[0].name.clone(),
    ];
    for (to, source) in [
        (
            SocketAddr::new("10.96.0.38".parse().expect("ip"), 38412),
            IpAddr::V4(NODE1_UNDERLAY),
        ),
        (
            SocketAddr::new("fd00:10:96::38".parse().expect("ip"), 38412),
            IpAddr::V6(NODE1_UNDERLAY6),
        ),
    ] {
        let answers = node
            .run(move || {
                (0..16)
                    .map(|_| sctp_request(to, TIMEOUT))
                    .collect::<Result<Vec<_>, _>>()
            })
            .expect("node thread");
        let answers = answers.unwrap_or_else(|e| panic!("{to}: {e}\n{}", lab.agent.log_text()));
        let mut reached = BTreeMap::new();
        for a in &answers {
            assert!(
                names.contains(&a.backend),
                "{to}: answered by {}",
                a.backend
            );
            *reached.entry(a.backend.clone()).or_insert(0) += 1;
            assert_eq!(
                seen_ip(a),
                source,
                "{to}: {} saw {}, not the node's address toward its route",
                a.backend,
                a.seen_client
            );
        }
        assert_eq!(
            reached.len(),
            2,
            "{to}: 16 associations reached only {reached:?}"
        );
    }
    assert_no_bad_sctp_checksums(&servers);
}
