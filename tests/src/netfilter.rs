//! Netfilter in a lab node namespace: the firewalls real nodes run beside a service proxy
//! (each drops the packets the kernel's conntrack calls INVALID and accepts the replies it
//! calls ESTABLISHED), their rules' packet counters, and the kernel's conntrack table as
//! `conntrack -L` shows it. Everything acts inside one namespace (`nsenter`), never on the
//! machine's own rules; the rules go with the namespace.

use std::net::IpAddr;

use crate::netns::{Netns, run};

/// A node firewall that drops conntrack-INVALID packets, in both families.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Firewall {
    /// kube-proxy's forwarding rules as a stopped kube-proxy leaves them (iptables and
    /// ip6tables, `filter` table): FORWARD jumps to `KUBE-FORWARD`, which drops INVALID
    /// and accepts RELATED,ESTABLISHED; INPUT drops INVALID and accepts ESTABLISHED as an
    /// ordinary host firewall does.
    KubeForward,
    /// A host firewall (firewalld, ufw) in nftables: `table inet filter` whose `input` and
    /// `forward` chains accept established/related and drop invalid, with counters.
    NftInet,
    /// A Calico-like CNI: one pair of chains per interface (from it, to it), jumped to by
    /// `-i IFACE` / `-o IFACE` from FORWARD and by `-i IFACE` from INPUT, each accepting
    /// RELATED,ESTABLISHED and dropping INVALID before its (allow-all) policy.
    CalicoLike,
}

/// All three, for tests that run each.
pub const FIREWALLS: [Firewall; 3] = [
    Firewall::KubeForward,
    Firewall::NftInet,
    Firewall::CalicoLike,
];

/// Packet counts of a firewall's rules, both families and every hook summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Packets accepted as ESTABLISHED (or RELATED): replies conntrack matched to a flow.
    pub established: u64,
    /// Packets dropped as INVALID.
    pub invalid: u64,
}

impl Counters {
    /// What was counted since `before`.
    pub fn since(self, before: Counters) -> Counters {
        Counters {
            established: self.established.saturating_sub(before.established),
            invalid: self.invalid.saturating_sub(before.invalid),
        }
    }
}

/// kube-proxy's forwarding chain (pkg/proxy/iptables, the "kubernetes forwarding rules"),
/// with the INPUT rules of a host firewall beside it.
const KUBE_FORWARD: &str = "*filter
:KUBE-FORWARD - [0:0]
-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A INPUT -m conntrack --ctstate INVALID -j DROP
-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
COMMIT
";

/// firewalld's and ufw's shape in nftables (established first, then invalid).
const NFT_INET: &str = "table inet filter {
  chain input {
    type filter hook input priority filter; policy accept;
    ct state established,related counter accept comment \"established\"
    ct state invalid counter drop comment \"invalid\"
  }
  chain forward {
    type filter hook forward priority filter; policy accept;
    ct state established,related counter accept comment \"established\"
    ct state invalid counter drop comment \"invalid\"
  }
}
";

/// The Calico-like rules for `interfaces`, for `iptables-restore`.
fn calico_like(interfaces: &[&str]) -> String {
    let mut chains = String::from(":xcali-FORWARD - [0:0]\n:xcali-INPUT - [0:0]\n");
    let mut rules = String::from("-A FORWARD -j xcali-FORWARD\n-A INPUT -j xcali-INPUT\n");
    for iface in interfaces {
        for (dir, chain) in [
            ("-i", format!("xcali-fw-{iface}")),
            ("-o", format!("xcali-tw-{iface}")),
        ] {
            chains.push_str(&format!(":{chain} - [0:0]\n"));
            rules.push_str(&format!("-A xcali-FORWARD {dir} {iface} -j {chain}\n"));
            rules.push_str(&format!(
                "-A {chain} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
                 -A {chain} -m conntrack --ctstate INVALID -j DROP\n\
                 -A {chain} -m comment --comment \"policy: allow\" -j RETURN\n"
            ));
        }
        rules.push_str(&format!("-A xcali-INPUT -i {iface} -j xcali-fw-{iface}\n"));
    }
    format!("*filter\n{chains}{rules}COMMIT\n")
}

impl Firewall {
    /// Installs the firewall's rules (both families) in `node`; `interfaces` are the
    /// interfaces a per-interface firewall ([`Firewall::CalicoLike`]) guards.
    pub fn install(self, node: &Netns, interfaces: &[&str]) -> Result<(), String> {
        match self {
            Firewall::KubeForward => {
                node.feed("iptables-restore", &["--noflush"], KUBE_FORWARD)?;
                node.feed("ip6tables-restore", &["--noflush"], KUBE_FORWARD)
            }
            Firewall::NftInet => node.feed("nft", &["-f", "-"], NFT_INET),
            Firewall::CalicoLike => {
                let rules = calico_like(interfaces);
                node.feed("iptables-restore", &["--noflush"], &rules)?;
                node.feed("ip6tables-restore", &["--noflush"], &rules)
            }
        }
    }

    /// The firewall's counters now.
    pub fn counters(self, node: &Netns) -> Result<Counters, String> {
        match self {
            Firewall::NftInet => nft_counters(node),
            Firewall::KubeForward | Firewall::CalicoLike => {
                let mut c = Counters::default();
                for save in ["iptables-save", "ip6tables-save"] {
                    let out = run(node.command(save).args(["-c", "-t", "filter"]))?;
                    let f = iptables_counters(&String::from_utf8_lossy(&out.stdout));
                    c.established += f.established;
                    c.invalid += f.invalid;
                }
                Ok(c)
            }
        }
    }

    /// The rules as the node holds them, with their counters (for failure messages).
    pub fn listing(self, node: &Netns) -> String {
        let cmds: &[&[&str]] = match self {
            Firewall::NftInet => &[&["nft", "list", "ruleset"]],
            _ => &[
                &["iptables", "-L", "-v", "-x", "-n"],
                &["ip6tables", "-L", "-v", "-x", "-n"],
            ],
        };
        let mut text = String::new();
        for cmd in cmds {
            match run(node.command(cmd[0]).args(&cmd[1..])) {
                Ok(out) => text.push_str(&String::from_utf8_lossy(&out.stdout)),
                Err(e) => text.push_str(&e),
            }
        }
        text
    }
}

/// The ESTABLISHED-accept and INVALID-drop counts in `iptables-save -c` output.
pub fn iptables_counters(save: &str) -> Counters {
    let mut c = Counters::default();
    for line in save.lines() {
        let Some((count, rule)) = line.strip_prefix('[').and_then(|l| l.split_once("] ")) else {
            continue;
        };
        let packets: u64 = count
            .split(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        if rule.contains("--ctstate RELATED,ESTABLISHED") && rule.ends_with("-j ACCEPT") {
            c.established += packets;
        } else if rule.contains("--ctstate INVALID") && rule.ends_with("-j DROP") {
            c.invalid += packets;
        }
    }
    c
}

/// The counters of the `established` and `invalid` rules of `table inet filter`, read as
/// JSON (`nft -j`).
fn nft_counters(node: &Netns) -> Result<Counters, String> {
    let out = run(node
        .command("nft")
        .args(["-j", "list", "table", "inet", "filter"]))?;
    nft_json_counters(&String::from_utf8_lossy(&out.stdout))
}

/// The counts of the rules commented `established` and `invalid` in `nft -j` output.
pub fn nft_json_counters(json: &str) -> Result<Counters, String> {
    let doc: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("nft -j output: {e}"))?;
    let mut c = Counters::default();
    let items = doc["nftables"]
        .as_array()
        .ok_or("nft -j: no nftables array")?;
    for rule in items.iter().filter_map(|i| i.get("rule")) {
        let packets: u64 = rule["expr"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["counter"]["packets"].as_u64())
            .sum();
        match rule["comment"].as_str() {
            Some("established") => c.established += packets,
            Some("invalid") => c.invalid += packets,
            _ => {}
        }
    }
    Ok(c)
}

/// Makes the kernel track connections in `node` without filtering anything: a table whose
/// only rule counts new flows (a namespace without a rule that uses conntrack has no
/// conntrack hooks, so no table to list).
pub fn track_connections(node: &Netns) -> Result<(), String> {
    node.feed(
        "nft",
        &["-f", "-"],
        "table inet xlb-lab-ct {\n  chain prerouting {\n    type filter hook prerouting priority filter; policy accept;\n    ct state new counter\n  }\n}\n",
    )
}

/// One entry of the kernel's conntrack table, as `conntrack -L` prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// `tcp`, `udp`, …
    pub protocol: String,
    /// The TCP state (`ESTABLISHED`, `SYN_SENT`, …); empty for other protocols.
    pub state: String,
    /// The original direction: source, destination, their ports.
    pub orig: (IpAddr, u16, IpAddr, u16),
    /// The reply direction as conntrack expects it.
    pub reply: (IpAddr, u16, IpAddr, u16),
    pub assured: bool,
    /// The line as printed.
    pub line: String,
}

/// Parses one `conntrack -L` line (`None` for lines that are not entries).
pub fn parse_entry(line: &str) -> Option<Entry> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let protocol = (*words.first()?).to_string();
    let state = words
        .iter()
        .take_while(|w| !w.contains('='))
        .find(|w| w.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .map_or(String::new(), |w| w.to_string());
    let values =
        |key: &str| -> Vec<&str> { words.iter().filter_map(|w| w.strip_prefix(key)).collect() };
    let (src, dst) = (values("src="), values("dst="));
    let (sport, dport) = (values("sport="), values("dport="));
    let tuple = |i: usize| -> Option<(IpAddr, u16, IpAddr, u16)> {
        Some((
            src.get(i)?.parse().ok()?,
            sport.get(i)?.parse().ok()?,
            dst.get(i)?.parse().ok()?,
            dport.get(i)?.parse().ok()?,
        ))
    };
    Some(Entry {
        protocol,
        state,
        orig: tuple(0)?,
        reply: tuple(1)?,
        assured: words.contains(&"[ASSURED]"),
        line: line.to_string(),
    })
}

/// The kernel's conntrack table of `family` (`ipv4`, `ipv6`) in `node`.
pub fn conntrack_entries(node: &Netns, family: &str) -> Result<Vec<Entry>, String> {
    let out = run(node.command("conntrack").args(["-L", "-f", family]))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(parse_entry)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iptables_save_counters_sum_the_established_and_invalid_rules() {
        let save = "# Generated\n*filter\n:INPUT ACCEPT [5:300]\n:KUBE-FORWARD - [0:0]\n\
            [7:420] -A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
            [2:120] -A INPUT -m conntrack --ctstate INVALID -j DROP\n\
            [9:540] -A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
            [3:180] -A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n\
            [0:0] -A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT\n\
            [6:360] -A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\nCOMMIT\n";
        assert_eq!(
            iptables_counters(save),
            Counters {
                established: 13,
                invalid: 5
            }
        );
    }

    #[test]
    fn nft_json_counters_read_the_commented_rules() {
        let json = r#"{"nftables":[{"metainfo":{"version":"1.0.6"}},
            {"table":{"family":"inet","name":"filter","handle":1}},
            {"rule":{"family":"inet","table":"filter","chain":"input","handle":3,"comment":"established",
              "expr":[{"match":{"op":"in","left":{"ct":{"key":"state"}},"right":["established","related"]}},
                      {"counter":{"packets":4,"bytes":240}},{"accept":null}]}},
            {"rule":{"family":"inet","table":"filter","chain":"forward","handle":5,"comment":"established",
              "expr":[{"counter":{"packets":10,"bytes":600}},{"accept":null}]}},
            {"rule":{"family":"inet","table":"filter","chain":"forward","handle":6,"comment":"invalid",
              "expr":[{"counter":{"packets":1,"bytes":60}},{"drop":null}]}}]}"#;
        assert_eq!(
            nft_json_counters(json).expect("json"),
            Counters {
                established: 14,
                invalid: 1
            }
        );
    }

    #[test]
    fn conntrack_lines_parse_into_both_tuples() {
        let e = parse_entry("tcp      6 431999 ESTABLISHED src=10.244.1.2 dst=10.244.2.2 sport=40000 dport=8080 src=10.244.2.2 dst=10.244.1.2 sport=8080 dport=40000 [ASSURED] mark=0 use=1")
            .expect("entry");
        assert_eq!(e.state, "ESTABLISHED");
        assert!(e.assured);
        assert_eq!(e.orig.2, "10.244.2.2".parse::<IpAddr>().expect("ip"));
        assert_eq!(e.reply.0, "10.244.2.2".parse::<IpAddr>().expect("ip"));
        assert_eq!((e.orig.1, e.reply.3), (40000, 40000));
        let e = parse_entry("tcp      6 118 SYN_SENT src=fd00:10:244:1::2 dst=fd00:10:244:2::2 sport=1 dport=8080 [UNREPLIED] src=fd00:10:244:2::2 dst=fd00:10:244:1::2 sport=8080 dport=1 mark=0 use=1")
            .expect("entry");
        assert_eq!((e.state.as_str(), e.assured), ("SYN_SENT", false));
        let e = parse_entry("udp      17 29 src=10.0.0.1 dst=10.0.0.2 sport=5 dport=53 src=10.0.0.2 dst=10.0.0.1 sport=53 dport=5 mark=0 use=1")
            .expect("entry");
        assert_eq!(e.state, "");
        assert!(parse_entry("conntrack v1.4.7 (conntrack-tools): 3 flow entries").is_none());
    }
}
