//! The `kind: TestConfig` header of kube-proxy conformance inputs: node settings (and the
//! case's bookkeeping) in the first document of a case file.
//!
//! Mapping to [`NodeSettings`] and the writer's [`WriterOptions`]: `nodeName`, `ipFamily`, `nodeIP`/`nodeIPs`,
//! `nodeInterfaceAddresses` (every listed address is local; without it, iptables and
//! nftables cases use the upstream fake's interfaces 127.0.0.1, ::1, 192.168.0.2,
//! 192.168.1.2, 192.168.99.11, 2001:db8::1, 2001:db8:1::2, and ipvs cases their `nodeIPs`),
//! `localTrafficDetector`, `masqueradeMark` (kept literally), `masqueradeAll`,
//! `localhostNodePorts`, `nodePortAddresses`, `iptablesHasRandomFully`,
//! `conntrackTCPBeLiberal`, `nfacctCounters`, `serviceCIDRs`, `ipvsScheduler`.

use std::net::IpAddr;

use serde::Deserialize;
use serde_json::Value;

use super::{SourceError, convert::parse_ip};
use crate::model::{
    Cidr, IpFamily, LocalDetector, NodeSettings,
    proxy::{HostFeatures, IptablesOptions, IpvsOptions, MasqueradeMark, WriterOptions},
};

/// The annotation multi-step cases put on objects: the steps (`"1-10"`, `"6"`) they exist in.
pub const PRESENT_IN_STEPS: &str = "peertest.kube-proxy.local/present-in-steps";

/// The upstream fakes' interface addresses (see module docs).
pub const DEFAULT_TEST_ADDRESSES: [&str; 7] = [
    "127.0.0.1",
    "::1",
    "192.168.0.2",
    "192.168.1.2",
    "192.168.99.11",
    "2001:db8::1",
    "2001:db8:1::2",
];

/// A parsed `TestConfig` document.
#[derive(Clone, Debug)]
pub struct TestConfig {
    /// `metadata.name`.
    pub name: String,
    /// `iptables`, `nftables` or `ipvs`.
    pub mode: String,
    /// The `compare` field (first word tells the mode of comparison).
    pub compare: String,
    /// `syncPeriod` in seconds, when given.
    pub sync_period_secs: Option<u64>,
    /// The node settings the case was written for.
    pub settings: NodeSettings,
    /// The writer settings of its mode.
    pub options: WriterOptions,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct Spec {
    mode: String,
    ip_family: Option<String>,
    node_name: String,
    #[serde(rename = "nodeIP")]
    node_ip: Option<String>,
    #[serde(rename = "nodeIPs")]
    node_ips: Vec<String>,
    node_interface_addresses: Option<std::collections::BTreeMap<String, Vec<String>>>,
    local_traffic_detector: Option<Detector>,
    masquerade_mark: Option<String>,
    masquerade_all: bool,
    localhost_node_ports: Option<bool>,
    node_port_addresses: Vec<String>,
    iptables_has_random_fully: Option<bool>,
    #[serde(rename = "conntrackTCPBeLiberal")]
    conntrack_tcp_be_liberal: bool,
    nfacct_counters: std::collections::BTreeMap<String, bool>,
    #[serde(rename = "serviceCIDRs")]
    service_cidrs: Vec<String>,
    ipvs_scheduler: Option<String>,
    sync_period: Option<String>,
    compare: String,
}

#[derive(Clone, Deserialize, Default)]
#[serde(default)]
struct Detector {
    mode: String,
    cidr: Option<String>,
    interface: Option<String>,
}

fn invalid(object: &str, field: &str, value: &str, reason: &str) -> SourceError {
    SourceError::Invalid {
        kind: "TestConfig",
        object: object.to_string(),
        field: field.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

fn ip(object: &str, field: &str, raw: &str) -> Result<IpAddr, SourceError> {
    parse_ip(raw).ok_or_else(|| invalid(object, field, raw, "not an IP address"))
}

fn cidr(object: &str, field: &str, raw: &str) -> Result<Cidr, SourceError> {
    Cidr::parse_sloppy(raw).map_err(|e| invalid(object, field, raw, &e.to_string()))
}

/// Parses a `TestConfig` document (already known to be one).
pub fn parse(value: &Value) -> Result<TestConfig, SourceError> {
    let name = value
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(|n| n.as_str())
        .unwrap_or("")
        .to_string();
    let spec_value = value.get("spec").cloned().unwrap_or(Value::Null);
    let spec: Spec = serde_json::from_value(spec_value)
        .map_err(|e| invalid(&name, "spec", "", &e.to_string()))?;
    let family = match spec.ip_family.as_deref() {
        None | Some("IPv4") => IpFamily::V4,
        Some("IPv6") => IpFamily::V6,
        Some(other) => return Err(invalid(&name, "spec.ipFamily", other, "IPv4 or IPv6")),
    };
    let (node_ips, local_addresses) = addresses(&spec, &name)?;
    let detector = detector(spec.local_traffic_detector.clone(), &name)?;
    let mut node_port_addresses = Vec::new();
    for raw in &spec.node_port_addresses {
        node_port_addresses.push(cidr(&name, "spec.nodePortAddresses", raw)?);
    }
    let mut service_cidrs = Vec::new();
    for raw in &spec.service_cidrs {
        service_cidrs.push(cidr(&name, "spec.serviceCIDRs", raw)?);
    }
    let settings = NodeSettings {
        node_name: spec.node_name.clone(),
        zone: None,
        family,
        node_ips,
        local_addresses,
        detector,
        masquerade_all: spec.masquerade_all,
        localhost_node_ports: spec.localhost_node_ports.unwrap_or(true),
        node_port_addresses,
        service_cidrs,
    };
    let options = writer_options(&spec, &name)?;
    Ok(TestConfig {
        name,
        mode: spec.mode,
        compare: spec.compare,
        sync_period_secs: spec
            .sync_period
            .as_deref()
            .and_then(|s| s.trim().trim_end_matches('s').parse().ok()),
        settings,
        options,
    })
}

/// The node IPs and every local address (`nodeInterfaceAddresses`, else the upstream
/// fakes' addresses; ipvs cases: the node IPs).
fn addresses(spec: &Spec, name: &str) -> Result<(Vec<IpAddr>, Vec<IpAddr>), SourceError> {
    let mut node_ips = Vec::new();
    if let Some(raw) = &spec.node_ip {
        node_ips.push(ip(name, "spec.nodeIP", raw)?);
    }
    for raw in &spec.node_ips {
        node_ips.push(ip(name, "spec.nodeIPs", raw)?);
    }
    let mut local_addresses = Vec::new();
    match &spec.node_interface_addresses {
        Some(ifaces) => {
            for addrs in ifaces.values() {
                for raw in addrs {
                    let addr = raw.split('/').next().unwrap_or(raw);
                    local_addresses.push(ip(name, "spec.nodeInterfaceAddresses", addr)?);
                }
            }
        }
        None if spec.mode == "ipvs" => local_addresses.extend(node_ips.iter().copied()),
        None => {
            for raw in DEFAULT_TEST_ADDRESSES {
                local_addresses.push(ip(name, "default addresses", raw)?);
            }
        }
    }
    Ok((node_ips, local_addresses))
}

/// `localTrafficDetector`.
fn detector(detector: Option<Detector>, name: &str) -> Result<LocalDetector, SourceError> {
    Ok(match detector {
        None => LocalDetector::None,
        Some(d) => match d.mode.as_str() {
            "None" | "" => LocalDetector::None,
            "ClusterCIDR" | "NodeCIDR" => {
                let raw = d.cidr.unwrap_or_default();
                let c = cidr(name, "spec.localTrafficDetector.cidr", &raw)?;
                if d.mode == "ClusterCIDR" {
                    LocalDetector::ClusterCidr(c)
                } else {
                    LocalDetector::NodeCidr(c)
                }
            }
            "BridgeInterface" => LocalDetector::BridgeInterface(d.interface.unwrap_or_default()),
            "InterfaceNamePrefix" => {
                LocalDetector::InterfaceNamePrefix(d.interface.unwrap_or_default())
            }
            other => {
                return Err(invalid(
                    name,
                    "spec.localTrafficDetector.mode",
                    other,
                    "unknown detector",
                ));
            }
        },
    })
}

/// The writer settings: the mark, the host features, the ipvs scheduler.
fn writer_options(spec: &Spec, name: &str) -> Result<WriterOptions, SourceError> {
    let mark = match &spec.masquerade_mark {
        None => MasqueradeMark::default(),
        Some(raw) => MasqueradeMark::literal(raw)
            .ok_or_else(|| invalid(name, "spec.masqueradeMark", raw, "not a number"))?,
    };
    let counter = |n: &str| spec.nfacct_counters.get(n).copied().unwrap_or(false);
    Ok(WriterOptions {
        mark,
        host: HostFeatures {
            random_fully: spec.iptables_has_random_fully.unwrap_or(true),
            tcp_be_liberal: spec.conntrack_tcp_be_liberal,
            nfacct_invalid_dropped: counter("ct_state_invalid_dropped_pkts"),
            nfacct_localhost_nodeports: counter("localhost_nps_accepted_pkts"),
        },
        iptables: IptablesOptions::default(),
        ipvs: IpvsOptions {
            scheduler: spec.ipvs_scheduler.clone().unwrap_or_else(|| "rr".into()),
        },
    })
}

/// Whether an object annotated with [`PRESENT_IN_STEPS`] exists in `step`; objects without
/// the annotation exist in every step.
pub fn present_in_step(value: &Value, step: u32) -> bool {
    let Some(spec) = value
        .get("metadata")
        .and_then(|m| m.get("annotations"))
        .and_then(|a| a.get(PRESENT_IN_STEPS))
        .and_then(|v| v.as_str())
    else {
        return true;
    };
    spec.split(',').any(|part| {
        let part = part.trim();
        match part.split_once('-') {
            Some((a, b)) => match (a.trim().parse::<u32>(), b.trim().parse::<u32>()) {
                (Ok(a), Ok(b)) => (a..=b).contains(&step),
                _ => false,
            },
            None => part.parse::<u32>() == Ok(step),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_ranges() {
        let v: Value = crate::source::yaml::from_str(
            "metadata: {annotations: {peertest.kube-proxy.local/present-in-steps: \"2-5\"}}",
        )
        .expect("yaml");
        assert!(!present_in_step(&v, 1));
        assert!(present_in_step(&v, 2) && present_in_step(&v, 5));
        assert!(!present_in_step(&v, 6));
    }
}
