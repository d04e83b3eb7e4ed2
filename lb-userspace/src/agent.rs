//! The agent's sync loop: source → model → desired → make-before-break writes; interfaces
//! that match are attached as they appear. Level-triggered: every sync recomputes the whole
//! desired state from the model and writes only the difference.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use thiserror::Error;
use tracing::{debug, error, info, warn};

use crate::{
    EBPF_OBJECT,
    datapath::{DatapathError, attach, kernel::KernelMaps, loader, sync::apply, writer::MapWriter},
    desired::{self, Desired, Ids},
    glob, netif,
    source::file::{self, FileWatch},
};

/// How the agent runs.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// The YAML file of Services and EndpointSlices.
    pub source_file: PathBuf,
    /// Glob(s) of pod-facing interfaces to attach to (comma-separated).
    pub pod_interfaces: String,
    /// Node interfaces that carry replies from remote backends.
    pub node_interfaces: Vec<String>,
    /// Pin directory on bpffs.
    pub bpffs: PathBuf,
    /// How often the source and the interfaces are polled.
    pub poll: Duration,
}

#[derive(Debug, Error)]
pub enum AgentError {
    #[error(transparent)]
    Datapath(#[from] DatapathError),
}

const ATTACH_RETRY: Duration = Duration::from_secs(5);

struct Interfaces {
    attached: BTreeSet<String>,
    failed: BTreeMap<String, Instant>,
    missing_reported: BTreeSet<String>,
}

/// Runs until `stop` is set. Pinned maps and links stay when it returns: the datapath keeps
/// forwarding, and the next agent adopts them.
pub fn run(opts: &AgentOptions, stop: &AtomicBool) -> Result<(), AgentError> {
    let mut ebpf = loader::load(EBPF_OBJECT, &opts.bpffs)?;
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
    let mut ifs = Interfaces {
        attached: BTreeSet::new(),
        failed: BTreeMap::new(),
        missing_reported: BTreeSet::new(),
    };
    let mut watch = FileWatch::new(opts.source_file.clone());
    let mut first = true;
    while !stop.load(Ordering::Relaxed) {
        sync_interfaces(opts, &mut ebpf, &mut ifs)?;
        if watch.changed() {
            current = sync_file(&mut watch, &mut maps, &current, &mut ids, limits);
            first = false;
        } else if first {
            error!(file = %watch.path().display(), "cannot read the source file; waiting for it");
            first = false;
        }
        std::thread::sleep(opts.poll);
    }
    info!(
        pins = %opts.bpffs.display(),
        "stopping; the datapath keeps forwarding from its pins (`xlb cleanup` removes them)"
    );
    Ok(())
}

fn sync_file(
    watch: &mut FileWatch,
    maps: &mut KernelMaps,
    current: &Desired,
    ids: &mut Ids,
    limits: desired::Limits,
) -> Desired {
    let started = Instant::now();
    let loaded = match file::load(watch.path()) {
        Ok(l) => l,
        Err(e) => {
            error!("{e}; keeping what is programmed");
            return current.clone();
        }
    };
    for e in &loaded.errors {
        warn!("{e}");
    }
    for why in &loaded.ignored {
        debug!("ignored: {why}");
    }
    let (want, problems) = desired::compute(&loaded.model, ids, limits);
    for p in &problems {
        warn!("{p}");
    }
    let (now, report) = apply(maps, current, &want);
    for e in &report.errors {
        error!("{e}");
    }
    info!(
        services = now.services.keys().filter(|k| k.slot == 0).count(),
        backends = now.backends.len(),
        writes = report.writes,
        deletes = report.deletes,
        errors = report.errors.len() + loaded.errors.len() + problems.len(),
        took_us = started.elapsed().as_micros() as u64,
        "synced"
    );
    now
}

fn sync_interfaces(
    opts: &AgentOptions,
    ebpf: &mut aya::Ebpf,
    ifs: &mut Interfaces,
) -> Result<(), DatapathError> {
    let live = netif::interfaces();
    ifs.attached.retain(|i| live.contains(i));
    for gone in attach::prune_links(&opts.bpffs, &live) {
        info!(iface = %gone, "interface gone; its link pin removed");
    }
    for name in &opts.node_interfaces {
        if !live.contains(name) && ifs.missing_reported.insert(name.clone()) {
            warn!(iface = %name, "node interface (--node-interfaces) does not exist; will attach when it appears");
        }
    }
    let wanted = live.iter().filter(|i| {
        *i != "lo"
            && (glob::matches_any(&opts.pod_interfaces, i) || opts.node_interfaces.contains(i))
    });
    for iface in wanted {
        if ifs.attached.contains(iface)
            || ifs
                .failed
                .get(iface)
                .is_some_and(|t| t.elapsed() < ATTACH_RETRY)
        {
            continue;
        }
        let prog = loader::tc_program(ebpf)?;
        match attach::attach_ingress(prog, &opts.bpffs, iface) {
            Ok(()) => {
                info!(iface = %iface, "attached tc ingress (TCX, pinned)");
                ifs.failed.remove(iface);
                ifs.missing_reported.remove(iface);
                ifs.attached.insert(iface.clone());
            }
            Err(e) => {
                error!("{e}; retrying in {}s", ATTACH_RETRY.as_secs());
                ifs.failed.insert(iface.clone(), Instant::now());
            }
        }
    }
    Ok(())
}
