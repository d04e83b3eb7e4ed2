//! A bridge-based pod network (the CNI `bridge` plugin; flannel and kubenet are built the
//! same way), beside [`crate::topology`]'s routed one: each node namespace has a Linux
//! bridge `cbr0` holding the node's pod-subnet gateway, every pod's veth is a port of it,
//! and nodes reach each other's pod subnets over an underlay.
//!
//! ```text
//!  node k: cbr0 10.88.k.1/24 ── xv-<pod> ══ eth0 10.88.k.(10+i)/24 (default via 10.88.k.1)
//!          ul<j> 10.0.0.k/24 ══ ul<k> 10.0.0.j/24 on node j; 10.88.j.0/24 via 10.0.0.j
//! ```
//!
//! The lab leaves `accept_local` and the bridge's netfilter settings (`bridge-nf-call-*`)
//! at the kernel's defaults, as a CNI does.

use std::net::Ipv4Addr;

use crate::{netns::Netns, topology::Pod};

/// The bridge every node's pods hang on.
pub const BRIDGE: &str = "cbr0";

/// Node `k`'s pod-subnet gateway, held by its bridge (`10.88.k.1`).
pub fn bridge_gateway(node: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 88, node, 1)
}

/// Node `k`'s `i`-th pod (from 0): `10.88.k.(10 + i)`.
pub fn bridge_pod_ip(node: u8, i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 88, node, 10 + i)
}

/// Node `k`'s address on the underlay (`10.0.0.k`).
pub fn bridge_node_ip(node: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, node)
}

/// A node namespace with a pod bridge and its pods, removed (pods first) on drop.
#[derive(Debug)]
pub struct BridgeNode {
    /// Its number `k` (1..=254): its pod subnet is `10.88.k.0/24`.
    pub index: u8,
    pub pods: Vec<Pod>,
    /// Declared last so the pods go first on drop.
    pub ns: Netns,
}

impl BridgeNode {
    /// Node `<tag>-bn<index>`: forwarding, no reverse-path filter, the bridge up with the
    /// gateway address.
    pub fn new(tag: &str, index: u8) -> Result<Self, String> {
        let ns = Netns::new(&format!("{tag}-bn{index}"))?;
        ns.sysctl(&[
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
        ])?;
        ns.ip(&["link", "add", BRIDGE, "type", "bridge"])?;
        let gw = format!("{}/24", bridge_gateway(index));
        ns.ip(&["addr", "add", &gw, "dev", BRIDGE])?;
        ns.ip(&["link", "set", BRIDGE, "up"])?;
        Ok(BridgeNode {
            index,
            pods: Vec::new(),
            ns,
        })
    }

    /// Adds pod `name` (namespace `<tag>-<name>`) at the next [`bridge_pod_ip`], its veth's
    /// node side `xv-<name>` a port of the bridge.
    pub fn add_pod(&mut self, tag: &str, name: &str) -> Result<&Pod, String> {
        let ip = bridge_pod_ip(self.index, self.pods.len() as u8);
        let host_if = format!("xv-{name}");
        let ns = Netns::new(&format!("{tag}-{name}"))?;
        self.ns.ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
        ])?;
        self.ns.ip(&["link", "set", &host_if, "master", BRIDGE])?;
        self.ns.ip(&["link", "set", &host_if, "up"])?;
        ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
        ns.ip(&["link", "set", "eth0", "up"])?;
        let gw = bridge_gateway(self.index).to_string();
        ns.ip(&["route", "add", "default", "via", &gw, "dev", "eth0"])?;
        self.pods.push(Pod {
            name: name.to_string(),
            ns,
            ip,
            ip6: None,
            host_if,
        });
        Ok(&self.pods[self.pods.len() - 1])
    }

    /// Joins this node and `other` with an underlay veth (`ul<other>` here, `ul<self>`
    /// there, addresses [`bridge_node_ip`]) and routes each one's pod subnet over it.
    pub fn join(&self, other: &BridgeNode) -> Result<(), String> {
        let (here, there) = (self.underlay_to(other), other.underlay_to(self));
        self.ns.ip(&[
            "link",
            "add",
            &here,
            "type",
            "veth",
            "peer",
            "name",
            &there,
            "netns",
            &other.ns.name,
        ])?;
        for (node, iface, peer) in [(self, &here, other), (other, &there, self)] {
            let own = format!("{}/24", bridge_node_ip(node.index));
            node.ns.ip(&["addr", "add", &own, "dev", iface])?;
            node.ns.ip(&["link", "set", iface, "up"])?;
            let subnet = format!("10.88.{}.0/24", peer.index);
            let via = bridge_node_ip(peer.index).to_string();
            node.ns.ip(&["route", "add", &subnet, "via", &via])?;
        }
        Ok(())
    }

    /// The name of this node's underlay interface to `other` (`ul<other's index>`).
    pub fn underlay_to(&self, other: &BridgeNode) -> String {
        format!("ul{}", other.index)
    }
}
