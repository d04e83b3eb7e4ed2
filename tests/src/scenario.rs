//! A ready-made scenario: topology + echo servers + a YAML file + the agent, torn down on drop.

use std::{
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    path::PathBuf,
    time::Duration,
};

use crate::{
    agent::Agent, echo::EchoServer, services::write_atomic, topology::Topology, unique_tag,
};

/// The TCP and UDP ports every backend's echo server listens on.
pub const TCP_PORT: u16 = 8080;
pub const UDP_PORT: u16 = 5353;

/// Everything a traffic test needs. Field order is drop order: agent (and its pins) first,
/// then servers, then the namespaces.
pub struct Scenario {
    pub agent: Agent,
    pub servers: Vec<EchoServer>,
    pub topo: Topology,
    pub yaml: PathBuf,
    pub workdir: PathBuf,
}

impl Scenario {
    /// Builds `backends` backend pods with echo servers named `backend-k`, writes `yaml` and
    /// starts the agent on it.
    pub fn start(prefix: &str, backends: usize, yaml: &str) -> Result<Self, String> {
        Self::start_with(prefix, backends, yaml, &[])
    }

    /// [`Scenario::start`] with more agent flags.
    pub fn start_with(
        prefix: &str,
        backends: usize,
        yaml: &str,
        extra: &[&str],
    ) -> Result<Self, String> {
        let tag = unique_tag(prefix);
        let topo = Topology::build(&tag, backends)?;
        let mut servers = Vec::new();
        for pod in &topo.backends {
            servers.push(EchoServer::start(&pod.ns, &pod.name, TCP_PORT, UDP_PORT)?);
        }
        let workdir = std::env::temp_dir().join(&tag);
        std::fs::create_dir_all(&workdir).map_err(|e| e.to_string())?;
        let yaml_path = workdir.join("services.yaml");
        write_atomic(&yaml_path, yaml)?;
        let mut args = vec![
            "--source".to_string(),
            format!("file:{}", yaml_path.display()),
            "--pod-interfaces".into(),
            "xv-*".into(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let agent = Agent::start_with(
            &topo.node,
            &args,
            PathBuf::from(format!("/sys/fs/bpf/{tag}")),
            workdir.join("agent.log"),
        )?;
        Ok(Scenario {
            agent,
            servers,
            topo,
            yaml: yaml_path,
            workdir,
        })
    }

    /// For a privileged test: [`Scenario::start`] and a wait until `frontend`
    /// (`ip:port/PROTO`) has its `backends` programmed; `None` (skipped) without root.
    pub fn started(prefix: &str, yaml: &str, backends: usize, frontend: &str) -> Option<Self> {
        if !crate::require_root() {
            return None;
        }
        let mut s = Self::start(prefix, backends, yaml).expect("scenario");
        // Generous: loading means the verifier's pass over every program, seconds on a
        // loaded machine with several agents starting at once.
        s.wait_backends(frontend, backends, Duration::from_secs(30))
            .expect("initial sync");
        Some(s)
    }

    /// Backend pod IPs.
    pub fn backend_ips(&self) -> Vec<Ipv4Addr> {
        self.topo.backends.iter().map(|p| p.ip).collect()
    }

    /// Waits until the frontend `vip:port` has `n` backends programmed.
    pub fn wait_backends(
        &mut self,
        frontend: &str,
        n: usize,
        timeout: Duration,
    ) -> Result<Duration, String> {
        let frontend = frontend.to_string();
        self.agent.wait_for(timeout, move |rows| {
            rows.iter()
                .any(|r| r.frontend == frontend && r.backends.len() == n)
        })
    }
}

impl Scenario {
    /// `n` TCP requests from the client pod to `to`, one connection each (2 s apiece): the
    /// name of the backend that answered each, or the first error (with the agent's log).
    pub fn ask_tcp(&self, to: SocketAddr, n: usize) -> Result<Vec<String>, String> {
        self.topo
            .client
            .ns
            .run(move || {
                (0..n)
                    .map(|_| {
                        crate::client::tcp_request(to, Duration::from_secs(2)).map(|a| a.backend)
                    })
                    .collect::<Result<Vec<_>, _>>()
            })?
            .map_err(|e| format!("{e}\n{}", self.agent.log_text()))
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.workdir);
    }
}

/// `ip:port` as a socket address.
pub fn sock(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(ip, port))
}
