//! What `--from` and `--to` name, and the packet they make: IPv4 or IPv6, as the target's
//! address (or, for a Service, `--ip-family`, else its primary family) says.

use std::net::{IpAddr, SocketAddr};

use thiserror::Error;

pub use super::pods::{Pods, pods};
use crate::model::{IpFamily, Model, Protocol, ServiceRef, ServiceType, TrafficPolicy};

/// The source port of a traced packet when `--from` names none.
pub const DEFAULT_SOURCE_PORT: u16 = 40000;

/// Where the packet starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A pod, by name: its packets cross tc ingress on the host side of its veth.
    Pod { namespace: String, name: String },
    /// The node itself: its sockets go through the cgroup socket hooks (connect4/connect6).
    Node,
    /// An address (a pod IP, or a client outside the cluster for NodePorts and
    /// LoadBalancers) and maybe a port.
    Addr(IpAddr, Option<u16>),
}

/// Where it is sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A Service and maybe one of its ports (by name or number): its ClusterIP.
    Service {
        svc: ServiceRef,
        port: Option<String>,
    },
    /// A frontend address (a ClusterIP, a node IP and nodePort, an external IP, a
    /// LoadBalancer IP), of either family.
    Addr(SocketAddr),
}

/// Why a request cannot be traced.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RequestError {
    #[error("--from {0:?}: expected pod/NAMESPACE/NAME, node, IP, IPv4:PORT or [IPv6]:PORT")]
    BadOrigin(String),
    #[error(
        "--to {0:?}: expected svc/NAMESPACE/NAME[:PORT], IPv4:PORT or [IPv6]:PORT (an address and port)"
    )]
    BadTarget(String),
    #[error("{0} is not in the source (give the agent's --source file:PATH)")]
    NoService(String),
    #[error("service {svc} has no port {port:?} (its ports: {ports})")]
    NoPort {
        svc: String,
        port: String,
        ports: String,
    },
    #[error("service {svc} has no {family} ClusterIP (its ClusterIPs: {ips})")]
    NoClusterIp {
        svc: String,
        family: &'static str,
        ips: String,
    },
    #[error(
        "pod {0} is not in the source: give a --source file with a `kind: Pod` document (status.podIP), or --from its IP"
    )]
    NoPod(String),
    #[error("pod {pod} has no {family} address (status.podIPs: {ips}) for {dst}")]
    NoPodAddress {
        pod: String,
        family: &'static str,
        ips: String,
        dst: String,
    },
    #[error("{what} is {is}, but {other} is {family}: a packet has one family")]
    FamilyMismatch {
        what: String,
        is: &'static str,
        other: String,
        family: &'static str,
    },
    #[error("{what} names a pod or a service: it needs --source file:PATH")]
    NeedsSource { what: String },
}

fn ns_name(rest: &str) -> Option<(String, String)> {
    let (ns, name) = rest.split_once('/')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains('/'))
        .then(|| (ns.to_string(), name.to_string()))
}

/// `IP`, `[IPv6]`, `IPv4:PORT` or `[IPv6]:PORT`.
fn addr_and_port(s: &str) -> Option<(IpAddr, Option<u16>)> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Some((a.ip(), Some(a.port())));
    }
    let bare = s
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(s);
    bare.parse::<IpAddr>().ok().map(|ip| (ip, None))
}

impl Origin {
    pub fn parse(s: &str) -> Result<Self, RequestError> {
        let bad = || RequestError::BadOrigin(s.to_string());
        if s == "node" {
            return Ok(Origin::Node);
        }
        if let Some(rest) = s.strip_prefix("pod/") {
            let (namespace, name) = ns_name(rest).ok_or_else(bad)?;
            return Ok(Origin::Pod { namespace, name });
        }
        addr_and_port(s)
            .map(|(ip, port)| Origin::Addr(ip, port))
            .ok_or_else(bad)
    }
}

impl Target {
    /// `svc/NAMESPACE/NAME[:PORT]` (or `service/…`, as kubectl spells both) or an address
    /// and port.
    pub fn parse(s: &str) -> Result<Self, RequestError> {
        let bad = || RequestError::BadTarget(s.to_string());
        if let Some(rest) = s
            .strip_prefix("svc/")
            .or_else(|| s.strip_prefix("service/"))
        {
            let (svc, port) = match rest.rsplit_once(':') {
                Some((svc, port)) if !port.is_empty() => (svc, Some(port.to_string())),
                Some(_) => return Err(bad()),
                None => (rest, None),
            };
            let (namespace, name) = ns_name(svc).ok_or_else(bad)?;
            return Ok(Target::Service {
                svc: ServiceRef {
                    namespace: namespace.into(),
                    name: name.into(),
                },
                port,
            });
        }
        s.parse::<SocketAddr>().map(Target::Addr).map_err(|_| bad())
    }
}

/// What the source says (optional: without one, addresses only).
#[derive(Clone, Debug, Default)]
pub struct Source {
    pub model: Option<Model>,
    pub pods: Pods,
}

/// A request resolved to a tuple.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// `None` for a node origin (the socket's source is not known before connect()).
    pub src: Option<SocketAddr>,
    /// The destination; its family is the packet's.
    pub dst: SocketAddr,
    pub protocol: Protocol,
    /// The origin as the user named it (`pod default/client (10.244.1.2)`).
    pub from: String,
    /// The target likewise.
    pub to: String,
}

impl Resolved {
    /// The packet's family.
    pub fn family(&self) -> IpFamily {
        IpFamily::of(self.dst.ip())
    }
}

fn list(ips: &[IpAddr]) -> String {
    if ips.is_empty() {
        return "none".into();
    }
    ips.iter()
        .map(IpAddr::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The service's port `port` (by name or number; the first without one) and its ClusterIP
/// of `family` (the primary one, the first of its ClusterIPs, without one).
fn service_target(
    model: &Model,
    svc: &ServiceRef,
    port: Option<&String>,
    family: Option<IpFamily>,
) -> Result<(SocketAddr, Protocol), RequestError> {
    let s = model
        .services
        .get(svc)
        .ok_or_else(|| RequestError::NoService(format!("service {svc}")))?;
    let p = match port {
        None => s.ports.first(),
        Some(p) => s
            .ports
            .iter()
            .find(|sp| *sp.name == **p || sp.port.to_string() == *p),
    }
    .ok_or_else(|| RequestError::NoPort {
        svc: svc.to_string(),
        port: port.cloned().unwrap_or_default(),
        ports: s
            .ports
            .iter()
            .map(|p| format!("{}/{}", p.port, p.protocol))
            .collect::<Vec<_>>()
            .join(", "),
    })?;
    let primary = s.cluster_ips.first().map(|ip| IpFamily::of(*ip));
    let want = family.or(primary).unwrap_or_default();
    let ip = s
        .cluster_ips
        .iter()
        .find(|ip| want.matches(**ip))
        .ok_or_else(|| RequestError::NoClusterIp {
            svc: svc.to_string(),
            family: want.name(),
            ips: list(&s.cluster_ips),
        })?;
    Ok((SocketAddr::new(*ip, p.port), p.protocol))
}

/// The destination: its address, the service port's protocol, and its name.
fn target(
    to: &Target,
    family: Option<IpFamily>,
    source: &Source,
) -> Result<(SocketAddr, Option<Protocol>, String), RequestError> {
    match to {
        Target::Addr(a) => {
            if let Some(f) = family.filter(|f| !f.matches(a.ip())) {
                return Err(RequestError::FamilyMismatch {
                    what: format!("--to {a}"),
                    is: IpFamily::of(a.ip()).name(),
                    other: "--ip-family".into(),
                    family: f.name(),
                });
            }
            Ok((*a, None, a.to_string()))
        }
        Target::Service { svc, port } => {
            let model = source
                .model
                .as_ref()
                .ok_or_else(|| RequestError::NeedsSource {
                    what: format!("--to svc/{svc}"),
                })?;
            let (a, proto) = service_target(model, svc, port.as_ref(), family)?;
            Ok((a, Some(proto), format!("svc/{svc}:{} ({a})", a.port())))
        }
    }
}

/// The source: none for the node, else the address (of `dst`'s family) and its name.
fn origin(
    from: &Origin,
    dst: SocketAddr,
    source: &Source,
) -> Result<(Option<SocketAddr>, String), RequestError> {
    let family = IpFamily::of(dst.ip());
    match from {
        Origin::Node => Ok((None, "node (a socket of the node's own)".to_string())),
        Origin::Addr(ip, port) => {
            if !family.matches(*ip) {
                return Err(RequestError::FamilyMismatch {
                    what: format!("--from {ip}"),
                    is: IpFamily::of(*ip).name(),
                    other: format!("the destination {dst}"),
                    family: family.name(),
                });
            }
            let a = SocketAddr::new(*ip, port.unwrap_or(DEFAULT_SOURCE_PORT));
            Ok((Some(a), a.to_string()))
        }
        Origin::Pod { namespace, name } => {
            if source.model.is_none() && source.pods.is_empty() {
                return Err(RequestError::NeedsSource {
                    what: format!("--from pod/{namespace}/{name}"),
                });
            }
            let pod = format!("{namespace}/{name}");
            let ips = source
                .pods
                .get(&(namespace.clone(), name.clone()))
                .ok_or_else(|| RequestError::NoPod(pod.clone()))?;
            let ip = ips.iter().find(|ip| family.matches(**ip)).ok_or_else(|| {
                RequestError::NoPodAddress {
                    pod: pod.clone(),
                    family: family.name(),
                    ips: list(ips),
                    dst: dst.to_string(),
                }
            })?;
            let a = SocketAddr::new(*ip, DEFAULT_SOURCE_PORT);
            Ok((Some(a), format!("pod {pod} ({a})")))
        }
    }
}

/// Resolves `from`/`to` against `source`; `proto` when given, else the service port's
/// protocol, else TCP. `family` picks a Service's ClusterIP (default: its primary one) and
/// must agree with an address `--to` names.
pub fn resolve(
    from: &Origin,
    to: &Target,
    proto: Option<Protocol>,
    family: Option<IpFamily>,
    source: &Source,
) -> Result<Resolved, RequestError> {
    let (dst, port_proto, to_name) = target(to, family, source)?;
    let protocol = proto.or(port_proto).unwrap_or(Protocol::Tcp);
    let (src, from_name) = origin(from, dst, source)?;
    Ok(Resolved {
        src,
        dst,
        protocol,
        from: from_name,
        to: to_name,
    })
}

/// How `dst` reaches a service of `model`: `ClusterIP`, `NodePort`, `externalIP` or
/// `LoadBalancer`, the service, and its port's name (or number).
pub fn frontend_kind(
    model: &Model,
    dst: SocketAddr,
    protocol: Protocol,
) -> Option<(&'static str, ServiceRef, String)> {
    let ip = dst.ip();
    for (id, s) in &model.services {
        for p in s.ports.iter().filter(|p| p.protocol == protocol) {
            let pname = if p.name.is_empty() {
                p.port.to_string()
            } else {
                p.name.to_string()
            };
            let kind = if p.port == dst.port() && s.cluster_ips.contains(&ip) {
                "ClusterIP"
            } else if p.port == dst.port() && s.external_ips.contains(&ip) {
                "externalIP"
            } else if p.port == dst.port() && s.load_balancer_ips.contains(&ip) {
                "LoadBalancer"
            } else if p.node_port == Some(dst.port()) && s.service_type != ServiceType::ClusterIp {
                "NodePort"
            } else {
                continue;
            };
            return Some((kind, id.clone(), pname));
        }
    }
    None
}

/// The traffic policy that applies to a frontend kind, as words.
pub fn policy_words(model: &Model, svc: &ServiceRef, kind: &str) -> String {
    let Some(s) = model.services.get(svc) else {
        return String::new();
    };
    let (which, p) = if kind == "ClusterIP" {
        ("internalTrafficPolicy", s.internal_traffic_policy)
    } else {
        ("externalTrafficPolicy", s.external_traffic_policy)
    };
    format!(
        "{which} {}",
        match p {
            TrafficPolicy::Cluster => "Cluster",
            TrafficPolicy::Local => "Local",
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::file;

    #[test]
    fn origins_and_targets_parse_or_say_what_is_expected() {
        assert_eq!(Origin::parse("node"), Ok(Origin::Node));
        assert_eq!(
            Origin::parse("pod/default/client"),
            Ok(Origin::Pod {
                namespace: "default".into(),
                name: "client".into()
            })
        );
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        assert_eq!(
            Origin::parse("10.0.0.1:5"),
            Ok(Origin::Addr(ip("10.0.0.1"), Some(5)))
        );
        assert_eq!(
            Origin::parse("[2001:db8::5]:40000"),
            Ok(Origin::Addr(ip("2001:db8::5"), Some(40000)))
        );
        assert_eq!(
            Origin::parse("2001:db8::5"),
            Ok(Origin::Addr(ip("2001:db8::5"), None))
        );
        assert_eq!(
            Origin::parse("[fe80::1]"),
            Ok(Origin::Addr(ip("fe80::1"), None))
        );
        assert!(Origin::parse("pod/x").is_err());
        assert!(Origin::parse("2001:db8::5:40000:x").is_err());
        let svc = |port: Option<&str>| Target::Service {
            svc: ServiceRef {
                namespace: "ns".into(),
                name: "web".into(),
            },
            port: port.map(String::from),
        };
        assert_eq!(Target::parse("svc/ns/web:http"), Ok(svc(Some("http"))));
        assert_eq!(Target::parse("service/ns/web"), Ok(svc(None)));
        assert_eq!(
            Target::parse("[fd00::10]:80"),
            Ok(Target::Addr("[fd00::10]:80".parse().expect("addr")))
        );
        assert!(Target::parse("10.0.0.1").is_err());
        let e = Target::parse("fd00::10").expect_err("no port");
        assert!(e.to_string().contains("[IPv6]:PORT"), "{e}");
        let e = Target::parse("svc/web").expect_err("no namespace");
        assert!(e.to_string().contains("svc/NAMESPACE/NAME"));
    }

    /// dual (IPv6 first), v4 (IPv4 only), v6 (IPv6 only), and a dual-stack pod.
    const YAML: &str = "apiVersion: v1\nkind: Service\nmetadata: {namespace: d, name: dual}\nspec:\n  ipFamilyPolicy: PreferDualStack\n  ipFamilies: [IPv6, IPv4]\n  clusterIP: \"fd00::10\"\n  clusterIPs: [\"fd00::10\", 10.96.0.10]\n  ports:\n  - {name: http, port: 80, protocol: TCP, targetPort: 8080}\n  - {name: dns, port: 53, protocol: UDP, targetPort: 5353}\n---\napiVersion: v1\nkind: Service\nmetadata: {namespace: d, name: v4}\nspec:\n  clusterIP: 10.96.0.11\n  ports:\n  - {port: 80, protocol: TCP}\n---\napiVersion: v1\nkind: Service\nmetadata: {namespace: d, name: v6}\nspec:\n  ipFamilies: [IPv6]\n  clusterIP: \"fd00::12\"\n  ports:\n  - {port: 80, protocol: TCP}\n---\nkind: Pod\nmetadata: {namespace: d, name: client}\nstatus:\n  podIP: 10.244.1.2\n  podIPs: [{ip: 10.244.1.2}, {ip: \"fd00:244:1::2\"}]\n---\nkind: Pod\nmetadata: {namespace: d, name: old}\nstatus: {podIP: 10.244.1.3}\n";

    fn source() -> Source {
        Source {
            model: Some(file::parse("t.yaml", YAML).expect("yaml").model),
            pods: pods(YAML),
        }
    }

    fn go(from: &str, to: &str, family: Option<IpFamily>) -> Result<Resolved, RequestError> {
        let from = Origin::parse(from)?;
        let to = Target::parse(to)?;
        resolve(&from, &to, None, family, &source())
    }

    #[test]
    fn a_dual_stack_service_resolves_to_its_primary_family_unless_asked() {
        let r = go("pod/d/client", "svc/d/dual", None).expect("primary");
        assert_eq!(r.dst, "[fd00::10]:80".parse().expect("addr"));
        assert_eq!(r.src, Some("[fd00:244:1::2]:40000".parse().expect("addr")));
        assert_eq!(r.family(), IpFamily::V6);
        assert_eq!(r.to, "svc/d/dual:80 ([fd00::10]:80)");
        let r = go("pod/d/client", "svc/d/dual:dns", Some(IpFamily::V4)).expect("IPv4");
        assert_eq!(r.dst, "10.96.0.10:53".parse().expect("addr"));
        assert_eq!(r.protocol, Protocol::Udp);
        assert_eq!(r.src, Some("10.244.1.2:40000".parse().expect("addr")));
        let r = go("node", "svc/d/v4", None).expect("IPv4 only");
        assert_eq!((r.src, r.family()), (None, IpFamily::V4));
        let r = go("[2001:db8::5]:41000", "[fd00::12]:80", None).expect("address");
        assert_eq!(r.src, Some("[2001:db8::5]:41000".parse().expect("addr")));
        let r = go("2001:db8::5", "svc/d/v6", Some(IpFamily::V6)).expect("v6");
        assert_eq!(r.src.map(|a| a.port()), Some(DEFAULT_SOURCE_PORT));
    }

    #[test]
    fn family_errors_name_the_object_and_the_family() {
        let e = go("node", "svc/d/v4", Some(IpFamily::V6)).expect_err("no IPv6");
        assert_eq!(
            e.to_string(),
            "service d/v4 has no IPv6 ClusterIP (its ClusterIPs: 10.96.0.11)"
        );
        let e = go("node", "svc/d/v6", Some(IpFamily::V4)).expect_err("no IPv4");
        assert!(e.to_string().contains("d/v6 has no IPv4 ClusterIP"), "{e}");
        let e = go("pod/d/old", "svc/d/dual", None).expect_err("an IPv4-only pod");
        assert_eq!(
            e.to_string(),
            "pod d/old has no IPv6 address (status.podIPs: 10.244.1.3) for [fd00::10]:80"
        );
        let e = go("10.0.0.1", "[fd00::12]:80", None).expect_err("mixed");
        assert!(
            e.to_string().contains("--from 10.0.0.1 is IPv4") && e.to_string().contains("IPv6"),
            "{e}"
        );
        let e = go("node", "10.96.0.11:80", Some(IpFamily::V6)).expect_err("asked IPv6");
        assert!(e.to_string().contains("--ip-family is IPv6"), "{e}");
    }
}
