//! The frontends a service asks for on a node (its candidates), a pure function of the
//! service, its slices and the node: per port and family, the ClusterIP, the externalIPs,
//! the LoadBalancer IPs and the NodePorts, each with the endpoints its traffic policy
//! chooses, its flags, affinity and allowed source ranges.

use lb_common::user::frontend_key;
use std::{
    net::{IpAddr, Ipv4Addr},
    sync::Arc,
};

use lb_common::{
    MAX_BACKENDS_PER_SVC, SCOPE_INTERNAL, SVC_F_DROP_EMPTY, SVC_F_SNAT_REMOTE, SVC_F_SRC_RANGES,
    SVC_F_TWO_SCOPES, SvcKey,
};

use super::{DesiredError, NodeContext};
use crate::model::{
    BackendAddr, Cidr, LbAlgorithm, Model, Protocol, Service, ServiceRef,
    node::IpFamily,
    select::{PortView, push_service_ports},
};

/// A frontend to program: its key, its object name, its backends (and whether each is on
/// this node), flags, affinity and allowed source ranges.
pub struct Candidate {
    pub key: SvcKey,
    /// The frontend's object name (`namespace/name:port`, with the frontend when it is
    /// one), whole: made once per service port and shared by its ClusterIP's candidates,
    /// the error that names it and, when it fits the name map, the desired state's name.
    pub object: Arc<str>,
    pub(super) backends: Vec<(BackendAddr, bool)>,
    pub(super) flags: u16,
    pub(super) affinity_timeout_s: u32,
    pub(super) src_ranges: Vec<(IpAddr, u8)>,
    /// Where it is reached (address, port) and over which protocol.
    pub frontend: std::net::SocketAddr,
    pub protocol: Protocol,
    /// Reached from outside the cluster (a NodePort, externalIP or LoadBalancer IP) rather
    /// than from pods (the ClusterIP).
    pub external: bool,
    /// The size of its Maglev table when its new flows pick by Maglev (`--lb-algorithm` or
    /// the Service's annotation; external frontends only, not their internal scope).
    pub(super) maglev: Option<(u32, Arc<str>)>,
}

impl Candidate {
    /// The backends it sends to.
    pub fn backend_addrs(&self) -> impl Iterator<Item = &BackendAddr> {
        self.backends.iter().map(|(b, _)| b)
    }

    /// With no backends, it drops (its traffic policy left it none) rather than rejects.
    pub fn drops_when_empty(&self) -> bool {
        self.flags & SVC_F_DROP_EMPTY != 0
    }

    /// The sources a LoadBalancer frontend admits (empty: every source).
    pub fn allowed_sources(&self) -> &[(IpAddr, u8)] {
        &self.src_ranges
    }
}

/// How a frontend is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reach {
    /// NodePort on 127.0.0.1: only the node's own sockets reach it (the socket hooks), so
    /// it always takes the cluster endpoints, as kube-proxy's local-origin traffic does.
    Loopback,
    /// ClusterIP: internalTrafficPolicy.
    Cluster,
    /// NodePort, externalIP: externalTrafficPolicy; Cluster SNATs flows to remote backends.
    External,
    /// LoadBalancer ingress IP: as External, and loadBalancerSourceRanges apply.
    LoadBalancer,
}

/// One address and port a service port is reached on, how, and the suffix its object name
/// takes (` (nodePort 10.0.0.1)`).
struct Frontend {
    ip: IpAddr,
    port: u16,
    reach: Reach,
    suffix: String,
}

/// One service port of one family on this node: what each of its frontends needs.
struct Port<'v, 'm> {
    view: &'v PortView<'m>,
    family: IpFamily,
    node: &'v NodeContext,
    node_port_addresses: &'v [IpAddr],
    /// `namespace/name:port`.
    object: Arc<str>,
}

/// The frontends service `id` of `model` asks for on `node`, in its port order (a pure
/// function of the service, its slices and the node); what cannot be programmed at all
/// (no slice) is reported in `errors`.
pub fn service_candidates(
    model: &Model,
    id: &ServiceRef,
    node: &NodeContext,
    errors: &mut Vec<DesiredError>,
) -> Vec<Candidate> {
    match model.services.get_key_value(id) {
        Some(service) => candidates_of(model, service, node, errors),
        None => Vec::new(),
    }
}

/// [`service_candidates`] of service `id` of `model`, `svc` (looked up by the caller).
pub fn candidates_of(
    model: &Model,
    (id, svc): (&ServiceRef, &Service),
    node: &NodeContext,
    errors: &mut Vec<DesiredError>,
) -> Vec<Candidate> {
    let mut candidates = Vec::new();
    let slices = model.slices.get(id);
    if slices.is_none() {
        errors.push(DesiredError::NoEndpointSlice {
            object: id.to_string(),
        });
    }
    let node_port_addresses = node.node_port_addresses();
    // One pass per family, as kube-proxy runs one proxier per family: a dual-stack Service
    // gets each family's ClusterIP with that family's endpoints.
    let mut views = Vec::new();
    for family in [IpFamily::V4, IpFamily::V6] {
        push_service_ports(slices, (id, svc), &node.node, family, &mut views);
    }
    for view in views {
        if let (true, Some(why)) = (view.cluster_ip.is_ipv6(), node.ipv6_off) {
            errors.push(DesiredError::NoIpv6 {
                object: object_name(&view),
                why,
            });
            continue;
        }
        let port = Port {
            view: &view,
            family: if view.cluster_ip.is_ipv6() {
                IpFamily::V6
            } else {
                IpFamily::V4
            },
            node,
            node_port_addresses: &node_port_addresses,
            object: object_name(&view).into(),
        };
        for f in port.frontends() {
            port.candidates(f, errors, &mut candidates);
        }
    }
    candidates
}

impl Port<'_, '_> {
    /// Where the port is reached: ClusterIP traffic follows internalTrafficPolicy;
    /// externalIPs, LoadBalancer ingress IPs (of the port's family) and NodePorts (on each of
    /// this node's NodePort addresses) follow externalTrafficPolicy.
    fn frontends(&self) -> Vec<Frontend> {
        let view = self.view;
        let fe = |ip, port, reach, suffix| Frontend {
            ip,
            port,
            reach,
            suffix,
        };
        let mut out = vec![fe(
            view.cluster_ip,
            view.port.port,
            Reach::Cluster,
            String::new(),
        )];
        let of_family = |ips: &[IpAddr]| -> Vec<IpAddr> {
            ips.iter()
                .copied()
                .filter(|ip| self.family.matches(*ip))
                .collect()
        };
        for ip in of_family(&view.external_ips) {
            let suffix = format!(" (externalIP {ip})");
            out.push(fe(ip, view.port.port, Reach::External, suffix));
        }
        for ip in of_family(&view.load_balancer_ips) {
            let suffix = format!(" (LoadBalancer {ip})");
            out.push(fe(ip, view.port.port, Reach::LoadBalancer, suffix));
        }
        let Some(node_port) = view.node_port else {
            return out;
        };
        // Each family's NodePorts on that family's NodePort addresses (kube-proxy's proxier
        // per family).
        for ip in of_family(self.node_port_addresses) {
            out.push(fe(
                ip,
                node_port,
                Reach::External,
                format!(" (nodePort {ip})"),
            ));
        }
        // 127.0.0.1 only: kube-proxy serves no NodePort on ::1 (`! -d ::1/128`).
        if self.node.socket_lb && self.family == IpFamily::V4 {
            let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
            out.push(fe(
                lo,
                node_port,
                Reach::Loopback,
                format!(" (nodePort {lo})"),
            ));
        }
        out
    }

    /// The candidate(s) of frontend `f`: its entry, and with the socket hooks on, an
    /// external frontend under a Local policy also an internal scope for the node's own
    /// sockets with every cluster endpoint.
    fn candidates(&self, f: Frontend, errors: &mut Vec<DesiredError>, out: &mut Vec<Candidate>) {
        let view = self.view;
        let object: Arc<str> = match f.suffix.is_empty() {
            true => self.object.clone(),
            false => format!("{}{}", self.object, f.suffix).into(),
        };
        let local = match f.reach {
            Reach::Cluster => view.internal_policy_local(),
            Reach::External | Reach::LoadBalancer => view.external_policy_local(),
            Reach::Loopback => false,
        };
        let backends = backends_of(view, local, &object, errors);
        let mut flags = flags(view, local, f.reach);
        let key = frontend_key(f.ip, f.port, view.protocol());
        let two_scopes = local && f.reach != Reach::Cluster && self.node.socket_lb;
        if two_scopes {
            flags |= SVC_F_TWO_SCOPES;
        }
        if f.reach == Reach::LoadBalancer && !view.source_ranges.is_empty() {
            flags |= SVC_F_SRC_RANGES;
        }
        let src_ranges = self.allowed_sources(&f);
        let affinity_timeout_s = view.affinity_timeout().unwrap_or(0);
        let frontend = std::net::SocketAddr::new(f.ip, f.port);
        let external = f.reach != Reach::Cluster;
        let lb = &self.node.lb;
        let algorithm = view.service.lb_algorithm.unwrap_or(lb.algorithm);
        let maglev = (algorithm == LbAlgorithm::Maglev
            && matches!(f.reach, Reach::External | Reach::LoadBalancer))
        .then(|| (lb.maglev_size, lb.maglev_seed.clone()));
        out.push(Candidate {
            key,
            object: object.clone(),
            backends,
            flags,
            affinity_timeout_s,
            src_ranges,
            frontend,
            protocol: view.protocol(),
            external,
            maglev,
        });
        if two_scopes {
            // The node's own sockets: every cluster endpoint (source ranges are checked
            // against the ranges of the external entry, which shares the id).
            out.push(Candidate {
                key: SvcKey {
                    scope: SCOPE_INTERNAL,
                    ..key
                },
                backends: backends_of(view, false, &object, &mut Vec::new()),
                object,
                flags: flags & SVC_F_SRC_RANGES,
                affinity_timeout_s,
                src_ranges: Vec::new(),
                frontend,
                protocol: view.protocol(),
                external,
                maglev: None,
            });
        }
    }

    /// A LoadBalancer frontend's allowed sources: the loadBalancerSourceRanges of its family
    /// (kube-proxy's proxier of that family sees only those), and when a range holds a node
    /// address, the LoadBalancer IP itself (kube-proxy: traffic the node sends to its own
    /// VIP). Empty for other frontends, and for a family without ranges (kube-proxy: no
    /// firewall for that family, every client admitted).
    fn allowed_sources(&self, f: &Frontend) -> Vec<(IpAddr, u8)> {
        let view = self.view;
        if f.reach != Reach::LoadBalancer || view.source_ranges.is_empty() {
            return Vec::new();
        }
        let mut r: Vec<(IpAddr, u8)> = view
            .source_ranges
            .iter()
            .filter(|c| self.family.matches(c.addr()))
            .map(|c| (c.addr(), c.prefix()))
            .collect();
        if self
            .node_port_addresses
            .iter()
            .any(|n| view.source_ranges.iter().any(|c| c.contains(*n)))
        {
            let host = Cidr::host(f.ip);
            r.push((host.addr(), host.prefix()));
        }
        r
    }
}

/// A frontend's drop and SNAT flags: drop when its policy leaves it no endpoints, else an
/// external frontend under the Cluster policy SNATs flows to remote backends.
fn flags(view: &PortView<'_>, local: bool, reach: Reach) -> u16 {
    if view.drops_when_empty(local) {
        SVC_F_DROP_EMPTY
    } else if !local && (reach == Reach::External || reach == Reach::LoadBalancer) {
        SVC_F_SNAT_REMOTE
    } else {
        0
    }
}

/// The backends a frontend of `view` takes: this node's endpoints (`local`) or the cluster
/// endpoints, at most `MAX_BACKENDS_PER_SVC` (more is reported in `errors`); each with
/// whether it is on this node.
fn backends_of(
    view: &PortView<'_>,
    local: bool,
    object: &str,
    errors: &mut Vec<DesiredError>,
) -> Vec<(BackendAddr, bool)> {
    let chosen = if local {
        &view.categorized.local
    } else {
        &view.categorized.cluster
    };
    let mut backends: Vec<(BackendAddr, bool)> = chosen
        .iter()
        .map(|e| {
            let addr = BackendAddr {
                ip: e.ip,
                port: e.port,
                protocol: view.protocol(),
            };
            (addr, e.local)
        })
        .collect();
    if backends.len() > MAX_BACKENDS_PER_SVC as usize {
        errors.push(DesiredError::TooManyBackends {
            object: object.to_string(),
            count: backends.len(),
            limit: MAX_BACKENDS_PER_SVC,
        });
        backends.truncate(MAX_BACKENDS_PER_SVC as usize);
    }
    backends
}

/// `namespace/name:port` of `view`, the port by name or, when it has none, by number.
fn object_name(view: &PortView<'_>) -> String {
    let port = view.port;
    if port.name.is_empty() {
        format!("{}:{}", view.name, port.port)
    } else {
        // The view's name is the same text.
        view.name.clone()
    }
}
