//! kube-proxy's view of one service port on one node: the addresses of the proxier's family
//! and its endpoint choice (kube-proxy's `CategorizeEndpoints`), computed once so every writer agrees.
//!
//! * cluster endpoints: ready ones (narrowed by topology hints when every ready endpoint
//!   has hints and one matches this node), else serving-and-terminating ones anywhere;
//! * local endpoints: local ready ones, else local serving-and-terminating ones;
//! * "all reachable" endpoints (those that get a per-endpoint chain): the union.

use std::{collections::BTreeMap, fmt, net::IpAddr};

use super::{
    Cidr, Model, Name, Protocol, Service, ServicePort, ServiceRef, ServiceType, SessionAffinity,
    Slices, TrafficPolicy,
    node::{IpFamily, NodeSettings},
};

/// One endpoint of a service port, with its conditions and locality.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointView {
    pub ip: IpAddr,
    pub port: u16,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// On this node (`nodeName` equals the node's name).
    pub local: bool,
    pub zone_hints: Vec<Name>,
    pub node_hints: Vec<Name>,
}

impl EndpointView {
    /// Serving and terminating: the fallback when nothing is ready.
    pub fn serving_terminating(&self) -> bool {
        self.serving && self.terminating
    }
}

impl fmt::Display for EndpointView {
    /// `ip:port`, `[ip6]:port` for IPv6: kube-proxy's endpoint identity.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            IpAddr::V4(ip) => write!(f, "{ip}:{}", self.port),
            IpAddr::V6(ip) => write!(f, "[{ip}]:{}", self.port),
        }
    }
}

/// The endpoints of `port` of `svc` for one family: from every slice of the service whose
/// port matches by name and protocol, first address only, deduplicated by `ip:port` (a
/// ready copy wins over a not-ready one) and sorted by that string, as kube-proxy does.
/// `node_name` decides locality (`None`: nothing is local).
pub fn port_endpoints(
    model: &Model,
    svc: &ServiceRef,
    port: &ServicePort,
    family: IpFamily,
    node_name: Option<&str>,
) -> Vec<EndpointView> {
    slices_endpoints(model.slices.get(svc), port, family, node_name)
}

/// [`port_endpoints`] of a service's slices (looked up once by the caller).
fn slices_endpoints(
    slices: Option<&Slices>,
    port: &ServicePort,
    family: IpFamily,
    node_name: Option<&str>,
) -> Vec<EndpointView> {
    // Each endpoint with its `ip:port` text in a buffer of its own (no string allocated),
    // sorted by it (stable: the first of equal ones first), then one of each kept.
    let mut keyed: Vec<(EndpointId, EndpointView)> = Vec::new();
    for slice in slices.into_iter().flat_map(|s| s.values()) {
        let Some(ep_port) = slice
            .ports
            .iter()
            .find(|p| p.name == port.name && p.protocol == port.protocol)
        else {
            continue;
        };
        keyed.reserve(slice.endpoints.len());
        for ep in &slice.endpoints {
            let ip = ep.address;
            if !family.matches(ip) {
                continue;
            }
            let view = EndpointView {
                ip,
                port: ep_port.port,
                ready: ep.ready,
                serving: ep.serving,
                terminating: ep.terminating,
                local: matches!((node_name, ep.node_name().map(|n| &**n)), (Some(n), Some(e)) if !n.is_empty() && n == e),
                zone_hints: ep.zone_hints().to_vec(),
                node_hints: ep.node_hints().to_vec(),
            };
            keyed.push((EndpointId::of(ip, ep_port.port), view));
        }
    }
    keyed.sort_by_key(|(id, _)| *id);
    let mut out: Vec<EndpointView> = Vec::with_capacity(keyed.len());
    let mut last: Option<EndpointId> = None;
    for (id, view) in keyed {
        if last.as_ref() != Some(&id) {
            out.push(view);
            last = Some(id);
        } else if let Some(kept) = out.last_mut()
            && !kept.ready
            && view.ready
        {
            // The first ready copy wins over a not-ready one.
            *kept = view;
        }
    }
    out
}

/// An endpoint's identity `ip:port` (`[ip6]:port`) as [`EndpointView`] displays it, in a
/// buffer of its own; ordered as that text.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct EndpointId {
    /// The text, then zeros (which order below every character of it).
    text: [u8; 56],
}

impl EndpointId {
    fn of(ip: IpAddr, port: u16) -> Self {
        let mut w = IdWriter {
            text: [0; 56],
            len: 0,
        };
        match ip {
            IpAddr::V4(ip) => {
                for (i, o) in ip.octets().into_iter().enumerate() {
                    if i > 0 {
                        w.push(b'.');
                    }
                    w.decimal(o.into());
                }
                w.push(b':');
                w.decimal(port.into());
            }
            IpAddr::V6(ip) => {
                // A write into the buffer cannot fail (it is long enough for any address).
                let _ = fmt::Write::write_fmt(&mut w, format_args!("[{ip}]:{port}"));
            }
        }
        Self { text: w.text }
    }
}

/// Writes an [`EndpointId`]'s text.
struct IdWriter {
    text: [u8; 56],
    len: usize,
}

impl IdWriter {
    fn push(&mut self, b: u8) {
        if let Some(c) = self.text.get_mut(self.len) {
            *c = b;
            self.len += 1;
        }
    }

    /// `n` in decimal.
    fn decimal(&mut self, n: u32) {
        let mut digits = [0u8; 10];
        let mut i = digits.len();
        let mut n = n;
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        for &d in &digits[i..] {
            self.push(d);
        }
    }
}

impl fmt::Write for IdWriter {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        s.bytes().for_each(|b| self.push(b));
        Ok(())
    }
}

/// Which endpoint lists a service port needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Uses {
    pub cluster: bool,
    pub local: bool,
}

/// Where this node is, for topology hints.
#[derive(Clone, Copy, Debug)]
pub struct Topology<'a> {
    pub node_name: &'a str,
    pub zone: Option<&'a str>,
}

/// kube-proxy's endpoint categories for one service port.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Categorized {
    /// Endpoints for Cluster traffic policy.
    pub cluster: Vec<EndpointView>,
    /// Endpoints for Local traffic policy.
    pub local: Vec<EndpointView>,
    /// Which list [`Categorized::all_reachable`] is.
    reachable: Reachable,
    /// A usable (ready, or serving and terminating) endpoint exists anywhere.
    pub has_any: bool,
}

/// The union of the cluster and local endpoints: most often one of them (not a copy).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum Reachable {
    #[default]
    Cluster,
    Local,
    Union(Vec<EndpointView>),
}

impl Categorized {
    /// Union of the cluster and local endpoints, in `ip:port` order: the endpoints that
    /// get per-endpoint rules.
    pub fn all_reachable(&self) -> &[EndpointView] {
        match &self.reachable {
            Reachable::Cluster => &self.cluster,
            Reachable::Local => &self.local,
            Reachable::Union(u) => u,
        }
    }
}

/// How topology hints narrow the ready endpoints: `None` when they are not used.
fn topology_filter(eps: &[EndpointView], topo: Option<Topology<'_>>) -> Option<TopoFilter> {
    let topo = topo?;
    let ready: Vec<&EndpointView> = eps.iter().filter(|e| e.ready).collect();
    if ready.is_empty() {
        return None;
    }
    if ready.iter().all(|e| !e.node_hints.is_empty())
        && ready
            .iter()
            .any(|e| e.node_hints.iter().any(|n| **n == *topo.node_name))
    {
        return Some(TopoFilter::Node(topo.node_name.to_string()));
    }
    let zone = topo.zone?;
    if ready.iter().all(|e| !e.zone_hints.is_empty())
        && ready
            .iter()
            .any(|e| e.zone_hints.iter().any(|z| **z == *zone))
    {
        return Some(TopoFilter::Zone(zone.to_string()));
    }
    None
}

enum TopoFilter {
    Node(String),
    Zone(String),
}

impl TopoFilter {
    fn keeps(&self, e: &EndpointView) -> bool {
        match self {
            TopoFilter::Node(n) => e.node_hints.iter().any(|h| **h == **n),
            TopoFilter::Zone(z) => e.zone_hints.iter().any(|h| **h == **z),
        }
    }
}

/// Splits `eps` (already in `ip:port` order) into kube-proxy's categories.
pub fn categorize(eps: &[EndpointView], uses: Uses, topo: Option<Topology<'_>>) -> Categorized {
    let mut out = Categorized::default();
    let mut used_topology = false;
    if uses.cluster {
        let filter = topology_filter(eps, topo);
        used_topology = filter.is_some();
        out.cluster = eps
            .iter()
            .filter(|e| e.ready && filter.as_ref().is_none_or(|f| f.keeps(e)))
            .cloned()
            .collect();
        if out.cluster.is_empty() {
            out.cluster = eps
                .iter()
                .filter(|e| e.serving_terminating())
                .cloned()
                .collect();
        }
        out.has_any = !out.cluster.is_empty();
    }
    if !uses.local {
        out.reachable = Reachable::Cluster;
        return out;
    }
    let mut local_ready = false;
    let mut local_terminating = false;
    for e in eps {
        if e.ready {
            out.has_any = true;
            local_ready |= e.local;
        } else if e.serving_terminating() {
            out.has_any = true;
            local_terminating |= e.local;
        }
    }
    let mut used_terminating = false;
    if local_ready {
        out.local = eps.iter().filter(|e| e.local && e.ready).cloned().collect();
    } else if local_terminating {
        used_terminating = true;
        out.local = eps
            .iter()
            .filter(|e| e.local && e.serving_terminating())
            .cloned()
            .collect();
    }
    if !uses.cluster {
        out.reachable = Reachable::Local;
        return out;
    }
    if !used_topology && !used_terminating {
        out.reachable = Reachable::Cluster;
        return out;
    }
    let mut union: BTreeMap<String, EndpointView> = BTreeMap::new();
    for e in out.cluster.iter().chain(out.local.iter()) {
        union.insert(e.to_string(), e.clone());
    }
    out.reachable = Reachable::Union(union.into_values().collect());
    out
}

/// A service port as one proxier sees it: the addresses of its family, its policies and
/// its endpoint categories.
#[derive(Clone, Debug)]
pub struct PortView<'a> {
    pub service: &'a Service,
    pub port: &'a ServicePort,
    /// `ns/name:port`, or `ns/name` when the port has no name.
    pub name: String,
    pub cluster_ip: IpAddr,
    pub external_ips: Vec<IpAddr>,
    pub load_balancer_ips: Vec<IpAddr>,
    pub source_ranges: Vec<Cidr>,
    /// The nodePort (0 or absent = none).
    pub node_port: Option<u16>,
    /// Only for LoadBalancer services with externalTrafficPolicy Local.
    pub health_check_node_port: Option<u16>,
    /// Every endpoint of the port (any condition), in `ip:port` order.
    pub endpoints: Vec<EndpointView>,
    pub categorized: Categorized,
}

impl PortView<'_> {
    /// The protocol.
    pub fn protocol(&self) -> Protocol {
        self.port.protocol
    }

    /// NodePort, externalIPs or LoadBalancer IPs exist.
    pub fn externally_accessible(&self) -> bool {
        self.node_port.is_some()
            || !self.external_ips.is_empty()
            || !self.load_balancer_ips.is_empty()
    }

    /// externalTrafficPolicy Local on an externally accessible port.
    pub fn external_policy_local(&self) -> bool {
        self.service.external_traffic_policy == TrafficPolicy::Local && self.externally_accessible()
    }

    /// internalTrafficPolicy Local.
    pub fn internal_policy_local(&self) -> bool {
        self.service.internal_traffic_policy == TrafficPolicy::Local
    }

    /// kube-proxy's verdict for a new connection that a policy leaves without endpoints
    /// (`local`: the policy that applies is Local): dropped ("has no local endpoints") when
    /// usable endpoints exist elsewhere, refused ("has no endpoints") when there are none at
    /// all, whatever the policy.
    pub fn drops_when_empty(&self, local: bool) -> bool {
        local && self.categorized.has_any
    }

    /// Traffic of some kind uses the cluster endpoints: internal traffic under Cluster
    /// policy, or any externally accessible port (kube-proxy's `UsesClusterEndpoints`: even
    /// with externalTrafficPolicy Local, pods' and the node's own traffic to an external
    /// frontend short-circuits to the cluster endpoints).
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_policy_local() || self.externally_accessible()
    }

    /// Traffic of some kind uses the local endpoints.
    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_policy_local() || self.external_policy_local()
    }

    /// ClientIP affinity timeout, when affinity is on.
    pub fn affinity_timeout(&self) -> Option<u32> {
        match self.service.session_affinity {
            SessionAffinity::None => None,
            SessionAffinity::ClientIp { timeout_seconds } => Some(timeout_seconds),
        }
    }
}

/// Every service port of `model` that the proxier of `node.family` handles (services with a
/// ClusterIP of that family), sorted by service then port order, with endpoints chosen.
pub fn service_ports<'a>(model: &'a Model, node: &NodeSettings) -> Vec<PortView<'a>> {
    let mut out = Vec::new();
    for (id, svc) in &model.services {
        let slices = model.slices.get(id);
        push_service_ports(slices, (id, svc), node, node.family, &mut out);
    }
    out
}

/// [`service_ports`] of one service (none when `id` is not in the model): what an
/// incremental computation recomputes when that service or its slices changed.
pub fn ports_of_service<'a>(
    model: &'a Model,
    id: &ServiceRef,
    node: &NodeSettings,
) -> Vec<PortView<'a>> {
    let mut out = Vec::new();
    if let Some(service) = model.services.get_key_value(id) {
        push_service_ports(model.slices.get(id), service, node, node.family, &mut out);
    }
    out
}

/// [`ports_of_service`] of service `id` (`svc`, with its `slices`) for the proxier of
/// `family` on `node` (whose own family is not read), added to `out`.
pub fn push_service_ports<'a>(
    slices: Option<&'a Slices>,
    (id, svc): (&'a ServiceRef, &'a Service),
    node: &NodeSettings,
    family: IpFamily,
    out: &mut Vec<PortView<'a>>,
) {
    let topo = Topology {
        node_name: &node.node_name,
        zone: node.zone.as_deref(),
    };
    {
        let Some(cluster_ip) = svc
            .cluster_ips
            .iter()
            .copied()
            .find(|ip| family.matches(*ip))
        else {
            return;
        };
        let fam = |ips: &[IpAddr]| -> Vec<IpAddr> {
            ips.iter()
                .copied()
                .filter(|ip| family.matches(*ip))
                .collect()
        };
        for port in &svc.ports {
            let name = if port.name.is_empty() {
                id.to_string()
            } else {
                format!("{id}:{}", port.name)
            };
            let endpoints = slices_endpoints(slices, port, family, Some(&node.node_name));
            let health_check_node_port = (svc.service_type == ServiceType::LoadBalancer
                && svc.external_traffic_policy == TrafficPolicy::Local)
                .then_some(svc.health_check_node_port)
                .flatten();
            let mut view = PortView {
                service: svc,
                port,
                name,
                cluster_ip,
                external_ips: fam(&svc.external_ips),
                load_balancer_ips: fam(&svc.load_balancer_ips),
                source_ranges: svc
                    .load_balancer_source_ranges
                    .iter()
                    .copied()
                    .filter(|c| family.matches(c.addr()))
                    .collect(),
                node_port: port.node_port.filter(|&p| p != 0),
                health_check_node_port,
                endpoints,
                categorized: Categorized::default(),
            };
            let uses = Uses {
                cluster: view.uses_cluster_endpoints(),
                local: view.uses_local_endpoints(),
            };
            view.categorized = categorize(&view.endpoints, uses, Some(topo));
            out.push(view);
        }
    }
}

/// Endpoints over every service port of every slice of the family (kube-proxy's count for
/// large-cluster mode; slices whose Service is gone count too).
pub fn total_endpoints(model: &Model, family: IpFamily) -> usize {
    let mut total = 0;
    for slices in model.slices.values() {
        let mut per_port: BTreeMap<(Name, Protocol), std::collections::BTreeSet<(IpAddr, u16)>> =
            BTreeMap::new();
        for slice in slices.values() {
            for p in &slice.ports {
                let set = per_port.entry((p.name.clone(), p.protocol)).or_default();
                for ep in &slice.endpoints {
                    let ip = ep.address;
                    if family.matches(ip) {
                        set.insert((ip, p.port));
                    }
                }
            }
        }
        total += per_port.values().map(|s| s.len()).sum::<usize>();
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(ip: &str, ready: bool, serving: bool, terminating: bool, local: bool) -> EndpointView {
        EndpointView {
            ip: ip.parse().expect("ip"),
            port: 80,
            ready,
            serving,
            terminating,
            local,
            zone_hints: vec![],
            node_hints: vec![],
        }
    }

    fn ips(eps: &[EndpointView]) -> Vec<String> {
        eps.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn local_policy_falls_back_to_local_terminating_endpoints() {
        let eps = vec![
            ep("10.0.1.2", false, true, true, true),
            ep("10.0.1.3", false, true, true, true),
            ep("10.0.1.4", false, false, true, true),
            ep("10.0.1.5", true, true, false, false),
        ];
        let c = categorize(
            &eps,
            Uses {
                cluster: true,
                local: true,
            },
            None,
        );
        assert_eq!(ips(&c.cluster), ["10.0.1.5:80"]);
        assert_eq!(ips(&c.local), ["10.0.1.2:80", "10.0.1.3:80"]);
        assert_eq!(
            ips(c.all_reachable()),
            ["10.0.1.2:80", "10.0.1.3:80", "10.0.1.5:80"]
        );
        assert!(c.has_any);
    }

    #[test]
    fn nothing_usable_means_no_endpoints() {
        let eps = vec![ep("10.0.1.4", false, false, true, true)];
        let c = categorize(
            &eps,
            Uses {
                cluster: true,
                local: true,
            },
            None,
        );
        assert!(!c.has_any && c.all_reachable().is_empty());
    }

    #[test]
    fn zone_hints_narrow_ready_endpoints() {
        let mut a = ep("10.0.0.1", true, true, false, false);
        a.zone_hints = vec!["z1".into()];
        let mut b = ep("10.0.0.2", true, true, false, false);
        b.zone_hints = vec!["z2".into()];
        let topo = Topology {
            node_name: "n",
            zone: Some("z1"),
        };
        let c = categorize(
            &[a, b],
            Uses {
                cluster: true,
                local: false,
            },
            Some(topo),
        );
        assert_eq!(ips(&c.cluster), ["10.0.0.1:80"]);
    }
}
