//! `xlb trace` over IPv6, against a dual-stack Service (IPv6 first) on the lab's dual-stack
//! pods: its verdicts are those of real IPv6 packets from the client pod (through tc: the
//! test's sockets are outside the agent's cgroup), it leaves the live flow maps (the IPv6
//! conntrack tables included) byte-identical, `--ip-family` picks the Service's other
//! family, a Service without endpoints is refused, and each kube-proxy mode's IPv6 rules
//! agree with the datapath's trace.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use xlb_tests::{
    client,
    echo::EchoServer,
    require_root,
    scenario::Scenario,
    services::service6_yaml,
    topology::{pod_ip, pod_ip6},
};

use xlb_tests::trace_support as support;

use super::{affinity_follows_the_real_flow, backend_name, from_the_node, maglev_names_the_entry};
use support::{flow_maps6, open_request, outcome, trace, trace_command, trace_only};

const WEB6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x10);
const WEB4: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const STICKY6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x11);
const EMPTY6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x12);
const V4ONLY: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 13);
const EXT6_CLUSTER_IP: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x14);
/// `ext6`'s externalIP: a Maglev frontend (the Service's annotation).
const EXT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x7);
/// The echo servers' ports (the scenario's on IPv4, the test's own on IPv6).
const TCP: u16 = 8080;
const UDP: u16 = 5353;

/// web: dual-stack (IPv6 first), TCP 80 and UDP 53 on both backends of each family; sticky6
/// (ClientIP affinity) and empty6/emptyu6 (no endpoints), IPv6 only; v4only; the client pod with
/// both its addresses.
fn services() -> String {
    let (b4, b6): (Vec<Ipv4Addr>, Vec<Ipv6Addr>) =
        ((2..4).map(pod_ip).collect(), (2..4).map(pod_ip6).collect());
    let mut y = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: test, name: web}}\nspec:\n  ipFamilyPolicy: PreferDualStack\n  ipFamilies: [IPv6, IPv4]\n  clusterIP: \"{WEB6}\"\n  clusterIPs: [\"{WEB6}\", \"{WEB4}\"]\n  ports:\n  - {{name: http, port: 80, protocol: TCP, targetPort: {TCP}}}\n  - {{name: dns, port: 53, protocol: UDP, targetPort: {UDP}}}\n"
    );
    let slices: [(&str, Vec<String>); 2] = [
        ("IPv6", b6.iter().map(Ipv6Addr::to_string).collect()),
        ("IPv4", b4.iter().map(Ipv4Addr::to_string).collect()),
    ];
    for (family, addrs) in slices {
        y.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: test\n  name: web-{family}\n  labels: {{kubernetes.io/service-name: web}}\naddressType: {family}\nports:\n- {{name: http, port: {TCP}, protocol: TCP}}\n- {{name: dns, port: {UDP}, protocol: UDP}}\nendpoints:\n"
        ));
        for a in addrs {
            y.push_str(&format!(
                "- addresses: [\"{a}\"]\n  conditions: {{ready: true}}\n"
            ));
        }
    }
    y + &service6_yaml("sticky6", STICKY6, 80, "TCP", TCP, &b6).replacen(
        "spec:\n",
        "spec:\n  sessionAffinity: ClientIP\n",
        1,
    ) + &service6_yaml("ext6", EXT6_CLUSTER_IP, 80, "TCP", TCP, &b6)
        .replacen(
            "spec:\n",
            &format!("spec:\n  externalIPs: [\"{EXT6}\"]\n"),
            1,
        )
        .replacen(
            "name: ext6}",
            "name: ext6, annotations: {service.cilium.io/lb-algorithm: maglev}}",
            1,
        )
        + &service6_yaml("empty6", EMPTY6, 80, "TCP", TCP, &[])
        + &service6_yaml("emptyu6", EMPTY6, 53, "UDP", UDP, &[])
        + &xlb_tests::services::service_yaml("v4only", V4ONLY, 80, "TCP", TCP, &b4)
        + &format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{namespace: test, name: client}}\nstatus:\n  podIP: {}\n  podIPs: [{{ip: {}}}, {{ip: \"{}\"}}]\n",
            pod_ip(1),
            pod_ip(1),
            pod_ip6(1)
        )
}

/// The scenario on dual-stack pods with IPv6 echo servers (running until dropped), every
/// IPv6 frontend programmed.
fn dual_stack() -> (Scenario, Vec<EchoServer>) {
    let mut s = Scenario::start_with("xtr6", 2, &services(), &[]).expect("scenario");
    s.topo.dual_stack().expect("dual-stack pods");
    let mut servers = Vec::new();
    for pod in &s.topo.backends {
        let ip6 = pod.ip6.expect("a dual-stack backend");
        let server = EchoServer::start_at(&pod.ns, &pod.name, ip6.into(), TCP, UDP);
        servers.push(server.expect("IPv6 echo server"));
    }
    for (frontend, n) in [
        (format!("{}/TCP", SocketAddr::from((WEB6, 80))), 2),
        (format!("{}/UDP", SocketAddr::from((WEB6, 53))), 2),
        (format!("{}/TCP", SocketAddr::from((STICKY6, 80))), 2),
        (format!("{}/TCP", SocketAddr::from((EXT6, 80))), 2),
        (format!("{}/TCP", SocketAddr::from((EMPTY6, 80))), 0),
        (format!("{}/UDP", SocketAddr::from((EMPTY6, 53))), 0),
        ("10.96.0.10:80/TCP".to_string(), 2),
    ] {
        s.wait_backends(&frontend, n, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{frontend} programmed: {e}\n{}", s.agent.log_text()));
    }
    (s, servers)
}

/// `[v6]:port` of each IPv6 backend.
fn backends6(port: u16) -> BTreeSet<String> {
    (2..4)
        .map(|k| SocketAddr::from((pod_ip6(k), port)).to_string())
        .collect()
}

#[test]
fn ipv6_traces_match_real_ipv6_packets_and_leave_flow_maps_unchanged() {
    if !require_root() {
        return;
    }
    let (s, _servers) = dual_stack();
    let timeout = Duration::from_secs(3);
    let client_ns = &s.topo.client.ns;

    // A real IPv6 flow kept open (the collector deletes closed ones): the IPv6 conntrack
    // tables and the sticky service's affinity entry the traces must leave alone.
    let sticky = SocketAddr::from((STICKY6, 80));
    let (first, mut open) = client_ns
        .run(move || open_request(sticky, timeout))
        .expect("netns")
        .expect("sticky6 answers");
    assert!(!flow_maps6(&s.agent.pins).is_empty(), "a real IPv6 flow");

    // The Service's primary family (IPv6), from the pod by name: its IPv6 address.
    let web = trace(&s, &["--from", "pod/test/client", "--to", "svc/test/web"]);
    println!("{web}");
    let web6 = SocketAddr::from((WEB6, 80));
    for want in [
        format!("IPv6 TCP SYN [{}]:40000 -> {web6}", pod_ip6(1)),
        "ClusterIP of service test/web".into(),
        format!("DNAT {web6} -> "),
        "would create IPv6 conntrack forward".into(),
        "new_flow +1".into(),
    ] {
        assert!(web.contains(&want), "{want:?} in\n{web}");
    }
    assert!(backends6(TCP).contains(&outcome(&web)), "{web}");
    let real = client_ns
        .run(move || client::tcp_request(web6, timeout))
        .expect("netns")
        .expect("web answers over IPv6");
    assert!(real.backend.starts_with("backend-"), "{real:?}");
    assert!(
        real.seen_client.contains(&pod_ip6(1).to_string()),
        "{real:?}"
    );

    // --ip-family ipv4: the same Service's IPv4 ClusterIP, the pod's IPv4 address.
    let web4 = trace(
        &s,
        &[
            "--from",
            "pod/test/client",
            "--to",
            "svc/test/web",
            "--ip-family",
            "ipv4",
        ],
    );
    let chosen: SocketAddr = outcome(&web4).parse().expect("a backend");
    assert!(
        chosen.is_ipv4()
            && s.backend_ips()
                .iter()
                .any(|b| IpAddr::V4(*b) == chosen.ip())
    );
    assert!(web4.contains(&format!("DNAT {WEB4}:80 -> ")), "{web4}");

    // UDP from an IPv6 address to the Service's named port.
    let from6 = format!("[{}]:41000", pod_ip6(1));
    let dns = trace(&s, &["--from", &from6, "--to", "svc/test/web:dns"]);
    assert!(backends6(UDP).contains(&outcome(&dns)), "{dns}");
    let dns6 = SocketAddr::from((WEB6, 53));
    client_ns
        .run(move || client::udp_request(dns6, timeout))
        .expect("netns")
        .expect("dns answers over IPv6");

    // The kept flow asked again between the steps, so the echo server's 30 s idle timeout
    // never closes it in the middle of a trace, however slow the machine.
    let mut keep = move || {
        xlb_tests::client::ask_tcp(&mut open).expect("the kept flow answers");
        open.local_addr().expect("the open flow's port").port()
    };
    keep();
    affinity_follows_the_real_flow(&s, &first.backend, "svc/test/sticky6", sticky);
    let port = keep();
    tracked_flow(&s, port, &first.backend);
    keep();
    refused_passed_and_errors(&s);
    keep();
    let backends: Vec<String> = backends6(TCP).into_iter().collect();
    from_the_node(&s, "connect6", &backends, "[fd00:10:96::12]:80");
    keep();
    rules_agree_with_the_datapath(&s);
    // The kept flow closes now, settled before the next trace.
    drop(keep);
    let ext = SocketAddr::from((EXT6, 80));
    let slots = maglev_names_the_entry(&s, pod_ip6(1).into(), ext, "test/ext6", "", false);
    println!("IPv6 Maglev flows went to slots {slots:?}");
}

/// The open real flow's own tuple: the trace meets its live IPv6 conntrack entry (copied
/// into the scratch tables) and follows it, no service lookup.
fn tracked_flow(s: &Scenario, port: u16, first: &str) {
    let from = SocketAddr::from((pod_ip6(1), port)).to_string();
    let to = SocketAddr::from((STICKY6, 80)).to_string();
    let t = trace(s, &["--from", &from, "--to", &to]);
    println!("{t}");
    assert!(
        t.contains("tracked flow: this tuple already goes to"),
        "{t}"
    );
    assert!(t.contains("established +1"), "{t}");
    let chosen: SocketAddr = outcome(&t).parse().expect("the flow's backend");
    assert_eq!(backend_name(s, chosen.ip()), first, "{t}");
}

/// No endpoints: refused (a TCP RST, an ICMPv6 port unreachable), as a real connect and a
/// real datagram are; not a frontend: passed; a
/// family the Service lacks: an error naming it.
fn refused_passed_and_errors(s: &Scenario) {
    let empty = SocketAddr::from((EMPTY6, 80));
    let t = trace(
        s,
        &["--from", "pod/test/client", "--to", &empty.to_string()],
    );
    println!("{t}");
    assert_eq!(outcome(&t), "refused", "{t}");
    assert!(t.contains("TCP RST") && t.contains("reject +1"), "{t}");
    let e = s
        .topo
        .client
        .ns
        .run(move || client::tcp_request(empty, Duration::from_secs(3)))
        .expect("netns")
        .expect_err("refused");
    assert!(e.contains("refused"), "{e}");
    let empty_udp = SocketAddr::from((EMPTY6, 53));
    let t = trace(
        s,
        &[
            "--from",
            "pod/test/client",
            "--to",
            &empty_udp.to_string(),
            "--proto",
            "udp",
        ],
    );
    assert_eq!(outcome(&t), "refused", "{t}");
    assert!(t.contains("ICMPv6 port unreachable"), "{t}");
    let e = s
        .topo
        .client
        .ns
        .run(move || client::udp_request(empty_udp, Duration::from_secs(3)))
        .expect("netns")
        .expect_err("refused");
    assert!(
        e.contains("refused"),
        "the ICMPv6 answer fails the connected socket: {e}"
    );

    let none = SocketAddr::from((Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x99), 80));
    let t = trace(s, &["--from", "pod/test/client", "--to", &none.to_string()]);
    assert_eq!(outcome(&t), "passed", "{t}");

    let out = trace_command(
        s,
        &[
            "--from",
            "node",
            "--to",
            "svc/test/v4only",
            "--ip-family",
            "ipv6",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("service test/v4only has no IPv6 ClusterIP"),
        "{err}"
    );
}

/// Each kube-proxy mode's IPv6 rules (ip6tables, `ip6 kube-proxy`, IPVS IPv6): every IPv6
/// backend of the Service, among which the datapath's trace picked; the same refusal.
fn rules_agree_with_the_datapath(s: &Scenario) {
    let datapath = outcome(&trace_only(
        s,
        &["--from", "pod/test/client", "--to", "svc/test/web"],
    ));
    let want: Vec<String> = backends6(TCP).into_iter().collect();
    for mode in ["iptables", "nftables", "ipvs"] {
        let args = [
            "--mode",
            mode,
            "--from",
            "pod/test/client",
            "--to",
            "svc/test/web",
        ];
        let text = trace_only(s, &args);
        assert!(text.contains("IPv6 proxier"), "{text}");
        assert_eq!(
            outcome(&text),
            format!("one of {}", want.join(", ")),
            "{text}"
        );
        assert!(
            want.contains(&datapath),
            "{mode}: {datapath} not in {want:?}"
        );
        let empty = [
            "--mode",
            mode,
            "--from",
            "pod/test/client",
            "--to",
            "[fd00:10:96::12]:80",
        ];
        let text = trace_only(s, &empty);
        assert_eq!(outcome(&text), "refused", "{mode}\n{text}");
    }
}
