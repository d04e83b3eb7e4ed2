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

use super::{names::nft_name, options::Options};
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
fn base(t: &mut NftTable, node: &NodeSettings, opts: &Options) {
    let f = fam(node.family);
    let at = addr_type(node.family);
    let mark = &opts.mark.text;
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

fn write_port(t: &mut NftTable, pv: &PortView<'_>, node: &NodeSettings) {
    let f = fam(node.family);
    let spn = pv.name.as_str();
    let proto = pv.protocol().lower();
    let port = pv.port.port;
    let base = port_base(pv);
    let cluster_chain = nft_name("service", &base);
    let local_chain = nft_name("local", &base);
    let ext_chain = nft_name("external", &base);
    let fw_chain = nft_name("firewall", &base);
    let cat = &pv.categorized;
    let has_endpoints = cat.has_any;
    let internal_local = pv.internal_policy_local();
    let external_local = pv.external_policy_local();
    let internal_chain = if internal_local {
        &local_chain
    } else {
        &cluster_chain
    };
    let external_policy_chain = if external_local {
        &local_chain
    } else {
        &cluster_chain
    };
    let has_internal = has_endpoints
        && !(if internal_local {
            &cat.local
        } else {
            &cat.cluster
        })
        .is_empty();
    let has_external = has_endpoints
        && !(if external_local {
            &cat.local
        } else {
            &cat.cluster
        })
        .is_empty();
    let uses_cluster_chain = !cat.cluster.is_empty() && pv.uses_cluster_endpoints();
    let uses_local_chain = !cat.local.is_empty() && pv.uses_local_endpoints();
    let uses_ext = has_endpoints && pv.externally_accessible();
    let uses_fw = has_endpoints && !pv.load_balancer_ips.is_empty() && !pv.source_ranges.is_empty();
    let no_ep_verdict = |has: bool| -> Option<String> {
        if has {
            None
        } else if !has_endpoints {
            Some("goto reject-chain".into())
        } else {
            Some("drop".into())
        }
    };
    let cip = pv.cluster_ip;
    let key = |ip: IpAddr| format!("{ip} . {proto} . {port}");

    t.element("cluster-ips", cip.to_string(), None, None);
    if has_internal {
        t.element(
            "service-ips",
            key(cip),
            None,
            Some(format!("goto {internal_chain}")),
        );
    } else if let Some(v) = no_ep_verdict(false) {
        t.element("no-endpoint-services", key(cip), Some(spn), Some(v));
    }
    let ext_target = format!("goto {ext_chain}");
    for ip in &pv.external_ips {
        if has_endpoints {
            t.element("service-ips", key(*ip), None, Some(ext_target.clone()));
        }
        if let Some(v) = no_ep_verdict(has_external) {
            t.element("no-endpoint-services", key(*ip), Some(spn), Some(v));
        }
    }
    for ip in &pv.load_balancer_ips {
        if has_endpoints {
            t.element("service-ips", key(*ip), None, Some(ext_target.clone()));
        }
        if uses_fw {
            t.element(
                "firewall-ips",
                key(*ip),
                None,
                Some(format!("goto {fw_chain}")),
            );
        }
        if let Some(v) = no_ep_verdict(has_external) {
            t.element("no-endpoint-services", key(*ip), Some(spn), Some(v));
        }
    }
    if let Some(np) = pv.node_port {
        let k = format!("{proto} . {np}");
        if has_endpoints {
            t.element(
                "service-nodeports",
                k.clone(),
                None,
                Some(ext_target.clone()),
            );
        }
        if let Some(v) = no_ep_verdict(has_external) {
            t.element("no-endpoint-nodeports", k, Some(spn), Some(v));
        }
    }

    if has_internal {
        if node.masquerade_all {
            t.rule(
                internal_chain,
                format!("{f} daddr {cip} jump mark-for-masquerade"),
            );
        } else if let Some(m) = detector_match(&node.detector, f, false) {
            t.rule(
                internal_chain,
                format!("{f} daddr {cip} {m} jump mark-for-masquerade"),
            );
        }
    }
    if uses_ext {
        t.chain(&ext_chain, "");
        if !external_local {
            t.rule(&ext_chain, "jump mark-for-masquerade");
        } else {
            if let Some(m) = detector_match(&node.detector, f, true) {
                t.rule(
                    &ext_chain,
                    format!("{m} goto {cluster_chain} comment \"short-circuit pod traffic\""),
                );
            }
            t.rule(
                &ext_chain,
                "fib saddr type local jump mark-for-masquerade comment \"masquerade local traffic\"",
            );
            t.rule(
                &ext_chain,
                format!("fib saddr type local goto {cluster_chain} comment \"short-circuit local traffic\""),
            );
        }
        if has_external {
            t.rule(&ext_chain, format!("goto {external_policy_chain}"));
        }
    }
    if uses_fw {
        let mut allowed: Vec<String> = pv.source_ranges.iter().map(|c| c.to_string()).collect();
        if node
            .node_ip()
            .is_some_and(|ip| pv.source_ranges.iter().any(|c| c.contains(ip)))
        {
            allowed.extend(pv.load_balancer_ips.iter().map(|ip| ip.to_string()));
        }
        t.rule(
            &fw_chain,
            format!("{f} saddr != {{ {} }} drop", allowed.join(", ")),
        );
    }
    let affinity = pv.affinity_timeout();
    let policy_chain = |t: &mut NftTable, chain: &str, eps: &[EndpointView]| {
        t.chain(chain, "");
        if affinity.is_some() {
            for ep in eps {
                let b = ep_base(pv, ep);
                t.rule(
                    chain,
                    format!(
                        "{f} saddr @{} goto {}",
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
    };
    if uses_cluster_chain {
        policy_chain(t, &cluster_chain, &cat.cluster);
    }
    if uses_local_chain {
        policy_chain(t, &local_chain, &cat.local);
    }
    for ep in &cat.all_reachable {
        let b = ep_base(pv, ep);
        let chain = nft_name("endpoint", &b);
        t.rule(
            &chain,
            format!("{f} saddr {} jump mark-for-masquerade", ep.ip),
        );
        if let Some(timeout) = affinity {
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
            format!("meta l4proto {proto} dnat to {}", dnat_dest(ep)),
        );
    }
}

/// The table a fresh kube-proxy writes for `model` on `node`.
pub fn emit(model: &Model, node: &NodeSettings, opts: &Options) -> NftTable {
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
        opts: &Options,
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
    Continue,
    Stop,
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
            (Some("goto"), Some(c)) | (Some("jump"), Some(c)) => {
                let stop = self.run(c, pkt);
                if stop || v.starts_with("goto") {
                    Verdict::Stop
                } else {
                    Verdict::Continue
                }
            }
            (Some("drop"), _) => {
                self.outputs.push("DROP".into());
                Verdict::Stop
            }
            (Some("reject"), _) => {
                self.outputs.push("REJECT".into());
                Verdict::Stop
            }
            (Some("return"), _) => Verdict::Stop,
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
        let f = fam(self.t.family);
        let mut done = false;
        for rule in c.rules.clone() {
            let rule = rule.split(" comment \"").next().unwrap_or("").to_string();
            let mut rest = rule.as_str();
            let mut matched = true;
            // Leading matches.
            loop {
                rest = rest.trim_start();
                if let Some(r) = rest.strip_prefix("ct state new ") {
                    rest = r;
                } else if let Some(r) = rest.strip_prefix("fib saddr type local ") {
                    matched &= self.node.is_local_address(pkt.src);
                    rest = r;
                } else if let Some(r) = rest.strip_prefix("fib daddr type local ") {
                    matched &= self.node.is_local_address(pkt.dst);
                    rest = r;
                } else if let Some(r) =
                    rest.strip_prefix(&format!("{f} daddr . meta l4proto . th dport vmap @"))
                {
                    let key = format!("{} . {} . {}", pkt.dst, proto_name(pkt.protocol), pkt.dport);
                    if matched
                        && let Some(v) = self.set_has(r.trim(), &key).and_then(|e| e.value.clone())
                        && matches!(self.verdict(&v, pkt), Verdict::Stop)
                    {
                        done = true;
                    }
                    matched = false;
                    rest = "";
                } else if let Some(r) = rest.strip_prefix("meta l4proto . th dport vmap @") {
                    let key = format!("{} . {}", proto_name(pkt.protocol), pkt.dport);
                    if matched
                        && let Some(v) = self.set_has(r.trim(), &key).and_then(|e| e.value.clone())
                        && matches!(self.verdict(&v, pkt), Verdict::Stop)
                    {
                        done = true;
                    }
                    matched = false;
                    rest = "";
                } else if let Some(r) = rest.strip_prefix("numgen random mod ") {
                    if matched {
                        let arms = r
                            .split_once('{')
                            .map_or("", |(_, a)| a)
                            .trim_end_matches('}');
                        for arm in arms.split(',') {
                            if let Some((_, v)) = arm.split_once(':') {
                                self.verdict(v.trim(), pkt);
                            }
                        }
                        done = true;
                    }
                    matched = false;
                    rest = "";
                } else if let Some(r) = rest
                    .strip_prefix(&format!("{f} daddr "))
                    .map(|r| (r, true))
                    .or_else(|| {
                        rest.strip_prefix(&format!("{f} saddr "))
                            .map(|r| (r, false))
                    })
                {
                    let (r, is_dst) = r;
                    let ip = if is_dst { pkt.dst } else { pkt.src };
                    let (neg, r) = match r.strip_prefix("!= ") {
                        Some(r) => (true, r),
                        None => (false, r),
                    };
                    let (hit, r) = if let Some(r) = r.strip_prefix('@') {
                        let (set, r) = r.split_once(' ').unwrap_or((r, ""));
                        if set.starts_with("affinity-") {
                            // Affinity: the client may or may not be remembered; both ways.
                            if matched && let Some(v) = r.trim().strip_prefix("goto ") {
                                self.run(v.trim(), pkt);
                            }
                            matched = false;
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
                    matched &= hit != neg;
                    rest = r;
                } else if let Some(r) = rest.strip_prefix("meta l4proto ") {
                    let (p, r) = r.split_once(' ').unwrap_or((r, ""));
                    matched &= p == proto_name(pkt.protocol);
                    rest = r;
                } else {
                    break;
                }
            }
            if !matched || rest.is_empty() {
                if done {
                    break;
                }
                continue;
            }
            let action = rest.trim();
            if action == "jump mark-for-masquerade" {
                self.masq = true;
                continue;
            }
            if let Some(dest) = action.strip_prefix("dnat to ") {
                self.outputs.push(dest.trim().to_string());
                done = true;
                break;
            }
            if action.starts_with("update ")
                || action.starts_with("mark ")
                || action.starts_with("masquerade")
            {
                continue;
            }
            if matches!(self.verdict(action, pkt), Verdict::Stop) {
                done = true;
                break;
            }
        }
        self.depth -= 1;
        done
    }
}

/// Follows a new packet as kube-proxy's nftables tests do: `filter-prerouting-pre-dnat`,
/// `nat-prerouting` (numgen maps are explored on every arm), then with the DNATed
/// destination `filter-forward` and `filter-input`. Returns the outputs (sorted set joined
/// with `, `) and whether the packet was marked for masquerade.
pub fn trace(t: &NftTable, node: &NodeSettings, pkt: Packet) -> (String, bool) {
    let mut tr = Tracer {
        t,
        node,
        outputs: Vec::new(),
        masq: false,
        depth: 0,
    };
    let finish = |tr: &Tracer<'_>| {
        let set: BTreeSet<&str> = tr.outputs.iter().map(String::as_str).collect();
        (set.into_iter().collect::<Vec<_>>().join(", "), tr.masq)
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
