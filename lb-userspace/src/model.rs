//! The Kubernetes-agnostic service model: what every source produces and every writer reads.
//!
//! Sources translate what they read into [`Model`]; they know nothing of BPF or rules. The
//! endpoint selection kube-proxy does (ready, else serving-and-terminating) is computed here,
//! once, so every writer agrees by construction.

pub mod cidr;
pub mod name;
pub mod node;
pub mod proxy;
pub mod select;
pub mod slices;

use std::{
    collections::BTreeMap,
    fmt,
    net::IpAddr,
    sync::{Arc, Mutex},
};

pub use cidr::{Cidr, parse_ip};
use name::Interner;
pub use name::{Name, intern};
pub use node::{IpFamily, LocalDetector, NodeSettings};
pub use slices::Slices;

/// A list that mostly has one element (a Service's ClusterIPs and ports, a slice's ports):
/// that one inline, no allocation of its own.
pub type MostlyOne<T> = smallvec::SmallVec<[T; 1]>;

/// A list that is mostly empty (a Service's externalIPs, LoadBalancer IPs and source
/// ranges): 16 bytes, no allocation when empty.
pub type MostlyNone<T> = Box<[T]>;

/// `namespace/name` of a Service.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceRef {
    pub namespace: Name,
    pub name: Name,
}

impl ServiceRef {
    /// `namespace/name`, both interned.
    pub fn new(namespace: &str, name: &str) -> Self {
        ServiceRef {
            namespace: intern(namespace),
            name: intern(name),
        }
    }
}

impl fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// L4 protocol of a service port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// Lowercase name, as iptables and nftables write it (`tcp`).
    pub fn lower(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }

    /// A protocol by name, either case (`tcp`, `TCP`).
    pub fn parse(name: &str) -> Option<Self> {
        [Protocol::Tcp, Protocol::Udp, Protocol::Sctp]
            .into_iter()
            .find(|p| name.eq_ignore_ascii_case(p.lower()))
    }

    /// The inverse of [`Protocol::number`].
    pub fn from_number(n: u8) -> Option<Self> {
        match n {
            6 => Some(Protocol::Tcp),
            17 => Some(Protocol::Udp),
            132 => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

/// The IP protocol number, as the map codec (`lb_common::user`) takes it.
impl From<Protocol> for u8 {
    fn from(p: Protocol) -> u8 {
        p.number()
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        })
    }
}

/// One port of a Service.
#[derive(Clone, Debug, PartialEq, Eq, Default, Hash)]
pub struct ServicePort {
    /// The port's name ("" when the service has a single unnamed port).
    pub name: Name,
    pub port: u16,
    pub protocol: Protocol,
    /// The nodePort, when the service has one (used by later issues).
    pub node_port: Option<u16>,
}

/// `spec.type` of a Service (ExternalName services never reach the model).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ServiceType {
    #[default]
    ClusterIp,
    NodePort,
    LoadBalancer,
}

/// `externalTrafficPolicy` / `internalTrafficPolicy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TrafficPolicy {
    #[default]
    Cluster,
    Local,
}

/// `spec.sessionAffinity`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SessionAffinity {
    #[default]
    None,
    /// ClientIP affinity with its timeout in seconds (Kubernetes' default is 10800).
    ClientIp { timeout_seconds: u32 },
}

/// The default ClientIP affinity timeout (3 hours).
pub const DEFAULT_AFFINITY_TIMEOUT_SECONDS: u32 = 10800;

/// How a frontend reached from outside the cluster picks the backend of a new flow
/// (`--lb-algorithm`, overridden per Service by the annotation
/// `service.cilium.io/lb-algorithm`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LbAlgorithm {
    /// At random (kube-proxy's choice).
    #[default]
    Random,
    /// Maglev consistent hashing of the flow's 5-tuple: every node picks the same backend.
    Maglev,
}

impl LbAlgorithm {
    /// The names [`LbAlgorithm::from_str`](std::str::FromStr::from_str) accepts, for messages.
    pub const ACCEPTED: &'static str = "random or maglev";

    /// Its name, as `--lb-algorithm` and the annotation write it (`maglev`).
    pub fn name(self) -> &'static str {
        match self {
            LbAlgorithm::Random => "random",
            LbAlgorithm::Maglev => "maglev",
        }
    }
}

impl std::str::FromStr for LbAlgorithm {
    type Err = String;

    /// Exactly `random` or `maglev`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "random" => Ok(LbAlgorithm::Random),
            "maglev" => Ok(LbAlgorithm::Maglev),
            other => Err(format!(
                "unknown load-balancing algorithm {other:?} (accepted: {})",
                LbAlgorithm::ACCEPTED
            )),
        }
    }
}

impl fmt::Display for LbAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Service as the datapath and emitters need it.
#[derive(Clone, Debug, PartialEq, Eq, Default, Hash)]
pub struct Service {
    pub id: ServiceRef,
    /// ClusterIPs, primary first.
    pub cluster_ips: MostlyOne<IpAddr>,
    pub ports: MostlyOne<ServicePort>,
    /// `spec.type`.
    pub service_type: ServiceType,
    /// `spec.externalIPs` that parse (canonical form), both families.
    pub external_ips: MostlyNone<IpAddr>,
    /// `status.loadBalancer.ingress[].ip`, without entries whose `ipMode` is `Proxy`.
    pub load_balancer_ips: MostlyNone<IpAddr>,
    /// `spec.loadBalancerSourceRanges`, trimmed and parsed, both families.
    pub load_balancer_source_ranges: MostlyNone<Cidr>,
    /// `spec.sessionAffinity` (+ `sessionAffinityConfig.clientIP.timeoutSeconds`).
    pub session_affinity: SessionAffinity,
    /// `spec.externalTrafficPolicy` (unset = Cluster).
    pub external_traffic_policy: TrafficPolicy,
    /// `spec.internalTrafficPolicy` (unset = Cluster).
    pub internal_traffic_policy: TrafficPolicy,
    /// `spec.healthCheckNodePort` as written (kube-proxy only uses it for LoadBalancer
    /// services with externalTrafficPolicy Local; see [`select::PortView`]).
    pub health_check_node_port: Option<u16>,
    /// The annotation service.cilium.io/lb-algorithm, when set to a known value (else the
    /// node's --lb-algorithm applies).
    pub lb_algorithm: Option<LbAlgorithm>,
    /// `metadata.uid` (the API source's; the file's when written): an Event about the
    /// Service names it, as `kubectl describe` finds events by it.
    pub uid: Option<Uid>,
}

/// An object's `metadata.uid` (a UUID the API server assigns), in 16 bytes rather than
/// its 36-character text (two halves, high first: a `u128` would align the Service to 16
/// bytes and its `Option` take 32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Uid([u64; 2]);

impl From<u128> for Uid {
    fn from(v: u128) -> Self {
        Uid([(v >> 64) as u64, v as u64])
    }
}

impl Uid {
    /// Its 128 bits.
    pub fn value(self) -> u128 {
        (u128::from(self.0[0]) << 64) | u128::from(self.0[1])
    }
}

impl Uid {
    /// The UUID text (`8-4-4-4-12` hex digits, either case); none for anything else.
    pub fn parse(text: &str) -> Option<Uid> {
        let groups: Vec<&str> = text.split('-').collect();
        let lens: Vec<usize> = groups.iter().map(|g| g.len()).collect();
        if lens != [8, 4, 4, 4, 12]
            || !groups
                .iter()
                .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return None;
        }
        u128::from_str_radix(&groups.concat(), 16)
            .ok()
            .map(Uid::from)
    }
}

impl fmt::Display for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = format!("{:032x}", self.value());
        write!(
            f,
            "{}-{}-{}-{}-{}",
            &h[..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..]
        )
    }
}

/// An endpoint of a slice with kube-proxy's conditions: compact (32 bytes: its address,
/// flags and a shared topology; no string or allocation of its own).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The first of its addresses of the slice's family (the one kube-proxy uses).
    pub address: IpAddr,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// Its node, zone and hints, one copy shared by every endpoint with the same ones (a
    /// node's endpoints); none when none is set.
    pub topology: Option<Arc<Topology>>,
}

/// Where an endpoint runs (`nodeName`, `zone`) and its `hints`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Topology {
    pub node_name: Option<Name>,
    pub zone: Option<Name>,
    pub hints: Hints,
}

/// The shared topologies (as names are shared: [`intern`]).
static TOPOLOGIES: Mutex<Option<Interner<Topology>>> = Mutex::new(None);

impl Topology {
    /// The one shared copy of this topology; none when nothing is set.
    pub fn shared(self) -> Option<Arc<Topology>> {
        if self == Topology::default() {
            return None;
        }
        let mut guard = TOPOLOGIES.lock().unwrap_or_else(|e| e.into_inner());
        let table = guard.get_or_insert_with(Interner::new);
        Some(table.get(&self, || Arc::new(self.clone())))
    }
}

/// An endpoint's `hints`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Hints {
    /// `hints.forZones[].name` (topology-aware routing).
    pub zones: Vec<Name>,
    /// `hints.forNodes[].name` (PreferSameNode traffic distribution).
    pub nodes: Vec<Name>,
}

impl Endpoint {
    /// `nodeName`.
    pub fn node_name(&self) -> Option<&Name> {
        self.topology.as_ref().and_then(|t| t.node_name.as_ref())
    }

    /// `zone`.
    pub fn zone(&self) -> Option<&Name> {
        self.topology.as_ref().and_then(|t| t.zone.as_ref())
    }

    /// `hints.forZones[].name`.
    pub fn zone_hints(&self) -> &[Name] {
        self.topology.as_ref().map_or(&[], |t| &t.hints.zones)
    }

    /// `hints.forNodes[].name`.
    pub fn node_hints(&self) -> &[Name] {
        self.topology.as_ref().map_or(&[], |t| &t.hints.nodes)
    }
}

impl Default for Endpoint {
    fn default() -> Self {
        Self {
            address: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            ready: false,
            serving: false,
            terminating: false,
            topology: None,
        }
    }
}

const _: () = assert!(std::mem::size_of::<Endpoint>() == 32);

/// A named port of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq, Default, Hash)]
pub struct EndpointPort {
    pub name: Name,
    pub port: u16,
    pub protocol: Protocol,
}

/// An EndpointSlice, attached to its Service by the `kubernetes.io/service-name` label.
#[derive(Clone, Debug, PartialEq, Eq, Default, Hash)]
pub struct EndpointSlice {
    /// The slice's own name (unique within the namespace).
    pub name: Name,
    pub service: ServiceRef,
    pub ports: MostlyOne<EndpointPort>,
    pub endpoints: Vec<Endpoint>,
}

/// A backend address for one service port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BackendAddr {
    pub ip: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
}

impl fmt::Display for BackendAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            IpAddr::V4(ip) => write!(f, "{ip}:{}/{}", self.port, self.protocol),
            IpAddr::V6(ip) => write!(f, "[{ip}]:{}/{}", self.port, self.protocol),
        }
    }
}

/// Services and their endpoint slices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Model {
    pub services: BTreeMap<ServiceRef, Service>,
    /// Slices by service, each service's by slice name.
    pub slices: BTreeMap<ServiceRef, Slices>,
}

impl Model {
    /// Adds or replaces a service.
    pub fn upsert_service(&mut self, svc: Service) {
        self.services.insert(svc.id.clone(), svc);
    }

    /// Rebuilds the B-trees from their sorted entries: filled one insert at a time (a parse,
    /// a list: names come in no order) their nodes are a quarter to a half empty, built from
    /// sorted entries full (at 10,000 × 10 about 2.5 MiB less).
    pub fn compact(&mut self) {
        self.services = std::mem::take(&mut self.services).into_iter().collect();
        self.slices = std::mem::take(&mut self.slices).into_iter().collect();
    }

    /// Adds or replaces a slice.
    pub fn upsert_slice(&mut self, slice: EndpointSlice) {
        self.slices
            .entry(slice.service.clone())
            .or_default()
            .insert(slice);
    }

    /// The backends that new connections to `port` of `svc` may use, deduplicated and in
    /// kube-proxy's order (by their `ip:port` string).
    ///
    /// As kube-proxy's cluster-policy choice (see [`select`]): endpoints from every slice of
    /// the service, matched by port name and protocol; the ready ones, or when none is ready,
    /// the serving-and-terminating ones. Node-independent: no topology hints, no
    /// internalTrafficPolicy (the datapath does not know its node yet).
    pub fn backends(&self, svc: &ServiceRef, port: &ServicePort) -> Vec<BackendAddr> {
        let mut families = Vec::new();
        for slice in self.slices.get(svc).into_iter().flat_map(|s| s.values()) {
            for ep in &slice.endpoints {
                {
                    let ip = &ep.address;
                    let fam = if ip.is_ipv4() {
                        IpFamily::V4
                    } else {
                        IpFamily::V6
                    };
                    if !families.contains(&fam) {
                        families.push(fam);
                    }
                }
            }
        }
        families.sort();
        let mut out = Vec::new();
        for family in families {
            let eps = select::port_endpoints(self, svc, port, family, None);
            let uses = select::Uses {
                cluster: true,
                local: false,
            };
            out.extend(
                select::categorize(&eps, uses, None)
                    .cluster
                    .into_iter()
                    .map(|e| BackendAddr {
                        ip: e.ip,
                        port: e.port,
                        protocol: port.protocol,
                    }),
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_uid_reads_and_shows_as_the_api_writes_it() {
        let text = "6f1b2c3d-0a1b-4c2d-8e3f-00112233aabb";
        let uid = super::Uid::parse(text).expect("a UUID");
        assert_eq!(uid.to_string(), text);
        assert_eq!(super::Uid::parse(&text.to_uppercase()), Some(uid));
        for bad in [
            "",
            "web",
            "6f1b2c3d0a1b4c2d8e3f00112233aabb",
            "6f1b2c3d-0a1b-4c2d-8e3f-00112233aabx",
        ] {
            assert_eq!(super::Uid::parse(bad), None, "{bad}");
        }
    }

    use super::*;

    fn ep(ip: &str, ready: bool, serving: bool, terminating: bool) -> Endpoint {
        Endpoint {
            address: ip.parse().expect("test ip"),
            ready,
            serving,
            terminating,
            ..Default::default()
        }
    }

    fn model(endpoints: Vec<Endpoint>) -> (Model, ServiceRef, ServicePort) {
        let id = ServiceRef {
            namespace: "ns".into(),
            name: "svc".into(),
        };
        let port = ServicePort {
            name: "http".into(),
            port: 80,
            protocol: Protocol::Tcp,
            node_port: None,
        };
        let mut m = Model::default();
        m.upsert_service(Service {
            id: id.clone(),
            cluster_ips: smallvec::smallvec!["10.96.0.1".parse().expect("ip")],
            ports: smallvec::smallvec![port.clone()],
            ..Default::default()
        });
        m.upsert_slice(EndpointSlice {
            name: "svc-a".into(),
            service: id.clone(),
            ports: smallvec::smallvec![EndpointPort {
                name: "http".into(),
                port: 8080,
                protocol: Protocol::Tcp,
            }],
            endpoints,
        });
        (m, id, port)
    }

    #[test]
    fn ready_endpoints_win_over_terminating_ones() {
        let (m, id, port) = model(vec![
            ep("10.0.0.2", true, true, false),
            ep("10.0.0.1", false, true, true),
        ]);
        let got: Vec<String> = m
            .backends(&id, &port)
            .iter()
            .map(|b| b.to_string())
            .collect();
        assert_eq!(got, vec!["10.0.0.2:8080/TCP"]);
    }

    #[test]
    fn serving_terminating_endpoints_are_the_fallback() {
        let (m, id, port) = model(vec![
            ep("10.0.0.1", false, true, true),
            ep("10.0.0.3", false, false, true),
            ep("10.0.0.4", false, false, false),
        ]);
        let got: Vec<String> = m
            .backends(&id, &port)
            .iter()
            .map(|b| b.to_string())
            .collect();
        assert_eq!(got, vec!["10.0.0.1:8080/TCP"]);
    }

    #[test]
    fn port_is_matched_by_name_and_protocol() {
        let (m, id, mut port) = model(vec![ep("10.0.0.1", true, true, false)]);
        port.protocol = Protocol::Udp;
        assert!(m.backends(&id, &port).is_empty());
        port.protocol = Protocol::Tcp;
        port.name = "other".into();
        assert!(m.backends(&id, &port).is_empty());
    }
}
