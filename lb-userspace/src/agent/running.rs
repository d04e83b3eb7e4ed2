//! The running agent: what it holds from start to stop, and one turn of its loop at a
//! time (attach what appeared, sync when due, else sleep until woken), its phase kept by
//! [`phase::Machine`].

use std::{
    sync::{Arc, mpsc::Receiver},
    time::{Duration, Instant},
};

use super::{
    AgentError, AgentOptions, CollectorGuard, State, backfill_egress,
    feed::{self, Wake},
    interfaces::{Interfaces, Wanted},
    next_wake, node_port_addresses,
    phase::{Input, Machine},
    sockets,
    stale_udp::{self, StaleUdp},
    start, status, take_over, takeover, update_service_health, woken,
};
use crate::{
    datapath::{
        kernel::{KernelMaps, write_config},
        links::KernelLinks,
        loader::PinLock,
        pins::Pins,
        routing,
        socket::SocketLb,
        upgrade,
    },
    desired,
    reconcile::{GoneUdp, Reconciler, Synced as SyncedBooks},
    serve::{
        health::Health,
        metrics::{Metrics, MetricsOptions, PerServiceOptions, Synced},
        service_health::ServiceHealth,
    },
};

/// What the agent holds while it runs.
pub(super) struct Running<'o> {
    opts: &'o AgentOptions,
    _lock: PinLock,
    ebpf: aya::Ebpf,
    /// The node configuration as written.
    config: lb_common::NodeConfig,
    _bpf_log: Option<crate::datapath::bpflog::BpfLogReader>,
    /// The previous layout's pins, taken over after the first sync.
    upgrade: Option<upgrade::Previous>,
    /// The socket hooks' cgroup.
    hooks: Option<std::path::PathBuf>,
    /// Destroys the connected UDP sockets of removed backends, off the loop.
    stale_udp: StaleUdp,
    maps: KernelMaps,
    pins: Pins,
    books: Reconciler,
    ifs: Interfaces,
    wanted: Wanted<'o>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    node: desired::NodeContext,
    service_health: ServiceHealth,
    _collector: CollectorGuard,
    wake: Receiver<Wake>,
    links_watched: bool,
    told: status::Told,
    state: State,
    links_changed: bool,
    /// A rule or route selecting by source came or went: the routing flags are looked at
    /// again.
    routing_changed: bool,
    attached: bool,
    last_sync: Option<Instant>,
    last_prune: Instant,
    /// A takeover attaches after the first sync, once kube-proxy's flows are xlb's.
    taking_over: bool,
    pub(super) phase: Machine,
}

impl<'o> Running<'o> {
    /// Loads the datapath, serves the HTTP endpoints, starts the source.
    pub(super) fn start(opts: &'o AgentOptions) -> Result<Self, AgentError> {
        let mut phase = Machine::default();
        let mut started = start::load(&opts.datapath, &opts.sockets)?;
        // The per-service series' names: the agent's own, as it writes them.
        let per_service = opts
            .servers
            .metrics_per_service
            .map(|limit| PerServiceOptions {
                limit,
                names: started.maps.share_names(started.books.programmed()),
            });
        let health = Arc::new(Health::new(Duration::from_secs(10).max(opts.poll * 20)));
        let metrics = Arc::new(Metrics::new(
            MetricsOptions {
                pins: started.pins.clone(),
                per_service,
            },
            Some(health.clone()),
        ));
        start::serve(&opts.servers, &health, &metrics)?;
        // Deferred hooks (an upgrade) are expected to attach; if they do not, the first
        // sync after the upgrade drops what only they would use.
        let socket_lb = started.hooks.is_some()
            || (started.upgrade.is_some() && sockets::wanted(&opts.sockets));
        let mut node = desired::NodeContext::new(
            &opts.node.name,
            &node_port_addresses(&opts.node, &opts.interfaces),
            socket_lb,
        );
        node.lb = opts.node.lb.clone();
        node.ipv6_off = crate::datapath::sysctl::ipv6_off();
        if let Some(why) = node.ipv6_off {
            tracing::warn!(
                why,
                "the node has IPv6 turned off: IPv6 frontends are not programmed"
            );
        }
        let service_health = ServiceHealth::new(health.clone());
        let sysctls = crate::datapath::sysctl::apply(&opts.datapath.kernel_conntrack);
        metrics.node_sysctls(&sysctls);
        let timeouts = crate::datapath::sysctl::collector_timeouts(&sysctls);
        let _collector = CollectorGuard::spawn(&started.pins, timeouts, &metrics);
        // Link changes wake the loop at once (a new or re-created pod veth is attached
        // within milliseconds); so do source events. Nothing is polled unless a watch is
        // unavailable.
        let (wake, links_watched) = feed::start(&opts.source, opts.poll);
        let told = status::Told::start(&opts.source, started.pins.dir());
        metrics.failing(status::counts(started.books.statuses()));
        phase.take(Input::Loaded);
        Ok(Self {
            opts,
            _lock: started._lock,
            ebpf: started.ebpf,
            config: started.config,
            _bpf_log: started._bpf_log,
            upgrade: started.upgrade,
            hooks: started.hooks,
            stale_udp: StaleUdp::new(started.pins.clone()),
            maps: started.maps,
            pins: started.pins,
            books: started.books,
            ifs: Interfaces::default(),
            wanted: Wanted::of(&opts.interfaces),
            health,
            metrics,
            node,
            service_health,
            _collector,
            wake,
            links_watched,
            told,
            state: State::default(),
            links_changed: true,
            routing_changed: false,
            attached: false,
            last_sync: None,
            last_prune: Instant::now(),
            taking_over: opts.takeover_from_kube_proxy,
            phase,
        })
    }

    /// One turn: interfaces attached where needed, then a sync when one is due, else a
    /// sleep until woken.
    pub(super) fn turn(&mut self) -> Result<(), AgentError> {
        self.attach_when_needed()?;
        self.routing_when_changed()?;
        self.state.prune_when_due(&mut self.last_prune);
        self.state.retry_when_due(self.books.next_retry());
        let due = self.state.due(self.last_sync, self.opts.min_sync);
        match due {
            // kube-proxy's bounded-frequency sync: a change after a quiet minSyncPeriod
            // applies at once; changes within it wait for its end and go as one sync.
            Some(at) if Instant::now() >= at => self.sync(),
            _ => self.sleep(due),
        }
    }

    /// Interfaces that appeared or changed attached (not while an upgrade or a takeover
    /// defers the programs).
    fn attach_when_needed(&mut self) -> Result<(), AgentError> {
        let deferred = self.upgrade.is_some() || self.taking_over;
        // Without a link watch, every turn looks.
        let asked = self.links_changed || self.ifs.pending() || self.ifs.retrying();
        if deferred || (!asked && self.links_watched) {
            return Ok(());
        }
        self.links_changed = false;
        let mut links = KernelLinks {
            ebpf: &mut self.ebpf,
            dir: self.pins.dir(),
        };
        // The first attach takes every interface (the flows the previous programs began are
        // filled in after it); later ones a batch a turn, a due sync between batches.
        match self.attached {
            true => self.ifs.sync(&mut links, &self.wanted)?,
            false => self.ifs.sync_all(&mut links, &self.wanted)?,
        }
        if !self.attached {
            // Flows the previous programs began before they were replaced.
            self.attached = true;
            backfill_egress(&self.pins);
        }
        Ok(())
    }

    /// The node config's routing flags (`CFG_F_ROUTES_BY_DST`, `CFG_F_ROUTES6_BY_DST`: XDP
    /// keeps the way out per backend) brought in line with the rules, when a rule or route
    /// selecting by source came or went (or every turn without a link watch).
    fn routing_when_changed(&mut self) -> Result<(), AgentError> {
        if !std::mem::take(&mut self.routing_changed) && self.links_watched {
            return Ok(());
        }
        const ROUTING: u32 = lb_common::CFG_F_ROUTES_BY_DST | lb_common::CFG_F_ROUTES6_BY_DST;
        let flags = (self.config.flags & !ROUTING) | routing::by_destination();
        if flags == self.config.flags {
            return Ok(());
        }
        self.config.flags = flags;
        write_config(&mut self.ebpf, &self.config)?;
        tracing::info!(
            ipv4 = flags & lb_common::CFG_F_ROUTES_BY_DST != 0,
            ipv6 = flags & lb_common::CFG_F_ROUTES6_BY_DST != 0,
            "routing by destination alone (XDP keeps the way out per backend) changed"
        );
        Ok(())
    }

    /// A sync of what changed, then what the first sync unblocks (an upgrade's or a
    /// takeover's attach), then it is recorded and told.
    fn sync(&mut self) -> Result<(), AgentError> {
        let opts = self.opts;
        self.last_sync = Some(Instant::now());
        let since = self.state.dirty.take().unwrap_or_else(Instant::now);
        let (services, endpoints) = std::mem::take(&mut self.state.queued);
        let started = Instant::now();
        let udp = match self.hooks.is_some() {
            true => GoneUdp::Find,
            false => GoneUdp::Ignore,
        };
        let mut synced = self
            .state
            .sync(&mut self.books, &self.node, &mut self.maps, udp);
        if let Some(cgroup) = self.hooks.as_deref() {
            // Handed to the worker: the loop does not wait for the namespaces' search.
            let all = opts.sockets.socket_lb == SocketLb::All;
            let dropped = self.stale_udp.submit(stale_udp::Job {
                gone: std::mem::take(&mut synced.gone_udp),
                scope: all.then(|| cgroup.to_path_buf()),
            });
            self.metrics.stale_udp_dropped(dropped as u64);
        }
        self.after_first_sync()?;
        let errors = synced.errors + std::mem::take(&mut self.state.errors);
        self.metrics.synced(&Synced {
            took: started.elapsed(),
            full: synced.full,
            programming: Some(since.elapsed()),
            services,
            endpoints,
            errors,
        });
        self.record(&synced, errors);
        Ok(())
    }

    /// The upgrade's take-over and the takeover from kube-proxy, once the maps hold this
    /// agent's first sync.
    fn after_first_sync(&mut self) -> Result<(), AgentError> {
        let opts = self.opts;
        if let Some(prev) = self.upgrade.take() {
            let now = self.books.programmed();
            let (ebpf, ifs) = (&mut self.ebpf, &mut self.ifs);
            self.hooks = take_over(opts, &self.pins, prev, now, ebpf, ifs, &self.wanted)?;
            self.node.socket_lb = self.hooks.is_some();
        }
        if std::mem::take(&mut self.taking_over) {
            let mut links = KernelLinks {
                ebpf: &mut self.ebpf,
                dir: self.pins.dir(),
            };
            let now = self.books.programmed();
            let (ifs, wanted) = (&mut self.ifs, &self.wanted);
            takeover::from_kube_proxy(&self.pins, now, || ifs.sync_all(&mut links, wanted))?;
        }
        Ok(())
    }

    /// What a sync left: the maps' fill, the failing frontends (metrics, told), health,
    /// the phase.
    fn record(&mut self, synced: &SyncedBooks, errors: u64) {
        let statuses = self.books.statuses();
        let (books, metrics) = (&self.books, &self.metrics);
        metrics.programmed(books.programmed(), books.tally(), books.limits());
        self.metrics.failing(status::counts(statuses));
        self.told
            .tell(&synced.transitions, statuses, &self.state.model);
        self.phase.take(Input::Synced {
            failing: statuses.failing().count(),
            errors,
        });
        self.health.synced();
        if std::mem::take(&mut self.state.health_changed) {
            let (state, node) = (&self.state, &self.node);
            update_service_health(&mut self.service_health, state, node, &self.opts.node.name);
        }
    }

    /// Sleeps until an event, `due` (the end of minSyncPeriod when a change waits), a
    /// retry's time, or a look at the stop flag; takes in what woke it.
    fn sleep(&mut self, due: Option<Instant>) -> Result<(), AgentError> {
        let opts = self.opts;
        self.state.release_after_full_sync();
        let poll = !self.links_watched || self.ifs.retrying();
        // A waiting sync takes due retries in; without one, a retry's time wakes the loop;
        // interfaces waiting for their batch do not wait at all.
        let attaching = self.ifs.pending() && self.upgrade.is_none() && !self.taking_over;
        let wake_at = match attaching {
            true => Some(Instant::now()),
            false => due.or(self.books.next_retry()),
        };
        let Some(first) = next_wake(&self.wake, wake_at, poll.then_some(opts.poll))? else {
            return Ok(());
        };
        let wake = &self.wake;
        for w in std::iter::once(first).chain(std::iter::from_fn(|| wake.try_recv().ok())) {
            let redo = woken(w, opts, &mut self.node, &mut self.state, &self.health)?;
            self.links_changed |= redo.links;
            self.routing_changed |= redo.routing;
        }
        if self.state.dirty.is_some() {
            self.health.queued();
            self.metrics
                .queued(self.state.queued.0, self.state.queued.1);
        }
        Ok(())
    }
}
