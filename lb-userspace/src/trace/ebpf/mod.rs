//! A packet through the loaded programs: a test run of tc ingress on a scratch instance
//! ([`crate::datapath::scratch`]), or for the node's own sockets the connect4/connect6
//! decision computed from the same maps, explained in Kubernetes terms. IPv4 and IPv6 alike:
//! the service, backend and affinity maps are shared by both families; conntrack has a
//! table per family (`flows` shows either).

use lb_common::user::{frontend_key, show_backend, words_addr};
use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
};

use lb_common::{
    AffinityKey, AffinityValue, BE_F_REMOTE, BE_F_TERMINATING, Backend, NodeConfig, REASON_NAMES,
    SCOPE_EXTERNAL, SVC_F_DROP_EMPTY, SVC_F_SNAT_REMOTE, SVC_F_SRC_RANGES, SVC_F_TWO_SCOPES,
    SvcKey, SvcValue,
};

mod algorithm;
mod connect;
mod flows;
mod tc;

use super::{
    Report,
    request::{Resolved, Source, frontend_kind, policy_words},
};
use crate::{
    datapath::{
        DatapathError, clock::monotonic_coarse_ns, kernel::KernelMaps, pins::Pins,
        writer::MapWriter,
    },
    desired::Desired,
    model::{IpFamily, NodeSettings, Protocol, select::service_ports},
};

const TC_ACT_OK: i32 = 0;
const TC_ACT_SHOT: i32 = 2;
const TC_ACT_REDIRECT: i32 = 7;

/// What the trace knows besides the maps.
pub struct Context<'a> {
    pub pins: &'a Pins,
    pub source: &'a Source,
    /// This node's name (which endpoints are local).
    pub node_name: &'a str,
}

/// The address and port of map words of `family` (network order).
fn sock(addr_be: [u32; 4], family: u8, port_be: u16) -> SocketAddr {
    SocketAddr::new(words_addr(addr_be, family), u16::from_be(port_be))
}

fn backend_addr(b: &Backend) -> SocketAddr {
    sock(b.addr_be, b.family, b.port_be)
}

/// The service-map key of frontend `dst` (either family) in `scope`.
fn svc_key(dst: SocketAddr, proto: Protocol, scope: u8) -> SvcKey {
    SvcKey {
        scope,
        ..frontend_key(dst.ip(), dst.port(), proto)
    }
}

/// The frontend's service entry and its backends, slot by slot.
struct Frontend {
    key: SvcKey,
    svc: SvcValue,
    slots: Vec<(u16, u32, Option<Backend>)>,
}

fn frontend(state: &Desired, key: SvcKey) -> Option<Frontend> {
    let entry = state.services.get(&key)?;
    let slots = (1..=entry.count)
        .map(|slot| {
            let id = entry.slot(slot).unwrap_or(0);
            (slot, id, state.backends.get(&id).copied())
        })
        .collect();
    Some(Frontend {
        key,
        svc: entry.value,
        slots,
    })
}

fn flag_words(flags: u16) -> Vec<&'static str> {
    [
        (SVC_F_DROP_EMPTY, "drops when empty (a Local policy)"),
        (SVC_F_SNAT_REMOTE, "SNATs flows to remote backends"),
        (SVC_F_SRC_RANGES, "loadBalancerSourceRanges"),
        (
            SVC_F_TWO_SCOPES,
            "cluster-wide entries for the node's own traffic",
        ),
    ]
    .iter()
    .filter(|(f, _)| flags & f != 0)
    .map(|(_, w)| *w)
    .collect()
}

fn backend_words(b: &Backend) -> String {
    let mut w = vec![if b.flags & BE_F_REMOTE != 0 {
        "not on this node by nodeName"
    } else {
        "on this node"
    }];
    if b.flags & BE_F_TERMINATING != 0 {
        w.push("terminating");
    }
    format!("{} ({})", show_backend(b), w.join(", "))
}

/// The frontend step: which Kubernetes frontend the destination is.
fn frontend_step(r: &mut Report, ctx: &Context, state: &Desired, f: &Frontend, dst: SocketAddr) {
    let name = state
        .names
        .get(&f.svc.svc_id)
        .map(|n| n.to_string())
        .unwrap_or_else(|| {
            format!(
                "service index {} (its name is unavailable: not in the agent's names file)",
                f.svc.svc_id
            )
        });
    let proto = Protocol::from_number(f.key.proto).unwrap_or_default();
    let mut line = match ctx
        .source
        .model
        .as_ref()
        .and_then(|m| frontend_kind(m, dst, proto).map(|k| (m, k)))
    {
        Some((m, (kind, svc, port))) => format!(
            "{dst}/{proto} is the {kind} of service {svc} port {port} ({}; map name {name})",
            policy_words(m, &svc, kind)
        ),
        None => format!("{dst}/{proto} is a frontend of {name}"),
    };
    let flags = flag_words(f.svc.flags);
    if !flags.is_empty() {
        line.push_str(&format!("; {}", flags.join(", ")));
    }
    r.line("frontend", line);
}

/// The endpoints step: the backends in the frontend's slots, and (with a source) the
/// service's other endpoints and why the policies left them out.
fn endpoints_step(r: &mut Report, ctx: &Context, f: &Frontend, dst: SocketAddr) {
    let mut lines: Vec<String> = Vec::new();
    if f.slots.is_empty() {
        lines.push("none left: the frontend has no backends".into());
    } else {
        let (base, n) = (f.svc.slot_base, f.slots.len() as u32);
        lines.push(format!(
            "{n} slots: {}[{base}..{}]",
            lb_common::MAP_SLOT,
            base + n
        ));
    }
    let mut kept = BTreeSet::new();
    for (slot, id, be) in &f.slots {
        match be {
            Some(b) => {
                kept.insert(backend_addr(b));
                lines.push(format!("slot {slot}: {}", backend_words(b)));
            }
            None => lines.push(format!("slot {slot}: backend index {id} is missing")),
        }
    }
    let proto = Protocol::from_number(f.key.proto).unwrap_or_default();
    if let Some(model) = ctx.source.model.as_ref()
        && let Some((kind, svc, _)) = frontend_kind(model, dst, proto)
    {
        // The proxier of the frontend's family: its endpoints are of that family only.
        let settings = NodeSettings {
            node_name: ctx.node_name.to_string(),
            family: IpFamily::of(dst.ip()),
            ..NodeSettings::default()
        };
        let view = service_ports(model, &settings).into_iter().find(|v| {
            v.service.id == svc
                && v.port.protocol == proto
                && (v.port.port == dst.port() || v.node_port == Some(dst.port()))
        });
        let local_policy = kind != "ClusterIP" && f.key.scope == SCOPE_EXTERNAL;
        for ep in view.iter().flat_map(|v| v.endpoints.iter()) {
            let ip = ep.ip;
            let target_port = f
                .slots
                .iter()
                .find_map(|(_, _, b)| b.map(|b| u16::from_be(b.port_be)))
                .unwrap_or(ep.port);
            if kept.contains(&SocketAddr::new(ip, target_port))
                || kept.contains(&SocketAddr::new(ip, ep.port))
            {
                continue;
            }
            let why = if !ep.ready && !ep.serving {
                "not ready"
            } else if ep.serving_terminating() {
                "terminating (a fallback only when no endpoint is ready)"
            } else if !ep.local
                && view.as_ref().is_some_and(|v| {
                    (local_policy && v.external_policy_local())
                        || (kind == "ClusterIP" && v.internal_policy_local())
                })
            {
                "on another node (traffic policy Local)"
            } else {
                "left out by topology hints for another zone or node"
            };
            lines.push(format!("left out: {ep} {why}"));
        }
    }
    r.step("endpoints", lines);
}

/// The affinity key of a packet's source, as the datapath folds it.
fn client_key(svc_id: u32, client: IpAddr) -> AffinityKey {
    lb_common::user::affinity_key(svc_id, client)
}

fn affinity_key(svc_id: u32, words: [u32; 2], family: u8) -> AffinityKey {
    AffinityKey {
        svc_id,
        client_be: [words[0], words[1], 0, 0],
        family,
        _pad0: 0,
        _pad1: 0,
    }
}

/// The affinity step as the live map has it (before the run).
fn affinity_before(
    svc: &SvcValue,
    key: &AffinityKey,
    live: Option<&AffinityValue>,
    state: &Desired,
) -> String {
    if svc.affinity_timeout_s == 0 {
        return "sessionAffinity None: every new flow picks a backend".into();
    }
    let timeout = svc.affinity_timeout_s;
    let Some(a) = live else {
        return format!(
            "sessionAffinity ClientIP ({timeout} s): miss, no entry for this client (key svc {} family {})",
            key.svc_id, key.family
        );
    };
    let idle = monotonic_coarse_ns().saturating_sub(a.last_seen_ns) / 1_000_000_000;
    let be = state
        .backends
        .get(&a.backend_id)
        .filter(|b| b.generation == a.backend_gen);
    match be {
        Some(b) if idle <= timeout as u64 => format!(
            "sessionAffinity ClientIP ({timeout} s): hit, this client went to {} {idle} s ago",
            show_backend(b)
        ),
        Some(b) => format!(
            "sessionAffinity ClientIP ({timeout} s): expired, {} was {idle} s ago",
            show_backend(b)
        ),
        None => format!(
            "sessionAffinity ClientIP ({timeout} s): stale, its backend index {} is gone",
            a.backend_id
        ),
    }
}

fn open_state(pins: &Pins) -> Result<(Desired, NodeConfig), DatapathError> {
    let state = KernelMaps::open(pins)?.read()?;
    let cfg: aya::maps::Array<aya::maps::MapData, NodeConfig> =
        aya::maps::Array::try_from(pins.map(lb_common::MAP_CONFIG)?).map_err(|source| {
            DatapathError::Map {
                name: lb_common::MAP_CONFIG,
                source,
            }
        })?;
    let cfg = cfg.get(&0, 0).map_err(|source| DatapathError::Map {
        name: lb_common::MAP_CONFIG,
        source,
    })?;
    Ok((state, cfg))
}

/// Traces `req` through the datapath pinned at `ctx.pins` (see the module docs). Nothing
/// live is written.
pub fn trace(object: &[u8], ctx: &Context, req: &Resolved) -> Result<Report, DatapathError> {
    let (state, cfg) = open_state(ctx.pins)?;
    match req.src {
        Some(src) => tc::trace_tc(object, ctx, req, src, &state),
        None => Ok(connect::trace_connect(ctx, req, &state, &cfg)),
    }
}

fn reason_name(r: u32) -> &'static str {
    REASON_NAMES.get(r as usize).copied().unwrap_or("unknown")
}

fn affinity_entry(pins: &Pins, key: &AffinityKey) -> Option<AffinityValue> {
    let map = pins.map(lb_common::MAP_AFFINITY).ok()?;
    let aff: aya::maps::HashMap<aya::maps::MapData, AffinityKey, AffinityValue> =
        aya::maps::HashMap::try_from(map).ok()?;
    aff.get(key, 0).ok()
}
