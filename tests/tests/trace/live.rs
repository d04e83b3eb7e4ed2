//! `xlb trace` against a live agent, one table of steps run in both families, each on a
//! lab of its own: IPv4 on the single-stack lab, IPv6 on the dual-stack one (IPv6 first),
//! with real packets from the client pod for each verdict (through tc: the test's sockets
//! are outside the agent's cgroup). The live flow and affinity maps stay byte-identical
//! through every trace ([`trace`]).

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use xlb_lab::sctp::{SctpServer, sctp_request};
use xlb_tests::{
    client,
    echo::EchoServer,
    scenario::{Scenario, TCP_PORT, UDP_PORT},
    services::{service_of, service_yaml},
    topology::{pod_ip, pod_ip6},
    trace_support::{flow_maps, open_request, outcome, trace, trace_command, trace_only},
};

/// The agent's node name in the IPv4 lab (`ext`'s endpoints are on it: an external
/// frontend's flows to them are not SNATed).
const NODE: &str = "node1";
const SIG_PORT: u16 = 38412;
const SIG_TARGET: u16 = 9000;

/// One family's lab: what each step addresses, and how the trace words that family.
pub struct Lab {
    pub name: &'static str,
    /// The trace's word before a packet or a conntrack entry of this family.
    prefix: &'static str,
    /// The client pod's address of this family.
    client: IpAddr,
    backends: [IpAddr; 2],
    pub web: IpAddr,
    sticky: IpAddr,
    /// TCP 80 and UDP 53 without endpoints.
    empty: IpAddr,
    /// An address of the ClusterIP range that is no frontend.
    none: IpAddr,
    sig: IpAddr,
    /// A Maglev externalIP and its ClusterIP.
    ext: IpAddr,
    ext_cluster: IpAddr,
    /// The Services by name: sticky, the Maglev one, and dns (a port of its own name).
    sticky_svc: &'static str,
    ext_svc: &'static str,
    dns_svc: &'static str,
    /// The node's connect hook.
    hook: &'static str,
    /// What the trace says after a Maglev slot's backend (its endpoints' node).
    locality: &'static str,
    /// The conntrack tables of this family in [`flow_maps`]'s numbering.
    ct_tables: [u8; 2],
}

pub const V4: Lab = Lab {
    name: "IPv4",
    prefix: "",
    client: IpAddr::V4(Ipv4Addr::new(10, 244, 1, 2)),
    backends: [
        IpAddr::V4(Ipv4Addr::new(10, 244, 2, 2)),
        IpAddr::V4(Ipv4Addr::new(10, 244, 3, 2)),
    ],
    web: IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10)),
    sticky: IpAddr::V4(Ipv4Addr::new(10, 96, 0, 11)),
    empty: IpAddr::V4(Ipv4Addr::new(10, 96, 0, 12)),
    none: IpAddr::V4(Ipv4Addr::new(10, 96, 0, 99)),
    sig: IpAddr::V4(Ipv4Addr::new(10, 96, 0, 13)),
    ext: IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7)),
    ext_cluster: IpAddr::V4(Ipv4Addr::new(10, 96, 0, 14)),
    sticky_svc: "svc/test/sticky",
    ext_svc: "test/ext",
    dns_svc: "svc/test/dns",
    hook: "connect4",
    locality: " (on this node)",
    ct_tables: [0, 1],
};

pub const V6: Lab = Lab {
    name: "IPv6",
    prefix: "IPv6 ",
    client: IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 2)),
    backends: [
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x244, 2, 0, 0, 0, 2)),
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x244, 3, 0, 0, 0, 2)),
    ],
    web: IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x10)),
    sticky: IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x11)),
    empty: IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x12)),
    none: IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x99)),
    sig: IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x13)),
    ext: IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x7)),
    ext_cluster: IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x14)),
    sticky_svc: "svc/test/sticky6",
    ext_svc: "test/ext6",
    dns_svc: "svc/test/web:dns",
    hook: "connect6",
    locality: "",
    ct_tables: [2, 3],
};

/// The IPv4 ClusterIP of the dual-stack lab's `web`, and its IPv4-only Service.
const WEB4_OF_DUAL: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const V4ONLY: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 13);

/// A Service with one port `p` and its slice of ready endpoints (namespace `test`), of
/// the family of `ip`; `extra` lines go into its spec.
fn service(
    name: &str,
    ip: IpAddr,
    proto: &str,
    port: u16,
    target: u16,
    extra: &str,
    eps: &[IpAddr],
) -> String {
    service_of(name, ip, port, proto, target, eps).replacen(
        "spec:\n",
        &format!("spec:\n{extra}"),
        1,
    )
}

/// The Services both labs have, in the lab's family: sticky (ClientIP affinity), empty
/// (TCP 80 and UDP 53 without endpoints), sig (SCTP), the Maglev externalIP `ext` (its
/// endpoints on [`NODE`] in the IPv4 lab, which runs as that node).
fn common(lab: &Lab, six: &str) -> String {
    let eps = &lab.backends;
    let node = if lab.is_v6() {
        String::new()
    } else {
        format!("  nodeName: {NODE}\n")
    };
    let affinity = "  sessionAffinity: ClientIP\n";
    service(
        &format!("sticky{six}"),
        lab.sticky,
        "TCP",
        80,
        TCP_PORT,
        affinity,
        eps,
    ) + &service(
        &format!("empty{six}"),
        lab.empty,
        "TCP",
        80,
        TCP_PORT,
        "",
        &[],
    ) + &service(
        &format!("emptyu{six}"),
        lab.empty,
        "UDP",
        53,
        UDP_PORT,
        "",
        &[],
    ) + &service(
        &format!("sig{six}"),
        lab.sig,
        "SCTP",
        SIG_PORT,
        SIG_TARGET,
        "",
        eps,
    ) + &service(
        &format!("ext{six}"),
        lab.ext_cluster,
        "TCP",
        80,
        TCP_PORT,
        &format!("  externalIPs: [\"{}\"]\n", lab.ext),
        eps,
    )
    .replace(
        "  conditions: {ready: true}",
        &format!("{node}  conditions: {{ready: true}}"),
    )
    .replacen(
        &format!("name: ext{six}}}"),
        &format!("name: ext{six}, annotations: {{service.cilium.io/lb-algorithm: maglev}}}}"),
        1,
    )
}

/// The IPv4 lab's Services: web (TCP) and dns (UDP) on one ClusterIP, [`common`], and
/// the client pod as a `kind: Pod` document.
pub fn services4() -> String {
    let eps = &V4.backends;
    service("web", V4.web, "TCP", 80, TCP_PORT, "", eps)
        + &service("dns", V4.web, "UDP", 53, UDP_PORT, "", eps)
        + &common(&V4, "")
        + &format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{namespace: test, name: client}}\nstatus: {{podIP: {}}}\n",
            pod_ip(1)
        )
}

/// The IPv6 lab's Services: web dual-stack (IPv6 first), TCP 80 and UDP 53 (port `dns`) on
/// both backends of each family; [`common`] in IPv6; v4only; the client pod with both its
/// addresses.
fn services6() -> String {
    let (b4, b6): (Vec<Ipv4Addr>, Vec<Ipv6Addr>) =
        ((2..4).map(pod_ip).collect(), (2..4).map(pod_ip6).collect());
    let web6 = V6.web;
    let mut y = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: test, name: web}}\nspec:\n  ipFamilyPolicy: PreferDualStack\n  ipFamilies: [IPv6, IPv4]\n  clusterIP: \"{web6}\"\n  clusterIPs: [\"{web6}\", \"{WEB4_OF_DUAL}\"]\n  ports:\n  - {{name: http, port: 80, protocol: TCP, targetPort: {TCP_PORT}}}\n  - {{name: dns, port: 53, protocol: UDP, targetPort: {UDP_PORT}}}\n"
    );
    let slices: [(&str, Vec<String>); 2] = [
        ("IPv6", b6.iter().map(Ipv6Addr::to_string).collect()),
        ("IPv4", b4.iter().map(Ipv4Addr::to_string).collect()),
    ];
    for (family, addrs) in slices {
        y.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: test\n  name: web-{family}\n  labels: {{kubernetes.io/service-name: web}}\naddressType: {family}\nports:\n- {{name: http, port: {TCP_PORT}, protocol: TCP}}\n- {{name: dns, port: {UDP_PORT}, protocol: UDP}}\nendpoints:\n"
        ));
        for a in addrs {
            y.push_str(&format!(
                "- addresses: [\"{a}\"]\n  conditions: {{ready: true}}\n"
            ));
        }
    }
    y + &common(&V6, "6")
        + &service_yaml("v4only", V4ONLY, 80, "TCP", TCP_PORT, &b4)
        + &format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{namespace: test, name: client}}\nstatus:\n  podIP: {}\n  podIPs: [{{ip: {}}}, {{ip: \"{}\"}}]\n",
            pod_ip(1),
            pod_ip(1),
            pod_ip6(1)
        )
}

impl Lab {
    fn is_v6(&self) -> bool {
        self.web.is_ipv6()
    }

    /// `IP:port` of each backend.
    fn backends(&self, port: u16) -> BTreeSet<String> {
        self.backends
            .iter()
            .map(|b| SocketAddr::new(*b, port).to_string())
            .collect()
    }

    /// `what`, prefixed with the family: how a step names itself in a failure.
    fn row(&self, what: &str) -> String {
        format!("{}: {what}", self.name)
    }

    /// The lab's scenario with every frontend programmed, its echo servers of this family
    /// (IPv4's are the scenario's own) and SCTP servers (running until dropped).
    fn start(&self) -> (Scenario, Vec<EchoServer>, Vec<SctpServer>) {
        let mut s = if self.is_v6() {
            let mut s = Scenario::start_with("xtr6", 2, &services6(), &[]).expect("scenario");
            s.topo.dual_stack().expect("dual-stack pods");
            s
        } else {
            Scenario::start_with("xtr", 2, &services4(), &["--hostname-override", NODE])
                .expect("scenario")
        };
        let mut echo = Vec::new();
        let mut sctp = Vec::new();
        for pod in &s.topo.backends {
            let ip = if self.is_v6() {
                let ip6: IpAddr = pod.ip6.expect("a dual-stack backend").into();
                let server = EchoServer::start_at(&pod.ns, &pod.name, ip6, TCP_PORT, UDP_PORT);
                echo.push(server.expect("IPv6 echo server"));
                ip6
            } else {
                pod.ip.into()
            };
            sctp.push(SctpServer::start(&pod.ns, &pod.name, ip, SIG_TARGET).expect("SCTP server"));
        }
        let at =
            |ip: IpAddr, port: u16, proto: &str| format!("{}/{proto}", SocketAddr::new(ip, port));
        let mut frontends = vec![
            (at(self.web, 80, "TCP"), 2),
            (at(self.web, 53, "UDP"), 2),
            (at(self.sticky, 80, "TCP"), 2),
            (at(self.sig, SIG_PORT, "SCTP"), 2),
            (at(self.ext, 80, "TCP"), 2),
            (at(self.empty, 80, "TCP"), 0),
            (at(self.empty, 53, "UDP"), 0),
        ];
        if self.is_v6() {
            frontends.push((at(WEB4_OF_DUAL.into(), 80, "TCP"), 2));
        }
        for (frontend, n) in frontends {
            s.wait_backends(&frontend, n, Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("{frontend} programmed: {e}\n{}", s.agent.log_text()));
        }
        (s, echo, sctp)
    }
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
    for lab in [&V4, &V6] {
        traces_match_real_packets(lab);
    }
}

/// The table of steps, for one family.
fn traces_match_real_packets(lab: &Lab) {
    let (s, _echo, _sctp) = lab.start();
    let timeout = Duration::from_secs(3);
    // A real flow first, kept open through the test (the conntrack collector deletes
    // closed flows), so the maps the traces must leave alone hold this family's entries
    // and the sticky service's affinity entry.
    let sticky = SocketAddr::new(lab.sticky, 80);
    let (first, mut open) = s
        .topo
        .client
        .ns
        .run(move || open_request(sticky, timeout))
        .expect("netns")
        .expect("sticky answers");
    let (ct, affinity) = flow_maps(&s.agent.pins);
    assert!(
        ct.keys().any(|k| lab.ct_tables.contains(&k[0])) && !affinity.is_empty(),
        "{}",
        lab.row("a real flow left entries")
    );
    services_by_name(&s, lab);
    // The kept flow asked again between the steps, so the echo server's 30 s idle timeout
    // never closes it in the middle of a trace, however slow the machine.
    let mut keep = move || {
        client::ask_tcp(&mut open).expect("the kept flow answers");
        open.local_addr().expect("the open flow's port").port()
    };
    keep();
    affinity_follows_the_real_flow(&s, lab, &first.backend);
    let port = keep();
    tracked_flow(&s, lab, port, &first.backend);
    keep();
    refused_and_passed(&s, lab);
    keep();
    from_the_node(&s, lab);
    keep();
    rules_agree_with_the_datapath(&s, lab);
    keep();
    if lab.is_v6() {
        other_family_of_a_dual_stack_service(&s);
    }
    // The kept flow closes now, settled before the next trace.
    drop(keep);
    let reached = maglev_names_the_entry(&s, lab);
    println!("{}: 6 Maglev flows reached {reached:?}", lab.name);
    list_shows_each_frontends_algorithm(&s, lab);
}

/// The Services by name from the pod, each traced and then reached for real: web (TCP,
/// a new flow, random among its slots), dns (UDP), sig (SCTP).
fn services_by_name(s: &Scenario, lab: &Lab) {
    let timeout = Duration::from_secs(3);
    let client_ns = &s.topo.client.ns;
    let web = SocketAddr::new(lab.web, 80);
    let text = trace(s, &["--from", "pod/test/client", "--to", "svc/test/web"]);
    println!("{text}");
    let what = lab.row("web by name");
    for want in [
        format!(
            "{}TCP SYN {} -> {web}",
            lab.prefix,
            SocketAddr::new(lab.client, 40000)
        ),
        "ClusterIP of service test/web".into(),
        format!("DNAT {web} -> "),
        format!("would create {}conntrack forward", lab.prefix),
        "new_flow +1".into(),
        "algorithm  random: a new flow picks uniformly among 2 slot(s)".into(),
    ] {
        assert!(text.contains(&want), "{what}: {want:?} in\n{text}");
    }
    assert_eq!(
        text.contains("IPv6 TCP SYN"),
        lab.is_v6(),
        "{what}: the packet's family\n{text}"
    );
    assert!(
        lab.backends(TCP_PORT).contains(&outcome(&text)),
        "{what}: {text}"
    );
    let real = client_ns
        .run(move || client::tcp_request(web, timeout))
        .expect("netns")
        .unwrap_or_else(|e| panic!("{what}: web answers: {e}"));
    assert!(real.backend.starts_with("backend-"), "{what}: {real:?}");
    assert!(
        real.seen_client.contains(&lab.client.to_string()),
        "{what}: {real:?}"
    );

    // UDP from the pod's address to the Service's UDP port.
    let what = lab.row("dns");
    let from = SocketAddr::new(lab.client, 41000).to_string();
    let text = trace(s, &["--from", &from, "--to", lab.dns_svc]);
    assert!(
        lab.backends(UDP_PORT).contains(&outcome(&text)),
        "{what}: {text}"
    );
    let dns = SocketAddr::new(lab.web, 53);
    client_ns
        .run(move || client::udp_request(dns, timeout))
        .expect("netns")
        .unwrap_or_else(|e| panic!("{what}: dns answers: {e}"));

    // SCTP: the trace sends an INIT; a real association goes through.
    let what = lab.row("sig");
    let svc = if lab.is_v6() {
        "svc/test/sig6"
    } else {
        "svc/test/sig"
    };
    let text = trace(s, &["--from", "pod/test/client", "--to", svc]);
    assert!(text.contains("SCTP INIT"), "{what}: {text}");
    assert!(
        lab.backends(SIG_TARGET).contains(&outcome(&text)),
        "{what}: {text}"
    );
    let to = SocketAddr::new(lab.sig, SIG_PORT);
    client_ns
        .run(move || sctp_request(to, timeout))
        .expect("netns")
        .unwrap_or_else(|e| panic!("{what}: sig answers: {e}"));
}

/// ClientIP affinity: the trace of the client pod to the sticky Service finds the real
/// flow's entry (whose backend was `first`) and goes where the real packet goes.
fn affinity_follows_the_real_flow(s: &Scenario, lab: &Lab, first: &str) {
    let what = lab.row("affinity");
    let st = trace(s, &["--from", "pod/test/client", "--to", lab.sticky_svc]);
    println!("{st}");
    assert!(st.contains("ClientIP (10800 s): hit"), "{what}: {st}");
    let chosen: SocketAddr = outcome(&st).parse().expect("a backend");
    assert_eq!(backend_name(s, chosen.ip()), first, "{what}: {st}");
    let sticky = SocketAddr::new(lab.sticky, 80);
    let again = s
        .topo
        .client
        .ns
        .run(move || client::tcp_request(sticky, Duration::from_secs(3)))
        .expect("netns")
        .expect("sticky answers");
    assert_eq!(again.backend, first, "{what}");
}

/// The open real flow's own tuple: the trace meets its live conntrack entry (copied into
/// the scratch tables) and follows it, no service lookup.
fn tracked_flow(s: &Scenario, lab: &Lab, port: u16, first: &str) {
    let what = lab.row("tracked flow");
    let from = SocketAddr::new(lab.client, port).to_string();
    let to = SocketAddr::new(lab.sticky, 80).to_string();
    let t = trace(s, &["--from", &from, "--to", &to]);
    println!("{t}");
    assert!(
        t.contains("tracked flow: this tuple already goes to"),
        "{what}: {t}"
    );
    assert!(t.contains("established +1"), "{what}: {t}");
    let chosen: SocketAddr = outcome(&t).parse().expect("the flow's backend");
    assert_eq!(backend_name(s, chosen.ip()), first, "{what}: {t}");
}

/// No endpoints: refused (a TCP RST; the family's ICMP port unreachable), as a real
/// connect and a real datagram are; not a frontend: passed.
fn refused_and_passed(s: &Scenario, lab: &Lab) {
    let client_ns = &s.topo.client.ns;
    let empty = SocketAddr::new(lab.empty, 80);
    let what = lab.row("TCP without endpoints");
    let t = trace(
        s,
        &["--from", "pod/test/client", "--to", &empty.to_string()],
    );
    println!("{t}");
    assert_eq!(outcome(&t), "refused", "{what}: {t}");
    assert!(
        t.contains("TCP RST") && t.contains("reject +1"),
        "{what}: {t}"
    );
    let e = client_ns
        .run(move || client::tcp_request(empty, Duration::from_secs(3)))
        .expect("netns")
        .expect_err("refused");
    assert!(e.contains("refused"), "{what}: {e}");
    let what = lab.row("UDP without endpoints");
    let empty_udp = SocketAddr::new(lab.empty, 53);
    let args = [
        "--from",
        "pod/test/client",
        "--to",
        &empty_udp.to_string(),
        "--proto",
        "udp",
    ];
    let t = trace(s, &args);
    assert_eq!(outcome(&t), "refused", "{what}: {t}");
    let icmp = if lab.is_v6() { "ICMPv6" } else { "ICMP" };
    assert!(
        t.contains(&format!("{icmp} port unreachable")),
        "{what}: {t}"
    );
    let e = client_ns
        .run(move || client::udp_request(empty_udp, Duration::from_secs(3)))
        .expect("netns")
        .expect_err("refused");
    assert!(
        e.contains("refused"),
        "{what}: the ICMP answer fails the connected socket: {e}"
    );
    let what = lab.row("not a frontend");
    let none = SocketAddr::new(lab.none, 80).to_string();
    let t = trace(s, &["--from", "pod/test/client", "--to", &none]);
    assert_eq!(outcome(&t), "passed", "{what}: {t}");
}

/// From the node: the connect4 or connect6 decision, computed from the maps and said so:
/// one of the backends; a frontend without endpoints refused.
fn from_the_node(s: &Scenario, lab: &Lab) {
    let what = lab.row("from the node");
    let node = trace(s, &["--from", "node", "--to", "svc/test/web"]);
    assert!(
        node.contains("cannot test-run cgroup sock_addr"),
        "{what}: {node}"
    );
    let hook = lab.hook;
    assert!(
        node.contains(&format!("{hook} hook (xlb_{hook})")),
        "{what}: {node}"
    );
    let backends: Vec<String> = lab.backends(TCP_PORT).into_iter().collect();
    assert_eq!(
        outcome(&node),
        format!("one of {}", backends.join(", ")),
        "{what}: {node}"
    );
    let empty = SocketAddr::new(lab.empty, 80).to_string();
    let node_empty = trace(s, &["--from", "node", "--to", &empty]);
    assert_eq!(outcome(&node_empty), "refused", "{what}: {node_empty}");
}

/// Each kube-proxy mode's rules of the family (IPv6: ip6tables, `ip6 kube-proxy`, IPVS
/// IPv6, which the trace names as the IPv6 proxier): every backend of the Service, among
/// which the datapath's trace picked; the same refusal.
fn rules_agree_with_the_datapath(s: &Scenario, lab: &Lab) {
    let datapath = outcome(&trace_only(
        s,
        &["--from", "pod/test/client", "--to", "svc/test/web"],
    ));
    let want: Vec<String> = lab.backends(TCP_PORT).into_iter().collect();
    let empty = SocketAddr::new(lab.empty, 80).to_string();
    for mode in ["iptables", "nftables", "ipvs"] {
        let what = lab.row(mode);
        let args = [
            "--mode",
            mode,
            "--from",
            "pod/test/client",
            "--to",
            "svc/test/web",
        ];
        let text = trace_only(s, &args);
        assert_eq!(
            text.contains("IPv6 proxier"),
            lab.is_v6(),
            "{what}: the proxier of the family\n{text}"
        );
        assert_eq!(
            outcome(&text),
            format!("one of {}", want.join(", ")),
            "{what}: {text}"
        );
        assert!(
            want.contains(&datapath),
            "{what}: {datapath} not in {want:?}"
        );
        let args = ["--mode", mode, "--from", "pod/test/client", "--to", &empty];
        let text = trace_only(s, &args);
        assert_eq!(outcome(&text), "refused", "{what}\n{text}");
    }
}

/// Dual-stack lab only (the IPv4 lab's Services are single-stack): `--ip-family ipv4`
/// picks the Service's other ClusterIP and the pod's other address; a family the Service
/// lacks is an error naming it.
fn other_family_of_a_dual_stack_service(s: &Scenario) {
    let web4 = trace(
        s,
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
                .any(|b| IpAddr::V4(*b) == chosen.ip()),
        "{web4}"
    );
    assert!(
        web4.contains(&format!("DNAT {WEB4_OF_DUAL}:80 -> ")),
        "{web4}"
    );
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

/// The Maglev frontend: for six source ports the trace names the table entry the packet's
/// 5-tuple hashes to (`lb_common::flow_hash` over the addresses' words, as the program
/// computes it) and the slot and backend it holds, the test run goes there, and a real
/// connection from the same source port reaches that backend. The backends that answered.
fn maglev_names_the_entry(s: &Scenario, lab: &Lab) -> BTreeSet<String> {
    const M: u32 = 16381;
    let timeout = Duration::from_secs(3);
    let ext = SocketAddr::new(lab.ext, 80);
    let words = |ip: IpAddr| match ip {
        IpAddr::V4(a) => [u32::from_ne_bytes(a.octets()), 0, 0, 0],
        IpAddr::V6(a) => {
            let o = a.octets();
            std::array::from_fn(|i| {
                u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
            })
        }
    };
    let mut reached = BTreeSet::new();
    for port in [41001u16, 41002, 41003, 41004, 41005, 41006] {
        let from = SocketAddr::new(lab.client, port);
        let what = lab.row(&format!("Maglev from {from}"));
        let text = trace(s, &["--from", &from.to_string(), "--to", &ext.to_string()]);
        println!("{text}");
        assert!(
            text.contains(&format!("is the externalIP of service {}", lab.ext_svc)),
            "{what}: {text}"
        );
        let hash = lb_common::flow_hash(
            &words(lab.client),
            &words(ext.ip()),
            port.to_be(),
            ext.port().to_be(),
            lb_common::IPPROTO_TCP,
        );
        let (slot, backend) = xlb_tests::trace_support::maglev_choice(&text, hash, M);
        let locality = lab.locality;
        assert!(
            text.contains(&format!("slot {slot}: {backend}/TCP{locality}")),
            "{what}: the endpoints step puts {backend} in slot {slot}:\n{text}"
        );
        assert_eq!(
            outcome(&text),
            backend,
            "{what}: the test run went there:\n{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.contains(&format!("{backend}/TCP{locality}"))
                    && l.contains("chosen by the frontend's Maglev table")),
            "{what}: {text}"
        );
        let to: SocketAddr = backend.parse().expect("a backend");
        let name = backend_name(s, to.ip());
        assert!(
            name.starts_with("backend-") && to.port() == TCP_PORT,
            "{what}: {backend}: {text}"
        );
        let answered = s
            .topo
            .client
            .ns
            .run(move || tcp_request_from(from, ext, timeout))
            .expect("netns")
            .unwrap_or_else(|e| panic!("{what}: {ext} answers: {e}"));
        assert_eq!(answered, name, "{what}: {text}");
        reached.insert(answered);
    }
    reached
}

/// `xlb list services`: the Maglev frontend's table (`maglev M=…`), the ClusterIPs random.
fn list_shows_each_frontends_algorithm(s: &Scenario, lab: &Lab) {
    let out = s
        .topo
        .node
        .command(xlb_tests::xlb_bin())
        .args(["list", "services", "--bpffs"])
        .arg(&s.agent.pins)
        .output()
        .expect("run xlb list");
    let text = String::from_utf8_lossy(&out.stdout);
    let what = lab.row("xlb list services");
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    let row = |ip: IpAddr| {
        let frontend = format!(" {}/TCP", SocketAddr::new(ip, 80));
        text.lines()
            .find(|l| l.contains(&frontend))
            .unwrap_or_else(|| panic!("{what}: no row for {frontend}:\n{text}"))
            .to_string()
    };
    assert!(
        text.lines().next().is_some_and(|h| h.contains("ALGORITHM")),
        "{what}: {text}"
    );
    assert!(
        row(lab.ext).contains("maglev M=16381 table="),
        "{what}: {text}"
    );
    for clusterip in [lab.ext_cluster, lab.web] {
        let r = row(clusterip);
        assert!(r.contains(" random "), "{what}: {r}\n{text}");
        assert!(!r.contains("maglev"), "{what}: {r}\n{text}");
    }
}
