//! The iptables rule vocabulary every iptables-based mode shares (iptables, ipvs and
//! userspace all feed `iptables-restore`): restore payloads ([`Table`], [`Payload`]), the
//! jumps kube-proxy ensures in built-in chains ([`Jump`]), argument helpers, and the
//! masquerade and forwarding rules kube-proxy writes the same way in iptables and ipvs mode.

use std::{fmt::Write as _, net::IpAddr};

/// A rule kube-proxy ensures in a built-in chain, outside its restore input: the jump into
/// one of its own chains, prepended (`-I`) or appended (`-A`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Jump {
    pub table: &'static str,
    pub chain: &'static str,
    pub append: bool,
    /// Match arguments before `-j` (kube-proxy's extra arguments, then its comment).
    pub matches: &'static [&'static str],
    pub target: &'static str,
}

impl Jump {
    /// A jump prepended (`-I`) to `chain`.
    pub const fn prepend(
        table: &'static str,
        chain: &'static str,
        matches: &'static [&'static str],
        target: &'static str,
    ) -> Self {
        Self {
            table,
            chain,
            append: false,
            matches,
            target,
        }
    }

    /// The `iptables` arguments that add this rule.
    pub fn args(&self) -> Vec<&'static str> {
        let op = if self.append { "-A" } else { "-I" };
        let mut a = vec!["-t", self.table, op, self.chain];
        a.extend_from_slice(self.matches);
        a.extend(["-j", self.target]);
        a
    }
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
    /// Declares `name`.
    pub fn chain(&mut self, name: &str) {
        self.chains.push(name.to_string());
    }

    /// Appends `-A CHAIN ARGS…` (arguments joined by spaces).
    pub fn rule<S: AsRef<str>>(&mut self, chain: &str, args: &[S]) {
        let mut line = format!("-A {chain}");
        for a in args {
            line.push(' ');
            line.push_str(a.as_ref());
        }
        self.rules.push(line);
    }

    /// Appends `-A CHAIN SPEC`, the arguments already written as one string.
    pub fn line(&mut self, chain: &str, spec: &str) {
        self.rules.push(format!("-A {chain} {spec}"));
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

/// The comment argument: quoted when it has spaces (kube-proxy quotes multi-word comments).
pub fn comment(s: &str) -> [String; 4] {
    let text = if s.contains(' ') {
        format!("\"{s}\"")
    } else {
        s.to_string()
    };
    ["-m".into(), "comment".into(), "--comment".into(), text]
}

/// `comment(c)` followed by `rest` (words separated by spaces).
pub fn commented(c: &str, rest: &str) -> Vec<String> {
    let mut v: Vec<String> = comment(c).into();
    v.extend(rest.split_whitespace().map(String::from));
    v
}

/// `-m comment --comment C -m P -p P -d IP --dport PORT`.
pub fn dest_match(c: &str, proto: &str, ip: &str, port: u16) -> Vec<String> {
    commented(c, &format!("-m {proto} -p {proto} -d {ip} --dport {port}"))
}

/// `args` then `-j TARGET`.
pub fn with_target(mut args: Vec<String>, target: &str) -> Vec<String> {
    args.push("-j".into());
    args.push(target.into());
    args
}

/// `IP:PORT`, or `[IP]:PORT` for IPv6.
pub fn hostport(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v) => format!("{v}:{port}"),
        IpAddr::V6(v) => format!("[{v}]:{port}"),
    }
}

/// The chain masqueraded traffic is marked in, and the one that masquerades it.
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
pub const KUBE_FORWARD: &str = "KUBE-FORWARD";

/// nat KUBE-POSTROUTING (masquerade what carries `mark`, clearing the mark first) and
/// KUBE-MARK-MASQ (set it), as iptables and ipvs mode write them.
pub fn masquerade(nat: &mut Table, mark: &str, random_fully: bool) {
    nat.line(
        KUBE_POSTROUTING,
        &format!("-m mark ! --mark {mark}/{mark} -j RETURN"),
    );
    nat.line(KUBE_POSTROUTING, &format!("-j MARK --xor-mark {mark}"));
    let mut masq = commented("kubernetes service traffic requiring SNAT", "-j MASQUERADE");
    if random_fully {
        masq.push("--random-fully".into());
    }
    nat.rule(KUBE_POSTROUTING, &masq);
    nat.line(KUBE_MARK_MASQ, &format!("-j MARK --or-mark {mark}"));
}

/// filter KUBE-FORWARD: drop conntrack-INVALID packets (`invalid_drop`, with the nfacct
/// counter when `Some(true)`), accept marked traffic and established flows.
pub fn forward(filter: &mut Table, mark: &str, invalid_drop: Option<bool>) {
    if let Some(nfacct) = invalid_drop {
        let counter = if nfacct {
            " -m nfacct --nfacct-name ct_state_invalid_dropped_pkts"
        } else {
            ""
        };
        filter.line(
            KUBE_FORWARD,
            &format!("-m conntrack --ctstate INVALID{counter} -j DROP"),
        );
    }
    filter.rule(
        KUBE_FORWARD,
        &commented(
            "kubernetes forwarding rules",
            &format!("-m mark --mark {mark}/{mark} -j ACCEPT"),
        ),
    );
    filter.rule(
        KUBE_FORWARD,
        &commented(
            "kubernetes forwarding conntrack rule",
            "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_with_spaces_are_quoted_and_rules_join_their_words() {
        let mut t = Table::default();
        t.rule("X", &commented("a b", "-j ACCEPT"));
        t.rule("X", &commented("ab", "-j DROP"));
        assert_eq!(
            t.chain_rules("X"),
            [
                "-A X -m comment --comment \"a b\" -j ACCEPT",
                "-A X -m comment --comment ab -j DROP"
            ]
        );
    }
}
