//! kube-proxy's original userspace mode: every service port gets a proxy port on the node
//! where kube-proxy itself accepts connections and relays them to a backend; iptables only
//! steers traffic there (nat table):
//!
//! * `KUBE-PORTALS-CONTAINER`: ClusterIP (and externalIP / LoadBalancer IP) traffic from
//!   pods → `REDIRECT --to-ports <proxy port>`;
//! * `KUBE-PORTALS-HOST`: the same from the node's own processes →
//!   `DNAT --to-destination <node IP>:<proxy port>`;
//! * `KUBE-NODEPORT-CONTAINER` / `KUBE-NODEPORT-HOST`: the same for NodePorts.
//!
//! Proxy ports are allocated deterministically: each service port (`ns/name:port` +
//! protocol) starts at `start + hash % size` of the range and probes upward (wrapping)
//! past ports already taken, visiting service ports in model order. A port keeps its proxy
//! port as long as no earlier service port collides with it, so adding a service rarely
//! moves others. SCTP ports are skipped (the userspace proxy never supported SCTP).

use std::{collections::BTreeSet, fmt::Write as _, net::IpAddr};

use sha2::{Digest, Sha256};

use super::rules::{Jump, Payload, Table, hostport};
use crate::model::{Model, NodeSettings, Protocol, select};

/// The proxy port range (inclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRange {
    pub start: u16,
    pub end: u16,
}

impl Default for PortRange {
    fn default() -> Self {
        Self {
            start: 36000,
            end: 39999,
        }
    }
}

/// One service port and the proxy port that serves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyPort {
    /// `ns/name:port`.
    pub service_port: String,
    pub protocol: Protocol,
    pub proxy_port: u16,
    /// Where the proxy relays connections (`ip:port`).
    pub backends: Vec<String>,
    /// sessionAffinity ClientIP: its timeout in seconds (`None`: round-robin only).
    pub affinity_timeout: Option<u32>,
}

/// The userspace mode's rules and proxy ports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserspaceState {
    pub ports: Vec<ProxyPort>,
    /// The nat table's `KUBE-PORTALS-*` and `KUBE-NODEPORT-*` chains.
    pub iptables: Payload,
}

fn preferred(key: &str, range: PortRange) -> u16 {
    let d = Sha256::digest(key.as_bytes());
    let size = u32::from(range.end.saturating_sub(range.start)) + 1;
    let h = u32::from_be_bytes([d[0], d[1], d[2], d[3]]);
    range.start + u16::try_from(h % size).unwrap_or(0)
}

/// The chains.
pub const CHAINS: [&str; 4] = [
    "KUBE-PORTALS-CONTAINER",
    "KUBE-PORTALS-HOST",
    "KUBE-NODEPORT-CONTAINER",
    "KUBE-NODEPORT-HOST",
];

const PORTALS: &[&str] = &[
    "-m",
    "comment",
    "--comment",
    "handle ClusterIPs; NOTE: this must be before the NodePort rules",
];
const NODEPORTS: &[&str] = &[
    "-m",
    "addrtype",
    "--dst-type",
    "LOCAL",
    "-m",
    "comment",
    "--comment",
    "handle service NodePorts; NOTE: this must be the last rule in the chain",
];

/// The jumps the userspace proxier ensures in the nat table's built-in chains
/// (`iptablesInit`): the portal chains first in PREROUTING (pods) and OUTPUT (the node's own
/// processes), the NodePort chains last, for local destinations.
pub const JUMPS: [Jump; 4] = [
    Jump {
        table: "nat",
        chain: "PREROUTING",
        append: false,
        matches: PORTALS,
        target: CHAINS[0],
    },
    Jump {
        table: "nat",
        chain: "OUTPUT",
        append: false,
        matches: PORTALS,
        target: CHAINS[1],
    },
    Jump {
        table: "nat",
        chain: "PREROUTING",
        append: true,
        matches: NODEPORTS,
        target: CHAINS[2],
    },
    Jump {
        table: "nat",
        chain: "OUTPUT",
        append: true,
        matches: NODEPORTS,
        target: CHAINS[3],
    },
];

/// Computes the userspace mode's rules for `model` on `node`. Host rules DNAT to the node
/// IP of the proxier's family; without one they are left out (logged).
pub fn emit(model: &Model, node: &NodeSettings, range: PortRange) -> UserspaceState {
    let mut nat = Table::default();
    nat.chains.extend(CHAINS.iter().map(|c| c.to_string()));
    let node_ip = node.node_ip();
    if node_ip.is_none() {
        tracing::warn!("no node IP of the proxier's family: KUBE-*-HOST rules are left out");
    }
    let size = usize::from(range.end.saturating_sub(range.start)) + 1;
    let mut taken = BTreeSet::new();
    let mut ports = Vec::new();
    for pv in select::service_ports(model, node) {
        if pv.protocol() == Protocol::Sctp {
            continue;
        }
        let mut port = preferred(&format!("{}{}", pv.name, pv.protocol().lower()), range);
        let mut tries = 0;
        while taken.contains(&port) && tries < size {
            port = if port >= range.end {
                range.start
            } else {
                port + 1
            };
            tries += 1;
        }
        if tries >= size {
            tracing::warn!(service = %pv.name, "proxy port range is full; service port skipped");
            continue;
        }
        taken.insert(port);
        let p = pv.protocol().lower();
        let c = format!("\"{}\"", pv.name);
        let dport = pv.port.port.to_string();
        let portal = |nat: &mut Table, ip: IpAddr| {
            let dst = match ip {
                IpAddr::V4(v) => format!("{v}/32"),
                IpAddr::V6(v) => format!("{v}/128"),
            };
            let m = format!("-m comment --comment {c} -p {p} -m {p} -d {dst} --dport {dport}");
            nat.rules.push(format!(
                "-A KUBE-PORTALS-CONTAINER {m} -j REDIRECT --to-ports {port}"
            ));
            if let Some(nip) = node_ip {
                nat.rules.push(format!(
                    "-A KUBE-PORTALS-HOST {m} -j DNAT --to-destination {}",
                    hostport(nip, port)
                ));
            }
        };
        portal(&mut nat, pv.cluster_ip);
        for ip in pv.external_ips.iter().chain(pv.load_balancer_ips.iter()) {
            portal(&mut nat, *ip);
        }
        if let Some(np) = pv.node_port {
            let m = format!("-m comment --comment {c} -p {p} -m {p} --dport {np}");
            nat.rules.push(format!(
                "-A KUBE-NODEPORT-CONTAINER {m} -j REDIRECT --to-ports {port}"
            ));
            if let Some(nip) = node_ip {
                nat.rules.push(format!(
                    "-A KUBE-NODEPORT-HOST {m} -j DNAT --to-destination {}",
                    hostport(nip, port)
                ));
            }
        }
        let eps = if pv.internal_policy_local() {
            &pv.categorized.local
        } else {
            &pv.categorized.cluster
        };
        ports.push(ProxyPort {
            service_port: pv.name.clone(),
            protocol: pv.protocol(),
            proxy_port: port,
            backends: eps.iter().map(|e| e.to_string()).collect(),
            affinity_timeout: pv.affinity_timeout(),
        });
    }
    UserspaceState {
        ports,
        iptables: Payload {
            filter: Table::default(),
            nat,
        },
    }
}

impl UserspaceState {
    /// `iptables-restore --noflush` input for the nat chains, preceded by `#` lines listing
    /// the proxy ports.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for p in &self.ports {
            let _ = writeln!(
                out,
                "# proxy port {} <- {} {} -> {}",
                p.proxy_port,
                p.service_port,
                p.protocol,
                if p.backends.is_empty() {
                    "(no endpoints)".to_string()
                } else {
                    p.backends.join(",")
                }
            );
        }
        let full = self.iptables.render();
        // Only the nat table carries userspace rules.
        if let Some(i) = full.find("*nat") {
            out.push_str(&full[i..]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preferred_port_stays_in_range() {
        let r = PortRange {
            start: 36000,
            end: 36009,
        };
        for k in ["a", "b", "ns/svc:http", "x/y"] {
            let p = preferred(k, r);
            assert!((36000..=36009).contains(&p));
        }
    }
}
