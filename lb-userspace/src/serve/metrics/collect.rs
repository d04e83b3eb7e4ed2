//! What a scrape reads: the datapath's reason counters (one batched read), the cached fill
//! of the maps and conntrack tables, the health answers, the process's own numbers, and with
//! `--metrics-per-service` the per-service counters.

use std::{
    collections::{BTreeMap, HashMap},
    fmt,
    sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard},
};

use aya::maps::Map;
use lb_common::{
    Counter, MAP_CT, MAP_CT_ASSURED, MAP_CT6, MAP_CT6_ASSURED, MAP_STATS, MAP_SVC_STATS, R_COUNT,
    REASON_NAMES,
};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};
use tracing::debug;

use super::MetricsOptions;
use crate::{
    datapath::{
        DatapathError,
        counts::{self, Fill},
        ct_gc,
        names_file::ServiceNames,
        pins::Pins,
        rows,
    },
    serve::health::Health,
};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn lock_read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|p| p.into_inner())
}

/// `help` as the registry writes the help of the series it holds: a sentence.
fn sentence(help: &str) -> String {
    match help.ends_with('.') {
        true => help.to_string(),
        false => format!("{help}."),
    }
}

/// One family: its HELP and TYPE lines, then one sample per (labels, value); nothing when
/// there are no samples.
fn family<L: EncodeLabelSet, M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: Vec<(L, M)>,
) -> fmt::Result {
    if samples.is_empty() {
        return Ok(());
    }
    let help = sentence(help);
    let mut m = enc.encode_descriptor(name, &help, None, kind)?;
    for (labels, v) in &samples {
        v.encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

/// One series without labels.
pub(super) fn single(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: impl EncodeMetric,
) -> fmt::Result {
    let kind = v.metric_type();
    v.encode(enc.encode_descriptor(name, &sentence(help), None, kind)?)
}

/// What the agent and the conntrack collector leave for scrapes.
#[derive(Debug, Default)]
pub(super) struct Shared {
    inner: Mutex<Filled>,
}

#[derive(Debug, Default)]
struct Filled {
    /// The maps the agent writes, after its last sync.
    programmed: Vec<(&'static str, Fill)>,
    /// The collector's last pass (LRU counts from the last pass that counted them), and
    /// when (Unix seconds).
    conntrack: Option<(ct_gc::Pass, f64)>,
}

impl Shared {
    pub(super) fn set_programmed(&self, maps: Vec<(&'static str, Fill)>) {
        lock(&self.inner).programmed = maps;
    }

    pub(super) fn set_conntrack(&self, pass: &ct_gc::Pass, at: f64) {
        let mut f = lock(&self.inner);
        let mut pass = *pass;
        if let Some((old, _)) = &f.conntrack {
            pass.v4.lru = pass.v4.lru.or(old.v4.lru);
            if let (Some(new), Some(old)) = (pass.v6.as_mut(), old.v6) {
                new.lru = new.lru.or(old.lru);
            }
        }
        f.conntrack = Some((pass, at));
    }
}

/// Registers every collector `opts` asks for.
pub(super) fn register(
    r: &mut Registry,
    opts: &MetricsOptions,
    shared: &Arc<Shared>,
    health: Option<Arc<Health>>,
) {
    r.register_collector(Box::new(Reasons::new(&opts.pins)));
    r.register_collector(Box::new(Maps(shared.clone())));
    if let Some(h) = health {
        r.register_collector(Box::new(Answers(h)));
    }
    r.register_collector(Box::new(super::process::Process::new()));
    if let Some(p) = &opts.per_service {
        r.register_collector(Box::new(PerService::new(&opts.pins, p)));
    }
}

/// One map of the agent's pins, read on each scrape.
#[derive(Debug)]
struct Pinned {
    pins: Pins,
    name: &'static str,
}

impl Pinned {
    fn new(pins: &Pins, name: &'static str) -> Self {
        Self {
            pins: pins.clone(),
            name,
        }
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&Map) -> Result<T, DatapathError>,
    ) -> Result<T, DatapathError> {
        f(self.pins.get(self.name)?)
    }
}

/// `xlb_datapath_{packets,bytes}_total{reason}`: the per-CPU reason counters, summed.
#[derive(Debug)]
struct Reasons(Pinned);

impl Reasons {
    fn new(pins: &Pins) -> Self {
        Self(Pinned::new(pins, MAP_STATS))
    }

    fn read(&self) -> Result<Vec<Counter>, DatapathError> {
        let mut out = vec![Counter::default(); R_COUNT as usize];
        self.0.with(|map| {
            counts::counter_sums(map, MAP_STATS, |i, c| {
                if let Some(slot) = out.get_mut(i as usize) {
                    *slot = c;
                }
            })
        })?;
        Ok(out)
    }
}

impl Collector for Reasons {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let rows = match self.read() {
            Ok(rows) => rows,
            Err(e) => {
                debug!("metrics: datapath counters: {e}");
                return Ok(());
            }
        };
        let by_reason = |v: fn(&Counter) -> u64| {
            rows.iter()
                .zip(REASON_NAMES)
                .map(|(c, reason)| ([("reason", reason)], ConstCounter::new(v(c))))
                .collect::<Vec<_>>()
        };
        family(
            &mut enc,
            "xlb_datapath_packets",
            "Packets by datapath verdict reason, summed over CPUs",
            MetricType::Counter,
            by_reason(|c| c.packets),
        )?;
        family(
            &mut enc,
            "xlb_datapath_bytes",
            "Bytes by datapath verdict reason, summed over CPUs",
            MetricType::Counter,
            by_reason(|c| c.bytes),
        )
    }
}

/// `xlb_map_{entries,capacity}{map}` and the conntrack gauges, from the cache.
#[derive(Debug)]
struct Maps(Arc<Shared>);

impl Collector for Maps {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let (mut maps, conntrack) = {
            let f = lock(&self.0.inner);
            (f.programmed.clone(), f.conntrack)
        };
        let mut tables = Vec::new();
        if let Some((pass, _)) = &conntrack {
            let families = [
                ("IPv4", Some(pass.v4), MAP_CT, MAP_CT_ASSURED),
                ("IPv6", pass.v6, MAP_CT6, MAP_CT6_ASSURED),
            ];
            for (family, t, lru_map, assured_map) in families {
                let Some(t) = t else { continue };
                if let Some(lru) = t.lru {
                    maps.push((lru_map, lru));
                    tables.push(((family, "lru"), lru));
                }
                maps.push((assured_map, t.assured));
                tables.push(((family, "assured"), t.assured));
            }
        }
        let by_map = |v: fn(&Fill) -> u64| {
            maps.iter()
                .map(|(m, f)| ([("map", *m)], ConstGauge::new(v(f) as i64)))
                .collect::<Vec<_>>()
        };
        family(
            &mut enc,
            "xlb_map_entries",
            "Entries in a pinned map (the agent's maps after its last sync, the conntrack tables as last counted)",
            MetricType::Gauge,
            by_map(|f| f.entries),
        )?;
        family(
            &mut enc,
            "xlb_map_capacity",
            "Capacity (max_entries) of a pinned map",
            MetricType::Gauge,
            by_map(|f| f.capacity.into()),
        )?;
        let by_table = |v: fn(&Fill) -> u64| {
            tables
                .iter()
                .map(|((family, table), f)| {
                    (
                        [("ip_family", *family), ("table", *table)],
                        ConstGauge::new(v(f) as i64),
                    )
                })
                .collect::<Vec<_>>()
        };
        family(
            &mut enc,
            "xlb_conntrack_entries",
            "Conntrack entries (two a flow) as last counted, by family and table",
            MetricType::Gauge,
            by_table(|f| f.entries),
        )?;
        family(
            &mut enc,
            "xlb_conntrack_entries_limit",
            "Conntrack entries a table holds at most",
            MetricType::Gauge,
            by_table(|f| f.capacity.into()),
        )?;
        match conntrack {
            Some((_, at)) => single(
                &mut enc,
                "xlb_conntrack_counted_timestamp_seconds",
                "When the conntrack tables were last counted (Unix seconds)",
                ConstGauge::new(at),
            ),
            None => Ok(()),
        }
    }
}

/// kube-proxy's `kubeproxy_proxy_{healthz,livez}_total{code}`.
#[derive(Debug)]
struct Answers(Arc<Health>);

impl Collector for Answers {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let answered = self.0.answered();
        for (path, name) in [
            ("/healthz", "kubeproxy_proxy_healthz"),
            ("/livez", "kubeproxy_proxy_livez"),
        ] {
            let samples = answered
                .iter()
                .filter(|(p, _, _)| *p == path)
                .map(|(_, code, n)| ([("code", *code)], ConstCounter::new(*n)))
                .collect();
            let help = format!("Answers of {path} by status code");
            family(&mut enc, name, &help, MetricType::Counter, samples)?;
        }
        Ok(())
    }
}

/// `xlb_service_{packets,bytes}_total{service,port}` (`--metrics-per-service`): the
/// per-service counters summed over a service port's frontends and CPUs, for the first
/// `limit` service ports in name order. The names are the agent's (in its memory, as it
/// writes them); the counters read with batched lookups: linear in the service ports
/// programmed and the per-service array's capacity.
#[derive(Debug)]
struct PerService {
    names: ServiceNames,
    stats: Pinned,
    limit: usize,
}

/// Per-service rows: ((service, port), counters), and the service ports left out.
type ServiceRows = (Vec<((String, String), Counter)>, usize);

impl PerService {
    fn new(pins: &Pins, opts: &super::PerServiceOptions) -> Self {
        Self {
            names: opts.names.clone(),
            stats: Pinned::new(pins, MAP_SVC_STATS),
            limit: opts.limit,
        }
    }

    fn rows(&self) -> Result<ServiceRows, DatapathError> {
        let mut ports: BTreeMap<(String, String), Vec<u32>> = BTreeMap::new();
        // Grouped under the lock, the counters read after it (a sync waits only for this).
        for (id, name) in lock_read(&self.names).iter() {
            let (service, port) = crate::desired::service_port_of(name);
            ports
                .entry((service.to_string(), port.to_string()))
                .or_default()
                .push(*id);
        }
        let omitted = ports.len().saturating_sub(self.limit);
        let mut rows = Vec::with_capacity(ports.len().min(self.limit));
        let mut row_of: HashMap<u32, usize> = HashMap::new();
        for (key, ids) in ports.into_iter().take(self.limit) {
            row_of.extend(ids.into_iter().map(|id| (id, rows.len())));
            rows.push((key, Counter::default()));
        }
        // The rows alone: an assured flow's last second or so waits in its conntrack entries
        // (`datapath::pending`, which `xlb list` adds) and may go with them, and a counter
        // must never go down.
        self.stats.with(|m| {
            rows::sums(m, MAP_SVC_STATS, |id, c| {
                if let Some(row) = row_of.get(&id).and_then(|&i| rows.get_mut(i)) {
                    row.1.packets += c.packets;
                    row.1.bytes += c.bytes;
                }
            })
        })?;
        Ok((rows, omitted))
    }
}

impl Collector for PerService {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let (rows, omitted) = match self.rows() {
            Ok(r) => r,
            Err(e) => {
                debug!("metrics: per-service counters: {e}");
                return Ok(());
            }
        };
        let by_service = |v: fn(&Counter) -> u64| {
            rows.iter()
                .map(|((service, port), c)| {
                    (
                        [("service", service.as_str()), ("port", port.as_str())],
                        ConstCounter::new(v(c)),
                    )
                })
                .collect::<Vec<_>>()
        };
        family(
            &mut enc,
            "xlb_service_packets",
            "Packets forwarded for a service port (all its frontends, both directions)",
            MetricType::Counter,
            by_service(|c| c.packets),
        )?;
        family(
            &mut enc,
            "xlb_service_bytes",
            "Bytes forwarded for a service port (all its frontends, both directions)",
            MetricType::Counter,
            by_service(|c| c.bytes),
        )?;
        single(
            &mut enc,
            "xlb_metrics_service_ports_omitted",
            "Service ports left out of the per-service series (over --metrics-per-service's limit)",
            ConstGauge::new(omitted as i64),
        )
    }
}
