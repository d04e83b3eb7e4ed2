//! `xlb agent --config FILE`: a YAML file that mirrors kube-proxy's KubeProxyConfiguration
//! where the concept exists in xlb. Flags override it. Unknown keys are an error naming the
//! key, so a typo is never silently ignored.

use std::{net::IpAddr, path::Path, time::Duration};

use serde::Deserialize;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Invalid {
        path: String,
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    #[error("{path}: {field}: {value:?} is not a duration (e.g. 100ms, 1s, 2m)")]
    Duration {
        path: String,
        field: &'static str,
        value: String,
    },
}

/// The subset of KubeProxyConfiguration xlb understands.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentConfig {
    /// `kubeproxy.config.k8s.io/v1alpha1` (or xlb's own).
    pub api_version: Option<String>,
    /// `KubeProxyConfiguration`.
    pub kind: Option<String>,
    /// This node's name.
    pub hostname_override: Option<String>,
    /// The pod CIDR; kept for the emitters' local-traffic detection and north-south masquerade.
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: Option<String>,
    /// Where NodePorts are served (addresses of either family; kube-proxy also takes CIDRs
    /// or "primary").
    pub node_port_addresses: Option<Vec<IpAddr>>,
    /// Smallest interval between syncs, e.g. `100ms`.
    pub min_sync_period: Option<String>,
    /// `IP:PORT` of `/healthz` and `/livez` ("" disables).
    pub healthz_bind_address: Option<String>,
    /// `IP:PORT` of `/metrics` ("" disables).
    pub metrics_bind_address: Option<String>,
    /// Conntrack settings. The sizes apply; the timeouts are accepted (so a kube-proxy file
    /// loads) and reported as unused: xlb's assured-flow collector (`datapath::ct_gc`) has
    /// kube-proxy's defaults built in.
    pub conntrack: Option<ConntrackConfig>,
}

/// KubeProxyConntrackConfiguration's keys.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConntrackConfig {
    pub max_per_core: Option<u32>,
    pub min: Option<u32>,
    pub tcp_established_timeout: Option<String>,
    pub tcp_close_wait_timeout: Option<String>,
    pub tcp_be_liberal: Option<bool>,
    pub udp_timeout: Option<String>,
    pub udp_stream_timeout: Option<String>,
}

impl AgentConfig {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: shown.clone(),
            source,
        })?;
        Self::parse(&shown, &text)
    }

    /// Parses config text (`path` only names it in errors).
    pub fn parse(path: &str, text: &str) -> Result<Self, ConfigError> {
        let c: AgentConfig =
            crate::source::yaml::from_str(text).map_err(|source| ConfigError::Invalid {
                path: path.to_string(),
                source: Box::new(source),
            })?;
        if let Some(v) = &c.min_sync_period {
            parse_duration(v).ok_or_else(|| ConfigError::Duration {
                path: path.to_string(),
                field: "minSyncPeriod",
                value: v.clone(),
            })?;
        }
        Ok(c)
    }

    /// `minSyncPeriod` as a duration (validated by [`AgentConfig::parse`]).
    pub fn min_sync(&self) -> Option<Duration> {
        self.min_sync_period.as_deref().and_then(parse_duration)
    }
}

/// Precedence, one rule for every setting: a flag (or its environment variable, which clap
/// reads as the flag) wins, then the config file, then kube-proxy's default.
impl AgentConfig {
    /// The node's name as configured (the caller falls back to $NODE_NAME, the hostname).
    pub fn hostname(&self, flag: Option<String>) -> Option<String> {
        flag.or_else(|| self.hostname_override.clone())
    }

    /// Where NodePorts are served; empty: the node interfaces' addresses.
    pub fn node_port_addresses(&self, flag: Vec<IpAddr>) -> Vec<IpAddr> {
        if flag.is_empty() {
            self.node_port_addresses.clone().unwrap_or_default()
        } else {
            flag
        }
    }

    /// The smallest interval between syncs (default 100 ms).
    pub fn min_sync_or(&self, flag_ms: Option<u64>) -> Duration {
        flag_ms
            .map(Duration::from_millis)
            .or(self.min_sync())
            .unwrap_or(Duration::from_millis(100))
    }

    /// Where health is served (kube-proxy: 0.0.0.0:10256; "" disables).
    pub fn healthz(&self, flag: Option<String>) -> String {
        flag.or_else(|| self.healthz_bind_address.clone())
            .unwrap_or_else(|| "0.0.0.0:10256".into())
    }

    /// Where metrics are served (kube-proxy: 127.0.0.1:10249; "" disables).
    pub fn metrics(&self, flag: Option<String>) -> String {
        flag.or_else(|| self.metrics_bind_address.clone())
            .unwrap_or_else(|| "127.0.0.1:10249".into())
    }

    /// Conntrack entries for `cpus` CPUs from kube-proxy's maxPerCore and min (flags, then the
    /// file, then kube-proxy's defaults).
    pub fn conntrack_entries(&self, max_per_core: Option<u32>, min: Option<u32>, cpus: u32) -> u32 {
        use crate::datapath::sizes::{CONNTRACK_MAX_PER_CORE, CONNTRACK_MIN, conntrack_entries};
        let ct = self.conntrack.clone().unwrap_or_default();
        conntrack_entries(
            max_per_core
                .or(ct.max_per_core)
                .unwrap_or(CONNTRACK_MAX_PER_CORE),
            min.or(ct.min).unwrap_or(CONNTRACK_MIN),
            cpus,
        )
    }

    /// Names the keys that are read but do not apply to xlb (conntrack timeouts: the
    /// collector of assured flows uses kube-proxy's defaults).
    pub fn unused(&self) -> Vec<&'static str> {
        let Some(ct) = &self.conntrack else {
            return Vec::new();
        };
        [
            (
                "conntrack.tcpEstablishedTimeout",
                ct.tcp_established_timeout.is_some(),
            ),
            (
                "conntrack.tcpCloseWaitTimeout",
                ct.tcp_close_wait_timeout.is_some(),
            ),
            ("conntrack.tcpBeLiberal", ct.tcp_be_liberal.is_some()),
            ("conntrack.udpTimeout", ct.udp_timeout.is_some()),
            (
                "conntrack.udpStreamTimeout",
                ct.udp_stream_timeout.is_some(),
            ),
        ]
        .into_iter()
        .filter_map(|(k, set)| set.then_some(k))
        .collect()
    }
}

/// Parses Go-style durations of one unit: `250ms`, `1s`, `2m`, `1h`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.')?;
    let (n, unit) = s.split_at(split);
    let n: f64 = n.parse().ok()?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(secs).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
hostnameOverride: node1
clusterCIDR: 10.0.0.0/8
nodePortAddresses: [192.0.2.1]
minSyncPeriod: 250ms
healthzBindAddress: 0.0.0.0:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {tcpEstablishedTimeout: 24h0m0s, udpTimeout: 30s}
"#;

    #[test]
    fn kube_proxy_configuration_loads() {
        let c = AgentConfig::parse("c.yaml", GOOD).expect("valid");
        assert_eq!(c.hostname_override.as_deref(), Some("node1"));
        assert_eq!(c.min_sync(), Some(Duration::from_millis(250)));
        assert_eq!(
            c.node_port_addresses,
            Some(vec![std::net::Ipv4Addr::new(192, 0, 2, 1).into()])
        );
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = AgentConfig::parse("c.yaml", "minSyncPeriodd: 1s\n").expect_err("unknown key");
        assert!(e.to_string().contains("minSyncPeriodd"), "{e}");
        let e =
            AgentConfig::parse("c.yaml", "conntrack: {udpTimout: 1s}\n").expect_err("unknown key");
        assert!(e.to_string().contains("udpTimout"), "{e}");
        let e = AgentConfig::parse("c.yaml", "minSyncPeriod: soon\n").expect_err("bad duration");
        assert!(e.to_string().contains("minSyncPeriod"), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("100ms"), Some(Duration::from_millis(100)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("10"), None);
    }
}
