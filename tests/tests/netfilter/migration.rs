//! The lab the migration tests share (`takeover`, `hand_back`): dual-stack Services — a
//! ClusterIP TCP one, a ClusterIP UDP one, a NodePort with a TCP and a UDP port, a
//! ClusterIP with ClientIP affinity, an `externalTrafficPolicy: Local` NodePort — each on
//! three dual-stack backend pods; the node's IPs on its `lo`; an external client on the
//! node's uplink `up0`; kube-proxy's rules of a mode for both families, or nothing yet.
//! Its flows run from the client pod, from the node itself and from the external client.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket},
    path::PathBuf,
    sync::mpsc,
    thread::JoinHandle,
    time::Duration,
};

use lb_userspace::{
    model::{IpFamily, Model, NodeSettings, Protocol},
    source::file,
};
use xlb_lab::{
    compare::{Impl, Installed, LabSpec, install},
    netns::Netns,
    topology::{Pod, pod_ip6},
};
use xlb_tests::{
    client::{ask_tcp, ask_udp},
    scenario::{TCP_PORT, UDP_PORT},
    services::{Port, dual_stack_service_on_nodes, source_file},
    topology::pod_ip,
    twonode::{CLIENT6, NODE6},
};

/// The families every flow set runs in.
pub const FAMILIES: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];
/// The ClusterIPs of the TCP, UDP and NodePort Services, by family.
const WEB: (Ipv4Addr, Ipv6Addr) = (
    Ipv4Addr::new(10, 96, 0, 10),
    Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x10),
);
const DNS: (Ipv4Addr, Ipv6Addr) = (
    Ipv4Addr::new(10, 96, 0, 53),
    Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x53),
);
const NP: (Ipv4Addr, Ipv6Addr) = (
    Ipv4Addr::new(10, 96, 0, 20),
    Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x20),
);
const AFF: (Ipv4Addr, Ipv6Addr) = (
    Ipv4Addr::new(10, 96, 0, 30),
    Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x30),
);
const LOCAL: (Ipv4Addr, Ipv6Addr) = (
    Ipv4Addr::new(10, 96, 0, 40),
    Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x40),
);
/// The node's IPs (on its `lo`): NodePorts are served there.
const NODE_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 10);
const NODE_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x198, 0x18, 0, 0, 0, 0, 0x10);
pub const NODE_PORT_TCP: u16 = 30080;
pub const NODE_PORT_UDP: u16 = 30053;
/// The NodePort of the `externalTrafficPolicy: Local` Service.
pub const NODE_PORT_LOCAL: u16 = 30081;
pub const TIMEOUT: Duration = Duration::from_secs(3);

fn pick(ips: (Ipv4Addr, Ipv6Addr), family: IpFamily) -> IpAddr {
    match family {
        IpFamily::V4 => ips.0.into(),
        IpFamily::V6 => ips.1.into(),
    }
}

/// The TCP Service's ClusterIP frontend of `family`.
pub fn web(family: IpFamily) -> SocketAddr {
    SocketAddr::new(pick(WEB, family), 80)
}

/// The UDP Service's ClusterIP frontend of `family`.
pub fn dns(family: IpFamily) -> SocketAddr {
    SocketAddr::new(pick(DNS, family), 53)
}

/// The ClientIP-affinity Service's ClusterIP frontend of `family`.
pub fn affinity(family: IpFamily) -> SocketAddr {
    SocketAddr::new(pick(AFF, family), 80)
}

/// The `externalTrafficPolicy: Local` NodePort on the node's IP of `family`.
pub fn local_node_port(family: IpFamily) -> SocketAddr {
    SocketAddr::new(pick((NODE_IP, NODE_IP6), family), NODE_PORT_LOCAL)
}

/// The NodePort of `protocol` (`TCP`, `UDP`) on the node's IP of `family`.
pub fn node_port(family: IpFamily, tcp: bool) -> SocketAddr {
    let port = if tcp { NODE_PORT_TCP } else { NODE_PORT_UDP };
    SocketAddr::new(pick((NODE_IP, NODE_IP6), family), port)
}

/// The flows one namespace keeps open: TCP connections and connected UDP sockets.
#[derive(Clone, Debug, Default)]
pub struct Targets {
    pub tcp: Vec<SocketAddr>,
    pub udp: Vec<SocketAddr>,
}

impl Targets {
    /// `n` more TCP connections to `to` of each family.
    pub fn tcp(mut self, n: usize, to: impl Fn(IpFamily) -> SocketAddr) -> Self {
        for family in FAMILIES {
            self.tcp.extend(std::iter::repeat_n(to(family), n));
        }
        self
    }

    /// `n` more connected UDP sockets to `to` of each family.
    pub fn udp(mut self, n: usize, to: impl Fn(IpFamily) -> SocketAddr) -> Self {
        for family in FAMILIES {
            self.udp.extend(std::iter::repeat_n(to(family), n));
        }
        self
    }

    pub fn len(&self) -> usize {
        self.tcp.len() + self.udp.len()
    }
}

/// The backends that answered each TCP connection and each UDP socket, one round.
pub type Round = Result<(Vec<String>, Vec<String>), String>;

pub fn round(tcp: &mut [TcpStream], udp: &[UdpSocket]) -> Round {
    let t = tcp
        .iter_mut()
        .map(|c| {
            let ends = format!("{:?} → {:?}", c.local_addr(), c.peer_addr());
            ask_tcp(c).map_err(|e| format!("TCP {ends}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let u = udp
        .iter()
        .map(|s| {
            let ends = format!("{:?} → {:?}", s.local_addr(), s.peer_addr());
            ask_udp(s).map_err(|e| format!("UDP {ends}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((t, u))
}

/// A lab of the migration tests, with its services file (removed on drop).
pub struct MigrationLab {
    /// The external client on the node's `up0` (dropped before the lab's namespaces).
    pub ext: Pod,
    pub lab: Installed,
    pub path: PathBuf,
    pub model: Model,
    pub node: NodeSettings,
    dir: PathBuf,
}

impl Drop for MigrationLab {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The Services of the lab, on backends `v4` and `v6`.
fn services_yaml(v4: &[Ipv4Addr], v6: &[Ipv6Addr]) -> String {
    let v4: Vec<(Ipv4Addr, &str)> = v4.iter().map(|ip| (*ip, "node1")).collect();
    let v6: Vec<(Ipv6Addr, &str)> = v6.iter().map(|ip| (*ip, "node1")).collect();
    let one = |name, protocol, port, target| Port {
        name,
        port,
        protocol,
        target,
        node_port: 0,
    };
    let web = [one("p", "TCP", 80, TCP_PORT)];
    let dns = [one("p", "UDP", 53, UDP_PORT)];
    let np = [
        Port {
            node_port: NODE_PORT_TCP,
            ..one("t", "TCP", 80, TCP_PORT)
        },
        Port {
            node_port: NODE_PORT_UDP,
            ..one("u", "UDP", 53, UDP_PORT)
        },
    ];
    let local = [Port {
        node_port: NODE_PORT_LOCAL,
        ..one("p", "TCP", 80, TCP_PORT)
    }];
    let eps = (v4.as_slice(), v6.as_slice());
    let sticky = "  sessionAffinity: ClientIP\n";
    let etp_local = "  externalTrafficPolicy: Local\n";
    dual_stack_service_on_nodes("web", "ClusterIP", WEB, &web, "", eps)
        + &dual_stack_service_on_nodes("dns", "ClusterIP", DNS, &dns, "", eps)
        + &dual_stack_service_on_nodes("np", "NodePort", NP, &np, "", eps)
        + &dual_stack_service_on_nodes("aff", "ClusterIP", AFF, &web, sticky, eps)
        + &dual_stack_service_on_nodes("local", "NodePort", LOCAL, &local, etp_local, eps)
}

impl MigrationLab {
    /// The lab `tag` with `mode` installed (`None`: nothing yet).
    pub fn build(tag: &str, mode: Option<Impl>) -> Self {
        let ips: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
        let ips6: Vec<Ipv6Addr> = (2..=4).map(pod_ip6).collect();
        let yaml = services_yaml(&ips, &ips6);
        let path = source_file(tag, &yaml);
        let dir = path.parent().map(PathBuf::from).unwrap_or_default();
        let model = file::parse("migration.yaml", &yaml).expect("yaml").model;
        let node = NodeSettings {
            node_name: "node1".into(),
            node_ips: vec![NODE_IP.into(), NODE_IP6.into()],
            ..NodeSettings::default()
        };
        let pods: BTreeMap<IpAddr, BTreeSet<(u16, Protocol)>> = ips
            .iter()
            .map(|ip| IpAddr::V4(*ip))
            .chain(ips6.iter().map(|ip| IpAddr::V6(*ip)))
            .map(|ip| {
                (
                    ip,
                    [(TCP_PORT, Protocol::Tcp), (UDP_PORT, Protocol::Udp)].into(),
                )
            })
            .collect();
        let frontends: Vec<SocketAddr> = FAMILIES
            .into_iter()
            .flat_map(|f| [web(f), dns(f), affinity(f)])
            .collect();
        let lab = install(&LabSpec {
            mode,
            tag,
            source: &path,
            xlb: &xlb_tests::xlb_bin(),
            model: &model,
            settings: &node,
            options: &lb_userspace::emit::WriterOptions::default(),
            pods: &pods,
            frontends: &frontends,
        })
        .expect("the migration lab");
        let ext = external_client(&lab);
        Self {
            ext,
            lab,
            path,
            model,
            node,
            dir,
        }
    }

    /// The agent's flags for this lab (its services file, its node), then `extra`.
    pub fn agent_args(&self, extra: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = [
            "--source",
            &format!("file:{}", self.path.display()),
            "--pod-interfaces",
            "xv-*",
            "--node-interfaces",
            "up0",
            "--hostname-override",
            "node1",
            "--healthz-bind-address",
            "",
            "--metrics-bind-address",
            "",
            "--nodeport-addresses",
            &format!("{NODE_IP},{NODE_IP6}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    /// The namespace of the client pod, the node, the external client.
    pub fn namespaces(&self) -> [&Netns; 3] {
        [&self.lab.topo.client.ns, &self.lab.topo.node, &self.ext.ns]
    }
}

/// The external client on the node's `up0`, both families, routing the node's IPs through
/// the node.
fn external_client(lab: &Installed) -> Pod {
    let topo = &lab.topo;
    let mut ext = topo.add_external_client("up0").expect("external client");
    topo.add_external_ipv6(&mut ext, "up0", NODE6, CLIENT6)
        .expect("external IPv6");
    ext.ns
        .ip(&["route", "add", &NODE_IP.to_string(), "via", "192.0.2.1"])
        .expect("route to the node IP");
    ext.ns
        .ip(&[
            "-6",
            "route",
            "add",
            &NODE_IP6.to_string(),
            "via",
            &NODE6.to_string(),
        ])
        .expect("route to the node's IPv6");
    ext
}

/// The answers of a namespace's flows before and after a change.
pub type Rounds = Result<Result<(Round, Round), String>, String>;

/// Opens `targets` on a thread of `ns` and asks each once; then, once the sender is told
/// to go on, asks again (several rounds: the first packets after the change, and later
/// ones). Returns once the first round is done.
pub fn open_flows(ns: &Netns, targets: Targets) -> (mpsc::Sender<()>, JoinHandle<Rounds>) {
    let (go, wait) = mpsc::channel::<()>();
    let (asked, first_round) = mpsc::channel::<()>();
    let flows = ns.spawn(move || -> Result<(Round, Round), String> {
        let mut tcp = Vec::new();
        for to in &targets.tcp {
            let c = TcpStream::connect_timeout(to, TIMEOUT)
                .map_err(|e| format!("connect {to}: {e}"))?;
            c.set_read_timeout(Some(TIMEOUT))
                .map_err(|e| e.to_string())?;
            tcp.push(c);
        }
        let mut udp = Vec::new();
        for to in &targets.udp {
            let any = if to.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" };
            let u = UdpSocket::bind(any).map_err(|e| e.to_string())?;
            u.connect(to).map_err(|e| e.to_string())?;
            u.set_read_timeout(Some(TIMEOUT))
                .map_err(|e| e.to_string())?;
            udp.push(u);
        }
        let before = round(&mut tcp, &udp);
        let _ = asked.send(());
        wait.recv().map_err(|e| e.to_string())?;
        let mut after = round(&mut tcp, &udp);
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(300));
            let again = round(&mut tcp, &udp);
            if after.is_ok() {
                after = again;
            }
        }
        Ok((before, after))
    });
    // A thread that failed before its first round drops the sender: no wait either way.
    let _ = first_round.recv_timeout(Duration::from_secs(60));
    (go, flows)
}

/// A set's answers before and after a change, or why it could not ask.
pub type Outcome = Result<(Round, Round), String>;

/// Flows of several namespaces, each opened by [`open_flows`].
pub struct Flows(Vec<(&'static str, mpsc::Sender<()>, JoinHandle<Rounds>)>);

impl Flows {
    /// Opens each `(name, namespace, targets)`, one after another.
    pub fn open(sets: Vec<(&'static str, &Netns, Targets)>) -> Self {
        Self(
            sets.into_iter()
                .map(|(name, ns, t)| {
                    let (go, h) = open_flows(ns, t);
                    (name, go, h)
                })
                .collect(),
        )
    }

    /// Lets every set ask again; each set's answers before and after, or why it could
    /// not ask.
    pub fn finish(self) -> Vec<(&'static str, Outcome)> {
        for (_, go, _) in &self.0 {
            let _ = go.send(());
        }
        self.0
            .into_iter()
            .map(|(name, _, h)| {
                let rounds = h
                    .join()
                    .map_err(|_| "its thread panicked".to_string())
                    .and_then(|r| r)
                    .and_then(|r| r);
                (name, rounds)
            })
            .collect()
    }
}

/// Asserts that every set answered before and, unbroken, answered after from the same
/// backends; a failure names every set that did not.
pub fn assert_unbroken(results: &[(&'static str, Outcome)], context: &dyn Fn() -> String) {
    let mut failed = Vec::new();
    for (name, rounds) in results {
        let why = match rounds {
            Err(e) => Some(format!("{name}: {e}")),
            Ok((Err(e), _)) => Some(format!("{name}, before the change: {e}")),
            Ok((_, Err(e))) => Some(format!("{name}: a flow broke: {e}")),
            Ok((Ok(before), Ok(after))) => (after != before)
                .then(|| format!("{name}: flows moved to other backends: {before:?} → {after:?}")),
        };
        failed.extend(why);
    }
    assert!(failed.is_empty(), "{}\n{}", failed.join("\n"), context());
}
