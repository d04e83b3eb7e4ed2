//! SCTP associations through the attached datapath: the client pod runs whole associations
//! (handshake, DATA each way, shutdown) to an SCTP ClusterIP whose `targetPort` differs
//! from its `port`, so every packet's CRC32c is rewritten; each peer checks every packet it
//! takes against an independent CRC32c. The peers speak SCTP over raw IP sockets
//! (`xlb_lab::sctp`): this kernel has no SCTP sockets.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr},
    time::Duration,
};

use xlb_lab::sctp::{SctpClient, SctpServer, sctp_refused, sctp_request};
use xlb_tests::{
    checksums::assert_no_bad_sctp_checksums,
    scenario::{Scenario, sock},
    services::service_yaml,
    suites::traffic::{WEB, backends, yaml},
};

/// The SCTP Service: port 38412 (NGAP's) to the backends' 9000.
const SIG: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 38);
const PORT: u16 = 38412;
const TARGET: u16 = 9000;
/// An SCTP Service without endpoints.
const NONE: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 39);
const TIMEOUT: Duration = Duration::from_secs(2);

/// A scenario with `n` backends serving SCTP on `TARGET`, the web Service beside the SCTP
/// ones (`affinity`: the SCTP Service's `sessionAffinity: ClientIP`).
fn sctp_scenario(prefix: &str, n: u8, affinity: bool) -> Option<(Scenario, Vec<SctpServer>)> {
    let all = backends(n);
    let mut sig = service_yaml("sig", SIG, PORT, "SCTP", TARGET, &all);
    if affinity {
        sig = sig.replacen(
            &format!("clusterIP: {SIG}\n"),
            &format!("clusterIP: {SIG}\n  sessionAffinity: ClientIP\n"),
            1,
        );
    }
    let none = service_yaml("none", NONE, PORT, "SCTP", TARGET, &[]);
    let text = yaml(&all, &all) + &sig + &none;
    let s = Scenario::started(prefix, &text, n.into(), &format!("{WEB}:80/TCP"))?;
    let mut s = s;
    s.wait_backends(
        &format!("{SIG}:{PORT}/SCTP"),
        n.into(),
        Duration::from_secs(30),
    )
    .expect("SCTP frontend programmed");
    let servers = s
        .topo
        .backends
        .iter()
        .map(|pod| {
            SctpServer::start(&pod.ns, &pod.name, IpAddr::V4(pod.ip), TARGET).expect("SCTP server")
        })
        .collect();
    Some((s, servers))
}

#[test]
fn sctp_associations_to_a_cluster_ip_reach_every_backend_with_the_client_address_and_right_checksums()
 {
    let Some((s, servers)) = sctp_scenario("xsa", 3, false) else {
        return;
    };
    let client = s.topo.client.ip;
    let answers = s
        .topo
        .client
        .ns
        .run(|| {
            (0..30)
                .map(|_| sctp_request(sock(SIG, PORT), TIMEOUT))
                .collect::<Result<Vec<_>, _>>()
        })
        .expect("client thread")
        .expect("every association completes");
    let seen: BTreeSet<_> = answers.iter().map(|a| a.backend.clone()).collect();
    assert!(seen.len() >= 2, "30 associations all went to {seen:?}");
    for a in &answers {
        assert!(
            a.seen_client.starts_with(&format!("{client}:")),
            "a pod's association is not source-NATed, yet {} saw {}",
            a.backend,
            a.seen_client
        );
    }
    assert_no_bad_sctp_checksums(&servers);
}

#[test]
fn an_sctp_service_without_endpoints_refuses_with_icmp_port_unreachable() {
    let Some((s, _servers)) = sctp_scenario("xsn", 1, false) else {
        return;
    };
    s.topo
        .client
        .ns
        .run(|| sctp_refused(sock(NONE, PORT), TIMEOUT))
        .expect("client thread")
        .expect("refused as kube-proxy's REJECT refuses");
}

#[test]
fn sctp_client_ip_affinity_keeps_a_client_on_one_backend() {
    let Some((s, servers)) = sctp_scenario("xsf", 3, true) else {
        return;
    };
    let answers = s
        .topo
        .client
        .ns
        .run(|| {
            (0..12)
                .map(|_| sctp_request(sock(SIG, PORT), TIMEOUT))
                .collect::<Result<Vec<_>, _>>()
        })
        .expect("client thread")
        .expect("every association completes");
    let seen: BTreeSet<_> = answers.iter().map(|a| a.backend.clone()).collect();
    assert_eq!(
        seen.len(),
        1,
        "ClientIP affinity, yet 12 associations went to {seen:?}"
    );
    assert_no_bad_sctp_checksums(&servers);
}

#[test]
fn an_sctp_association_lives_across_an_agent_restart() {
    let Some((mut s, servers)) = sctp_scenario("xsr", 3, false) else {
        return;
    };
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (back_tx, back_rx) = std::sync::mpsc::channel::<String>();
    // One association, held open on the client's thread across the restart.
    let client = s
        .topo
        .client
        .ns
        .spawn(move || -> Result<(String, String), String> {
            let mut c = SctpClient::connect(sock(SIG, PORT), TIMEOUT)?;
            let first = c.request()?.backend;
            back_tx.send(first.clone()).map_err(|e| e.to_string())?;
            rx.recv().map_err(|e| e.to_string())?;
            let second = c.request()?.backend;
            c.close()?;
            Ok((first, second))
        });
    back_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("first request");
    // `xlb list conntrack` shows the open association as an SCTP flow to the frontend.
    let flows =
        lb_userspace::list::conntrack(&xlb_tests::pins(&s.agent.pins)).expect("list conntrack");
    let frontend = format!("{SIG}:{PORT}");
    assert!(
        flows
            .iter()
            .any(|f| f.protocol.eq_ignore_ascii_case("sctp") && f.frontend == frontend),
        "no SCTP flow to {frontend} in {}",
        lb_userspace::list::render(&flows)
    );
    let log = s.workdir.join("agent2.log");
    s.agent.restart(log).expect("restart");
    s.wait_backends(&format!("{SIG}:{PORT}/SCTP"), 3, Duration::from_secs(30))
        .expect("restarted agent");
    tx.send(()).expect("client waiting");
    let (first, second) = client
        .join()
        .expect("client thread")
        .expect("namespace")
        .expect("the association's DATA and shutdown after the restart");
    assert_eq!(
        first, second,
        "the association moved backends across the restart"
    );
    assert_no_bad_sctp_checksums(&servers);
}

/// The node's own associations (a host-network process) to an SCTP ClusterIP: no socket
/// hook runs for SCTP, so tc egress on the interface the ClusterIP's route leaves by (here
/// the node's gateway, as a node's default route) DNATs them and redirects them to a
/// backend, and tc ingress gives the replies the frontend back. The gateway namespace does
/// not forward: a packet left untranslated is lost there. A Service without endpoints is
/// refused into the node's own stack.
#[test]
fn the_nodes_own_sctp_associations_to_a_cluster_ip_reach_the_backends() {
    let Some((s, servers)) = sctp_scenario("xso", 3, false) else {
        return;
    };
    let gw = s.topo.add_external_client("xv-gw").expect("gateway");
    s.topo
        .node
        .ip(&["route", "add", "10.96.0.0/16", "via", &gw.ip.to_string()])
        .expect("the node's route to the service range");
    let answers = s
        .topo
        .node
        .run(|| {
            // The agent attaches xv-* interfaces as they appear: the first association
            // waits for that.
            let deadline = std::time::Instant::now() + Duration::from_secs(15);
            let first = loop {
                match sctp_request(sock(SIG, PORT), TIMEOUT) {
                    Ok(a) => break a,
                    Err(e) if std::time::Instant::now() > deadline => return Err(e),
                    Err(_) => {}
                }
            };
            let mut all = vec![first];
            for _ in 0..12 {
                all.push(sctp_request(sock(SIG, PORT), TIMEOUT)?);
            }
            Ok(all)
        })
        .expect("node thread")
        .expect("every association of the node completes");
    let seen: BTreeSet<_> = answers.iter().map(|a| a.backend.clone()).collect();
    assert!(seen.len() >= 2, "13 associations all went to {seen:?}");
    for a in &answers {
        assert!(
            a.seen_client.starts_with("192.0.2.1:"),
            "the node's association should come from its address toward the gateway, yet {} saw {}",
            a.backend,
            a.seen_client
        );
    }
    assert_no_bad_sctp_checksums(&servers);
    s.topo
        .node
        .run(|| sctp_refused(sock(NONE, PORT), TIMEOUT))
        .expect("node thread")
        .expect("the node's INIT to a Service without endpoints is refused");
}
