//! kube-proxy's live state on the node, one family at a time, as the node's tools print it
//! (`datapath::netfilter::read_kube_proxy_state` reads it): which proxier's state is there,
//! parsed into what the rule tracers follow, and the frontends it serves.
//!
//! * nftables mode: the `ip`/`ip6 kube-proxy` table (`nft -j list table`, JSON);
//! * iptables mode: `iptables-save`'s `nat` and `filter` tables holding `KUBE-SERVICES`;
//! * ipvs mode (the same, matching `KUBE-CLUSTER-IP` ipsets): the kernel's virtual servers
//!   (`/proc/net/ip_vs`) say where a packet goes.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
};

use super::prune::{IptablesIndex, NftIndex};
use crate::{
    datapath::netfilter::LiveText,
    emit::{
        leftovers::is_kube_proxy_chain,
        nft_json,
        nftables::NftTable,
        restore::{Tables, split_args},
        trace::understood_option,
    },
    model::{IpFamily, Protocol},
};

/// One family's kube-proxy state.
pub enum Proxier {
    Iptables {
        /// The tool that printed it (`iptables-nft-save`, …).
        tool: &'static str,
        tables: Tables,
        index: IptablesIndex,
    },
    Nftables {
        table: NftTable,
        /// Indexed once per look (`shadow::prune`).
        index: NftIndex,
    },
    /// The ipvs mode: virtual server → its real servers with weight above zero.
    Ipvs(BTreeMap<(Protocol, SocketAddr), BTreeSet<SocketAddr>>),
}

impl Proxier {
    /// The mode's name, and where it was read from.
    pub fn describe(&self) -> String {
        match self {
            Proxier::Iptables { tool, .. } => format!("iptables ({tool})"),
            Proxier::Nftables { .. } => "nftables (nft -j list table)".to_string(),
            Proxier::Ipvs(_) => "ipvs (/proc/net/ip_vs)".to_string(),
        }
    }
}

/// One family's state: the proxier found (none: kube-proxy has no state for this family),
/// and what could not be read or understood.
#[derive(Default)]
pub struct FamilyState {
    pub proxier: Option<Proxier>,
    /// Why a state that is there could not be used.
    pub errors: Vec<String>,
}

/// Parses one family's live text (and the kernel's IPVS table) into its proxier's state.
pub fn parse(family: IpFamily, text: &LiveText, ipvs: Option<&str>) -> FamilyState {
    let mut st = FamilyState::default();
    if let Some(listing) = &text.nft {
        match nft_json::parse(listing) {
            Ok(table) => {
                let index = NftIndex::new(&table);
                st.proxier = Some(Proxier::Nftables { table, index });
            }
            Err(e) => st
                .errors
                .push(format!("the {} kube-proxy table: {e}", nft_family(family))),
        }
        return st;
    }
    let Some((tool, saved)) = &text.iptables else {
        return st;
    };
    let tables = parse_save(saved);
    if is_ipvs_mode(&tables) {
        match ipvs {
            Some(t) => st.proxier = Some(Proxier::Ipvs(parse_ipvs(t, family))),
            None => st.errors.push(format!(
                "{tool}: kube-proxy's ipvs mode, but the kernel has no IPVS table (/proc/net/ip_vs): not compared"
            )),
        }
        return st;
    }
    let index = IptablesIndex::new(&tables);
    st.proxier = Some(Proxier::Iptables {
        tool,
        tables,
        index,
    });
    st
}

fn nft_family(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

/// `iptables-save` output as tables of rules (chains only as their rules name them: the
/// tracer needs no declarations, and a target it does not know stays a target).
pub fn parse_save(text: &str) -> Tables {
    let mut t = Tables::new();
    let mut table = String::new();
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('*') {
            table = name.to_string();
        } else if line.starts_with("-A ") && !table.is_empty() {
            t.append(&table, line);
        }
    }
    t
}

/// The ipvs mode's `KUBE-SERVICES` matches ipsets (`--match-set KUBE-CLUSTER-IP`).
fn is_ipvs_mode(t: &Tables) -> bool {
    t.rules("nat", "KUBE-SERVICES")
        .iter()
        .any(|r| r.contains("--match-set KUBE-CLUSTER-IP"))
}

/// `/proc/net/ip_vs`'s virtual servers of `family` and their real servers of weight > 0.
///
/// ```text
/// TCP  0A600001:0050 rr
///   -> 0A000002:0050      Masq    1      0          0
/// TCP  [2001:0db8:0000:0000:0000:0000:0000:0001]:0050 rr
/// ```
pub fn parse_ipvs(
    text: &str,
    family: IpFamily,
) -> BTreeMap<(Protocol, SocketAddr), BTreeSet<SocketAddr>> {
    let mut out: BTreeMap<(Protocol, SocketAddr), BTreeSet<SocketAddr>> = BTreeMap::new();
    let mut current = None;
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            [proto @ ("TCP" | "UDP" | "SCTP"), addr, ..] => {
                current = ipvs_addr(addr)
                    .filter(|a| family.matches(a.ip()))
                    .and_then(|a| Some((Protocol::parse(proto)?, a)));
                if let Some(k) = current {
                    out.entry(k).or_default();
                }
            }
            ["->", addr, _forward, weight, ..] => {
                let real = ipvs_addr(addr);
                let weighted = weight.parse::<u32>().is_ok_and(|w| w > 0);
                if let (Some(k), Some(real), true) = (current, real, weighted) {
                    out.entry(k).or_default().insert(real);
                }
            }
            _ => current = current.filter(|_| !line.starts_with("FWM")),
        }
    }
    out
}

/// `0A600001:0050` or `[2001:0db8:…]:0050` (hexadecimal address and port).
fn ipvs_addr(s: &str) -> Option<SocketAddr> {
    let (addr, port) = s.rsplit_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = match addr.strip_prefix('[') {
        Some(v6) => IpAddr::V6(v6.trim_end_matches(']').parse::<Ipv6Addr>().ok()?),
        None => IpAddr::V4(Ipv4Addr::from(u32::from_str_radix(addr, 16).ok()?)),
    };
    Some(SocketAddr::new(ip, port))
}

/// A frontend kube-proxy's state serves: its address (`None`: a NodePort, on the node's
/// addresses), port and protocol, and kube-proxy's name for it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LiveFrontend {
    pub addr: Option<IpAddr>,
    pub port: u16,
    pub protocol: Protocol,
    pub name: String,
}

/// The frontends `p` serves.
pub fn frontends(p: &Proxier) -> Vec<LiveFrontend> {
    match p {
        Proxier::Iptables { tables, .. } => iptables_frontends(tables),
        Proxier::Nftables { table, .. } => nft_frontends(table),
        Proxier::Ipvs(servers) => servers
            .keys()
            .map(|(protocol, a)| LiveFrontend {
                addr: Some(a.ip()),
                port: a.port(),
                protocol: *protocol,
                name: format!("IPVS {a}/{protocol}"),
            })
            .collect(),
    }
}

/// `KUBE-SERVICES` rules to a service chain (`-d VIP -p tcp --dport P -j KUBE-SVC-…`) and
/// `KUBE-NODEPORTS` ones (`-p tcp --dport P -j KUBE-EXT-…`), named by their comment.
fn iptables_frontends(t: &Tables) -> Vec<LiveFrontend> {
    let mut out = Vec::new();
    for (chain, node_port) in [("KUBE-SERVICES", false), ("KUBE-NODEPORTS", true)] {
        for rule in t.rules("nat", chain) {
            let args = split_args(rule);
            let value = |flag: &str| {
                let at = args.iter().position(|a| a == flag)?;
                args.get(at + 1).map(String::as_str)
            };
            let to_service = value("-j").is_some_and(|j| {
                ["KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-"]
                    .iter()
                    .any(|p| j.starts_with(p))
            });
            let protocol = value("-p").and_then(Protocol::parse);
            let port = value("--dport").and_then(|p| p.parse().ok());
            let addr = value("-d").and_then(|d| d.split('/').next()?.parse().ok());
            let (true, Some(protocol), Some(port)) = (to_service, protocol, port) else {
                continue;
            };
            if !node_port && addr.is_none() {
                continue;
            }
            out.push(LiveFrontend {
                addr: if node_port { None } else { addr },
                port,
                protocol,
                name: value("--comment")
                    .unwrap_or(chain)
                    .trim_matches('"')
                    .to_string(),
            });
        }
    }
    out
}

/// The `service-ips` (`ADDR . proto . port`) and `service-nodeports` (`proto . port`)
/// verdict maps' elements, named by their comment.
fn nft_frontends(t: &NftTable) -> Vec<LiveFrontend> {
    let mut out = Vec::new();
    for (map, node_port) in [("service-ips", false), ("service-nodeports", true)] {
        let Some(c) = t.sets.get(map) else { continue };
        for e in &c.elements {
            let parts: Vec<&str> = e.key.split(" . ").map(str::trim).collect();
            let (addr, proto, port) = match (node_port, parts.as_slice()) {
                (false, [a, p, n]) => (a.parse().ok(), *p, *n),
                (true, [p, n]) => (None, *p, *n),
                _ => continue,
            };
            let (Some(protocol), Ok(port)) = (Protocol::parse(proto), port.parse()) else {
                continue;
            };
            if !node_port && addr.is_none() {
                continue;
            }
            out.push(LiveFrontend {
                addr,
                port,
                protocol,
                name: e.comment.clone().unwrap_or_else(|| e.key.clone()),
            });
        }
    }
    out
}

/// kube-proxy's rules whose matches the tracer does not understand (so what they do is not
/// compared): `TABLE: RULE (OPTION, …)`, in kube-proxy's chains of `nat` and `filter`.
pub fn not_understood(p: &Proxier) -> Vec<String> {
    let Proxier::Iptables { tables, .. } = p else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for table in ["nat", "filter"] {
        for chain in tables.chains(table) {
            if !is_kube_proxy_chain(&chain) {
                continue;
            }
            for rule in tables.rules(table, &chain) {
                let args = split_args(rule);
                let unknown: Vec<&str> = args
                    .iter()
                    .skip(2)
                    .take_while(|a| *a != "-j")
                    .map(String::as_str)
                    .filter(|a| a.starts_with('-') && !understood_option(a))
                    .collect();
                if !unknown.is_empty() {
                    out.push(format!("{table}: {rule} ({})", unknown.join(", ")));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipvs_servers_are_read_per_family_with_their_weighted_real_servers() {
        let text = "IP Virtual Server version 1.2.1 (size=4096)\n\
                    Prot LocalAddress:Port Scheduler Flags\n\
                    \x20 -> RemoteAddress:Port Forward Weight ActiveConn InActConn\n\
                    TCP  0A600001:0050 rr\n\
                    \x20 -> 0A000002:1F90      Masq    1      0          0\n\
                    \x20 -> 0A000003:1F90      Masq    0      0          0\n\
                    UDP  0A60000A:0035 rr\n\
                    TCP  [fd00:0000:0000:0000:0000:0000:0000:0001]:0050 rr\n\
                    \x20 -> [fd00:0000:0000:0000:0000:0000:0000:0002]:1F90      Masq    1      0          0\n";
        let v4 = parse_ipvs(text, IpFamily::V4);
        let vip: SocketAddr = "10.96.0.1:80".parse().expect("addr");
        let real: SocketAddr = "10.0.0.2:8080".parse().expect("addr");
        assert_eq!(v4[&(Protocol::Tcp, vip)], BTreeSet::from([real]));
        assert!(v4[&(Protocol::Udp, "10.96.0.10:53".parse().expect("addr"))].is_empty());
        assert_eq!(v4.len(), 2);
        let v6 = parse_ipvs(text, IpFamily::V6);
        assert_eq!(v6.len(), 1);
        assert_eq!(
            v6.values().next().map(|s| s.len()),
            Some(1),
            "the IPv6 server's real server"
        );
    }

    #[test]
    fn saved_rules_give_the_frontends_and_what_the_tracer_does_not_understand() {
        let saved = "# Generated by iptables-nft-save\n*nat\n:KUBE-SERVICES - [0:0]\n\
            -A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment \"default/web:http cluster IP\" -m tcp --dport 80 -j KUBE-SVC-ABC\n\
            -A KUBE-NODEPORTS -p tcp -m comment --comment \"default/web:http\" -m tcp --dport 30080 -j KUBE-EXT-ABC\n\
            -A KUBE-SVC-ABC -m multiport --dports 80,81 -j KUBE-SEP-X\n\
            -A CNI-NAT -m multiport --dports 80,81 -j ACCEPT\nCOMMIT\n";
        let tables = parse_save(saved);
        let index = IptablesIndex::new(&tables);
        let p = Proxier::Iptables {
            tool: "iptables-save",
            tables,
            index,
        };
        let f = frontends(&p);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].addr, Some("10.96.0.1".parse().expect("ip")));
        assert_eq!(f[0].name, "default/web:http cluster IP");
        assert_eq!((f[1].addr, f[1].port), (None, 30080));
        let n = not_understood(&p);
        assert_eq!(n.len(), 1, "only kube-proxy's chains: {n:?}");
        assert!(n[0].ends_with("(--dports)"), "{n:?}");
    }
}
