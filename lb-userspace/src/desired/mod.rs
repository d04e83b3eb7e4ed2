//! Desired state: a pure function from the model (and the ids already handed out) to the
//! exact contents of the service, backend and name maps.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
};

use lb_common::{
    BACKEND_MAP_CAPACITY, Backend, MAP_BACKEND, MAP_SRC_RANGE, MAP_SVC, MAP_SVC_STATS,
    MAX_BACKENDS_PER_SVC, SCOPE_EXTERNAL, SCOPE_INTERNAL, SRC_RANGE_MAP_CAPACITY, SVC_F_DROP_EMPTY,
    SVC_F_SNAT_REMOTE, SVC_F_SRC_RANGES, SVC_F_TWO_SCOPES, SVC_MAP_CAPACITY, SVC_NAME_LEN,
    SVC_NAME_MAP_CAPACITY, SvcKey, SvcName, SvcValue,
};
use thiserror::Error;

mod ids;
mod incremental;
mod show;
mod values;

pub use ids::Ids;
pub use incremental::{Incremental, Touched};
pub use show::{show_backend, show_frontend};
pub use values::{
    addr_words, backend_value, frontend_key, remote_backend_value, svc_name, svc_name_str,
    words_addr,
};

use crate::model::{
    BackendAddr, Model, Protocol,
    node::{IpFamily, NodeSettings},
    select::ports_of_service,
};

/// The contents of the maps the agent owns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    /// Service entries (slot 0) and backend slots.
    pub services: BTreeMap<SvcKey, SvcValue>,
    /// Backend index → backend (with its generation).
    pub backends: BTreeMap<u32, Backend>,
    pub names: BTreeMap<u32, SvcName>,
    /// loadBalancerSourceRanges of frontends flagged `SVC_F_SRC_RANGES`.
    pub src_ranges: BTreeSet<SrcRange>,
    /// The set bits of the address filters (`XLB_ADDRFILT_V1`, numbered `word * 64 + bit`):
    /// every frontend's and every backend's address, and for a day those that went.
    pub filter: BTreeSet<u32>,
}

/// The filter bits (numbered as in [`Desired::filter`]) of the addresses `d` programs:
/// frontends in the first filter, backends in the second.
pub fn live_filter_bits(d: &Desired) -> BTreeSet<u32> {
    let backend_base = lb_common::FILTER_WORDS * 64;
    d.services
        .keys()
        .filter(|k| k.slot == 0)
        .map(|k| lb_common::filter_bit(k.addr_be[0]))
        .chain(
            d.backends
                .values()
                .map(|b| backend_base + lb_common::filter_bit(b.addr_be[0])),
        )
        .collect()
}

/// One allowed source range of a frontend (an entry of the source-range trie).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SrcRange {
    pub svc_id: u32,
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

/// A service port that could not be programmed (fully), named with the reason and the limit.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DesiredError {
    #[error("Service {object}: {what} is not supported by the datapath yet; skipped")]
    Unsupported { object: String, what: String },
    #[error("Service {object}: frontend {frontend} is already used by Service {owner}; skipped")]
    FrontendConflict {
        object: String,
        frontend: String,
        owner: String,
    },
    #[error(
        "Service {object}: map {map} is full (capacity {capacity}, {needed} more entries needed); skipped, programmed services are kept"
    )]
    MapFull {
        object: String,
        map: &'static str,
        capacity: u32,
        needed: usize,
    },
    #[error(
        "Service {object}: {count} backends exceed the limit of {limit} per service port; the first {limit} are used"
    )]
    TooManyBackends {
        object: String,
        count: usize,
        limit: u16,
    },
    #[error(
        "Service {object} has no EndpointSlice: it has no backends and new connections are refused"
    )]
    NoEndpointSlice { object: String },
}

/// Capacities the desired state must fit in.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub svc_entries: u32,
    /// The backend array's size: backend indices are `1..backends`.
    pub backends: u32,
    pub src_ranges: u32,
    /// The per-service arrays' size (names, counters): service indices are `1..services`.
    pub services: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            svc_entries: SVC_MAP_CAPACITY,
            backends: BACKEND_MAP_CAPACITY,
            src_ranges: SRC_RANGE_MAP_CAPACITY,
            services: SVC_NAME_MAP_CAPACITY,
        }
    }
}

struct Planned {
    object: String,
    entries: Vec<(SvcKey, SvcValue)>,
    backends: Vec<(u32, Backend)>,
    name: (u32, SvcName),
    src_ranges: Vec<SrcRange>,
}

/// Computes the desired maps for `model`. Frontends already programmed are placed first, so
/// a full map rejects new services rather than dropping working ones.
pub fn compute(model: &Model, ids: &mut Ids, limits: Limits) -> (Desired, Vec<DesiredError>) {
    compute_on(model, &NodeContext::default(), ids, limits)
}

/// The node the agent programs: the model's node ([`NodeSettings`], the one node type: its
/// name decides which endpoints are local (traffic policies Local), its zone which topology
/// hints apply, its local addresses (narrowed by nodePortAddresses) where NodePorts are),
/// and whether the socket hooks are on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeContext {
    pub node: NodeSettings,
    /// The socket hooks are on (`--socket-lb all|host`): NodePorts are also served on
    /// 127.0.0.1 (to the node's own sockets only), and external frontends with
    /// externalTrafficPolicy Local get a second, internal scope with every cluster endpoint
    /// for traffic from the node (as kube-proxy sends local-origin traffic to the cluster
    /// chain).
    pub socket_lb: bool,
}

impl NodeContext {
    /// The node `name`, serving NodePorts on `node_port_addresses`.
    pub fn new(name: &str, node_port_addresses: &[Ipv4Addr], socket_lb: bool) -> Self {
        let mut c = Self {
            node: NodeSettings {
                node_name: name.to_string(),
                ..NodeSettings::default()
            },
            socket_lb,
        };
        c.set_node_port_addresses(node_port_addresses);
        c
    }

    /// The IPv4 addresses NodePorts are served on, in order: the node's local addresses,
    /// narrowed by nodePortAddresses when it is set. Empty: no NodePort frontends.
    pub fn node_port_addresses(&self) -> Vec<Ipv4Addr> {
        let n = &self.node;
        n.local_addresses
            .iter()
            .filter_map(|ip| match ip {
                IpAddr::V4(v) => Some(*v),
                IpAddr::V6(_) => None,
            })
            .filter(|ip| {
                n.node_port_addresses.is_empty()
                    || n.node_port_addresses
                        .iter()
                        .any(|c| c.contains(IpAddr::V4(*ip)))
            })
            .collect()
    }

    /// Serves NodePorts on `addrs` (the node's addresses the agent found or was given).
    pub fn set_node_port_addresses(&mut self, addrs: &[Ipv4Addr]) {
        self.node.local_addresses = addrs.iter().copied().map(IpAddr::V4).collect();
        self.node.node_port_addresses.clear();
    }
}

/// A frontend to program: its key, its object name, its backends (and whether each is on
/// this node), flags, affinity and allowed source ranges.
struct Candidate {
    key: SvcKey,
    object: String,
    backends: Vec<(BackendAddr, bool)>,
    flags: u16,
    affinity_timeout_s: u32,
    src_ranges: Vec<(Ipv4Addr, u8)>,
}

/// How a frontend is reached.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// NodePort on 127.0.0.1: only the node's own sockets reach it (the socket hooks), so
    /// it always takes the cluster endpoints, as kube-proxy's local-origin traffic does.
    Loopback,
    /// ClusterIP: internalTrafficPolicy.
    Cluster,
    /// NodePort, externalIP: externalTrafficPolicy; Cluster SNATs flows to remote backends.
    External,
    /// LoadBalancer ingress IP: as External, and loadBalancerSourceRanges apply.
    LoadBalancer,
}

/// [`compute`] for a node: kube-proxy's endpoint choice for ClusterIP traffic on `node`
/// (the model's shared selection): internalTrafficPolicy Local uses only this node's
/// endpoints and drops when there are none; Cluster uses the cluster endpoints narrowed by
/// topology hints; ClientIP affinity carries its timeout.
pub fn compute_on(
    model: &Model,
    node: &NodeContext,
    ids: &mut Ids,
    limits: Limits,
) -> (Desired, Vec<DesiredError>) {
    let mut errors = Vec::new();
    let mut candidates = Vec::new();
    ids.limit(limits);
    for id in model.services.keys() {
        candidates.extend(service_candidates(model, id, node, &mut errors));
    }
    // Already-programmed frontends first, then new ones, each group in model order (IPv4,
    // then IPv6: one pass per family): a full map or a clashing frontend never takes the
    // place of something that works.
    candidates.sort_by_key(|c| placing_order(ids, c));
    let mut owners: BTreeMap<SvcKey, String> = BTreeMap::new();
    let mut desired = Desired::default();
    for c in candidates {
        if c.key.scope != SCOPE_EXTERNAL {
            // An internal scope goes with its external entry, placed before it.
            if owners.get(&external(c.key)) == Some(&c.object) {
                place(&mut desired, c, ids, limits, &mut errors);
            }
            continue;
        }
        if let Some(owner) = owners.get(&c.key) {
            errors.push(DesiredError::FrontendConflict {
                frontend: show_frontend(&c.key),
                object: c.object,
                owner: owner.clone(),
            });
            continue;
        }
        owners.insert(c.key, c.object.clone());
        place(&mut desired, c, ids, limits, &mut errors);
    }
    ids.retain(&desired);
    desired.filter = ids.filter_bits(live_filter_bits(&desired));
    (desired, errors)
}

/// The frontends service `id` of `model` asks for on `node`, in its port order (a pure
/// function of the service, its slices and the node); what cannot be programmed at all
/// (IPv6, SCTP, no slice) is reported in `errors`.
fn service_candidates(
    model: &Model,
    id: &crate::model::ServiceRef,
    node: &NodeContext,
    errors: &mut Vec<DesiredError>,
) -> Vec<Candidate> {
    let mut candidates = Vec::new();
    if !model.services.contains_key(id) {
        return candidates;
    }
    if !model.slices.contains_key(id) {
        errors.push(DesiredError::NoEndpointSlice {
            object: id.to_string(),
        });
    }
    let node_port_addresses = node.node_port_addresses();
    // One pass per family, as kube-proxy runs one proxier per family: a dual-stack Service
    // gets each family's ClusterIP with that family's endpoints.
    let views = [IpFamily::V4, IpFamily::V6].into_iter().flat_map(|family| {
        let settings = NodeSettings {
            family,
            ..node.node.clone()
        };
        ports_of_service(model, id, &settings)
    });
    for view in views {
        let family = if view.cluster_ip.is_ipv6() {
            IpFamily::V6
        } else {
            IpFamily::V4
        };
        let object = object_name(&view.service.id.to_string(), view.port);
        if view.protocol() == Protocol::Sctp {
            errors.push(DesiredError::Unsupported {
                object,
                what: "SCTP".into(),
            });
            continue;
        }
        // ClusterIP traffic follows internalTrafficPolicy; NodePort traffic (on each of this
        // node's NodePort addresses) follows externalTrafficPolicy.
        let vip = view.cluster_ip;
        let mut frontends = vec![(vip, view.port.port, Reach::Cluster, String::new())];
        // externalIPs and LoadBalancer ingress IPs (of the view's family) take the service
        // port and the external policy; LoadBalancer IPs also the loadBalancerSourceRanges.
        for ip in view
            .external_ips
            .iter()
            .copied()
            .filter(|ip| family.matches(*ip))
        {
            frontends.push((
                ip,
                view.port.port,
                Reach::External,
                format!(" (externalIP {ip})"),
            ));
        }
        for ip in view
            .load_balancer_ips
            .iter()
            .copied()
            .filter(|ip| family.matches(*ip))
        {
            frontends.push((
                ip,
                view.port.port,
                Reach::LoadBalancer,
                format!(" (LoadBalancer {ip})"),
            ));
        }
        if let Some(node_port) = view.node_port {
            if family == IpFamily::V6 {
                // tc and XDP translate IPv4 only: an IPv6 NodePort would not be served.
                errors.push(DesiredError::Unsupported {
                    object: object.clone(),
                    what: format!("IPv6 NodePort {node_port}"),
                });
            }
            for ip in node_port_addresses
                .iter()
                .filter(|_| family == IpFamily::V4)
            {
                let ip = IpAddr::V4(*ip);
                frontends.push((ip, node_port, Reach::External, format!(" (nodePort {ip})")));
            }
            if node.socket_lb && family == IpFamily::V4 {
                let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
                frontends.push((lo, node_port, Reach::Loopback, format!(" (nodePort {lo})")));
            }
        }
        let ranges = source_ranges(&view);
        for (ip, port, reach, suffix) in frontends {
            if family == IpFamily::V6
                && reach == Reach::LoadBalancer
                && !view.source_ranges.is_empty()
            {
                errors.push(DesiredError::Unsupported {
                    object: format!("{object}{suffix}"),
                    what: "IPv6 loadBalancerSourceRanges".into(),
                });
                continue;
            }
            let local = match reach {
                Reach::Cluster => view.internal_policy_local(),
                Reach::External | Reach::LoadBalancer => view.external_policy_local(),
                Reach::Loopback => false,
            };
            let object = format!("{object}{suffix}");
            let backends = backends_of(&view, local, &object, errors);
            let mut flags = 0;
            if view.drops_when_empty(local) {
                flags |= SVC_F_DROP_EMPTY;
            } else if !local && (reach == Reach::External || reach == Reach::LoadBalancer) {
                flags |= SVC_F_SNAT_REMOTE;
            }
            let key = frontend_key(ip, port, view.protocol());
            let two_scopes = local && reach != Reach::Cluster && node.socket_lb;
            if two_scopes {
                flags |= SVC_F_TWO_SCOPES;
            }
            let src_ranges = if reach == Reach::LoadBalancer && !view.source_ranges.is_empty() {
                flags |= SVC_F_SRC_RANGES;
                let mut r = ranges.clone();
                // kube-proxy: when a range holds a node IP, the LoadBalancer IPs themselves
                // are allowed as sources too (traffic the node sends to its own VIP).
                if node_port_addresses.iter().any(|n| {
                    view.source_ranges
                        .iter()
                        .any(|c| c.contains(IpAddr::V4(*n)))
                }) && let IpAddr::V4(ip) = ip
                {
                    r.push((ip, 32));
                }
                r
            } else {
                Vec::new()
            };
            let affinity_timeout_s = view.affinity_timeout().unwrap_or(0);
            candidates.push(Candidate {
                key,
                object: object.clone(),
                backends,
                flags,
                affinity_timeout_s,
                src_ranges,
            });
            if two_scopes {
                // The node's own sockets: every cluster endpoint (source ranges are checked
                // against the ranges of the external entry, which shares the id).
                candidates.push(Candidate {
                    key: SvcKey {
                        scope: SCOPE_INTERNAL,
                        ..key
                    },
                    object: object.clone(),
                    backends: backends_of(&view, false, &object, &mut Vec::new()),
                    flags: flags & SVC_F_SRC_RANGES,
                    affinity_timeout_s,
                    src_ranges: Vec::new(),
                });
            }
        }
    }

    candidates
}

/// Places one frontend: its index, its backends' indices, its slots; admitted into
/// `desired` when it fits (else the reason is in `errors`). Returns what it added.
fn place(
    desired: &mut Desired,
    c: Candidate,
    ids: &mut Ids,
    limits: Limits,
    errors: &mut Vec<DesiredError>,
) -> Option<Placed> {
    let Candidate {
        key,
        object,
        backends,
        flags,
        affinity_timeout_s,
        src_ranges,
    } = c;
    // Both scopes of a frontend are one service port: one id, one name, one counter.
    let Some(svc_id) = ids.svc_id(external(key)) else {
        errors.push(DesiredError::MapFull {
            object,
            map: MAP_SVC_STATS,
            capacity: limits.services,
            needed: 1,
        });
        return None;
    };
    let mut plan = Planned {
        object,
        entries: Vec::new(),
        backends: Vec::new(),
        name: (
            svc_id,
            SvcName {
                name: [0; SVC_NAME_LEN],
            },
        ),
        src_ranges: src_ranges
            .iter()
            .map(|&(addr, prefix)| SrcRange {
                svc_id,
                addr,
                prefix,
            })
            .collect(),
    };
    plan.name.1 = svc_name(&plan.object);
    let mut slot = 0u16;
    for (b, local) in &backends {
        let ip = b.ip;
        let be = if *local {
            backend_value(ip, b.port, b.protocol)
        } else {
            remote_backend_value(ip, b.port, b.protocol)
        };
        let Some((backend_id, generation)) = ids.backend_id(be) else {
            errors.push(DesiredError::MapFull {
                object: plan.object,
                map: MAP_BACKEND,
                capacity: limits.backends,
                needed: backends.len(),
            });
            return None;
        };
        let be = Backend { generation, ..be };
        slot += 1;
        plan.backends.push((backend_id, be));
        plan.entries.push((
            SvcKey { slot, ..key },
            SvcValue {
                backend_id,
                svc_id,
                ..SvcValue::default()
            },
        ));
    }
    plan.entries.push((
        key,
        SvcValue {
            count: slot,
            svc_id,
            flags,
            affinity_timeout_s,
            ..SvcValue::default()
        },
    ));
    admit(desired, plan, limits, errors)
}

/// What one placed frontend added to the desired state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Placed {
    /// Its service map keys (slots, then the entry).
    entries: Vec<SvcKey>,
    /// The backend index of each slot.
    backends: Vec<u32>,
    name: u32,
    src_ranges: Vec<SrcRange>,
}

/// The order candidates are placed in (stable: model order within): programmed frontends
/// first, then IPv4 before IPv6.
fn placing_order(ids: &Ids, c: &Candidate) -> (bool, bool) {
    (
        !ids.has_svc(&external(c.key)),
        c.key.family != lb_common::FAMILY_V4,
    )
}

/// The external-scope key of a frontend's entry.
fn external(key: SvcKey) -> SvcKey {
    SvcKey {
        scope: SCOPE_EXTERNAL,
        ..key
    }
}

/// The backends a frontend of `view` takes: this node's endpoints (`local`) or the cluster
/// endpoints, at most `MAX_BACKENDS_PER_SVC` (more is reported in `errors`); each with
/// whether it is on this node.
fn backends_of(
    view: &crate::model::select::PortView<'_>,
    local: bool,
    object: &str,
    errors: &mut Vec<DesiredError>,
) -> Vec<(BackendAddr, bool)> {
    let chosen = if local {
        &view.categorized.local
    } else {
        &view.categorized.cluster
    };
    let mut backends: Vec<(BackendAddr, bool)> = chosen
        .iter()
        .map(|e| {
            let addr = BackendAddr {
                ip: e.ip,
                port: e.port,
                protocol: view.protocol(),
            };
            (addr, e.local)
        })
        .collect();
    if backends.len() > MAX_BACKENDS_PER_SVC as usize {
        errors.push(DesiredError::TooManyBackends {
            object: object.to_string(),
            count: backends.len(),
            limit: MAX_BACKENDS_PER_SVC,
        });
        backends.truncate(MAX_BACKENDS_PER_SVC as usize);
    }
    backends
}

/// `namespace/name:port`, the port by name or, when it has none, by number.
fn object_name(service: &str, port: &crate::model::ServicePort) -> String {
    if port.name.is_empty() {
        format!("{service}:{}", port.port)
    } else {
        format!("{service}:{}", port.name)
    }
}

fn admit(
    desired: &mut Desired,
    plan: Planned,
    limits: Limits,
    errors: &mut Vec<DesiredError>,
) -> Option<Placed> {
    let svc_needed = plan.entries.len();
    if desired.services.len() + svc_needed > limits.svc_entries as usize {
        errors.push(DesiredError::MapFull {
            object: plan.object,
            map: MAP_SVC,
            capacity: limits.svc_entries,
            needed: svc_needed,
        });
        return None;
    }
    let new_backends = plan
        .backends
        .iter()
        .filter(|(id, _)| !desired.backends.contains_key(id))
        .count();
    if desired.backends.len() + new_backends > limits.backends as usize {
        errors.push(DesiredError::MapFull {
            object: plan.object,
            map: MAP_BACKEND,
            capacity: limits.backends,
            needed: new_backends,
        });
        return None;
    }
    if desired.src_ranges.len() + plan.src_ranges.len() > limits.src_ranges as usize {
        errors.push(DesiredError::MapFull {
            object: plan.object,
            map: MAP_SRC_RANGE,
            capacity: limits.src_ranges,
            needed: plan.src_ranges.len(),
        });
        return None;
    }
    let placed = Placed {
        entries: plan.entries.iter().map(|(k, _)| *k).collect(),
        backends: plan.backends.iter().map(|(id, _)| *id).collect(),
        name: plan.name.0,
        src_ranges: plan.src_ranges.clone(),
    };
    desired.services.extend(plan.entries);
    desired.backends.extend(plan.backends);
    desired.names.insert(plan.name.0, plan.name.1);
    desired.src_ranges.extend(plan.src_ranges);
    Some(placed)
}

/// A port's IPv4 loadBalancerSourceRanges as (network, prefix length).
fn source_ranges(view: &crate::model::select::PortView<'_>) -> Vec<(Ipv4Addr, u8)> {
    view.source_ranges
        .iter()
        .filter_map(|c| match c.addr() {
            IpAddr::V4(a) => Some((a, c.prefix())),
            IpAddr::V6(_) => None,
        })
        .collect()
}
