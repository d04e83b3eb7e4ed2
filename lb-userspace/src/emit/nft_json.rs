//! Reads what `nft -j list table ip kube-proxy` (or `ip6`) prints — kube-proxy's live
//! nftables state on a node, in libnftables' JSON schema (`libnftables-json(5)`, the one
//! kube-proxy's knftables reads) — into typed values ([`Listing`]), and renders them into
//! an [`NftTable`] in the emitter's spelling, so that
//! [`nftables::trace`](super::nftables::trace) follows the rules a node really has exactly
//! as it follows the emitted ones. Nothing here reads nft's human listing.
//!
//! The rendering is the emitter's spelling of each typed value:
//!
//! * chains: `type T hook H priority P` (P the number nft lists), the default
//!   `policy accept` dropped, a chain comment kept when nft lists one (nft 1.0.6 does not);
//! * sets and maps: `type K` (`type K1 . K2 : verdict` for a map), `flags …` (`dynamic`
//!   added for a set a rule updates: nft 1.0.6's JSON leaves it out), `timeout Ns`, the
//!   comment; the default `size 65535` of dynamic sets is dropped; one [`Element`] per
//!   entry (its comment kept, the `timeout`/`expires` of live entries dropped);
//! * rules: matches as `ip daddr 10.96.0.10`, `ip saddr != 10.244.0.0/16`,
//!   `meta l4proto tcp`, `ct state new`, `fib saddr type local`; `meta mark` as `mark`
//!   with `or`/`xor`/`and` and hexadecimal masks (`mark set mark or 0x00004000`);
//!   `numgen random mod N vmap { 0 : goto a , 1 : goto b }`; `dnat to ADDR:PORT`
//!   (`[ADDR]:PORT` for IPv6); `update @set { ip saddr }`; the rule's comment last.
//!   Counters are left out (the tracer has nothing to do with them).
//!
//! What nft normalises cannot be undone and is rendered as nft lists it, which the tracer
//! reads as well: anonymous sets lose their order (and a one-element set its braces), host
//! prefixes lose `/32` or `/128`. `inet` tables, flowtables, stateful objects and
//! statements kube-proxy does not write are refused with what they are.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use thiserror::Error;

use super::nftables::{Chain, Collection, Element, NftTable};
use crate::model::IpFamily;

/// Why a listing could not be read.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ListingError {
    /// Not nft's JSON, or an object or statement this reader does not know (serde's
    /// message names it and where).
    #[error("nft's JSON listing: {0}")]
    Json(String),
    /// No table at all.
    #[error("the listing has no table")]
    NoTable,
    /// A table of another family, or a second table.
    #[error("table {family} {name}: {reason}")]
    Table {
        family: String,
        name: String,
        reason: &'static str,
    },
    /// A chain, set or map listed twice.
    #[error("{kind} {name} is listed twice")]
    Twice { kind: &'static str, name: String },
}

/// `nft -j list …`'s output: a list of objects.
#[derive(Debug, Deserialize)]
pub struct Listing {
    pub nftables: Vec<Object>,
}

/// One listed object (`{"table": {…}}`, …).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Object {
    Metainfo(serde::de::IgnoredAny),
    Table(TableDecl),
    Chain(ChainDecl),
    Set(SetDecl),
    Map(SetDecl),
    Rule(RuleDecl),
}

#[derive(Debug, Deserialize)]
pub struct TableDecl {
    pub family: String,
    pub name: String,
}

#[derive(Debug, Deserialize)]
pub struct ChainDecl {
    pub name: String,
    /// `filter`, `nat` (base chains only).
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub hook: Option<String>,
    pub prio: Option<i64>,
    pub policy: Option<String>,
    pub comment: Option<String>,
}

/// A set or map.
#[derive(Debug, Deserialize)]
pub struct SetDecl {
    pub name: String,
    /// The key's type, one or concatenated.
    #[serde(rename = "type")]
    pub key: OneOrMany,
    /// A map's value type.
    pub map: Option<OneOrMany>,
    #[serde(default)]
    pub flags: Vec<String>,
    /// Seconds.
    pub timeout: Option<u64>,
    #[serde(rename = "gc-interval")]
    pub gc_interval: Option<u64>,
    pub size: Option<u64>,
    pub policy: Option<String>,
    pub comment: Option<String>,
    /// Set elements (expressions); map entries (`[key, value]`).
    #[serde(default)]
    pub elem: Vec<Expr>,
}

#[derive(Debug, Deserialize)]
pub struct RuleDecl {
    pub chain: String,
    pub comment: Option<String>,
    pub expr: Vec<Stmt>,
}

/// A string or a list of them (`"ipv4_addr"`, `["ipv4_addr", "inet_proto"]`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn join(&self, sep: &str) -> String {
        match self {
            OneOrMany::One(s) => s.clone(),
            OneOrMany::Many(v) => v.join(sep),
        }
    }
}

/// A statement of a rule.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stmt {
    Match {
        op: String,
        left: Expr,
        right: Expr,
    },
    Vmap {
        key: Expr,
        data: Expr,
    },
    Mangle {
        key: Expr,
        value: Expr,
    },
    /// `update @set { key }` (and `add`).
    Set {
        op: String,
        elem: Expr,
        set: String,
    },
    Dnat(Option<Nat>),
    Snat(Option<Nat>),
    Masquerade(Option<Nat>),
    Reject(Option<Reject>),
    Counter(serde::de::IgnoredAny),
    Jump(Target),
    Goto(Target),
    Accept,
    Drop,
    Return,
    Continue,
}

/// A jump's or goto's chain.
#[derive(Debug, Deserialize)]
pub struct Target {
    pub target: String,
}

/// A NAT statement's arguments.
#[derive(Debug, Deserialize)]
pub struct Nat {
    pub addr: Option<Expr>,
    pub port: Option<Expr>,
    pub flags: Option<OneOrMany>,
}

#[derive(Debug, Deserialize)]
pub struct Reject {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub expr: Option<String>,
}

/// An expression: an immediate (address, name, `@set`, number), a list, or an operation.
#[derive(Debug)]
pub enum Expr {
    Number(u64),
    Text(String),
    List(Vec<Expr>),
    Op(Box<Op>),
}

/// By the JSON value's kind (serde's `untagged` would buffer every expression first: 8×
/// slower on a 10,000-service table).
impl<'de> Deserialize<'de> for Expr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Kind;
        impl<'de> serde::de::Visitor<'de> for Kind {
            type Value = Expr;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an nft expression")
            }
            fn visit_u64<E>(self, n: u64) -> Result<Expr, E> {
                Ok(Expr::Number(n))
            }
            fn visit_str<E>(self, s: &str) -> Result<Expr, E> {
                Ok(Expr::Text(s.to_string()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Expr, A::Error> {
                let mut items = Vec::new();
                while let Some(e) = seq.next_element()? {
                    items.push(e);
                }
                Ok(Expr::List(items))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Expr, A::Error> {
                let op = Op::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(Expr::Op(Box::new(op)))
            }
        }
        d.deserialize_any(Kind)
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Payload {
        protocol: String,
        field: String,
    },
    Meta {
        key: String,
    },
    Ct {
        key: String,
    },
    Fib {
        result: String,
        flags: Vec<String>,
    },
    Concat(Vec<Expr>),
    Prefix {
        addr: Expr,
        len: u8,
    },
    Range(Vec<Expr>),
    /// An anonymous set (a vmap's: `[key, verdict]` entries).
    Set(Vec<Expr>),
    Numgen {
        mode: String,
        #[serde(rename = "mod")]
        modulus: u64,
        #[serde(default)]
        offset: u64,
    },
    /// A set element with its options (`timeout`, `expires` are not kept).
    Elem {
        val: Expr,
        comment: Option<String>,
    },
    #[serde(rename = "|")]
    Or([Expr; 2]),
    #[serde(rename = "^")]
    Xor([Expr; 2]),
    #[serde(rename = "&")]
    And([Expr; 2]),
    // A verdict map's values, as in [`Stmt`] (an untagged `Stmt` variant would make serde
    // buffer every operation).
    Jump(Target),
    Goto(Target),
    Accept,
    Drop,
    Return,
    Continue,
}

/// The table `nft -j list table ip kube-proxy` (or `ip6`) printed, in the emitter's
/// spelling (see the module documentation). The listed objects are read one at a time
/// into the table (a 10,000-service listing is never held as typed values whole).
pub fn parse(json: &str) -> Result<NftTable, ListingError> {
    use serde::de::DeserializeSeed as _;
    let mut r = Reader::default();
    let mut de = serde_json::Deserializer::from_str(json);
    let read = Objects(&mut r).deserialize(&mut de).and_then(|()| de.end());
    if let Some(e) = r.error {
        return Err(e);
    }
    read.map_err(|e| ListingError::Json(e.to_string()))?;
    r.finish()
}

/// `nft -j list tables` as `FAMILY NAME` (`ip kube-proxy`), in the order listed.
pub fn tables(json: &str) -> Result<Vec<String>, ListingError> {
    let listing: Listing =
        serde_json::from_str(json).map_err(|e| ListingError::Json(e.to_string()))?;
    Ok(listing
        .nftables
        .iter()
        .filter_map(|o| match o {
            Object::Table(t) => Some(format!("{} {}", t.family, t.name)),
            _ => None,
        })
        .collect())
}

/// The table being read, object by object.
#[derive(Default)]
struct Reader {
    t: NftTable,
    seen: bool,
    /// Sets' declarations (without their elements), for their spec once every rule is
    /// read (a set a rule updates is `dynamic`).
    sets: Vec<SetDecl>,
    updated: BTreeSet<String>,
    /// Why reading stopped (serde's error then only says that it did).
    error: Option<ListingError>,
}

impl Reader {
    fn object(&mut self, o: Object) -> Result<(), ListingError> {
        match o {
            Object::Metainfo(_) => {}
            Object::Table(d) => {
                let refuse = |reason| ListingError::Table {
                    family: d.family.clone(),
                    name: d.name.clone(),
                    reason,
                };
                if self.seen {
                    return Err(refuse("a second table in one listing"));
                }
                self.t.family = match d.family.as_str() {
                    "ip" => IpFamily::V4,
                    "ip6" => IpFamily::V6,
                    _ => return Err(refuse("only ip and ip6 tables are read")),
                };
                self.seen = true;
            }
            Object::Chain(c) => {
                let chain = Chain {
                    spec: chain_spec(&c),
                    rules: Vec::new(),
                };
                insert(&mut self.t.chains, &c.name, chain, "chain")?;
            }
            Object::Set(mut s) | Object::Map(mut s) => {
                let set = Collection {
                    spec: String::new(),
                    is_map: s.map.is_some(),
                    elements: std::mem::take(&mut s.elem).iter().map(element).collect(),
                };
                insert(&mut self.t.sets, &s.name, set, "set or map")?;
                self.sets.push(s);
            }
            Object::Rule(r) => {
                for s in &r.expr {
                    if let Stmt::Set { set, .. } = s {
                        self.updated.insert(set.trim_start_matches('@').to_string());
                    }
                }
                let rule = rule(&r);
                let chain = self.t.chains.entry(r.chain).or_default();
                chain.rules.push(rule);
            }
        }
        Ok(())
    }

    fn finish(mut self) -> Result<NftTable, ListingError> {
        if !self.seen {
            return Err(ListingError::NoTable);
        }
        for s in &self.sets {
            if let Some(c) = self.t.sets.get_mut(&s.name) {
                c.spec = set_spec(s, self.updated.contains(&s.name));
            }
        }
        Ok(self.t)
    }
}

/// `{"nftables": [...]}` (the map, then its array), each object handed to the reader as
/// it is read.
struct Objects<'r>(&'r mut Reader);

impl<'de> serde::de::DeserializeSeed<'de> for Objects<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Objects<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("nft's JSON listing ({\"nftables\": [objects]})")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            if key == "nftables" {
                map.next_value_seed(Objects(&mut *self.0))?;
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        use serde::de::Error as _;
        while let Some(o) = seq.next_element::<Object>()? {
            if let Err(e) = self.0.object(o) {
                let msg = e.to_string();
                self.0.error = Some(e);
                return Err(A::Error::custom(msg));
            }
        }
        Ok(())
    }
}

fn insert<T>(
    into: &mut BTreeMap<String, T>,
    name: &str,
    item: T,
    kind: &'static str,
) -> Result<(), ListingError> {
    if into.insert(name.to_string(), item).is_some() {
        return Err(ListingError::Twice {
            kind,
            name: name.to_string(),
        });
    }
    Ok(())
}

/// `type filter hook prerouting priority -110 ; comment "…"` (no default policy).
fn chain_spec(c: &ChainDecl) -> String {
    let mut parts = Vec::new();
    if let (Some(kind), Some(hook)) = (&c.kind, &c.hook) {
        parts.push(format!(
            "type {kind} hook {hook} priority {}",
            c.prio.unwrap_or(0)
        ));
    }
    if let Some(p) = c.policy.as_deref().filter(|p| *p != "accept") {
        parts.push(format!("policy {p}"));
    }
    if let Some(comment) = &c.comment {
        parts.push(format!("comment \"{comment}\""));
    }
    parts.join(" ; ")
}

/// A set's or map's declaration as the emitter writes it (`updated`: a rule updates it).
fn set_spec(s: &SetDecl, updated: bool) -> String {
    let mut ty = format!("type {}", s.key.join(" . "));
    if let Some(v) = &s.map {
        ty = format!("{ty} : {}", v.join(" . "));
    }
    let mut parts = vec![ty];
    if let Some(size) = s.size.filter(|n| *n != 65535) {
        parts.push(format!("size {size}"));
    }
    let mut flags: Vec<&str> = s.flags.iter().map(String::as_str).collect();
    if updated && !flags.contains(&"dynamic") {
        flags.push("dynamic");
    }
    // The emitter's order: dynamic first.
    flags.sort_by_key(|f| *f != "dynamic");
    if !flags.is_empty() {
        parts.push(format!("flags {}", flags.join(",")));
    }
    if let Some(t) = s.timeout {
        parts.push(format!("timeout {t}s"));
    }
    if let Some(g) = s.gc_interval {
        parts.push(format!("gc-interval {g}s"));
    }
    if let Some(p) = &s.policy {
        parts.push(format!("policy {p}"));
    }
    if let Some(c) = &s.comment {
        parts.push(format!("comment \"{c}\""));
    }
    parts.join(" ; ")
}

/// A listed element: a key (maybe wrapped in `elem` with its comment), or a map's
/// `[key, value]`.
fn element(e: &Expr) -> Element {
    let (key, value) = match e {
        Expr::List(kv) if kv.len() == 2 => (&kv[0], Some(expr(&kv[1], false))),
        _ => (e, None),
    };
    let (key, comment) = match key {
        Expr::Op(op) => match op.as_ref() {
            Op::Elem { val, comment } => (val, comment.clone()),
            _ => (key, None),
        },
        _ => (key, None),
    };
    Element {
        key: expr(key, false),
        comment,
        value,
    }
}

/// A rule's statements in the emitter's spelling, its comment last.
fn rule(r: &RuleDecl) -> String {
    let mut words: Vec<String> = r.expr.iter().filter_map(stmt).collect();
    if let Some(c) = &r.comment {
        words.push(format!("comment \"{c}\""));
    }
    words.join(" ")
}

fn stmt(s: &Stmt) -> Option<String> {
    Some(match s {
        Stmt::Match { op, left, right } => {
            let (l, r) = (expr(left, false), expr(right, false));
            let bitwise =
                matches!(left, Expr::Op(o) if matches!(**o, Op::Or(_) | Op::Xor(_) | Op::And(_)));
            match op.as_str() {
                "==" if bitwise => format!("{l} == {r}"),
                "==" | "in" => format!("{l} {r}"),
                op => format!("{l} {op} {r}"),
            }
        }
        Stmt::Vmap { key, data } => {
            let data = match data {
                Expr::Op(o) => match o.as_ref() {
                    Op::Set(arms) => braces(arms, " , "),
                    _ => expr(data, false),
                },
                _ => expr(data, false),
            };
            format!("{} vmap {data}", expr(key, false))
        }
        Stmt::Mangle { key, value } => format!("{} set {}", expr(key, false), expr(value, false)),
        Stmt::Set { op, elem, set } => format!("{op} {set} {{ {} }}", expr(elem, false)),
        Stmt::Dnat(n) => nat("dnat", n.as_ref()),
        Stmt::Snat(n) => nat("snat", n.as_ref()),
        Stmt::Masquerade(n) => nat("masquerade", n.as_ref()),
        Stmt::Reject(r) => match r {
            Some(Reject {
                kind: Some(kind),
                expr: Some(e),
            }) if !(kind.starts_with("icmp") && e == "port-unreachable") => {
                format!("reject with {kind} {e}")
            }
            Some(Reject {
                kind: Some(kind),
                expr: None,
            }) => format!("reject with {kind}"),
            _ => "reject".to_string(),
        },
        Stmt::Counter(_) => return None,
        Stmt::Jump(t) => verdict("jump", Some(t)),
        Stmt::Goto(t) => verdict("goto", Some(t)),
        Stmt::Accept => verdict("accept", None),
        Stmt::Drop => verdict("drop", None),
        Stmt::Return => verdict("return", None),
        Stmt::Continue => verdict("continue", None),
    })
}

/// `goto CHAIN`, `drop`, ….
fn verdict(word: &str, target: Option<&Target>) -> String {
    match target {
        Some(t) => format!("{word} {}", t.target),
        None => word.to_string(),
    }
}

/// `dnat to 10.0.0.1:80`, `dnat to [fd00::1]:80`, `masquerade fully-random`.
fn nat(verb: &str, n: Option<&Nat>) -> String {
    let Some(n) = n else {
        return verb.to_string();
    };
    let addr = n.addr.as_ref().map(|a| expr(a, false));
    let to = match (addr, &n.port) {
        (Some(a), Some(p)) if a.contains(':') => format!(" to [{a}]:{}", expr(p, false)),
        (Some(a), Some(p)) => format!(" to {a}:{}", expr(p, false)),
        (Some(a), None) => format!(" to {a}"),
        (None, Some(p)) => format!(" to :{}", expr(p, false)),
        (None, None) => String::new(),
    };
    match &n.flags {
        Some(f) => format!("{verb}{to} {}", f.join(",")),
        None => format!("{verb}{to}"),
    }
}

/// `{ a, b }` (`{ 0 : goto x , 1 : goto y }` with `sep` ` , `).
fn braces(items: &[Expr], sep: &str) -> String {
    let items: Vec<String> = items
        .iter()
        .map(|i| match i {
            Expr::List(kv) if kv.len() == 2 => {
                format!("{} : {}", expr(&kv[0], false), expr(&kv[1], false))
            }
            _ => expr(i, false),
        })
        .collect();
    format!("{{ {} }}", items.join(sep))
}

/// An expression in the emitter's spelling; numbers in hexadecimal as bitwise operands.
fn expr(e: &Expr, hex: bool) -> String {
    match e {
        Expr::Number(n) if hex => format!("{n:#010x}"),
        Expr::Number(n) => n.to_string(),
        Expr::Text(s) => s.clone(),
        Expr::List(items) => items
            .iter()
            .map(|i| expr(i, hex))
            .collect::<Vec<_>>()
            .join(","),
        Expr::Op(op) => match op.as_ref() {
            Op::Payload { protocol, field } => format!("{protocol} {field}"),
            Op::Meta { key } if key == "mark" => "mark".into(),
            Op::Meta { key } => format!("meta {key}"),
            Op::Ct { key } => format!("ct {key}"),
            Op::Fib { result, flags } => format!("fib {} {result}", flags.join(" . ")),
            Op::Concat(items) => items
                .iter()
                .map(|i| expr(i, false))
                .collect::<Vec<_>>()
                .join(" . "),
            Op::Prefix { addr, len } => format!("{}/{len}", expr(addr, false)),
            Op::Range(r) => r
                .iter()
                .map(|i| expr(i, false))
                .collect::<Vec<_>>()
                .join("-"),
            Op::Set(items) => braces(items, ", "),
            Op::Numgen {
                mode,
                modulus,
                offset,
            } => match offset {
                0 => format!("numgen {mode} mod {modulus}"),
                o => format!("numgen {mode} mod {modulus} offset {o}"),
            },
            Op::Elem { val, .. } => expr(val, hex),
            Op::Or([l, r]) => format!("{} or {}", expr(l, true), expr(r, true)),
            Op::Xor([l, r]) => format!("{} xor {}", expr(l, true), expr(r, true)),
            Op::And([l, r]) => format!("{} and {}", expr(l, true), expr(r, true)),
            Op::Jump(t) => verdict("jump", Some(t)),
            Op::Goto(t) => verdict("goto", Some(t)),
            Op::Accept => verdict("accept", None),
            Op::Drop => verdict("drop", None),
            Op::Return => verdict("return", None),
            Op::Continue => verdict("continue", None),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::emit::WriterOptions;
    use crate::emit::nftables::{self, Packet};
    use crate::model::{Cidr, LocalDetector, Model, NodeSettings, Protocol};

    /// The services the listings below were made from: a TCP+UDP ClusterIP with two
    /// endpoints, a NodePort with sessionAffinity ClientIP, an externalTrafficPolicy Local
    /// LoadBalancer with an externalIP and loadBalancerSourceRanges, a NodePort without
    /// endpoints. Dual-stack, endpoints on node1 and node2.
    const SERVICES: &str = include_str!("testdata/nft-services.yaml");

    /// `nft -j list table ip kube-proxy` (nft 1.0.6) after `nft -f` of
    /// `xlb emit nftables --source file:SERVICES --ip-family ipv4 --node-name node1
    /// --node-ip 10.0.0.5,fd00::5 --local-address 127.0.0.1,10.0.0.5,::1,fd00::5
    /// --service-cidr 10.96.0.0/16,fd00:96::/112 --cluster-cidr 10.244.0.0/16
    /// --nodeport-addresses 10.0.0.0/24` in a scratch network namespace, and
    /// `nft add element` of one client (192.168.7.7) to an affinity set.
    const LISTING_V4: &str = include_str!("testdata/nft-kube-proxy-v4.json");

    /// The same for `--ip-family ipv6 --cluster-cidr fd00:244::/56` (no
    /// nodeport-addresses: NodePorts on every local address), one client (2001:db8:7::7)
    /// remembered with `timeout 1h`.
    const LISTING_V6: &str = include_str!("testdata/nft-kube-proxy-v6.json");

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn cidr(s: &str) -> Cidr {
        Cidr::parse_sloppy(s).expect("cidr")
    }

    fn model() -> Model {
        let loaded = crate::source::file::parse("t.yaml", SERVICES).expect("yaml");
        assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
        loaded.model
    }

    /// node1, as the listings were emitted for.
    fn node(family: IpFamily) -> NodeSettings {
        let (pods, node_ports) = match family {
            IpFamily::V4 => ("10.244.0.0/16", vec![cidr("10.0.0.0/24")]),
            IpFamily::V6 => ("fd00:244::/56", Vec::new()),
        };
        NodeSettings {
            node_name: "node1".into(),
            family,
            node_ips: vec![ip("10.0.0.5"), ip("fd00::5")],
            local_addresses: ["127.0.0.1", "10.0.0.5", "::1", "fd00::5"].map(ip).to_vec(),
            detector: LocalDetector::ClusterCidr(cidr(pods)),
            node_port_addresses: node_ports,
            service_cidrs: vec![cidr("10.96.0.0/16"), cidr("fd00:96::/112")],
            ..NodeSettings::default()
        }
    }

    fn packet(src: &str, dst: &str, dport: u16, protocol: Protocol) -> Packet {
        Packet {
            src: ip(src),
            dst: ip(dst),
            dport,
            protocol,
        }
    }

    /// Every packet gets the same outputs, masquerade and number of matched rules from the
    /// parsed listing as from the emitted table, and matches some rule.
    fn same_traces(listing: &str, family: IpFamily, packets: &[Packet]) {
        let node = node(family);
        let emitted = nftables::emit(&model(), &node, &WriterOptions::default());
        let parsed = parse(listing).expect("listing");
        assert_eq!(parsed.family, family);
        for pkt in packets {
            let (want, want_masq, want_rules) = nftables::trace_rules(&emitted, &node, *pkt);
            let (got, got_masq, got_rules) = nftables::trace_rules(&parsed, &node, *pkt);
            assert!(!want_rules.is_empty(), "{pkt:?}: no rule to compare");
            assert_eq!((&got, got_masq), (&want, want_masq), "{pkt:?}");
            assert_eq!(
                got_rules.len(),
                want_rules.len(),
                "{pkt:?}: {got_rules:#?} vs {want_rules:#?}"
            );
        }
        same_declarations(&parsed, &emitted);
    }

    /// Same chains, sets and specs; same elements (but the clients remembered in affinity
    /// sets); same rules but those whose anonymous set or host prefix nft respells.
    fn same_declarations(parsed: &NftTable, emitted: &NftTable) {
        let names = |t: &NftTable| t.chains.keys().cloned().collect::<Vec<_>>();
        assert_eq!(names(parsed), names(emitted));
        for (name, want) in &emitted.chains {
            let got = &parsed.chains[name];
            // nft 1.0.6's JSON lists no chain comment.
            let no_comment = got.spec.is_empty() && want.spec.starts_with("comment ");
            assert!(
                got.spec == want.spec || no_comment,
                "{name}: {got:?} vs {want:?}"
            );
            assert_eq!(got.rules.len(), want.rules.len(), "{name}");
            for (g, w) in got.rules.iter().zip(&want.rules) {
                let host = w.replace("/32 ", " ").replace("/128 ", " ");
                assert!(*g == host || w.contains(" { "), "{name}: {g:?} vs {w:?}");
            }
        }
        let sets = |t: &NftTable| t.sets.keys().cloned().collect::<Vec<_>>();
        assert_eq!(sets(parsed), sets(emitted));
        for (name, want) in &emitted.sets {
            let got = &parsed.sets[name];
            assert_eq!((&got.spec, got.is_map), (&want.spec, want.is_map), "{name}");
            if !name.starts_with("affinity-") {
                let sorted = |c: &Collection| {
                    let mut e = c.elements.clone();
                    e.sort();
                    e.dedup();
                    e
                };
                assert_eq!(sorted(got), sorted(want), "{name}");
            }
        }
    }

    /// A packet: source, destination, port, protocol.
    type Flow = (&'static str, &'static str, u16, Protocol);

    /// Per case: its IPv4 packet and its IPv6 one (`None`: no such case in IPv6).
    #[rustfmt::skip]
    const FLOWS: [(Flow, Option<Flow>); 13] = {
        use Protocol::{Tcp, Udp};
        [
            // ClusterIP, TCP and UDP, from a pod and from outside the cluster CIDR.
            (("10.244.5.5", "10.96.0.10", 80, Tcp),     Some(("fd00:244::55", "fd00:96::10", 80, Tcp))),
            (("10.0.0.99", "10.96.0.10", 53, Udp),      Some(("fd00::99", "fd00:96::10", 53, Udp))),
            // NodePort with affinity, and its ClusterIP.
            (("192.168.1.1", "10.0.0.5", 30080, Tcp),   Some(("2001:db8:9::1", "fd00::5", 30080, Tcp))),
            (("10.244.5.5", "10.96.0.20", 80, Tcp),     Some(("fd00:244::55", "fd00:96::20", 80, Tcp))),
            // LoadBalancer (eTP Local): an allowed range, a /32, a stranger.
            (("203.0.113.9", "192.0.2.100", 443, Tcp),  Some(("2001:db8:1::9", "2001:db8::100", 443, Tcp))),
            (("198.51.100.7", "192.0.2.100", 443, Tcp), None),
            (("8.8.8.8", "192.0.2.100", 443, Tcp),      Some(("2001:db8:2::9", "2001:db8::100", 443, Tcp))),
            // externalIP from a pod, NodePort from the node itself.
            (("10.244.3.3", "192.0.2.50", 443, Tcp),    Some(("fd00:244::33", "2001:db8::50", 443, Tcp))),
            (("10.0.0.5", "10.0.0.5", 30443, Tcp),      Some(("fd00::5", "fd00::5", 30443, Tcp))),
            // No endpoints, a ClusterIP's other port, an unallocated ClusterIP.
            (("10.244.5.5", "10.96.0.40", 80, Tcp),     Some(("fd00:244::55", "fd00:96::40", 80, Tcp))),
            (("192.168.1.1", "10.0.0.5", 30090, Tcp),   Some(("2001:db8:9::1", "fd00::5", 30090, Tcp))),
            (("10.244.5.5", "10.96.0.10", 81, Tcp),     Some(("fd00:244::55", "fd00:96::10", 81, Tcp))),
            (("10.244.5.5", "10.96.9.9", 80, Tcp),      Some(("fd00:244::55", "fd00:96::99", 80, Tcp))),
        ]
    };

    #[test]
    fn live_tables_trace_as_the_emitted_ones() {
        for (family, listing) in [(IpFamily::V4, LISTING_V4), (IpFamily::V6, LISTING_V6)] {
            let flows: Vec<Packet> = FLOWS
                .iter()
                .filter_map(|(v4, v6)| match family {
                    IpFamily::V4 => Some(*v4),
                    IpFamily::V6 => *v6,
                })
                .map(|(src, dst, port, proto)| packet(src, dst, port, proto))
                .collect();
            same_traces(listing, family, &flows);
        }
    }

    /// A `goto`'d chain that ends without a verdict returns to the chain that jumped to
    /// the one holding the `goto` (nft's semantics): an allowed LoadBalancer client passes
    /// `firewall-check` and is DNATed; a stranger is dropped.
    #[test]
    fn a_loadbalancer_client_in_an_allowed_range_reaches_the_endpoints() {
        let node = node(IpFamily::V4);
        for t in [
            parse(LISTING_V4).expect("listing"),
            nftables::emit(&model(), &node, &WriterOptions::default()),
        ] {
            let allowed = packet("203.0.113.9", "192.0.2.100", 443, Protocol::Tcp);
            let (out, _) = nftables::trace(&t, &node, allowed);
            assert!(!out.is_empty() && !out.contains("DROP"), "allowed: {out:?}");
            let stranger = packet("8.8.8.8", "192.0.2.100", 443, Protocol::Tcp);
            assert_eq!(nftables::trace(&t, &node, stranger).0, "DROP");
        }
    }

    #[test]
    fn live_elements_and_nft_spellings_are_read_back() {
        let t = parse(LISTING_V6).expect("listing");
        let remembered = &t.sets["affinity-QKRAFSXZ-ns/np/tcp/http__fd00.244.1..3/8080"];
        assert_eq!(remembered.elements[0].key, "2001:db8:7::7");
        let no_ep = &t.sets["no-endpoint-services"].elements[0];
        assert_eq!(no_ep.comment.as_deref(), Some("ns/empty:http"));
        assert_eq!(no_ep.value.as_deref(), Some("goto reject-chain"));
        assert_eq!(
            t.chains["masquerading"].rules,
            [
                "mark and 0x00004000 == 0 return",
                "mark set mark xor 0x00004000",
                "masquerade fully-random"
            ]
        );
        assert_eq!(
            t.chains["endpoint-DKVN7GZF-ns/lb/tcp/https__fd00.244.1..4/8443"].rules[1],
            "meta l4proto tcp dnat to [fd00:244:1::4]:8443"
        );
        // A counter (kube-proxy writes none) is left out; a handle is not kept.
        let counted = r#"{"nftables": [{"table": {"family": "ip", "name": "kube-proxy", "handle": 3}},
            {"chain": {"family": "ip", "table": "kube-proxy", "name": "x", "handle": 7}},
            {"rule": {"family": "ip", "table": "kube-proxy", "chain": "x", "handle": 9, "expr": [
                {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}},
                {"counter": {"packets": 0, "bytes": 0}},
                {"dnat": {"addr": "10.0.0.1", "port": 80}}]}}]}"#;
        let t = parse(counted).expect("listing with a counter");
        assert_eq!(
            t.chains["x"].rules,
            ["meta l4proto tcp dnat to 10.0.0.1:80"]
        );
    }

    #[test]
    fn the_tables_listed_are_named() {
        let list = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"table": {"family": "inet", "name": "filter", "handle": 1}}, {"table": {"family": "ip", "name": "kube-proxy", "handle": 2}}]}"#;
        assert_eq!(
            tables(list).expect("tables"),
            ["inet filter", "ip kube-proxy"]
        );
        assert!(tables("table ip kube-proxy\n").is_err());
    }

    #[test]
    fn what_is_not_kube_proxys_table_is_refused_by_name() {
        let err = parse("table ip kube-proxy {\n}\n").expect_err("text");
        assert!(matches!(err, ListingError::Json(_)), "{err}");
        assert_eq!(parse(r#"{"nftables": []}"#), Err(ListingError::NoTable));
        let inet = r#"{"nftables": [{"table": {"family": "inet", "name": "kube-proxy"}}]}"#;
        assert_eq!(
            parse(inet).expect_err("inet").to_string(),
            "table inet kube-proxy: only ip and ip6 tables are read"
        );
        let two = r#"{"nftables": [{"table": {"family": "ip", "name": "a"}}, {"table": {"family": "ip", "name": "b"}}]}"#;
        assert!(matches!(parse(two), Err(ListingError::Table { .. })));
        let flowtable = r#"{"nftables": [{"table": {"family": "ip", "name": "t"}}, {"flowtable": {"family": "ip", "name": "f"}}]}"#;
        let err = parse(flowtable).expect_err("flowtable").to_string();
        assert!(err.contains("flowtable"), "{err}");
        let log = r#"{"nftables": [{"table": {"family": "ip", "name": "t"}}, {"rule": {"chain": "c", "expr": [{"log": {"prefix": "x"}}]}}]}"#;
        let err = parse(log).expect_err("log").to_string();
        assert!(err.contains("log"), "{err}");
        let twice = r#"{"nftables": [{"table": {"family": "ip", "name": "t"}}, {"chain": {"name": "c"}}, {"chain": {"name": "c"}}]}"#;
        assert_eq!(
            parse(twice),
            Err(ListingError::Twice {
                kind: "chain",
                name: "c".into()
            })
        );
    }
}
