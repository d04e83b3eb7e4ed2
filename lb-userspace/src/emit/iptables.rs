//! kube-proxy's iptables mode: the `iptables-restore` input for the `filter` and `nat`
//! tables, from the model and the node's settings (kube-proxy's `pkg/proxy/iptables`).
//!
//! [`emit`] is the pure one-shot form (a full sync on a node with no kube-proxy chains yet).
//! [`IptablesProxier`] keeps what kube-proxy keeps between syncs, for partial syncs: which
//! services changed since the last sync, whether a full sync is due (first sync, after a
//! failed restore), and the large-cluster cleanup clock. The caller passes the chains that
//! currently exist in the nat table (kube-proxy reads them with `iptables-save`), so stale
//! chains are flushed and deleted (`:NAME` + `-X NAME`).
//!
//! Services are written in model order (namespace/name, then port order); kube-proxy's own
//! order is Go map order, which its tests canonicalise away.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

pub use super::rules::{KUBE_FORWARD, KUBE_MARK_MASQ, KUBE_POSTROUTING};
use super::{
    WriterOptions,
    names::{endpoint_chain, probability, service_port_hash},
    plan::Decisions,
    rules::{self, Jump, Payload, Table, comment, commented, dest_match, with_target},
};
use crate::model::{
    IpFamily, Model, NodeSettings, Service, ServiceRef, Slices,
    select::{self, EndpointView, PortView},
};

/// nat and filter chains kube-proxy always declares.
pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
pub const KUBE_EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
pub const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
pub const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
pub const KUBE_FIREWALL: &str = "KUBE-FIREWALL";

/// The jumps kube-proxy prepends to the built-in chains, in its order
/// (`iptablesJumpChains`: extra arguments, then the comment).
pub const JUMPS: [Jump; 12] = [
    Jump::prepend(
        "filter",
        "INPUT",
        &[
            "-m",
            "conntrack",
            "--ctstate",
            "NEW",
            "-m",
            "comment",
            "--comment",
            "kubernetes externally-visible service portals",
        ],
        KUBE_EXTERNAL_SERVICES,
    ),
    Jump::prepend(
        "filter",
        "FORWARD",
        &[
            "-m",
            "conntrack",
            "--ctstate",
            "NEW",
            "-m",
            "comment",
            "--comment",
            "kubernetes externally-visible service portals",
        ],
        KUBE_EXTERNAL_SERVICES,
    ),
    Jump::prepend(
        "filter",
        "INPUT",
        &[
            "-m",
            "comment",
            "--comment",
            "kubernetes health check service ports",
        ],
        KUBE_NODEPORTS,
    ),
    Jump::prepend(
        "filter",
        "FORWARD",
        &[
            "-m",
            "conntrack",
            "--ctstate",
            "NEW",
            "-m",
            "comment",
            "--comment",
            "kubernetes service portals",
        ],
        KUBE_SERVICES,
    ),
    Jump::prepend(
        "filter",
        "OUTPUT",
        &[
            "-m",
            "conntrack",
            "--ctstate",
            "NEW",
            "-m",
            "comment",
            "--comment",
            "kubernetes service portals",
        ],
        KUBE_SERVICES,
    ),
    Jump::prepend(
        "filter",
        "FORWARD",
        &["-m", "comment", "--comment", "kubernetes forwarding rules"],
        KUBE_FORWARD,
    ),
    Jump::prepend(
        "filter",
        "INPUT",
        &[
            "-m",
            "conntrack",
            "--ctstate",
            "NEW",
            "-m",
            "comment",
            "--comment",
            "kubernetes load balancer firewall",
        ],
        KUBE_PROXY_FIREWALL,
    ),
    Jump::prepend(
        "filter",
        "OUTPUT",
        &[
            "-m",
            "conntrack",
            "--ctstate",
            "NEW",
            "-m",
            "comment",
            "--comment",
            "kubernetes load balancer firewall",
        ],
        KUBE_PROXY_FIREWALL,
    ),
    Jump::prepend(
        "filter",
        "FORWARD",
        &[
            "-m",
            "conntrack",
            "--ctstate",
            "NEW",
            "-m",
            "comment",
            "--comment",
            "kubernetes load balancer firewall",
        ],
        KUBE_PROXY_FIREWALL,
    ),
    Jump::prepend(
        "nat",
        "OUTPUT",
        &["-m", "comment", "--comment", "kubernetes service portals"],
        KUBE_SERVICES,
    ),
    Jump::prepend(
        "nat",
        "PREROUTING",
        &["-m", "comment", "--comment", "kubernetes service portals"],
        KUBE_SERVICES,
    ),
    Jump::prepend(
        "nat",
        "POSTROUTING",
        &["-m", "comment", "--comment", "kubernetes postrouting rules"],
        KUBE_POSTROUTING,
    ),
];

/// The kubelet's jumps into KUBE-FIREWALL, which kube-proxy ensures too (only where the
/// payload declares that chain: with localhost NodePorts on IPv4).
pub const FIREWALL_JUMPS: [Jump; 2] = [
    Jump::prepend("filter", "INPUT", &[], KUBE_FIREWALL),
    Jump::prepend("filter", "OUTPUT", &[], KUBE_FIREWALL),
];

/// The jumps kube-proxy ensures for `payload`: [`JUMPS`], and [`FIREWALL_JUMPS`] where the
/// payload declares KUBE-FIREWALL.
pub fn jumps(payload: &Payload) -> Vec<Jump> {
    let firewall = payload.filter.chains.iter().any(|c| c == KUBE_FIREWALL);
    JUMPS
        .iter()
        .chain(FIREWALL_JUMPS.iter().filter(|_| firewall))
        .copied()
        .collect()
}

/// Prefixes of the per-service chains kube-proxy owns (and deletes when stale).
pub const SERVICE_CHAIN_PREFIXES: [&str; 5] = [
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-EXT-",
    "KUBE-FW-",
    "KUBE-SEP-",
];

/// Whether `chain` is a per-service chain kube-proxy would garbage-collect.
pub fn is_service_chain(chain: &str) -> bool {
    SERVICE_CHAIN_PREFIXES.iter().any(|p| chain.starts_with(p))
}

/// Which per-service chains to write this sync.
enum Scope<'a> {
    Full,
    Changed(&'a BTreeSet<ServiceRef>),
}

impl Scope<'_> {
    fn writes(&self, svc: &ServiceRef) -> bool {
        match self {
            Scope::Full => true,
            Scope::Changed(set) => set.contains(svc),
        }
    }
}

struct Generated {
    payload: Payload,
    /// Every nat per-service chain that should exist after this sync.
    active: BTreeSet<String>,
}

/// Whether the model is over the large-cluster threshold (no per-endpoint comments, stale
/// chains cleaned up once per sync period).
fn is_large(model: &Model, node: &NodeSettings, opts: &WriterOptions) -> bool {
    select::total_endpoints(model, node.family) > opts.iptables.large_cluster_threshold
}

/// Builds the payload. `scope` decides which services' own chains are written; every other
/// part is always regenerated.
fn generate(
    model: &Model,
    node: &NodeSettings,
    opts: &WriterOptions,
    scope: Scope<'_>,
) -> Generated {
    let mut payload = Payload::default();
    base_chains(node, opts, &mut payload);
    let mut own = Own {
        large: is_large(model, node, opts),
        skipped: Table::default(),
        active: BTreeSet::new(),
    };
    for pv in select::service_ports(model, node) {
        let plan = PortPlan::new(&pv);
        shared_rules(&plan, node, opts, &mut payload);
        let nat = if scope.writes(&pv.service.id) {
            &mut payload.nat
        } else {
            &mut own.skipped
        };
        own_chains(&plan, node, nat, &mut own.active, own.large);
    }
    node_ports_jump(node, &mut payload.nat);
    let invalid_drop = (!opts.host.tcp_be_liberal).then_some(opts.host.nfacct_invalid_dropped);
    rules::forward(&mut payload.filter, &opts.mark.text, invalid_drop);
    Generated {
        payload,
        active: own.active,
    }
}

/// The chains every sync declares, and the rules of the shared ones that come first.
fn base_chains(node: &NodeSettings, opts: &WriterOptions, payload: &mut Payload) {
    let Payload { filter, nat } = payload;
    for c in [
        KUBE_SERVICES,
        KUBE_EXTERNAL_SERVICES,
        KUBE_FORWARD,
        KUBE_NODEPORTS,
        KUBE_PROXY_FIREWALL,
    ] {
        filter.chain(c);
    }
    let localhost_fw = node.family == IpFamily::V4 && node.localhost_node_ports;
    if localhost_fw {
        filter.chain(KUBE_FIREWALL);
    }
    for c in [
        KUBE_SERVICES,
        KUBE_NODEPORTS,
        KUBE_POSTROUTING,
        KUBE_MARK_MASQ,
    ] {
        nat.chain(c);
    }
    rules::masquerade(nat, &opts.mark.text, opts.host.random_fully);
    if localhost_fw {
        filter.rule(
            KUBE_FIREWALL,
            &commented(
                "block incoming localnet connections",
                "-d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
            ),
        );
    }
}

/// The last rule of nat KUBE-SERVICES: local destinations go on to KUBE-NODEPORTS.
fn node_ports_jump(node: &NodeSettings, nat: &mut Table) {
    let c = "kubernetes service nodeports; NOTE: this must be the last rule in this chain";
    let v4 = node.family == IpFamily::V4;
    match node.node_port_ips() {
        None => {
            let not_loopback = if !v4 {
                " ! -d ::1/128"
            } else if !node.localhost_node_ports {
                " ! -d 127.0.0.0/8"
            } else {
                ""
            };
            let rest = format!("-m addrtype --dst-type LOCAL{not_loopback} -j {KUBE_NODEPORTS}");
            nat.rule(KUBE_SERVICES, &commented(c, &rest));
        }
        Some(ips) => {
            for ip in ips {
                if ip.is_loopback() && (!v4 || !node.localhost_node_ports) {
                    continue;
                }
                nat.rule(
                    KUBE_SERVICES,
                    &commented(c, &format!("-d {ip} -j {KUBE_NODEPORTS}")),
                );
            }
        }
    }
}

/// Where a service's own chains go this sync, and what the sync keeps.
struct Own {
    /// Over the large-cluster threshold: no per-endpoint comments.
    large: bool,
    /// The own chains of services that did not change (computed, not written).
    skipped: Table,
    /// Every per-service nat chain that exists after the sync.
    active: BTreeSet<String>,
}

/// One service port's chain names and the decisions kube-proxy's `syncProxyRules` makes
/// for it, computed once.
struct PortPlan<'a> {
    pv: &'a PortView<'a>,
    spn: &'a str,
    proto: &'static str,
    port: u16,
    svc_chain: String,
    svl_chain: String,
    ext_chain: String,
    fw_chain: String,
    d: Decisions,
    /// The target and comment of traffic without endpoints (internal and external alike).
    no_endpoints: (&'static str, String),
}

impl<'a> PortPlan<'a> {
    fn new(pv: &'a PortView<'a>) -> Self {
        let spn = pv.name.as_str();
        let hash = service_port_hash(spn, pv.protocol());
        let d = Decisions::of(pv);
        let no_endpoints = if d.has_endpoints {
            ("DROP", format!("{spn} has no local endpoints"))
        } else {
            ("REJECT", format!("{spn} has no endpoints"))
        };
        Self {
            pv,
            spn,
            proto: pv.protocol().lower(),
            port: pv.port.port,
            svc_chain: format!("KUBE-SVC-{hash}"),
            svl_chain: format!("KUBE-SVL-{hash}"),
            ext_chain: format!("KUBE-EXT-{hash}"),
            fw_chain: format!("KUBE-FW-{hash}"),
            d,
            no_endpoints,
        }
    }

    /// The chain of a traffic policy: KUBE-SVL- when Local, else KUBE-SVC-.
    fn policy_chain(&self, local: bool) -> &str {
        if local {
            &self.svl_chain
        } else {
            &self.svc_chain
        }
    }

    fn internal_chain(&self) -> &str {
        self.policy_chain(self.pv.internal_policy_local())
    }

    /// Where LoadBalancer IP traffic goes: the firewall chain when it has source ranges.
    fn lb_target(&self) -> &str {
        if self.d.uses_fw {
            &self.fw_chain
        } else {
            &self.ext_chain
        }
    }

    /// `-m comment --comment C -m P -p P -d IP --dport PORT -j TARGET`.
    fn to(&self, c: &str, ip: &str, target: &str) -> Vec<String> {
        with_target(dest_match(c, self.proto, ip, self.port), target)
    }

    /// The rule rejecting or dropping traffic to `ip` that has no endpoints.
    fn refuse(&self, ip: &str) -> Vec<String> {
        let (target, c) = &self.no_endpoints;
        self.to(c, ip, target)
    }
}

/// A service port's rules in the shared chains: written every sync.
fn shared_rules(
    plan: &PortPlan<'_>,
    node: &NodeSettings,
    opts: &WriterOptions,
    payload: &mut Payload,
) {
    let Payload { filter, nat } = payload;
    let (pv, spn) = (plan.pv, plan.spn);
    let cip = pv.cluster_ip.to_string();
    if plan.d.has_internal {
        let r = plan.to(&format!("{spn} cluster IP"), &cip, plan.internal_chain());
        nat.rule(KUBE_SERVICES, &r);
    } else {
        filter.rule(KUBE_SERVICES, &plan.refuse(&cip));
    }
    for ip in pv.external_ips.iter().map(|ip| ip.to_string()) {
        if plan.d.has_endpoints {
            let r = plan.to(&format!("{spn} external IP"), &ip, &plan.ext_chain);
            nat.rule(KUBE_SERVICES, &r);
        }
        if !plan.d.has_external {
            filter.rule(KUBE_EXTERNAL_SERVICES, &plan.refuse(&ip));
        }
    }
    load_balancer_rules(plan, filter, nat);
    if let Some(np) = pv.node_port {
        let nfacct = node.family == IpFamily::V4
            && node.localhost_node_ports
            && opts.host.nfacct_localhost_nodeports;
        node_port_rules(plan, nfacct, np, filter, nat);
    }
    if let Some(hc) = pv.health_check_node_port {
        let c = format!("{spn} health check node port");
        let r = commented(&c, &format!("-m tcp -p tcp --dport {hc} -j ACCEPT"));
        filter.rule(KUBE_NODEPORTS, &r);
    }
}

/// LoadBalancer IPs: the jump to the service (or its firewall), the firewall's drop, and
/// the refusal without endpoints.
fn load_balancer_rules(plan: &PortPlan<'_>, filter: &mut Table, nat: &mut Table) {
    let spn = plan.spn;
    for ip in plan.pv.load_balancer_ips.iter().map(|ip| ip.to_string()) {
        if plan.d.has_endpoints {
            let r = plan.to(&format!("{spn} loadbalancer IP"), &ip, plan.lb_target());
            nat.rule(KUBE_SERVICES, &r);
        }
        if plan.d.uses_fw {
            let c = format!("{spn} traffic not accepted by {}", plan.fw_chain);
            filter.rule(KUBE_PROXY_FIREWALL, &plan.to(&c, &ip, "DROP"));
        }
    }
    if !plan.d.has_external {
        for ip in &plan.pv.load_balancer_ips {
            filter.rule(KUBE_EXTERNAL_SERVICES, &plan.refuse(&ip.to_string()));
        }
    }
}

/// The NodePort's jumps into the external chain, and its refusal without endpoints.
fn node_port_rules(
    plan: &PortPlan<'_>,
    localhost_nfacct: bool,
    np: u16,
    filter: &mut Table,
    nat: &mut Table,
) {
    let (spn, proto) = (plan.spn, plan.proto);
    if plan.d.has_endpoints {
        if localhost_nfacct {
            let rest = format!(
                "-m {proto} -p {proto} -d 127.0.0.0/8 --dport {np} -m nfacct --nfacct-name localhost_nps_accepted_pkts"
            );
            nat.rule(
                KUBE_NODEPORTS,
                &with_target(commented(spn, &rest), &plan.ext_chain),
            );
        }
        let rest = format!("-m {proto} -p {proto} --dport {np}");
        nat.rule(
            KUBE_NODEPORTS,
            &with_target(commented(spn, &rest), &plan.ext_chain),
        );
    }
    if !plan.d.has_external {
        let (target, c) = &plan.no_endpoints;
        let rest = format!("-m addrtype --dst-type LOCAL -m {proto} -p {proto} --dport {np}");
        filter.rule(
            KUBE_EXTERNAL_SERVICES,
            &with_target(commented(c, &rest), target),
        );
    }
}

/// The service port's own chains: written only when it changed (or on a full sync), but
/// always counted as active.
fn own_chains(
    plan: &PortPlan<'_>,
    node: &NodeSettings,
    nat: &mut Table,
    active: &mut BTreeSet<String>,
    large: bool,
) {
    let pv = plan.pv;
    let mut chains = Chains { nat, active };
    if plan.d.has_internal {
        internal_masquerade(plan, node, chains.nat);
    }
    if plan.d.uses_ext {
        external_chain(plan, node, &mut chains);
    }
    if plan.d.uses_fw {
        firewall_chain(plan, node, &mut chains);
    }
    let eps = EndpointRules { plan, large };
    let cat = &pv.categorized;
    if plan.d.uses_cluster_chain {
        eps.policy_chain(&plan.svc_chain, &cat.cluster, &mut chains);
    }
    if plan.d.uses_local_chain {
        eps.policy_chain(&plan.svl_chain, &cat.local, &mut chains);
    }
    for ep in cat.all_reachable() {
        eps.endpoint_chain(ep, &mut chains);
    }
}

/// The nat table a service's own chains are written to, and the set of active chains.
struct Chains<'t> {
    nat: &'t mut Table,
    active: &'t mut BTreeSet<String>,
}

impl Chains<'_> {
    /// Declares `chain` and keeps it active.
    fn declare(&mut self, chain: &str) {
        self.nat.chain(chain);
        self.active.insert(chain.to_string());
    }
}

/// Cluster-IP traffic that does not come from a pod (or all of it with
/// `--masquerade-all`) is marked for masquerade.
fn internal_masquerade(plan: &PortPlan<'_>, node: &NodeSettings, nat: &mut Table) {
    let chain = plan.internal_chain();
    let c = format!("{} cluster IP", plan.spn);
    let args = dest_match(&c, plan.proto, &plan.pv.cluster_ip.to_string(), plan.port);
    if node.masquerade_all {
        nat.rule(chain, &with_target(args, KUBE_MARK_MASQ));
    } else if let Some(not_local) = node.detector.if_not_local() {
        let mut r = args;
        r.extend(not_local);
        nat.rule(chain, &with_target(r, KUBE_MARK_MASQ));
    }
}

/// KUBE-EXT-: masquerade (unless externalTrafficPolicy Local, which keeps pod and
/// node-local traffic on the cluster chain), then the policy chain.
fn external_chain(plan: &PortPlan<'_>, node: &NodeSettings, chains: &mut Chains<'_>) {
    let (spn, ext) = (plan.spn, plan.ext_chain.as_str());
    chains.declare(ext);
    let nat = &mut *chains.nat;
    let external_local = plan.pv.external_policy_local();
    if !external_local {
        let c = format!("masquerade traffic for {spn} external destinations");
        nat.rule(ext, &with_target(comment(&c).into(), KUBE_MARK_MASQ));
    } else {
        if let Some(local) = node.detector.if_local() {
            let mut r: Vec<String> =
                comment(&format!("pod traffic for {spn} external destinations")).into();
            r.extend(local);
            nat.rule(ext, &with_target(r, &plan.svc_chain));
        }
        let c = format!("masquerade LOCAL traffic for {spn} external destinations");
        let r = commented(&c, "-m addrtype --src-type LOCAL");
        nat.rule(ext, &with_target(r, KUBE_MARK_MASQ));
        let c = format!("route LOCAL traffic for {spn} external destinations");
        let r = commented(&c, "-m addrtype --src-type LOCAL");
        nat.rule(ext, &with_target(r, &plan.svc_chain));
    }
    if plan.d.has_external {
        nat.rule(ext, &["-j", plan.policy_chain(external_local)]);
    }
}

/// KUBE-FW-: LoadBalancer traffic from the source ranges (and from the LoadBalancer IPs
/// themselves when the node is in a range) goes on; the rest falls through to the drop.
fn firewall_chain(plan: &PortPlan<'_>, node: &NodeSettings, chains: &mut Chains<'_>) {
    let (pv, fw) = (plan.pv, plan.fw_chain.as_str());
    chains.declare(fw);
    let nat = &mut *chains.nat;
    let base: Vec<String> = comment(&format!("{} loadbalancer IP", plan.spn)).into();
    let from = |src: String| {
        let mut r = base.clone();
        r.extend(["-s".into(), src]);
        with_target(r, &plan.ext_chain)
    };
    for cidr in &pv.source_ranges {
        nat.rule(fw, &from(cidr.to_string()));
    }
    let node_ip = node.node_ip();
    if pv
        .source_ranges
        .iter()
        .any(|c| node_ip.is_some_and(|ip| c.contains(ip)))
    {
        for ip in &pv.load_balancer_ips {
            nat.rule(fw, &from(ip.to_string()));
        }
    }
    let c = format!(
        "other traffic to {} will be dropped by KUBE-PROXY-FIREWALL",
        plan.spn
    );
    nat.rule(fw, &comment(&c));
}

/// The per-endpoint rules: the policy chains' choice of endpoint and each endpoint's chain.
struct EndpointRules<'p, 'a> {
    plan: &'p PortPlan<'a>,
    /// Large-cluster mode: no per-endpoint comments.
    large: bool,
}

impl EndpointRules<'_, '_> {
    fn comment(&self, c: String) -> Vec<String> {
        if self.large {
            Vec::new()
        } else {
            comment(&c).into()
        }
    }

    fn sep(&self, ep: &EndpointView) -> String {
        endpoint_chain(self.plan.spn, self.plan.pv.protocol(), ep)
    }

    /// KUBE-SVC-/KUBE-SVL-: affinity checks first, then a random choice among `eps`.
    fn policy_chain(&self, chain: &str, eps: &[EndpointView], chains: &mut Chains<'_>) {
        chains.declare(chain);
        let spn = self.plan.spn;
        if let Some(timeout) = self.plan.pv.affinity_timeout() {
            for ep in eps {
                let sep = self.sep(ep);
                let mut r = self.comment(format!("{spn} -> {ep}"));
                let rest = format!("-m recent --name {sep} --rcheck --seconds {timeout} --reap");
                r.extend(rest.split(' ').map(String::from));
                chains.nat.rule(chain, &with_target(r, &sep));
            }
        }
        let n = eps.len();
        for (i, ep) in eps.iter().enumerate() {
            let mut r = self.comment(format!("{spn} -> {ep}"));
            if i + 1 < n {
                let p = probability(n - i);
                let rest = format!("-m statistic --mode random --probability {p}");
                r.extend(rest.split(' ').map(String::from));
            }
            chains.nat.rule(chain, &with_target(r, &self.sep(ep)));
        }
    }

    /// KUBE-SEP-: hairpin traffic is masqueraded, then DNAT to the endpoint.
    fn endpoint_chain(&self, ep: &EndpointView, chains: &mut Chains<'_>) {
        let sep = self.sep(ep);
        chains.declare(&sep);
        let c = self.comment(self.plan.spn.to_string());
        let mut r = c.clone();
        r.extend(["-s".into(), ep.ip.to_string()]);
        chains.nat.rule(&sep, &with_target(r, KUBE_MARK_MASQ));
        let mut r = c;
        if self.plan.pv.affinity_timeout().is_some() {
            r.extend(["-m", "recent", "--name", &sep, "--set"].map(String::from));
        }
        let proto = self.plan.proto;
        let rest = format!("-m {proto} -p {proto} -j DNAT --to-destination {ep}");
        r.extend(rest.split(' ').map(String::from));
        chains.nat.rule(&sep, &r);
    }
}
/// The payload of a full sync on a node without kube-proxy chains: kube-proxy's first sync.
pub fn emit(model: &Model, node: &NodeSettings, opts: &WriterOptions) -> Payload {
    generate(model, node, opts, Scope::Full).payload
}

/// What kube-proxy remembers of a service between syncs, to tell whether it changed.
type Snapshot = (Option<Service>, Option<Slices>);

/// Options of one [`IptablesProxier::sync`].
#[derive(Clone, Copy, Debug, Default)]
pub struct SyncOptions {
    /// Force a full sync (kube-proxy does one at least every FullSyncPeriod).
    pub force_full: bool,
    /// The time of the sync (any monotonic clock), for the large-cluster cleanup interval.
    pub now: Duration,
}

/// kube-proxy's iptables proxier state between syncs (see the module docs).
#[derive(Debug)]
pub struct IptablesProxier {
    last: Option<BTreeMap<ServiceRef, Snapshot>>,
    need_full_sync: bool,
    last_cleanup: Option<Duration>,
    /// `--iptables-sync-period`: the minimum time between stale-chain cleanups in
    /// large-cluster mode.
    pub sync_period: Duration,
}

impl Default for IptablesProxier {
    fn default() -> Self {
        Self {
            last: None,
            need_full_sync: true,
            last_cleanup: None,
            sync_period: Duration::from_secs(30),
        }
    }
}

fn snapshots(model: &Model) -> BTreeMap<ServiceRef, Snapshot> {
    let mut out: BTreeMap<ServiceRef, Snapshot> = BTreeMap::new();
    for (id, svc) in &model.services {
        out.entry(id.clone()).or_default().0 = Some(svc.clone());
    }
    for (id, slices) in &model.slices {
        out.entry(id.clone()).or_default().1 = Some(slices.clone());
    }
    out
}

impl IptablesProxier {
    /// A proxier whose first sync is a full one.
    pub fn new(sync_period: Duration) -> Self {
        Self {
            sync_period,
            ..Self::default()
        }
    }

    /// Sets when stale chains were last cleaned up (large-cluster mode only cleans up once
    /// per sync period).
    pub fn set_last_cleanup(&mut self, at: Duration) {
        self.last_cleanup = Some(at);
    }

    /// Whether the next sync will be a full one.
    pub fn needs_full_sync(&self) -> bool {
        self.need_full_sync
    }

    /// Computes the payload of one sync. `existing_nat_chains` are the chains in the nat
    /// table now (`iptables-save -t nat`); per-service ones not written or kept active this
    /// sync are deleted. Report the restore's outcome with [`IptablesProxier::restored`].
    pub fn sync(
        &mut self,
        model: &Model,
        node: &NodeSettings,
        writer: &WriterOptions,
        existing_nat_chains: &BTreeSet<String>,
        opts: SyncOptions,
    ) -> Payload {
        let now_snap = snapshots(model);
        let full = opts.force_full || self.need_full_sync || self.last.is_none();
        let changed: BTreeSet<ServiceRef> = match &self.last {
            Some(last) => now_snap
                .keys()
                .chain(last.keys())
                .filter(|k| now_snap.get(*k) != last.get(*k))
                .cloned()
                .collect(),
            None => BTreeSet::new(),
        };
        self.last = Some(now_snap);
        let scope = if full {
            Scope::Full
        } else {
            Scope::Changed(&changed)
        };
        let Generated {
            mut payload,
            active,
        } = generate(model, node, writer, scope);
        let large = is_large(model, node, writer);
        let cleanup_due = !large
            || self
                .last_cleanup
                .is_none_or(|t| opts.now.saturating_sub(t) > self.sync_period);
        if cleanup_due {
            for chain in existing_nat_chains {
                if is_service_chain(chain) && !active.contains(chain) {
                    payload.nat.chains.push(chain.clone());
                    payload.nat.deleted.push(chain.clone());
                }
            }
            self.last_cleanup = Some(opts.now);
        }
        tracing::debug!(
            full,
            changed = changed.len(),
            large,
            "iptables sync computed"
        );
        payload
    }

    /// Records whether `iptables-restore` accepted the last payload; a failure makes the
    /// next sync a full one.
    pub fn restored(&mut self, ok: bool) {
        self.need_full_sync = !ok;
    }
}
