//! kube-proxy's leftovers in this network namespace's netfilter tables, found and removed
//! with the node's own tools (`iptables-save`/`iptables-restore --noflush` of both
//! families and both backends, `nft`, `ipset`, `ip`, `ipvsadm`), as `kube-proxy --cleanup`
//! removes them, in its order: its chains and the jumps into them, the ipvs mode's virtual
//! servers (all of them, as kube-proxy flushes them), `kube-ipvs0` and ipsets, its nftables
//! tables. What is kube-proxy's is `emit::leftovers`' call; everything else is kept. A step
//! that fails does not stop the others.

use std::{
    io::Write as _,
    process::{Command, Stdio},
};

use thiserror::Error;

use crate::{
    emit::leftovers::{self, TableLeftovers},
    model::IpFamily,
};

/// A tool that failed, named with what it said.
#[derive(Debug, Error)]
pub enum NetfilterError {
    #[error("{tool} failed: {message}")]
    Tool { tool: String, message: String },
}

/// One iptables flavour: its save and restore commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Flavour {
    save: &'static str,
    restore: &'static str,
}

/// The flavours tried, in order: the nft and legacy backends by name where the node has
/// both (kube-proxy's image picks one, either may hold its rules), else the plain tools.
const FLAVOURS: [[Flavour; 3]; 2] = [
    [
        Flavour {
            save: "iptables-nft-save",
            restore: "iptables-nft-restore",
        },
        Flavour {
            save: "iptables-legacy-save",
            restore: "iptables-legacy-restore",
        },
        Flavour {
            save: "iptables-save",
            restore: "iptables-restore",
        },
    ],
    [
        Flavour {
            save: "ip6tables-nft-save",
            restore: "ip6tables-nft-restore",
        },
        Flavour {
            save: "ip6tables-legacy-save",
            restore: "ip6tables-legacy-restore",
        },
        Flavour {
            save: "ip6tables-save",
            restore: "ip6tables-restore",
        },
    ],
];

/// kube-proxy's leftovers on this node.
#[derive(Debug, Default)]
pub struct KubeProxyLeftovers {
    /// Per iptables tool (`iptables-nft-save`, …): its tables' leftovers.
    iptables: Vec<(Flavour, Vec<TableLeftovers>)>,
    /// `ip kube-proxy`, `ip6 kube-proxy`.
    pub nft_tables: Vec<String>,
    /// The ipvs mode's dummy interface is there.
    pub ipvs_link: bool,
    /// The kernel has IPVS virtual servers (`/proc/net/ip_vs` lists some).
    pub ipvs_servers: bool,
    /// The ipvs mode's ipsets that exist.
    pub ipsets: Vec<String>,
}

impl KubeProxyLeftovers {
    pub fn is_empty(&self) -> bool {
        self.iptables.is_empty()
            && self.nft_tables.is_empty()
            && !self.ipvs_link
            && !self.ipvs_servers
            && self.ipsets.is_empty()
    }

    /// One line per thing found: `iptables-nft-save nat: 3 jumps, 12 chains`, …
    pub fn describe(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (f, tables) in &self.iptables {
            for t in tables {
                out.push(format!(
                    "{} table {}: {} jumps, {} chains",
                    f.save.trim_end_matches("-save"),
                    t.table,
                    t.jumps.len(),
                    t.chains.len()
                ));
            }
        }
        for t in &self.nft_tables {
            out.push(format!("nftables table {t}"));
        }
        if self.ipvs_servers {
            out.push("IPVS virtual servers".to_string());
        }
        if self.ipvs_link {
            out.push("the ipvs mode's kube-ipvs0 interface".to_string());
        }
        if !self.ipsets.is_empty() {
            out.push(format!("ipsets {}", self.ipsets.join(", ")));
        }
        out
    }

    /// The chains found, `table/chain`, for tests and logs.
    pub fn chains(&self) -> Vec<String> {
        self.iptables
            .iter()
            .flat_map(|(_, ts)| ts)
            .flat_map(|t| t.chains.iter().map(move |c| format!("{}/{c}", t.table)))
            .collect()
    }
}

/// The `FAMILY NAME` of every nftables table `nft -j list tables [FAMILY]` lists (`family`
/// narrows it), or only kube-proxy's (`family` `None`).
fn nft_tables(family: Option<&str>) -> Result<Vec<String>, NetfilterError> {
    let args: Vec<&str> = ["-j", "list", "tables"].into_iter().chain(family).collect();
    let json = run("nft", &args, None)?;
    let tables = match family {
        None => leftovers::nft_tables(&json),
        Some(_) => crate::emit::nft_json::tables(&json),
    };
    tables.map_err(|e| NetfilterError::Tool {
        tool: format!("nft {}", args.join(" ")),
        message: e.to_string(),
    })
}

/// Whether `tool` can be run here.
fn exists(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn run(tool: &str, args: &[&str], input: Option<&str>) -> Result<String, NetfilterError> {
    let err = |message: String| NetfilterError::Tool {
        tool: format!("{tool} {}", args.join(" ")),
        message,
    };
    let mut child = Command::new(tool)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| err(e.to_string()))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| err(e.to_string()))?;
    }
    let out = child.wait_with_output().map_err(|e| err(e.to_string()))?;
    if !out.status.success() {
        return Err(err(String::from_utf8_lossy(&out.stderr).trim().to_string()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The flavours of one family this node has: the named backends where either exists, else
/// the plain tools.
fn flavours(family: &[Flavour; 3]) -> Vec<Flavour> {
    let named: Vec<Flavour> = family[..2]
        .iter()
        .copied()
        .filter(|f| exists(f.save))
        .collect();
    if !named.is_empty() {
        return named;
    }
    family[2..]
        .iter()
        .copied()
        .filter(|f| exists(f.save))
        .collect()
}

/// Finds kube-proxy's leftovers in this namespace. A tool the node lacks is skipped (a
/// node without ip6tables has no IPv6 rules of kube-proxy's).
pub fn find_kube_proxy() -> Result<KubeProxyLeftovers, NetfilterError> {
    let mut found = KubeProxyLeftovers::default();
    for family in &FLAVOURS {
        for f in flavours(family) {
            let tables = leftovers::of_save(&run(f.save, &[], None)?);
            if !tables.is_empty() {
                found.iptables.push((f, tables));
            }
        }
    }
    if exists("nft") {
        found.nft_tables = nft_tables(None)?;
    }
    found.ipvs_link = crate::datapath::netif::ifindex("kube-ipvs0").is_some();
    found.ipvs_servers = std::fs::read_to_string("/proc/net/ip_vs").is_ok_and(|t| {
        t.lines().any(|l| {
            l.starts_with("TCP")
                || l.starts_with("UDP")
                || l.starts_with("SCTP")
                || l.starts_with("FWM")
        })
    });
    if exists("ipset") {
        let names = run("ipset", &["list", "-n"], None)?;
        found.ipsets = names
            .lines()
            .map(str::trim)
            .filter(|n| leftovers::IPSETS.contains(n))
            .map(str::to_string)
            .collect();
    }
    Ok(found)
}

/// kube-proxy's live state of one family as the node's tools print it (shadow mode reads
/// it; nothing is changed).
#[derive(Debug, Default)]
pub struct LiveText {
    /// The `iptables-save` (or `ip6tables-save`) flavour whose output holds kube-proxy's
    /// `KUBE-SERVICES` chain, and that output.
    pub iptables: Option<(&'static str, String)>,
    /// `nft -j list table ip kube-proxy` (or `ip6`, libnftables' JSON), when the table
    /// exists.
    pub nft: Option<String>,
}

/// Reads kube-proxy's live state of `family`: the saved rules
/// of the first flavour that has kube-proxy's chains, and its nftables table. A tool that
/// fails is named in the errors; the rest is still read.
pub fn read_kube_proxy_state(family: IpFamily) -> (LiveText, Vec<NetfilterError>) {
    let v6 = family == IpFamily::V6;
    let mut live = LiveText::default();
    let mut errors = Vec::new();
    for f in flavours(&FLAVOURS[usize::from(v6)]) {
        match run(f.save, &[], None) {
            Ok(text) if text.contains(":KUBE-SERVICES ") => {
                live.iptables = Some((f.save, text));
                break;
            }
            Ok(_) => {}
            Err(e) => errors.push(e),
        }
    }
    if exists("nft") {
        let name = if v6 {
            "ip6 kube-proxy"
        } else {
            "ip kube-proxy"
        };
        let tables = nft_tables(None).unwrap_or_else(|e| {
            errors.push(e);
            Vec::new()
        });
        if tables.iter().any(|t| t == name) {
            let args: Vec<&str> = ["-j", "list", "table"]
                .into_iter()
                .chain(name.split_whitespace())
                .collect();
            match run("nft", &args, None) {
                Ok(text) => live.nft = Some(text),
                Err(e) => errors.push(e),
            }
        }
    }
    (live, errors)
}

/// The kernel's IPVS table (`/proc/net/ip_vs`, IPv4 and IPv6 virtual servers); `None`
/// where the kernel has no IPVS.
pub fn read_ipvs() -> Option<String> {
    std::fs::read_to_string("/proc/net/ip_vs").ok()
}

/// Removes what [`find_kube_proxy`] found: every table's jumps and chains in one
/// `iptables-restore --noflush` transaction per tool and table, the IPVS servers, the dummy
/// interface, the ipsets, the nftables tables. Errors are collected: one that fails does
/// not keep the rest.
pub fn remove_kube_proxy(found: &KubeProxyLeftovers) -> Vec<NetfilterError> {
    let mut errors = Vec::new();
    for (f, tables) in &found.iptables {
        for t in tables {
            if let Err(e) = run(f.restore, &["--noflush"], Some(&t.restore_input())) {
                errors.push(e);
            }
        }
    }
    if found.ipvs_servers
        && let Err(e) = run("ipvsadm", &["-C"], None)
    {
        errors.push(e);
    }
    if found.ipvs_link
        && let Err(e) = run("ip", &["link", "delete", "kube-ipvs0"], None)
    {
        errors.push(e);
    }
    for set in &found.ipsets {
        if let Err(e) = run("ipset", &["destroy", set], None) {
            errors.push(e);
        }
    }
    for t in &found.nft_tables {
        let args: Vec<&str> = ["delete", "table"]
            .into_iter()
            .chain(t.split_whitespace())
            .collect();
        if let Err(e) = run("nft", &args, None) {
            errors.push(e);
        }
    }
    errors
}

/// The nftables table of NAT chains (`inet xlb-keep-nat`) a takeover leaves while the
/// node's own connections still ride the kernel's NAT: the kernel translates a flow from
/// its conntrack entry only while some NAT chain registers the NAT hooks and some rule
/// needs conntrack in that family (a `ct` expression, a NAT target), and kube-proxy's
/// rules may have been the only ones (its nftables table; its ip6tables rules on a node
/// where nothing else tracks IPv6). Each chain's one rule, `ct state new`, holds
/// conntrack for both families; it changes no packet.
pub const KEEP_NAT_TABLE: &str = "xlb-keep-nat";

/// Makes sure the kernel's NAT hooks stay registered (see [`KEEP_NAT_TABLE`]); idempotent.
pub fn keep_nat_hooks() -> Result<(), NetfilterError> {
    // Flushed first: a rerun adds no second rule.
    let script = format!(
        "table inet {KEEP_NAT_TABLE} {{ }}\nflush table inet {KEEP_NAT_TABLE}\ntable inet {KEEP_NAT_TABLE} {{\n  chain prerouting {{ type nat hook prerouting priority dstnat ; ct state new ; }}\n  chain output {{ type nat hook output priority -100 ; ct state new ; }}\n  chain input {{ type nat hook input priority 100 ; ct state new ; }}\n  chain postrouting {{ type nat hook postrouting priority srcnat ; ct state new ; }}\n}}\n"
    );
    run("nft", &["-f", "-"], Some(&script)).map(|_| ())
}

/// Removes [`KEEP_NAT_TABLE`]; a table already gone (or a node without `nft`) is not an
/// error.
pub fn release_nat_hooks() -> Result<(), NetfilterError> {
    if !exists("nft") {
        return Ok(());
    }
    if !nft_tables(Some("inet"))?.contains(&format!("inet {KEEP_NAT_TABLE}")) {
        return Ok(());
    }
    run("nft", &["delete", "table", "inet", KEEP_NAT_TABLE], None).map(|_| ())
}

/// The nftables table that keeps a hand-back's window untracked (`inet xlb-hand-back`).
pub const HAND_BACK_TABLE: &str = "xlb-hand-back";

/// One direction of a flow as netfilter sees it while xlb translates it: protocol, source,
/// destination (one family).
pub type SeenTuple = (u8, std::net::SocketAddr, std::net::SocketAddr);

/// While it lives, conntrack ignores packets of `tuples` (a raw-priority `notrack` in
/// table `inet xlb-hand-back`): packets xlb still translates during a hand-back would
/// otherwise be new flows to netfilter, clashing with the NATed entries written for them
/// (the kernel then remaps their ports, and the backend resets them). Dropped: the table
/// goes.
pub struct Untracked(());

/// The nft element of `t` (`saddr . proto . sport . daddr . dport`).
fn element((p, s, d): &SeenTuple) -> String {
    format!(
        "{} . {p} . {} . {} . {}",
        s.ip(),
        s.port(),
        d.ip(),
        d.port()
    )
}

impl Untracked {
    pub fn new(tuples: &[SeenTuple]) -> Result<Self, NetfilterError> {
        let t = HAND_BACK_TABLE;
        let mut script = format!(
            "table inet {t} {{\n  set flows4 {{ type ipv4_addr . inet_proto . inet_service . ipv4_addr . inet_service ; }}\n  set flows6 {{ type ipv6_addr . inet_proto . inet_service . ipv6_addr . inet_service ; }}\n  chain prerouting {{\n    type filter hook prerouting priority raw ;\n    ip saddr . meta l4proto . th sport . ip daddr . th dport @flows4 notrack\n    ip6 saddr . meta l4proto . th sport . ip6 daddr . th dport @flows6 notrack\n  }}\n}}\n"
        );
        let (v4, v6): (Vec<&SeenTuple>, Vec<&SeenTuple>) =
            tuples.iter().partition(|(_, s, _)| s.is_ipv4());
        for (set, tuples) in [("flows4", v4), ("flows6", v6)] {
            for chunk in tuples.chunks(1000) {
                let elements: Vec<String> = chunk.iter().map(|t| element(t)).collect();
                script.push_str(&format!(
                    "add element inet {t} {set} {{ {} }}\n",
                    elements.join(", ")
                ));
            }
        }
        let _ = run("nft", &["delete", "table", "inet", t], None);
        run("nft", &["-f", "-"], Some(&script))?;
        Ok(Self(()))
    }
}

impl Drop for Untracked {
    fn drop(&mut self) {
        if let Err(e) = run("nft", &["delete", "table", "inet", HAND_BACK_TABLE], None) {
            tracing::warn!("the hand-back's notrack table stays: {e}");
        }
    }
}
