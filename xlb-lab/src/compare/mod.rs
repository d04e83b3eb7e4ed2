//! `xlb-compare`: the same services through each implementation, side by side. Every mode
//! gets its own lab (node namespace, a client pod, one pod per endpoint address running echo
//! servers on the endpoint ports): xlb's eBPF datapath (the agent as a process), kube-proxy's
//! iptables and nftables rules as xlb emits them (applied with iptables-restore / nft -f),
//! and kube-proxy's userspace mode (its rules plus `xlb proxy userspace`). The same flows run
//! through each, from the four origins a service proxy serves: the client pod and the node
//! itself, each to ClusterIPs and to NodePorts on the node's address. Every flow's client is
//! an `xlb-probe flows` process in the pod's or the node's namespace; in xlb's labs it runs in
//! the cgroup the socket hooks are attached to (a lab cgroup, never the root). xlb runs
//! twice: with `--socket-lb all` (every socket through the hooks) and `--socket-lb host`
//! (the pod's packets through tc). The report shows which backends each mode reached, or
//! whether it refused or dropped, and where modes disagree.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::{Path, PathBuf},
    time::Duration,
};

use lb_userspace::{
    emit::{self, Mode},
    model::{Cidr, IpFamily, Model, NodeSettings, Protocol, select},
    source::file,
};
use thiserror::Error;

use crate::{
    probe::{self, REQUEST_TIMEOUT},
    process::run_client,
};

mod lab;
mod report;

pub use lab::{Installed, LabSpec, install, install_rules, route_to_void};
pub use report::{Counts, Outcome, Report, outcomes_agree};

/// The implementations compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Impl {
    /// xlb as deployed by default (`--socket-lb all`): every client's socket, the pod's and
    /// the node's, is translated at connect by the socket hooks.
    Ebpf,
    /// xlb with `--socket-lb host`: the node's sockets through the hooks, the pod's packets
    /// through the tc program.
    EbpfHost,
    /// kube-proxy in one of its modes, as xlb emits it (ipvs is not run: it needs the IPVS
    /// kernel modules).
    KubeProxy(Mode),
}

impl Impl {
    pub const ALL: [Impl; 5] = [
        Impl::Ebpf,
        Impl::EbpfHost,
        Impl::KubeProxy(Mode::Iptables),
        Impl::KubeProxy(Mode::Nftables),
        Impl::KubeProxy(Mode::Userspace),
    ];

    /// The mode's name in the report for `flow`; xlb's names the path that serves it
    /// (SCTP has no socket hooks: tc ingress for a pod, tc egress for the node).
    pub fn label(self, flow: &Flow) -> String {
        let sctp = flow.protocol == Protocol::Sctp;
        match (self, flow.origin) {
            (Impl::Ebpf | Impl::EbpfHost, Origin::Node) if sctp => {
                format!("{} (tc egress)", self.name())
            }
            (Impl::Ebpf | Impl::EbpfHost, Origin::Pod) if sctp => format!("{} (tc)", self.name()),
            (Impl::EbpfHost, Origin::Pod) => format!("{} (tc)", self.name()),
            (Impl::Ebpf | Impl::EbpfHost, _) => format!("{} (socket hooks)", self.name()),
            _ => self.name().to_string(),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Impl::Ebpf => "xlb-ebpf",
            Impl::EbpfHost => "xlb-ebpf-host",
            Impl::KubeProxy(m) => m.name(),
        }
    }

    /// Whether the mode serves `flow`: kube-proxy's userspace mode (and `xlb proxy
    /// userspace`) is IPv4 TCP and UDP only; every other mode serves both families and
    /// SCTP.
    pub fn serves(self, flow: &Flow) -> bool {
        self != Impl::KubeProxy(Mode::Userspace)
            || (flow.frontend.is_ipv4() && flow.protocol != Protocol::Sctp)
    }

    /// xlb's `--socket-lb` for this mode; `None` for kube-proxy's modes.
    fn socket_lb(self) -> Option<&'static str> {
        match self {
            Impl::Ebpf => Some("all"),
            Impl::EbpfHost => Some("host"),
            _ => None,
        }
    }
}

/// Where a flow starts (the article's four origins are these two, to each frontend kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Origin {
    /// The client pod.
    Pod,
    /// The node itself: a process in the node namespace.
    Node,
}

impl Origin {
    pub const ALL: [Origin; 2] = [Origin::Pod, Origin::Node];

    pub fn name(self) -> &'static str {
        match self {
            Origin::Pod => "pod",
            Origin::Node => "node",
        }
    }
}

/// The kind of frontend a flow goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Frontend {
    ClusterIp,
    /// A NodePort on the lab node's address.
    NodePort,
}

impl Frontend {
    pub fn name(self) -> &'static str {
        match self {
            Frontend::ClusterIp => "ClusterIP",
            Frontend::NodePort => "NodePort",
        }
    }
}

/// One flow: a client (in the pod or on the node) to a ClusterIP or NodePort frontend.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Flow {
    pub service: String,
    pub kind: Frontend,
    pub frontend: SocketAddr,
    pub protocol: Protocol,
    pub origin: Origin,
    /// ClientIP affinity services: the backends (`ip:port`) a flow may stick to (the port's
    /// endpoints under either traffic policy). A mode agrees when it answered from exactly
    /// one of them; `None` without affinity (the backend sets must be equal).
    pub eligible: Option<BTreeSet<String>>,
}

impl Flow {
    /// The flow's target as `xlb client flows` takes it: `tcp/IP:PORT`, `udp/IP:PORT` or
    /// `sctp/IP:PORT`.
    pub fn target(&self) -> String {
        format!("{}/{}", self.protocol.lower(), self.frontend)
    }
}

/// Parses [`Flow::target`].
pub(crate) fn parse_target(text: &str) -> Result<(Protocol, SocketAddr), String> {
    let (proto, addr) = text
        .split_once('/')
        .ok_or_else(|| format!("{text:?}: expected PROTO/IP:PORT (tcp, udp or sctp)"))?;
    let protocol = match proto {
        "tcp" => Protocol::Tcp,
        "udp" => Protocol::Udp,
        "sctp" => Protocol::Sctp,
        other => {
            return Err(format!(
                "{text:?}: protocol {other:?} is not tcp, udp or sctp"
            ));
        }
    };
    let addr = addr.parse().map_err(|e| format!("{text:?}: {e}"))?;
    Ok((protocol, addr))
}

#[derive(Debug, Error)]
pub enum CompareError {
    #[error(transparent)]
    Source(#[from] lb_userspace::source::SourceError),
    #[error("{mode}: {reason}")]
    Mode { mode: &'static str, reason: String },
}

/// What to compare.
#[derive(Clone, Debug)]
pub struct CompareOptions {
    pub source: PathBuf,
    /// This node's name when the file has no TestConfig header.
    pub node_name: String,
    pub requests: usize,
    pub modes: Vec<Impl>,
    /// The `xlb` binary (the agent, the userspace proxy, the client processes).
    pub xlb: PathBuf,
    /// A tag unique to this run (namespace, pin and cgroup names embed it).
    pub tag: String,
}

/// The node's address in every lab when the input names none: NodePorts are served there
/// (kube-proxy's nodePortAddresses, xlb's `--nodeport-addresses`), on the node's `lo`.
pub const LAB_NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// The node's IPv6 address in every lab when the input names none (IPv6 NodePorts).
pub const LAB_NODE_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0x10, 1);

/// The families kube-proxy runs a proxier for, in the order flows are listed.
pub const FAMILIES: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

/// `settings` as the proxier of `family` sees them (kube-proxy runs one per family, on the
/// same node settings).
pub fn for_family(settings: &NodeSettings, family: IpFamily) -> NodeSettings {
    NodeSettings {
        family,
        ..settings.clone()
    }
}

/// The address NodePort flows of `settings.family` go to: the first address other than
/// loopback that nodePortAddresses selects, else the node IP; `None` when the settings name
/// neither.
pub fn node_port_ip(settings: &NodeSettings) -> Option<IpAddr> {
    match settings.node_port_ips() {
        Some(ips) => ips.into_iter().find(|ip| !ip.is_loopback()),
        None => settings.node_ip().filter(|ip| !ip.is_loopback()),
    }
}

/// For each ClientIP-affinity service port (`ns/name:port` or `ns/name`, protocol) of
/// `model` on `settings`' node: the endpoints it may send to under either traffic policy.
fn affinity_backends(
    model: &Model,
    settings: &NodeSettings,
) -> BTreeMap<(String, Protocol), BTreeSet<String>> {
    select::service_ports(model, settings)
        .into_iter()
        .filter(|pv| pv.affinity_timeout().is_some())
        .map(|pv| {
            let c = &pv.categorized;
            let eligible = c.cluster.iter().chain(&c.local).map(|e| e.to_string());
            ((pv.name.clone(), pv.protocol()), eligible.collect())
        })
        .collect()
}

/// The flows of `model` (TCP, UDP and SCTP, both families) on `settings`' node: each ClusterIP
/// port, and each NodePort on the family's [`node_port_ip`], from the pod and from the node.
pub fn flows(model: &Model, settings: &NodeSettings) -> Vec<Flow> {
    let mut out = Vec::new();
    for family in FAMILIES {
        let settings = for_family(settings, family);
        family_flows(model, &settings, &mut out);
    }
    out
}

/// [`flows`] of the family of `settings`.
fn family_flows(model: &Model, settings: &NodeSettings, out: &mut Vec<Flow>) {
    let affinity = affinity_backends(model, settings);
    let node_port_ip = node_port_ip(settings);
    for (id, svc) in &model.services {
        for ip in svc
            .cluster_ips
            .iter()
            .filter(|ip| settings.family.matches(**ip))
        {
            for p in &svc.ports {
                let service = if p.name.is_empty() {
                    id.to_string()
                } else {
                    format!("{id}:{}", p.name)
                };
                let mut frontends = vec![(Frontend::ClusterIp, SocketAddr::new(*ip, p.port))];
                if let (Some(np), Some(nip)) = (p.node_port, node_port_ip) {
                    frontends.push((Frontend::NodePort, SocketAddr::new(nip, np)));
                }
                for (kind, frontend) in frontends {
                    out.extend(Origin::ALL.map(|origin| Flow {
                        service: service.clone(),
                        kind,
                        frontend,
                        protocol: p.protocol,
                        origin,
                        eligible: affinity.get(&(service.clone(), p.protocol)).cloned(),
                    }));
                }
            }
        }
    }
}

/// Every endpoint address (both families) and the ports it serves, with their protocols.
fn endpoints(model: &Model) -> BTreeMap<IpAddr, BTreeSet<(u16, Protocol)>> {
    let mut out: BTreeMap<IpAddr, BTreeSet<(u16, Protocol)>> = BTreeMap::new();
    for slice in model.slices.values().flat_map(|s| s.values()) {
        for ep in &slice.endpoints {
            out.entry(ep.address)
                .or_default()
                .extend(slice.ports.iter().map(|p| (p.port, p.protocol)));
        }
    }
    out
}

/// The node settings every lab uses: the file's TestConfig, else this node's name and
/// [`LAB_NODE_IP`] and [`LAB_NODE_IP6`] as node IPs and only NodePort addresses.
fn lab_settings(loaded: &lb_userspace::source::Snapshot, node_name: &str) -> NodeSettings {
    match &loaded.test_config {
        Some(t) => t.settings.clone(),
        None => {
            let ips = [IpAddr::V4(LAB_NODE_IP), IpAddr::V6(LAB_NODE_IP6)];
            NodeSettings {
                node_name: node_name.to_string(),
                node_ips: ips.to_vec(),
                local_addresses: ips.to_vec(),
                node_port_addresses: ips.map(Cidr::host).to_vec(),
                ..NodeSettings::default()
            }
        }
    }
}

/// The writer options every lab uses: the file's TestConfig's, without nfacct counters
/// (the lab's namespaces have no nfacct objects; kube-proxy creates them at start).
pub fn lab_options(loaded: &lb_userspace::source::Snapshot) -> emit::WriterOptions {
    let mut options = loaded
        .test_config
        .as_ref()
        .map(|t| t.options.clone())
        .unwrap_or_default();
    options.host.nfacct_invalid_dropped = false;
    options.host.nfacct_localhost_nodeports = false;
    options
}

/// Runs every mode and returns the report.
pub fn compare(opts: &CompareOptions) -> Result<Report, CompareError> {
    let loaded = file::load(&opts.source)?;
    let settings = lab_settings(&loaded, &opts.node_name);
    let options = lab_options(&loaded);
    let flows = flows(&loaded.model, &settings);
    let mut report = Report {
        flows: flows.iter().map(|f| (f.clone(), BTreeMap::new())).collect(),
        counters: BTreeMap::new(),
    };
    for (i, mode) in opts.modes.iter().enumerate() {
        let tag = format!("{}{i}", opts.tag);
        let (outcomes, counters) = run_mode(
            *mode,
            &tag,
            opts,
            &loaded.model,
            (&settings, &options),
            &flows,
        )
        .map_err(|reason| CompareError::Mode {
            mode: mode.name(),
            reason,
        })?;
        for ((_, by), o) in report.flows.iter_mut().zip(outcomes) {
            if let Some(o) = o {
                by.insert(*mode, o);
            }
        }
        if let Some(c) = counters {
            report.counters.insert(*mode, c);
        }
    }
    Ok(report)
}

/// Runs `flows` through a lab of `mode`: their outcomes (`None` for a flow the mode does
/// not serve, [`Impl::serves`]), and xlb's counters after them.
fn run_mode(
    mode: Impl,
    tag: &str,
    opts: &CompareOptions,
    model: &Model,
    (settings, options): (&NodeSettings, &emit::WriterOptions),
    flows: &[Flow],
) -> Result<(Vec<Option<Outcome>>, Option<Counts>), String> {
    let frontends: Vec<SocketAddr> = flows.iter().map(|f| f.frontend).collect();
    let lab = install(&LabSpec {
        mode: Some(mode),
        tag,
        source: &opts.source,
        xlb: &opts.xlb,
        model,
        settings,
        options,
        pods: &endpoints(model),
        frontends: &frontends,
    })?;
    let requests = opts.requests.max(1);
    let mut outcomes = vec![None; flows.len()];
    for origin in Origin::ALL {
        let (index, targets): (Vec<usize>, Vec<String>) = flows
            .iter()
            .enumerate()
            .filter(|(_, f)| f.origin == origin && mode.serves(f))
            .map(|(i, f)| (i, f.target()))
            .unzip();
        if index.is_empty() {
            continue;
        }
        let got = run_flows(&lab, &opts.xlb, origin, requests, targets)?;
        for (i, o) in index.into_iter().zip(got) {
            outcomes[i] = Some(o);
        }
    }
    let failed = lab.server_failures();
    if !failed.is_empty() {
        return Err(format!(
            "the lab's SCTP servers' sockets refused packets, so its outcomes say nothing of the mode: {}",
            failed.join("; ")
        ));
    }
    Ok((outcomes, lab.counters()))
}

/// Runs one origin's flows (`targets`) from an `xlb client flows` process in its namespace
/// (in xlb's labs, in the cgroup the socket hooks are attached to); one outcome per target.
fn run_flows(
    lab: &Installed,
    xlb: &Path,
    origin: Origin,
    requests: usize,
    targets: Vec<String>,
) -> Result<Vec<Outcome>, String> {
    let count = targets.len();
    let mut args = vec![
        "flows".to_string(),
        "--requests".into(),
        requests.to_string(),
    ];
    args.extend(targets);
    let limit = Duration::from_secs(10) + 2 * REQUEST_TIMEOUT * (requests * count) as u32;
    let out = run_client(
        &probe::bin_beside(xlb),
        lab.namespace(origin),
        lab.cgroup.as_ref(),
        &args,
        limit,
    )?;
    let outcomes = out
        .lines()
        .map(str::parse)
        .collect::<Result<Vec<Outcome>, String>>()?;
    if outcomes.len() != count {
        return Err(format!(
            "{} client: {} lines for {count} flows:\n{out}",
            origin.name(),
            outcomes.len()
        ));
    }
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affinity_flows_carry_the_ports_endpoints_as_eligible() {
        let yaml = "apiVersion: v1\nkind: Service\nmetadata: {namespace: t, name: s}\nspec:\n  clusterIP: 10.96.0.40\n  sessionAffinity: ClientIP\n  ports:\n  - {name: p, port: 80, protocol: TCP}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {namespace: t, name: s-1, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nports:\n- {name: p, port: 8080, protocol: TCP}\nendpoints:\n- {addresses: [10.244.2.2], conditions: {ready: true}, nodeName: node1}\n- {addresses: [10.244.3.2], conditions: {ready: false}, nodeName: node1}\n";
        let loaded = file::parse("aff.yaml", yaml).expect("yaml");
        let settings = lab_settings(&loaded, "node1");
        let got = flows(&loaded.model, &settings);
        assert_eq!(got.len(), 2);
        for f in got {
            assert_eq!(f.eligible, Some(["10.244.2.2:8080".to_string()].into()));
        }
    }

    #[test]
    fn a_flow_target_survives_its_text() {
        let flow = Flow {
            service: "demo/web:dns".into(),
            kind: Frontend::NodePort,
            frontend: "10.0.0.1:30053".parse().expect("addr"),
            protocol: Protocol::Udp,
            origin: Origin::Node,
            eligible: None,
        };
        assert_eq!(
            parse_target(&flow.target()),
            Ok((Protocol::Udp, flow.frontend))
        );
        assert!(parse_target("icmp/10.0.0.1:1").is_err());
        assert_eq!(
            parse_target("sctp/10.0.0.1:38412"),
            Ok((Protocol::Sctp, "10.0.0.1:38412".parse().expect("addr")))
        );
    }

    #[test]
    fn node_ports_are_flows_from_both_origins_on_the_node_address() {
        let yaml = "apiVersion: v1\nkind: Service\nmetadata: {namespace: t, name: np}\nspec:\n  type: NodePort\n  clusterIP: 10.96.0.20\n  ports:\n  - {name: p, port: 80, protocol: TCP, nodePort: 30080}\n";
        let loaded = file::parse("np.yaml", yaml).expect("yaml");
        let settings = lab_settings(&loaded, "node1");
        assert_eq!(node_port_ip(&settings), Some(IpAddr::V4(LAB_NODE_IP)));
        let got: Vec<(Frontend, String, Origin)> = flows(&loaded.model, &settings)
            .into_iter()
            .map(|f| (f.kind, f.frontend.to_string(), f.origin))
            .collect();
        assert_eq!(
            got,
            [
                (Frontend::ClusterIp, "10.96.0.20:80".into(), Origin::Pod),
                (Frontend::ClusterIp, "10.96.0.20:80".into(), Origin::Node),
                (Frontend::NodePort, "10.0.0.1:30080".into(), Origin::Pod),
                (Frontend::NodePort, "10.0.0.1:30080".into(), Origin::Node),
            ]
        );
    }

    #[test]
    fn dual_stack_services_give_flows_of_both_families_with_their_node_ports() {
        let yaml = "apiVersion: v1\nkind: Service\nmetadata: {namespace: t, name: ds}\nspec:\n  type: NodePort\n  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv6, IPv4]\n  clusterIP: fd00:10:96::20\n  clusterIPs: [fd00:10:96::20, 10.96.0.20]\n  ports:\n  - {name: p, port: 80, protocol: TCP, nodePort: 30080}\n";
        let loaded = file::parse("ds.yaml", yaml).expect("yaml");
        let settings = lab_settings(&loaded, "node1");
        let got: Vec<(Frontend, String)> = flows(&loaded.model, &settings)
            .into_iter()
            .filter(|f| f.origin == Origin::Pod)
            .map(|f| (f.kind, f.frontend.to_string()))
            .collect();
        assert_eq!(
            got,
            [
                (Frontend::ClusterIp, "10.96.0.20:80".into()),
                (Frontend::NodePort, "10.0.0.1:30080".into()),
                (Frontend::ClusterIp, "[fd00:10:96::20]:80".into()),
                (Frontend::NodePort, "[fd00::10:1]:30080".into()),
            ]
        );
        let v6 = flows(&loaded.model, &settings)
            .into_iter()
            .find(|f| f.frontend.is_ipv6());
        let v6 = v6.expect("an IPv6 flow");
        assert!(!Impl::KubeProxy(Mode::Userspace).serves(&v6));
        assert!(Impl::Ebpf.serves(&v6) && Impl::KubeProxy(Mode::Nftables).serves(&v6));
    }
}
