//! The lab the migration tests share (`takeover`, `hand_back`): a ClusterIP TCP Service, a
//! ClusterIP UDP one and a NodePort, each on three backend pods; the node's IP on its `lo`;
//! kube-proxy's rules of a mode, or nothing yet.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, TcpStream, UdpSocket},
    path::PathBuf,
    sync::mpsc,
    thread::JoinHandle,
    time::Duration,
};

use lb_userspace::{
    model::{Model, NodeSettings},
    source::file,
};
use xlb_lab::compare::{Impl, Installed, LabSpec, install};
use xlb_tests::{
    client::{ask_tcp, ask_udp},
    scenario::{TCP_PORT, UDP_PORT, sock},
    services::{service_yaml, source_file},
    topology::pod_ip,
};

pub const WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
pub const DNS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 53);
/// The node's IP (on its `lo`): NodePorts are served there.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
pub const NODE_PORT: u16 = 30080;
pub const TIMEOUT: Duration = Duration::from_secs(3);

/// The backends that answered each TCP connection and each UDP socket, one round.
pub type Round = Result<(Vec<String>, Vec<String>), String>;

pub fn round(tcp: &mut [TcpStream], udp: &[UdpSocket]) -> Round {
    let t = tcp
        .iter_mut()
        .map(|c| {
            let ends = format!("{:?} → {:?}", c.local_addr(), c.peer_addr());
            ask_tcp(c).map_err(|e| format!("{ends}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let u = udp.iter().map(ask_udp).collect::<Result<Vec<_>, _>>()?;
    Ok((t, u))
}

/// A lab of the migration tests, with its services file (removed on drop).
pub struct MigrationLab {
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

impl MigrationLab {
    /// The lab `tag` with `mode` installed (`None`: nothing yet).
    pub fn build(tag: &str, mode: Option<Impl>) -> Self {
        let ips: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
        let mut yaml = service_yaml("web", WEB, 80, "TCP", TCP_PORT, &ips)
            + &service_yaml("dns", DNS, 53, "UDP", UDP_PORT, &ips);
        yaml.push_str(&format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: test, name: np}}\nspec:\n  type: NodePort\n  clusterIP: 10.96.0.20\n  ports: [{{name: p, port: 80, protocol: TCP, targetPort: {TCP_PORT}, nodePort: {NODE_PORT}}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{namespace: test, name: np-1, labels: {{kubernetes.io/service-name: np}}}}\naddressType: IPv4\nports: [{{name: p, port: {TCP_PORT}, protocol: TCP}}]\nendpoints:\n"
        ));
        for ip in &ips {
            yaml.push_str(&format!(
                "- {{addresses: [{ip}], conditions: {{ready: true}}}}\n"
            ));
        }
        let path = source_file(tag, &yaml);
        let dir = path.parent().map(PathBuf::from).unwrap_or_default();
        let model = file::parse("migration.yaml", &yaml).expect("yaml").model;
        let node = NodeSettings {
            node_name: "node1".into(),
            node_ips: vec![NODE_IP.into()],
            ..NodeSettings::default()
        };
        let pods: BTreeMap<IpAddr, BTreeSet<u16>> = ips
            .iter()
            .map(|ip| (IpAddr::V4(*ip), [TCP_PORT, UDP_PORT].into()))
            .collect();
        let frontends = [sock(WEB, 80), sock(DNS, 53)];
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
        Self {
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
            "--hostname-override",
            "node1",
            "--healthz-bind-address",
            "",
            "--metrics-bind-address",
            "",
            "--nodeport-addresses",
            &NODE_IP.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }
}

/// The answers of a client's flows before and after a change.
pub type Rounds = Result<Result<(Round, Round), String>, String>;

/// The client pod's flows: `streams` TCP connections to the ClusterIP, `node_port_streams`
/// to the NodePort, `udp_flows` connected UDP sockets to the UDP ClusterIP, opened and
/// asked once on a thread of the pod's namespace, then asked again (several rounds: the
/// first packets after the change, and later ones) once the sender is told to go on.
/// Returns once the first round is done.
pub fn pod_flows(
    lab: &Installed,
    streams: usize,
    node_port_streams: usize,
    udp_flows: usize,
) -> (mpsc::Sender<()>, JoinHandle<Rounds>) {
    let (go, wait) = mpsc::channel::<()>();
    let (asked, first_round) = mpsc::channel::<()>();
    let client =
        lab.topo
            .client
            .ns
            .spawn(move || -> Result<(Round, Round), String> {
                let mut tcp = Vec::new();
                let targets = std::iter::repeat_n(sock(WEB, 80), streams).chain(
                    std::iter::repeat_n(sock(NODE_IP, NODE_PORT), node_port_streams),
                );
                for to in targets {
                    let c = TcpStream::connect_timeout(&to, TIMEOUT)
                        .map_err(|e| format!("connect {to}: {e}"))?;
                    c.set_read_timeout(Some(TIMEOUT))
                        .map_err(|e| e.to_string())?;
                    tcp.push(c);
                }
                let mut udp = Vec::new();
                for _ in 0..udp_flows {
                    let u = UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
                    u.connect(sock(DNS, 53)).map_err(|e| e.to_string())?;
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
    (go, client)
}
