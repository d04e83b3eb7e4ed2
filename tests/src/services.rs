//! Service YAML for tests: ClusterIPs in front of pods of the [`crate::topology`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A Service with one port and an EndpointSlice listing `backends` (all ready
///), as Kubernetes YAML.
pub fn service_yaml(
    name: &str,
    cluster_ip: Ipv4Addr,
    port: u16,
    protocol: &str,
    target_port: u16,
    backends: &[Ipv4Addr],
) -> String {
    let mut y = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: test, name: {name}}}\nspec:\n  clusterIP: {cluster_ip}\n  ports:\n  - {{name: p, port: {port}, protocol: {protocol}, targetPort: {target_port}}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: test\n  name: {name}-1\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports:\n- {{name: p, port: {target_port}, protocol: {protocol}}}\nendpoints:"
    );
    y.push_str(if backends.is_empty() { " []\n" } else { "\n" });
    for ip in backends {
        y.push_str(&format!(
            "- addresses: [\"{ip}\"]\n  conditions: {{ready: true}}\n"
        ));
    }
    y
}

/// A dual-stack Service (`ipFamilyPolicy: RequireDualStack`, IPv4 first) with one port and
/// one EndpointSlice per family listing `v4` and `v6` (all ready), as Kubernetes YAML.
pub fn dual_stack_service_yaml(
    name: &str,
    (ip4, ip6): (Ipv4Addr, Ipv6Addr),
    (port, protocol, target_port): (u16, &str, u16),
    v4: &[Ipv4Addr],
    v6: &[Ipv6Addr],
) -> String {
    let mut y = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: test, name: {name}}}\nspec:\n  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]\n  clusterIP: {ip4}\n  clusterIPs: [\"{ip4}\", \"{ip6}\"]\n  ports:\n  - {{name: p, port: {port}, protocol: {protocol}, targetPort: {target_port}}}\n"
    );
    let v4: Vec<String> = v4.iter().map(|ip| ip.to_string()).collect();
    let v6: Vec<String> = v6.iter().map(|ip| ip.to_string()).collect();
    for (family, ips) in [("IPv4", v4), ("IPv6", v6)] {
        y.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: test\n  name: {name}-{family}\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: {family}\nports:\n- {{name: p, port: {target_port}, protocol: {protocol}}}\nendpoints:"
        ));
        y.push_str(if ips.is_empty() { " []\n" } else { "\n" });
        for ip in ips {
            y.push_str(&format!(
                "- addresses: [\"{ip}\"]\n  conditions: {{ready: true}}\n"
            ));
        }
    }
    y
}

/// A Service of `kind` (`ClusterIP`, `NodePort`, `LoadBalancer`) with one port `p`
/// (`port` → `target_port`, and `node_port` if any), extra `spec` lines (two-space
/// indented) and a `status` block, and its EndpointSlice: `endpoints` ready, each on its node.
#[allow(clippy::too_many_arguments)]
pub fn service_on_nodes(
    name: &str,
    kind: &str,
    cluster_ip: &str,
    protocol: &str,
    port: u16,
    target_port: u16,
    node_port: Option<u16>,
    spec: &str,
    status: &str,
    endpoints: &[(Ipv4Addr, &str)],
) -> String {
    let endpoints: Vec<(IpAddr, &str)> =
        endpoints.iter().map(|(ip, n)| ((*ip).into(), *n)).collect();
    service_on_nodes_of(
        name,
        kind,
        cluster_ip,
        protocol,
        port,
        target_port,
        node_port,
        spec,
        status,
        &endpoints,
    )
}

/// [`service_on_nodes`] of either family: an IPv6 `cluster_ip` makes it an IPv6
/// single-stack Service (`ipFamilies: [IPv6]`, its slice's `addressType: IPv6`); else it is
/// IPv4.
#[allow(clippy::too_many_arguments)]
pub fn service_on_nodes_of(
    name: &str,
    kind: &str,
    cluster_ip: &str,
    protocol: &str,
    port: u16,
    target_port: u16,
    node_port: Option<u16>,
    spec: &str,
    status: &str,
    endpoints: &[(IpAddr, &str)],
) -> String {
    let node_port = node_port.map_or(String::new(), |p| format!(", nodePort: {p}"));
    let (cluster_ip, family) = match cluster_ip.parse::<Ipv6Addr>() {
        Ok(ip) => (format!("\"{ip}\"\n  ipFamilies: [IPv6]"), "IPv6"),
        Err(_) => (cluster_ip.to_string(), "IPv4"),
    };
    let mut y = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: ns, name: {name}}}\nspec:\n  type: {kind}\n  clusterIP: {cluster_ip}\n{spec}  ports:\n  - {{name: p, port: {port}, protocol: {protocol}, targetPort: {target_port}{node_port}}}\n{status}---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: ns\n  name: {name}-1\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: {family}\nports:\n- {{name: p, port: {target_port}, protocol: {protocol}}}\nendpoints:"
    );
    y.push_str(if endpoints.is_empty() { " []\n" } else { "\n" });
    for (ip, node) in endpoints {
        y.push_str(&format!(
            "- addresses: [\"{ip}\"]\n  conditions: {{ready: true}}\n  nodeName: {node}\n"
        ));
    }
    y
}

/// Writes `yaml` as the services file of the test tagged `tag` (`{tmp}/{tag}-src/
/// services.yaml`); its path. The caller removes the directory (the path's parent).
pub fn source_file(tag: &str, yaml: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("{tag}-src"));
    std::fs::create_dir_all(&dir).expect("the services file's directory");
    let path = dir.join("services.yaml");
    std::fs::write(&path, yaml).expect("the services file");
    path
}

/// Writes `text` to `path` atomically (a reader sees the old or the new file, never half).
pub fn write_atomic(path: &std::path::Path, text: &str) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

/// An IPv6 single-stack ClusterIP Service `name` (`cluster_ip`:`port` → `target_port`) and
/// its IPv6 EndpointSlice with `backends` ready.
pub fn service6_yaml(
    name: &str,
    cluster_ip: std::net::Ipv6Addr,
    port: u16,
    protocol: &str,
    target_port: u16,
    backends: &[std::net::Ipv6Addr],
) -> String {
    let mut y = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: test, name: {name}}}\nspec:\n  ipFamilyPolicy: SingleStack\n  ipFamilies: [IPv6]\n  clusterIP: \"{cluster_ip}\"\n  clusterIPs: [\"{cluster_ip}\"]\n  ports:\n  - {{name: p, port: {port}, protocol: {protocol}, targetPort: {target_port}}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: test\n  name: {name}-1\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv6\nports:\n- {{name: p, port: {target_port}, protocol: {protocol}}}\nendpoints:"
    );
    y.push_str(if backends.is_empty() { " []\n" } else { "\n" });
    for ip in backends {
        y.push_str(&format!(
            "- addresses: [\"{ip}\"]\n  conditions: {{ready: true}}\n"
        ));
    }
    y
}

/// One port of a Service: its name, `port`, protocol, `targetPort` and `nodePort` (0: none).
#[derive(Clone, Copy, Debug)]
pub struct Port<'a> {
    pub name: &'a str,
    pub port: u16,
    pub protocol: &'a str,
    pub target: u16,
    pub node_port: u16,
}

/// A dual-stack Service's endpoints: the IPv4 and the IPv6 ones, each with its node.
pub type DualEndpoints<'a> = (&'a [(Ipv4Addr, &'a str)], &'a [(Ipv6Addr, &'a str)]);

/// A dual-stack Service of `kind` (`RequireDualStack`, IPv4 first: ClusterIPs `ip4` and
/// `ip6`) with `ports` and extra `spec` lines (two-space indented), and one EndpointSlice
/// per family: `v4` and `v6` ready, each on its node.
pub fn dual_stack_service_on_nodes(
    name: &str,
    kind: &str,
    (ip4, ip6): (Ipv4Addr, Ipv6Addr),
    ports: &[Port],
    spec: &str,
    (v4, v6): DualEndpoints,
) -> String {
    let mut y = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: ns, name: {name}}}\nspec:\n  type: {kind}\n  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]\n  clusterIP: {ip4}\n  clusterIPs: [\"{ip4}\", \"{ip6}\"]\n{spec}  ports:\n"
    );
    for p in ports {
        let node_port = match p.node_port {
            0 => String::new(),
            n => format!(", nodePort: {n}"),
        };
        y.push_str(&format!(
            "  - {{name: {}, port: {}, protocol: {}, targetPort: {}{node_port}}}\n",
            p.name, p.port, p.protocol, p.target
        ));
    }
    let v4: Vec<(String, &str)> = v4.iter().map(|(ip, n)| (ip.to_string(), *n)).collect();
    let v6: Vec<(String, &str)> = v6.iter().map(|(ip, n)| (ip.to_string(), *n)).collect();
    for (family, endpoints) in [("IPv4", v4), ("IPv6", v6)] {
        y.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: ns\n  name: {name}-{}\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: {family}\nports:\n",
            family.to_lowercase()
        ));
        for p in ports {
            y.push_str(&format!(
                "- {{name: {}, port: {}, protocol: {}}}\n",
                p.name, p.target, p.protocol
            ));
        }
        y.push_str(if endpoints.is_empty() {
            "endpoints: []\n"
        } else {
            "endpoints:\n"
        });
        for (ip, node) in endpoints {
            y.push_str(&format!(
                "- addresses: [\"{ip}\"]\n  conditions: {{ready: true}}\n  nodeName: {node}\n"
            ));
        }
    }
    y
}

/// A ClusterIP Service `name` (`vip`:`port` → `target`) and its slice with `backends`
/// ready, of the family of `vip`.
pub fn service_of(
    name: &str,
    vip: IpAddr,
    port: u16,
    proto: &str,
    target: u16,
    backends: &[IpAddr],
) -> String {
    match vip {
        IpAddr::V4(v) => {
            let b: Vec<Ipv4Addr> = backends
                .iter()
                .map(|b| match b {
                    IpAddr::V4(a) => *a,
                    IpAddr::V6(_) => panic!("{name}: backend {b} is not of the family of {vip}"),
                })
                .collect();
            service_yaml(name, v, port, proto, target, &b)
        }
        IpAddr::V6(v) => {
            let b: Vec<Ipv6Addr> = backends
                .iter()
                .map(|b| match b {
                    IpAddr::V6(a) => *a,
                    IpAddr::V4(_) => panic!("{name}: backend {b} is not of the family of {vip}"),
                })
                .collect();
            service6_yaml(name, v, port, proto, target, &b)
        }
    }
}
