//! `xlb list`: reads the pinned maps and shows them in Kubernetes terms.

use lb_common::user::{show_backend, show_frontend};
use std::{fmt::Write as _, net::Ipv4Addr};

use aya::maps::{HashMap, MapData, PerCpuArray};
use lb_common::{
    CT_DIR_FORWARD, CT_F_SNAT, Counter, CtKey, CtKey6, CtValue, CtValue6, MAP_CT, MAP_CT_ASSURED,
    MAP_CT6, MAP_CT6_ASSURED, MAP_STATS, R_COUNT, REASON_NAMES,
};
use serde::Serialize;

use crate::{
    datapath::{
        DatapathError, clock::monotonic_coarse_ns, kernel::KernelMaps, names_file,
        pending::Pending, pins::Pins, status_file, writer::MapWriter,
    },
    desired::{Desired, show_maglev},
    model::{IpFamily, Protocol},
};

#[derive(Debug, Serialize)]
pub struct ServiceRow {
    pub service: String,
    pub frontend: String,
    /// `programmed` (it is in the maps), or for a frontend the agent failed to program
    /// (its row then comes from the agent's status file, `frontend` is `-` and the ids
    /// 0) `<Reason> since <time>: <message>`.
    pub status: String,
    pub id: u32,
    pub backends: Vec<String>,
    /// The clients a LoadBalancer frontend admits (its loadBalancerSourceRanges of the
    /// frontend's family, `a.b.c.d/len` or `v6/len`); empty: every client.
    pub source_ranges: Vec<String>,
    /// How a new flow picks its backend: `random`, or for a frontend flagged
    /// `SVC_F_MAGLEV` its table as `maglev M=<size> table=<digest>`
    /// ([`crate::desired::show_maglev`]: nodes with the same word have the same table).
    pub algorithm: String,
    /// Packets and bytes forwarded for this service (both directions), summed over CPUs.
    pub packets: u64,
    pub bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct BackendRow {
    pub id: u32,
    pub backend: String,
    pub services: Vec<String>,
    /// Packets and bytes forwarded to and from this backend, summed over CPUs.
    pub packets: u64,
    pub bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct FlowRow {
    pub protocol: String,
    pub client: String,
    pub frontend: String,
    pub backend: String,
    /// The source the backend sees: SNAT (to the node or the hairpin address), else "-".
    pub snat: String,
    /// Direct server return (`--lb-mode dsr|hybrid`): "sent" on the node that chose the
    /// remote backend (the frontend rides in an IPv4 option or IPv6 destination option),
    /// "learnt" on the backend's node (from that option: it answers the client), else "-".
    pub dsr: String,
    pub service: String,
    pub age_seconds: u64,
    pub idle_seconds: u64,
    /// Answered and continued: kept in the assured table, which no flood evicts.
    pub assured: bool,
}

#[derive(Debug, Serialize)]
pub struct CounterRow {
    pub reason: &'static str,
    pub packets: u64,
    pub bytes: u64,
}

fn read_state(pins: &Pins) -> Result<Desired, DatapathError> {
    let maps = KernelMaps::open(pins)?;
    Ok(maps.read()?)
}

/// Why the services are shown by index, when they are: the agent's names file (beside the
/// pins, `datapath::names_file`) is missing.
pub fn names_unavailable(pins: &Pins) -> Option<String> {
    let path = names_file::path(pins.dir());
    (!path.exists()).then(|| {
        format!(
            "names unavailable: no names file {} (no agent of this version has run with these pins since boot): services are shown by index (#N)",
            path.display()
        )
    })
}

fn name_of(state: &Desired, svc_id: u32) -> String {
    state
        .names
        .get(&svc_id)
        .map(|n| n.to_string())
        .unwrap_or_else(|| format!("#{svc_id}"))
}

/// One row per frontend, and one per frontend the agent failed to program.
pub fn services(pins: &Pins) -> Result<Vec<ServiceRow>, DatapathError> {
    let maps = KernelMaps::open(pins)?;
    let state = maps.read()?;
    let pending = Pending::read(pins)?;
    let mut rows = services_of(&state);
    for r in &mut rows {
        let (c, p) = (maps.service_counter(r.id), pending.service(r.id));
        (r.packets, r.bytes) = (c.packets + p.packets, c.bytes + p.bytes);
    }
    // An unreadable status file leaves the programmed rows (their status is the maps').
    let failing = status_file::read(pins.dir()).unwrap_or_default();
    rows.extend(failing.into_iter().map(failing_row));
    rows.sort_by(|a, b| (&a.service, &a.frontend).cmp(&(&b.service, &b.frontend)));
    Ok(rows)
}

/// The row of a frontend the agent failed to program: its service port's name (the
/// frontend's object name up to its ` (nodePort …)`-like suffix), its status.
fn failing_row(f: status_file::Failing) -> ServiceRow {
    let service = crate::desired::service_port_name(&f.frontend).to_string();
    let since = i64::try_from(f.since)
        .ok()
        .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
        .map_or_else(|| f.since.to_string(), |t| t.to_string());
    ServiceRow {
        service,
        frontend: "-".into(),
        status: format!("{} since {since}: {}", f.reason, f.message),
        id: 0,
        backends: Vec::new(),
        source_ranges: Vec::new(),
        algorithm: "-".into(),
        packets: 0,
        bytes: 0,
    }
}

/// Rows for a state already read (counters left at zero).
pub fn services_of(state: &Desired) -> Vec<ServiceRow> {
    // The source ranges by service index, once (not a scan of them per frontend).
    let mut ranges: std::collections::HashMap<u32, Vec<String>> = std::collections::HashMap::new();
    for r in &state.src_ranges {
        ranges
            .entry(r.svc_id)
            .or_default()
            .push(format!("{}/{}", r.addr, r.prefix));
    }
    let mut rows = Vec::new();
    for (k, v) in &state.services {
        let backends = v
            .slots
            .iter()
            .map(|id| {
                state
                    .backends
                    .get(id)
                    .map_or("MISSING".into(), show_backend)
            })
            .collect();
        let source_ranges = if v.flags & lb_common::SVC_F_SRC_RANGES != 0 {
            ranges.get(&v.svc_id).cloned().unwrap_or_default()
        } else {
            Vec::new()
        };
        let algorithm = if v.flags & lb_common::SVC_F_MAGLEV != 0 {
            show_maglev(state.maglev.get(&v.svc_id))
        } else {
            "random".into()
        };
        rows.push(ServiceRow {
            service: name_of(state, v.svc_id),
            frontend: show_frontend(k),
            status: "programmed".into(),
            id: v.svc_id,
            backends,
            source_ranges,
            algorithm,
            packets: 0,
            bytes: 0,
        });
    }
    rows.sort_by(|a, b| (&a.service, &a.frontend).cmp(&(&b.service, &b.frontend)));
    rows
}

/// One row per backend, with the services that use it.
pub fn backends(pins: &Pins) -> Result<Vec<BackendRow>, DatapathError> {
    let maps = KernelMaps::open(pins)?;
    let state = maps.read()?;
    let pending = Pending::read(pins)?;
    let mut rows = backends_of(&state);
    for r in &mut rows {
        let (c, p) = (maps.backend_counter(r.id), pending.backend(r.id));
        (r.packets, r.bytes) = (c.packets + p.packets, c.bytes + p.bytes);
    }
    Ok(rows)
}

/// Rows for a state already read (counters left at zero): the service entries are indexed
/// by backend once, so this is linear in entries (not services × backends).
pub fn backends_of(state: &Desired) -> Vec<BackendRow> {
    let mut by_backend: std::collections::HashMap<u32, Vec<u32>> =
        std::collections::HashMap::with_capacity(state.backends.len());
    for v in state.services.values() {
        for id in v.slots.iter() {
            by_backend.entry(*id).or_default().push(v.svc_id);
        }
    }
    state
        .backends
        .iter()
        .map(|(id, be)| {
            let mut ids = by_backend.remove(id).unwrap_or_default();
            // In service-map order, one name per service index.
            ids.dedup();
            let mut services: Vec<String> = ids.iter().map(|s| name_of(state, *s)).collect();
            services.dedup();
            BackendRow {
                id: *id,
                backend: show_backend(be),
                services,
                packets: 0,
                bytes: 0,
            }
        })
        .collect()
}

fn sock(addr_be: u32, port_be: u16) -> String {
    format!(
        "{}:{}",
        Ipv4Addr::from(addr_be.to_ne_bytes()),
        u16::from_be(port_be)
    )
}

/// Tracked flows (forward entries), oldest first: the assured table's and the LRU table's.
pub fn conntrack(pins: &Pins) -> Result<Vec<FlowRow>, DatapathError> {
    let state = read_state(pins)?;
    let now = monotonic_coarse_ns();
    let mut rows = Vec::new();
    for (name, assured) in [(MAP_CT_ASSURED, true), (MAP_CT, false)] {
        let ct: HashMap<MapData, CtKey, CtValue> = HashMap::try_from(pins.map(name)?)
            .map_err(|source| DatapathError::Map { name, source })?;
        for kv in ct.iter() {
            let (k, v) = kv.map_err(|source| DatapathError::Map { name, source })?;
            if k.dir != CT_DIR_FORWARD {
                continue;
            }
            rows.push(flow_row(&state, &k, &v, now, assured));
        }
    }
    // IPv6 flows: their own tables (missing under the pins of an agent from before them).
    for (name, assured) in [(MAP_CT6_ASSURED, true), (MAP_CT6, false)] {
        if !pins.has(name) {
            continue;
        }
        let ct: HashMap<MapData, CtKey6, CtValue6> = HashMap::try_from(pins.map(name)?)
            .map_err(|source| DatapathError::Map { name, source })?;
        for kv in ct.iter() {
            let (k, v) = kv.map_err(|source| DatapathError::Map { name, source })?;
            if k.dir != CT_DIR_FORWARD {
                continue;
            }
            rows.push(flow_row6(&state, &k, &v, now, assured));
        }
    }
    rows.sort_by_key(|r| std::cmp::Reverse(r.age_seconds));
    Ok(rows)
}

fn flow_row(state: &Desired, k: &CtKey, v: &CtValue, now: u64, assured: bool) -> FlowRow {
    FlowRow {
        protocol: Protocol::from_number(k.proto)
            .map_or_else(|| k.proto.to_string(), |p| p.to_string()),
        client: sock(k.saddr_be, k.sport_be),
        frontend: sock(k.daddr_be, k.dport_be),
        backend: sock(v.daddr_be, v.dport_be),
        snat: if v.flags & CT_F_SNAT != 0 {
            sock(v.saddr_be, v.sport_be)
        } else {
            "-".into()
        },
        dsr: dsr_cell(v.flags, v.backend_gen, IpFamily::V4),
        service: name_of(state, v.svc_id),
        age_seconds: now.saturating_sub(v.created_ns) / 1_000_000_000,
        idle_seconds: now.saturating_sub(v.last_seen_ns) / 1_000_000_000,
        assured,
    }
}

/// The DSR cell of a flow whose forward entry has `flags` and `backend_gen`: a flow this node
/// sends by DSR has its backend's generation; one it learnt from another node's option has
/// none (0).
fn dsr_cell(flags: u16, backend_gen: u32, family: IpFamily) -> String {
    if flags & lb_common::CT_F_DSR == 0 {
        "-".into()
    } else if backend_gen == 0 {
        "learnt".into()
    } else {
        match family {
            IpFamily::V4 => format!("sent (IPv4 option, {} B)", lb_common::DSR_OPT_LEN),
            IpFamily::V6 => format!(
                "sent (IPv6 destination option, {} B)",
                lb_common::DSR6_HDR_LEN
            ),
        }
    }
}

/// `[addr]:port` of an IPv6 address and port in network order.
fn sock6(addr_be: &[u32; 4], port_be: u16) -> String {
    let mut b = [0u8; 16];
    for (i, w) in addr_be.iter().enumerate() {
        b[4 * i..4 * i + 4].copy_from_slice(&w.to_ne_bytes());
    }
    format!(
        "[{}]:{}",
        std::net::Ipv6Addr::from(b),
        u16::from_be(port_be)
    )
}

fn flow_row6(state: &Desired, k: &CtKey6, v: &CtValue6, now: u64, assured: bool) -> FlowRow {
    FlowRow {
        protocol: Protocol::from_number(k.proto)
            .map_or_else(|| k.proto.to_string(), |p| p.to_string()),
        client: sock6(&k.saddr_be, k.sport_be),
        frontend: sock6(&k.daddr_be, k.dport_be),
        backend: sock6(&v.daddr_be, v.dport_be),
        snat: if v.flags & CT_F_SNAT != 0 {
            sock6(&v.saddr_be, v.sport_be)
        } else {
            "-".into()
        },
        dsr: dsr_cell(v.flags, v.backend_gen, IpFamily::V6),
        service: name_of(state, v.svc_id),
        age_seconds: now.saturating_sub(v.created_ns) / 1_000_000_000,
        idle_seconds: now.saturating_sub(v.last_seen_ns) / 1_000_000_000,
        assured,
    }
}

/// Datapath counters summed over CPUs, one row per reason.
pub fn counters(pins: &Pins) -> Result<Vec<CounterRow>, DatapathError> {
    let map = pins.map(MAP_STATS)?;
    let stats: PerCpuArray<MapData, Counter> =
        PerCpuArray::try_from(map).map_err(|source| DatapathError::Map {
            name: MAP_STATS,
            source,
        })?;
    let mut rows = Vec::new();
    for i in 0..R_COUNT {
        let per_cpu = stats.get(&i, 0).map_err(|source| DatapathError::Map {
            name: MAP_STATS,
            source,
        })?;
        let (packets, bytes) = per_cpu
            .iter()
            .fold((0, 0), |(p, b), c| (p + c.packets, b + c.bytes));
        rows.push(CounterRow {
            reason: REASON_NAMES[i as usize],
            packets,
            bytes,
        });
    }
    Ok(rows)
}

/// A row `xlb list` can print as a table.
pub trait TableRow {
    const HEADERS: &'static [&'static str];
    fn cells(&self) -> Vec<String>;
}

impl TableRow for ServiceRow {
    const HEADERS: &'static [&'static str] = &[
        "SERVICE",
        "FRONTEND",
        "STATUS",
        "PACKETS",
        "BYTES",
        "SOURCE RANGES",
        "ALGORITHM",
        "BACKENDS",
    ];
    fn cells(&self) -> Vec<String> {
        let ranges = if self.source_ranges.is_empty() {
            "-".to_string()
        } else {
            self.source_ranges.join(",")
        };
        vec![
            self.service.clone(),
            self.frontend.clone(),
            self.status.clone(),
            self.packets.to_string(),
            self.bytes.to_string(),
            ranges,
            self.algorithm.clone(),
            self.backends.join(", "),
        ]
    }
}

impl TableRow for BackendRow {
    const HEADERS: &'static [&'static str] = &["ID", "BACKEND", "PACKETS", "BYTES", "SERVICES"];
    fn cells(&self) -> Vec<String> {
        vec![
            self.id.to_string(),
            self.backend.clone(),
            self.packets.to_string(),
            self.bytes.to_string(),
            self.services.join(", "),
        ]
    }
}

impl TableRow for FlowRow {
    const HEADERS: &'static [&'static str] = &[
        "PROTO", "CLIENT", "FRONTEND", "BACKEND", "SNAT", "DSR", "SERVICE", "AGE", "ASSURED",
    ];
    fn cells(&self) -> Vec<String> {
        vec![
            self.protocol.clone(),
            self.client.clone(),
            self.frontend.clone(),
            self.backend.clone(),
            self.snat.clone(),
            self.dsr.clone(),
            self.service.clone(),
            format!("{}s", self.age_seconds),
            if self.assured { "yes" } else { "no" }.to_string(),
        ]
    }
}

impl TableRow for CounterRow {
    const HEADERS: &'static [&'static str] = &["REASON", "PACKETS", "BYTES"];
    fn cells(&self) -> Vec<String> {
        vec![
            self.reason.to_string(),
            self.packets.to_string(),
            self.bytes.to_string(),
        ]
    }
}

/// Rows as an aligned text table under their headers.
pub fn render<T: TableRow>(rows: &[T]) -> String {
    let cells: Vec<Vec<String>> = rows.iter().map(TableRow::cells).collect();
    table(T::HEADERS, &cells)
}

/// Formats rows as an aligned text table.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                let _ = write!(s, "{c:<w$}  ");
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(headers.to_vec(), &mut out);
    for r in rows {
        line(r.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

/// How full one pinned map is.
#[derive(Debug, Serialize)]
pub struct MapUsage {
    pub map: &'static str,
    pub entries: u64,
    pub capacity: u32,
}

/// Entries and capacity of every hash map xlb pins, and of the slot and backend arrays
/// (their entries: the slots the service entries read, the backends the slots name; the
/// counter arrays have one slot per index, in use or not).
pub fn map_usage(pins: &Pins) -> Result<Vec<MapUsage>, DatapathError> {
    use lb_common::{MAP_BACKEND, MAP_SLOT, MAP_SVC, SvcKey, SvcValue};
    fn usage<K: aya::Pod, V: aya::Pod>(
        pins: &Pins,
        name: &'static str,
    ) -> Result<MapUsage, DatapathError> {
        let map = pins.map(name)?;
        let err = |source| DatapathError::Map { name, source };
        let capacity = match &map {
            aya::maps::Map::HashMap(d) | aya::maps::Map::LruHashMap(d) => {
                d.info().map(|i| i.max_entries()).unwrap_or(0)
            }
            _ => 0,
        };
        let m: HashMap<MapData, K, V> = HashMap::try_from(map).map_err(err)?;
        Ok(MapUsage {
            map: name,
            entries: m.keys().count() as u64,
            capacity,
        })
    }
    let maps = KernelMaps::open(pins)?;
    let state = maps.read()?;
    let backends = MapUsage {
        map: MAP_BACKEND,
        entries: state.backends.len() as u64,
        capacity: maps.limits().backends,
    };
    // Slots the entries read (a frontend's range may hold more).
    let slots = MapUsage {
        map: MAP_SLOT,
        entries: state.services.values().map(|v| u64::from(v.count)).sum(),
        capacity: maps.limits().slots,
    };
    Ok(vec![
        usage::<SvcKey, SvcValue>(pins, MAP_SVC)?,
        slots,
        backends,
        usage::<CtKey, CtValue>(pins, MAP_CT)?,
        usage::<CtKey, CtValue>(pins, MAP_CT_ASSURED)?,
        usage::<CtKey6, CtValue6>(pins, MAP_CT6)?,
        usage::<CtKey6, CtValue6>(pins, MAP_CT6_ASSURED)?,
        src_range_usage::<lb_common::SrcRangeKey>(pins, lb_common::MAP_SRC_RANGE)?,
        src_range_usage::<lb_common::SrcRangeKey6>(pins, lb_common::MAP_SRC_RANGE6)?,
    ])
}

/// Entries and capacity of a source-range trie (IPv4's or IPv6's).
fn src_range_usage<K: aya::Pod>(
    pins: &Pins,
    name: &'static str,
) -> Result<MapUsage, DatapathError> {
    let map = pins.map(name)?;
    let capacity = match &map {
        aya::maps::Map::LpmTrie(d) => d.info().map(|i| i.max_entries()).unwrap_or(0),
        _ => 0,
    };
    let trie: aya::maps::lpm_trie::LpmTrie<MapData, K, u32> =
        aya::maps::lpm_trie::LpmTrie::try_from(map)
            .map_err(|source| DatapathError::Map { name, source })?;
    Ok(MapUsage {
        map: name,
        entries: trie.keys().count() as u64,
        capacity,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        desired::{Limits, compute},
        reconcile::Ids,
        source::file,
    };

    #[test]
    fn without_a_names_file_services_are_shown_by_index_and_names_said_unavailable() {
        let pins =
            Pins::open(std::path::Path::new("/nonexistent/xlb-list-no-names")).expect("no pins");
        let why = names_unavailable(&pins).expect("no names file");
        assert!(
            why.starts_with("names unavailable") && why.contains("_nonexistent_xlb-list-no-names"),
            "{why}"
        );
        assert_eq!(name_of(&Desired::default(), 7), "#7");
    }

    /// Two Services sharing one endpoint address and port, one of them alone on another.
    const YAML: &str = "\
apiVersion: v1
kind: Service
metadata: {namespace: ns, name: a}
spec: {clusterIP: 10.96.0.1, ports: [{name: p, port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {namespace: ns, name: b}
spec: {clusterIP: 10.96.0.2, ports: [{name: p, port: 80, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {namespace: ns, name: a-1, labels: {kubernetes.io/service-name: a}}
addressType: IPv4
ports: [{name: p, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.0.0.1], conditions: {ready: true}}
- {addresses: [10.0.0.2], conditions: {ready: true}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {namespace: ns, name: b-1, labels: {kubernetes.io/service-name: b}}
addressType: IPv4
ports: [{name: p, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.0.0.1], conditions: {ready: true}}
";

    #[test]
    fn backend_rows_name_every_service_that_uses_the_backend() {
        let loaded = file::parse("t.yaml", YAML).expect("yaml");
        let (state, errors) = compute(&loaded.model, &mut Ids::default(), Limits::default());
        assert!(errors.is_empty(), "{errors:?}");
        let rows = backends_of(&state);
        let of = |addr: &str| {
            rows.iter()
                .find(|r| r.backend.starts_with(addr))
                .unwrap_or_else(|| panic!("no row for {addr}: {rows:?}"))
                .services
                .clone()
        };
        assert_eq!(of("10.0.0.1:"), ["ns/a:p", "ns/b:p"]);
        assert_eq!(of("10.0.0.2:"), ["ns/a:p"]);
        assert_eq!(rows.len(), 2);
    }

    #[test]
    fn service_rows_show_each_frontends_algorithm() {
        // `a` annotated maglev with an externalIP: the externalIP picks by its table, the
        // ClusterIP (and `b`) at random.
        let yaml = YAML.replacen(
            "metadata: {namespace: ns, name: a}\nspec: {",
            "metadata: {namespace: ns, name: a, annotations: {service.cilium.io/lb-algorithm: maglev}}\nspec: {externalIPs: [203.0.113.7], ",
            1,
        );
        let loaded = file::parse("t.yaml", &yaml).expect("yaml");
        let (state, errors) = compute(&loaded.model, &mut Ids::default(), Limits::default());
        assert!(errors.is_empty(), "{errors:?}");
        let rows = services_of(&state);
        let of = |frontend: &str| {
            rows.iter()
                .find(|r| r.frontend.starts_with(frontend))
                .unwrap_or_else(|| panic!("no row for {frontend}: {rows:?}"))
                .algorithm
                .clone()
        };
        let ext = of("203.0.113.7:80");
        let table = state.maglev.values().next().expect("one table");
        assert_eq!(ext, crate::desired::show_maglev(Some(table)));
        assert!(ext.starts_with("maglev M=16381 table="), "{ext}");
        assert_eq!(of("10.96.0.1:80"), "random");
        assert_eq!(of("10.96.0.2:80"), "random");
        assert!(rows.iter().all(|r| r.status == "programmed"), "{rows:?}");
        let text = render(&rows);
        let header: Vec<&str> = text
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        assert_eq!(
            header.join(" "),
            "SERVICE FRONTEND STATUS PACKETS BYTES SOURCE RANGES ALGORITHM BACKENDS"
        );
        assert!(
            text.lines()
                .any(|l| l.contains("203.0.113.7:80") && l.contains(&ext)),
            "{text}"
        );
    }
}
