//! The agent's sync loop: source → model → desired → make-before-break writes; interfaces
//! that match are attached as they appear (`interfaces`), the socket hooks at start
//! (`sockets`), the source read through `feed`. Level-triggered: every sync recomputes the whole
//! desired state from the model and writes only the difference.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use thiserror::Error;
use tracing::{debug, error, info, warn};

mod feed;
mod interfaces;
mod sockets;

use feed::Feed;
use interfaces::{Interfaces, Wanted};

use crate::{
    EBPF_OBJECT,
    datapath::{
        DatapathError, attach,
        kernel::KernelMaps,
        links::KernelLinks,
        loader,
        socket::{self, SocketLb},
        sync::apply,
        sysctl, upgrade,
        writer::MapWriter,
    },
    desired::{self, Desired, Ids},
    model::Model,
    netif,
    serve::{self, health::Health, metrics::Metrics},
    source::{
        SourceError,
        file::Loaded,
        kube::{KubeError, KubeOptions},
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
    /// The programs log their decisions into the agent's log (`--bpf-log debug`).
    pub bpf_log: bool,
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
            } | if self.bpf_log {
                lb_common::CFG_F_BPF_LOG
            } else {
                0
            },
            host_netns_cookie,
            ..Default::default()
        }
    }
}

/// Warns when the SNAT ports overlap the node's ephemeral ports: a local connection could
/// then take a port a SNATed flow's replies use.
fn check_snat_ports(ports: &std::ops::RangeInclusive<u16>) {
    if let Some(eph) = sysctl::ephemeral_ports()
        && eph.start() <= ports.end()
        && ports.start() <= eph.end()
    {
        warn!(
            snat = ?ports,
            ephemeral = ?eph,
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
    // The reader first: the flag turns the programs' log on at once.
    let _bpf_log = match opts.bpf_log {
        true => Some(crate::datapath::bpflog::BpfLogReader::start(&mut ebpf)?),
        false => None,
    };
    crate::datapath::kernel::write_config(&mut ebpf, &opts.node_config(cookie))?;
    // The previous layout's pins: its programs keep forwarding from them until this agent
    // has programmed its own maps and copied their flows over; only then are this agent's
    // programs attached (see `datapath::upgrade`).
    let mut upgrade = upgrade::Previous::find(&opts.bpffs)?;
    let mut hooks = match upgrade {
        None => sockets::sync_socket_hooks(opts, &mut ebpf),
        Some(_) => {
            info!(
                pins = %opts.bpffs.display(),
                "found the previous layout's maps: their flows are copied over after the first sync, before this agent's programs take over"
            );
            None
        }
    };
    let mut maps = KernelMaps::from_ebpf(&mut ebpf)?;
    let limits = maps.limits();
    let mut current = maps.read().map_err(DatapathError::from)?;
    current.filter = maps.read_filter().map_err(DatapathError::from)?;
    let mut ids = Ids::adopt(&current);
    info!(
        pins = %opts.bpffs.display(),
        services = current.services.keys().filter(|k| k.slot == 0).count(),
        backends = current.backends.len(),
        "loaded; adopted what was pinned"
    );
    let mut ifs = Interfaces::default();
    let wanted = Wanted {
        pod_interfaces: &opts.pod_interfaces,
        node_interfaces: &opts.node_interfaces,
        xdp: opts.xdp,
    };
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
    // Deferred hooks (an upgrade) are expected to attach; if they do not, the first sync
    // after the upgrade drops what only they would use.
    let socket_lb = hooks.is_some() || (upgrade.is_some() && sockets::wanted(opts));
    let mut node = desired::NodeContext::new(&opts.node_name, &[], socket_lb);
    let mut service_health = serve::service_health::ServiceHealth::new(health.clone());
    let mut feed = Feed::start(&opts.source);
    let _collector = CollectorGuard::spawn(&opts.bpffs);
    while !stop.load(Ordering::Relaxed) {
        if upgrade.is_none() {
            let mut links = KernelLinks {
                ebpf: &mut ebpf,
                dir: &opts.bpffs,
            };
            ifs.sync(&mut links, &wanted)?;
        }
        if let Some(update) = feed.next()? {
            let source_ok = update.loaded.is_ok();
            health.set_node_deleting(update.node_deleting);
            node.node.zone = update.zone.clone();
            node.set_node_port_addresses(&node_port_addresses(opts));
            if let Ok(l) = &update.loaded {
                let (svc, ep) = changes(&model, &l.model);
                metrics.queued(svc, ep);
                health.queued();
                model = l.model.clone();
            }
            let started = Instant::now();
            let (now, errors) = sync(update.loaded, &node, &mut maps, &current, &mut ids, limits);
            if let Some(cgroup) = &hooks {
                sockets::destroy_stale_udp(opts, cgroup, &current, &now);
            }
            current = now;
            if source_ok && let Some(prev) = upgrade.take() {
                hooks = take_over(opts, prev, &current, &mut ebpf, &mut ifs, &wanted)?;
                node.socket_lb = hooks.is_some();
            }
            metrics.synced(started.elapsed(), Some(update.since.elapsed()), errors);
            health.synced();
            service_health.update(
                &serve::service_health::desired(&model, &opts.node_name),
                &node.node_port_addresses(),
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

/// The assured conntrack collector's thread, stopped when the agent returns.
struct CollectorGuard(Arc<AtomicBool>);

impl CollectorGuard {
    fn spawn(dir: &std::path::Path) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        if let Err(e) = crate::datapath::ct_gc::spawn(dir.to_path_buf(), stop.clone()) {
            warn!("cannot start the assured conntrack collector: {e}");
        }
        Self(stop)
    }
}

impl Drop for CollectorGuard {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The upgrade's steps after this agent's first sync: the previous layout's flows copied
/// over, this agent's programs attached (replacing the previous ones link by link), the
/// flows begun meanwhile copied too, the previous pins removed. Returns the socket hooks'
/// cgroup, as [`sockets::sync_socket_hooks`] does.
fn take_over(
    opts: &AgentOptions,
    prev: upgrade::Previous,
    current: &Desired,
    ebpf: &mut aya::Ebpf,
    ifs: &mut Interfaces,
    wanted: &Wanted<'_>,
) -> Result<Option<PathBuf>, AgentError> {
    let before = prev.copy(current, false)?;
    let hooks = sockets::sync_socket_hooks(opts, ebpf);
    let mut links = KernelLinks {
        ebpf,
        dir: &opts.bpffs,
    };
    ifs.sync(&mut links, wanted)?;
    let meanwhile = prev.copy(current, true)?;
    let removed = prev.finish();
    info!(
        conntrack = before.conntrack + meanwhile.conntrack,
        affinity = before.affinity + meanwhile.affinity,
        skipped = before.skipped,
        begun_meanwhile = meanwhile.conntrack,
        removed_pins = removed,
        "took over from the previous layout: flows copied, programs replaced, old pins removed"
    );
    Ok(hooks)
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
    ids.tick(Instant::now());
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
