//! A packet through the rules `xlb emit` writes for one kube-proxy mode, rule by rule, with
//! the tracers the conformance tests use ([`crate::emit::trace`] for iptables rules,
//! [`crate::emit::nftables::trace_rules`] for nftables).
//!
//! The rules are those of kube-proxy's proxier of the packet's family (`xlb emit
//! --ip-family ipv4|ipv6`): ip6tables, the `ip6 kube-proxy` nftables table, IPVS's IPv6
//! virtual servers for an IPv6 packet.
//!
//! A rule that matches only some packets (`-m statistic`, `numgen`, affinity's `recent`) is
//! both taken and passed over, so the outcome is every backend the mode could pick.

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
};

use super::{Report, request::frontend_kind};
use crate::{
    emit::{
        Mode, WriterOptions, iptables, ipvs, nftables,
        restore::Tables,
        trace::{Packet, Trace, trace as trace_iptables, trace_chains},
        userspace,
    },
    model::{IpFamily, Model, NodeSettings, Protocol},
};

/// One packet for the rule tracers.
#[derive(Clone, Debug)]
pub struct Input<'a> {
    pub model: &'a Model,
    pub node: &'a NodeSettings,
    /// The writers' settings (masquerade mark, host features, IPVS scheduler).
    pub opts: &'a WriterOptions,
    pub src: IpAddr,
    /// The destination; its family picks the proxier.
    pub dst: SocketAddr,
    pub protocol: Protocol,
    /// Sent by the node's own processes (nat OUTPUT) rather than a pod (nat PREROUTING).
    pub from_node: bool,
    /// The origin and target as the user named them.
    pub from: &'a str,
    pub to: &'a str,
}

impl Input<'_> {
    fn packet(&self) -> Packet {
        Packet {
            src: self.src,
            dst: self.dst.ip(),
            dport: self.dst.port(),
            protocol: self.protocol,
        }
    }
}

/// The mode's name as `--mode` spells it.
pub fn mode_name(mode: Mode) -> &'static str {
    mode.name()
}

/// Every mode `--mode all` shows.
pub const MODES: [Mode; 4] = [Mode::Iptables, Mode::Nftables, Mode::Ipvs, Mode::Userspace];

/// Traces `input` through `mode`'s rules (those of the proxier of `input.dst`'s family).
pub fn trace(mode: Mode, input: &Input) -> Report {
    let family = IpFamily::of(input.dst.ip());
    let node = NodeSettings {
        family,
        ..input.node.clone()
    };
    let input = &Input {
        node: &node,
        ..input.clone()
    };
    let mut r = Report::new(format!(
        "xlb trace ({}): {} -> {} {}",
        mode_name(mode),
        input.from,
        input.to,
        input.protocol
    ));
    if family == IpFamily::V6 {
        r.line("proxier", proxier_words(mode));
    }
    r.line("frontend", frontend_words(input));
    match mode {
        Mode::Iptables => {
            let tables = restore(&iptables::emit(input.model, input.node, input.opts).render());
            let t = trace_iptables(&tables, input.node, input.packet());
            rules_step(&mut r, &t.matched, annotate_iptables);
            finish(&mut r, &t.outputs, t.masquerade);
        }
        Mode::Nftables => {
            let table = nftables::emit(input.model, input.node, input.opts);
            let (out, masq, matched) = nftables::trace_rules(&table, input.node, input.packet());
            rules_step(&mut r, &matched, annotate_nft);
            let outputs: Vec<String> = out
                .split(", ")
                .filter(|o| !o.is_empty())
                .map(String::from)
                .collect();
            finish(&mut r, &outputs, masq);
        }
        Mode::Ipvs => trace_ipvs(&mut r, input),
        Mode::Userspace => trace_userspace(&mut r, input),
    }
    r
}

/// kube-proxy's IPv6 proxier of `mode`, and what loads its rules.
fn proxier_words(mode: Mode) -> &'static str {
    match mode {
        Mode::Iptables => "kube-proxy's IPv6 proxier: ip6tables-restore",
        Mode::Nftables => "kube-proxy's IPv6 proxier: the ip6 kube-proxy table (nft -f)",
        Mode::Ipvs => "kube-proxy's IPv6 proxier: IPv6 virtual servers, KUBE-6-* ipsets, ip6tables",
        Mode::Userspace => "kube-proxy's IPv6 proxier: ip6tables portals",
    }
}

fn restore(payload: &str) -> Tables {
    let mut t = Tables::new();
    // The emitters' own payloads; a refusal would leave the tables empty, which the trace
    // then shows as no rule matching.
    if let Err(e) = t.apply(payload) {
        tracing::warn!("the emitted rules do not restore: {e}");
    }
    t
}

fn frontend_words(input: &Input) -> String {
    match frontend_kind(input.model, input.dst, input.protocol) {
        Some((kind, svc, port)) => format!(
            "{}/{} is the {kind} of service {svc} port {port}",
            input.dst, input.protocol
        ),
        None => format!("{}/{} is no service's frontend", input.dst, input.protocol),
    }
}

fn rules_step(r: &mut Report, matched: &[String], note: impl Fn(&str) -> &'static str) {
    let lines: Vec<String> = if matched.is_empty() {
        vec!["no rule matched".into()]
    } else {
        matched
            .iter()
            .map(|l| {
                let n = note(l);
                if n.is_empty() {
                    l.clone()
                } else {
                    format!("{l}   <- {n}")
                }
            })
            .collect()
    };
    r.step("rules", lines);
}

fn annotate_iptables(line: &str) -> &'static str {
    if line.contains("--probability") {
        "random: taken with this probability, else the next rule"
    } else if line.contains("--rcheck") {
        "affinity: taken when the client is remembered"
    } else if line.contains("KUBE-MARK-MASQ") {
        "marked for masquerade (SNAT in POSTROUTING)"
    } else {
        ""
    }
}

fn annotate_nft(line: &str) -> &'static str {
    if line.contains("numgen random") {
        "random: one arm per endpoint"
    } else if line.contains("(if remembered)") {
        "affinity"
    } else if line.contains("mark-for-masquerade") {
        "marked for masquerade (SNAT in postrouting)"
    } else {
        ""
    }
}

/// The outcome of a set of rule outputs: the backends, else refused/dropped/passed.
pub fn outcome_of(outputs: &[String]) -> String {
    let dnat: BTreeSet<&str> = outputs
        .iter()
        .map(String::as_str)
        .filter(|o| o.parse::<std::net::SocketAddr>().is_ok())
        .collect();
    if !dnat.is_empty() {
        return backends_outcome(dnat.into_iter().map(String::from).collect());
    }
    if outputs.iter().any(|o| o == "REJECT") {
        "refused".into()
    } else if outputs.iter().any(|o| o == "DROP") {
        "dropped".into()
    } else {
        "passed".into()
    }
}

/// `ip:port` alone, or `one of A, B` (sorted).
pub fn backends_outcome(mut b: Vec<String>) -> String {
    b.sort();
    b.dedup();
    match b.as_slice() {
        [one] => one.clone(),
        _ => format!("one of {}", b.join(", ")),
    }
}

fn finish(r: &mut Report, outputs: &[String], masq: bool) {
    let dnat: BTreeSet<&String> = outputs
        .iter()
        .filter(|o| o.parse::<std::net::SocketAddr>().is_ok())
        .collect();
    let mut rewrites: Vec<String> = dnat.iter().map(|d| format!("DNAT to {d}")).collect();
    if masq {
        rewrites.push("SNAT: masqueraded to the node's address (KUBE-MARK-MASQ)".into());
    }
    if rewrites.is_empty() {
        rewrites.push("none".into());
    }
    r.step("rewrite", rewrites);
    r.outcome = outcome_of(outputs);
    r.line(
        "verdict",
        match r.outcome.as_str() {
            "refused" => "REJECT: the client gets a TCP RST or ICMP port unreachable",
            "dropped" => "DROP",
            "passed" => "no service rule took it: routed as it is",
            _ => "DNAT, then routed to the backend (conntrack keeps the choice)",
        },
    );
}

fn trace_ipvs(r: &mut Report, input: &Input) {
    let st = ipvs::emit(input.model, input.node, input.opts);
    let dst = input.dst.ip();
    let mut lines = Vec::new();
    if st.dummy_addresses.contains(&dst) {
        lines.push(format!(
            "{dst} is bound on kube-ipvs0: the node takes the packet as its own, IPVS sees it in INPUT"
        ));
    }
    let entry = format!("{dst},{}:{}", input.protocol.lower(), input.dst.port());
    for (name, set) in &st.ipsets {
        if set
            .entries
            .iter()
            .any(|e| e == &entry || e.starts_with(&format!("{entry},")))
        {
            lines.push(format!("ipset {name} holds {entry}"));
        }
    }
    r.step(
        "ipsets",
        if lines.is_empty() {
            vec!["no ipset or kube-ipvs0 address holds it".into()]
        } else {
            lines
        },
    );
    let vs = st
        .virtual_servers
        .iter()
        .find(|v| v.ip == dst && v.port == input.dst.port() && v.protocol == input.protocol);
    let Some(vs) = vs else {
        r.line("virtual server", "none: IPVS leaves the packet alone");
        r.line("verdict", "no service rule took it: routed as it is");
        r.outcome = "passed".into();
        return;
    };
    let mut lines = vec![format!(
        "-A -{} {} -s {}{}",
        if input.protocol == Protocol::Udp {
            "u"
        } else {
            "t"
        },
        SocketAddr::new(vs.ip, vs.port),
        vs.scheduler,
        vs.persistent_timeout.map_or(String::new(), |t| format!(
            " -p {t}   <- affinity: persistence {t} s"
        ))
    )];
    lines.extend(vs.reals.iter().map(|rs| {
        format!(
            "  -a -r {} -m -w {}",
            SocketAddr::new(rs.ip, rs.port),
            rs.weight
        )
    }));
    r.step("virtual server", lines);
    let reals: Vec<String> = vs
        .reals
        .iter()
        .filter(|rs| rs.weight > 0)
        .map(|rs| SocketAddr::new(rs.ip, rs.port).to_string())
        .collect();
    if reals.is_empty() {
        r.line("rewrite", "none");
        r.line(
            "verdict",
            "no real server: IPVS answers ICMP port unreachable (the client sees connection refused)",
        );
        r.outcome = "refused".into();
    } else {
        r.line(
            "rewrite",
            format!(
                "IPVS masquerading (DNAT) to the scheduler's ({}) pick",
                vs.scheduler
            ),
        );
        r.line("verdict", "forwarded to a real server");
        r.outcome = backends_outcome(reals);
    }
}

fn trace_userspace(r: &mut Report, input: &Input) {
    let st = userspace::emit(input.model, input.node, userspace::PortRange::default());
    let tables = restore(&st.iptables.render());
    let chains: [&str; 2] = if input.from_node {
        ["KUBE-PORTALS-HOST", "KUBE-NODEPORT-HOST"]
    } else {
        ["KUBE-PORTALS-CONTAINER", "KUBE-NODEPORT-CONTAINER"]
    };
    let t: Trace = trace_chains(&tables, input.node, input.packet(), &chains, &[]);
    rules_step(r, &t.matched, |_| "");
    let port = t.outputs.iter().find_map(|o| {
        o.strip_prefix("REDIRECT ")
            .map(str::to_string)
            .or_else(|| o.rsplit_once(':').map(|(_, p)| p.to_string()))
    });
    let Some(pp) = port
        .and_then(|p| p.parse::<u16>().ok())
        .and_then(|p| st.ports.iter().find(|pp| pp.proxy_port == p))
    else {
        r.line("verdict", "no portal took it: routed as it is");
        r.outcome = "passed".into();
        return;
    };
    r.line(
        "rewrite",
        format!(
            "to the proxy port {} on the node (xlb proxy userspace for {})",
            pp.proxy_port, pp.service_port
        ),
    );
    if pp.backends.is_empty() {
        r.line(
            "proxy",
            "no endpoints: the proxy takes the connection and closes it (a datagram is never answered)",
        );
        r.outcome = "closed by the proxy".into();
        return;
    }
    r.line(
        "proxy",
        format!(
            "a new connection to one of {} round-robin{}; the backend sees the node as source",
            pp.backends.join(", "),
            pp.affinity_timeout
                .map_or(String::new(), |t| format!(", ClientIP affinity {t} s"))
        ),
    );
    r.line("verdict", "relayed by the proxy");
    r.outcome = backends_outcome(pp.backends.clone());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::file;

    /// A TCP packet from a pod at `src` to the service address `dst`.
    fn from_pod<'a>(
        model: &'a crate::model::Model,
        node: &'a NodeSettings,
        opts: &'a WriterOptions,
        src: &str,
        dst: &str,
    ) -> Input<'a> {
        Input {
            model,
            node,
            opts,
            src: src.parse().expect("ip"),
            dst: dst.parse().expect("addr"),
            protocol: Protocol::Tcp,
            from_node: false,
            from: "pod",
            to: "svc",
        }
    }

    const YAML: &str = "apiVersion: v1\nkind: Service\nmetadata: {namespace: d, name: web}\nspec:\n  clusterIP: 10.96.0.10\n  ports:\n  - {name: http, port: 80, protocol: TCP, targetPort: 8080}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {namespace: d, name: web-1, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports:\n- {name: http, port: 8080, protocol: TCP}\nendpoints:\n- {addresses: [\"10.244.2.2\"], conditions: {ready: true}}\n- {addresses: [\"10.244.3.2\"], conditions: {ready: true}}\n";

    #[test]
    fn every_mode_reaches_both_endpoints_and_names_its_rules() {
        let loaded = file::parse("t.yaml", YAML).expect("yaml");
        let node = NodeSettings {
            node_ips: vec!["10.0.0.1".parse().expect("ip")],
            local_addresses: vec!["10.0.0.1".parse().expect("ip")],
            ..NodeSettings::default()
        };
        let opts = WriterOptions::default();
        let input = from_pod(&loaded.model, &node, &opts, "10.244.1.2", "10.96.0.10:80");
        for mode in MODES {
            let r = trace(mode, &input);
            assert_eq!(
                r.outcome, "one of 10.244.2.2:8080, 10.244.3.2:8080",
                "{}",
                r
            );
            assert!(r.to_string().contains("ClusterIP of service d/web"), "{r}");
        }
        let missed = Input {
            dst: "10.96.0.99:80".parse().expect("addr"),
            ..input
        };
        for mode in MODES {
            assert_eq!(trace(mode, &missed).outcome, "passed");
        }
    }

    const DUAL: &str = "apiVersion: v1\nkind: Service\nmetadata: {namespace: d, name: web}\nspec:\n  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]\n  clusterIP: 10.96.0.10\n  clusterIPs: [10.96.0.10, \"fd00::10\"]\n  ports:\n  - {name: http, port: 80, protocol: TCP, targetPort: 8080}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {namespace: d, name: web-4, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports:\n- {name: http, port: 8080, protocol: TCP}\nendpoints:\n- {addresses: [\"10.244.2.2\"], conditions: {ready: true}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {namespace: d, name: web-6, labels: {kubernetes.io/service-name: web}}\naddressType: IPv6\nports:\n- {name: http, port: 8080, protocol: TCP}\nendpoints:\n- {addresses: [\"fd00:244:2::2\"], conditions: {ready: true}}\n- {addresses: [\"fd00:244:3::2\"], conditions: {ready: true}}\n";

    #[test]
    fn an_ipv6_packet_walks_the_ipv6_proxiers_rules() {
        let loaded = file::parse("t.yaml", DUAL).expect("yaml");
        // The settings say IPv4 (the default): the packet's family picks the proxier.
        let node = NodeSettings {
            node_ips: vec![
                "10.0.0.1".parse().expect("ip"),
                "fd00::1".parse().expect("ip"),
            ],
            local_addresses: vec![
                "10.0.0.1".parse().expect("ip"),
                "fd00::1".parse().expect("ip"),
            ],
            ..NodeSettings::default()
        };
        let opts = WriterOptions::default();
        let input = from_pod(
            &loaded.model,
            &node,
            &opts,
            "fd00:244:1::2",
            "[fd00::10]:80",
        );
        for mode in MODES {
            let r = trace(mode, &input);
            assert_eq!(
                r.outcome, "one of [fd00:244:2::2]:8080, [fd00:244:3::2]:8080",
                "{mode:?}\n{r}"
            );
            let text = r.to_string();
            assert!(text.contains("IPv6 proxier"), "{text}");
            assert!(text.contains("ClusterIP of service d/web"), "{text}");
        }
        let v4 = Input {
            src: "10.244.1.2".parse().expect("ip"),
            dst: "10.96.0.10:80".parse().expect("addr"),
            ..input.clone()
        };
        assert_eq!(trace(Mode::Iptables, &v4).outcome, "10.244.2.2:8080");
        let missed = Input {
            dst: "[fd00::99]:80".parse().expect("addr"),
            ..input
        };
        for mode in MODES {
            assert_eq!(trace(mode, &missed).outcome, "passed", "{mode:?}");
        }
    }

    #[test]
    fn outcomes_read_like_the_compare_report() {
        assert_eq!(outcome_of(&["REJECT".into()]), "refused");
        assert_eq!(outcome_of(&["DROP".into()]), "dropped");
        assert_eq!(outcome_of(&[]), "passed");
        assert_eq!(
            outcome_of(&["1.2.3.4:5".into(), "ACCEPT".into()]),
            "1.2.3.4:5"
        );
    }
}
