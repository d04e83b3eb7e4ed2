//! kube-proxy's nftables mode: the `kube-proxy` table (kube-proxy's `pkg/proxy/nftables`), as the `add …` commands
//! that create it (`nft -f` input; also the form kube-proxy's tests dump the table in).
//!
//! [`emit`] builds the table of a fresh proxier. [`NftProxier`] adds what kube-proxy keeps
//! between syncs: chains that are no longer used are flushed at once but deleted only after
//! [`STALE_CHAIN_DELAY`], so a table state can hold empty stale chains.
//! [`trace`] follows a packet through a [`NftTable`] (for packet-flow checks).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    net::IpAddr,
    time::Duration,
};

use super::{WriterOptions, names::nft_name, plan::Decisions};
use crate::model::{
    IpFamily, LocalDetector, Model, NodeSettings, Protocol,
    select::{self, EndpointView, PortView},
};

/// How long a flushed chain is kept before it is deleted.
pub const STALE_CHAIN_DELAY: Duration = Duration::from_secs(1);

/// The table's name.
pub const TABLE: &str = "kube-proxy";

/// One element of a set or map.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Element {
    /// `172.30.0.41 . tcp . 80`.
    pub key: String,
    /// Element comment (the service port name), if any.
    pub comment: Option<String>,
    /// Map value (`goto service-…`, `drop`); `None` in a set.
    pub value: Option<String>,
}

/// A set or map with its declaration and elements.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Collection {
    /// `{ type … ; … }` body.
    pub spec: String,
    pub is_map: bool,
    pub elements: Vec<Element>,
}

/// A chain: its declaration suffix (hook or comment, may be empty) and rules.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    pub spec: String,
    pub rules: Vec<String>,
}

/// The whole `kube-proxy` table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NftTable {
    pub family: IpFamily,
    pub chains: BTreeMap<String, Chain>,
    pub sets: BTreeMap<String, Collection>,
}

fn fam(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

fn addr_type(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "ipv4_addr",
        IpFamily::V6 => "ipv6_addr",
    }
}

impl NftTable {
    fn chain(&mut self, name: &str, spec: &str) -> &mut Chain {
        let c = self.chains.entry(name.to_string()).or_default();
        if c.spec.is_empty() {
            c.spec = spec.to_string();
        }
        c
    }

    fn rule(&mut self, chain: &str, rule: impl Into<String>) {
        self.chain(chain, "").rules.push(rule.into());
    }

    fn collection(&mut self, name: &str, is_map: bool, spec: String) {
        self.sets.insert(
            name.to_string(),
            Collection {
                spec,
                is_map,
                elements: Vec::new(),
            },
        );
    }

    fn element(&mut self, set: &str, key: String, comment: Option<&str>, value: Option<String>) {
        if let Some(s) = self.sets.get_mut(set) {
            s.elements.push(Element {
                key,
                comment: comment.map(String::from),
                value,
            });
        }
    }

    /// The `add …` commands that create the table (knftables' dump order: table, chains,
    /// sets and maps, rules, elements).
    pub fn render(&self) -> String {
        let f = fam(self.family);
        let mut out = format!("add table {f} {TABLE} {{ comment \"rules for kube-proxy\" ; }}\n");
        for (name, c) in &self.chains {
            if c.spec.is_empty() {
                let _ = writeln!(out, "add chain {f} {TABLE} {name}");
            } else {
                let _ = writeln!(out, "add chain {f} {TABLE} {name} {{ {} ; }}", c.spec);
            }
        }
        for (name, s) in &self.sets {
            let kind = if s.is_map { "map" } else { "set" };
            let _ = writeln!(out, "add {kind} {f} {TABLE} {name} {{ {} ; }}", s.spec);
        }
        for (name, c) in &self.chains {
            for r in &c.rules {
                let _ = writeln!(out, "add rule {f} {TABLE} {name} {r}");
            }
        }
        for (name, s) in &self.sets {
            for e in &s.elements {
                let mut body = e.key.clone();
                if let Some(c) = &e.comment {
                    let _ = write!(body, " comment \"{c}\"");
                }
                if let Some(v) = &e.value {
                    let _ = write!(body, " : {v}");
                }
                let _ = writeln!(out, "add element {f} {TABLE} {name} {{ {body} }}");
            }
        }
        out
    }

    /// `nft -f` input that replaces any existing `kube-proxy` table with this one.
    pub fn render_replace(&self) -> String {
        let f = fam(self.family);
        format!(
            "add table {f} {TABLE}\ndelete table {f} {TABLE}\n{}",
            self.render()
        )
    }
}

/// The fixed chains, sets, maps and rules every sync writes.
fn base(t: &mut NftTable, node: &NodeSettings, opts: &WriterOptions) {
    let f = fam(node.family);
    base_chains(t);
    base_collections(t, addr_type(node.family));
    dispatch_rules(t, node, f);
    let mark = &opts.mark.text;
    t.rule("mark-for-masquerade", format!("mark set mark or {mark}"));
    t.rule("masquerading", format!("mark and {mark} == 0 return"));
    t.rule("masquerading", format!("mark set mark xor {mark}"));
    t.rule("masquerading", "masquerade fully-random");
    t.rule("nat-prerouting", "jump services");
    t.rule("nat-output", "jump services");
    t.rule("nat-postrouting", "jump masquerading");
    t.rule("reject-chain", "reject");
    t.rule(
        "services",
        format!("{f} daddr . meta l4proto . th dport vmap @service-ips"),
    );
    node_port_rules(t, node, f);
}

/// The hooked chains and the helper chains.
fn base_chains(t: &mut NftTable) {
    for (name, spec) in [
        (
            "filter-prerouting-pre-dnat",
            "type filter hook prerouting priority -110",
        ),
        (
            "filter-output-pre-dnat",
            "type filter hook output priority -110",
        ),
        ("filter-forward", "type filter hook forward priority 0"),
        ("filter-input", "type filter hook input priority 0"),
        ("filter-output", "type filter hook output priority 0"),
        ("nat-prerouting", "type nat hook prerouting priority -100"),
        ("nat-output", "type nat hook output priority -100"),
        ("nat-postrouting", "type nat hook postrouting priority 100"),
        ("services", ""),
        ("service-endpoints-check", ""),
        ("nodeport-endpoints-check", ""),
        ("cluster-ips-check", ""),
        ("firewall-check", ""),
        ("mark-for-masquerade", ""),
        ("masquerading", ""),
        (
            "reject-chain",
            "comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\"",
        ),
    ] {
        t.chain(name, spec);
    }
}

/// The sets and verdict maps services add their elements to.
fn base_collections(t: &mut NftTable, at: &str) {
    t.collection(
        "cluster-ips",
        false,
        format!("type {at} ; comment \"Active ClusterIPs\""),
    );
    t.collection(
        "nodeport-ips",
        false,
        format!("type {at} ; comment \"IPs that accept NodePort traffic\""),
    );
    let addr_proto_port = format!("type {at} . inet_proto . inet_service : verdict");
    for (name, spec) in [
        (
            "firewall-ips",
            format!("{addr_proto_port} ; comment \"destinations that are subject to LoadBalancerSourceRanges\""),
        ),
        (
            "no-endpoint-nodeports",
            "type inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to service nodeports with no endpoints\"".to_string(),
        ),
        (
            "no-endpoint-services",
            format!("{addr_proto_port} ; comment \"vmap to drop or reject packets to services with no endpoints\""),
        ),
        (
            "service-ips",
            format!("{addr_proto_port} ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\""),
        ),
        (
            "service-nodeports",
            "type inet_proto . inet_service : verdict ; comment \"NodePort traffic\"".to_string(),
        ),
    ] {
        t.collection(name, true, spec);
    }
}

/// The hooks' jumps into the checks, and the checks' lookups.
fn dispatch_rules(t: &mut NftTable, node: &NodeSettings, f: &str) {
    t.rule(
        "filter-prerouting-pre-dnat",
        "ct state new jump firewall-check",
    );
    t.rule("filter-output-pre-dnat", "ct state new jump firewall-check");
    t.rule(
        "filter-forward",
        "ct state new jump service-endpoints-check",
    );
    t.rule("filter-forward", "ct state new jump cluster-ips-check");
    t.rule("filter-input", "ct state new jump nodeport-endpoints-check");
    t.rule("filter-input", "ct state new jump service-endpoints-check");
    t.rule("filter-output", "ct state new jump service-endpoints-check");
    t.rule("filter-output", "ct state new jump cluster-ips-check");
    t.rule(
        "firewall-check",
        format!("{f} daddr . meta l4proto . th dport vmap @firewall-ips"),
    );
    t.rule(
        "service-endpoints-check",
        format!("{f} daddr . meta l4proto . th dport vmap @no-endpoint-services"),
    );
    t.rule(
        "cluster-ips-check",
        format!("{f} daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\""),
    );
    if !node.service_cidrs.is_empty() {
        let cidrs: Vec<String> = node
            .service_cidrs
            .iter()
            .filter(|c| node.family.matches(c.addr()))
            .map(|c| c.to_string())
            .collect();
        if !cidrs.is_empty() {
            t.rule(
                "cluster-ips-check",
                format!(
                    "{f} daddr {{ {} }} drop comment \"Drop traffic to unallocated ClusterIPs\"",
                    cidrs.join(", ")
                ),
            );
        }
    }
}

/// Where NodePorts are served: the nodePortAddresses, or every local address but loopback.
fn node_port_rules(t: &mut NftTable, node: &NodeSettings, f: &str) {
    match node.node_port_ips() {
        Some(ips) => {
            t.rule(
                "services",
                format!("{f} daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports"),
            );
            t.rule(
                "nodeport-endpoints-check",
                format!(
                    "{f} daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports"
                ),
            );
            for ip in ips {
                t.element("nodeport-ips", ip.to_string(), None, None);
            }
        }
        None => {
            let no_lo = format!("{f} daddr != {}", node.family.loopback());
            t.rule(
                "services",
                format!(
                    "fib daddr type local {no_lo} meta l4proto . th dport vmap @service-nodeports"
                ),
            );
            t.rule(
                "nodeport-endpoints-check",
                format!("fib daddr type local {no_lo} meta l4proto . th dport vmap @no-endpoint-nodeports"),
            );
        }
    }
}

fn detector_match(d: &LocalDetector, f: &str, local: bool) -> Option<String> {
    let op = if local { "" } else { "!= " };
    match d {
        LocalDetector::None => None,
        LocalDetector::ClusterCidr(c) | LocalDetector::NodeCidr(c) => {
            Some(format!("{f} saddr {op}{c}"))
        }
        LocalDetector::BridgeInterface(i) => Some(format!("iifname {op}\"{i}\"")),
        LocalDetector::InterfaceNamePrefix(p) => Some(format!("iifname {op}\"{p}*\"")),
    }
}

fn ep_base(pv: &PortView<'_>, ep: &EndpointView) -> String {
    let ip = ep.ip.to_string().replace(':', ".");
    format!("{}__{ip}/{}", port_base(pv), ep.port)
}

fn port_base(pv: &PortView<'_>) -> String {
    format!(
        "{}/{}/{}/{}",
        pv.service.id.namespace,
        pv.service.id.name,
        pv.protocol().lower(),
        pv.port.name
    )
}

fn dnat_dest(ep: &EndpointView) -> String {
    ep.to_string()
}

/// One service port's chain names and decisions, computed once.
struct PortPlan<'a> {
    pv: &'a PortView<'a>,
    /// The family's word in rules (`ip`, `ip6`).
    f: &'static str,
    proto: &'static str,
    cluster_chain: String,
    local_chain: String,
    ext_chain: String,
    fw_chain: String,
    d: Decisions,
}

impl<'a> PortPlan<'a> {
    fn new(pv: &'a PortView<'a>, node: &NodeSettings) -> Self {
        let base = port_base(pv);
        Self {
            pv,
            f: fam(node.family),
            proto: pv.protocol().lower(),
            cluster_chain: nft_name("service", &base),
            local_chain: nft_name("local", &base),
            ext_chain: nft_name("external", &base),
            fw_chain: nft_name("firewall", &base),
            d: Decisions::of(pv),
        }
    }

    /// The chain of a traffic policy.
    fn policy_chain(&self, local: bool) -> &str {
        if local {
            &self.local_chain
        } else {
            &self.cluster_chain
        }
    }

    /// The verdict for traffic without endpoints under its policy (`has`: it has some).
    fn no_endpoints(&self, has: bool) -> Option<String> {
        if has {
            None
        } else if !self.d.has_endpoints {
            Some("goto reject-chain".into())
        } else {
            Some("drop".into())
        }
    }

    /// `IP . PROTO . PORT`, the key of the address maps.
    fn key(&self, ip: IpAddr) -> String {
        format!("{ip} . {} . {}", self.proto, self.pv.port.port)
    }
}

fn write_port(t: &mut NftTable, pv: &PortView<'_>, node: &NodeSettings) {
    let plan = PortPlan::new(pv, node);
    map_elements(t, &plan);
    if plan.d.has_internal {
        internal_masquerade(t, &plan, node);
    }
    if plan.d.uses_ext {
        external_chain(t, &plan, node);
    }
    if plan.d.uses_fw {
        firewall_chain(t, &plan, node);
    }
    let cat = &pv.categorized;
    if plan.d.uses_cluster_chain {
        policy_chain(t, &plan, &plan.cluster_chain, &cat.cluster);
    }
    if plan.d.uses_local_chain {
        policy_chain(t, &plan, &plan.local_chain, &cat.local);
    }
    for ep in cat.all_reachable() {
        endpoint_chain(t, &plan, node, ep);
    }
}

/// The port's elements in the shared sets and verdict maps.
fn map_elements(t: &mut NftTable, plan: &PortPlan<'_>) {
    let (pv, d) = (plan.pv, &plan.d);
    let spn = pv.name.as_str();
    let cip = pv.cluster_ip;
    t.element("cluster-ips", cip.to_string(), None, None);
    if d.has_internal {
        let chain = plan.policy_chain(pv.internal_policy_local());
        t.element(
            "service-ips",
            plan.key(cip),
            None,
            Some(format!("goto {chain}")),
        );
    } else if let Some(v) = plan.no_endpoints(false) {
        t.element("no-endpoint-services", plan.key(cip), Some(spn), Some(v));
    }
    let ext_target = format!("goto {}", plan.ext_chain);
    for ip in &pv.external_ips {
        if d.has_endpoints {
            t.element("service-ips", plan.key(*ip), None, Some(ext_target.clone()));
        }
        if let Some(v) = plan.no_endpoints(d.has_external) {
            t.element("no-endpoint-services", plan.key(*ip), Some(spn), Some(v));
        }
    }
    for ip in &pv.load_balancer_ips {
        if d.has_endpoints {
            t.element("service-ips", plan.key(*ip), None, Some(ext_target.clone()));
        }
        if d.uses_fw {
            let goto = format!("goto {}", plan.fw_chain);
            t.element("firewall-ips", plan.key(*ip), None, Some(goto));
        }
        if let Some(v) = plan.no_endpoints(d.has_external) {
            t.element("no-endpoint-services", plan.key(*ip), Some(spn), Some(v));
        }
    }
    if let Some(np) = pv.node_port {
        let k = format!("{} . {np}", plan.proto);
        if d.has_endpoints {
            t.element("service-nodeports", k.clone(), None, Some(ext_target));
        }
        if let Some(v) = plan.no_endpoints(d.has_external) {
            t.element("no-endpoint-nodeports", k, Some(spn), Some(v));
        }
    }
}

/// ClusterIP traffic not from a pod (or all of it with `--masquerade-all`) is masqueraded.
fn internal_masquerade(t: &mut NftTable, plan: &PortPlan<'_>, node: &NodeSettings) {
    let (f, cip) = (plan.f, plan.pv.cluster_ip);
    let chain = plan.policy_chain(plan.pv.internal_policy_local());
    if node.masquerade_all {
        t.rule(chain, format!("{f} daddr {cip} jump mark-for-masquerade"));
    } else if let Some(m) = detector_match(&node.detector, f, false) {
        t.rule(
            chain,
            format!("{f} daddr {cip} {m} jump mark-for-masquerade"),
        );
    }
}

/// The external chain: masquerade (externalTrafficPolicy Cluster), or short-circuit pod and
/// node-local traffic to the cluster chain (Local); then the policy chain.
fn external_chain(t: &mut NftTable, plan: &PortPlan<'_>, node: &NodeSettings) {
    let (ext, cluster) = (plan.ext_chain.as_str(), plan.cluster_chain.as_str());
    t.chain(ext, "");
    let external_local = plan.pv.external_policy_local();
    if !external_local {
        t.rule(ext, "jump mark-for-masquerade");
    } else {
        if let Some(m) = detector_match(&node.detector, plan.f, true) {
            t.rule(
                ext,
                format!("{m} goto {cluster} comment \"short-circuit pod traffic\""),
            );
        }
        t.rule(
            ext,
            "fib saddr type local jump mark-for-masquerade comment \"masquerade local traffic\"",
        );
        t.rule(
            ext,
            format!("fib saddr type local goto {cluster} comment \"short-circuit local traffic\""),
        );
    }
    if plan.d.has_external {
        t.rule(ext, format!("goto {}", plan.policy_chain(external_local)));
    }
}

/// The firewall chain: drop LoadBalancer traffic from outside the source ranges (and the
/// LoadBalancer IPs themselves, when the node is in a range).
fn firewall_chain(t: &mut NftTable, plan: &PortPlan<'_>, node: &NodeSettings) {
    let pv = plan.pv;
    let mut allowed: Vec<String> = pv.source_ranges.iter().map(|c| c.to_string()).collect();
    if node
        .node_ip()
        .is_some_and(|ip| pv.source_ranges.iter().any(|c| c.contains(ip)))
    {
        allowed.extend(pv.load_balancer_ips.iter().map(|ip| ip.to_string()));
    }
    t.rule(
        &plan.fw_chain,
        format!("{} saddr != {{ {} }} drop", plan.f, allowed.join(", ")),
    );
}

/// A policy chain: affinity first, then a random endpoint.
fn policy_chain(t: &mut NftTable, plan: &PortPlan<'_>, chain: &str, eps: &[EndpointView]) {
    let pv = plan.pv;
    t.chain(chain, "");
    if pv.affinity_timeout().is_some() {
        for ep in eps {
            let b = ep_base(pv, ep);
            t.rule(
                chain,
                format!(
                    "{} saddr @{} goto {}",
                    plan.f,
                    nft_name("affinity", &b),
                    nft_name("endpoint", &b)
                ),
            );
        }
    }
    let arms: Vec<String> = eps
        .iter()
        .enumerate()
        .map(|(i, ep)| format!("{i} : goto {}", nft_name("endpoint", &ep_base(pv, ep))))
        .collect();
    t.rule(
        chain,
        format!(
            "numgen random mod {} vmap {{ {} }}",
            eps.len(),
            arms.join(" , ")
        ),
    );
}

/// An endpoint's chain: hairpin masquerade, the affinity set, DNAT.
fn endpoint_chain(t: &mut NftTable, plan: &PortPlan<'_>, node: &NodeSettings, ep: &EndpointView) {
    let f = plan.f;
    let b = ep_base(plan.pv, ep);
    let chain = nft_name("endpoint", &b);
    t.rule(
        &chain,
        format!("{f} saddr {} jump mark-for-masquerade", ep.ip),
    );
    if let Some(timeout) = plan.pv.affinity_timeout() {
        let set = nft_name("affinity", &b);
        t.collection(
            &set,
            false,
            format!(
                "type {} ; flags dynamic,timeout ; timeout {timeout}s",
                addr_type(node.family)
            ),
        );
        t.rule(&chain, format!("update @{set} {{ {f} saddr }}"));
    }
    t.rule(
        &chain,
        format!("meta l4proto {} dnat to {}", plan.proto, dnat_dest(ep)),
    );
}

/// The table a fresh kube-proxy writes for `model` on `node`.
pub fn emit(model: &Model, node: &NodeSettings, opts: &WriterOptions) -> NftTable {
    let mut t = NftTable {
        family: node.family,
        ..NftTable::default()
    };
    base(&mut t, node, opts);
    for pv in select::service_ports(model, node) {
        write_port(&mut t, &pv, node);
    }
    t
}

/// kube-proxy's nftables proxier between syncs: flushed chains wait [`STALE_CHAIN_DELAY`]
/// before they are deleted.
#[derive(Debug, Default)]
pub struct NftProxier {
    previous: BTreeSet<String>,
    stale: BTreeMap<String, Duration>,
}

impl NftProxier {
    /// Syncs at time `now` (any monotonic clock) and returns the table state afterwards.
    pub fn sync(
        &mut self,
        model: &Model,
        node: &NodeSettings,
        opts: &WriterOptions,
        now: Duration,
    ) -> NftTable {
        let mut t = emit(model, node, opts);
        let active: BTreeSet<String> = t.chains.keys().cloned().collect();
        for gone in self.previous.difference(&active) {
            self.stale.entry(gone.clone()).or_insert(now);
        }
        self.stale.retain(|name, since| {
            !active.contains(name) && now.saturating_sub(*since) < STALE_CHAIN_DELAY
        });
        for name in self.stale.keys() {
            t.chains.entry(name.clone()).or_default();
        }
        self.previous = active;
        t
    }
}

// ---------------------------------------------------------------- tracing

/// A packet to trace.
pub use super::trace::Packet;

struct Tracer<'a> {
    t: &'a NftTable,
    node: &'a NodeSettings,
    outputs: Vec<String>,
    masq: bool,
    depth: usize,
    /// Rules (and verdict-map elements) matched, as `CHAIN: RULE`.
    matched: Vec<String>,
}

fn proto_name(p: Protocol) -> &'static str {
    p.lower()
}

fn in_list(list: &str, ip: IpAddr) -> bool {
    list.split(',').any(|s| {
        let s = s.trim();
        if s.contains('/') {
            crate::model::Cidr::parse_sloppy(s).is_ok_and(|c| c.contains(ip))
        } else {
            s.parse::<IpAddr>().ok() == Some(ip)
        }
    })
}

/// What a rule decided.
enum Verdict {
    /// On to the chain's next rule.
    Continue,
    /// This chain ends (`return`, or a `goto`'d chain that ended without a verdict): the
    /// packet goes back to the chain that jumped here.
    EndChain,
    /// The packet's fate is sealed (`drop`, `reject`, a DNAT).
    Final,
}

impl Tracer<'_> {
    fn set_has(&self, set: &str, key: &str) -> Option<&Element> {
        self.t
            .sets
            .get(set)
            .and_then(|s| s.elements.iter().find(|e| e.key == key))
    }

    fn verdict(&mut self, v: &str, pkt: &Packet) -> Verdict {
        let mut w = v.split_whitespace();
        match (w.next(), w.next()) {
            (Some(how @ ("goto" | "jump")), Some(c)) => match (self.run(c, pkt), how) {
                (true, _) => Verdict::Final,
                (false, "goto") => Verdict::EndChain,
                _ => Verdict::Continue,
            },
            (Some("drop"), _) => {
                self.outputs.push("DROP".into());
                Verdict::Final
            }
            (Some("reject"), _) => {
                self.outputs.push("REJECT".into());
                Verdict::Final
            }
            (Some("return"), _) => Verdict::EndChain,
            _ => Verdict::Continue,
        }
    }

    /// Runs a chain; true when the packet got a final verdict.
    fn run(&mut self, chain: &str, pkt: &Packet) -> bool {
        if self.depth > 64 {
            return false;
        }
        let Some(c) = self.t.chains.get(chain) else {
            return false;
        };
        self.depth += 1;
        let mut sealed = false;
        for rule in c.rules.clone() {
            let rule = rule.split(" comment \"").next().unwrap_or("").to_string();
            let line = format!("{chain}: {rule}");
            let mut scan = Scan {
                rest: &rule,
                matched: true,
                done: false,
                sealed: false,
                line: &line,
            };
            self.leading_matches(&mut scan, pkt);
            sealed |= scan.sealed;
            if !scan.matched || scan.rest.is_empty() {
                if scan.done {
                    break;
                }
                continue;
            }
            self.matched.push(line.clone());
            match self.action(scan.rest.trim(), pkt) {
                Verdict::Continue => {}
                Verdict::EndChain => break,
                Verdict::Final => {
                    sealed = true;
                    break;
                }
            }
        }
        self.depth -= 1;
        sealed
    }

    /// Consumes a rule's leading matches (and the lookups that end it).
    fn leading_matches(&mut self, scan: &mut Scan<'_>, pkt: &Packet) {
        let f = fam(self.t.family);
        loop {
            let rest = scan.rest.trim_start();
            scan.rest = rest;
            if let Some(r) = rest.strip_prefix("ct state new ") {
                scan.rest = r;
            } else if let Some(r) = rest.strip_prefix("fib saddr type local ") {
                scan.matched &= self.node.is_local_address(pkt.src);
                scan.rest = r;
            } else if let Some(r) = rest.strip_prefix("fib daddr type local ") {
                scan.matched &= self.node.is_local_address(pkt.dst);
                scan.rest = r;
            } else if let Some(r) =
                rest.strip_prefix(&format!("{f} daddr . meta l4proto . th dport vmap @"))
            {
                let key = format!("{} . {} . {}", pkt.dst, proto_name(pkt.protocol), pkt.dport);
                self.vmap(scan, r.trim(), &key, pkt);
            } else if let Some(r) = rest.strip_prefix("meta l4proto . th dport vmap @") {
                let key = format!("{} . {}", proto_name(pkt.protocol), pkt.dport);
                self.vmap(scan, r.trim(), &key, pkt);
            } else if let Some(r) = rest.strip_prefix("numgen random mod ") {
                self.numgen(scan, r, pkt);
            } else if let Some(r) = rest.strip_prefix(&format!("{f} daddr ")) {
                self.address(scan, r, pkt.dst, pkt);
            } else if let Some(r) = rest.strip_prefix(&format!("{f} saddr ")) {
                self.address(scan, r, pkt.src, pkt);
            } else if let Some(r) = rest.strip_prefix("meta l4proto ") {
                let (p, r) = r.split_once(' ').unwrap_or((r, ""));
                scan.matched &= p == proto_name(pkt.protocol);
                scan.rest = r;
            } else {
                break;
            }
        }
    }

    /// A verdict-map lookup, which ends the rule.
    fn vmap(&mut self, scan: &mut Scan<'_>, map: &str, key: &str, pkt: &Packet) {
        if scan.matched
            && let Some(v) = self.set_has(map, key).and_then(|e| e.value.clone())
        {
            self.matched.push(format!("{} [{key} : {v}]", scan.line));
            match self.verdict(&v, pkt) {
                Verdict::Continue => {}
                Verdict::EndChain => scan.done = true,
                Verdict::Final => (scan.done, scan.sealed) = (true, true),
            }
        }
        scan.matched = false;
        scan.rest = "";
    }

    /// `numgen random mod N vmap { … }`: every arm is explored; it ends the rule.
    fn numgen(&mut self, scan: &mut Scan<'_>, r: &str, pkt: &Packet) {
        if scan.matched {
            self.matched.push(scan.line.to_string());
            let arms = r
                .split_once('{')
                .map_or("", |(_, a)| a)
                .trim_end_matches('}');
            for arm in arms.split(',') {
                if let Some((_, v)) = arm.split_once(':')
                    && matches!(self.verdict(v.trim(), pkt), Verdict::Final)
                {
                    scan.sealed = true;
                }
            }
            scan.done = true;
        }
        scan.matched = false;
        scan.rest = "";
    }

    /// `daddr`/`saddr` (`ip` is the packet's address on that side) against a set, a list
    /// or one address, maybe negated.
    fn address<'r>(&mut self, scan: &mut Scan<'r>, r: &'r str, ip: IpAddr, pkt: &Packet) {
        let (neg, r) = match r.strip_prefix("!= ") {
            Some(r) => (true, r),
            None => (false, r),
        };
        let (hit, r) = if let Some(r) = r.strip_prefix('@') {
            let (set, r) = r.split_once(' ').unwrap_or((r, ""));
            if set.starts_with("affinity-") {
                // Affinity: the client may or may not be remembered; both ways.
                if scan.matched
                    && let Some(v) = r.trim().strip_prefix("goto ")
                {
                    self.matched.push(format!("{} (if remembered)", scan.line));
                    self.run(v.trim(), pkt);
                }
                scan.matched = false;
                (false, "")
            } else {
                (self.set_has(set, &ip.to_string()).is_some(), r)
            }
        } else if let Some(r) = r.strip_prefix('{') {
            let (list, r) = r.split_once('}').unwrap_or((r, ""));
            (in_list(list, ip), r)
        } else {
            let (v, r) = r.split_once(' ').unwrap_or((r, ""));
            (in_list(v, ip), r)
        };
        scan.matched &= hit != neg;
        scan.rest = r;
    }

    /// A matched rule's action.
    fn action(&mut self, action: &str, pkt: &Packet) -> Verdict {
        if action == "jump mark-for-masquerade" {
            self.masq = true;
            return Verdict::Continue;
        }
        if let Some(dest) = action.strip_prefix("dnat to ") {
            self.outputs.push(dest.trim().to_string());
            return Verdict::Final;
        }
        if action.starts_with("update ")
            || action.starts_with("mark ")
            || action.starts_with("masquerade")
        {
            return Verdict::Continue;
        }
        self.verdict(action, pkt)
    }
}

/// A rule being matched: what is left of it, whether it still matches, and whether a
/// lookup in it gave the packet a final verdict.
struct Scan<'r> {
    rest: &'r str,
    matched: bool,
    /// A lookup in it ended the chain.
    done: bool,
    /// A lookup in it sealed the packet's fate.
    sealed: bool,
    /// The rule as the trace lists it (`CHAIN: RULE`).
    line: &'r str,
}

/// Follows a new packet as kube-proxy's nftables tests do: `filter-prerouting-pre-dnat`,
/// `nat-prerouting` (numgen maps are explored on every arm), then with the DNATed
/// destination `filter-forward` and `filter-input`. Returns the outputs (sorted set joined
/// with `, `) and whether the packet was marked for masquerade.
pub fn trace(t: &NftTable, node: &NodeSettings, pkt: Packet) -> (String, bool) {
    let (out, masq, _) = trace_rules(t, node, pkt);
    (out, masq)
}

/// [`trace`], with every rule (and verdict-map element) the packet matched, in order, as
/// `CHAIN: RULE`.
pub fn trace_rules(t: &NftTable, node: &NodeSettings, pkt: Packet) -> (String, bool, Vec<String>) {
    let mut tr = Tracer {
        t,
        node,
        outputs: Vec::new(),
        masq: false,
        depth: 0,
        matched: Vec::new(),
    };
    let finish = |tr: &Tracer<'_>| {
        let set: BTreeSet<&str> = tr.outputs.iter().map(String::as_str).collect();
        (
            set.into_iter().collect::<Vec<_>>().join(", "),
            tr.masq,
            tr.matched.clone(),
        )
    };
    if tr.run("filter-prerouting-pre-dnat", &pkt) {
        return finish(&tr);
    }
    tr.run("nat-prerouting", &pkt);
    let mut after = pkt;
    if let Some(first) = tr.outputs.first() {
        let host = match first.strip_prefix('[') {
            Some(r) => r.split(']').next().unwrap_or(""),
            None => first.rsplit_once(':').map_or(first.as_str(), |(h, _)| h),
        };
        if let Ok(ip) = host.parse() {
            after.dst = ip;
        }
    }
    if tr.run("filter-forward", &after) {
        return finish(&tr);
    }
    tr.run("filter-input", &after);
    finish(&tr)
}
