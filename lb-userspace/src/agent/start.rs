//! The agent's start: the pin lock, the programs loaded and configured, the previous
//! layout's pins found, the socket hooks, the pinned maps adopted, the HTTP endpoints.

use std::{path::PathBuf, sync::Arc};

use tracing::{info, warn};

use super::{AgentError, DatapathOptions, ServerOptions, SocketOptions, sockets};
use crate::{
    EBPF_OBJECT,
    datapath::{
        DatapathError,
        bpflog::BpfLogReader,
        kernel::{KernelMaps, write_config},
        loader::{self, PinLock},
        pins::Pins,
        routing, socket, sysctl, upgrade,
        writer::MapWriter,
    },
    reconcile::Reconciler,
    serve::{self, health::Health, metrics::Metrics},
};

/// What the agent holds from start to stop.
pub(super) struct Started {
    /// Held while the agent runs: one agent per pin directory.
    pub(super) _lock: PinLock,
    pub(super) ebpf: aya::Ebpf,
    /// The node configuration as written (its routing flags kept current by the loop).
    pub(super) config: lb_common::NodeConfig,
    /// The programs' log reader, with `--bpf-log`.
    pub(super) _bpf_log: Option<BpfLogReader>,
    /// The previous layout's pins, taken over after the first sync.
    pub(super) upgrade: Option<upgrade::Previous>,
    /// The cgroup the socket hooks are attached to (none: off, or deferred by an upgrade).
    pub(super) hooks: Option<PathBuf>,
    pub(super) maps: KernelMaps,
    /// The pinned maps, opened once: the collector, the metrics, the upgrade and the
    /// takeover read and write through them.
    pub(super) pins: Pins,
    /// The books on the maps, adopting what was pinned.
    pub(super) books: Reconciler,
}

/// Loads the datapath and adopts what is pinned.
pub(super) fn load(opts: &DatapathOptions, sockets: &SocketOptions) -> Result<Started, AgentError> {
    let _lock = loader::lock(&opts.bpffs)?;
    let counters_pinned = loader::counters_pinned(&opts.bpffs);
    let mut ebpf = loader::load(EBPF_OBJECT, &opts.bpffs, &opts.map_sizes)?;
    super::memory::drop_object_pages(EBPF_OBJECT);
    let pins = Pins::open(&opts.bpffs)?;
    // Before this agent's programs replace an earlier one's (see `datapath::ct_egress`).
    super::backfill_egress(&pins);
    check_snat_ports(&opts.snat_ports);
    let cookie = socket::netns_cookie().map_err(|e| DatapathError::Socket {
        cgroup: PathBuf::from("/proc/self/ns/net"),
        reason: format!("cannot read this namespace's cookie: {e}"),
    })?;
    // The reader first: the flag turns the programs' log on at once.
    let _bpf_log = match opts.bpf_log {
        true => Some(BpfLogReader::start(&mut ebpf)?),
        false => None,
    };
    let mut config = opts.node_config(sockets.socket_lb, cookie);
    config.flags |= routing::by_destination();
    write_config(&mut ebpf, &config)?;
    // The previous layout's pins: its programs keep forwarding from them until this agent
    // has programmed its own maps and copied their flows over; only then are this agent's
    // programs attached (see `datapath::upgrade`).
    let upgrade = upgrade::Previous::find(&pins)?;
    let hooks = match upgrade {
        None => sockets::sync_socket_hooks(sockets, &pins, &mut ebpf),
        Some(_) => {
            info!(
                pins = %opts.bpffs.display(),
                "found the previous layout's maps: their flows are copied over after the first sync, before this agent's programs take over"
            );
            None
        }
    };
    // The names of the previous layout's names map, before the maps are read.
    if let Some(names) = upgrade::adopt_names(&pins)? {
        info!(
            names,
            "wrote the names of the previous layout's names map to the names file"
        );
    }
    let mut maps = KernelMaps::from_ebpf(&mut ebpf, &opts.bpffs)?;
    // The previous layout's address filters: their bits, before the filters are read.
    if let Some(words) = upgrade::adopt_filter(&pins)? {
        info!(
            words,
            "took the bits of the previous layout's address filters over"
        );
    }
    if !counters_pinned {
        maps.counters_created();
    }
    let mut current = maps.read().map_err(DatapathError::from)?;
    current.filter = maps.read_filter().map_err(DatapathError::from)?;
    info!(
        pins = %opts.bpffs.display(),
        services = current.services.len(),
        backends = current.backends.len(),
        "loaded; adopted what was pinned"
    );
    let limits = maps.limits();
    // The layout before slot ranges: its indices, so every flow keeps its service and backend.
    let books = match upgrade::slotted_indices(&pins)?.filter(|_| current.services.is_empty()) {
        Some(indices) => {
            info!(
                services = indices.services.len(),
                backends = indices.backends.len(),
                "adopted the indices of the service map before slot ranges"
            );
            Reconciler::adopt_slotted(indices, current, limits)
        }
        None => Reconciler::adopt(current, limits),
    };
    Ok(Started {
        _lock,
        ebpf,
        config,
        _bpf_log,
        upgrade,
        hooks,
        maps,
        pins,
        books,
    })
}

/// Serves /healthz and /livez, and /metrics, where asked.
pub(super) fn serve(
    opts: &ServerOptions,
    health: &Arc<Health>,
    metrics: &Arc<Metrics>,
) -> Result<(), AgentError> {
    if let Some(addr) = opts.healthz_addr {
        let h = health.clone();
        let bound = serve::spawn(addr, serve::Pool::Health, move |path| h.handle(path))?;
        info!(%bound, "serving /healthz and /livez");
    }
    if let Some(addr) = opts.metrics_addr {
        let m = metrics.clone();
        let status = opts.status.clone();
        let bound = serve::spawn(addr, serve::Pool::Metrics, move |path| {
            status.handle(path).or_else(|| m.handle(path))
        })?;
        info!(%bound, "serving /metrics, /proxyMode and /configz");
    }
    Ok(())
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
