//! What a proxy needs to know about the node it runs on: its name, zone, addresses and
//! kube-proxy's node-level flags. How a writer writes (kube-proxy's masquerade mark, host
//! features, ipvs scheduler) is the writer's own option ([`super::proxy::WriterOptions`]).

use std::net::IpAddr;

use super::cidr::Cidr;

/// The IP family one proxier handles; kube-proxy runs one proxier per family.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    #[default]
    V4,
    V6,
}

impl IpFamily {
    /// The family of `ip`.
    pub fn of(ip: IpAddr) -> Self {
        if ip.is_ipv6() {
            IpFamily::V6
        } else {
            IpFamily::V4
        }
    }

    /// The family as Kubernetes spells it (`spec.ipFamilies`): `IPv4`, `IPv6`.
    pub fn name(self) -> &'static str {
        match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        }
    }

    /// Whether `ip` belongs to this family.
    pub fn matches(self, ip: IpAddr) -> bool {
        match self {
            IpFamily::V4 => ip.is_ipv4(),
            IpFamily::V6 => ip.is_ipv6(),
        }
    }

    /// The family's loopback prefix (`127.0.0.0/8`, `::1/128`).
    pub fn loopback(self) -> &'static str {
        match self {
            IpFamily::V4 => "127.0.0.0/8",
            IpFamily::V6 => "::1/128",
        }
    }
}

/// How kube-proxy tells pod traffic from other traffic (`--detect-local-mode`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LocalDetector {
    /// No detector: rules that need one are left out.
    #[default]
    None,
    /// Pod traffic comes from the cluster CIDR of the proxier's family.
    ClusterCidr(Cidr),
    /// Pod traffic comes from this node's pod CIDR.
    NodeCidr(Cidr),
    /// Pod traffic enters from this bridge interface.
    BridgeInterface(String),
    /// Pod traffic enters from interfaces with this name prefix.
    InterfaceNamePrefix(String),
}

impl LocalDetector {
    /// iptables match arguments for "comes from a local pod", `None` without a detector.
    pub fn if_local(&self) -> Option<Vec<String>> {
        Some(match self {
            LocalDetector::None => return None,
            LocalDetector::ClusterCidr(c) | LocalDetector::NodeCidr(c) => {
                vec!["-s".into(), c.to_string()]
            }
            LocalDetector::BridgeInterface(i) => vec!["-i".into(), i.clone()],
            LocalDetector::InterfaceNamePrefix(p) => vec!["-i".into(), format!("{p}+")],
        })
    }

    /// iptables match arguments for "does not come from a local pod".
    pub fn if_not_local(&self) -> Option<Vec<String>> {
        let mut args = self.if_local()?;
        args.insert(0, "!".into());
        Some(args)
    }
}

/// A node's settings, as kube-proxy's flags and the node object give them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSettings {
    /// This node's name: endpoints with this `nodeName` are local.
    pub node_name: String,
    /// The node's `topology.kubernetes.io/zone` label, for topology hints.
    pub zone: Option<String>,
    /// The family this proxier handles.
    pub family: IpFamily,
    /// The node's primary IPs (`--bind-address` / node addresses); the LoadBalancer
    /// source-range "allow from node" check uses the one of the proxier's family.
    pub node_ips: Vec<IpAddr>,
    /// Every address on the node's interfaces (loopback included), for nodePortAddresses.
    pub local_addresses: Vec<IpAddr>,
    /// `--detect-local-mode` and its argument.
    pub detector: LocalDetector,
    /// `--masquerade-all`.
    pub masquerade_all: bool,
    /// `--iptables-localhost-nodeports` (IPv4 only).
    pub localhost_node_ports: bool,
    /// `--nodeport-addresses`; empty means every local address.
    pub node_port_addresses: Vec<Cidr>,
    /// Service CIDRs (nftables drops traffic to unallocated ClusterIPs in them).
    pub service_cidrs: Vec<Cidr>,
}

impl Default for NodeSettings {
    fn default() -> Self {
        Self {
            node_name: String::new(),
            zone: None,
            family: IpFamily::V4,
            node_ips: Vec::new(),
            local_addresses: Vec::new(),
            detector: LocalDetector::None,
            masquerade_all: false,
            localhost_node_ports: true,
            node_port_addresses: Vec::new(),
            service_cidrs: Vec::new(),
        }
    }
}

impl NodeSettings {
    /// The node IP of the proxier's family, if any.
    pub fn node_ip(&self) -> Option<IpAddr> {
        self.node_ips
            .iter()
            .copied()
            .find(|ip| self.family.matches(*ip))
    }

    /// Whether `ip` is an address of this node (`-m addrtype --src-type LOCAL`).
    pub fn is_local_address(&self, ip: IpAddr) -> bool {
        ip.is_loopback() || self.local_addresses.contains(&ip) || self.node_ips.contains(&ip)
    }

    /// The local addresses of the proxier's family that `--nodeport-addresses` selects,
    /// sorted; `None` when nodePortAddresses is empty ("all local addresses").
    pub fn node_port_ips(&self) -> Option<Vec<IpAddr>> {
        if self.node_port_addresses.is_empty() {
            return None;
        }
        let mut ips: Vec<IpAddr> = self
            .local_addresses
            .iter()
            .chain(self.node_ips.iter())
            .copied()
            .filter(|ip| self.family.matches(*ip))
            .filter(|ip| self.node_port_addresses.iter().any(|c| c.contains(*ip)))
            .collect();
        ips.sort();
        ips.dedup();
        Some(ips)
    }
}
