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
    fmt::Write as _,
    time::Duration,
};

use super::{
    Jump,
    names::{endpoint_chain, probability, service_port_hash},
};
use crate::model::{
    EndpointSlice, IpFamily, Model, NodeSettings, Service, ServiceRef,
    select::{self, EndpointView, PortView},
};

/// nat and filter chains kube-proxy always declares.
pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
pub const KUBE_EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
pub const KUBE_FORWARD: &str = "KUBE-FORWARD";
pub const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
pub const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
pub const KUBE_FIREWALL: &str = "KUBE-FIREWALL";
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";

const fn jump(
    table: &'static str,
    chain: &'static str,
    matches: &'static [&'static str],
    target: &'static str,
) -> Jump {
    Jump {
        table,
        chain,
        append: false,
        matches,
        target,
    }
}

/// The jumps kube-proxy prepends to the built-in chains, in its order
/// (`iptablesJumpChains`: extra arguments, then the comment).
pub const JUMPS: [Jump; 12] = [
    jump(
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
    jump(
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
    jump(
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
    jump(
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
    jump(
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
    jump(
        "filter",
        "FORWARD",
        &["-m", "comment", "--comment", "kubernetes forwarding rules"],
        KUBE_FORWARD,
    ),
    jump(
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
    jump(
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
    jump(
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
    jump(
        "nat",
        "OUTPUT",
        &["-m", "comment", "--comment", "kubernetes service portals"],
        KUBE_SERVICES,
    ),
    jump(
        "nat",
        "PREROUTING",
        &["-m", "comment", "--comment", "kubernetes service portals"],
        KUBE_SERVICES,
    ),
    jump(
        "nat",
        "POSTROUTING",
        &["-m", "comment", "--comment", "kubernetes postrouting rules"],
        KUBE_POSTROUTING,
    ),
];

/// The kubelet's jumps into KUBE-FIREWALL, which kube-proxy ensures too (only where the
/// payload declares that chain: with localhost NodePorts on IPv4).
pub const FIREWALL_JUMPS: [Jump; 2] = [
    jump("filter", "INPUT", &[], KUBE_FIREWALL),
    jump("filter", "OUTPUT", &[], KUBE_FIREWALL),
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

/// One table of a restore payload.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    /// Chains declared (`:NAME - [0:0]`), in order.
    pub chains: Vec<String>,
    /// Rule lines (`-A CHAIN …`), in order.
    pub rules: Vec<String>,
    /// Chains deleted (`-X NAME`).
    pub deleted: Vec<String>,
}

impl Table {
    fn chain(&mut self, name: &str) {
        self.chains.push(name.to_string());
    }

    fn rule<S: AsRef<str>>(&mut self, chain: &str, args: &[S]) {
        let mut line = format!("-A {chain}");
        for a in args {
            line.push(' ');
            line.push_str(a.as_ref());
        }
        self.rules.push(line);
    }

    fn render(&self, name: &str, out: &mut String) {
        let _ = writeln!(out, "*{name}");
        for c in &self.chains {
            let _ = writeln!(out, ":{c} - [0:0]");
        }
        for r in &self.rules {
            let _ = writeln!(out, "{r}");
        }
        for c in &self.deleted {
            let _ = writeln!(out, "-X {c}");
        }
        out.push_str("COMMIT\n");
    }

    /// The rule lines of `chain`, in order.
    pub fn chain_rules(&self, chain: &str) -> Vec<&str> {
        let prefix = format!("-A {chain} ");
        let bare = format!("-A {chain}");
        self.rules
            .iter()
            .filter(|r| r.starts_with(&prefix) || **r == bare)
            .map(String::as_str)
            .collect()
    }
}

/// An `iptables-restore --noflush` payload: filter, then nat.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Payload {
    pub filter: Table,
    pub nat: Table,
}

impl Payload {
    /// The restore text, exactly as kube-proxy feeds it to `iptables-restore --noflush`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.filter.render("filter", &mut out);
        self.nat.render("nat", &mut out);
        out
    }
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

fn quoted(s: &str) -> String {
    format!("\"{s}\"")
}

/// The comment argument: quoted when it has spaces (kube-proxy quotes multi-word comments).
fn comment(s: &str) -> [String; 4] {
    let text = if s.contains(' ') {
        quoted(s)
    } else {
        s.to_string()
    };
    ["-m".into(), "comment".into(), "--comment".into(), text]
}

struct Generated {
    payload: Payload,
    /// Every nat per-service chain that should exist after this sync.
    active: BTreeSet<String>,
}

/// Builds the payload. `scope` decides which services' own chains are written; every other
/// part is always regenerated.
fn generate(model: &Model, node: &NodeSettings, scope: Scope<'_>) -> Generated {
    let mark = &node.mark.text;
    let v4 = node.family == IpFamily::V4;
    let large = select::total_endpoints(model, node.family) > node.large_cluster_threshold;
    let mut filter = Table::default();
    let mut nat = Table::default();
    for c in [
        KUBE_SERVICES,
        KUBE_EXTERNAL_SERVICES,
        KUBE_FORWARD,
        KUBE_NODEPORTS,
        KUBE_PROXY_FIREWALL,
    ] {
        filter.chain(c);
    }
    let localhost_fw = v4 && node.localhost_node_ports;
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
    nat.rule(
        KUBE_POSTROUTING,
        &[
            "-m",
            "mark",
            "!",
            "--mark",
            &format!("{mark}/{mark}"),
            "-j",
            "RETURN",
        ],
    );
    nat.rule(KUBE_POSTROUTING, &["-j", "MARK", "--xor-mark", mark]);
    let mut masq: Vec<String> = comment("kubernetes service traffic requiring SNAT").into();
    masq.extend(["-j".into(), "MASQUERADE".into()]);
    if node.host.random_fully {
        masq.push("--random-fully".into());
    }
    nat.rule(KUBE_POSTROUTING, &masq);
    nat.rule(KUBE_MARK_MASQ, &["-j", "MARK", "--or-mark", mark]);
    if localhost_fw {
        let mut r: Vec<String> = comment("block incoming localnet connections").into();
        r.extend(
            [
                "-d",
                "127.0.0.0/8",
                "!",
                "-s",
                "127.0.0.0/8",
                "-m",
                "conntrack",
                "!",
                "--ctstate",
                "RELATED,ESTABLISHED,DNAT",
                "-j",
                "DROP",
            ]
            .map(String::from),
        );
        filter.rule(KUBE_FIREWALL, &r);
    }

    let mut active = BTreeSet::new();
    let mut skipped = Table::default();
    for pv in select::service_ports(model, node) {
        let write = scope.writes(&pv.service.id);
        write_service_port(
            &pv,
            node,
            large,
            &mut filter,
            &mut nat,
            &mut skipped,
            write,
            &mut active,
        );
    }

    // The last rule of nat KUBE-SERVICES: local destinations go on to KUBE-NODEPORTS.
    let np_comment =
        comment("kubernetes service nodeports; NOTE: this must be the last rule in this chain");
    match node.node_port_ips() {
        None => {
            let mut r: Vec<String> = np_comment.into();
            r.extend(["-m", "addrtype", "--dst-type", "LOCAL"].map(String::from));
            if !v4 {
                r.extend(["!", "-d", "::1/128"].map(String::from));
            } else if !node.localhost_node_ports {
                r.extend(["!", "-d", "127.0.0.0/8"].map(String::from));
            }
            r.extend(["-j".into(), KUBE_NODEPORTS.into()]);
            nat.rule(KUBE_SERVICES, &r);
        }
        Some(ips) => {
            for ip in ips {
                if ip.is_loopback() && (!v4 || !node.localhost_node_ports) {
                    continue;
                }
                let mut r: Vec<String> = np_comment.clone().into();
                r.extend([
                    "-d".into(),
                    ip.to_string(),
                    "-j".into(),
                    KUBE_NODEPORTS.into(),
                ]);
                nat.rule(KUBE_SERVICES, &r);
            }
        }
    }

    // filter KUBE-FORWARD, after every per-service filter rule.
    if !node.host.tcp_be_liberal {
        let mut r: Vec<String> = ["-m", "conntrack", "--ctstate", "INVALID"]
            .map(String::from)
            .into();
        if node.host.nfacct_invalid_dropped {
            r.extend(
                [
                    "-m",
                    "nfacct",
                    "--nfacct-name",
                    "ct_state_invalid_dropped_pkts",
                ]
                .map(String::from),
            );
        }
        r.extend(["-j".into(), "DROP".into()]);
        filter.rule(KUBE_FORWARD, &r);
    }
    let mut r: Vec<String> = comment("kubernetes forwarding rules").into();
    r.extend([
        "-m".into(),
        "mark".into(),
        "--mark".into(),
        format!("{mark}/{mark}"),
        "-j".into(),
        "ACCEPT".into(),
    ]);
    filter.rule(KUBE_FORWARD, &r);
    let mut r: Vec<String> = comment("kubernetes forwarding conntrack rule").into();
    r.extend(
        [
            "-m",
            "conntrack",
            "--ctstate",
            "RELATED,ESTABLISHED",
            "-j",
            "ACCEPT",
        ]
        .map(String::from),
    );
    filter.rule(KUBE_FORWARD, &r);

    Generated {
        payload: Payload { filter, nat },
        active,
    }
}

/// `-m comment --comment C -m P -p P -d IP --dport PORT`.
fn dest_match(c: &str, proto: &str, ip: &str, port: u16) -> Vec<String> {
    let mut v: Vec<String> = comment(c).into();
    v.extend([
        "-m".into(),
        proto.into(),
        "-p".into(),
        proto.into(),
        "-d".into(),
        ip.into(),
        "--dport".into(),
        port.to_string(),
    ]);
    v
}

fn with_target(mut args: Vec<String>, target: &str) -> Vec<String> {
    args.push("-j".into());
    args.push(target.into());
    args
}

#[allow(clippy::too_many_arguments)]
fn write_service_port(
    pv: &PortView<'_>,
    node: &NodeSettings,
    large: bool,
    filter: &mut Table,
    nat_real: &mut Table,
    skipped: &mut Table,
    write: bool,
    active: &mut BTreeSet<String>,
) {
    let spn = pv.name.as_str();
    let proto = pv.protocol().lower();
    let port = pv.port.port;
    let hash = service_port_hash(spn, pv.protocol());
    let svc_chain = format!("KUBE-SVC-{hash}");
    let svl_chain = format!("KUBE-SVL-{hash}");
    let ext_chain = format!("KUBE-EXT-{hash}");
    let fw_chain = format!("KUBE-FW-{hash}");
    let cat = &pv.categorized;
    let cluster_eps = &cat.cluster;
    let local_eps = &cat.local;
    let has_endpoints = cat.has_any;
    let internal_local = pv.internal_policy_local();
    let external_local = pv.external_policy_local();
    let internal_chain = if internal_local {
        &svl_chain
    } else {
        &svc_chain
    };
    let external_policy_chain = if external_local {
        &svl_chain
    } else {
        &svc_chain
    };
    let has_internal = has_endpoints
        && !(if internal_local {
            local_eps
        } else {
            cluster_eps
        })
        .is_empty();
    let has_external = has_endpoints
        && !(if external_local {
            local_eps
        } else {
            cluster_eps
        })
        .is_empty();
    let uses_cluster_chain = !cluster_eps.is_empty() && pv.uses_cluster_endpoints();
    let uses_local_chain = !local_eps.is_empty() && pv.uses_local_endpoints();
    let uses_ext = has_endpoints && pv.externally_accessible();
    let uses_fw = has_endpoints && !pv.load_balancer_ips.is_empty() && !pv.source_ranges.is_empty();
    let lb_target = if uses_fw { &fw_chain } else { &ext_chain };

    let (int_target, int_comment) = if !has_endpoints {
        ("REJECT", format!("{spn} has no endpoints"))
    } else {
        ("DROP", format!("{spn} has no local endpoints"))
    };
    let (ext_target, ext_comment) = if !has_endpoints {
        ("REJECT", format!("{spn} has no endpoints"))
    } else {
        ("DROP", format!("{spn} has no local endpoints"))
    };

    // Rules in the shared chains: always written.
    let cip = pv.cluster_ip.to_string();
    if has_internal {
        nat_real.rule(
            KUBE_SERVICES,
            &with_target(
                dest_match(&format!("{spn} cluster IP"), proto, &cip, port),
                internal_chain,
            ),
        );
    } else {
        filter.rule(
            KUBE_SERVICES,
            &with_target(dest_match(&int_comment, proto, &cip, port), int_target),
        );
    }
    for ip in &pv.external_ips {
        let ip = ip.to_string();
        if has_endpoints {
            nat_real.rule(
                KUBE_SERVICES,
                &with_target(
                    dest_match(&format!("{spn} external IP"), proto, &ip, port),
                    &ext_chain,
                ),
            );
        }
        if !has_external {
            filter.rule(
                KUBE_EXTERNAL_SERVICES,
                &with_target(dest_match(&ext_comment, proto, &ip, port), ext_target),
            );
        }
    }
    for ip in &pv.load_balancer_ips {
        let ip = ip.to_string();
        if has_endpoints {
            nat_real.rule(
                KUBE_SERVICES,
                &with_target(
                    dest_match(&format!("{spn} loadbalancer IP"), proto, &ip, port),
                    lb_target,
                ),
            );
        }
        if uses_fw {
            filter.rule(
                KUBE_PROXY_FIREWALL,
                &with_target(
                    dest_match(
                        &format!("{spn} traffic not accepted by {fw_chain}"),
                        proto,
                        &ip,
                        port,
                    ),
                    "DROP",
                ),
            );
        }
    }
    if !has_external {
        for ip in &pv.load_balancer_ips {
            filter.rule(
                KUBE_EXTERNAL_SERVICES,
                &with_target(
                    dest_match(&ext_comment, proto, &ip.to_string(), port),
                    ext_target,
                ),
            );
        }
    }
    if let Some(np) = pv.node_port {
        let np = np.to_string();
        if has_endpoints {
            let base: Vec<String> = comment(spn)
                .into_iter()
                .chain(["-m", proto, "-p", proto].map(String::from))
                .collect();
            if node.family == IpFamily::V4
                && node.localhost_node_ports
                && node.host.nfacct_localhost_nodeports
            {
                let mut r = base.clone();
                r.extend([
                    "-d".into(),
                    "127.0.0.0/8".into(),
                    "--dport".into(),
                    np.clone(),
                ]);
                r.extend(
                    [
                        "-m",
                        "nfacct",
                        "--nfacct-name",
                        "localhost_nps_accepted_pkts",
                    ]
                    .map(String::from),
                );
                nat_real.rule(KUBE_NODEPORTS, &with_target(r, &ext_chain));
            }
            let mut r = base;
            r.extend(["--dport".into(), np.clone()]);
            nat_real.rule(KUBE_NODEPORTS, &with_target(r, &ext_chain));
        }
        if !has_external {
            let mut r: Vec<String> = comment(&ext_comment).into();
            r.extend(
                [
                    "-m",
                    "addrtype",
                    "--dst-type",
                    "LOCAL",
                    "-m",
                    proto,
                    "-p",
                    proto,
                    "--dport",
                ]
                .map(String::from),
            );
            r.push(np);
            filter.rule(KUBE_EXTERNAL_SERVICES, &with_target(r, ext_target));
        }
    }
    if let Some(hc) = pv.health_check_node_port {
        let mut r: Vec<String> = comment(&format!("{spn} health check node port")).into();
        r.extend(["-m", "tcp", "-p", "tcp", "--dport"].map(String::from));
        r.push(hc.to_string());
        filter.rule(KUBE_NODEPORTS, &with_target(r, "ACCEPT"));
    }

    // The service's own chains: written only when it changed (or on a full sync), but
    // always counted as active.
    let nat = if write { nat_real } else { skipped };
    let ep_comment = |c: String| -> Vec<String> {
        if large {
            Vec::new()
        } else {
            comment(&c).into()
        }
    };

    if has_internal {
        let args = dest_match(&format!("{spn} cluster IP"), proto, &cip, port);
        if node.masquerade_all {
            nat.rule(internal_chain, &with_target(args, KUBE_MARK_MASQ));
        } else if let Some(not_local) = node.detector.if_not_local() {
            let mut r = args;
            r.extend(not_local);
            nat.rule(internal_chain, &with_target(r, KUBE_MARK_MASQ));
        }
    }
    if uses_ext {
        nat.chain(&ext_chain);
        active.insert(ext_chain.clone());
        if !external_local {
            let r: Vec<String> = comment(&format!(
                "masquerade traffic for {spn} external destinations"
            ))
            .into();
            nat.rule(&ext_chain, &with_target(r, KUBE_MARK_MASQ));
        } else {
            if let Some(local) = node.detector.if_local() {
                let mut r: Vec<String> =
                    comment(&format!("pod traffic for {spn} external destinations")).into();
                r.extend(local);
                nat.rule(&ext_chain, &with_target(r, &svc_chain));
            }
            let mut r: Vec<String> = comment(&format!(
                "masquerade LOCAL traffic for {spn} external destinations"
            ))
            .into();
            r.extend(["-m", "addrtype", "--src-type", "LOCAL"].map(String::from));
            nat.rule(&ext_chain, &with_target(r, KUBE_MARK_MASQ));
            let mut r: Vec<String> = comment(&format!(
                "route LOCAL traffic for {spn} external destinations"
            ))
            .into();
            r.extend(["-m", "addrtype", "--src-type", "LOCAL"].map(String::from));
            nat.rule(&ext_chain, &with_target(r, &svc_chain));
        }
        if has_external {
            nat.rule(&ext_chain, &["-j", external_policy_chain.as_str()]);
        }
    }
    if uses_fw {
        nat.chain(&fw_chain);
        active.insert(fw_chain.clone());
        let base: Vec<String> = comment(&format!("{spn} loadbalancer IP")).into();
        let mut allow_from_node = false;
        for cidr in &pv.source_ranges {
            let mut r = base.clone();
            r.extend(["-s".into(), cidr.to_string()]);
            nat.rule(&fw_chain, &with_target(r, &ext_chain));
            if node.node_ip().is_some_and(|ip| cidr.contains(ip)) {
                allow_from_node = true;
            }
        }
        if allow_from_node {
            for ip in &pv.load_balancer_ips {
                let mut r = base.clone();
                r.extend(["-s".into(), ip.to_string()]);
                nat.rule(&fw_chain, &with_target(r, &ext_chain));
            }
        }
        let r: Vec<String> = comment(&format!(
            "other traffic to {spn} will be dropped by KUBE-PROXY-FIREWALL"
        ))
        .into();
        nat.rule(&fw_chain, &r);
    }
    let affinity = pv.affinity_timeout();
    let mut policy_chain = |chain: &str, eps: &[EndpointView], nat: &mut Table| {
        nat.chain(chain);
        active.insert(chain.to_string());
        if let Some(timeout) = affinity {
            for ep in eps {
                let sep = endpoint_chain(spn, pv.protocol(), ep);
                let mut r = ep_comment(format!("{spn} -> {ep}"));
                r.extend([
                    "-m".into(),
                    "recent".into(),
                    "--name".into(),
                    sep.clone(),
                    "--rcheck".into(),
                    "--seconds".into(),
                    timeout.to_string(),
                    "--reap".into(),
                ]);
                nat.rule(chain, &with_target(r, &sep));
            }
        }
        let n = eps.len();
        for (i, ep) in eps.iter().enumerate() {
            let sep = endpoint_chain(spn, pv.protocol(), ep);
            let mut r = ep_comment(format!("{spn} -> {ep}"));
            if i + 1 < n {
                r.extend(
                    ["-m", "statistic", "--mode", "random", "--probability"].map(String::from),
                );
                r.push(probability(n - i));
            }
            nat.rule(chain, &with_target(r, &sep));
        }
    };
    if uses_cluster_chain {
        policy_chain(&svc_chain, cluster_eps, nat);
    }
    if uses_local_chain {
        policy_chain(&svl_chain, local_eps, nat);
    }
    for ep in &cat.all_reachable {
        let sep = endpoint_chain(spn, pv.protocol(), ep);
        nat.chain(&sep);
        active.insert(sep.clone());
        let c = ep_comment(spn.to_string());
        let mut r = c.clone();
        r.extend(["-s".into(), ep.ip.to_string()]);
        nat.rule(&sep, &with_target(r, KUBE_MARK_MASQ));
        let mut r = c;
        if affinity.is_some() {
            r.extend([
                "-m".into(),
                "recent".into(),
                "--name".into(),
                sep.clone(),
                "--set".into(),
            ]);
        }
        r.extend(["-m", proto, "-p", proto, "-j", "DNAT", "--to-destination"].map(String::from));
        r.push(ep.to_string());
        nat.rule(&sep, &r);
    }
}

/// The payload of a full sync on a node without kube-proxy chains: kube-proxy's first sync.
pub fn emit(model: &Model, node: &NodeSettings) -> Payload {
    generate(model, node, Scope::Full).payload
}

/// What kube-proxy remembers of a service between syncs, to tell whether it changed.
type Snapshot = (Option<Service>, Option<BTreeMap<String, EndpointSlice>>);

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
        } = generate(model, node, scope);
        let large = select::total_endpoints(model, node.family) > node.large_cluster_threshold;
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
