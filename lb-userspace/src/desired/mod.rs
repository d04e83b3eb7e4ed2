//! Desired state: a pure function from the model to the exact contents of the service,
//! slot, backend, name and source-range maps and the address filters. The dense indices the
//! contents name come from an [`Indices`] allocator it is handed ([`crate::reconcile`]
//! keeps them stable across computations, with their quarantine); keeping books of what is
//! programmed, what went and what failed is the reconciler's, not this module's.
//!
//! | file | what it holds |
//! |---|---|
//! | `mod.rs` | [`Desired`], [`compute_on`], the node it is computed for, the errors, the limits |
//! | `candidates.rs` | a service's frontends on this node, each with its endpoints |
//! | `place.rs` | one frontend planned (indices, slots) and checked against the limits |
//! | `dense.rs` | [`Dense`]: index → value as an array (backends, names) |
//! | `touched.rs` | [`Touched`]: the keys of a desired state one change names |
//! | `maglev.rs` | Maglev's lookup table of a frontend's backends (consistent hashing) |
//! | `show.rs` | the text dump of a desired state (golden tests) |

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
};

use lb_common::{
    BACKEND_MAP_CAPACITY, Backend, FilterSize, MAGLEV_MAP_CAPACITY, SCOPE_EXTERNAL,
    SLOT_MAP_CAPACITY, SRC_RANGE_MAP_CAPACITY, SRC_RANGE6_MAP_CAPACITY, SVC_MAP_CAPACITY,
    SVC_NAME_LEN, SVC_NAME_MAP_CAPACITY, SvcKey, SvcValue, user::show_frontend,
};
use thiserror::Error;

mod candidates;
mod dense;
pub mod maglev;
mod place;
mod show;
mod touched;

pub use candidates::{Candidate, candidates_of, service_candidates};
pub use dense::Dense;
pub use place::{Placed, Plan, external, placing_order, plan};
pub use show::show_maglev;
pub use touched::Touched;

use crate::model::{LbAlgorithm, Model, node::NodeSettings};

/// The contents of the maps the agent owns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    /// Frontends: each one's service entry and the backend index of each of its slots.
    pub services: BTreeMap<SvcKey, SvcEntry>,
    /// Backend index → backend (with its generation).
    pub backends: Dense<Backend>,
    /// Service index → its object name, as the names file holds it ([`object_name`]).
    pub names: Dense<ObjectName>,
    /// loadBalancerSourceRanges of frontends flagged `SVC_F_SRC_RANGES`.
    pub src_ranges: BTreeSet<SrcRange>,
    /// The set bits of the address filters (`XLB_ADDRFILT_V2`, numbered `word * 64 + bit`):
    /// every frontend's and every backend's address, and for a day those that went.
    pub filter: BTreeSet<u32>,
    /// Service index → the Maglev table of a frontend flagged `SVC_F_MAGLEV`.
    pub maglev: BTreeMap<u32, MaglevTable>,
}

impl Desired {
    /// Nothing in any map.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
            && self.backends.is_empty()
            && self.names.is_empty()
            && self.src_ranges.is_empty()
            && self.filter.is_empty()
            && self.maglev.is_empty()
    }
}

/// What a desired state takes of the maps beyond what their lengths say: the slots its
/// frontends' ranges take (a power of two each, as the slot allocator hands them out) and
/// its IPv6 source ranges (the IPv4 ones are the rest of [`Desired::src_ranges`]). Kept as
/// running totals where the state changes ([`Plan::apply`] adds, the reconciler's removal
/// takes away), so the fill metrics of a sync cost nothing per frontend;
/// [`Tally::recount`] is the from-scratch count they must equal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Slots the frontends' ranges take.
    pub slots: u64,
    /// Entries of the IPv6 source-range trie.
    pub src_ranges6: u64,
}

impl Tally {
    /// `d` counted from scratch (walks every frontend and range: for tests and debug
    /// assertions, or once for a state the totals were not kept for).
    pub fn recount(d: &Desired) -> Self {
        let mut t = Tally::default();
        for e in d.services.values() {
            t.service(e, true);
        }
        for r in &d.src_ranges {
            t.src_range(r, true);
        }
        t
    }

    /// The slots a frontend of `count` slots takes: its range, a power of two (none when
    /// it has no slot).
    pub fn slots_of(count: u16) -> u64 {
        match count {
            0 => 0,
            n => u64::from(n.next_power_of_two()),
        }
    }

    /// Frontend entry `e` was added (`true`) to the state or taken out of it.
    pub fn service(&mut self, e: &SvcEntry, added: bool) {
        let n = Self::slots_of(e.count);
        match added {
            true => self.slots += n,
            false => self.slots -= n,
        }
    }

    /// Source range `r` was added (`true`) to the state's set or taken out of it (only
    /// when the set changed: a range already there adds nothing).
    pub fn src_range(&mut self, r: &SrcRange, added: bool) {
        if r.map() != lb_common::MAP_SRC_RANGE6 {
            return;
        }
        match added {
            true => self.src_ranges6 += 1,
            false => self.src_ranges6 -= 1,
        }
    }
}

/// A frontend's object name (`namespace/name:port`, with the frontend when it is one) as
/// the names file holds it: one shared copy, cut to at most [`SVC_NAME_LEN`] bytes (a
/// character boundary) as the kernel's name map cut it. The bookkeeping's owner of the
/// frontend shares it.
pub type ObjectName = Arc<str>;

/// The [`ObjectName`] of `object`.
pub fn object_name(object: &str) -> ObjectName {
    let mut len = object.len().min(SVC_NAME_LEN);
    while !object.is_char_boundary(len) {
        len -= 1;
    }
    Arc::from(&object[..len])
}

/// [`object_name`] of a candidate's whole name: that one shared when it fits.
pub fn shared_object_name(object: &Arc<str>) -> ObjectName {
    match object.len() <= SVC_NAME_LEN {
        true => object.clone(),
        false => object_name(object),
    }
}

/// The service port's name in a frontend's object name: `namespace/name:port`, without the
/// frontend's suffix (` (nodePort …)`, ` (externalIP …)`, ` (LoadBalancer …)`), whose
/// address may hold colons (IPv6).
pub fn service_port_name(object: &str) -> &str {
    object.split_once(" (").map_or(object, |(base, _)| base)
}

/// A frontend's object name as (`namespace/name`, port name or number): its
/// [`service_port_name`] split at the last colon (names and namespaces hold none).
pub fn service_port_of(object: &str) -> (&str, &str) {
    let base = service_port_name(object);
    base.rsplit_once(':').unwrap_or((base, ""))
}

/// A frontend as the maps hold it: its service entry (`XLB_SVC_V3`) and its slots, the
/// elements `value.slot_base..` of the slot array (`XLB_SLOT_V1`), a backend index each
/// (4 B a slot; `slots.len()` is the entry's count). It reads as its entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SvcEntry {
    pub value: SvcValue,
    pub slots: Box<[u32]>,
}

impl SvcEntry {
    /// An entry `value` whose slots hold `slots`.
    pub fn new(value: SvcValue, slots: impl Into<Box<[u32]>>) -> Self {
        Self {
            value,
            slots: slots.into(),
        }
    }

    /// The backend index of slot `n` (`1..=count`).
    pub fn slot(&self, n: u16) -> Option<u32> {
        self.slots.get(usize::from(n).checked_sub(1)?).copied()
    }
}

impl std::ops::Deref for SvcEntry {
    type Target = SvcValue;
    fn deref(&self) -> &SvcValue {
        &self.value
    }
}

/// A frontend's Maglev table in slot terms (`XLB_MAGLEV_V2`): entry `flow_hash % size`
/// names the slot a new flow goes to. Shared between frontends with the same backends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MaglevTable {
    pub slots: Arc<[u16]>,
}

impl MaglevTable {
    /// Its size `M`.
    pub fn size(&self) -> u32 {
        self.slots.len() as u32
    }
}

/// How frontends reached from outside the cluster pick the backend of a new flow
/// (`--lb-algorithm`, `--maglev-table-size`, `--maglev-hash-seed`). ClusterIP traffic
/// always picks at random: it starts on the node its client is on, so every node agreeing
/// buys it nothing, and the socket hooks, which serve most of it, choose before the flow
/// has a source port to hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LbSettings {
    /// The node's algorithm; a Service's annotation `service.cilium.io/lb-algorithm`
    /// overrides it.
    pub algorithm: LbAlgorithm,
    /// Maglev's table size `M` (one of `maglev::TABLE_SIZES`).
    pub maglev_size: u32,
    /// The seed of every backend's permutation: the same on every node, or the nodes
    /// disagree.
    pub maglev_seed: Arc<str>,
}

/// Cilium's default `maglev.hashSeed` is a random string set at install; xlb's default is
/// this fixed one, so nodes agree without configuration.
pub const DEFAULT_MAGLEV_SEED: &str = "xlb-maglev-v1";

impl Default for LbSettings {
    fn default() -> Self {
        Self {
            algorithm: LbAlgorithm::Random,
            maglev_size: maglev::DEFAULT_TABLE_SIZE,
            maglev_seed: DEFAULT_MAGLEV_SEED.into(),
        }
    }
}

/// The filter bits (numbered as in [`Desired::filter`]) of the addresses `d` programs, in
/// filters of `size`: frontends in the first filter, backends in the second.
pub fn live_filter_bits(d: &Desired, size: FilterSize) -> BTreeSet<u32> {
    d.services
        .keys()
        .map(|k| size.bit_of(&k.addr_be))
        .chain(d.backends.values().map(|b| backend_filter_bit(size, b)))
        .collect()
}

/// A backend's bit (numbered as in [`Desired::filter`]) in the second filter of `size`.
pub fn backend_filter_bit(size: FilterSize, be: &Backend) -> u32 {
    size.backend_bit_of(&be.addr_be)
}

/// One allowed source range of a frontend: an entry of the IPv4 source-range trie
/// (`XLB_SRCRNG_V2`) or, for an IPv6 network, of the IPv6 one (`XLB_SRCRNG6_V1`). `addr` is
/// the network (host bits clear), `prefix` at most 32 or 128.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SrcRange {
    pub svc_id: u32,
    pub addr: IpAddr,
    pub prefix: u8,
}

impl SrcRange {
    /// The trie it goes into.
    pub fn map(&self) -> &'static str {
        if self.addr.is_ipv4() {
            lb_common::MAP_SRC_RANGE
        } else {
            lb_common::MAP_SRC_RANGE6
        }
    }
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
        "Service {object}: map {map} is full (capacity {capacity}, {needed} more entries needed for all {count} backends); programmed with the first {kept}"
    )]
    MapFullPartly {
        object: String,
        map: &'static str,
        capacity: u32,
        needed: usize,
        count: usize,
        kept: u16,
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
    #[error(
        "Service {object}: map {map} is full (capacity {capacity} Maglev tables); its new flows pick a backend at random"
    )]
    MaglevFull {
        object: String,
        map: &'static str,
        capacity: u32,
    },
    #[error(
        "Service {object}: the node has IPv6 turned off ({why}); its IPv6 frontends are skipped"
    )]
    NoIpv6 { object: String, why: &'static str },
}

impl DesiredError {
    /// The object it names (`namespace/name:port`, with the frontend when it is one).
    pub fn object(&self) -> &str {
        match self {
            DesiredError::Unsupported { object, .. }
            | DesiredError::FrontendConflict { object, .. }
            | DesiredError::MapFull { object, .. }
            | DesiredError::MapFullPartly { object, .. }
            | DesiredError::MaglevFull { object, .. }
            | DesiredError::TooManyBackends { object, .. }
            | DesiredError::NoIpv6 { object, .. }
            | DesiredError::NoEndpointSlice { object } => object,
        }
    }
}

/// Where a computation gets its dense indices (see [`crate::reconcile::Ids`], which keeps
/// them stable across computations and agent restarts). An index is below the capacity
/// given; `None` when none is free.
pub trait Indices {
    /// The index of a frontend (both scopes share it, so `key` is its external scope).
    fn svc_id(&mut self, key: SvcKey, capacity: u32) -> Option<u32>;
    /// The index and generation of a backend (`be`'s own generation is ignored), with
    /// `desired` the backends of the state being computed (an allocator may find those
    /// it handed out there rather than keep a copy).
    fn backend_id(
        &mut self,
        be: Backend,
        capacity: u32,
        desired: &Dense<Backend>,
    ) -> Option<(u32, u32)>;
    /// The frontend holds an index already (it is programmed: it is placed first).
    fn has_svc(&self, key: &SvcKey) -> bool;
    /// Where the `count` slots of frontend `key` (either scope) go in a slot array of
    /// `capacity`: the base of its range and how many slots the range has (fewer than
    /// `count` when the array has no larger range free); `(0, 0)` for none; `None` when the
    /// array has not one slot free.
    fn slot_range(&mut self, key: SvcKey, count: u16, capacity: u32) -> Option<(u32, u16)>;
    /// The Maglev table (slot terms) of `backends` (in slot order) of size `m`: computed
    /// here; an allocator that lives across computations caches them.
    fn maglev_table(&mut self, backends: &[String], m: u32, seed: &[u8]) -> Arc<[u16]> {
        maglev::slot_table(backends, m, seed).into()
    }
}

/// Capacities the desired state must fit in.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The service map's size: frontend entries.
    pub svc_entries: u32,
    /// The slot array's size: backend slots of all frontends.
    pub slots: u32,
    /// The backend array's size: backend indices are `1..backends`.
    pub backends: u32,
    /// The IPv4 source-range trie's size.
    pub src_ranges: u32,
    /// The IPv6 source-range trie's size.
    pub src_ranges6: u32,
    /// The per-service arrays' size (names, counters): service indices are `1..services`.
    pub services: u32,
    /// The Maglev map's size (tables).
    pub maglev: u32,
    /// The address filters' size (how [`Desired::filter`]'s bits are numbered).
    pub filter: FilterSize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            svc_entries: SVC_MAP_CAPACITY,
            slots: SLOT_MAP_CAPACITY,
            backends: BACKEND_MAP_CAPACITY,
            src_ranges: SRC_RANGE_MAP_CAPACITY,
            src_ranges6: SRC_RANGE6_MAP_CAPACITY,
            services: SVC_NAME_MAP_CAPACITY,
            maglev: MAGLEV_MAP_CAPACITY,
            filter: FilterSize::DEFAULT,
        }
    }
}

/// Computes the desired maps for `model`. Frontends already programmed are placed first, so
/// a full map rejects new services rather than dropping working ones.
pub fn compute(
    model: &Model,
    ids: &mut impl Indices,
    limits: Limits,
) -> (Desired, Vec<DesiredError>) {
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
    /// How external frontends pick backends.
    pub lb: LbSettings,
    /// The node has IPv6 turned off, and why (`disable_ipv6`, or no IPv6 in the kernel):
    /// IPv6 frontends are not programmed, and say so ([`DesiredError::NoIpv6`]).
    pub ipv6_off: Option<&'static str>,
}

impl NodeContext {
    /// The node `name`, serving NodePorts on `node_port_addresses` (either family).
    pub fn new(name: &str, node_port_addresses: &[IpAddr], socket_lb: bool) -> Self {
        let mut c = Self {
            node: NodeSettings {
                node_name: name.to_string(),
                ..NodeSettings::default()
            },
            socket_lb,
            lb: LbSettings::default(),
            ipv6_off: None,
        };
        c.set_node_port_addresses(node_port_addresses);
        c
    }

    /// The addresses NodePorts are served on, both families, in order: the node's local
    /// addresses, narrowed by nodePortAddresses when it is set. Empty: no NodePort frontends.
    pub fn node_port_addresses(&self) -> Vec<IpAddr> {
        let n = &self.node;
        n.local_addresses
            .iter()
            .copied()
            .filter(|ip| {
                n.node_port_addresses.is_empty()
                    || n.node_port_addresses.iter().any(|c| c.contains(*ip))
            })
            .collect()
    }

    /// Serves NodePorts on `addrs` (the node's addresses the agent found or was given).
    pub fn set_node_port_addresses(&mut self, addrs: &[IpAddr]) {
        self.node.local_addresses = addrs.to_vec();
        self.node.node_port_addresses.clear();
    }
}

/// [`compute`] for a node: kube-proxy's endpoint choice for ClusterIP traffic on `node`
/// (the model's shared selection): internalTrafficPolicy Local uses only this node's
/// endpoints and drops when there are none; Cluster uses the cluster endpoints narrowed by
/// topology hints; ClientIP affinity carries its timeout. The address filters hold the
/// addresses of this state ([`live_filter_bits`]).
pub fn compute_on(
    model: &Model,
    node: &NodeContext,
    ids: &mut impl Indices,
    limits: Limits,
) -> (Desired, Vec<DesiredError>) {
    let mut errors = Vec::new();
    let mut candidates = Vec::new();
    for id in model.services.keys() {
        candidates.extend(service_candidates(model, id, node, &mut errors));
    }
    // Already-programmed frontends first, then new ones, each group in model order (IPv4,
    // then IPv6: one pass per family): a full map or a clashing frontend never takes the
    // place of something that works.
    candidates.sort_by_cached_key(|c| placing_order(ids, c));
    let mut owners: BTreeMap<SvcKey, Arc<str>> = BTreeMap::new();
    let mut desired = Desired::default();
    for c in candidates {
        if c.key.scope != SCOPE_EXTERNAL {
            // An internal scope goes with its external entry, placed before it.
            if owners.get(&external(c.key)) == Some(&c.object)
                && let Some(p) = plan(&desired, c, ids, limits, &mut errors)
            {
                p.apply(&mut desired);
            }
            continue;
        }
        if let Some(owner) = owners.get(&c.key) {
            errors.push(DesiredError::FrontendConflict {
                frontend: show_frontend(&c.key),
                object: c.object.to_string(),
                owner: owner.to_string(),
            });
            continue;
        }
        owners.insert(c.key, c.object.clone());
        if let Some(p) = plan(&desired, c, ids, limits, &mut errors) {
            p.apply(&mut desired);
        }
    }
    desired.filter = live_filter_bits(&desired, limits.filter);
    (desired, errors)
}

#[cfg(test)]
mod tests;
