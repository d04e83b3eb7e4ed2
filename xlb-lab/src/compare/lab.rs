//! A lab of one mode: its namespaces, pods with echo servers, and the mode installed in it
//! (xlb's agent, kube-proxy's rules, or its userspace proxy).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use lb_userspace::{
    emit::{self, Mode},
    model::{Model, NodeSettings},
};

use super::{Counts, Impl, Origin, node_port_ip, v4_not_loopback};
use crate::{
    cgroup::Cgroup,
    echo::EchoServer,
    netns::{Netns, Reap, run},
    topology::Topology,
};

/// Removes a pin directory on drop.
struct Pins(PathBuf);

impl Drop for Pins {
    fn drop(&mut self) {
        let _ = lb_userspace::cleanup::cleanup(&self.0);
    }
}

fn spawn_xlb(ns: &Netns, xlb: &Path, args: &[String], log: &Path) -> Result<Reap, String> {
    let out = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    ns.command(xlb)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map(Reap)
        .map_err(|e| format!("{}: {e}", xlb.display()))
}

/// How long one request of a flow may take (connect, then the answer).
/// What a lab is built for.
pub struct LabSpec<'a> {
    /// The implementation to install; `None`: the lab alone, for traffic straight to pods.
    pub mode: Option<Impl>,
    /// Unique to the lab: namespace, pin and cgroup names embed it.
    pub tag: &'a str,
    /// The services file the agent and the userspace proxy read.
    pub source: &'a Path,
    /// The `xlb` binary (agent, userspace proxy, client processes).
    pub xlb: &'a Path,
    pub model: &'a Model,
    /// The node: the emitters' settings; its node IP and NodePort address go on its `lo`.
    pub settings: &'a NodeSettings,
    /// The emitters' writer options.
    pub options: &'a emit::Options,
    /// One pod per address, with echo servers (TCP and UDP) on its ports.
    pub pods: &'a BTreeMap<Ipv4Addr, BTreeSet<u16>>,
    /// Routed into a sink, so that packets no rule rewrites reach the FORWARD hook.
    pub frontends: &'a [SocketAddr],
}

/// A lab with one implementation installed; everything is removed on drop.
pub struct Installed {
    // Drop order: processes and pins first, then the cgroup, servers, namespaces.
    guards: Vec<Reap>,
    pins: Option<Pins>,
    /// xlb's labs: the cgroup its socket hooks are attached to (`--cgroup-path`); a client
    /// process must join it to be served by the hooks.
    pub cgroup: Option<Cgroup>,
    _servers: Vec<EchoServer>,
    pub topo: Topology,
    work: PathBuf,
}

impl Installed {
    /// xlb's datapath counters, in xlb's labs.
    pub fn counters(&self) -> Option<Counts> {
        let pins = self.pins.as_ref()?;
        let rows = lb_userspace::list::counters(&pins.0).ok()?;
        Some(rows.iter().map(|r| (r.reason, r.packets)).collect())
    }

    /// The namespace a client of `origin` runs in.
    pub fn namespace(&self, origin: Origin) -> &Netns {
        match origin {
            Origin::Pod => &self.topo.client.ns,
            Origin::Node => &self.topo.node,
        }
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

/// The addresses the lab's node carries on `lo`: its node IP and NodePort address.
fn node_addresses(settings: &NodeSettings) -> BTreeSet<Ipv4Addr> {
    let node_ip = settings.node_ip().and_then(v4_not_loopback);
    node_ip.into_iter().chain(node_port_ip(settings)).collect()
}

/// Builds a lab (a node namespace with its node addresses, a client pod, one pod per
/// address of `spec.pods` with echo servers) and installs `spec.mode` in it.
pub fn install(spec: &LabSpec) -> Result<Installed, String> {
    let eps = spec.pods;
    let client_ip = (1..=254u8)
        .map(|i| Ipv4Addr::new(10, 255, 255, i))
        .find(|ip| !eps.contains_key(ip))
        .ok_or("no free client address")?;
    let node_ips = node_addresses(spec.settings);
    if let Some(ip) = node_ips.iter().find(|ip| eps.contains_key(ip)) {
        return Err(format!("the node address {ip} is also an endpoint's"));
    }
    let pod_ips: Vec<Ipv4Addr> = eps.keys().copied().collect();
    let topo = Topology::with_pods(spec.tag, client_ip, &pod_ips)?;
    let mut servers = Vec::new();
    for (pod, (ip, ports)) in topo.backends.iter().zip(eps) {
        for port in ports {
            servers.push(EchoServer::start(
                &pod.ns,
                &format!("{ip}:{port}"),
                *port,
                *port,
            )?);
        }
    }
    for ip in &node_ips {
        topo.node
            .ip(&["addr", "add", &format!("{ip}/32"), "dev", "lo"])?;
    }
    route_to_void(&topo.node, spec.frontends)?;
    let work = std::env::temp_dir().join(spec.tag);
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let mut lab = Installed {
        guards: Vec::new(),
        pins: None,
        cgroup: None,
        _servers: servers,
        topo,
        work,
    };
    match spec.mode {
        None => {}
        Some(Impl::Ebpf | Impl::EbpfHost) => start_agent(spec, &mut lab)?,
        Some(Impl::KubeProxy(Mode::Iptables)) => {
            let payload = emit::iptables::emit(spec.model, spec.settings, spec.options);
            lab.topo
                .node
                .feed("iptables-restore", &["--noflush"], &payload.render())?;
            add_jumps(&lab.topo.node, &emit::iptables::jumps(&payload))?;
        }
        Some(Impl::KubeProxy(Mode::Nftables)) => {
            // The table carries its own hooks (prerouting, input, forward, output, postrouting).
            lab.topo.node.feed(
                "nft",
                &["-f", "-"],
                &emit::render(Mode::Nftables, spec.model, spec.settings, spec.options),
            )?;
        }
        Some(Impl::KubeProxy(Mode::Userspace)) => start_userspace(spec, &mut lab)?,
        Some(Impl::KubeProxy(Mode::Ipvs)) => {
            return Err("ipvs mode is not run in a lab (it needs the IPVS kernel modules)".into());
        }
    }
    Ok(lab)
}

/// A node in a cluster routes ClusterIPs somewhere (its default route), so a packet that no
/// rule rewrites reaches the FORWARD hook, where kube-proxy REJECTs. The lab's node has no
/// default route; a veth whose peer stays down (both ends in the node namespace: it never
/// carries a packet) stands in for it.
fn route_to_void(node: &Netns, frontends: &[SocketAddr]) -> Result<(), String> {
    node.ip(&[
        "link",
        "add",
        "xv-void",
        "type",
        "veth",
        "peer",
        "name",
        "xv-void-peer",
    ])?;
    node.ip(&["link", "set", "xv-void", "up"])?;
    for f in frontends {
        if let IpAddr::V4(ip) = f.ip() {
            let _ = node.ip(&["route", "replace", &format!("{ip}/32"), "dev", "xv-void"]);
        }
    }
    Ok(())
}

/// Adds kube-proxy's jumps into its chains, as it ensures them.
fn add_jumps(node: &Netns, jumps: &[emit::Jump]) -> Result<(), String> {
    for j in jumps {
        run(node.command("iptables").args(j.args()))?;
    }
    Ok(())
}

/// xlb's lab: the agent in the node namespace, attached to the pods' veths, with the socket
/// hooks on a cgroup of the lab's own (never the machine's root).
fn start_agent(spec: &LabSpec, lab: &mut Installed) -> Result<(), String> {
    let socket_lb = spec.mode.and_then(Impl::socket_lb).unwrap_or("all");
    let cgroup = Cgroup::new(spec.tag)?;
    let pins = PathBuf::from(format!("/sys/fs/bpf/{}", spec.tag));
    let mut args: Vec<String> = [
        "agent",
        "--source",
        &format!("file:{}", spec.source.display()),
        "--pod-interfaces",
        "xv-*",
        "--hostname-override",
        &spec.settings.node_name,
        "--healthz-bind-address",
        "",
        "--metrics-bind-address",
        "",
        "--socket-lb",
        socket_lb,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(["--cgroup-path".into(), cgroup.path.display().to_string()]);
    args.extend(["--bpffs".into(), pins.display().to_string()]);
    if let Some(ip) = node_port_ip(spec.settings) {
        args.extend(["--nodeport-addresses".into(), ip.to_string()]);
    }
    lab.cgroup = Some(cgroup);
    let log = lab.work.join("agent.log");
    lab.guards
        .push(spawn_xlb(&lab.topo.node, spec.xlb, &args, &log)?);
    lab.pins = Some(Pins(pins.clone()));
    let want = spec.frontends.len().min(1);
    let deadline = Instant::now() + Duration::from_secs(15);
    while lb_userspace::list::services(&pins).map_or(0, |r| r.len()) < want {
        if Instant::now() > deadline {
            return Err(format!(
                "agent never programmed the maps:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Interfaces are attached in the same loop iteration as the first sync (the socket
    // hooks before it).
    std::thread::sleep(Duration::from_millis(300));
    Ok(())
}

/// kube-proxy's userspace lab: `xlb proxy userspace` in the node namespace and its rules.
fn start_userspace(spec: &LabSpec, lab: &mut Installed) -> Result<(), String> {
    let args: Vec<String> = [
        "proxy",
        "userspace",
        "--source",
        &format!("file:{}", spec.source.display()),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let log = lab.work.join("proxy.log");
    lab.guards
        .push(spawn_xlb(&lab.topo.node, spec.xlb, &args, &log)?);
    lab.topo.node.feed(
        "iptables-restore",
        &["--noflush"],
        &emit::render(Mode::Userspace, spec.model, spec.settings, spec.options),
    )?;
    add_jumps(&lab.topo.node, &emit::userspace::JUMPS)?;
    std::thread::sleep(Duration::from_millis(1000));
    Ok(())
}
