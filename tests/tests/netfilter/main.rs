//! Netfilter sees what it would see under kube-proxy (issue [netfilter]): with the
//! INVALID-dropping rules real nodes carry (kube-proxy's `KUBE-FORWARD`, a host firewall's
//! `ct state invalid drop`, a Calico-like per-interface chain) every path through xlb's tc
//! datapath is served and its replies are counted by the rules as ESTABLISHED, in both
//! families (`firewalls`), and XDP's flows are served too (`xdp`); a CNI's policy rule on
//! a backend's address still blocks what xlb sends it, and its rejection reaches the client
//! (`policy`); a bridge-based pod network gets its NodePort replies without `accept_local`
//! (`bridge`); a pod served by tc reaches a Service whose endpoint is the node itself
//! (`node_endpoint`); the kernel's conntrack holds the flows tc serves as ESTABLISHED and
//! ASSURED, with the backends' addresses (`conntrack`). `xlb cleanup --kube-proxy` removes
//! kube-proxy's rules of every mode and family and nothing else (`kube_proxy_cleanup`), and
//! `xlb agent --takeover-from kube-proxy` keeps kube-proxy's connections (`takeover`), and
//! `xlb cleanup --hand-back` gives xlb's connections to kube-proxy's rules (`hand_back`).
//!
//! The controls (`control_*`) run the same checks in the same labs with kube-proxy's own
//! iptables rules in place of the agent: what the tests ask of xlb is what netfilter sees
//! under kube-proxy, and the labs carry it.
//!
//! Every client here runs outside the agent's cgroup (a thread of the test process, or an
//! `xlb-probe` process with `--socket-lb host` in a pod's namespace), so the tc programs
//! serve it, not the socket hooks.

mod bridge;
mod conntrack;
mod control;
mod firewalls;
mod hand_back;
mod kube_proxy_cleanup;
mod migration;
mod node_endpoint;
mod policy;
mod shadow;
mod takeover;
mod xdp;

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::{Duration, Instant},
};

use xlb_tests::{
    client::{tcp_request, udp_request},
    netns::Netns,
    require_root,
    scenario::{TCP_PORT, UDP_PORT},
    services::{DualEndpoints, Port, dual_stack_service_on_nodes},
    topology::{pod_ip, pod_ip6, remote_pod_ip, remote_pod_ip6},
    twonode::{Lab, NODE6},
};

/// Node1's IPv4 address on its uplink (a NodePort address).
pub const NODE4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// How long one request may take (a loaded CI machine included).
pub const TIMEOUT: Duration = Duration::from_secs(3);

/// The Services of the dual-stack lab, each TCP 80 → 8080 and UDP 53 → 5353: `near` (a
/// NodePort, 30080/30053) on node1's backend pod, `far` (a NodePort, 30081/30054) on
/// node2's pod, `host` (a ClusterIP) on node1's own uplink addresses, `both` (a ClusterIP)
/// on node1's backend pod and node2's.
pub struct Frontends {
    pub near: IpAddr,
    pub far: IpAddr,
    pub host: IpAddr,
    pub both: IpAddr,
    pub node: IpAddr,
}

pub const V4: Frontends = Frontends {
    near: IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10)),
    far: IpAddr::V4(Ipv4Addr::new(10, 96, 0, 20)),
    host: IpAddr::V4(Ipv4Addr::new(10, 96, 0, 30)),
    both: IpAddr::V4(Ipv4Addr::new(10, 96, 0, 40)),
    node: IpAddr::V4(NODE4),
};

pub const V6: Frontends = Frontends {
    near: IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x10)),
    far: IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x20)),
    host: IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x30)),
    both: IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x40)),
    node: IpAddr::V6(NODE6),
};

/// The Services of the lab as YAML.
pub fn services() -> String {
    let ports = |tcp_np: u16, udp_np: u16| {
        [
            Port {
                name: "http",
                port: 80,
                protocol: "TCP",
                target: TCP_PORT,
                node_port: tcp_np,
            },
            Port {
                name: "dns",
                port: 53,
                protocol: "UDP",
                target: UDP_PORT,
                node_port: udp_np,
            },
        ]
    };
    let ips = |v4: IpAddr, v6: IpAddr| match (v4, v6) {
        (IpAddr::V4(a), IpAddr::V6(b)) => (a, b),
        other => panic!("not an IPv4 and an IPv6 address: {other:?}"),
    };
    let near: DualEndpoints = (&[(pod_ip(2), "node1")], &[(pod_ip6(2), "node1")]);
    let far: DualEndpoints = (
        &[(remote_pod_ip(1), "node2")],
        &[(remote_pod_ip6(1), "node2")],
    );
    let host: DualEndpoints = (&[(NODE4, "node1")], &[(NODE6, "node1")]);
    let both: DualEndpoints = (
        &[(pod_ip(2), "node1"), (remote_pod_ip(1), "node2")],
        &[(pod_ip6(2), "node1"), (remote_pod_ip6(1), "node2")],
    );
    let (near_ips, far_ips, host_ips) = (
        ips(V4.near, V6.near),
        ips(V4.far, V6.far),
        ips(V4.host, V6.host),
    );
    dual_stack_service_on_nodes("near", "NodePort", near_ips, &ports(30080, 30053), "", near)
        + &dual_stack_service_on_nodes("far", "NodePort", far_ips, &ports(30081, 30054), "", far)
        + &dual_stack_service_on_nodes("host", "ClusterIP", host_ips, &ports(0, 0), "", host)
        + &dual_stack_service_on_nodes(
            "both",
            "ClusterIP",
            ips(V4.both, V6.both),
            &ports(0, 0),
            "",
            both,
        )
}

/// The dual-stack two-node lab with [`services`] programmed (`extra`: more agent flags);
/// `None` (a loud skip) without root.
pub fn lab(prefix: &str, extra: &[&str]) -> Option<Lab> {
    if !require_root() {
        return None;
    }
    let last = format!("[{NODE6}]:30054/UDP");
    Some(Lab::start_dual_stack(prefix, &services(), &last, extra))
}

/// Where a request starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum From {
    /// Node1's client pod.
    ClientPod,
    /// The external client on node1's uplink.
    External,
    /// Node1's backend pod (the `near` Service's only endpoint: a hairpin to itself).
    BackendPod,
}

/// One way through xlb: from where, to which frontends (TCP, UDP), served by which backend.
#[derive(Clone, Debug)]
pub struct Path {
    pub what: &'static str,
    pub from: From,
    pub tcp: SocketAddr,
    pub udp: SocketAddr,
    pub backend: &'static str,
}

/// The paths of one family through the lab's Services.
pub fn paths(f: &Frontends) -> Vec<Path> {
    let at = |ip: IpAddr, tcp: u16, udp: u16| (SocketAddr::new(ip, tcp), SocketAddr::new(ip, udp));
    let path = |what, from, (tcp, udp), backend| Path {
        what,
        from,
        tcp,
        udp,
        backend,
    };
    vec![
        path(
            "pod → ClusterIP, local backend",
            From::ClientPod,
            at(f.near, 80, 53),
            "backend-1",
        ),
        path(
            "pod → ClusterIP, remote backend",
            From::ClientPod,
            at(f.far, 80, 53),
            "n2-backend-1",
        ),
        path(
            "pod → NodePort",
            From::ClientPod,
            at(f.node, 30080, 30053),
            "backend-1",
        ),
        path(
            "external → NodePort, local backend",
            From::External,
            at(f.node, 30080, 30053),
            "backend-1",
        ),
        path(
            "external → NodePort, remote backend (SNAT)",
            From::External,
            at(f.node, 30081, 30054),
            "n2-backend-1",
        ),
        path(
            "hairpin: a pod through its own Service",
            From::BackendPod,
            at(f.near, 80, 53),
            "backend-1",
        ),
    ]
}

/// The namespace a path's requests start in.
pub fn origin(lab: &Lab, from: From) -> &Netns {
    match from {
        From::ClientPod => &lab.topo.client.ns,
        From::External => &lab.ext.ns,
        From::BackendPod => &lab.topo.backends[0].ns,
    }
}

/// `n` requests over `protocol` (`TCP`, `UDP`) along `path`, each on a fresh socket; stops
/// at the first one that fails or is answered by another backend than the path's.
pub fn ask(lab: &Lab, path: &Path, protocol: &str, n: usize) -> Result<(), String> {
    let (to, tcp, want) = match protocol {
        "TCP" => (path.tcp, true, path.backend),
        _ => (path.udp, false, path.backend),
    };
    origin(lab, path.from)
        .run(move || {
            for i in 0..n {
                let answer = if tcp {
                    tcp_request(to, TIMEOUT)
                } else {
                    udp_request(to, TIMEOUT)
                };
                match answer {
                    Ok(a) if a.backend == want => {}
                    Ok(a) => return Err(format!("request {i} to {to} answered by {a:?}")),
                    Err(e) => return Err(format!("request {i}: {e}")),
                }
            }
            Ok(())
        })
        .map_err(|e| format!("client thread: {e}"))?
}

/// Waits (up to 10 s) until one request over each protocol along each path is answered: the
/// lab works before a test changes anything.
pub fn wait_served(lab: &Lab, paths: &[Path]) {
    for path in paths {
        for protocol in ["TCP", "UDP"] {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match ask(lab, path, protocol, 1) {
                    Ok(()) => break,
                    Err(e) if Instant::now() > deadline => panic!(
                        "before any rule, {} over {protocol} is not served: {e}\n{}",
                        path.what,
                        log_tail(&lab.agent.log_text())
                    ),
                    Err(_) => std::thread::sleep(Duration::from_millis(200)),
                }
            }
        }
    }
}

/// The last 40 lines of an agent's log (for failure messages).
pub fn log_tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    let from = lines.len().saturating_sub(40);
    format!("--- agent log (tail):\n{}", lines[from..].join("\n"))
}
