//! The real agent for the benches: `xlb agent` on synthetic services (a YAML file, or the
//! same objects served by the in-repo API test server) in a network namespace, pin
//! directory and cgroup of its own, its log in a file; stopped and everything removed when
//! dropped.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use xlb_tests::{apiserver::ApiServer, cgroup::Cgroup, netns::Netns, unique_tag};

use super::fixture::services_yaml;

/// `xlb agent` in its own namespace on a YAML file; stopped and its pins removed on drop.
pub(super) struct AgentRun {
    pub(super) child: Child,
    xlb: std::path::PathBuf,
    pub(super) pins: std::path::PathBuf,
    workdir: std::path::PathBuf,
    pub(super) ns: Netns,
    /// The socket hooks' cgroup (never the root cgroup); removed after the pins.
    _cgroup: Cgroup,
    /// The API server the agent watches (with [`Source::Api`]); stops after the agent.
    _api: Option<ApiServer>,
}

/// Where the agent reads the services from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    /// `--source file:…`.
    File,
    /// `--source kubernetes` against the in-repo API test server in the agent's namespace
    /// (the same objects, listed and watched as from a cluster).
    Api,
}

impl Drop for AgentRun {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc_kill(self.child.id() as i32) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new(&self.xlb)
            .arg("cleanup")
            .arg("--bpffs")
            .arg(&self.pins)
            .output();
        let _ = lb_userspace::cleanup::cleanup(&self.pins);
        let _ = std::fs::remove_dir_all(&self.workdir);
    }
}

/// SIGTERM to `pid`.
unsafe fn libc_kill(pid: i32) {
    unsafe extern "C" {
        fn kill(pid: i32, sig: i32) -> i32;
    }
    // SAFETY: kill(2) with a pid we own and SIGTERM (15).
    unsafe { kill(pid, 15) };
}

/// What an agent run serves: its objects' YAML and the entries they need in the service
/// and backend maps (the maps are sized from them).
pub(super) struct Objects {
    pub(super) yaml: String,
    pub(super) service_entries: usize,
    pub(super) backends: usize,
}

impl Objects {
    /// `services` ClusterIP services × `endpoints` ([`services_yaml`]).
    pub(super) fn cluster_ips(services: usize, endpoints: usize) -> Self {
        Self {
            yaml: services_yaml(0..services, |_| endpoints),
            // One service map entry per frontend (XLB_SVC_V3).
            service_entries: services,
            backends: services * endpoints,
        }
    }
}

/// The agent on `services` × `endpoints` from `source` in a namespace, pin directory and
/// cgroup of its own (`extra` flags added), its log to a file; the run (torn down when
/// dropped), the log's path and when the agent started.
pub(super) fn start_agent(
    source: Source,
    xlb: &Path,
    services: usize,
    endpoints: usize,
    extra: &[&str],
) -> Result<(AgentRun, std::path::PathBuf, Instant)> {
    start_agent_on(
        source,
        xlb,
        &Objects::cluster_ips(services, endpoints),
        extra,
    )
}

/// [`start_agent`] on `objects`.
pub(super) fn start_agent_on(
    source: Source,
    xlb: &Path,
    objects: &Objects,
    extra: &[&str],
) -> Result<(AgentRun, std::path::PathBuf, Instant)> {
    let tag = unique_tag("xlbm");
    let workdir = std::env::temp_dir().join(&tag);
    std::fs::create_dir_all(&workdir)?;
    let log = workdir.join("agent.log");
    let ns = Netns::new(&format!("{tag}-node")).map_err(anyhow::Error::msg)?;
    let (source_args, api) = source_args(source, &ns, &workdir, &objects.yaml)?;
    let pins = std::path::PathBuf::from(format!("/sys/fs/bpf/{tag}"));
    let cgroup = Cgroup::new(&tag).map_err(anyhow::Error::msg)?;
    let out = std::fs::File::create(&log)?;
    let err = out.try_clone()?;
    let started = Instant::now();
    // nsenter execs xlb in place: the child's pid is the agent's.
    let child = ns
        .command(xlb)
        .arg("agent")
        .args(&source_args)
        .args(["--pod-interfaces", "xbv*"])
        // Maps sized for the services (the per-service arrays follow the service map: an
        // index per entry, at least 65,536).
        .arg("--service-map-max")
        .arg(pow2(objects.service_entries + 64).to_string())
        .arg("--backend-map-max")
        .arg(pow2(objects.backends + 64).to_string())
        .arg("--bpffs")
        .arg(&pins)
        .arg("--cgroup-path")
        .arg(&cgroup.path)
        .args(extra)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .context("start xlb agent")?;
    let run = AgentRun {
        child,
        xlb: xlb.to_path_buf(),
        pins,
        workdir,
        ns,
        _cgroup: cgroup,
        _api: api,
    };
    Ok((run, log, started))
}

/// The agent's source flags for the objects of `yaml` (and the API server serving them).
fn source_args(
    source: Source,
    ns: &Netns,
    workdir: &Path,
    yaml: &str,
) -> Result<(Vec<String>, Option<ApiServer>)> {
    match source {
        Source::File => {
            let path = workdir.join("services.yaml");
            std::fs::write(&path, yaml)?;
            Ok((
                vec!["--source".into(), format!("file:{}", path.display())],
                None,
            ))
        }
        Source::Api => {
            let api = ApiServer::start(ns).map_err(anyhow::Error::msg)?;
            api.apply_yaml("apiVersion: v1\nkind: Node\nmetadata: {name: node1}\n")
                .map_err(anyhow::Error::msg)?;
            api.apply_yaml(yaml).map_err(anyhow::Error::msg)?;
            let kubeconfig = workdir.join("kubeconfig");
            api.write_kubeconfig(&kubeconfig)
                .map_err(anyhow::Error::msg)?;
            let args = ["--source", "kubernetes", "--hostname-override", "node1"]
                .map(String::from)
                .into_iter()
                .chain(["--kubeconfig".into(), kubeconfig.display().to_string()])
                .collect();
            Ok((args, Some(api)))
        }
    }
}

/// Waits (at most 120 s from `started`) for the agent's log to show a sync of `services`
/// frontends (a ClusterIP service has one).
pub(super) fn wait_synced(
    run: &mut AgentRun,
    log: &Path,
    services: usize,
    started: Instant,
) -> Result<()> {
    let want = format!("services={services}");
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text
            .lines()
            .any(|l| l.contains("synced") && l.contains(&want))
        {
            return Ok(());
        }
        if let Ok(Some(status)) = run.child.try_wait() {
            bail!("agent exited with {status}:\n{text}");
        }
        if started.elapsed() > Duration::from_secs(120) {
            bail!("agent not synced after 120 s:\n{text}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The next power of two at or above `n` (at least 1,024).
fn pow2(n: usize) -> u32 {
    (n.max(1024) as u32).next_power_of_two()
}
