//! `xlb trace` over IPv4 (IPv6: `v6.rs`): its verdicts are the datapath's real ones (the same packets sent for real
//! from the lab's client pod), it leaves the live flow and affinity maps byte-identical, and
//! each kube-proxy mode's rule trace agrees with what `xlb compare` saw that mode do with real
//! traffic on the conformance inputs. The steps both families take (ClientIP affinity, the
//! node's connect hook, a Maglev entry) are one body each here, which both scenarios run.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    time::Duration,
};

use lb_userspace::emit::Mode;
use xlb_lab::compare::{CompareOptions, Flow, Impl, Origin, Outcome, compare};
use xlb_lab::sctp::{SctpServer, sctp_request};
use xlb_tests::{
    client,
    scenario::{Scenario, TCP_PORT, UDP_PORT},
    topology::pod_ip,
};

use xlb_tests::trace_support as support;

mod v6;

use support::{flow_maps, open_request, outcome, trace};

const WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const STICKY: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 11);
const EMPTY: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 12);
const SIG: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 13);
const EXT_CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 14);
/// `ext`'s externalIP: a Maglev frontend (the Service's annotation).
const EXT: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 7);
/// The agent's node name in the trace test (`ext`'s endpoints are on it: an external
/// frontend's flows to them are not SNATed).
const NODE: &str = "node1";

/// A Service with one port `p` and its slice of ready endpoints (namespace `test`).
fn service(
    name: &str,
    ip: Ipv4Addr,
    proto: &str,
    port: u16,
    target: u16,
    extra: &str,
    eps: &[Ipv4Addr],
) -> String {
    let mut y = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: test, name: {name}}}\nspec:\n  clusterIP: {ip}\n{extra}  ports:\n  - {{name: p, port: {port}, protocol: {proto}, targetPort: {target}}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: test\n  name: {name}-1\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports:\n- {{name: p, port: {target}, protocol: {proto}}}\nendpoints:"
    );
    y.push_str(if eps.is_empty() { " []\n" } else { "\n" });
    for ip in eps {
        y.push_str(&format!(
            "- addresses: [\"{ip}\"]\n  conditions: {{ready: true}}\n"
        ));
    }
    y
}

/// web (TCP, 2 backends), dns (UDP on web's ClusterIP), sticky (ClientIP affinity), empty
/// (no endpoints), and the client pod as a `kind: Pod` document.
fn services() -> String {
    let eps = [pod_ip(2), pod_ip(3)];
    service("web", WEB, "TCP", 80, TCP_PORT, "", &eps)
        + &service("dns", WEB, "UDP", 53, UDP_PORT, "", &eps)
        + &service(
            "sticky",
            STICKY,
            "TCP",
            80,
            TCP_PORT,
            "  sessionAffinity: ClientIP\n",
            &eps,
        )
        + &service("empty", EMPTY, "TCP", 80, TCP_PORT, "", &[])
        + &service("sig", SIG, "SCTP", 38412, 9000, "", &eps)
        + &format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{namespace: test, name: client}}\nstatus: {{podIP: {}}}\n",
            pod_ip(1)
        )
}

/// ext: web's backends (on [`NODE`]) behind a ClusterIP and the externalIP [`EXT`],
/// annotated `service.cilium.io/lb-algorithm: maglev` (its externalIP picks by a Maglev
/// table, its ClusterIP at random).
fn maglev_service() -> String {
    service(
        "ext",
        EXT_CLUSTER_IP,
        "TCP",
        80,
        TCP_PORT,
        &format!("  externalIPs: [\"{EXT}\"]\n"),
        &[pod_ip(2), pod_ip(3)],
    )
    .replacen(
        "name: ext}",
        "name: ext, annotations: {service.cilium.io/lb-algorithm: maglev}}",
        1,
    )
    .replace(
        "  conditions: {ready: true}",
        &format!("  nodeName: {NODE}\n  conditions: {{ready: true}}"),
    )
}

/// The backend pod (`backend-k`) at an address of either family.
fn backend_name(s: &Scenario, ip: IpAddr) -> String {
    s.topo
        .backends
        .iter()
        .find(|p| IpAddr::V4(p.ip) == ip || p.ip6.map(IpAddr::V6) == Some(ip))
        .map(|p| p.name.clone())
        .unwrap_or_else(|| format!("no backend at {ip}"))
}

#[test]
fn trace_verdicts_match_real_packets_and_leave_flow_maps_unchanged() {
    if !xlb_tests::require_root() {
        return;
    }
    let mut s = Scenario::start_with(
        "xtr",
        2,
        &(services() + &maglev_service()),
        &["--hostname-override", NODE],
    )
    .expect("scenario");
    for frontend in ["10.96.0.10:80/TCP", &format!("{EXT}:80/TCP")] {
        s.wait_backends(frontend, 2, Duration::from_secs(30))
            .expect("initial sync");
    }
    let timeout = Duration::from_secs(3);
    let client_ns = &s.topo.client.ns;

    // A real flow first, kept open through the test (the conntrack collector deletes
    // closed flows), so the maps the traces must leave alone are not empty, and the sticky
    // service's affinity entry exists.
    let sticky = SocketAddr::from((STICKY, 80));
    let (first, mut open) = client_ns
        .run(move || open_request(sticky, timeout))
        .expect("netns")
        .expect("sticky answers");
    let before = flow_maps(&s.agent.pins);
    assert!(
        !before.0.is_empty() && !before.1.is_empty(),
        "a real flow left entries"
    );

    // ClusterIP from the pod (by name): forwarded to a backend, the one a real packet may
    // reach.
    let web = trace(&s, &["--from", "pod/test/client", "--to", "svc/test/web"]);
    println!("{web}");
    assert!(web.contains("ClusterIP of service test/web"), "{web}");
    assert!(web.contains("DNAT 10.96.0.10:80 -> "), "{web}");
    assert!(web.contains("new_flow +1"), "{web}");
    assert!(
        web.contains("algorithm  random: a new flow picks uniformly among 2 slot(s)"),
        "{web}"
    );
    let chosen: std::net::SocketAddrV4 = outcome(&web).parse().expect("a backend");
    assert!(
        s.backend_ips().contains(chosen.ip()) && chosen.port() == TCP_PORT,
        "{web}"
    );
    let to = SocketAddr::from((WEB, 80));
    let real = client_ns
        .run(move || client::tcp_request(to, timeout))
        .expect("netns")
        .expect("web answers");
    assert!(real.backend.starts_with("backend-"), "{real:?}");

    // UDP to the same ClusterIP: the service port's protocol.
    let dns = trace(
        &s,
        &["--from", &pod_ip(1).to_string(), "--to", "svc/test/dns"],
    );
    let chosen: std::net::SocketAddrV4 = outcome(&dns).parse().expect("a backend");
    assert_eq!(chosen.port(), UDP_PORT, "{dns}");
    let to = SocketAddr::from((WEB, 53));
    client_ns
        .run(move || client::udp_request(to, timeout))
        .expect("netns")
        .expect("dns answers");

    // SCTP: the trace sends an INIT; a real association goes through.
    let sig = trace(&s, &["--from", "pod/test/client", "--to", "svc/test/sig"]);
    assert!(sig.contains("SCTP INIT"), "{sig}");
    let chosen: std::net::SocketAddrV4 = outcome(&sig).parse().expect("a backend");
    assert!(
        s.backend_ips().contains(chosen.ip()) && chosen.port() == 9000,
        "{sig}"
    );
    let _servers: Vec<SctpServer> = s
        .topo
        .backends
        .iter()
        .map(|p| SctpServer::start(&p.ns, &p.name, p.ip.into(), 9000).expect("SCTP server"))
        .collect();
    let to = SocketAddr::from((SIG, 38412));
    client_ns
        .run(move || sctp_request(to, timeout))
        .expect("netns")
        .expect("sig answers");

    // The kept flow asked again between the steps, so the echo server's 30 s idle timeout
    // never closes it in the middle of a trace, however slow the machine.
    let mut keep = move || {
        xlb_tests::client::ask_tcp(&mut open).expect("the kept flow answers");
    };
    keep();
    affinity_follows_the_real_flow(&s, &first.backend, "svc/test/sticky", sticky);
    keep();
    no_endpoints_and_no_frontend(&s);
    keep();
    let backends = [pod_ip(2), pod_ip(3)].map(|ip| format!("{ip}:{TCP_PORT}"));
    from_the_node(&s, "connect4", &backends, "svc/test/empty");
    // The kept flow closes now, settled before the next trace.
    drop(keep);
    let ext = SocketAddr::from((EXT, 80));
    let reached = maglev_names_the_entry(
        &s,
        pod_ip(1).into(),
        ext,
        "test/ext",
        " (on this node)",
        true,
    );
    println!("6 flows reached {reached:?}");
    list_shows_each_frontends_algorithm(&s);
}

/// A TCP request from the client pod's `from` (a source port of the test's choice) to `to`:
/// the backend that answered.
fn tcp_request_from(from: SocketAddr, to: SocketAddr, timeout: Duration) -> Result<String, String> {
    use std::io::{BufRead, BufReader, Write};
    let e = |e: std::io::Error| format!("{from} -> {to}: {e}");
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(from),
        socket2::Type::STREAM,
        None,
    )
    .map_err(e)?;
    sock.set_reuse_address(true).map_err(e)?;
    sock.bind(&from.into()).map_err(e)?;
    sock.connect_timeout(&to.into(), timeout).map_err(e)?;
    let mut c: std::net::TcpStream = sock.into();
    c.set_read_timeout(Some(timeout)).map_err(e)?;
    c.write_all(b"hello\n").map_err(e)?;
    let mut line = String::new();
    BufReader::new(&c).read_line(&mut line).map_err(e)?;
    Ok(line
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

/// A Maglev frontend `ext` (Service `svc`) from the client pod's address `client`, in
/// either family: for six source ports the trace names the table entry the packet's 5-tuple
/// hashes to (`lb_common::flow_hash` over the addresses' words, as the program computes it)
/// and the slot and backend it holds (`locality` after the backend, as the trace prints it),
/// and the test run goes there; with `real`, a real
/// connection from the same source port reaches that backend. The backends that answered
/// (`real`) or the slots the flows went to.
fn maglev_names_the_entry(
    s: &Scenario,
    client: IpAddr,
    ext: SocketAddr,
    svc: &str,
    locality: &str,
    real: bool,
) -> std::collections::BTreeSet<String> {
    const M: u32 = 16381;
    let timeout = Duration::from_secs(3);
    let words = |ip: IpAddr| match ip {
        IpAddr::V4(a) => [u32::from_ne_bytes(a.octets()), 0, 0, 0],
        IpAddr::V6(a) => {
            let o = a.octets();
            std::array::from_fn(|i| {
                u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
            })
        }
    };
    let mut reached = std::collections::BTreeSet::new();
    for port in [41001u16, 41002, 41003, 41004, 41005, 41006] {
        let from = SocketAddr::new(client, port);
        let text = trace(s, &["--from", &from.to_string(), "--to", &ext.to_string()]);
        println!("{text}");
        assert!(
            text.contains(&format!("is the externalIP of service {svc}")),
            "{text}"
        );
        let hash = lb_common::flow_hash(
            &words(client),
            &words(ext.ip()),
            port.to_be(),
            ext.port().to_be(),
            lb_common::IPPROTO_TCP,
        );
        // The slot and the backend in it.
        let (slot, backend) = xlb_tests::trace_support::maglev_choice(&text, hash, M);
        let (slot, backend) = (slot.as_str(), backend.as_str());
        assert!(
            text.contains(&format!("slot {slot}: {backend}/TCP{locality}")),
            "the endpoints step puts {backend} in slot {slot}:\n{text}"
        );
        assert_eq!(outcome(&text), backend, "the test run went there:\n{text}");
        assert!(
            text.lines()
                .any(|l| l.contains(&format!("{backend}/TCP{locality}"))
                    && l.contains("chosen by the frontend's Maglev table")),
            "{text}"
        );
        let to: SocketAddr = backend.parse().expect("a backend");
        let name = backend_name(s, to.ip());
        assert!(
            name.starts_with("backend-") && to.port() == TCP_PORT,
            "{backend}: {text}"
        );
        if !real {
            reached.insert(slot.to_string());
            continue;
        }
        let answered = s
            .topo
            .client
            .ns
            .run(move || tcp_request_from(from, ext, timeout))
            .expect("netns")
            .unwrap_or_else(|e| panic!("{ext} answers: {e}"));
        assert_eq!(answered, name, "{from}: {text}");
        reached.insert(answered);
    }
    reached
}

/// `xlb list services`: the Maglev frontend's table (`maglev M=…`), the ClusterIPs random.
fn list_shows_each_frontends_algorithm(s: &Scenario) {
    let out = s
        .topo
        .node
        .command(xlb_tests::xlb_bin())
        .args(["list", "services", "--bpffs"])
        .arg(&s.agent.pins)
        .output()
        .expect("run xlb list");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    let row = |frontend: &str| {
        text.lines()
            .find(|l| l.contains(frontend))
            .unwrap_or_else(|| panic!("no row for {frontend}:\n{text}"))
            .to_string()
    };
    assert!(
        text.lines().next().is_some_and(|h| h.contains("ALGORITHM")),
        "{text}"
    );
    assert!(
        row(&format!(" {EXT}:80/TCP")).contains("maglev M=16381 table="),
        "{text}"
    );
    for clusterip in [EXT_CLUSTER_IP, WEB] {
        let r = row(&format!(" {clusterip}:80/TCP"));
        assert!(r.contains(" random "), "{r}\n{text}");
        assert!(!r.contains("maglev"), "{r}\n{text}");
    }
}

/// ClientIP affinity in either family: the trace of the client pod to `svc` finds the real
/// flow's entry (whose backend was `first`) and goes where the real packet to `sticky` goes.
fn affinity_follows_the_real_flow(s: &Scenario, first: &str, svc: &str, sticky: SocketAddr) {
    let st = trace(s, &["--from", "pod/test/client", "--to", svc]);
    println!("{st}");
    assert!(st.contains("ClientIP (10800 s): hit"), "{st}");
    let chosen: SocketAddr = outcome(&st).parse().expect("a backend");
    assert_eq!(backend_name(s, chosen.ip()), first, "{st}");
    let again = s
        .topo
        .client
        .ns
        .run(move || client::tcp_request(sticky, Duration::from_secs(3)))
        .expect("netns")
        .expect("sticky answers");
    assert_eq!(again.backend, first);
}

/// No endpoints: refused, as a real connect is; not a frontend: passed untouched.
fn no_endpoints_and_no_frontend(s: &Scenario) {
    let timeout = Duration::from_secs(3);
    let client_ns = &s.topo.client.ns;
    let empty = trace(
        s,
        &["--from", "pod/test/client", "--to", &format!("{EMPTY}:80")],
    );
    println!("{empty}");
    assert_eq!(outcome(&empty), "refused", "{empty}");
    assert!(empty.contains("reject +1"), "{empty}");
    let to = SocketAddr::from((EMPTY, 80));
    let e = client_ns
        .run(move || client::tcp_request(to, timeout))
        .expect("netns")
        .expect_err("refused");
    assert!(e.contains("refused"), "{e}");

    let none = trace(s, &["--from", "pod/test/client", "--to", "10.96.0.99:80"]);
    assert_eq!(outcome(&none), "passed", "{none}");
}

/// From the node, in either family: the connect4 or connect6 (`hook`) decision, computed
/// from the maps and said so: one of `backends`; `empty` (a frontend without endpoints)
/// refused.
fn from_the_node(s: &Scenario, hook: &str, backends: &[String], empty: &str) {
    let node = trace(s, &["--from", "node", "--to", "svc/test/web"]);
    assert!(node.contains("cannot test-run cgroup sock_addr"), "{node}");
    assert!(
        node.contains(&format!("{hook} hook (xlb_{hook})")),
        "{node}"
    );
    assert_eq!(
        outcome(&node),
        format!("one of {}", backends.join(", ")),
        "{node}"
    );
    let node_empty = trace(s, &["--from", "node", "--to", empty]);
    assert_eq!(outcome(&node_empty), "refused", "{node_empty}");
}

/// `xlb trace --mode MODE` of one of `xlb compare`'s flows on `source` (no datapath: the rule
/// modes need only the file).
fn trace_flow(source: &Path, mode: &str, flow: &Flow, client: &str) -> String {
    let from = match flow.origin {
        Origin::Pod => client,
        Origin::Node => "node",
    };
    let out = std::process::Command::new(xlb_tests::xlb_bin())
        .args(["trace", "--mode", mode, "--from", from, "--to"])
        .arg(flow.frontend.to_string())
        .args(["--proto", flow.protocol.lower(), "--source"])
        .arg(format!("file:{}", source.display()))
        .output()
        .expect("run xlb trace");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "xlb trace --mode {mode} {flow:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The backends a trace outcome names (`A`, or `one of A, B`); empty for a verdict.
fn traced_backends(outcome: &str) -> std::collections::BTreeSet<String> {
    let list = outcome.strip_prefix("one of ").unwrap_or(outcome);
    list.split(", ")
        .filter(|b| b.parse::<SocketAddr>().is_ok())
        .map(String::from)
        .collect()
}

/// A trace outcome and what a mode did with real traffic agree: the same backends (for an
/// affinity flow, the one it stuck to is among those traced), or the same refusal or drop.
fn agrees(flow: &Flow, traced: &str, real: &Outcome) -> bool {
    match real {
        Outcome::Backends(b) => {
            let t = traced_backends(traced);
            if flow.eligible.is_some() {
                b.len() == 1 && b.is_subset(&t)
            } else {
                *b == t
            }
        }
        Outcome::Refused => traced == "refused",
        Outcome::Dropped => traced == "dropped",
        Outcome::Failed(_) => false,
    }
}

/// Where the rule trace and the real mode are known to part (see tests/tests/compare.rs):
/// the node's own datagram to a ClusterIP without endpoints is REJECTed in the output path,
/// which fails the sender's send() with EPERM instead of an ICMP answer; the userspace proxy
/// takes a connection to a service without endpoints and closes it; IPVS (compared with
/// what iptables really did) has one virtual server per NodePort for every origin, so under
/// externalTrafficPolicy Local without a local endpoint it refuses a pod that iptables
/// short-circuits to the cluster's endpoints.
fn known_difference(mode: &str, flow: &Flow, traced: &str, real: &Outcome) -> bool {
    match (mode, real) {
        ("ipvs", Outcome::Backends(_)) => {
            flow.kind == xlb_lab::compare::Frontend::NodePort && traced == "refused"
        }
        ("iptables" | "nftables", Outcome::Failed(e)) => {
            flow.origin == Origin::Node
                && traced == "refused"
                && e.contains("Operation not permitted")
        }
        ("userspace", _) => {
            traced == "closed by the proxy" && !matches!(real, Outcome::Backends(_))
        }
        _ => false,
    }
}

fn modes_agree_with_compare(case: &str) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
        "../../shared/conformance/kube-proxy/cases/{case}.input.yaml"
    ));
    let opts = CompareOptions {
        source: source.clone(),
        node_name: "node1".into(),
        requests: 40,
        modes: vec![
            Impl::KubeProxy(Mode::Iptables),
            Impl::KubeProxy(Mode::Nftables),
            Impl::KubeProxy(Mode::Userspace),
        ],
        xlb: xlb_tests::xlb_bin(),
        tag: xlb_tests::unique_tag("xtq"),
    };
    let report = compare(&opts).unwrap_or_else(|e| panic!("{case}: {e}"));
    assert!(!report.flows.is_empty(), "{case}: no flows");
    // The lab's client pod: the first 10.255.255.x that is no endpoint (as compare picks it).
    let client = "10.255.255.1";
    let mut checked = 0;
    for (flow, by) in &report.flows {
        // IPVS has no lab in compare: its trace must agree with what iptables really did.
        for (mode, real) in [
            ("iptables", &by[&Impl::KubeProxy(Mode::Iptables)]),
            ("nftables", &by[&Impl::KubeProxy(Mode::Nftables)]),
            ("userspace", &by[&Impl::KubeProxy(Mode::Userspace)]),
            ("ipvs", &by[&Impl::KubeProxy(Mode::Iptables)]),
        ] {
            let text = trace_flow(&source, mode, flow, client);
            let traced = outcome(&text);
            assert!(
                agrees(flow, &traced, real) || known_difference(mode, flow, &traced, real),
                "{case}: {flow:?}: {mode} traced {traced:?}, really {real:?}\n{text}\n{}",
                report.render()
            );
            checked += 1;
        }
    }
    assert!(checked >= 4, "{case}: {checked} traces");
}

#[test]
fn rule_traces_agree_with_compare_on_kube_proxys_overall_case() {
    if !xlb_tests::require_root() {
        return;
    }
    modes_agree_with_compare("iptables-01-overall");
}

#[test]
fn rule_traces_agree_with_compare_on_a_service_without_endpoints() {
    if !xlb_tests::require_root() {
        return;
    }
    modes_agree_with_compare("iptables-30-flows-no-endpoints-reject");
}

#[test]
fn bpf_log_debug_puts_the_programs_decisions_in_the_agent_log() {
    if !xlb_tests::require_root() {
        return;
    }
    let mut s =
        Scenario::start_with("xtl", 2, &services(), &["--bpf-log", "debug"]).expect("scenario");
    s.wait_backends("10.96.0.10:80/TCP", 2, Duration::from_secs(30))
        .expect("initial sync");
    let to = SocketAddr::from((WEB, 80));
    let real = s
        .topo
        .client
        .ns
        .run(move || client::tcp_request(to, Duration::from_secs(3)))
        .expect("netns")
        .expect("web answers");
    let backend = s
        .topo
        .backends
        .iter()
        .find(|p| p.name == real.backend)
        .map(|p| p.ip)
        .expect("the backend that answered");
    // The SYN's decision, as it left the program: DNATed to the backend that answered.
    let want = format!("tc reason=new_flow action=ok proto=6 {}:", pod_ip(1));
    s.agent
        .wait_log(&want, 1, Duration::from_secs(5))
        .expect("the SYN's decision is logged");
    let log = s.agent.log_text();
    let line = log
        .lines()
        .find(|l| l.contains(&want))
        .expect("a new_flow line");
    assert!(line.contains("xlb::bpf"), "{line}");
    assert!(line.contains(&format!("-> {backend}:{TCP_PORT}")), "{line}");
    // Later packets' lines reach the log a moment after the SYN's (the reader drains the
    // programs' ring in batches).
    s.agent
        .wait_log("reason=established", 1, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("later packets too: {e}\n{}", s.agent.log_text()));
}

#[test]
fn bpf_log_is_off_by_default() {
    let Some(s) = Scenario::started("xto", &services(), 2, "10.96.0.10:80/TCP") else {
        return;
    };
    let to = SocketAddr::from((WEB, 80));
    s.topo
        .client
        .ns
        .run(move || client::tcp_request(to, Duration::from_secs(3)))
        .expect("netns")
        .expect("web answers");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !s.agent.log_text().contains("xlb::bpf"),
        "{}",
        s.agent.log_text()
    );
}
