//! kube-proxy's rules as a node holds them, told apart from everyone else's: which chains
//! of an `iptables-save` table `kube-proxy --cleanup` removes (iptables and ipvs modes: its
//! v1.28 `CleanupLeftovers` of both proxiers, which it runs one after the other), which
//! rules of other chains jump to them, and the `iptables-restore --noflush` input that
//! removes exactly those. A CNI's chains, kubelet's (`KUBE-FIREWALL`,
//! `KUBE-KUBELET-CANARY`) and a host firewall's are left alone, and so are the two chains
//! kube-proxy's own cleanup leaves (`KUBE-MARK-MASQ`, inert once nothing jumps to it, and
//! the empty `KUBE-PROXY-CANARY`). Running the tools is `datapath::netfilter`'s; this is
//! the pure part.

/// Chains `kube-proxy --cleanup` flushes and deletes under a fixed name (the iptables
/// proxier's in nat and filter, the ipvs proxier's), and the userspace mode's portals.
const FIXED: [&str; 14] = [
    "KUBE-SERVICES",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-POSTROUTING",
    "KUBE-FORWARD",
    "KUBE-PROXY-FIREWALL",
    "KUBE-NODE-PORT",
    "KUBE-LOAD-BALANCER",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-IPVS-FILTER",
    "KUBE-PORTALS-CONTAINER",
    "KUBE-PORTALS-HOST",
    "KUBE-NODEPORT-CONTAINER",
    "KUBE-NODEPORT-HOST",
];

/// The ipvs mode's ipsets, destroyed after its chains.
pub const IPSETS: [&str; 17] = [
    "KUBE-LOOP-BACK",
    "KUBE-CLUSTER-IP",
    "KUBE-EXTERNAL-IP",
    "KUBE-EXTERNAL-IP-LOCAL",
    "KUBE-LOAD-BALANCER",
    "KUBE-LOAD-BALANCER-FW",
    "KUBE-LOAD-BALANCER-LOCAL",
    "KUBE-LOAD-BALANCER-SOURCE-IP",
    "KUBE-LOAD-BALANCER-SOURCE-CIDR",
    "KUBE-NODE-PORT-TCP",
    "KUBE-NODE-PORT-LOCAL-TCP",
    "KUBE-NODE-PORT-UDP",
    "KUBE-NODE-PORT-LOCAL-UDP",
    "KUBE-NODE-PORT-SCTP-HASH",
    "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
    "KUBE-HEALTH-CHECK-NODE-PORT",
    "KUBE-IPVS-IPS",
];

/// Prefixes of the per-service and per-endpoint chains kube-proxy names by hash (its
/// cleanup hunts them in every table).
const PREFIXES: [&str; 5] = [
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-EXT-",
    "KUBE-FW-",
    "KUBE-SEP-",
];

/// Whether `chain` is one `kube-proxy --cleanup` removes (not kubelet's, a CNI's or a
/// firewall's).
pub fn is_kube_proxy_chain(chain: &str) -> bool {
    FIXED.contains(&chain) || PREFIXES.iter().any(|p| chain.starts_with(p))
}

/// kube-proxy's part of one `iptables-save` table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableLeftovers {
    /// `nat`, `filter`, `mangle`, …
    pub table: String,
    /// Rules of other chains that jump to kube-proxy's, as saved (`-A INPUT … -j KUBE-…`).
    pub jumps: Vec<String>,
    /// kube-proxy's chains in the table.
    pub chains: Vec<String>,
}

impl TableLeftovers {
    pub fn is_empty(&self) -> bool {
        self.jumps.is_empty() && self.chains.is_empty()
    }

    /// The `iptables-restore --noflush` input that removes them: each jump deleted, each
    /// chain flushed (declared), then deleted.
    pub fn restore_input(&self) -> String {
        let mut s = format!("*{}\n", self.table);
        for c in &self.chains {
            s.push_str(&format!(":{c} - [0:0]\n"));
        }
        for j in &self.jumps {
            if let Some(rule) = j.strip_prefix("-A ") {
                s.push_str(&format!("-D {rule}\n"));
            }
        }
        for c in &self.chains {
            s.push_str(&format!("-X {c}\n"));
        }
        s.push_str("COMMIT\n");
        s
    }
}

/// kube-proxy's chains and the jumps into them of every table in `save` (the output of
/// `iptables-save`, one or more tables).
pub fn of_save(save: &str) -> Vec<TableLeftovers> {
    let mut tables: Vec<TableLeftovers> = Vec::new();
    for line in save.lines() {
        if let Some(name) = line.strip_prefix('*') {
            tables.push(TableLeftovers {
                table: name.trim().to_string(),
                ..TableLeftovers::default()
            });
            continue;
        }
        let Some(t) = tables.last_mut() else { continue };
        if let Some(decl) = line.strip_prefix(':') {
            let chain = decl.split_whitespace().next().unwrap_or("");
            if is_kube_proxy_chain(chain) {
                t.chains.push(chain.to_string());
            }
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let chain = rule.split_whitespace().next().unwrap_or("");
            let target = jump_target(rule);
            if !is_kube_proxy_chain(chain) && target.is_some_and(is_kube_proxy_chain) {
                t.jumps.push(line.to_string());
            }
        }
    }
    tables.retain(|t| !t.is_empty());
    tables
}

/// The chain a rule jumps or goes to (`-j X`, `-g X`).
fn jump_target(rule: &str) -> Option<&str> {
    let mut words = rule.split_whitespace();
    while let Some(w) = words.next() {
        if w == "-j" || w == "-g" || w == "--jump" || w == "--goto" {
            return words.next();
        }
    }
    None
}

/// The nftables tables kube-proxy's nftables mode owns, of `nft -j list tables`'s JSON:
/// `ip kube-proxy` and `ip6 kube-proxy`.
pub fn nft_tables(list_json: &str) -> Result<Vec<String>, super::nft_json::ListingError> {
    Ok(super::nft_json::tables(list_json)?
        .into_iter()
        .filter(|t| t == "ip kube-proxy" || t == "ip6 kube-proxy")
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVE: &str = "# Generated by iptables-nft-save
*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-ABC - [0:0]
:KUBE-SEP-DEF - [0:0]
:KUBE-MARK-MASQ - [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -j KUBE-SVC-ABC
-A KUBE-SVC-ABC -j KUBE-SEP-DEF
COMMIT
*filter
:INPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:FLANNEL-FWD - [0:0]
-A INPUT -j KUBE-FIREWALL
-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES
COMMIT
*mangle
:PREROUTING ACCEPT [0:0]
COMMIT
";

    #[test]
    fn kube_proxys_chains_and_jumps_are_told_from_kubelets_and_a_cnis() {
        let t = of_save(SAVE);
        assert_eq!(t.len(), 2, "{t:?}");
        assert_eq!(t[0].table, "nat");
        assert_eq!(
            t[0].chains,
            ["KUBE-SERVICES", "KUBE-SVC-ABC", "KUBE-SEP-DEF"],
            "KUBE-MARK-MASQ stays, as kube-proxy's cleanup leaves it"
        );
        assert_eq!(
            t[0].jumps,
            ["-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"]
        );
        // kubelet's chains stay; a jump to a chain kube-proxy owns goes even when the chain
        // itself is not there.
        assert_eq!(t[1].table, "filter");
        assert!(t[1].chains.is_empty());
        assert_eq!(t[1].jumps.len(), 1);
        let input = t[0].restore_input();
        assert!(
            input.starts_with("*nat\n:KUBE-SERVICES - [0:0]\n"),
            "{input}"
        );
        assert!(input.contains(
            "\n-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n"
        ));
        assert!(input.ends_with("-X KUBE-SEP-DEF\nCOMMIT\n"), "{input}");
    }

    #[test]
    fn only_the_kube_proxy_nft_tables_are_named() {
        let list = r#"{"nftables": [{"metainfo": {"json_schema_version": 1}}, {"table": {"family": "inet", "name": "filter", "handle": 1}}, {"table": {"family": "ip", "name": "kube-proxy", "handle": 2}}, {"table": {"family": "ip6", "name": "kube-proxy", "handle": 3}}, {"table": {"family": "ip", "name": "nat", "handle": 4}}]}"#;
        assert_eq!(
            nft_tables(list).expect("nft -j list tables"),
            ["ip kube-proxy", "ip6 kube-proxy"]
        );
    }
}
