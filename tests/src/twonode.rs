//! The two-node north-south lab: node1 with a pod and the agent, node2 across an underlay
//! with a pod, an external client on node1's uplink, echo servers on every pod. Used by the
//! north-south tests and by `cargo xtask bench northsouth`.
//!
//! ```text
//!  ext 192.0.2.10 ─eth0══up0─ node1 192.0.2.1 ─ul1══ul0─ node2 10.0.0.2
//!                              10.0.0.1 │                  │
//!                              backend-1 10.244.2.2        n2-backend-1 10.245.1.2
//!                              client    10.244.1.2
//! ```
//!
//! Dual-stack ([`Lab::start_dual_stack`]): the same with IPv6 beside every IPv4 address
//! (`fd00:192::1` and `::10` on the uplink, `fd00:10::1`/`::2` on the underlay, pods at
//! `pod_ip6`/`remote_pod_ip6`).

use std::{net::Ipv6Addr, path::PathBuf, time::Duration};

use crate::{
    agent::Agent,
    echo::EchoServer,
    netns::Netns,
    scenario::{TCP_PORT, UDP_PORT},
    services::write_atomic,
    topology::{Pod, RemoteNode, Topology},
};

/// Node1's IPv6 address on its uplink in a dual-stack lab ([`Lab::start_dual_stack`]).
pub const NODE6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x192, 0, 0, 0, 0, 0, 1);
/// The external client's IPv6 address in a dual-stack lab.
pub const CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x192, 0, 0, 0, 0, 0, 0x10);

/// The NodePort the labs' `web` Service has.
pub const WEB_NODE_PORT: u16 = 30080;

/// The usual Service of these labs: `ns/web`, ClusterIP 10.96.0.10:80/TCP → the echo port,
/// NodePort 30080, with `endpoints` (address, node).
pub fn web_node_port(endpoints: &[(std::net::Ipv4Addr, &str)]) -> String {
    crate::services::service_on_nodes(
        "web",
        "NodePort",
        "10.96.0.10",
        "TCP",
        80,
        TCP_PORT,
        Some(WEB_NODE_PORT),
        "",
        "",
        endpoints,
    )
}

/// The labs' UDP Service: `ns/dns`, ClusterIP 10.96.0.53:53/UDP → the echo port, NodePort
/// 30053, with `endpoints` (address, node).
pub fn dns_node_port(endpoints: &[(std::net::Ipv4Addr, &str)]) -> String {
    crate::services::service_on_nodes(
        "dns",
        "NodePort",
        "10.96.0.53",
        "UDP",
        53,
        UDP_PORT,
        Some(30053),
        "",
        "",
        endpoints,
    )
}

/// The SNAT ports the lab's agent uses.
pub const SNAT_PORTS: (u16, u16) = (61000, 61099);

/// The flags of node1's agent in these labs: the Service file `svc_yaml`, the pods' and
/// node interfaces (`up0`, `ul1`), `nodeport_addresses`, the lab's SNAT ports (unless
/// `extra` sets `--snat-port-range`), no health or metrics server, then `extra`.
pub fn agent_args(
    svc_yaml: &std::path::Path,
    nodeport_addresses: &str,
    extra: &[&str],
) -> Vec<String> {
    let snat = format!("{}-{}", SNAT_PORTS.0, SNAT_PORTS.1);
    let default_snat: &[&str] = if extra.contains(&"--snat-port-range") {
        &[]
    } else {
        &["--snat-port-range", &snat]
    };
    [
        "--source",
        &format!("file:{}", svc_yaml.display()),
        "--pod-interfaces",
        "xv-*",
        "--node-interfaces",
        "up0,ul1",
        "--nodeport-addresses",
        nodeport_addresses,
        "--hostname-override",
        "node1",
        "--healthz-bind-address",
        "",
        "--metrics-bind-address",
        "",
    ]
    .iter()
    .chain(default_snat)
    .chain(extra)
    .map(|s| s.to_string())
    .collect()
}

/// Two nodes, the external client, echo servers on every pod, the agent on node1.
pub struct Lab {
    pub agent: Agent,
    /// Node2's agent, once [`Lab::direct_return`] started it.
    pub node2_agent: Option<Agent>,
    pub ext: Pod,
    /// Node2 and its pods (kept until the lab goes).
    pub remote: RemoteNode,
    _servers: Vec<EchoServer>,
    pub topo: Topology,
    dir: PathBuf,
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.agent.stop();
        if let Some(a) = &mut self.node2_agent {
            a.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Lab {
    /// Builds the lab with an underlay of `mtu`, programs `yaml` and waits until `frontend`
    /// (e.g. `192.0.2.1:30080/TCP`) is programmed.
    pub fn start(prefix: &str, yaml: &str, mtu: u32, frontend: &str) -> Self {
        Self::start_with(prefix, yaml, mtu, frontend, &[])
    }

    /// [`Lab::start`] with more agent flags.
    pub fn start_with(prefix: &str, yaml: &str, mtu: u32, frontend: &str, extra: &[&str]) -> Self {
        Self::build(prefix, yaml, mtu, frontend, extra, false)
    }

    /// [`Lab::start_with`] (a 1500-byte underlay), dual-stack: every pod also has its
    /// IPv6 address (node1's `pod_ip6`, node2's `remote_pod_ip6`) with IPv6 echo servers on
    /// it, node1's uplink has [`NODE6`] and the external client [`CLIENT6`], the underlay
    /// is dual-stack, and the agent's NodePort addresses are `192.0.2.1` and [`NODE6`].
    pub fn start_dual_stack(prefix: &str, yaml: &str, frontend: &str, extra: &[&str]) -> Self {
        Self::build(prefix, yaml, 1500, frontend, extra, true)
    }

    fn build(
        prefix: &str,
        yaml: &str,
        mtu: u32,
        frontend: &str,
        extra: &[&str],
        dual: bool,
    ) -> Self {
        let tag = crate::unique_tag(prefix);
        let (topo, ext, remote) = network(&tag, mtu, dual);
        let mut servers = Vec::new();
        for p in topo
            .backends
            .iter()
            .chain(&remote.pods)
            .chain([&topo.client])
        {
            servers.push(EchoServer::start(&p.ns, &p.name, TCP_PORT, UDP_PORT).expect("server"));
            if let Some(ip6) = p.ip6 {
                servers.push(
                    EchoServer::start_at(&p.ns, &p.name, ip6.into(), TCP_PORT, UDP_PORT)
                        .expect("IPv6 server"),
                );
            }
        }
        let dir = std::env::temp_dir().join(&tag);
        std::fs::create_dir_all(&dir).expect("dir");
        write_atomic(&dir.join("svc.yaml"), yaml).expect("yaml");
        let nodeport_addresses = if dual {
            format!("192.0.2.1,{NODE6}")
        } else {
            "192.0.2.1".to_string()
        };
        let args = agent_args(&dir.join("svc.yaml"), &nodeport_addresses, extra);
        let agent = Agent::start_with(
            &topo.node,
            &args,
            PathBuf::from(format!("/sys/fs/bpf/{tag}")),
            dir.join("agent.log"),
        )
        .expect("agent");
        let mut lab = Lab {
            agent,
            node2_agent: None,
            ext,
            remote,
            _servers: servers,
            topo,
            dir,
        };
        lab.agent
            .wait_for(Duration::from_secs(10), |rows| {
                rows.iter().any(|r| r.frontend == frontend)
            })
            .unwrap_or_else(|e| panic!("{frontend} not programmed: {e}"));
        // Let the interfaces get attached too.
        std::thread::sleep(Duration::from_millis(300));
        lab
    }

    /// For direct server return: node2 gets its own way to the external client (its `dr0`,
    /// 192.0.3.2, to the client's `eth1`, 192.0.3.10, and in a dual-stack lab fd00:193::2
    /// and ::10: the client's replies from node2 arrive there, never on node1's uplink) and its own agent on the lab's Service file (its pods'
    /// veths and `ul0`, `dr0`; `extra` flags), and waits until it programs `frontend`.
    pub fn direct_return(&mut self, frontend: &str, extra: &[&str]) {
        let node2 = &self.remote.ns;
        node2
            .ip(&[
                "link",
                "add",
                "dr0",
                "type",
                "veth",
                "peer",
                "name",
                "eth1",
                "netns",
                &self.ext.ns.name,
            ])
            .expect("veth to the client");
        node2
            .ip(&["addr", "add", "192.0.3.2/24", "dev", "dr0"])
            .expect("addr");
        node2.ip(&["link", "set", "dr0", "up"]).expect("up");
        node2
            .sysctl(&["net.ipv4.conf.dr0.rp_filter=0"])
            .expect("sysctl");
        node2
            .ip(&["route", "add", "192.0.2.10/32", "via", "192.0.3.10"])
            .expect("route to the client");
        let ext = &self.ext.ns;
        ext.ip(&["addr", "add", "192.0.3.10/24", "dev", "eth1"])
            .expect("addr");
        ext.ip(&["link", "set", "eth1", "up"]).expect("up");
        if self.remote.pods.iter().any(|p| p.ip6.is_some()) {
            // Dual-stack: the same way for IPv6 (fd00:193::2 on dr0, ::10 on eth1).
            node2
                .ip(&["addr", "add", "fd00:193::2/64", "dev", "dr0", "nodad"])
                .expect("addr");
            ext.ip(&["addr", "add", "fd00:193::10/64", "dev", "eth1", "nodad"])
                .expect("addr");
            node2
                .ip(&[
                    "-6",
                    "route",
                    "add",
                    &format!("{CLIENT6}/128"),
                    "via",
                    "fd00:193::10",
                ])
                .expect("IPv6 route to the client");
        }
        ext.sysctl(&[
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.eth1.rp_filter=0",
            "net.ipv4.conf.eth0.rp_filter=0",
        ])
        .expect("sysctl");
        let snat = format!("{}-{}", SNAT_PORTS.0, SNAT_PORTS.1);
        let svc = self.dir.join("svc.yaml");
        let args: Vec<String> = [
            "--source",
            &format!("file:{}", svc.display()),
            "--pod-interfaces",
            "xv-n2-*",
            "--node-interfaces",
            "ul0,dr0",
            "--nodeport-addresses",
            &crate::topology::NODE2_UNDERLAY.to_string(),
            "--hostname-override",
            "node2",
            "--healthz-bind-address",
            "",
            "--metrics-bind-address",
            "",
            "--snat-port-range",
            &snat,
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect();
        let tag = self
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let mut agent = Agent::start_with(
            node2,
            &args,
            PathBuf::from(format!("/sys/fs/bpf/{tag}-n2")),
            self.dir.join("agent2.log"),
        )
        .expect("node2's agent");
        agent
            .wait_for(Duration::from_secs(10), |rows| {
                rows.iter().any(|r| r.frontend == frontend)
            })
            .unwrap_or_else(|e| panic!("{frontend} not programmed on node2: {e}"));
        std::thread::sleep(Duration::from_millis(300));
        self.node2_agent = Some(agent);
    }

    /// `xlb trace ARGS…` in node1 against its agent's pins and the lab's Service file: its
    /// output (it must succeed).
    pub fn trace(&self, args: &[&str]) -> String {
        let out = crate::trace_support::trace_in(
            &self.topo.node,
            &self.agent.pins,
            &self.dir.join("svc.yaml"),
            args,
        );
        crate::trace_support::succeeded(out, args)
    }

    /// Replaces the agent's Service file with `yaml` (atomically: the agent sees the old
    /// file or the new one).
    pub fn rewrite(&self, yaml: &str) {
        write_atomic(&self.dir.join("svc.yaml"), yaml).expect("yaml");
    }

    /// Runs `f` in the external client's namespace.
    pub fn outside<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        self.ext.ns.run(f).expect("client thread")
    }

    /// Every veth end of the lab, as (namespace, interface).
    pub fn veths(&self) -> Vec<(&Netns, String)> {
        let mut v = vec![
            (&self.ext.ns, "eth0".to_string()),
            (&self.topo.node, "up0".to_string()),
            (&self.topo.node, "ul1".to_string()),
            (&self.remote.ns, "ul0".to_string()),
        ];
        for p in self.topo.backends.iter().chain([&self.topo.client]) {
            v.push((&p.ns, "eth0".to_string()));
            v.push((&self.topo.node, p.host_if.clone()));
        }
        for p in &self.remote.pods {
            v.push((&p.ns, "eth0".to_string()));
            v.push((&self.remote.ns, p.host_if.clone()));
        }
        v
    }

    /// Turns checksum offload (rx and tx) on or off on every veth end.
    pub fn set_offload(&self, on: bool) {
        let state = if on { "on" } else { "off" };
        for (ns, iface) in self.veths() {
            let out = ns
                .command("ethtool")
                .args(["-K", &iface, "rx", state, "tx", state])
                .output()
                .expect("ethtool");
            assert!(
                out.status.success(),
                "ethtool -K {iface} rx/tx {state}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// Enables NAPI (GRO) on the veth ends that receive XDP redirects, as a veth needs for
    /// native XDP frames sent to it.
    pub fn enable_napi_for_redirects(&self) {
        for (ns, iface) in [(&self.ext.ns, "eth0"), (&self.remote.ns, "ul0")] {
            let out = ns
                .command("ethtool")
                .args(["-K", iface, "gro", "on"])
                .output()
                .expect("ethtool");
            assert!(out.status.success(), "gro on {iface}");
        }
    }

    pub fn counter(&self, reason: &str) -> u64 {
        crate::datapath::reason_counts(&self.agent.pins)[reason]
    }
}

/// Node1 with the client and one backend pod, the external client on `up0` (routing the
/// service IPs through node1), node2 across an underlay of `mtu` with one pod; with `dual`,
/// all of it dual-stack.
fn network(tag: &str, mtu: u32, dual: bool) -> (Topology, Pod, RemoteNode) {
    let mut topo = Topology::build(tag, 1).expect("topology");
    let mut ext = topo.add_external_client("up0").expect("external client");
    // The client reaches externalIPs and LoadBalancer IPs through node1.
    ext.ns
        .ip(&["route", "add", "198.51.100.0/24", "via", "192.0.2.1"])
        .expect("route to the service IPs");
    let mut remote = topo.add_remote_node("ul1", mtu, 1).expect("node2");
    if dual {
        topo.dual_stack().expect("dual-stack pods");
        topo.add_external_ipv6(&mut ext, "up0", NODE6, CLIENT6)
            .expect("external IPv6");
        remote
            .dual_stack(&topo.node, "ul1")
            .expect("dual-stack node2");
    }
    (topo, ext, remote)
}
