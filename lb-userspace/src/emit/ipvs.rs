//! kube-proxy's ipvs mode (kube-proxy's `pkg/proxy/ipvs`): IPVS virtual and real servers, the ipsets its
//! iptables rules match on, the addresses of the `kube-ipvs0` dummy interface, and the
//! iptables rules the mode still needs.
//!
//! Renderings: [`IpvsState::render_ipvsadm`] (`ipvsadm-restore` input),
//! [`IpvsState::render_ipset`] (`ipset restore` input), [`IpvsState::render_addresses`]
//! (`ip -batch` input for `kube-ipvs0`) and [`IpvsState::iptables`] (`iptables-restore`
//! input). The iptables rule set follows kube-proxy's ipvs proxier; only the jumps that the conformance
//! cases assert were checked against kube-proxy.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    net::IpAddr,
};

use super::{
    IpvsOptions, WriterOptions,
    rules::{self, Payload, Table, hostport},
};
use crate::model::{
    IpFamily, Model, NodeSettings, Protocol,
    select::{self, PortView},
};

/// An IPVS real server.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RealServer {
    pub ip: IpAddr,
    pub port: u16,
    pub weight: u32,
}

/// An IPVS virtual server and its real servers.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct VirtualServer {
    pub protocol: Protocol,
    pub ip: IpAddr,
    pub port: u16,
    pub scheduler: String,
    /// Persistence timeout (ClientIP session affinity).
    pub persistent_timeout: Option<u32>,
    pub reals: Vec<RealServer>,
}

impl VirtualServer {
    fn service_flag(&self) -> &'static str {
        match self.protocol {
            Protocol::Tcp => "-t",
            Protocol::Udp => "-u",
            Protocol::Sctp => "--sctp-service",
        }
    }
}

/// An ipset: its type and entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IpSet {
    /// `hash:ip,port`, `bitmap:port`, …
    pub kind: &'static str,
    pub entries: BTreeSet<String>,
}

/// Everything ipvs mode programs on a node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IpvsState {
    pub family: IpFamily,
    pub virtual_servers: Vec<VirtualServer>,
    /// By full set name (`KUBE-CLUSTER-IP`, or `KUBE-6-CLUSTER-IP` for IPv6).
    pub ipsets: BTreeMap<String, IpSet>,
    /// Addresses bound to `kube-ipvs0`.
    pub dummy_addresses: BTreeSet<IpAddr>,
    /// The iptables rules ipvs mode needs.
    pub iptables: Payload,
}

/// The ipsets kube-proxy's ipvs mode creates, with their types (IPv4 names).
pub const IPSETS: [(&str, &str); 17] = [
    ("KUBE-LOOP-BACK", "hash:ip,port,ip"),
    ("KUBE-CLUSTER-IP", "hash:ip,port"),
    ("KUBE-EXTERNAL-IP", "hash:ip,port"),
    ("KUBE-EXTERNAL-IP-LOCAL", "hash:ip,port"),
    ("KUBE-LOAD-BALANCER", "hash:ip,port"),
    ("KUBE-LOAD-BALANCER-FW", "hash:ip,port"),
    ("KUBE-LOAD-BALANCER-LOCAL", "hash:ip,port"),
    ("KUBE-LOAD-BALANCER-SOURCE-IP", "hash:ip,port,ip"),
    ("KUBE-LOAD-BALANCER-SOURCE-CIDR", "hash:ip,port,net"),
    ("KUBE-NODE-PORT-TCP", "bitmap:port"),
    ("KUBE-NODE-PORT-LOCAL-TCP", "bitmap:port"),
    ("KUBE-NODE-PORT-UDP", "bitmap:port"),
    ("KUBE-NODE-PORT-LOCAL-UDP", "bitmap:port"),
    ("KUBE-NODE-PORT-SCTP-HASH", "hash:ip,port"),
    ("KUBE-NODE-PORT-LOCAL-SCTP-HASH", "hash:ip,port"),
    ("KUBE-HEALTH-CHECK-NODE-PORT", "bitmap:port"),
    ("KUBE-IPVS-IPS", "hash:ip"),
];

/// The set's name for a family (`KUBE-6-…` on IPv6).
pub fn set_name(family: IpFamily, base: &str) -> String {
    match family {
        IpFamily::V4 => base.to_string(),
        IpFamily::V6 => base.replacen("KUBE-", "KUBE-6-", 1),
    }
}

impl IpvsState {
    fn add(&mut self, base: &str, entry: String) {
        let name = set_name(self.family, base);
        if let Some(s) = self.ipsets.get_mut(&name) {
            s.entries.insert(entry);
        }
    }

    fn set(&self, base: &str) -> Option<&IpSet> {
        self.ipsets.get(&set_name(self.family, base))
    }

    /// `ipvsadm-restore` input.
    pub fn render_ipvsadm(&self) -> String {
        let mut out = String::new();
        for vs in &self.virtual_servers {
            let addr = hostport(vs.ip, vs.port);
            let flag = vs.service_flag();
            let _ = write!(out, "-A {flag} {addr} -s {}", vs.scheduler);
            if let Some(t) = vs.persistent_timeout {
                let _ = write!(out, " -p {t}");
            }
            out.push('\n');
            for rs in &vs.reals {
                let _ = writeln!(
                    out,
                    "-a {flag} {addr} -r {} -m -w {}",
                    hostport(rs.ip, rs.port),
                    rs.weight
                );
            }
        }
        out
    }

    /// `ipset restore` input (`-exist`, so it can be applied repeatedly).
    pub fn render_ipset(&self) -> String {
        let inet = match self.family {
            IpFamily::V4 => "inet",
            IpFamily::V6 => "inet6",
        };
        let mut out = String::new();
        for (name, s) in &self.ipsets {
            if s.kind == "bitmap:port" {
                let _ = writeln!(out, "create {name} {} range 0-65535 -exist", s.kind);
            } else {
                let _ = writeln!(
                    out,
                    "create {name} {} family {inet} hashsize 1024 maxelem 65536 -exist",
                    s.kind
                );
            }
            for e in &s.entries {
                let _ = writeln!(out, "add {name} {e} -exist");
            }
        }
        out
    }

    /// `ip -batch` input binding every service address to `kube-ipvs0`.
    pub fn render_addresses(&self) -> String {
        let mut out = String::from("link add kube-ipvs0 type dummy\n");
        for ip in &self.dummy_addresses {
            let len = if ip.is_ipv4() { 32 } else { 128 };
            let _ = writeln!(out, "address add {ip}/{len} dev kube-ipvs0");
        }
        out
    }
}

/// The node IPs NodePort virtual servers listen on: local addresses of the family, without
/// loopback and link-local ones, narrowed by nodePortAddresses when it is set.
pub fn node_port_ips(node: &NodeSettings) -> Vec<IpAddr> {
    let link_local = |ip: &IpAddr| match ip {
        IpAddr::V4(v) => v.is_link_local(),
        IpAddr::V6(v) => (v.segments()[0] & 0xffc0) == 0xfe80,
    };
    let mut ips: Vec<IpAddr> = node
        .local_addresses
        .iter()
        .chain(node.node_ips.iter())
        .copied()
        .filter(|ip| node.family.matches(*ip) && !ip.is_loopback() && !link_local(ip))
        .filter(|ip| {
            node.node_port_addresses.is_empty()
                || node.node_port_addresses.iter().any(|c| c.contains(*ip))
        })
        .collect();
    ips.sort();
    ips.dedup();
    ips
}

/// Computes the ipvs-mode state for `model` on `node`.
pub fn emit(model: &Model, node: &NodeSettings, opts: &WriterOptions) -> IpvsState {
    let mut st = IpvsState {
        family: node.family,
        ..IpvsState::default()
    };
    for (base, kind) in IPSETS {
        st.ipsets.insert(
            set_name(node.family, base),
            IpSet {
                kind,
                entries: BTreeSet::new(),
            },
        );
    }
    let np_ips = node_port_ips(node);
    for pv in select::service_ports(model, node) {
        add_port(&mut st, &pv, node, &opts.ipvs, &np_ips);
    }
    let addrs: Vec<IpAddr> = st.dummy_addresses.iter().copied().collect();
    for ip in addrs {
        st.add("KUBE-IPVS-IPS", ip.to_string());
    }
    st.virtual_servers.sort();
    st.iptables = iptables_rules(&st, node, opts);
    st
}

/// One service port's virtual servers, addresses and ipset entries.
fn add_port(
    st: &mut IpvsState,
    pv: &PortView<'_>,
    node: &NodeSettings,
    opts: &IpvsOptions,
    np_ips: &[IpAddr],
) {
    let p = pv.protocol().lower();
    let port = pv.port.port;
    let cat = &pv.categorized;
    let reals = |local: bool| -> Vec<RealServer> {
        let eps = if local { &cat.local } else { &cat.cluster };
        eps.iter()
            .map(|e| RealServer {
                ip: e.ip,
                port: e.port,
                weight: 1,
            })
            .collect()
    };
    let internal = reals(pv.internal_policy_local());
    let external = reals(pv.external_policy_local());
    let vs = |ip: IpAddr, port: u16, reals: &Vec<RealServer>| VirtualServer {
        protocol: pv.protocol(),
        ip,
        port,
        scheduler: opts.scheduler.clone(),
        persistent_timeout: pv.affinity_timeout(),
        reals: reals.clone(),
    };
    let entry = |ip: IpAddr| format!("{ip},{p}:{port}");
    let local = pv.external_policy_local();

    st.virtual_servers.push(vs(pv.cluster_ip, port, &internal));
    st.dummy_addresses.insert(pv.cluster_ip);
    st.add("KUBE-CLUSTER-IP", entry(pv.cluster_ip));
    for e in pv.endpoints.iter().filter(|e| e.local) {
        st.add(
            "KUBE-LOOP-BACK",
            format!("{},{p}:{},{}", e.ip, e.port, e.ip),
        );
    }
    for ip in &pv.external_ips {
        st.virtual_servers.push(vs(*ip, port, &external));
        st.dummy_addresses.insert(*ip);
        st.add("KUBE-EXTERNAL-IP", entry(*ip));
        if local {
            st.add("KUBE-EXTERNAL-IP-LOCAL", entry(*ip));
        }
    }
    for ip in &pv.load_balancer_ips {
        st.virtual_servers.push(vs(*ip, port, &external));
        st.dummy_addresses.insert(*ip);
        add_load_balancer_ip(st, pv, node, &entry(*ip), *ip);
    }
    if let Some(np) = pv.node_port {
        for ip in np_ips {
            st.virtual_servers.push(vs(*ip, np, &external));
        }
        add_node_port(st, pv.protocol(), np, local, np_ips);
    }
    if let Some(hc) = pv.health_check_node_port {
        st.add("KUBE-HEALTH-CHECK-NODE-PORT", hc.to_string());
    }
}

/// A LoadBalancer IP's ipset entries (`entry` is `IP,PROTO:PORT`), with its source ranges.
fn add_load_balancer_ip(
    st: &mut IpvsState,
    pv: &PortView<'_>,
    node: &NodeSettings,
    entry: &str,
    ip: IpAddr,
) {
    st.add("KUBE-LOAD-BALANCER", entry.to_string());
    if pv.external_policy_local() {
        st.add("KUBE-LOAD-BALANCER-LOCAL", entry.to_string());
    }
    if pv.source_ranges.is_empty() {
        return;
    }
    st.add("KUBE-LOAD-BALANCER-FW", entry.to_string());
    for c in &pv.source_ranges {
        st.add("KUBE-LOAD-BALANCER-SOURCE-CIDR", format!("{entry},{c}"));
    }
    if node
        .node_ip()
        .is_some_and(|n| pv.source_ranges.iter().any(|c| c.contains(n)))
    {
        st.add("KUBE-LOAD-BALANCER-SOURCE-IP", format!("{entry},{ip}"));
    }
}

/// A NodePort's ipset entries: a port bitmap for TCP and UDP, `IP,sctp:PORT` for SCTP.
fn add_node_port(st: &mut IpvsState, proto: Protocol, np: u16, local: bool, np_ips: &[IpAddr]) {
    match proto {
        Protocol::Tcp | Protocol::Udp => {
            let up = proto.lower().to_uppercase();
            st.add(&format!("KUBE-NODE-PORT-{up}"), np.to_string());
            if local {
                st.add(&format!("KUBE-NODE-PORT-LOCAL-{up}"), np.to_string());
            }
        }
        Protocol::Sctp => {
            for ip in np_ips {
                let e = format!("{ip},sctp:{np}");
                st.add("KUBE-NODE-PORT-SCTP-HASH", e.clone());
                if local {
                    st.add("KUBE-NODE-PORT-LOCAL-SCTP-HASH", e);
                }
            }
        }
    }
}

/// Names and tests the ipsets of one [`IpvsState`].
struct Sets<'a>(&'a IpvsState);

impl Sets<'_> {
    /// The set's name in the state's family.
    fn n(&self, base: &str) -> String {
        set_name(self.0.family, base)
    }

    /// Whether the set has entries.
    fn has(&self, base: &str) -> bool {
        self.0.set(base).is_some_and(|s| !s.entries.is_empty())
    }
}

/// The iptables rules of ipvs mode (kube-proxy's `pkg/proxy/ipvs`).
fn iptables_rules(st: &IpvsState, node: &NodeSettings, opts: &WriterOptions) -> Payload {
    let sets = Sets(st);
    let mut p = Payload::default();
    for c in [
        "KUBE-SERVICES",
        "KUBE-POSTROUTING",
        "KUBE-NODE-PORT",
        "KUBE-LOAD-BALANCER",
        "KUBE-MARK-MASQ",
    ] {
        p.nat.chain(c);
    }
    for c in [
        "KUBE-FORWARD",
        "KUBE-NODE-PORT",
        "KUBE-PROXY-FIREWALL",
        "KUBE-SOURCE-RANGES-FIREWALL",
        "KUBE-IPVS-FILTER",
    ] {
        p.filter.chain(c);
    }
    services_rules(&sets, node, &mut p.nat);
    node_port_rules(&sets, &mut p.nat);
    let hairpin = "\"Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose\"";
    let loop_back = sets.n("KUBE-LOOP-BACK");
    p.nat.line(
        "KUBE-POSTROUTING",
        &format!(
            "-m comment --comment {hairpin} -m set --match-set {loop_back} dst,dst,src -j MASQUERADE"
        ),
    );
    rules::masquerade(&mut p.nat, &opts.mark.text, opts.host.random_fully);
    filter_rules(&sets, &mut p.filter);
    let invalid_drop = (!opts.host.tcp_be_liberal).then_some(false);
    rules::forward(&mut p.filter, &opts.mark.text, invalid_drop);
    p
}

/// nat KUBE-SERVICES (and KUBE-LOAD-BALANCER): masquerade what needs it, accept service
/// addresses (IPVS takes them from there), send local destinations to KUBE-NODE-PORT.
fn services_rules(sets: &Sets<'_>, node: &NodeSettings, nat: &mut Table) {
    const SVC: &str = "KUBE-SERVICES";
    let cluster_ip = sets.n("KUBE-CLUSTER-IP");
    if sets.0.family == IpFamily::V4 {
        nat.line(SVC, "-s 127.0.0.0/8 -j RETURN");
    }
    let masq = format!(
        "-m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set {cluster_ip}"
    );
    if node.masquerade_all {
        nat.line(SVC, &format!("{masq} dst,dst -j KUBE-MARK-MASQ"));
    } else if let Some(not_local) = node.detector.if_not_local() {
        let not_local = not_local.join(" ");
        nat.line(
            SVC,
            &format!("{masq} dst,dst {not_local} -j KUBE-MARK-MASQ"),
        );
    } else {
        // No way to tell pod traffic: masquerade node-originated traffic whose source is a
        // service address (the VIP on kube-ipvs0 picked as source).
        nat.line(SVC, &format!("{masq} src,dst -j KUBE-MARK-MASQ"));
    }
    let lb = sets.n("KUBE-LOAD-BALANCER");
    if sets.has("KUBE-LOAD-BALANCER") {
        nat.line(
            SVC,
            &format!("-m set --match-set {lb} dst,dst -j KUBE-LOAD-BALANCER"),
        );
        if sets.has("KUBE-LOAD-BALANCER-LOCAL") {
            let local = sets.n("KUBE-LOAD-BALANCER-LOCAL");
            nat.line(
                "KUBE-LOAD-BALANCER",
                &format!("-m set --match-set {local} dst,dst -j RETURN"),
            );
        }
        nat.line("KUBE-LOAD-BALANCER", "-j KUBE-MARK-MASQ");
    }
    if sets.has("KUBE-EXTERNAL-IP") {
        let ext = sets.n("KUBE-EXTERNAL-IP");
        let c = "\"Kubernetes service external ip + port for masquerade and filter purpose\"";
        nat.line(
            SVC,
            &format!("-m comment --comment {c} -m set --match-set {ext} dst,dst -j KUBE-MARK-MASQ"),
        );
        nat.line(SVC, &format!("-m set --match-set {ext} dst,dst -j ACCEPT"));
    }
    nat.line(SVC, "-m addrtype --dst-type LOCAL -j KUBE-NODE-PORT");
    nat.line(
        SVC,
        &format!("-m set --match-set {cluster_ip} dst,dst -j ACCEPT"),
    );
    if sets.has("KUBE-LOAD-BALANCER") {
        nat.line(SVC, &format!("-m set --match-set {lb} dst,dst -j ACCEPT"));
    }
}

/// nat KUBE-NODE-PORT: Local-policy NodePorts return unmasqueraded, the rest are marked.
fn node_port_rules(sets: &Sets<'_>, nat: &mut Table) {
    for (local, all, m) in [
        ("KUBE-NODE-PORT-LOCAL-TCP", "KUBE-NODE-PORT-TCP", "dst"),
        ("KUBE-NODE-PORT-LOCAL-UDP", "KUBE-NODE-PORT-UDP", "dst"),
        (
            "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
            "KUBE-NODE-PORT-SCTP-HASH",
            "dst,dst",
        ),
    ] {
        if sets.has(local) {
            let set = sets.n(local);
            nat.line(
                "KUBE-NODE-PORT",
                &format!("-m set --match-set {set} {m} -j RETURN"),
            );
        }
        if sets.has(all) {
            let set = sets.n(all);
            nat.line(
                "KUBE-NODE-PORT",
                &format!("-m set --match-set {set} {m} -j KUBE-MARK-MASQ"),
            );
        }
    }
}

/// filter: health-check node ports, LoadBalancer source ranges, and KUBE-IPVS-FILTER
/// (reject new connections to addresses on kube-ipvs0 that are not a service).
fn filter_rules(sets: &Sets<'_>, filter: &mut Table) {
    let hc = sets.n("KUBE-HEALTH-CHECK-NODE-PORT");
    filter.line(
        "KUBE-NODE-PORT",
        &format!(
            "-m comment --comment \"Kubernetes health check node port\" -m set --match-set {hc} dst -j ACCEPT"
        ),
    );
    if sets.has("KUBE-LOAD-BALANCER-FW") {
        const SRF: &str = "KUBE-SOURCE-RANGES-FIREWALL";
        let fw = sets.n("KUBE-LOAD-BALANCER-FW");
        filter.line(
            "KUBE-PROXY-FIREWALL",
            &format!("-m set --match-set {fw} dst,dst -j {SRF}"),
        );
        let cidrs = sets.n("KUBE-LOAD-BALANCER-SOURCE-CIDR");
        filter.line(
            SRF,
            &format!("-m set --match-set {cidrs} dst,dst,src -j RETURN"),
        );
        if sets.has("KUBE-LOAD-BALANCER-SOURCE-IP") {
            let ips = sets.n("KUBE-LOAD-BALANCER-SOURCE-IP");
            filter.line(
                SRF,
                &format!("-m set --match-set {ips} dst,dst,src -j RETURN"),
            );
        }
        filter.line(SRF, "-j DROP");
    }
    for s in [
        "KUBE-LOAD-BALANCER",
        "KUBE-CLUSTER-IP",
        "KUBE-EXTERNAL-IP",
        "KUBE-EXTERNAL-IP-LOCAL",
    ] {
        let set = sets.n(s);
        filter.line(
            "KUBE-IPVS-FILTER",
            &format!("-m set --match-set {set} dst,dst -j RETURN"),
        );
    }
    filter.line(
        "KUBE-IPVS-FILTER",
        &format!("-m set --match-set {hc} dst -j RETURN"),
    );
    let ips = sets.n("KUBE-IPVS-IPS");
    filter.line(
        "KUBE-IPVS-FILTER",
        &format!("-m conntrack --ctstate NEW -m set --match-set {ips} dst -j REJECT"),
    );
}
