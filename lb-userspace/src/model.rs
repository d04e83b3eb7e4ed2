//! The Kubernetes-agnostic service model: what every source produces and every writer reads.
//!
//! Sources translate what they read into [`Model`]; they know nothing of BPF or rules. The
//! endpoint selection kube-proxy does (ready, else serving-and-terminating) is computed here,
//! once, so every writer agrees by construction.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::IpAddr,
};

/// `namespace/name` of a Service.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceRef {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// L4 protocol of a service port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    /// The port's name ("" when the service has a single unnamed port).
    pub name: String,
    pub port: u16,
    pub protocol: Protocol,
    /// The nodePort, when the service has one (used by later issues).
    pub node_port: Option<u16>,
}

/// A Service as the datapath and emitters need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    pub id: ServiceRef,
    /// ClusterIPs, primary first.
    pub cluster_ips: Vec<IpAddr>,
    pub ports: Vec<ServicePort>,
}

/// An endpoint of a slice with kube-proxy's conditions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub addresses: Vec<IpAddr>,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub node_name: Option<String>,
    pub zone: Option<String>,
}

/// A named port of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointPort {
    pub name: String,
    pub port: u16,
    pub protocol: Protocol,
}

/// An EndpointSlice, attached to its Service by the `kubernetes.io/service-name` label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointSlice {
    /// The slice's own name (unique within the namespace).
    pub name: String,
    pub service: ServiceRef,
    pub ports: Vec<EndpointPort>,
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
    /// Slices by service, then by slice name.
    pub slices: BTreeMap<ServiceRef, BTreeMap<String, EndpointSlice>>,
}

impl Model {
    /// Adds or replaces a service.
    pub fn upsert_service(&mut self, svc: Service) {
        self.services.insert(svc.id.clone(), svc);
    }

    /// Adds or replaces a slice.
    pub fn upsert_slice(&mut self, slice: EndpointSlice) {
        self.slices
            .entry(slice.service.clone())
            .or_default()
            .insert(slice.name.clone(), slice);
    }

    /// The backends that new connections to `port` of `svc` may use, sorted and deduplicated.
    ///
    /// As kube-proxy: endpoints from every slice of the service, matched by port name and
    /// protocol; the ready ones, or when none is ready, the serving-and-terminating ones.
    pub fn backends(&self, svc: &ServiceRef, port: &ServicePort) -> Vec<BackendAddr> {
        let mut ready = BTreeSet::new();
        let mut terminating = BTreeSet::new();
        for slice in self.slices.get(svc).into_iter().flat_map(|s| s.values()) {
            let Some(ep_port) = slice
                .ports
                .iter()
                .find(|p| p.name == port.name && p.protocol == port.protocol)
            else {
                continue;
            };
            for ep in &slice.endpoints {
                let Some(&ip) = ep.addresses.first() else {
                    continue;
                };
                let addr = BackendAddr {
                    ip,
                    port: ep_port.port,
                    protocol: port.protocol,
                };
                if ep.ready {
                    ready.insert(addr);
                } else if ep.serving && ep.terminating {
                    terminating.insert(addr);
                }
            }
        }
        let chosen = if ready.is_empty() { terminating } else { ready };
        chosen.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(ip: &str, ready: bool, serving: bool, terminating: bool) -> Endpoint {
        Endpoint {
            addresses: vec![ip.parse().expect("test ip")],
            ready,
            serving,
            terminating,
            node_name: None,
            zone: None,
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
            cluster_ips: vec!["10.96.0.1".parse().expect("ip")],
            ports: vec![port.clone()],
        });
        m.upsert_slice(EndpointSlice {
            name: "svc-a".into(),
            service: id.clone(),
            ports: vec![EndpointPort {
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
