//! Follows a new packet through iptables rules, as kube-proxy's own tests do: nat
//! `KUBE-SERVICES` first (jumps followed; a `-m statistic`/`-m recent --rcheck` rule is
//! taken *and* passed over, so every backend it could pick is collected), then, with the
//! destination DNATed when nat chose one, the filter chains `KUBE-SERVICES`,
//! `KUBE-EXTERNAL-SERVICES`, `KUBE-NODEPORTS` and `KUBE-PROXY-FIREWALL`.
//!
//! The result is the sorted set of DNAT destinations or ACCEPT/DROP/REJECT verdicts reached,
//! and whether the packet went through `KUBE-MARK-MASQ`.

use std::{collections::BTreeSet, net::IpAddr};

use super::restore::{Tables, split_args};
use crate::model::{Cidr, NodeSettings, Protocol};

/// A packet to trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub dport: u16,
    pub protocol: Protocol,
}

/// Where a packet went.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// DNAT destinations (`ip:port`) and verdicts, in the order reached.
    pub outputs: Vec<String>,
    /// The packet was sent through KUBE-MARK-MASQ.
    pub masquerade: bool,
    /// Every rule that matched, in order, as `TABLE: -A CHAIN …`.
    pub matched: Vec<String>,
}

impl Trace {
    /// Sorted, deduplicated outputs joined with `, ` (the conformance files' FLOW result).
    pub fn result(&self) -> String {
        let set: BTreeSet<&str> = self.outputs.iter().map(String::as_str).collect();
        set.into_iter().collect::<Vec<_>>().join(", ")
    }
}

struct Tracer<'a> {
    tables: &'a Tables,
    node: &'a NodeSettings,
    trace: Trace,
    depth: usize,
}

fn parse_net(s: &str) -> Option<Cidr> {
    if s.contains('/') {
        Cidr::parse_sloppy(s).ok()
    } else {
        crate::model::parse_ip(s).map(Cidr::host)
    }
}

enum Match {
    No,
    Yes,
    /// Matches some packets only (statistic, recent): take it and go on.
    Maybe,
}

/// The match options [`trace`] follows (before `-j`): a saved rule with another option is
/// one the tracer does not understand (it never matches there).
const UNDERSTOOD: [&str; 23] = [
    "!",
    "-j",
    "-m",
    "--comment",
    "--name",
    "--nfacct-name",
    "--mode",
    "--probability",
    "--seconds",
    "--rcheck",
    "--reap",
    "--set",
    "--mask",
    "--rsource",
    "-p",
    "-s",
    "-d",
    "--dport",
    "--src-type",
    "--dst-type",
    "--ctstate",
    "-i",
    "--mark",
];

/// Whether the tracer understands match option `flag` (`-d`, `--dport`, …).
pub fn understood_option(flag: &str) -> bool {
    UNDERSTOOD.contains(&flag)
}

impl Tracer<'_> {
    fn rule_matches(&self, args: &[String], pkt: &Packet) -> Match {
        let mut maybe = false;
        let mut negate = false;
        let mut i = 2; // after "-A CHAIN"
        while i < args.len() {
            let a = args[i].as_str();
            let val = args.get(i + 1).map(String::as_str).unwrap_or("");
            let mut consumed = 2;
            let ok = match a {
                "!" => {
                    negate = true;
                    i += 1;
                    continue;
                }
                "-j" => break,
                "-m" | "--comment" | "--name" | "--nfacct-name" | "--mode" | "--probability"
                | "--seconds" => {
                    if a == "--probability" {
                        maybe = true;
                    }
                    true
                }
                "--rcheck" => {
                    maybe = true;
                    consumed = 1;
                    true
                }
                // iptables-save spells affinity's `recent` out in full.
                "--mask" => true,
                "--reap" | "--set" | "--rsource" => {
                    consumed = 1;
                    true
                }
                "-p" => val.eq_ignore_ascii_case(pkt.protocol.lower()),
                "-s" => parse_net(val).is_some_and(|c| c.contains(pkt.src)),
                "-d" => parse_net(val).is_some_and(|c| c.contains(pkt.dst)),
                "--dport" => val.parse::<u16>().ok() == Some(pkt.dport),
                "--src-type" => val == "LOCAL" && self.node.is_local_address(pkt.src),
                "--dst-type" => val == "LOCAL" && self.node.is_local_address(pkt.dst),
                "--ctstate" => val.split(',').any(|s| s == "NEW"),
                "-i" | "--mark" => false,
                _ => false,
            };
            if ok == negate {
                return Match::No;
            }
            negate = false;
            i += consumed;
        }
        if maybe { Match::Maybe } else { Match::Yes }
    }

    /// Runs a chain; true when the packet hit a terminating rule.
    fn run(&mut self, table: &str, chain: &str, pkt: &Packet) -> bool {
        if self.depth > 64 {
            return false;
        }
        self.depth += 1;
        let rules = self.tables.rules(table, chain).to_vec();
        let mut terminated = false;
        for line in rules {
            let args = split_args(&line);
            let m = self.rule_matches(&args, pkt);
            if matches!(m, Match::No) {
                continue;
            }
            self.trace.matched.push(format!("{table}: {line}"));
            let target_at = args.iter().position(|a| a == "-j");
            let Some(target) = target_at.and_then(|i| args.get(i + 1)).map(String::as_str) else {
                continue;
            };
            match target {
                "KUBE-MARK-MASQ" => self.trace.masquerade = true,
                "ACCEPT" | "DROP" | "REJECT" => {
                    self.trace.outputs.push(target.to_string());
                    terminated = true;
                }
                // The userspace mode's portals: to a proxy port on the node.
                "REDIRECT" => {
                    let ports = args
                        .iter()
                        .position(|a| a == "--to-ports")
                        .and_then(|i| args.get(i + 1))
                        .cloned()
                        .unwrap_or_default();
                    self.trace.outputs.push(format!("REDIRECT {ports}"));
                    terminated = true;
                }
                "DNAT" => {
                    let dest = args
                        .iter()
                        .position(|a| a == "--to-destination")
                        .and_then(|i| args.get(i + 1))
                        .cloned()
                        .unwrap_or_default();
                    self.trace.outputs.push(dest);
                    terminated = true;
                }
                "RETURN" => break,
                other => {
                    let sub = self.run(table, other, pkt);
                    if sub && matches!(m, Match::Yes) {
                        terminated = true;
                    }
                }
            }
            if terminated {
                break;
            }
        }
        self.depth -= 1;
        terminated
    }
}

/// The destination IP of a DNAT target (`1.2.3.4:80`, `[2001:db8::1]:80`).
fn dnat_ip(dest: &str) -> Option<IpAddr> {
    let host = match dest.strip_prefix('[') {
        Some(rest) => rest.split(']').next()?,
        None => dest.rsplit_once(':').map_or(dest, |(h, _)| h),
    };
    host.parse().ok()
}

/// Traces `pkt` through `tables` (see the module docs). `node` says which addresses are
/// local (`-m addrtype --src-type/--dst-type LOCAL`).
pub fn trace(tables: &Tables, node: &NodeSettings, pkt: Packet) -> Trace {
    trace_chains(
        tables,
        node,
        pkt,
        &["KUBE-SERVICES"],
        &[
            "KUBE-SERVICES",
            "KUBE-EXTERNAL-SERVICES",
            "KUBE-NODEPORTS",
            "KUBE-PROXY-FIREWALL",
        ],
    )
}

/// [`trace`] from other chains: `nat` chains in order until one terminates, then (with the
/// destination DNATed) every `filter` chain.
pub fn trace_chains(
    tables: &Tables,
    node: &NodeSettings,
    pkt: Packet,
    nat: &[&str],
    filter: &[&str],
) -> Trace {
    let mut t = Tracer {
        tables,
        node,
        trace: Trace::default(),
        depth: 0,
    };
    for chain in nat {
        if t.run("nat", chain, &pkt) {
            break;
        }
    }
    let mut after = pkt;
    if let Some(ip) = t.trace.outputs.first().and_then(|d| dnat_ip(d)) {
        after.dst = ip;
    }
    for chain in filter {
        t.run("filter", chain, &after);
    }
    t.trace
}
