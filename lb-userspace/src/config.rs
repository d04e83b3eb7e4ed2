//! `xlb agent --config FILE`: a YAML file that mirrors kube-proxy's KubeProxyConfiguration
//! where the concept exists in xlb. Flags override it. Unknown keys are an error naming the
//! key, so a typo is never silently ignored.

use std::{net::IpAddr, path::Path, time::Duration};

use serde::Deserialize;

pub use crate::datapath::sysctl::KernelConntrack;
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
    #[error("{path}: {field}: {value:?} is not a duration (e.g. 100ms, 1s, 2m, 24h0m0s)")]
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
    /// Conntrack settings: they size xlb's conntrack maps and, as kube-proxy does at start,
    /// the kernel's conntrack (`datapath::sysctl`); the timeouts also drive xlb's collector
    /// of assured flows (`datapath::ct_gc`).
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
        let ct = c.conntrack.clone().unwrap_or_default();
        let durations = [
            ("minSyncPeriod", &c.min_sync_period),
            (
                "conntrack.tcpEstablishedTimeout",
                &ct.tcp_established_timeout,
            ),
            ("conntrack.tcpCloseWaitTimeout", &ct.tcp_close_wait_timeout),
            ("conntrack.udpTimeout", &ct.udp_timeout),
            ("conntrack.udpStreamTimeout", &ct.udp_stream_timeout),
        ];
        for (field, value) in durations {
            if let Some(v) = value
                && parse_duration(v).is_none()
            {
                return Err(ConfigError::Duration {
                    path: path.to_string(),
                    field,
                    value: v.clone(),
                });
            }
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

    /// The kernel conntrack settings kube-proxy would apply at start: the table's size
    /// (`max(maxPerCore × cpus, min)`; maxPerCore 0: left alone) and the timeouts (the
    /// file's, else kube-proxy's defaults: TCP established 24 h, close-wait 1 h, UDP ones
    /// left alone; 0 leaves a setting alone). Flags win over the file for the size.
    pub fn kernel_conntrack(
        &self,
        max_per_core: Option<u32>,
        min: Option<u32>,
        cpus: u32,
    ) -> KernelConntrack {
        use crate::datapath::sizes::{CONNTRACK_MAX_PER_CORE, CONNTRACK_MIN};
        let ct = self.conntrack.clone().unwrap_or_default();
        let per_core = max_per_core
            .or(ct.max_per_core)
            .unwrap_or(CONNTRACK_MAX_PER_CORE);
        let floor = min.or(ct.min).unwrap_or(CONNTRACK_MIN);
        let secs = |v: &Option<String>, default: u64| {
            v.as_deref()
                .and_then(parse_duration)
                .map_or(default, |d| d.as_secs())
        };
        KernelConntrack {
            max: match per_core {
                0 => 0,
                n => u64::from(n)
                    .saturating_mul(u64::from(cpus))
                    .max(u64::from(floor)),
            },
            tcp_established_s: secs(&ct.tcp_established_timeout, 24 * 3600),
            tcp_close_wait_s: secs(&ct.tcp_close_wait_timeout, 3600),
            tcp_be_liberal: ct.tcp_be_liberal.unwrap_or(false),
            udp_s: secs(&ct.udp_timeout, 0),
            udp_stream_s: secs(&ct.udp_stream_timeout, 0),
        }
    }
}

/// Parses Go durations (`time.ParseDuration`, as kube-proxy's configuration writes them):
/// one or more decimal numbers, each with a unit of ns, us (µs), ms, s, m, h: `250ms`,
/// `1.5s`, `24h0m0s`; `0` alone is zero. No sign.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let mut rest = s.trim();
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    if rest.is_empty() {
        return None;
    }
    let mut secs = 0.0f64;
    while !rest.is_empty() {
        let n_end = rest.find(|c: char| !c.is_ascii_digit() && c != '.')?;
        let u_end = rest[n_end..]
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .map_or(rest.len(), |i| n_end + i);
        let n: f64 = rest[..n_end].parse().ok()?;
        let unit = match &rest[n_end..u_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        secs += n * unit;
        rest = &rest[u_end..];
    }
    Duration::try_from_secs_f64(secs).ok()
}

/// A duration as Go prints it (`time.Duration.String`) for whole milliseconds: `0s`,
/// `250ms`, `1.5s`, `2m0s`, `24h0m0s`, as kube-proxy's `/configz` shows durations.
pub fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, m, s, frac) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    let secs = match frac {
        0 => format!("{s}s"),
        f => format!("{s}.{}s", format!("{f:03}").trim_end_matches('0')),
    };
    match (h, m) {
        (0, 0) => secs,
        (0, m) => format!("{m}m{secs}"),
        (h, m) => format!("{h}h{m}m{secs}"),
    }
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
        assert_eq!(parse_duration("24h0m0s"), Some(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5_400)));
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_duration("0s"), Some(Duration::ZERO));
        assert_eq!(parse_duration("1d"), None);
        assert_eq!(parse_duration("-1s"), None);
        assert_eq!(parse_duration(""), None);
        for d in [
            "0s",
            "250ms",
            "1.5s",
            "30s",
            "2m0s",
            "1h0m0s",
            "24h0m0s",
            "1h2m3.25s",
        ] {
            let parsed = parse_duration(d).expect(d);
            assert_eq!(go_duration(parsed), d);
        }
    }

    #[test]
    fn kernel_conntrack_as_kube_proxy_computes_it() {
        let none = AgentConfig::default();
        let k = none.kernel_conntrack(None, None, 2);
        assert_eq!(
            k,
            KernelConntrack {
                max: 131_072,
                tcp_established_s: 86_400,
                tcp_close_wait_s: 3_600,
                tcp_be_liberal: false,
                udp_s: 0,
                udp_stream_s: 0,
            }
        );
        assert_eq!(none.kernel_conntrack(None, None, 8).max, 262_144);
        // maxPerCore 0 leaves the table's size alone, as kube-proxy.
        assert_eq!(none.kernel_conntrack(Some(0), None, 8).max, 0);
        let file = AgentConfig::parse(
            "c.yaml",
            "conntrack: {maxPerCore: 1000, min: 10, tcpEstablishedTimeout: 2h0m0s, \
             tcpCloseWaitTimeout: 0s, tcpBeLiberal: true, udpTimeout: 45s, udpStreamTimeout: 3m}\n",
        )
        .expect("valid");
        let k = file.kernel_conntrack(None, Some(5_000), 2);
        assert_eq!(k.max, 5_000, "the flag's min wins over the file's");
        assert_eq!(k.tcp_established_s, 7_200);
        assert_eq!(k.tcp_close_wait_s, 0, "0 leaves the kernel's value");
        assert!(k.tcp_be_liberal);
        assert_eq!((k.udp_s, k.udp_stream_s), (45, 180));
        let e = AgentConfig::parse("c.yaml", "conntrack: {udpTimeout: 30 seconds}\n")
            .expect_err("bad duration");
        assert!(e.to_string().contains("conntrack.udpTimeout"), "{e}");
    }
}
