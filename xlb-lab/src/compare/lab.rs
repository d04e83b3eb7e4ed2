//! A lab of one mode: its namespaces, pods with echo servers, and the mode installed in it
//! (xlb's agent, kube-proxy's rules, or its userspace proxy).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use lb_userspace::{
    emit::{self, Mode},
    model::{IpFamily, Model, NodeSettings, Protocol},
};

use super::{Counts, FAMILIES, Impl, Origin, for_family, node_port_ip};
use crate::{
    cgroup::Cgroup,
    echo::EchoServer,
    netns::{Netns, Reap, run},
    sctp::SctpServer,
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
    pub options: &'a emit::WriterOptions,
    /// The endpoint addresses, with servers on their ports (an echo server serving TCP and
    /// UDP on a TCP or UDP port, an SCTP server on an SCTP one): one pod per IPv4 address;
    /// the IPv6 addresses make pods dual-stack, one each (in order), with pods of their own
    /// where there are more IPv6 addresses than IPv4 ones.
    pub pods: &'a BTreeMap<IpAddr, BTreeSet<(u16, Protocol)>>,
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
    servers: Servers,
    pub topo: Topology,
    work: PathBuf,
}

impl Installed {
    /// What the lab's own SCTP servers' sockets refused ([`SctpServer::failure`]), one line
    /// per server: a fault of the lab (the pods have no rules), not of the mode under test.
    pub fn server_failures(&self) -> Vec<String> {
        self.servers
            .sctp
            .iter()
            .filter_map(SctpServer::failure)
            .collect()
    }

    /// xlb's datapath counters, in xlb's labs.
    pub fn counters(&self) -> Option<Counts> {
        let pins = self.pins.as_ref()?;
        let opened = lb_userspace::datapath::pins::Pins::open(&pins.0).ok()?;
        let rows = lb_userspace::list::counters(&opened).ok()?;
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

/// The addresses the lab's node carries on `lo`: its node IPs and NodePort addresses, of
/// both families.
fn node_addresses(settings: &NodeSettings) -> BTreeSet<IpAddr> {
    let mut out = BTreeSet::new();
    for family in FAMILIES {
        let s = for_family(settings, family);
        let node_ip = s.node_ip().filter(|ip| !ip.is_loopback());
        out.extend(node_ip.into_iter().chain(node_port_ip(&s)));
    }
    out
}

/// `ip`'s family option for `ip` and its host prefix length.
fn family_args(ip: IpAddr) -> (&'static str, u8) {
    if ip.is_ipv4() {
        ("-4", 32)
    } else {
        ("-6", 128)
    }
}

/// The first address of `candidates` that is not in `taken`.
fn free<T: Ord + Copy>(candidates: impl Iterator<Item = T>, taken: &BTreeSet<T>) -> Option<T> {
    candidates.into_iter().find(|ip| !taken.contains(ip))
}

/// The endpoint addresses of `eps`, by family.
fn split_families<T>(eps: &BTreeMap<IpAddr, T>) -> (Vec<Ipv4Addr>, Vec<Ipv6Addr>) {
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for ip in eps.keys() {
        match ip {
            IpAddr::V4(ip) => v4.push(*ip),
            IpAddr::V6(ip) => v6.push(*ip),
        }
    }
    (v4, v6)
}

/// The lab's pods: the client (at the first `10.255.255.x`, and `fd00:10:255:255::x` when
/// there are IPv6 endpoints, that no endpoint has) and one backend per IPv4 endpoint, plus
/// placeholders (`10.255.254.x`) to carry the IPv6 endpoints beyond those.
fn build_pods(spec: &LabSpec) -> Result<Topology, String> {
    let eps = spec.pods;
    let (mut v4, v6) = split_families(eps);
    let taken: BTreeSet<IpAddr> = eps.keys().copied().collect();
    let v4_taken: BTreeSet<Ipv4Addr> = v4.iter().copied().collect();
    let client_ip = free(
        (1..=254u8).map(|i| Ipv4Addr::new(10, 255, 255, i)),
        &v4_taken,
    )
    .ok_or("no free client address")?;
    let node_ips = node_addresses(spec.settings);
    if let Some(ip) = node_ips.iter().find(|ip| taken.contains(ip)) {
        return Err(format!("the node address {ip} is also an endpoint's"));
    }
    let extra = (1..=254u8).map(|i| Ipv4Addr::new(10, 255, 254, i));
    v4.extend(
        extra
            .filter(|ip| !v4_taken.contains(ip))
            .take(v6.len().saturating_sub(v4.len())),
    );
    let mut topo = Topology::with_pods(spec.tag, client_ip, &v4)?;
    if !v6.is_empty() {
        topo.enable_ipv6()?;
        let v6_taken: BTreeSet<Ipv6Addr> = v6.iter().copied().collect();
        let client6 = (1..=254u16).map(|i| Ipv6Addr::new(0xfd00, 0x10, 0x255, 0x255, 0, 0, 0, i));
        let client6 = free(client6, &v6_taken).ok_or("no free IPv6 client address")?;
        topo.client.add_ipv6(&topo.node, client6)?;
        for (pod, ip6) in topo.backends.iter_mut().zip(&v6) {
            pod.add_ipv6(&topo.node, *ip6)?;
        }
    }
    for ip in &node_ips {
        let (opt, len) = family_args(*ip);
        let addr = format!("{ip}/{len}");
        topo.node.ip(&[opt, "addr", "add", &addr, "dev", "lo"])?;
    }
    Ok(topo)
}

/// The servers of a lab's pods.
#[derive(Default)]
struct Servers {
    _echo: Vec<EchoServer>,
    sctp: Vec<SctpServer>,
}

/// Servers on every endpoint address's ports, named `ip:port` (`[ip6]:port`), as the
/// report names backends: an echo server (TCP and UDP) on a TCP or UDP port, one of each
/// per port; an SCTP server on an SCTP port.
fn start_servers(
    topo: &Topology,
    eps: &BTreeMap<IpAddr, BTreeSet<(u16, Protocol)>>,
) -> Result<Servers, String> {
    let mut echo = Vec::new();
    let mut sctp = Vec::new();
    for pod in &topo.backends {
        let addrs = [Some(IpAddr::V4(pod.ip)), pod.ip6.map(IpAddr::V6)];
        for ip in addrs.into_iter().flatten() {
            let Some(ports) = eps.get(&ip) else { continue };
            let mut echo_ports = BTreeSet::new();
            for (port, protocol) in ports {
                let name = std::net::SocketAddr::new(ip, *port).to_string();
                match protocol {
                    Protocol::Sctp => sctp.push(SctpServer::start(&pod.ns, &name, ip, *port)?),
                    _ if !echo_ports.insert(*port) => {}
                    _ => echo.push(match ip {
                        IpAddr::V4(_) => EchoServer::start(&pod.ns, &name, *port, *port)?,
                        IpAddr::V6(_) => EchoServer::start_at(&pod.ns, &name, ip, *port, *port)?,
                    }),
                }
            }
        }
    }
    Ok(Servers { _echo: echo, sctp })
}

/// Builds a lab (a node namespace with its node addresses, a client pod, one pod per
/// endpoint address of `spec.pods` with echo servers) and installs `spec.mode` in it.
pub fn install(spec: &LabSpec) -> Result<Installed, String> {
    let topo = build_pods(spec)?;
    let servers = start_servers(&topo, spec.pods)?;
    route_to_void(&topo.node, spec.frontends)?;
    let work = std::env::temp_dir().join(spec.tag);
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let mut lab = Installed {
        guards: Vec::new(),
        pins: None,
        cgroup: None,
        servers,
        topo,
        work,
    };
    let families = families(spec);
    match spec.mode {
        None => {}
        Some(Impl::Ebpf | Impl::EbpfHost) => start_agent(spec, &mut lab)?,
        Some(Impl::KubeProxy(mode @ (Mode::Iptables | Mode::Nftables))) => {
            let (model, settings, options) = (spec.model, spec.settings, spec.options);
            install_rules(&lab.topo.node, mode, model, settings, options, &families)?
        }
        Some(Impl::KubeProxy(Mode::Userspace)) => start_userspace(spec, &mut lab)?,
        Some(Impl::KubeProxy(Mode::Ipvs)) => {
            return Err("ipvs mode is not run in a lab (it needs the IPVS kernel modules)".into());
        }
    }
    Ok(lab)
}

/// Installs kube-proxy's rules of `mode` (iptables or nftables) for `model` in `node`, one
/// proxier per family of `families` (`settings` with each family), as kube-proxy applies
/// them: iptables with `iptables-restore --noflush` (`ip6tables-restore` for IPv6) and its
/// jumps into its chains, nftables as one table per family (`ip kube-proxy`, `ip6
/// kube-proxy`).
pub fn install_rules(
    node: &Netns,
    mode: Mode,
    model: &Model,
    settings: &NodeSettings,
    options: &emit::WriterOptions,
    families: &[IpFamily],
) -> Result<(), String> {
    for &family in families {
        let settings = for_family(settings, family);
        match mode {
            Mode::Iptables => {
                let payload = emit::iptables::emit(model, &settings, options);
                let (restore, iptables) = match family {
                    IpFamily::V4 => ("iptables-restore", "iptables"),
                    IpFamily::V6 => ("ip6tables-restore", "ip6tables"),
                };
                node.feed(restore, &["--noflush"], &payload.render())?;
                add_jumps(node, iptables, &emit::iptables::jumps(&payload))?;
            }
            // Each family's table carries its own hooks (prerouting, input, forward,
            // output, postrouting).
            Mode::Nftables => {
                let rules = emit::render(Mode::Nftables, model, &settings, options);
                node.feed("nft", &["-f", "-"], &rules)?;
            }
            other => return Err(format!("{other:?} rules are not installed this way")),
        }
    }
    Ok(())
}

/// The families kube-proxy's modes are installed for: IPv4 always (kube-proxy's primary
/// proxier), IPv6 when a frontend or an endpoint is IPv6 (its second proxier on a
/// dual-stack node).
fn families(spec: &LabSpec) -> Vec<IpFamily> {
    let v6 = spec.frontends.iter().any(|f| f.is_ipv6()) || spec.pods.keys().any(|ip| ip.is_ipv6());
    if v6 {
        FAMILIES.to_vec()
    } else {
        vec![IpFamily::V4]
    }
}

/// A node in a cluster routes ClusterIPs somewhere (its default route, through a gateway),
/// so a packet that no rule rewrites reaches the FORWARD hook, where kube-proxy REJECTs,
/// and the node's own packet reaches tc egress, where xlb translates SCTP. The lab's node
/// has no default route; a veth whose peer stays down (both ends in the node namespace: it
/// never carries a packet) stands in for it, with a gateway whose neighbour entry is
/// permanent (a packet waiting for an ARP answer would never reach tc egress).
pub fn route_to_void(node: &Netns, frontends: &[SocketAddr]) -> Result<(), String> {
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
    for (opt, gw) in [("-4", VOID_GW.to_string()), ("-6", VOID_GW6.to_string())] {
        node.ip(&[
            opt,
            "neigh",
            "replace",
            &gw,
            "lladdr",
            VOID_GW_MAC,
            "dev",
            "xv-void",
            "nud",
            "permanent",
        ])?;
    }
    for f in frontends {
        let (opt, len) = family_args(f.ip());
        let host = format!("{}/{len}", f.ip());
        let gw = if f.is_ipv4() {
            VOID_GW.to_string()
        } else {
            VOID_GW6.to_string()
        };
        let _ = node.ip(&[
            opt, "route", "replace", &host, "via", &gw, "dev", "xv-void", "onlink",
        ]);
    }
    Ok(())
}

/// The void's gateway: link-local addresses no lab namespace has, and a locally
/// administered MAC.
const VOID_GW: Ipv4Addr = Ipv4Addr::new(169, 254, 255, 254);
const VOID_GW6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0xffff, 0xfffe);
const VOID_GW_MAC: &str = "02:00:00:ff:ff:fe";

/// Adds kube-proxy's jumps into its chains, as it ensures them (with `iptables`, the
/// IPv4 proxier's tool, or `ip6tables`).
fn add_jumps(node: &Netns, iptables: &str, jumps: &[emit::Jump]) -> Result<(), String> {
    for j in jumps {
        run(node.command(iptables).args(j.args()))?;
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
    // The NodePort address of each family the settings name.
    let node_ports: Vec<String> = FAMILIES
        .iter()
        .filter_map(|f| node_port_ip(&for_family(spec.settings, *f)))
        .map(|ip| ip.to_string())
        .collect();
    if !node_ports.is_empty() {
        args.extend(["--nodeport-addresses".into(), node_ports.join(",")]);
    }
    lab.cgroup = Some(cgroup);
    let log = lab.work.join("agent.log");
    lab.guards
        .push(spawn_xlb(&lab.topo.node, spec.xlb, &args, &log)?);
    lab.pins = Some(Pins(pins.clone()));
    let want = spec.frontends.len().min(1);
    // A bound to fail by, not a speed: loading the programs (the verifier's walk) takes
    // seconds on a loaded 2-core machine, 15 s was once not enough.
    let deadline = Instant::now() + Duration::from_secs(60);
    let programmed = || {
        lb_userspace::datapath::pins::Pins::open(&pins)
            .and_then(|p| lb_userspace::list::services(&p))
            .map_or(0, |r| r.len())
    };
    while programmed() < want {
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
    add_jumps(&lab.topo.node, "iptables", &emit::userspace::JUMPS)?;
    std::thread::sleep(Duration::from_millis(1000));
    Ok(())
}
