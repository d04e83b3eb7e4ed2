//! The agent's sync loop: source → model → desired → make-before-break writes; interfaces
//! that match are attached as they appear. Level-triggered: every sync recomputes the whole
//! desired state from the model and writes only the difference.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use thiserror::Error;
use tracing::{debug, error, info, warn};

use crate::{
    EBPF_OBJECT,
    datapath::{
        DatapathError, attach,
        kernel::KernelMaps,
        loader,
        socket::{self, SocketLb},
        stale,
        sync::apply,
        writer::MapWriter,
    },
    desired::{self, Desired, Ids},
    glob,
    model::Model,
    netif,
    serve::{self, health::Health, metrics::Metrics},
    source::{
        SourceError,
        file::{self, FileWatch, Loaded},
        kube::{self as kube_source, KubeError, KubeOptions, Snapshot},
    },
};

/// Where services come from.
#[derive(Clone, Debug)]
pub enum SourceSpec {
    /// A YAML file of Services and EndpointSlices, re-read when it changes.
    File(PathBuf),
    /// The Kubernetes API server.
    Kubernetes(KubeOptions),
}

/// How the agent runs.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// Where services come from.
    pub source: SourceSpec,
    /// This node's name (endpoints with this `nodeName` are local).
    pub node_name: String,
    /// Glob(s) of pod-facing interfaces to attach to (comma-separated).
    pub pod_interfaces: String,
    /// Node interfaces: replies from remote backends and NodePort traffic arrive there.
    pub node_interfaces: Vec<String>,
    /// Where NodePorts are served; empty: the node interfaces' IPv4 addresses.
    pub node_port_addresses: Vec<std::net::Ipv4Addr>,
    /// Pin directory on bpffs.
    pub bpffs: PathBuf,
    /// How often the source and the interfaces are polled.
    pub poll: Duration,
    /// Where `/healthz` and `/livez` are served (kube-proxy: 0.0.0.0:10256).
    pub healthz_addr: Option<std::net::SocketAddr>,
    /// Where `/metrics` is served (kube-proxy: 127.0.0.1:10249).
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Source ports for flows SNATed to this node (remote backends of external frontends).
    pub snat_ports: std::ops::RangeInclusive<u16>,
    /// Where a pod reaching itself through a service appears to come from; `None`: hairpin
    /// traffic is not SNATed.
    pub hairpin_address: Option<std::net::Ipv4Addr>,
    /// XDP on the node interfaces (`--xdp`).
    pub xdp: attach::XdpSetting,
    /// Which sockets the cgroup socket hooks translate (`--socket-lb`).
    pub socket_lb: SocketLb,
    /// The cgroup v2 directory the socket hooks attach to (`--cgroup-path`); `None`: the
    /// cgroup v2 root found from the mounts.
    pub cgroup_path: Option<PathBuf>,
    /// Map sizes (`--conntrack-max-per-core`, `--conntrack-min`, `--*-map-max`).
    pub map_sizes: crate::datapath::sizes::MapSizes,
}

impl AgentOptions {
    /// The datapath's node configuration for these options, in the network namespace with
    /// cookie `host_netns_cookie` (the agent's).
    pub fn node_config(&self, host_netns_cookie: u64) -> lb_common::NodeConfig {
        lb_common::NodeConfig {
            snat_port_min: *self.snat_ports.start(),
            snat_port_max: *self.snat_ports.end(),
            hairpin_addr_be: self
                .hairpin_address
                .map_or(0, |a| u32::from_ne_bytes(a.octets())),
            flags: if self.socket_lb == SocketLb::Host {
                lb_common::CFG_F_SOCK_HOST_ONLY
            } else {
                0
            },
            host_netns_cookie,
            ..Default::default()
        }
    }
}

/// Attaches (or, with `--socket-lb off`, removes) the socket hooks; returns the cgroup they
/// run in. Without cgroup v2, or when attaching fails, the error is logged and the agent
/// goes on with the tc path alone.
fn sync_socket_hooks(opts: &AgentOptions, ebpf: &mut aya::Ebpf) -> Option<PathBuf> {
    if opts.socket_lb == SocketLb::Off {
        if socket::detach(&opts.bpffs) > 0 {
            info!("--socket-lb off: removed the socket hooks an earlier agent attached");
        }
        return None;
    }
    let Some(cgroup) = opts.cgroup_path.clone().or_else(socket::cgroup2_root) else {
        error!(
            "no cgroup v2 hierarchy is mounted: the socket hooks are off, so the node's own processes do not reach services (pods do, through tc)"
        );
        return None;
    };
    match socket::attach(ebpf, &opts.bpffs, &cgroup) {
        Ok(()) => {
            info!(cgroup = %cgroup.display(), mode = ?opts.socket_lb, "attached the socket hooks (connect4, sendmsg4, recvmsg4, getpeername4; pinned)");
            Some(cgroup)
        }
        Err(e) => {
            error!("{e}; the node's own processes do not reach services (pods do, through tc)");
            None
        }
    }
}

/// Destroys the connected UDP sockets that went to a backend `before` had and `after` no
/// longer has for the same frontend.
fn destroy_stale_udp(opts: &AgentOptions, cgroup: &Path, before: &Desired, after: &Desired) {
    let gone = stale::removed_udp(before, after);
    if gone.is_empty() {
        return;
    }
    let cookies = match stale::cookies(&opts.bpffs, &gone) {
        Ok(c) if c.is_empty() => return,
        Ok(c) => c,
        Err(e) => {
            warn!("cannot read the socket map: {e}; UDP sockets of removed backends stay");
            return;
        }
    };
    let scope = (opts.socket_lb == SocketLb::All).then_some(cgroup);
    let mut destroyed = 0;
    for ns in stale::namespaces(scope) {
        match stale::destroy_in(&ns, &cookies) {
            Ok(n) => destroyed += n,
            Err(e) => debug!(ns = %ns.display(), "cannot destroy UDP sockets there: {e}"),
        }
    }
    info!(
        sockets = destroyed,
        backends = gone.len(),
        "destroyed connected UDP sockets of removed backends"
    );
}

/// Warns when the SNAT ports overlap the node's ephemeral ports: a local connection could
/// then take a port a SNATed flow's replies use.
fn check_snat_ports(ports: &std::ops::RangeInclusive<u16>) {
    let Ok(text) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range") else {
        return;
    };
    let mut it = text
        .split_whitespace()
        .filter_map(|p| p.parse::<u16>().ok());
    if let (Some(lo), Some(hi)) = (it.next(), it.next())
        && lo <= *ports.end()
        && *ports.start() <= hi
    {
        warn!(
            snat = ?ports,
            ephemeral = ?(lo..=hi),
            "the SNAT port range overlaps net.ipv4.ip_local_port_range: move one of them"
        );
    }
}

#[derive(Debug, Error)]
pub enum AgentError {
    #[error(transparent)]
    Datapath(#[from] DatapathError),
    #[error(transparent)]
    Kube(#[from] KubeError),
    #[error("the Kubernetes source stopped")]
    SourceStopped,
    #[error(transparent)]
    Serve(#[from] serve::ServeError),
}

/// Something new from the source.
struct Update {
    loaded: Result<Loaded, SourceError>,
    /// When the oldest change in it was seen.
    since: Instant,
    node_deleting: bool,
    /// The node's zone, when the source knows it.
    zone: Option<String>,
}

/// The agent's view of a source: the next model to program, when there is one.
enum Feed {
    File {
        watch: FileWatch,
        reported: bool,
    },
    Kube {
        rx: std::sync::mpsc::Receiver<Snapshot>,
        thread: Option<std::thread::JoinHandle<Result<(), KubeError>>>,
    },
}

impl Feed {
    fn start(spec: &SourceSpec) -> Self {
        match spec {
            SourceSpec::File(path) => Feed::File {
                watch: FileWatch::new(path.clone()),
                reported: false,
            },
            SourceSpec::Kubernetes(opts) => {
                let (tx, rx) = std::sync::mpsc::channel();
                let thread = Some(kube_source::spawn(opts.clone(), tx));
                Feed::Kube { rx, thread }
            }
        }
    }

    /// `Ok(Some)` when there is something new to program (only the newest snapshot counts).
    fn next(&mut self) -> Result<Option<Update>, AgentError> {
        match self {
            Feed::File { watch, reported } => {
                if watch.changed() {
                    *reported = true;
                    return Ok(Some(Update {
                        since: Instant::now(),
                        loaded: file::load(watch.path()),
                        node_deleting: false,
                        zone: None,
                    }));
                }
                if !*reported {
                    error!(file = %watch.path().display(), "cannot read the source file; waiting for it");
                    *reported = true;
                }
                Ok(None)
            }
            Feed::Kube { rx, thread } => {
                let mut newest = None;
                loop {
                    match rx.try_recv() {
                        Ok(s) => {
                            let since = newest
                                .as_ref()
                                .map_or(s.since, |u: &Update| u.since.min(s.since));
                            newest = Some(Update {
                                loaded: Ok(s.loaded),
                                since,
                                node_deleting: s.node_deleting,
                                zone: s.zone,
                            });
                        }
                        Err(std::sync::mpsc::TryRecvError::Empty) => return Ok(newest),
                        Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                            return match thread.take().map(|t| t.join()) {
                                Some(Ok(Err(e))) => Err(e.into()),
                                _ => Err(AgentError::SourceStopped),
                            };
                        }
                    }
                }
            }
        }
    }
}

const ATTACH_RETRY: Duration = Duration::from_secs(5);

/// What is attached where. Interfaces are known by name and index: a re-created interface
/// (a restarted pod's veth) has the same name, a new index, and nothing attached.
#[derive(Default)]
struct Interfaces {
    /// tc ingress attached: name → ifindex.
    attached: BTreeMap<String, u32>,
    /// Node interfaces with XDP attached (or, with XDP off, checked): name → ifindex.
    xdp: BTreeMap<String, u32>,
    /// When XDP last failed on an interface (retried after `ATTACH_RETRY`).
    xdp_failed: BTreeMap<String, Instant>,
    /// When tc last failed on an interface (retried after `ATTACH_RETRY`).
    failed: BTreeMap<String, Instant>,
    missing_reported: BTreeSet<String>,
}

/// Whether `t` (a failure's time) is recent enough to wait before trying again.
fn backing_off(failures: &BTreeMap<String, Instant>, iface: &str) -> bool {
    failures
        .get(iface)
        .is_some_and(|t| t.elapsed() < ATTACH_RETRY)
}

/// Runs until `stop` is set. Pinned maps and links stay when it returns: the datapath keeps
/// forwarding, and the next agent adopts them.
pub fn run(opts: &AgentOptions, stop: &AtomicBool) -> Result<(), AgentError> {
    let _lock = loader::lock(&opts.bpffs)?;
    let mut ebpf = loader::load(EBPF_OBJECT, &opts.bpffs, &opts.map_sizes)?;
    check_snat_ports(&opts.snat_ports);
    let cookie = socket::netns_cookie().map_err(|e| DatapathError::Socket {
        cgroup: PathBuf::from("/proc/self/ns/net"),
        reason: format!("cannot read this namespace's cookie: {e}"),
    })?;
    crate::datapath::kernel::write_config(&mut ebpf, &opts.node_config(cookie))?;
    let hooks = sync_socket_hooks(opts, &mut ebpf);
    let mut maps = KernelMaps::from_ebpf(&mut ebpf)?;
    let limits = maps.limits();
    let mut current = maps.read().map_err(DatapathError::from)?;
    let mut ids = Ids::adopt(&current);
    info!(
        pins = %opts.bpffs.display(),
        services = current.services.keys().filter(|k| k.slot == 0).count(),
        backends = current.backends.len(),
        "loaded; adopted what was pinned"
    );
    let mut ifs = Interfaces::default();
    // Link changes wake the loop at once (a new or re-created pod veth is attached within
    // milliseconds); without rtnetlink the loop still looks every --poll-ms.
    let (wake_tx, wake) = std::sync::mpsc::channel();
    if let Err(e) = netif::watch_links(wake_tx) {
        warn!(
            "cannot watch link changes over rtnetlink: {e}; interfaces are polled every {:?}",
            opts.poll
        );
    }
    let health = Arc::new(Health::new(Duration::from_secs(10).max(opts.poll * 20)));
    let metrics = Arc::new(Metrics::new(opts.bpffs.clone()));
    if let Some(addr) = opts.healthz_addr {
        let h = health.clone();
        let bound = serve::spawn(addr, move |path| h.handle(path))?;
        info!(%bound, "serving /healthz and /livez");
    }
    if let Some(addr) = opts.metrics_addr {
        let m = metrics.clone();
        let bound = serve::spawn(addr, move |path| m.handle(path))?;
        info!(%bound, "serving /metrics");
    }
    let mut model = Model::default();
    let mut node = desired::NodeContext {
        name: opts.node_name.clone(),
        zone: None,
        node_port_addresses: Vec::new(),
        socket_lb: hooks.is_some(),
    };
    let mut service_health = serve::service_health::ServiceHealth::new(health.clone());
    let mut feed = Feed::start(&opts.source);
    while !stop.load(Ordering::Relaxed) {
        sync_interfaces(opts, &mut ebpf, &mut ifs)?;
        if let Some(update) = feed.next()? {
            health.set_node_deleting(update.node_deleting);
            node.zone = update.zone.clone();
            node.node_port_addresses = node_port_addresses(opts);
            if let Ok(l) = &update.loaded {
                let (svc, ep) = changes(&model, &l.model);
                metrics.queued(svc, ep);
                health.queued();
                model = l.model.clone();
            }
            let started = Instant::now();
            let (now, errors) = sync(update.loaded, &node, &mut maps, &current, &mut ids, limits);
            if let Some(cgroup) = &hooks {
                destroy_stale_udp(opts, cgroup, &current, &now);
            }
            current = now;
            metrics.synced(started.elapsed(), Some(update.since.elapsed()), errors);
            health.synced();
            service_health.update(
                &serve::service_health::desired(&model, &opts.node_name),
                &node.node_port_addresses,
            );
        }
        // Up to --poll-ms, or less when a link changed.
        if wake.recv_timeout(opts.poll).is_ok() {
            while wake.try_recv().is_ok() {}
        }
    }
    info!(
        pins = %opts.bpffs.display(),
        "stopping; the datapath keeps forwarding from its pins (`xlb cleanup` removes them)"
    );
    Ok(())
}

/// `--nodeport-addresses`, or by default the IPv4 addresses of the node interfaces.
fn node_port_addresses(opts: &AgentOptions) -> Vec<std::net::Ipv4Addr> {
    if !opts.node_port_addresses.is_empty() {
        return opts.node_port_addresses.clone();
    }
    opts.node_interfaces
        .iter()
        .flat_map(|i| netif::ipv4_addresses(i))
        .collect()
}

/// How many services and how many services' endpoints differ between two models.
fn changes(old: &Model, new: &Model) -> (u64, u64) {
    fn diff<K: Ord, V: PartialEq>(a: &BTreeMap<K, V>, b: &BTreeMap<K, V>) -> u64 {
        let gone = a.keys().filter(|k| !b.contains_key(k)).count();
        let changed = b.iter().filter(|(k, v)| a.get(k) != Some(v)).count();
        (gone + changed) as u64
    }
    (
        diff(&old.services, &new.services),
        diff(&old.slices, &new.slices),
    )
}

/// Programs `loaded`; returns what is programmed and how many errors the sync had.
fn sync(
    loaded: Result<Loaded, SourceError>,
    node: &desired::NodeContext,
    maps: &mut KernelMaps,
    current: &Desired,
    ids: &mut Ids,
    limits: desired::Limits,
) -> (Desired, u64) {
    let started = Instant::now();
    let loaded = match loaded {
        Ok(l) => l,
        Err(e) => {
            error!("{e}; keeping what is programmed");
            return (current.clone(), 1);
        }
    };
    for e in &loaded.errors {
        warn!("{e}");
    }
    for why in &loaded.ignored {
        debug!("ignored: {why}");
    }
    let (want, problems) = desired::compute_on(&loaded.model, node, ids, limits);
    for p in &problems {
        match p {
            desired::DesiredError::NoEndpointSlice { .. } => info!("{p}"),
            _ => warn!("{p}"),
        }
    }
    let (now, report) = apply(maps, current, &want);
    for e in &report.errors {
        error!("{e}");
    }
    // A Service without an EndpointSlice is normal (kube-proxy does not count it).
    let counted = problems
        .iter()
        .filter(|p| !matches!(p, desired::DesiredError::NoEndpointSlice { .. }))
        .count();
    let errors = report.errors.len() + loaded.errors.len() + counted;
    info!(
        services = now.services.keys().filter(|k| k.slot == 0).count(),
        backends = now.backends.len(),
        writes = report.writes,
        deletes = report.deletes,
        errors,
        took_us = started.elapsed().as_micros() as u64,
        "synced"
    );
    (now, errors as u64)
}

/// Attaches XDP to node interface `iface` as `--xdp` asks (or removes an XDP link an earlier
/// agent left when it is off), and lets XDP redirect to it.
fn sync_xdp(
    opts: &AgentOptions,
    ebpf: &mut aya::Ebpf,
    iface: &str,
    ifindex: u32,
    ifs: &mut Interfaces,
) -> Result<(), DatapathError> {
    if opts.xdp == attach::XdpSetting::Off {
        if let Ok(old) =
            aya::programs::links::PinnedLink::from_pin(attach::xdp_link_pin(&opts.bpffs, iface))
        {
            let _ = old.unpin();
            info!(
                iface,
                "XDP is off: removed the XDP link an earlier agent attached"
            );
        }
        ifs.xdp.insert(iface.to_string(), ifindex);
        return Ok(());
    }
    if backing_off(&ifs.xdp_failed, iface) {
        return Ok(());
    }
    let prog = loader::xdp_program(ebpf)?;
    match attach::attach_xdp(prog, &opts.bpffs, iface, ifindex, opts.xdp) {
        Ok(mode) => {
            let map = ebpf
                .map_mut(lb_common::MAP_XDP_TX)
                .ok_or(DatapathError::MapMissing {
                    name: lb_common::MAP_XDP_TX,
                })?;
            let mut tx: aya::maps::DevMapHash<&mut aya::maps::MapData> =
                aya::maps::DevMapHash::try_from(map).map_err(|source| DatapathError::Map {
                    name: lb_common::MAP_XDP_TX,
                    source,
                })?;
            if let Err(e) = tx.insert(ifindex, ifindex, None, 0) {
                warn!(
                    iface,
                    "XDP cannot redirect to {iface}: {e}; translated packets go through the stack"
                );
            }
            info!(iface, mode, "attached XDP (pinned)");
            ifs.xdp_failed.remove(iface);
            ifs.xdp.insert(iface.to_string(), ifindex);
        }
        Err(e) => {
            error!(
                "{e}; tc handles {iface}; retrying XDP in {}s",
                ATTACH_RETRY.as_secs()
            );
            ifs.xdp_failed.insert(iface.to_string(), Instant::now());
        }
    }
    Ok(())
}

fn sync_interfaces(
    opts: &AgentOptions,
    ebpf: &mut aya::Ebpf,
    ifs: &mut Interfaces,
) -> Result<(), DatapathError> {
    let live = netif::interfaces();
    // Forget what is gone or was re-created (same name, another index).
    ifs.attached.retain(|i, idx| live.get(i) == Some(idx));
    ifs.xdp.retain(|i, idx| live.get(i) == Some(idx));
    for iface in &opts.node_interfaces {
        if let Some(&idx) = live.get(iface)
            && !ifs.xdp.contains_key(iface)
        {
            sync_xdp(opts, ebpf, iface, idx, ifs)?;
        }
    }
    let names: Vec<String> = live.keys().cloned().collect();
    for gone in attach::prune_links(&opts.bpffs, &names) {
        info!(iface = %gone, "interface gone; its link pin removed");
    }
    for name in &opts.node_interfaces {
        if !live.contains_key(name) && ifs.missing_reported.insert(name.clone()) {
            warn!(iface = %name, "node interface (--node-interfaces) does not exist; will attach when it appears");
        }
    }
    let wanted = live.iter().filter(|(i, _)| {
        *i != "lo"
            && (glob::matches_any(&opts.pod_interfaces, i) || opts.node_interfaces.contains(*i))
    });
    for (iface, &idx) in wanted {
        if ifs.attached.contains_key(iface) || backing_off(&ifs.failed, iface) {
            continue;
        }
        let prog = loader::tc_program(ebpf)?;
        match attach::attach_ingress(prog, &opts.bpffs, iface) {
            Ok(()) => {
                info!(iface = %iface, "attached tc ingress (TCX, pinned)");
                // A reverse-NATed NodePort reply carries the node's own address as source:
                // without accept_local the kernel would drop it as a martian.
                let knob = format!("/proc/sys/net/ipv4/conf/{iface}/accept_local");
                if let Err(e) = std::fs::write(&knob, "1") {
                    warn!(iface = %iface, "cannot set {knob}: {e}; NodePort replies may be dropped");
                }
                ifs.failed.remove(iface);
                ifs.missing_reported.remove(iface);
                ifs.attached.insert(iface.clone(), idx);
            }
            Err(e) => {
                error!("{e}; retrying in {}s", ATTACH_RETRY.as_secs());
                ifs.failed.insert(iface.clone(), Instant::now());
            }
        }
    }
    Ok(())
}
