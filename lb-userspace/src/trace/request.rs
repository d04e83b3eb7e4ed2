//! What `--from` and `--to` name, and the packet they make.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddrV4},
};

use serde::Deserialize;
use thiserror::Error;

use crate::model::{Model, Protocol, ServiceRef, ServiceType, TrafficPolicy};

/// The source port of a traced packet when `--from` names none.
pub const DEFAULT_SOURCE_PORT: u16 = 40000;

/// Where the packet starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A pod, by name: its packets cross tc ingress on the host side of its veth.
    Pod { namespace: String, name: String },
    /// The node itself: its sockets go through the cgroup socket hooks (connect4).
    Node,
    /// An address (a pod IP, or a client outside the cluster for NodePorts and
    /// LoadBalancers) and maybe a port.
    Addr(Ipv4Addr, Option<u16>),
}

/// Where it is sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A Service and maybe one of its ports (by name or number): its ClusterIP.
    Service {
        svc: ServiceRef,
        port: Option<String>,
    },
    /// A frontend address (a ClusterIP, a node IP and nodePort, an external IP).
    Addr(SocketAddrV4),
}

/// Why a request cannot be traced.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RequestError {
    #[error(
        "--from {0:?}: expected pod/NAMESPACE/NAME, node, or IP[:PORT] (an IPv4 address; trace covers IPv4)"
    )]
    BadOrigin(String),
    #[error("--to {0:?}: expected svc/NAMESPACE/NAME[:PORT] or IP:PORT (an IPv4 address and port)")]
    BadTarget(String),
    #[error("{0} is not in the source (give the agent's --source file:PATH)")]
    NoService(String),
    #[error("service {svc} has no port {port:?} (its ports: {ports})")]
    NoPort {
        svc: String,
        port: String,
        ports: String,
    },
    #[error("service {0} has no IPv4 ClusterIP (trace covers IPv4)")]
    NoClusterIp(String),
    #[error(
        "pod {0} is not in the source: give a --source file with a `kind: Pod` document (status.podIP), or --from its IP"
    )]
    NoPod(String),
    #[error("{what} names a pod or a service: it needs --source file:PATH")]
    NeedsSource { what: String },
}

fn ns_name(rest: &str) -> Option<(String, String)> {
    let (ns, name) = rest.split_once('/')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains('/'))
        .then(|| (ns.to_string(), name.to_string()))
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
        if let Ok(a) = s.parse::<SocketAddrV4>() {
            return Ok(Origin::Addr(*a.ip(), Some(a.port())));
        }
        s.parse::<Ipv4Addr>()
            .map(|ip| Origin::Addr(ip, None))
            .map_err(|_| bad())
    }
}

impl Target {
    pub fn parse(s: &str) -> Result<Self, RequestError> {
        let bad = || RequestError::BadTarget(s.to_string());
        if let Some(rest) = s.strip_prefix("svc/") {
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
        s.parse::<SocketAddrV4>()
            .map(Target::Addr)
            .map_err(|_| bad())
    }
}

/// Pods named in a source file (`kind: Pod` documents with `status.podIP`).
pub type Pods = BTreeMap<(String, String), Ipv4Addr>;

#[derive(Deserialize)]
struct PodDoc {
    kind: Option<String>,
    #[serde(default)]
    metadata: PodMeta,
    #[serde(default)]
    status: PodStatus,
}

#[derive(Deserialize, Default)]
struct PodMeta {
    name: Option<String>,
    namespace: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct PodStatus {
    #[serde(rename = "podIP")]
    pod_ip: Option<String>,
}

/// The pods of a multi-document YAML text (other documents, and pods without an IPv4
/// `status.podIP`, are skipped).
pub fn pods(text: &str) -> Pods {
    let mut out = Pods::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let Ok(p) = PodDoc::deserialize(doc) else {
            continue;
        };
        if p.kind.as_deref() != Some("Pod") {
            continue;
        }
        let (Some(name), Some(ip)) = (p.metadata.name, p.status.pod_ip) else {
            continue;
        };
        if let Ok(ip) = ip.parse() {
            let ns = p.metadata.namespace.unwrap_or_else(|| "default".into());
            out.insert((ns, name), ip);
        }
    }
    out
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
    pub src: Option<SocketAddrV4>,
    pub dst: SocketAddrV4,
    pub protocol: Protocol,
    /// The origin as the user named it (`pod default/client (10.244.1.2)`).
    pub from: String,
    /// The target likewise.
    pub to: String,
}

/// Resolves `from`/`to` against `source`; `proto` when given, else the service port's
/// protocol, else TCP.
pub fn resolve(
    from: &Origin,
    to: &Target,
    proto: Option<Protocol>,
    source: &Source,
) -> Result<Resolved, RequestError> {
    let (dst, port_proto, to_name) = match to {
        Target::Addr(a) => (*a, None, a.to_string()),
        Target::Service { svc, port } => {
            let model = source
                .model
                .as_ref()
                .ok_or_else(|| RequestError::NeedsSource {
                    what: format!("--to svc/{svc}"),
                })?;
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
                port: port.clone().unwrap_or_default(),
                ports: s
                    .ports
                    .iter()
                    .map(|p| format!("{}/{}", p.port, p.protocol))
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
            let ip = s
                .cluster_ips
                .iter()
                .find_map(|ip| match ip {
                    IpAddr::V4(v4) => Some(*v4),
                    IpAddr::V6(_) => None,
                })
                .ok_or_else(|| RequestError::NoClusterIp(svc.to_string()))?;
            let a = SocketAddrV4::new(ip, p.port);
            (a, Some(p.protocol), format!("svc/{svc}:{} ({a})", p.port))
        }
    };
    let protocol = proto.or(port_proto).unwrap_or(Protocol::Tcp);
    let (src, from_name) = match from {
        Origin::Node => (None, "node (a socket of the node's own)".to_string()),
        Origin::Addr(ip, port) => {
            let a = SocketAddrV4::new(*ip, port.unwrap_or(DEFAULT_SOURCE_PORT));
            (Some(a), a.to_string())
        }
        Origin::Pod { namespace, name } => {
            if source.model.is_none() && source.pods.is_empty() {
                return Err(RequestError::NeedsSource {
                    what: format!("--from pod/{namespace}/{name}"),
                });
            }
            let ip = source
                .pods
                .get(&(namespace.clone(), name.clone()))
                .ok_or_else(|| RequestError::NoPod(format!("{namespace}/{name}")))?;
            let a = SocketAddrV4::new(*ip, DEFAULT_SOURCE_PORT);
            (Some(a), format!("pod {namespace}/{name} ({a})"))
        }
    };
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
    dst: SocketAddrV4,
    protocol: Protocol,
) -> Option<(&'static str, ServiceRef, String)> {
    let ip = IpAddr::V4(*dst.ip());
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
        assert_eq!(
            Origin::parse("10.0.0.1:5"),
            Ok(Origin::Addr(Ipv4Addr::new(10, 0, 0, 1), Some(5)))
        );
        assert!(Origin::parse("pod/x").is_err());
        assert!(Origin::parse("fe80::1").is_err());
        assert_eq!(
            Target::parse("svc/ns/web:http"),
            Ok(Target::Service {
                svc: ServiceRef {
                    namespace: "ns".into(),
                    name: "web".into()
                },
                port: Some("http".into())
            })
        );
        assert!(Target::parse("10.0.0.1").is_err());
        let e = Target::parse("svc/web").expect_err("no namespace");
        assert!(e.to_string().contains("svc/NAMESPACE/NAME"));
    }

    #[test]
    fn pods_come_from_pod_documents() {
        let text = "kind: Pod\nmetadata: {name: a, namespace: n}\nstatus: {podIP: 10.1.2.3}\n---\nkind: Service\nmetadata: {name: s}\n";
        let p = pods(text);
        assert_eq!(
            p.get(&("n".into(), "a".into())),
            Some(&Ipv4Addr::new(10, 1, 2, 3))
        );
        assert_eq!(p.len(), 1);
    }
}
