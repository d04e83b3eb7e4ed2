//! The lab topology: a node namespace with one veth per pod namespace, routed like a CNI
//! that gives each pod a /32 (Calico-style):
//!
//! ```text
//!  client 10.244.1.2/32 ─eth0══xv-client─┐
//!  backend-1 10.244.2.2/32 ─eth0══xv-backend-1─┤ node (forwarding, xlb attached to xv-*)
//!  backend-N …             ─eth0══xv-…─────────┘
//! ```
//! Each pod's default route goes to 169.254.1.1, which every node-side veth carries; the node
//! routes each pod address to its veth. Any address can be a pod's, so the endpoints of any
//! services file can be hosted. The node has no default route: an address nobody rewrites
//! has nowhere to go.
//!
//! A pod can be made dual-stack ([`Pod::add_ipv6`]): an IPv6 /128 routed by the node to its
//! veth as the IPv4 /32 is, its default route through the link-local [`GATEWAY6`] that the
//! node side of its veth carries.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::netns::Netns;

/// The gateway address every pod routes through (on each node-side veth).
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

/// The link-local gateway of every dual-stack pod's IPv6 default route (on each node-side
/// veth).
pub const GATEWAY6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

/// A pod: its namespace and address.
#[derive(Debug)]
pub struct Pod {
    pub name: String,
    pub ns: Netns,
    pub ip: Ipv4Addr,
    /// Its IPv6 address once [`Pod::add_ipv6`] gave it one.
    pub ip6: Option<Ipv6Addr>,
    /// The node-side interface of its veth.
    pub host_if: String,
}

/// Node, client and backends, removed on drop.
#[derive(Debug)]
pub struct Topology {
    pub tag: String,
    pub client: Pod,
    pub backends: Vec<Pod>,
    /// Declared last so the pods go first on drop.
    pub node: Netns,
}

/// The first node's address on the underlay to a [`RemoteNode`].
pub const NODE1_UNDERLAY: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// The second node's address on the underlay.
pub const NODE2_UNDERLAY: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

/// A second node, joined to the first by an underlay veth (`10.0.0.1/24` ↔ `10.0.0.2/24`),
/// with pods of its own; each node routes the other's pod addresses over the underlay.
#[derive(Debug)]
pub struct RemoteNode {
    pub pods: Vec<Pod>,
    /// Declared last so the pods go first on drop.
    pub ns: Netns,
}

/// The address of pod `index` on the remote node (`10.245.<index>.2`).
pub fn remote_pod_ip(index: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 245, index, 2)
}

/// The IPv6 address of pod `index` on the remote node once it is dual-stack
/// (`fd00:10:245:<index>::2`, beside [`remote_pod_ip`]).
pub fn remote_pod_ip6(index: u8) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x10, 0x245, index.into(), 0, 0, 0, 2)
}

/// The first node's IPv6 address on the underlay ([`RemoteNode::dual_stack`]).
pub const NODE1_UNDERLAY6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0, 0, 0, 0, 0, 1);
/// The second node's IPv6 address on the underlay.
pub const NODE2_UNDERLAY6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0, 0, 0, 0, 0, 2);

/// The address of pod `index` in [`Topology::build`] (client = 1, backend k = k + 1).
pub fn pod_ip(index: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, index, 2)
}

/// The IPv6 address the lab gives pod `index` when it is dual-stack:
/// `fd00:10:244:<index>::2`, beside [`pod_ip`]'s `10.244.<index>.2`.
pub fn pod_ip6(index: u8) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x10, 0x244, index.into(), 0, 0, 0, 2)
}

impl Topology {
    /// Builds node, client and `backends` backend pods (`backend-k` at `pod_ip(k + 1)`).
    pub fn build(tag: &str, backends: usize) -> Result<Self, String> {
        let ips: Vec<Ipv4Addr> = (1..=backends).map(|k| pod_ip((k + 1) as u8)).collect();
        Self::with_pods(tag, pod_ip(1), &ips)
    }

    /// Builds node, a client at `client_ip` and one backend pod per address in `backends`.
    pub fn with_pods(
        tag: &str,
        client_ip: Ipv4Addr,
        backends: &[Ipv4Addr],
    ) -> Result<Self, String> {
        let node = Netns::new(&format!("{tag}-node"))?;
        node.sysctl(&[
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
        ])?;
        lift_icmp_limits(&node)?;
        let client = add_pod(&node, tag, "client", "xv-client", client_ip)?;
        let mut topo = Topology {
            tag: tag.to_string(),
            client,
            backends: Vec::new(),
            node,
        };
        for ip in backends {
            topo.add_backend_at(*ip)?;
        }
        Ok(topo)
    }

    /// Adds an "external" client on a node uplink: the node's `uplink` interface has
    /// `192.0.2.1/24`, the client (namespace `<tag>-ext`) `192.0.2.10/24` (TEST-NET-1, only
    /// inside these namespaces).
    pub fn add_external_client(&self, uplink: &str) -> Result<Pod, String> {
        let ns = Netns::new(&format!("{}-ext", self.tag))?;
        self.node.ip(&[
            "link", "add", uplink, "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
        ])?;
        self.node
            .ip(&["addr", "add", "192.0.2.1/24", "dev", uplink])?;
        self.node.ip(&["link", "set", uplink, "up"])?;
        self.node
            .sysctl(&[&format!("net.ipv4.conf.{uplink}.rp_filter=0")])?;
        let ip = Ipv4Addr::new(192, 0, 2, 10);
        ns.ip(&["addr", "add", "192.0.2.10/24", "dev", "eth0"])?;
        ns.ip(&["link", "set", "eth0", "up"])?;
        Ok(Pod {
            name: "external".into(),
            ns,
            ip,
            ip6: None,
            host_if: uplink.to_string(),
        })
    }

    /// Gives the external client of [`Topology::add_external_client`] an IPv6 address
    /// `client6` on its `eth0` and the node's `uplink` the address `node6`, both in one /64.
    pub fn add_external_ipv6(
        &self,
        ext: &mut Pod,
        uplink: &str,
        node6: Ipv6Addr,
        client6: Ipv6Addr,
    ) -> Result<(), String> {
        let own = format!("{node6}/64");
        self.node
            .ip(&["-6", "addr", "add", &own, "dev", uplink, "nodad"])?;
        let own = format!("{client6}/64");
        ext.ns
            .ip(&["-6", "addr", "add", &own, "dev", "eth0", "nodad"])?;
        ext.ip6 = Some(client6);
        Ok(())
    }

    /// Adds a second node (namespace `<tag>-node2`) on an underlay: this node's `underlay`
    /// interface (`10.0.0.1/24`) to the remote node's `ul0` (`10.0.0.2/24`), with `mtu` on
    /// both ends, and `pods` pods (`n2-backend-k` at `remote_pod_ip(k)`) behind it.
    pub fn add_remote_node(
        &self,
        underlay: &str,
        mtu: u32,
        pods: usize,
    ) -> Result<RemoteNode, String> {
        let ns = Netns::new(&format!("{}-node2", self.tag))?;
        ns.sysctl(&[
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
        ])?;
        let mtu = mtu.to_string();
        self.node.ip(&[
            "link", "add", underlay, "mtu", &mtu, "type", "veth", "peer", "name", "ul0", "mtu",
            &mtu, "netns", &ns.name,
        ])?;
        self.node.ip(&[
            "addr",
            "add",
            &format!("{NODE1_UNDERLAY}/24"),
            "dev",
            underlay,
        ])?;
        self.node.ip(&["link", "set", underlay, "up"])?;
        self.node
            .sysctl(&[&format!("net.ipv4.conf.{underlay}.rp_filter=0")])?;
        ns.ip(&["addr", "add", &format!("{NODE2_UNDERLAY}/24"), "dev", "ul0"])?;
        ns.ip(&["link", "set", "ul0", "up"])?;
        // Each node reaches the other's pods over the underlay (the first node's pods are
        // 10.244.0.0/16, the second's 10.245.0.0/16).
        ns.ip(&[
            "route",
            "add",
            "10.244.0.0/16",
            "via",
            &NODE1_UNDERLAY.to_string(),
        ])?;
        let mut remote = RemoteNode {
            pods: Vec::new(),
            ns,
        };
        for k in 1..=pods {
            let ip = remote_pod_ip(k as u8);
            let pod = add_pod(
                &remote.ns,
                &self.tag,
                &format!("n2-backend-{k}"),
                &format!("xv-n2-b{k}"),
                ip,
            )?;
            self.node.ip(&[
                "route",
                "add",
                &format!("{ip}/32"),
                "via",
                &NODE2_UNDERLAY.to_string(),
            ])?;
            remote.pods.push(pod);
        }
        Ok(remote)
    }

    /// Adds one more backend pod (`backend-N`) at the next `pod_ip` address.
    pub fn add_backend(&mut self) -> Result<&Pod, String> {
        let ip = pod_ip((self.backends.len() + 2) as u8);
        self.add_backend_at(ip)
    }

    /// Adds one more backend pod (`backend-N`) at `ip`.
    pub fn add_backend_at(&mut self, ip: Ipv4Addr) -> Result<&Pod, String> {
        let k = self.backends.len() + 1;
        let pod = add_pod(
            &self.node,
            &self.tag,
            &format!("backend-{k}"),
            &format!("xv-backend-{k}"),
            ip,
        )?;
        self.backends.push(pod);
        Ok(&self.backends[k - 1])
    }
}

fn add_pod(
    node: &Netns,
    tag: &str,
    name: &str,
    host_if: &str,
    ip: Ipv4Addr,
) -> Result<Pod, String> {
    let ns = Netns::new(&format!("{tag}-{name}"))?;
    lift_icmp_limits(&ns)?;
    wire(node, &ns, host_if, ip)?;
    Ok(Pod {
        name: name.to_string(),
        ns,
        ip,
        ip6: None,
        host_if: host_if.to_string(),
    })
}

/// The kernel rate-limits the ICMP errors a namespace sends (per destination,
/// `icmp_ratelimit`, and overall, `icmp_msgs_per_sec`): a burst of flows that iptables or
/// nftables REJECT in the node, or that reach a pod port nobody listens on, would see
/// timeouts instead of port unreachables. The lab lifts both in its own namespaces. Kernels
/// where `icmp_msgs_per_sec` is global (before 6.x) keep their limit: said on stderr.
fn lift_icmp_limits(ns: &Netns) -> Result<(), String> {
    ns.sysctl(&["net.ipv4.icmp_ratelimit=0", "net.ipv6.icmp.ratelimit=0"])?;
    if let Err(e) = ns.sysctl(&[
        "net.ipv4.icmp_msgs_per_sec=100000",
        "net.ipv4.icmp_msgs_burst=100000",
    ]) {
        eprintln!(
            "{}: ICMP errors stay rate-limited overall (refusals may show as drops): {e}",
            ns.name
        );
    }
    Ok(())
}

impl Pod {
    /// Deletes the pod's veth and creates it again, same names and addresses (a restarted
    /// pod: the node-side interface gets a new index).
    pub fn recreate_veth(&self, node: &Netns) -> Result<(), String> {
        node.ip(&["link", "del", &self.host_if])?;
        wire(node, &self.ns, &self.host_if, self.ip)?;
        match self.ip6 {
            Some(ip6) => wire6(node, &self.ns, &self.host_if, ip6),
            None => Ok(()),
        }
    }

    /// Makes the pod dual-stack: `ip6` on its `eth0`, routed to its veth by `node` (which
    /// must forward IPv6: [`Topology::enable_ipv6`]), its default route via [`GATEWAY6`].
    pub fn add_ipv6(&mut self, node: &Netns, ip6: Ipv6Addr) -> Result<(), String> {
        wire6(node, &self.ns, &self.host_if, ip6)?;
        self.ip6 = Some(ip6);
        Ok(())
    }
}

impl RemoteNode {
    /// Makes the underlay and the remote node's pods dual-stack: [`NODE1_UNDERLAY6`] on the
    /// first node's `underlay` interface, [`NODE2_UNDERLAY6`] on `ul0`, pod `k` at
    /// [`remote_pod_ip6`]`(k)`; each node routes the other's IPv6 pods over the underlay
    /// (the first node's are `fd00:10:244::/48`). The first node must forward IPv6.
    pub fn dual_stack(&mut self, node1: &Netns, underlay: &str) -> Result<(), String> {
        self.ns.sysctl(&["net.ipv6.conf.all.forwarding=1"])?;
        let own = format!("{NODE1_UNDERLAY6}/64");
        node1.ip(&["-6", "addr", "add", &own, "dev", underlay, "nodad"])?;
        let own = format!("{NODE2_UNDERLAY6}/64");
        self.ns
            .ip(&["-6", "addr", "add", &own, "dev", "ul0", "nodad"])?;
        let via = NODE1_UNDERLAY6.to_string();
        self.ns
            .ip(&["-6", "route", "add", "fd00:10:244::/48", "via", &via])?;
        let via = NODE2_UNDERLAY6.to_string();
        for (k, pod) in self.pods.iter_mut().enumerate() {
            let ip6 = remote_pod_ip6((k + 1) as u8);
            pod.add_ipv6(&self.ns, ip6)?;
            node1.ip(&["-6", "route", "add", &format!("{ip6}/128"), "via", &via])?;
        }
        Ok(())
    }
}

impl Topology {
    /// Lets the node forward IPv6 between its pods (their addresses come with
    /// [`Pod::add_ipv6`]).
    pub fn enable_ipv6(&self) -> Result<(), String> {
        self.node.sysctl(&["net.ipv6.conf.all.forwarding=1"])
    }

    /// Makes the client and every backend dual-stack: pod `k` of [`Topology::build`] gets
    /// [`pod_ip6`]`(k)` (client 1, backend k at k + 1).
    pub fn dual_stack(&mut self) -> Result<(), String> {
        self.enable_ipv6()?;
        self.client.add_ipv6(&self.node, pod_ip6(1))?;
        for (k, pod) in self.backends.iter_mut().enumerate() {
            pod.add_ipv6(&self.node, pod_ip6((k + 2) as u8))?;
        }
        Ok(())
    }
}

/// The IPv6 half of a pod's wiring: the node side of the veth carries the link-local
/// [`GATEWAY6`] and routes `ip6` to it; the pod has `ip6` and a default route via the
/// gateway. No duplicate address detection: the addresses are usable at once.
fn wire6(node: &Netns, ns: &Netns, host_if: &str, ip6: Ipv6Addr) -> Result<(), String> {
    let gw = format!("{GATEWAY6}/64");
    node.ip(&["-6", "addr", "add", &gw, "dev", host_if, "nodad"])?;
    node.ip(&["-6", "route", "add", &format!("{ip6}/128"), "dev", host_if])?;
    let own = format!("{ip6}/128");
    ns.ip(&["-6", "addr", "add", &own, "dev", "eth0", "nodad"])?;
    let gw = GATEWAY6.to_string();
    ns.ip(&["-6", "route", "add", "default", "via", &gw, "dev", "eth0"])?;
    Ok(())
}

/// The veth between `node` (`host_if`) and a pod namespace (`eth0`, address `ip`), with the
/// routes both ways.
fn wire(node: &Netns, ns: &Netns, host_if: &str, ip: Ipv4Addr) -> Result<(), String> {
    node.ip(&[
        "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
    ])?;
    node.ip(&["addr", "add", &format!("{GATEWAY}/32"), "dev", host_if])?;
    node.ip(&["link", "set", host_if, "up"])?;
    node.sysctl(&[&format!("net.ipv4.conf.{host_if}.rp_filter=0")])?;
    node.ip(&["route", "add", &format!("{ip}/32"), "dev", host_if])?;
    ns.ip(&["addr", "add", &format!("{ip}/32"), "dev", "eth0"])?;
    ns.ip(&["link", "set", "eth0", "up"])?;
    ns.ip(&[
        "route",
        "add",
        &format!("{GATEWAY}"),
        "dev",
        "eth0",
        "scope",
        "link",
    ])?;
    ns.ip(&[
        "route",
        "add",
        "default",
        "via",
        &GATEWAY.to_string(),
        "dev",
        "eth0",
        "onlink",
    ])?;
    Ok(())
}
