//! The agent's sync loop: source events → model (in place) → desired → make-before-break
//! writes; interfaces that match are attached as they appear (`interfaces`, woken by
//! rtnetlink), the socket hooks at start (`sockets`); sources and watchers send into one
//! channel (`feed`) the loop sleeps on. Syncs are bounded in frequency as kube-proxy's are
//! (`min_sync`), and everything is recomputed and diffed against the maps every [`PRUNE`].

use std::{
    collections::BTreeSet,
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
mod memory;
mod phase;
mod running;
mod shadow;
mod sockets;
mod stale_udp;
mod start;
mod status;
mod takeover;

pub use shadow::ShadowOptions;

use feed::Wake;
use interfaces::{Interfaces, Wanted};
use memory::release_free_memory;

use crate::{
    datapath::{
        DatapathError, attach, links::KernelLinks, netif, pins::Pins, socket::SocketLb, upgrade,
        writer::MapWriter,
    },
    desired::{self, Desired},
    model::{Model, ServiceRef},
    reconcile::{self, Reconciler},
    serve::{self, health::Health, metrics::Metrics},
    source::{
        SourceError,
        events::{self, Event, Stamped},
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
    /// This node: its name and where NodePorts are served.
    pub node: NodeOptions,
    /// The loaded programs and their maps.
    pub datapath: DatapathOptions,
    /// The interfaces tc and XDP attach to.
    pub interfaces: InterfaceOptions,
    /// The cgroup socket hooks.
    pub sockets: SocketOptions,
    /// The HTTP servers.
    pub servers: ServerOptions,
    /// How often the file and the interfaces are looked at when inotify or rtnetlink is
    /// unavailable (and how often a failed attach is retried); nothing is polled otherwise.
    pub poll: Duration,
    /// kube-proxy's minSyncPeriod: the least time between two syncs (a change after a quiet
    /// period applies at once, a burst within it is one sync at its end).
    pub min_sync: Duration,
    /// Take over kube-proxy's flows and remove its rules after the first sync, before the
    /// programs attach (see `agent/takeover.rs`).
    pub takeover_from_kube_proxy: bool,
    /// Shadow mode (`--shadow`): nothing is loaded or changed; kube-proxy's live rules are
    /// compared with what xlb would do (see `agent/shadow.rs`).
    pub shadow: Option<ShadowOptions>,
}

/// This node.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// This node's name (endpoints with this `nodeName` are local).
    pub name: String,
    /// Where NodePorts are served; empty: the node interfaces' addresses.
    pub node_port_addresses: Vec<std::net::IpAddr>,
    /// How external frontends pick backends (`--lb-algorithm`, `--maglev-*`).
    pub lb: desired::LbSettings,
}

/// The loaded programs, their pinned maps and their node configuration.
#[derive(Clone, Debug)]
pub struct DatapathOptions {
    /// Pin directory on bpffs.
    pub bpffs: PathBuf,
    /// Map sizes (`--conntrack-max-per-core`, `--conntrack-min`, `--*-map-max`).
    pub map_sizes: crate::datapath::sizes::MapSizes,
    /// Source ports for flows SNATed to this node (remote backends of external frontends).
    pub snat_ports: std::ops::RangeInclusive<u16>,
    /// Where a pod reaching itself through a service appears to come from; `None`: hairpin
    /// traffic is not SNATed.
    pub hairpin_address: Option<std::net::Ipv4Addr>,
    /// The same for IPv6 flows (`--hairpin-address6`).
    pub hairpin_address6: Option<std::net::Ipv6Addr>,
    /// The programs log their decisions into the agent's log (`--bpf-log debug`).
    pub bpf_log: bool,
    /// How external flows reach remote backends (`--lb-mode`).
    pub lb_mode: LbMode,
    /// The kernel conntrack's size and timeouts set at start, as kube-proxy sets them
    /// (`--config`'s `conntrack`, `--conntrack-*`); they drive the assured-flow collector.
    pub kernel_conntrack: crate::config::KernelConntrack,
}

/// `--lb-mode`: how a flow of an external frontend (externalTrafficPolicy Cluster) reaches
/// a backend on another node (Cilium's `loadBalancer.mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LbMode {
    /// SNAT to this node (kube-proxy's): replies come back through it.
    #[default]
    Snat,
    /// Direct server return for TCP and UDP (IPv4): the client's address is kept and the
    /// backend's node answers the client itself.
    Dsr,
    /// DSR for TCP, SNAT for UDP.
    Hybrid,
}

/// The interfaces tc and XDP attach to.
#[derive(Clone, Debug)]
pub struct InterfaceOptions {
    /// Glob(s) of pod-facing interfaces to attach to (comma-separated).
    pub pod_interfaces: String,
    /// Node interfaces: replies from remote backends and NodePort traffic arrive there.
    pub node_interfaces: Vec<String>,
    /// XDP on the node interfaces (`--xdp`).
    pub xdp: attach::XdpSetting,
}

/// The cgroup socket hooks.
#[derive(Clone, Debug)]
pub struct SocketOptions {
    /// Which sockets the hooks translate (`--socket-lb`).
    pub socket_lb: SocketLb,
    /// The cgroup v2 directory they attach to (`--cgroup-path`); `None`: the cgroup v2
    /// root found from the mounts.
    pub cgroup_path: Option<PathBuf>,
}

/// The HTTP servers.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Where `/healthz` and `/livez` are served (kube-proxy: 0.0.0.0:10256).
    pub healthz_addr: Option<std::net::SocketAddr>,
    /// Where `/metrics` is served (kube-proxy: 127.0.0.1:10249).
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Per-service series in `/metrics` for at most this many service ports
    /// (`--metrics-per-service`); none: node-level series only.
    pub metrics_per_service: Option<usize>,
    /// `/proxyMode` and `/configz`, on the metrics address.
    pub status: serve::status::Status,
}

impl DatapathOptions {
    /// The datapath's node configuration, with the socket hooks in mode `socket_lb`, in the
    /// network namespace with cookie `host_netns_cookie` (the agent's).
    pub fn node_config(
        &self,
        socket_lb: SocketLb,
        host_netns_cookie: u64,
    ) -> lb_common::NodeConfig {
        lb_common::NodeConfig {
            snat_port_min: *self.snat_ports.start(),
            snat_port_max: *self.snat_ports.end(),
            hairpin_addr_be: self
                .hairpin_address
                .map_or(0, |a| u32::from_ne_bytes(a.octets())),
            flags: if socket_lb == SocketLb::Host {
                lb_common::CFG_F_SOCK_HOST_ONLY
            } else {
                0
            } | if self.bpf_log {
                lb_common::CFG_F_BPF_LOG
            } else {
                0
            } | match self.lb_mode {
                LbMode::Snat => 0,
                LbMode::Dsr => lb_common::CFG_F_DSR_TCP | lb_common::CFG_F_DSR_UDP,
                LbMode::Hybrid => lb_common::CFG_F_DSR_TCP,
            },
            host_netns_cookie,
            hairpin6_addr_be: self
                .hairpin_address6
                .map_or([0; 4], |a| bytemuck::cast(a.octets())),
            ..Default::default()
        }
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
    #[error("taking over from kube-proxy: {0}")]
    Takeover(String),
    #[error(transparent)]
    Serve(#[from] serve::ServeError),
}

/// Runs until `stop` is set. Pinned maps and links stay when it returns: the datapath keeps
/// forwarding, and the next agent adopts them.
pub fn run(opts: &AgentOptions, stop: &AtomicBool) -> Result<(), AgentError> {
    if let Some(s) = &opts.shadow {
        return shadow::run(opts, s, stop);
    }
    memory::heap_settings();
    let mut agent = running::Running::start(opts)?;
    while !stop.load(Ordering::Relaxed) {
        agent.turn()?;
    }
    agent.phase.take(phase::Input::Stop);
    info!(
        pins = %opts.datapath.bpffs.display(),
        "stopping; the datapath keeps forwarding from its pins (`xlb cleanup` removes them)"
    );
    Ok(())
}

/// The health-check node ports of the services that want one, on the NodePort addresses
/// of both families (every IPv4 address when there are none), as each of kube-proxy's
/// proxiers serves them on its family's.
fn update_service_health(
    service_health: &mut serve::service_health::ServiceHealth,
    state: &State,
    node: &desired::NodeContext,
    node_name: &str,
) {
    service_health.update(
        &serve::service_health::desired(&state.model, node_name, &state.health_checked),
        &node.node_port_addresses(),
    );
}

/// Waits for the first wake until `due` (a sync waiting), `poll` (a watch unavailable or an
/// interface to retry) or a look at the stop flag; none when the time is up.
fn next_wake(
    wake: &std::sync::mpsc::Receiver<Wake>,
    due: Option<Instant>,
    poll: Option<Duration>,
) -> Result<Option<Wake>, AgentError> {
    let mut timeout = STOP_CHECK;
    if let Some(due) = due {
        timeout = timeout.min(due.saturating_duration_since(Instant::now()));
    }
    if let Some(poll) = poll {
        timeout = timeout.min(poll);
    }
    match wake.recv_timeout(timeout) {
        Ok(w) => Ok(Some(w)),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Ok(None),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(AgentError::SourceStopped),
    }
}

/// What a wake asks of the loop beyond the state.
#[derive(Clone, Copy, Debug, Default)]
struct Redo {
    /// The links changed: attach.
    links: bool,
    /// Routing by source may have changed: look at the rules again (`datapath::routing`).
    routing: bool,
}

/// Takes in one wake: a source event into the state, the node's addresses or zone into
/// `node`; what else it asks of the loop.
fn woken(
    w: Wake,
    opts: &AgentOptions,
    node: &mut desired::NodeContext,
    state: &mut State,
    health: &Health,
) -> Result<Redo, AgentError> {
    match w {
        Wake::Links => {
            return Ok(Redo {
                links: true,
                ..Redo::default()
            });
        }
        Wake::Routing => {
            return Ok(Redo {
                routing: true,
                ..Redo::default()
            });
        }
        Wake::Addresses => {
            let addrs = node_port_addresses(&opts.node, &opts.interfaces);
            if addrs != node.node_port_addresses() {
                node.set_node_port_addresses(&addrs);
                state.node_changed();
            }
        }
        Wake::SourceEnded(Some(e)) => return Err(e.into()),
        Wake::SourceEnded(None) => return Err(AgentError::SourceStopped),
        Wake::Source(t) => {
            if let Some(zone) = state.take(t, health)
                && zone != node.node.zone
            {
                node.node.zone = zone;
                state.node_changed();
            }
        }
    }
    Ok(Redo::default())
}

/// How long an idle agent sleeps before it looks at the stop flag again.
const STOP_CHECK: Duration = Duration::from_millis(500);

/// How often everything is recomputed and diffed against the maps (the slow prune).
pub const PRUNE: Duration = Duration::from_secs(60);

/// The agent's view of the source: its model, updated in place by each event, and what
/// waits for a sync.
#[derive(Default)]
struct State {
    model: Model,
    /// The source has sent its whole state once.
    ready: bool,
    /// When the oldest change waiting for a sync arrived.
    dirty: Option<Instant>,
    /// The next sync recomputes everything (the node changed, the prune, the first sync).
    full: bool,
    /// Services changed since the last sync (their desired state is recomputed).
    changed: BTreeSet<ServiceRef>,
    /// Services with a health check node port (their changes re-render service health).
    health_checked: BTreeSet<ServiceRef>,
    health_changed: bool,
    /// A full sync happened: its freed memory goes back to the kernel before the loop
    /// sleeps (after the service health it re-rendered).
    trim: bool,
    /// Services and endpoint slices changed since the last sync (for the metrics).
    queued: (u64, u64),
    /// Source errors since the last sync.
    errors: u64,
}

impl State {
    /// After a full sync: its freed memory back to the kernel.
    fn release_after_full_sync(&mut self) {
        if std::mem::take(&mut self.trim) {
            release_free_memory();
        }
    }

    /// The slow prune, every [`PRUNE`]: a full recompute (quarantined indices and retired
    /// filter bits expire in it) and a full diff against what is programmed.
    fn prune_when_due(&mut self, last_prune: &mut Instant) {
        if self.ready && last_prune.elapsed() >= PRUNE {
            *last_prune = Instant::now();
            self.full = true;
            self.dirty.get_or_insert_with(Instant::now);
        }
    }

    /// A failed service's retry is due (`next_retry`): a sync is wanted (it takes that
    /// service in).
    fn retry_when_due(&mut self, next_retry: Option<Instant>) {
        if self.ready && next_retry.is_some_and(|at| at <= Instant::now()) {
            self.dirty.get_or_insert_with(Instant::now);
        }
    }

    /// Syncs what changed (everything after a node change, as the prune, at start) into
    /// `maps` through `books`, finding the connected UDP pairs that went when `udp` asks.
    fn sync(
        &mut self,
        books: &mut Reconciler,
        node: &desired::NodeContext,
        maps: &mut dyn MapWriter,
        udp: reconcile::GoneUdp,
    ) -> reconcile::Synced {
        let changed = std::mem::take(&mut self.changed);
        let scope = match std::mem::take(&mut self.full) {
            true => reconcile::Scope::Everything,
            false => reconcile::Scope::Changed(&changed),
        };
        let synced = books.sync(&self.model, node, maps, scope, udp);
        self.health_changed |= synced.full;
        // A full sync's freed memory goes back to the kernel before the loop sleeps.
        self.trim |= synced.full;
        synced
    }

    /// When the next sync is due: at once after a quiet `min_sync`, else at its end; none
    /// before the source is ready or while nothing changed.
    fn due(&self, last_sync: Option<Instant>, min_sync: Duration) -> Option<Instant> {
        match (self.ready, self.dirty, last_sync) {
            (true, Some(_), Some(t)) => Some(t + min_sync),
            (true, Some(_), None) => Some(Instant::now()),
            _ => None,
        }
    }

    fn node_changed(&mut self) {
        self.full = true;
        self.health_changed = true;
        self.dirty.get_or_insert_with(Instant::now);
    }

    /// Takes one source event into the model; returns the node's zone from a Node event.
    fn take(&mut self, t: Stamped, health: &Health) -> Option<Option<String>> {
        let since = t.since;
        match t.event {
            Event::Error(e) => {
                match e {
                    SourceError::Io { .. } | SourceError::Yaml { .. } => {
                        error!("{e}; keeping what is programmed")
                    }
                    _ => warn!("{e}"),
                }
                self.errors += 1;
                return None;
            }
            Event::Node { deleting, zone } => {
                health.set_node_deleting(deleting);
                return Some(zone);
            }
            Event::Replace(loaded) => {
                for e in &loaded.errors {
                    warn!("{e}");
                }
                self.errors += loaded.errors.len() as u64;
                for why in &loaded.ignored {
                    debug!("ignored: {why}");
                }
                self.dirty.get_or_insert(since);
                if !self.ready || self.model == Model::default() {
                    // The first state: taken whole, computed in full.
                    self.ready = true;
                    self.full = true;
                    self.model = loaded.model;
                    self.model.compact();
                    self.queued.0 += self.model.services.len() as u64;
                    self.queued.1 += self
                        .model
                        .slices
                        .values()
                        .map(|s| s.len() as u64)
                        .sum::<u64>();
                    self.health_checked = serve::service_health::checked_services(&self.model);
                    return None;
                }
                for e in events::diff(&self.model, &loaded.model) {
                    self.apply(e, since);
                }
            }
            e => self.apply(e, since),
        }
        None
    }

    fn apply(&mut self, e: Event, since: Instant) {
        let slice = matches!(e, Event::Slice { .. });
        if let Some(id) = events::apply(&mut self.model, e) {
            if slice {
                self.queued.1 += 1;
            } else {
                self.queued.0 += 1;
            }
            let checked = self
                .model
                .services
                .get(&id)
                .is_some_and(|s| s.health_check_node_port.is_some());
            if checked {
                self.health_checked.insert(id.clone());
            }
            if checked || self.health_checked.contains(&id) {
                self.health_changed = true;
            }
            if !checked {
                self.health_checked.remove(&id);
            }
            self.changed.insert(id);
            self.dirty.get_or_insert(since);
        }
    }
}

/// The assured conntrack collector's thread (it also counts the conntrack tables for the
/// metrics), stopped when the agent returns.
struct CollectorGuard(Arc<AtomicBool>);

impl CollectorGuard {
    fn spawn(
        pins: &Pins,
        timeouts: crate::datapath::ct_gc::Timeouts,
        metrics: &Arc<Metrics>,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let m = metrics.clone();
        let report = move |p: &crate::datapath::ct_gc::Pass| m.conntrack(p);
        let pins = pins.clone();
        if let Err(e) = crate::datapath::ct_gc::spawn(pins, timeouts, stop.clone(), report) {
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
    pins: &Pins,
    prev: upgrade::Previous,
    current: &Desired,
    ebpf: &mut aya::Ebpf,
    ifs: &mut Interfaces,
    wanted: &Wanted<'_>,
) -> Result<Option<PathBuf>, AgentError> {
    let before = prev.copy(current, false)?;
    let hooks = sockets::sync_socket_hooks(&opts.sockets, pins, ebpf);
    let mut links = KernelLinks {
        ebpf,
        dir: pins.dir(),
    };
    ifs.sync_all(&mut links, wanted)?;
    backfill_egress(pins);
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

/// Adds the egress entries SNATed flows of an earlier datapath lack (see
/// `datapath::ct_egress`), logging what it did.
pub(super) fn backfill_egress(pins: &Pins) {
    match crate::datapath::ct_egress::backfill(pins) {
        Ok(0) => {}
        Ok(n) => info!(
            entries = n,
            "SNATed flows of an earlier datapath: egress entries added, their source side is restored at tc egress now"
        ),
        Err(e) => warn!("cannot add the egress entries of earlier SNATed flows: {e}"),
    }
}

/// `--nodeport-addresses`, or by default the node interfaces' addresses of both families
/// (IPv6: global ones, not link-local).
fn node_port_addresses(node: &NodeOptions, ifs: &InterfaceOptions) -> Vec<std::net::IpAddr> {
    if !node.node_port_addresses.is_empty() {
        return node.node_port_addresses.clone();
    }
    ifs.node_interfaces
        .iter()
        .flat_map(|i| netif::node_port_addresses(i))
        .collect()
}
