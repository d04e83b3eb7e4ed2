//! The part of a node's rule set one frontend's packet can meet, so that tracing every
//! frontend costs what its own rules cost and not the whole set each time (at 10,000
//! services kube-proxy's `KUBE-SERVICES` has over 10,000 rules and its nftables maps as
//! many elements).
//!
//! iptables: each chain's rules are indexed once by what they require of the packet (an
//! exact destination address, else a destination port); a frontend's subset keeps, in
//! order, the rules that may match its packet and every chain they reach. nftables: the
//! maps' and big sets' elements are indexed once by the address (else the port) they name;
//! a frontend's subset holds the base chains, every chain reachable from them and the sets
//! and maps those name, maps and big sets narrowed to the elements naming the packet's
//! address (or, naming no address, its port).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
};

use crate::emit::{
    nftables::{Collection, Element, NftTable},
    restore::{Tables, jump_target, split_args},
};

/// What a rule requires of the packet, for the index.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Need {
    Dst(IpAddr),
    Dport(u16),
    Nothing,
}

/// The requirement an iptables rule's arguments state (`-d ADDR[/32|/128]`, else
/// `--dport N`), negations excepted.
fn need_of(args: &[String]) -> Need {
    let mut dport = None;
    let mut negated = false;
    for pair in args.windows(2) {
        let (a, v) = (pair[0].as_str(), pair[1].as_str());
        if a == "!" {
            negated = true;
            continue;
        }
        if a == "-j" {
            break;
        }
        match a {
            "-d" if !negated => {
                let host = v
                    .strip_suffix("/32")
                    .or_else(|| v.strip_suffix("/128"))
                    .unwrap_or(v);
                if let Ok(ip) = host.parse() {
                    return Need::Dst(ip);
                }
            }
            "--dport" if !negated => dport = v.parse().ok(),
            _ => {}
        }
        negated = false;
    }
    dport.map_or(Need::Nothing, Need::Dport)
}

/// One chain's rules with their index.
#[derive(Debug, Default)]
struct IndexedChain {
    rules: Vec<String>,
    /// Rule positions by requirement.
    by_need: HashMap<Need, Vec<usize>>,
    /// The chains each rule jumps to.
    targets: Vec<Option<String>>,
}

/// A saved iptables rule set, indexed (built once per look at the node).
#[derive(Debug, Default)]
pub struct IptablesIndex {
    /// (table, chain) → the chain.
    chains: HashMap<(String, String), IndexedChain>,
    /// The chains every subset starts from.
    bases: Vec<(String, String)>,
}

impl IptablesIndex {
    /// Indexes `tables` (`nat` and `filter`, the tables the tracer follows).
    pub fn new(tables: &Tables) -> Self {
        let mut chains = HashMap::new();
        for table in ["nat", "filter"] {
            for chain in tables.chains(table) {
                let mut c = IndexedChain::default();
                for (i, rule) in tables.rules(table, &chain).iter().enumerate() {
                    let args = split_args(rule);
                    c.by_need.entry(need_of(&args)).or_default().push(i);
                    c.targets.push(jump_target(&args).map(str::to_string));
                    c.rules.push(rule.clone());
                }
                chains.insert((table.to_string(), chain), c);
            }
        }
        let bases = chains.keys().filter(|k| is_base(&k.1)).cloned().collect();
        Self { chains, bases }
    }

    /// The rules a packet to `dst:dport` may meet: from every chain, the rules whose
    /// requirement it meets (in order), with the chains they jump to followed.
    pub fn subset(&self, dst: IpAddr, dport: u16) -> Tables {
        let mut out = Tables::new();
        let mut seen = BTreeSet::new();
        let mut work = self.bases.clone();
        while let Some(key) = work.pop() {
            if !seen.insert(key.clone()) {
                continue;
            }
            let Some(c) = self.chains.get(&key) else {
                continue;
            };
            let mut picked: Vec<usize> = [Need::Dst(dst), Need::Dport(dport), Need::Nothing]
                .iter()
                .filter_map(|n| c.by_need.get(n))
                .flatten()
                .copied()
                .collect();
            picked.sort_unstable();
            for i in picked {
                out.append(&key.0, &c.rules[i]);
                if let Some(t) = &c.targets[i] {
                    work.push((key.0.clone(), t.clone()));
                }
            }
        }
        out
    }
}

/// The chains the tracer starts from, and the built-in ones.
fn is_base(chain: &str) -> bool {
    matches!(
        chain,
        "KUBE-SERVICES"
            | "KUBE-EXTERNAL-SERVICES"
            | "KUBE-NODEPORTS"
            | "KUBE-PROXY-FIREWALL"
            | "PREROUTING"
            | "OUTPUT"
            | "INPUT"
            | "FORWARD"
            | "POSTROUTING"
    )
}

/// Sets with more elements than this are narrowed to the packet's. Maps are narrowed
/// whatever their size: their values name chains, and a map kept whole (63 NodePorts in
/// `service-nodeports`) brought every chain it names, and theirs, into every frontend's
/// subset. A set is kept whole below it: a lookup after DNAT (by the backend's address)
/// still finds what it holds.
const SMALL: usize = 64;

/// What an element of a big set or map requires of the packet, for the index: an address
/// it names (a key `ADDR . proto . port` is only found by a packet to ADDR), else the port
/// it names (`proto . port`), else nothing a frontend's packet can be looked up by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum ElementNeed {
    Addr(IpAddr),
    Port(u16),
}

/// The needs of an element's key: every address it names, else its port.
fn element_needs(key: &str) -> Vec<ElementNeed> {
    let parts: Vec<&str> = key.split(" . ").map(str::trim).collect();
    let addrs: Vec<ElementNeed> = parts
        .iter()
        .filter_map(|p| p.parse().ok().map(ElementNeed::Addr))
        .collect();
    if !addrs.is_empty() {
        return addrs;
    }
    parts
        .iter()
        .filter_map(|p| p.parse().ok().map(ElementNeed::Port))
        .take(1)
        .collect()
}

/// An nftables table indexed once per look: its maps' and big sets' elements by what they
/// require of the packet, and the chains every trace starts from. A frontend's subset then
/// costs what its own elements and chains cost, not the table's size: narrowing every big
/// map by a scan, or keeping every element that names the packet's port (at 10,000
/// services on port 80 that is all of them, and every service chain with them), made a
/// look grow with services².
#[derive(Debug, Default)]
pub struct NftIndex {
    /// Big collection → element positions by need.
    sets: HashMap<String, HashMap<ElementNeed, Vec<usize>>>,
    /// The base chains (with a hook, or where the tracer starts).
    starts: Vec<String>,
}

impl NftIndex {
    pub fn new(t: &NftTable) -> Self {
        let sets = t
            .sets
            .iter()
            .filter(|(_, c)| c.is_map || c.elements.len() > SMALL)
            .map(|(name, c)| {
                let mut by: HashMap<ElementNeed, Vec<usize>> = HashMap::new();
                for (i, e) in c.elements.iter().enumerate() {
                    for n in element_needs(&e.key) {
                        by.entry(n).or_default().push(i);
                    }
                }
                (name.clone(), by)
            })
            .collect();
        let starts = t
            .chains
            .iter()
            .filter(|(name, c)| c.spec.contains("hook") || NFT_STARTS.contains(&name.as_str()))
            .map(|(name, _)| name.clone())
            .collect();
        Self { sets, starts }
    }

    /// The part of `t` (the table this indexes) a packet to `dst:dport` may meet: the
    /// chains reachable from the base chains, and the sets and maps they name, maps and big
    /// sets narrowed to the elements that name `dst` (or, naming no address, `dport`).
    pub fn subset(&self, t: &NftTable, dst: IpAddr, dport: u16) -> NftTable {
        let mut chains = BTreeMap::new();
        let mut sets = BTreeMap::new();
        let mut work: Vec<&str> = self.starts.iter().map(String::as_str).collect();
        while let Some(name) = work.pop() {
            if chains.contains_key(name) {
                continue;
            }
            let Some(c) = t.chains.get(name) else {
                continue;
            };
            for r in &c.rules {
                work.extend(chain_refs(r));
                for set in set_refs(r) {
                    if sets.contains_key(set) {
                        continue;
                    }
                    let Some(full) = t.sets.get(set) else {
                        continue;
                    };
                    let kept = self.narrowed(set, full, dst, dport);
                    work.extend(
                        kept.iter()
                            .filter_map(|e| e.value.as_deref())
                            .flat_map(chain_refs),
                    );
                    let kept = Collection {
                        spec: full.spec.clone(),
                        is_map: full.is_map,
                        elements: kept.into_iter().cloned().collect(),
                    };
                    sets.insert(set.to_string(), kept);
                }
            }
            chains.insert(name.to_string(), c.clone());
        }
        NftTable {
            family: t.family,
            chains,
            sets,
        }
    }

    /// The elements of collection `name` (`c`) a packet to `dst:dport` may be looked up
    /// by: all of a small set; of a map or a big set, those naming `dst` (or, naming no
    /// address, `dport`), in order.
    fn narrowed<'t>(
        &self,
        name: &str,
        c: &'t Collection,
        dst: IpAddr,
        dport: u16,
    ) -> Vec<&'t Element> {
        let Some(by) = self.sets.get(name) else {
            return c.elements.iter().collect();
        };
        let mut picked: Vec<usize> = [ElementNeed::Addr(dst), ElementNeed::Port(dport)]
            .iter()
            .filter_map(|n| by.get(n))
            .flatten()
            .copied()
            .collect();
        picked.sort_unstable();
        picked.dedup();
        picked
            .into_iter()
            .filter_map(|i| c.elements.get(i))
            .collect()
    }
}

/// The part of nftables table `t` a packet to `dst:dport` may meet (see
/// [`NftIndex::subset`]; a look indexes once and asks the index for every frontend).
pub fn nft_subset(t: &NftTable, dst: IpAddr, dport: u16) -> NftTable {
    NftIndex::new(t).subset(t, dst, dport)
}

/// The chains nftables' tracer starts from.
const NFT_STARTS: [&str; 4] = [
    "filter-prerouting-pre-dnat",
    "nat-prerouting",
    "filter-forward",
    "filter-input",
];

/// The chains a rule or verdict names (`jump X`, `goto X`).
fn chain_refs(text: &str) -> Vec<&str> {
    let words: Vec<&str> = text.split_whitespace().collect();
    words
        .windows(2)
        .filter(|w| w[0] == "jump" || w[0] == "goto")
        .map(|w| w[1].trim_end_matches([',', '}', ';']))
        .collect()
}

/// The sets and maps a rule names (`@NAME`).
fn set_refs(text: &str) -> impl Iterator<Item = &str> {
    text.split_whitespace()
        .filter_map(|w| w.strip_prefix('@'))
        .map(|w| w.trim_end_matches([',', '}', ';']))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subset_keeps_the_rules_a_packet_may_meet_in_order_and_the_chains_they_reach() {
        let mut t = Tables::new();
        t.apply(
            "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-A - [0:0]\n:KUBE-SVC-B - [0:0]\n:KUBE-NODEPORTS - [0:0]\n\
             -A KUBE-SERVICES -d 10.96.0.1/32 -p tcp --dport 80 -j KUBE-SVC-A\n\
             -A KUBE-SERVICES -d 10.96.0.2/32 -p tcp --dport 80 -j KUBE-SVC-B\n\
             -A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n\
             -A KUBE-SVC-A -j DNAT --to-destination 10.0.0.1:80\n\
             -A KUBE-SVC-B -j DNAT --to-destination 10.0.0.2:80\n\
             -A KUBE-NODEPORTS -p tcp --dport 30080 -j KUBE-SVC-B\n\
             COMMIT\n",
        )
        .expect("apply");
        let sub = IptablesIndex::new(&t).subset("10.96.0.1".parse().expect("ip"), 80);
        assert_eq!(
            sub.rules("nat", "KUBE-SERVICES"),
            [
                "-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp --dport 80 -j KUBE-SVC-A",
                "-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS",
            ]
        );
        assert!(sub.has_chain("nat", "KUBE-SVC-A"));
        assert!(!sub.has_chain("nat", "KUBE-SVC-B"));
        assert!(sub.rules("nat", "KUBE-NODEPORTS").is_empty());
        let np = IptablesIndex::new(&t).subset("192.168.1.1".parse().expect("ip"), 30080);
        assert_eq!(np.rules("nat", "KUBE-NODEPORTS").len(), 1);
        assert!(np.has_chain("nat", "KUBE-SVC-B"));
    }

    #[test]
    fn negated_and_ranged_destinations_stay_with_every_packet() {
        let args = |s: &str| split_args(s);
        assert_eq!(
            need_of(&args("-A X ! -d 10.0.0.1/32 -p tcp --dport 80 -j Y")),
            Need::Dport(80)
        );
        assert_eq!(need_of(&args("-A X -d 10.0.0.0/8 -j Y")), Need::Nothing);
        assert_eq!(
            need_of(&args("-A X -p tcp ! --dport 80 -j Y")),
            Need::Nothing
        );
        assert_eq!(
            need_of(&args("-A X -d fd00::1/128 -j Y")),
            Need::Dst("fd00::1".parse().expect("ip"))
        );
    }

    #[test]
    fn an_nft_subset_keeps_the_frontends_own_elements_and_chains_not_every_one_on_its_port() {
        use crate::emit::nftables::Chain;
        let chain = |spec: &str, rules: &[&str]| Chain {
            spec: spec.to_string(),
            rules: rules.iter().map(|r| r.to_string()).collect(),
        };
        let mut t = NftTable::default();
        t.chains.insert(
            "nat-prerouting".into(),
            chain("type nat hook prerouting priority -100", &["jump services"]),
        );
        t.chains.insert(
            "services".into(),
            chain(
                "",
                &[
                    "ip daddr . meta l4proto . th dport vmap @service-ips",
                    "fib daddr type local meta l4proto . th dport vmap @service-nodeports",
                ],
            ),
        );
        let (mut ips, mut node_ports) = (Collection::default(), Collection::default());
        for i in 0..200 {
            ips.elements.push(Element {
                key: format!("10.96.0.{i} . tcp . 80"),
                comment: None,
                value: Some(format!("goto service-{i}")),
            });
            node_ports.elements.push(Element {
                key: format!("tcp . {}", 30_000 + i),
                comment: None,
                value: Some(format!("goto service-{i}")),
            });
            t.chains.insert(
                format!("service-{i}"),
                chain("", &[&format!("dnat to 10.0.0.{i}:8080")]),
            );
        }
        t.sets.insert("service-ips".into(), ips);
        t.sets.insert("service-nodeports".into(), node_ports);
        let index = NftIndex::new(&t);
        let sub = index.subset(&t, "10.96.0.7".parse().expect("ip"), 80);
        assert_eq!(sub.sets["service-ips"].elements.len(), 1);
        assert!(sub.sets["service-nodeports"].elements.is_empty());
        assert!(sub.chains.contains_key("service-7"));
        assert_eq!(sub.chains.len(), 3, "{:?}", sub.chains.keys());
        let np = index.subset(&t, "10.0.0.5".parse().expect("ip"), 30_009);
        assert!(np.sets["service-ips"].elements.is_empty());
        assert_eq!(np.sets["service-nodeports"].elements.len(), 1);
        assert!(np.chains.contains_key("service-9"));
        assert_eq!(sub, nft_subset(&t, "10.96.0.7".parse().expect("ip"), 80));
    }
}
