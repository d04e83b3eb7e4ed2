//! The part of a node's rule set one frontend's packet can meet, so that tracing every
//! frontend costs what its own rules cost and not the whole set each time (at 10,000
//! services kube-proxy's `KUBE-SERVICES` has over 10,000 rules and its nftables maps as
//! many elements).
//!
//! iptables: each chain's rules are indexed once by what they require of the packet (an
//! exact destination address, else a destination port); a frontend's subset keeps, in
//! order, the rules that may match its packet and every chain they reach. nftables: big
//! sets and maps keep the elements that name the packet's address or port, and the subset
//! holds the base chains and every chain reachable from what it keeps.

use std::{
    collections::{BTreeSet, HashMap},
    net::IpAddr,
};

use crate::emit::{
    nftables::{Collection, NftTable},
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

/// Collections with more elements than this are narrowed to the packet's.
const SMALL: usize = 64;

/// The part of nftables table `t` a packet to `dst:dport` may meet: big sets and maps keep
/// the elements that name `dst` or `dport`; the chains kept are the base chains (those with
/// a hook, and those the tracer starts from) and every chain reachable from them.
pub fn nft_subset(t: &NftTable, dst: IpAddr, dport: u16) -> NftTable {
    let (dst, port) = (dst.to_string(), dport.to_string());
    let sets = t
        .sets
        .iter()
        .map(|(name, c)| (name.clone(), narrowed(c, &dst, &port)))
        .collect::<std::collections::BTreeMap<_, _>>();
    let mut chains = std::collections::BTreeMap::new();
    let mut work: Vec<&str> = t
        .chains
        .iter()
        .filter(|(name, c)| c.spec.contains("hook") || NFT_STARTS.contains(&name.as_str()))
        .map(|(name, _)| name.as_str())
        .collect();
    let values = sets
        .values()
        .flat_map(|c| c.elements.iter().filter_map(|e| e.value.as_deref()));
    work.extend(values.flat_map(chain_refs));
    while let Some(name) = work.pop() {
        if chains.contains_key(name) {
            continue;
        }
        let Some(c) = t.chains.get(name) else {
            continue;
        };
        work.extend(c.rules.iter().flat_map(|r| chain_refs(r)));
        chains.insert(name.to_string(), c.clone());
    }
    NftTable {
        family: t.family,
        chains,
        sets,
    }
}

/// The chains nftables' tracer starts from.
const NFT_STARTS: [&str; 4] = [
    "filter-prerouting-pre-dnat",
    "nat-prerouting",
    "filter-forward",
    "filter-input",
];

fn narrowed(c: &Collection, dst: &str, port: &str) -> Collection {
    if c.elements.len() <= SMALL {
        return c.clone();
    }
    Collection {
        spec: c.spec.clone(),
        is_map: c.is_map,
        elements: c
            .elements
            .iter()
            .filter(|e| {
                e.key
                    .split(" . ")
                    .any(|k| k.trim() == dst || k.trim() == port)
            })
            .cloned()
            .collect(),
    }
}

/// The chains a rule or verdict names (`jump X`, `goto X`).
fn chain_refs(text: &str) -> Vec<&str> {
    let words: Vec<&str> = text.split_whitespace().collect();
    words
        .windows(2)
        .filter(|w| w[0] == "jump" || w[0] == "goto")
        .map(|w| w[1].trim_end_matches([',', '}', ';']))
        .collect()
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
}
