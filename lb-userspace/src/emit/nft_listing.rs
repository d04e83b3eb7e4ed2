//! Reads what `nft list table ip kube-proxy` (or `ip6`) prints — kube-proxy's live
//! nftables state on a node — back into an [`NftTable`], so that
//! [`nftables::trace`](super::nftables::trace) can follow packets through the rules a node
//! really has.
//!
//! nft lists a table in its own spelling, not in the `add …` commands that created it.
//! [`parse`] turns that spelling back into the emitter's where the two differ:
//!
//! * chain hooks: `priority filter; policy accept;` becomes `priority 0` (named priorities
//!   and their offsets, such as `dstnat - 10`, become numbers; the default `policy accept`
//!   is dropped);
//! * sets: the default `size 65535` of dynamic sets is dropped, `timeout 3h` becomes
//!   `timeout 10800s`; `elements = { … }` spread over lines becomes one [`Element`] per
//!   entry (its `comment` kept, the `timeout`/`expires` of live entries dropped);
//! * rules: `meta mark set meta mark | M` becomes `mark set mark or M` (`^` `xor`,
//!   `&` `and`, `== 0x00000000` `== 0`), `dnat ip to` / `dnat ip6 to` becomes `dnat to`,
//!   numeric `meta l4proto 6` becomes `meta l4proto tcp`, and the arms of
//!   `numgen … vmap { 0 : goto a, 1 : goto b }` are joined with ` , ` as the emitter does;
//! * `# handle N` (from `nft -a`) is dropped.
//!
//! What cannot be undone is left in nft's spelling, which the tracer reads as well:
//! anonymous sets lose their order and braces (`{ 10.96.0.0/16 }` is listed as
//! `10.96.0.0/16`) and host prefixes (`198.51.100.7/32` is listed as `198.51.100.7`).
//! The table's own comment and flags are not kept; `inet` tables, flowtables and
//! stateful objects are refused.

use thiserror::Error;

use super::nftables::{Chain, Collection, Element, NftTable};
use crate::model::IpFamily;

/// Why a listing could not be read.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ListingError {
    /// A line that does not belong where it is.
    #[error("line {line}: {text:?}: {reason}")]
    Syntax {
        line: usize,
        text: String,
        reason: &'static str,
    },
    /// The listing ends inside a block (the line that opened it).
    #[error("line {line}: {text:?}: the listing ends before this block is closed")]
    Unclosed { line: usize, text: String },
    /// No `table …` line at all.
    #[error("the listing has no table")]
    NoTable,
}

/// The table `nft list table ip kube-proxy` (or `ip6`) printed, in the emitter's spelling
/// where nft's differs (see the module documentation).
pub fn parse(text: &str) -> Result<NftTable, ListingError> {
    let mut p = Parser::default();
    for (i, raw) in text.lines().enumerate() {
        let line = strip_comment(raw).trim();
        if !line.is_empty() {
            p.line(i + 1, line)?;
        }
    }
    p.finish()
}

/// Where the parser is.
#[derive(Debug, Default)]
enum State {
    /// Before the `table` line.
    #[default]
    Top,
    /// Inside the table's braces.
    Table,
    /// Inside a set or map.
    Set(Open<Collection>),
    /// Inside a chain.
    Chain(Open<Chain>),
    /// After the table's closing brace.
    Done,
}

/// A set, map or chain being read: its name, contents and opening line.
#[derive(Debug)]
struct Open<T> {
    name: String,
    item: T,
    line: usize,
    text: String,
    /// Declaration parts (`type …`, `comment "…"`), joined with ` ; ` into the spec.
    spec: Vec<String>,
    /// An `elements = { …` not closed yet, and the line it started on.
    pending: Option<(usize, String)>,
    /// The brace depth and quoting at the end of `pending` (so each listed line is scanned
    /// once, not the whole block again: nft lists an element a line).
    braces: (i32, bool),
}

impl<T> Open<T> {
    fn new(name: &str, item: T, line: usize, text: &str) -> Self {
        Self {
            name: name.to_string(),
            item,
            line,
            text: text.to_string(),
            spec: Vec::new(),
            pending: None,
            braces: (0, false),
        }
    }
}

#[derive(Debug, Default)]
struct Parser {
    table: NftTable,
    state: State,
    /// The `table` line, for an unclosed table.
    opened: Option<(usize, String)>,
}

fn syntax(line: usize, text: &str, reason: &'static str) -> ListingError {
    ListingError::Syntax {
        line,
        text: text.to_string(),
        reason,
    }
}

impl Parser {
    /// Takes one non-empty, trimmed line.
    fn line(&mut self, n: usize, l: &str) -> Result<(), ListingError> {
        match std::mem::take(&mut self.state) {
            State::Top => self.top(n, l),
            State::Table => self.in_table(n, l),
            State::Set(s) => self.in_set(s, n, l),
            State::Chain(c) => self.in_chain(c, n, l),
            State::Done => Err(syntax(n, l, "text after the table's closing brace")),
        }
    }

    /// `table ip NAME {`.
    fn top(&mut self, n: usize, l: &str) -> Result<(), ListingError> {
        let words: Vec<&str> = l.split_whitespace().collect();
        let family = match words.as_slice() {
            ["table", "ip", _, "{"] => IpFamily::V4,
            ["table", "ip6", _, "{"] => IpFamily::V6,
            ["table", _, _, "{"] => return Err(syntax(n, l, "only ip and ip6 tables are read")),
            _ => return Err(syntax(n, l, "expected `table ip|ip6 NAME {`")),
        };
        self.table.family = family;
        self.opened = Some((n, l.to_string()));
        self.state = State::Table;
        Ok(())
    }

    /// A line directly inside the table: a set, map or chain opening, or the table's end.
    fn in_table(&mut self, n: usize, l: &str) -> Result<(), ListingError> {
        self.state = State::Table;
        if l == "}" {
            self.state = State::Done;
            return Ok(());
        }
        if l.starts_with("comment ") || l.starts_with("flags ") {
            return Ok(());
        }
        let Some(head) = l.strip_suffix('{') else {
            return Err(syntax(n, l, "expected a set, map or chain"));
        };
        let (kind, name) = head.trim().split_once(' ').unwrap_or((head.trim(), ""));
        let name = unquote(name.trim());
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err(syntax(n, l, "expected a set, map or chain"));
        }
        self.state = match kind {
            "set" | "map" => State::Set(Open::new(
                name,
                Collection {
                    is_map: kind == "map",
                    ..Collection::default()
                },
                n,
                l,
            )),
            "chain" => State::Chain(Open::new(name, Chain::default(), n, l)),
            _ => return Err(syntax(n, l, "expected a set, map or chain")),
        };
        Ok(())
    }

    /// A line inside a set or map: a declaration, (part of) its elements, or its end.
    fn in_set(&mut self, mut s: Open<Collection>, n: usize, l: &str) -> Result<(), ListingError> {
        if let Some((start, mut buf)) = s.pending.take() {
            buf.push(' ');
            let from = buf.len();
            buf.push_str(l);
            self.elements(&mut s, start, buf, from)?;
        } else if l == "}" {
            s.item.spec = s.spec.join(" ; ");
            if self.table.sets.insert(s.name.clone(), s.item).is_some() {
                return Err(syntax(n, l, "a set or map of this name was listed before"));
            }
            self.state = State::Table;
            return Ok(());
        } else if let Some(rest) = l.strip_prefix("elements = ") {
            self.elements(&mut s, n, rest.to_string(), 0)?;
        } else if let Some(part) = set_attribute(l) {
            s.spec.extend(part);
        } else {
            return Err(syntax(n, l, "unknown set or map attribute"));
        }
        self.state = State::Set(s);
        Ok(())
    }

    /// `{ … }` after `elements =`, once its braces close (else kept for the next line);
    /// `buf[from..]` is what the last line added.
    fn elements(
        &mut self,
        s: &mut Open<Collection>,
        start: usize,
        buf: String,
        from: usize,
    ) -> Result<(), ListingError> {
        let (depth, quoted) = braces(buf.get(from..).unwrap_or(""), s.braces);
        if depth > 0 || quoted {
            s.braces = (depth, quoted);
            s.pending = Some((start, buf));
            return Ok(());
        }
        s.braces = (0, false);
        let inner = buf
            .trim()
            .strip_prefix('{')
            .and_then(|b| b.strip_suffix('}'))
            .ok_or_else(|| syntax(start, &buf, "expected `elements = { … }`"))?;
        for entry in split_outside_quotes(inner, ',') {
            let entry = entry.trim();
            if !entry.is_empty() {
                let e = element(entry).ok_or_else(|| syntax(start, entry, "not an element"))?;
                s.item.elements.push(e);
            }
        }
        Ok(())
    }

    /// A line inside a chain: its hook or comment (before any rule), a rule, or its end.
    fn in_chain(&mut self, mut c: Open<Chain>, n: usize, l: &str) -> Result<(), ListingError> {
        if l == "}" {
            c.item.spec = c.spec.join(" ; ");
            if self.table.chains.insert(c.name.clone(), c.item).is_some() {
                return Err(syntax(n, l, "a chain of this name was listed before"));
            }
            self.state = State::Table;
            return Ok(());
        }
        let declaring = c.item.rules.is_empty();
        if declaring && l.starts_with("type ") {
            c.spec.extend(hook(l));
        } else if declaring && l.starts_with("comment \"") {
            c.spec.push(l.to_string());
        } else {
            c.item.rules.push(rule(l));
        }
        self.state = State::Chain(c);
        Ok(())
    }

    /// The table, once every block is closed.
    fn finish(self) -> Result<NftTable, ListingError> {
        let open = match &self.state {
            State::Done => return Ok(self.table),
            State::Top => return Err(ListingError::NoTable),
            State::Table => self.opened.clone(),
            State::Set(s) => Some(s.pending.clone().unwrap_or((s.line, s.text.clone()))),
            State::Chain(c) => Some((c.line, c.text.clone())),
        };
        let (line, text) = open.unwrap_or_default();
        Err(ListingError::Unclosed { line, text })
    }
}

/// The line without a `#` comment (`# handle 12` from `nft -a`), quotes respected.
fn strip_comment(line: &str) -> &str {
    let mut quoted = false;
    for (i, ch) in line.char_indices() {
        match ch {
            '"' => quoted = !quoted,
            '#' if !quoted => return &line[..i],
            _ => {}
        }
    }
    line
}

/// A name without the quotes nft may put around it.
fn unquote(s: &str) -> &str {
    s.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s)
}

/// The brace depth and quoting after `s` (braces outside quotes), from `(depth, quoted)`
/// before it.
fn braces(s: &str, (mut depth, mut quoted): (i32, bool)) -> (i32, bool) {
    for ch in s.chars() {
        match ch {
            '"' => quoted = !quoted,
            '{' if !quoted => depth += 1,
            '}' if !quoted => depth -= 1,
            _ => {}
        }
    }
    (depth, quoted)
}

/// `s` split at every `sep` outside quotes.
fn split_outside_quotes(s: &str, sep: char) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut quoted, mut from) = (false, 0);
    for (i, ch) in s.char_indices() {
        if ch == '"' {
            quoted = !quoted;
        } else if ch == sep && !quoted {
            out.push(&s[from..i]);
            from = i + ch.len_utf8();
        }
    }
    out.push(&s[from..]);
    out
}

/// `s` split at whitespace outside quotes (quotes kept).
fn words(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut quoted, mut from) = (false, None);
    for (i, ch) in s.char_indices() {
        if ch == '"' {
            quoted = !quoted;
        }
        if ch.is_whitespace() && !quoted {
            if let Some(f) = from.take() {
                out.push(&s[f..i]);
            }
        } else if from.is_none() {
            from = Some(i);
        }
    }
    if let Some(f) = from {
        out.push(&s[f..]);
    }
    out
}

/// A set or map declaration line as spec parts (none for nft's defaults); `None` when
/// the attribute is unknown.
fn set_attribute(l: &str) -> Option<Option<String>> {
    let (key, value) = l.split_once(' ').unwrap_or((l, ""));
    match key {
        "size" if value == "65535" => Some(None),
        "timeout" => Some(Some(format!("timeout {}", seconds(value)))),
        "type" | "typeof" | "flags" | "comment" | "size" | "gc-interval" | "policy"
        | "auto-merge" | "counter" => Some(Some(l.to_string())),
        _ => None,
    }
}

/// An nft duration (`3h`, `1h30m`, `59m59s980ms`) in the emitter's `10800s`; as listed
/// when it is not one.
fn seconds(d: &str) -> String {
    match duration_ms(d) {
        Some(ms) if ms.is_multiple_of(1000) => format!("{}s", ms / 1000),
        Some(ms) => format!("{ms}ms"),
        None => d.to_string(),
    }
}

/// An nft duration in milliseconds.
fn duration_ms(d: &str) -> Option<u64> {
    let mut total: u64 = 0;
    let mut rest = d;
    while !rest.is_empty() {
        let (n, r) = rest.split_at(rest.find(|c: char| !c.is_ascii_digit())?);
        let (unit, r) = r.split_at(r.find(|c: char| c.is_ascii_digit()).unwrap_or(r.len()));
        let scale = match unit {
            "d" => 86_400_000,
            "h" => 3_600_000,
            "m" => 60_000,
            "s" => 1_000,
            "ms" => 1,
            _ => return None,
        };
        total = total.checked_add(n.parse::<u64>().ok()?.checked_mul(scale)?)?;
        rest = r;
    }
    (!d.is_empty()).then_some(total)
}

/// One listed element: `KEY [timeout T] [expires T] [counter …] [comment "C"] [: VALUE]`.
fn element(entry: &str) -> Option<Element> {
    let w = words(entry);
    let mut key: Vec<&str> = Vec::new();
    let mut comment = None;
    let mut value = None;
    let mut i = 0;
    while i < w.len() {
        match w[i] {
            ":" => {
                value = Some(w[i + 1..].join(" "));
                break;
            }
            "timeout" | "expires" => i += 1,
            "counter" => i += 4, // counter packets N bytes M
            "comment" => {
                comment = w.get(i + 1).map(|c| unquote(c).to_string());
                i += 1;
            }
            k => key.push(k),
        }
        i += 1;
    }
    if key.is_empty() || value.as_deref() == Some("") {
        return None;
    }
    Some(Element {
        key: key.join(" "),
        comment,
        value,
    })
}

/// A chain's `type … hook … priority P; policy accept;` as spec parts: the priority as a
/// number, the default policy dropped.
fn hook(l: &str) -> Vec<String> {
    l.split(';')
        .map(str::trim)
        .filter(|p| !p.is_empty() && *p != "policy accept")
        .map(|p| match p.split_once(" priority ") {
            Some((head, prio)) => format!("{head} priority {}", priority(prio)),
            None => p.to_string(),
        })
        .collect()
}

/// A named priority (`dstnat - 10`) as its number (`-110`); as listed when unknown.
fn priority(p: &str) -> String {
    let w: Vec<&str> = p.split_whitespace().collect();
    let base = |name: &str| -> Option<i64> {
        match name {
            "raw" => Some(-300),
            "mangle" => Some(-150),
            "dstnat" => Some(-100),
            "filter" => Some(0),
            "security" => Some(50),
            "srcnat" => Some(100),
            n => n.parse().ok(),
        }
    };
    let value = match w.as_slice() {
        [name] => base(name),
        [name, "+", off] => base(name).zip(off.parse::<i64>().ok()).map(|(b, o)| b + o),
        [name, "-", off] => base(name).zip(off.parse::<i64>().ok()).map(|(b, o)| b - o),
        _ => None,
    };
    value.map_or_else(|| p.to_string(), |v| v.to_string())
}

/// A listed rule in the emitter's spelling.
fn rule(l: &str) -> String {
    let r = mark_ops(l);
    let r = dnat_family(&r);
    let r = l4proto_names(&r);
    numgen_arms(&r)
}

/// `meta mark set meta mark | M` as `mark set mark or M` (also `^`, `&`, `== 0x00000000`).
fn mark_ops(l: &str) -> String {
    if !l.starts_with("meta mark ") {
        return l.to_string();
    }
    let w: Vec<&str> = l.split(' ').collect();
    let mut out: Vec<&str> = Vec::new();
    for (i, word) in w.iter().enumerate() {
        let word = match *word {
            "meta" if w.get(i + 1) == Some(&"mark") => continue,
            "|" => "or",
            "^" => "xor",
            "&" => "and",
            v if i > 0 && w[i - 1] == "==" && is_zero_hex(v) => "0",
            v => v,
        };
        out.push(word);
    }
    out.join(" ")
}

fn is_zero_hex(v: &str) -> bool {
    v.strip_prefix("0x")
        .is_some_and(|h| !h.is_empty() && h.chars().all(|c| c == '0'))
}

/// `dnat ip to` / `dnat ip6 to` (nft's spelling when it names the family) as `dnat to`.
fn dnat_family(l: &str) -> String {
    l.replace("dnat ip to ", "dnat to ")
        .replace("dnat ip6 to ", "dnat to ")
}

/// `meta l4proto 6` as `meta l4proto tcp` (also udp and sctp).
fn l4proto_names(l: &str) -> String {
    let mut r = l.to_string();
    for (num, name) in [("6", "tcp"), ("17", "udp"), ("132", "sctp")] {
        let from = format!("meta l4proto {num} ");
        if r.contains(&from) {
            r = r.replace(&from, &format!("meta l4proto {name} "));
        }
    }
    r
}

/// `numgen … vmap { 0 : goto a, 1 : goto b }` with the arms joined by ` , `, as emitted.
fn numgen_arms(l: &str) -> String {
    let Some((head, rest)) = l.split_once(" vmap { ") else {
        return l.to_string();
    };
    if !head.contains("numgen ") {
        return l.to_string();
    }
    let Some((arms, tail)) = rest.split_once('}') else {
        return l.to_string();
    };
    let arms: Vec<&str> = arms.split(',').map(str::trim).collect();
    format!("{head} vmap {{ {} }}{tail}", arms.join(" , "))
}

/// `t` as `nft list table` prints it (a table block, its sets and maps, then its chains),
/// in the spelling [`parse`] reads back into `t`: hooks with their numeric priority and
/// `policy accept;`, one element a line. For whoever needs a node's live text without a
/// node (the shadow bench); rules stay in the emitter's spelling, which [`parse`] keeps.
pub fn listing(t: &NftTable) -> String {
    use std::fmt::Write as _;
    let family = match t.family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    };
    let mut out = format!("table {family} {} {{\n", super::nftables::TABLE);
    let parts = |spec: &str| -> Vec<String> {
        spec.split(" ; ")
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect()
    };
    for (name, s) in &t.sets {
        let kind = if s.is_map { "map" } else { "set" };
        let _ = writeln!(out, "\t{kind} {name} {{");
        for p in parts(&s.spec) {
            let _ = writeln!(out, "\t\t{p}");
        }
        if !s.elements.is_empty() {
            let items: Vec<String> = s
                .elements
                .iter()
                .map(|e| {
                    let mut item = e.key.clone();
                    if let Some(c) = &e.comment {
                        let _ = write!(item, " comment \"{c}\"");
                    }
                    if let Some(v) = &e.value {
                        let _ = write!(item, " : {v}");
                    }
                    item
                })
                .collect();
            let _ = writeln!(out, "\t\telements = {{ {} }}", items.join(",\n\t\t\t     "));
        }
        out.push_str("\t}\n\n");
    }
    for (name, c) in &t.chains {
        let _ = writeln!(out, "\tchain {name} {{");
        for p in parts(&c.spec) {
            if p.starts_with("type ") {
                let _ = writeln!(out, "\t\t{p}; policy accept;");
            } else {
                let _ = writeln!(out, "\t\t{p}");
            }
        }
        for r in &c.rules {
            let _ = writeln!(out, "\t\t{r}");
        }
        out.push_str("\t}\n\n");
    }
    out.push_str("}\n");
    out
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
    const SERVICES: &str = r#"
apiVersion: v1
kind: Service
metadata: {namespace: ns, name: web}
spec:
  type: ClusterIP
  ipFamilyPolicy: PreferDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: 10.96.0.10
  clusterIPs: ["10.96.0.10", "fd00:96::10"]
  ports:
  - {name: http, port: 80, protocol: TCP, targetPort: 8080}
  - {name: dns, port: 53, protocol: UDP, targetPort: 5353}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {namespace: ns, name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}, {name: dns, port: 5353, protocol: UDP}]
endpoints:
- {addresses: ["10.244.1.2"], conditions: {ready: true}, nodeName: node1}
- {addresses: ["10.244.2.2"], conditions: {ready: true}, nodeName: node2}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {namespace: ns, name: web-2, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: http, port: 8080, protocol: TCP}, {name: dns, port: 5353, protocol: UDP}]
endpoints:
- {addresses: ["fd00:244:1::2"], conditions: {ready: true}, nodeName: node1}
- {addresses: ["fd00:244:2::2"], conditions: {ready: true}, nodeName: node2}
---
apiVersion: v1
kind: Service
metadata: {namespace: ns, name: np}
spec:
  type: NodePort
  ipFamilyPolicy: PreferDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: 10.96.0.20
  clusterIPs: ["10.96.0.20", "fd00:96::20"]
  sessionAffinity: ClientIP
  ports:
  - {name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {namespace: ns, name: np-1, labels: {kubernetes.io/service-name: np}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: ["10.244.1.3"], conditions: {ready: true}, nodeName: node1}
- {addresses: ["10.244.2.3"], conditions: {ready: true}, nodeName: node2}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {namespace: ns, name: np-2, labels: {kubernetes.io/service-name: np}}
addressType: IPv6
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: ["fd00:244:1::3"], conditions: {ready: true}, nodeName: node1}
- {addresses: ["fd00:244:2::3"], conditions: {ready: true}, nodeName: node2}
---
apiVersion: v1
kind: Service
metadata: {namespace: ns, name: lb}
spec:
  type: LoadBalancer
  ipFamilyPolicy: PreferDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: 10.96.0.30
  clusterIPs: ["10.96.0.30", "fd00:96::30"]
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  loadBalancerSourceRanges: ["203.0.113.0/24", "198.51.100.7/32", "2001:db8:1::/48"]
  externalIPs: ["192.0.2.50", "2001:db8::50"]
  ports:
  - {name: https, port: 443, protocol: TCP, targetPort: 8443, nodePort: 30443}
status:
  loadBalancer:
    ingress: [{ip: 192.0.2.100}, {ip: "2001:db8::100"}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {namespace: ns, name: lb-1, labels: {kubernetes.io/service-name: lb}}
addressType: IPv4
ports: [{name: https, port: 8443, protocol: TCP}]
endpoints:
- {addresses: ["10.244.1.4"], conditions: {ready: true}, nodeName: node1}
- {addresses: ["10.244.2.4"], conditions: {ready: true}, nodeName: node2}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {namespace: ns, name: lb-2, labels: {kubernetes.io/service-name: lb}}
addressType: IPv6
ports: [{name: https, port: 8443, protocol: TCP}]
endpoints:
- {addresses: ["fd00:244:1::4"], conditions: {ready: true}, nodeName: node1}
- {addresses: ["fd00:244:2::4"], conditions: {ready: true}, nodeName: node2}
---
apiVersion: v1
kind: Service
metadata: {namespace: ns, name: empty}
spec:
  type: NodePort
  ipFamilyPolicy: PreferDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: 10.96.0.40
  clusterIPs: ["10.96.0.40", "fd00:96::40"]
  ports:
  - {name: http, port: 80, protocol: TCP, nodePort: 30090}
"#;

    /// `nft list table ip kube-proxy` (nft 1.0.6) after `nft -f` of
    /// `xlb emit nftables --source file:SERVICES --ip-family ipv4 --node-name node1
    /// --node-ip 10.0.0.5,fd00::5 --local-address 127.0.0.1,10.0.0.5,::1,fd00::5
    /// --service-cidr 10.96.0.0/16,fd00:96::/112 --cluster-cidr 10.244.0.0/16
    /// --nodeport-addresses 10.0.0.0/24` and `nft add element` of one client to an
    /// affinity set.
    const LISTING_V4: &str = r##"table ip kube-proxy {
	comment "rules for kube-proxy"
	set affinity-5LON265A-ns/np/tcp/http__10.244.2.3/8080 {
		type ipv4_addr
		size 65535
		flags dynamic,timeout
		timeout 3h
	}

	set affinity-QFN57FJH-ns/np/tcp/http__10.244.1.3/8080 {
		type ipv4_addr
		size 65535
		flags dynamic,timeout
		timeout 3h
		elements = { 192.168.7.7 expires 2h59m59s968ms }
	}

	set cluster-ips {
		type ipv4_addr
		comment "Active ClusterIPs"
		elements = { 10.96.0.10, 10.96.0.20,
			     10.96.0.30, 10.96.0.40 }
	}

	map firewall-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "destinations that are subject to LoadBalancerSourceRanges"
		elements = { 192.0.2.100 . tcp . 443 : goto firewall-XI5Y37DP-ns/lb/tcp/https }
	}

	map no-endpoint-nodeports {
		type inet_proto . inet_service : verdict
		comment "vmap to drop or reject packets to service nodeports with no endpoints"
		elements = { tcp . 30090 comment "ns/empty:http" : goto reject-chain }
	}

	map no-endpoint-services {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "vmap to drop or reject packets to services with no endpoints"
		elements = { 10.96.0.40 . tcp . 80 comment "ns/empty:http" : goto reject-chain }
	}

	set nodeport-ips {
		type ipv4_addr
		comment "IPs that accept NodePort traffic"
		elements = { 10.0.0.5 }
	}

	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
		elements = { 10.96.0.10 . udp . 53 : goto service-EV4WC7AO-ns/web/udp/dns,
			     10.96.0.10 . tcp . 80 : goto service-Y6QD5CCT-ns/web/tcp/http,
			     10.96.0.20 . tcp . 80 : goto service-4EINRXLW-ns/np/tcp/http,
			     10.96.0.30 . tcp . 443 : goto service-XI5Y37DP-ns/lb/tcp/https,
			     192.0.2.50 . tcp . 443 : goto external-XI5Y37DP-ns/lb/tcp/https,
			     192.0.2.100 . tcp . 443 : goto external-XI5Y37DP-ns/lb/tcp/https }
	}

	map service-nodeports {
		type inet_proto . inet_service : verdict
		comment "NodePort traffic"
		elements = { tcp . 30080 : goto external-4EINRXLW-ns/np/tcp/http,
			     tcp . 30443 : goto external-XI5Y37DP-ns/lb/tcp/https }
	}

	chain cluster-ips-check {
		ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
		ip daddr 10.96.0.0/16 drop comment "Drop traffic to unallocated ClusterIPs"
	}

	chain endpoint-5LON265A-ns/np/tcp/http__10.244.2.3/8080 {
		ip saddr 10.244.2.3 jump mark-for-masquerade
		update @affinity-5LON265A-ns/np/tcp/http__10.244.2.3/8080 { ip saddr }
		meta l4proto tcp dnat to 10.244.2.3:8080
	}

	chain endpoint-IPE3F2DM-ns/web/udp/dns__10.244.2.2/5353 {
		ip saddr 10.244.2.2 jump mark-for-masquerade
		meta l4proto udp dnat to 10.244.2.2:5353
	}

	chain endpoint-L4LAMAAZ-ns/web/tcp/http__10.244.1.2/8080 {
		ip saddr 10.244.1.2 jump mark-for-masquerade
		meta l4proto tcp dnat to 10.244.1.2:8080
	}

	chain endpoint-MSYO4RAU-ns/lb/tcp/https__10.244.2.4/8443 {
		ip saddr 10.244.2.4 jump mark-for-masquerade
		meta l4proto tcp dnat to 10.244.2.4:8443
	}

	chain endpoint-OCPSZJTI-ns/web/tcp/http__10.244.2.2/8080 {
		ip saddr 10.244.2.2 jump mark-for-masquerade
		meta l4proto tcp dnat to 10.244.2.2:8080
	}

	chain endpoint-PGOSAZBQ-ns/lb/tcp/https__10.244.1.4/8443 {
		ip saddr 10.244.1.4 jump mark-for-masquerade
		meta l4proto tcp dnat to 10.244.1.4:8443
	}

	chain endpoint-Q5I5KP4I-ns/web/udp/dns__10.244.1.2/5353 {
		ip saddr 10.244.1.2 jump mark-for-masquerade
		meta l4proto udp dnat to 10.244.1.2:5353
	}

	chain endpoint-QFN57FJH-ns/np/tcp/http__10.244.1.3/8080 {
		ip saddr 10.244.1.3 jump mark-for-masquerade
		update @affinity-QFN57FJH-ns/np/tcp/http__10.244.1.3/8080 { ip saddr }
		meta l4proto tcp dnat to 10.244.1.3:8080
	}

	chain external-4EINRXLW-ns/np/tcp/http {
		jump mark-for-masquerade
		goto service-4EINRXLW-ns/np/tcp/http
	}

	chain external-XI5Y37DP-ns/lb/tcp/https {
		ip saddr 10.244.0.0/16 goto service-XI5Y37DP-ns/lb/tcp/https comment "short-circuit pod traffic"
		fib saddr type local jump mark-for-masquerade comment "masquerade local traffic"
		fib saddr type local goto service-XI5Y37DP-ns/lb/tcp/https comment "short-circuit local traffic"
		goto local-XI5Y37DP-ns/lb/tcp/https
	}

	chain filter-forward {
		type filter hook forward priority filter; policy accept;
		ct state new jump service-endpoints-check
		ct state new jump cluster-ips-check
	}

	chain filter-input {
		type filter hook input priority filter; policy accept;
		ct state new jump nodeport-endpoints-check
		ct state new jump service-endpoints-check
	}

	chain filter-output {
		type filter hook output priority filter; policy accept;
		ct state new jump service-endpoints-check
		ct state new jump cluster-ips-check
	}

	chain filter-output-pre-dnat {
		type filter hook output priority -110; policy accept;
		ct state new jump firewall-check
	}

	chain filter-prerouting-pre-dnat {
		type filter hook prerouting priority dstnat - 10; policy accept;
		ct state new jump firewall-check
	}

	chain firewall-XI5Y37DP-ns/lb/tcp/https {
		ip saddr != { 198.51.100.7, 203.0.113.0/24 } drop
	}

	chain firewall-check {
		ip daddr . meta l4proto . th dport vmap @firewall-ips
	}

	chain local-XI5Y37DP-ns/lb/tcp/https {
		numgen random mod 1 vmap { 0 : goto endpoint-PGOSAZBQ-ns/lb/tcp/https__10.244.1.4/8443 }
	}

	chain mark-for-masquerade {
		meta mark set meta mark | 0x00004000
	}

	chain masquerading {
		meta mark & 0x00004000 == 0x00000000 return
		meta mark set meta mark ^ 0x00004000
		masquerade fully-random
	}

	chain nat-output {
		type nat hook output priority -100; policy accept;
		jump services
	}

	chain nat-postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		jump masquerading
	}

	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}

	chain nodeport-endpoints-check {
		ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports
	}

	chain reject-chain {
		comment "helper for @no-endpoint-services / @no-endpoint-nodeports"
		reject
	}

	chain service-4EINRXLW-ns/np/tcp/http {
		ip daddr 10.96.0.20 ip saddr != 10.244.0.0/16 jump mark-for-masquerade
		ip saddr @affinity-QFN57FJH-ns/np/tcp/http__10.244.1.3/8080 goto endpoint-QFN57FJH-ns/np/tcp/http__10.244.1.3/8080
		ip saddr @affinity-5LON265A-ns/np/tcp/http__10.244.2.3/8080 goto endpoint-5LON265A-ns/np/tcp/http__10.244.2.3/8080
		numgen random mod 2 vmap { 0 : goto endpoint-QFN57FJH-ns/np/tcp/http__10.244.1.3/8080, 1 : goto endpoint-5LON265A-ns/np/tcp/http__10.244.2.3/8080 }
	}

	chain service-EV4WC7AO-ns/web/udp/dns {
		ip daddr 10.96.0.10 ip saddr != 10.244.0.0/16 jump mark-for-masquerade
		numgen random mod 2 vmap { 0 : goto endpoint-Q5I5KP4I-ns/web/udp/dns__10.244.1.2/5353, 1 : goto endpoint-IPE3F2DM-ns/web/udp/dns__10.244.2.2/5353 }
	}

	chain service-XI5Y37DP-ns/lb/tcp/https {
		ip daddr 10.96.0.30 ip saddr != 10.244.0.0/16 jump mark-for-masquerade
		numgen random mod 2 vmap { 0 : goto endpoint-PGOSAZBQ-ns/lb/tcp/https__10.244.1.4/8443, 1 : goto endpoint-MSYO4RAU-ns/lb/tcp/https__10.244.2.4/8443 }
	}

	chain service-Y6QD5CCT-ns/web/tcp/http {
		ip daddr 10.96.0.10 ip saddr != 10.244.0.0/16 jump mark-for-masquerade
		numgen random mod 2 vmap { 0 : goto endpoint-L4LAMAAZ-ns/web/tcp/http__10.244.1.2/8080, 1 : goto endpoint-OCPSZJTI-ns/web/tcp/http__10.244.2.2/8080 }
	}

	chain service-endpoints-check {
		ip daddr . meta l4proto . th dport vmap @no-endpoint-services
	}

	chain services {
		ip daddr . meta l4proto . th dport vmap @service-ips
		ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports
	}
}
"##;

    /// The same for `--ip-family ipv6 --cluster-cidr fd00:244::/56` (no
    /// nodeport-addresses: NodePorts on every local address), one client remembered with
    /// `timeout 1h`.
    const LISTING_V6: &str = r##"table ip6 kube-proxy {
	comment "rules for kube-proxy"
	set affinity-QKRAFSXZ-ns/np/tcp/http__fd00.244.1..3/8080 {
		type ipv6_addr
		size 65535
		flags dynamic,timeout
		timeout 3h
		elements = { 2001:db8:7::7 timeout 1h expires 59m59s980ms }
	}

	set affinity-ZJDXWGJP-ns/np/tcp/http__fd00.244.2..3/8080 {
		type ipv6_addr
		size 65535
		flags dynamic,timeout
		timeout 3h
	}

	set cluster-ips {
		type ipv6_addr
		comment "Active ClusterIPs"
		elements = { fd00:96::10,
			     fd00:96::20,
			     fd00:96::30,
			     fd00:96::40 }
	}

	map firewall-ips {
		type ipv6_addr . inet_proto . inet_service : verdict
		comment "destinations that are subject to LoadBalancerSourceRanges"
		elements = { 2001:db8::100 . tcp . 443 : goto firewall-XI5Y37DP-ns/lb/tcp/https }
	}

	map no-endpoint-nodeports {
		type inet_proto . inet_service : verdict
		comment "vmap to drop or reject packets to service nodeports with no endpoints"
		elements = { tcp . 30090 comment "ns/empty:http" : goto reject-chain }
	}

	map no-endpoint-services {
		type ipv6_addr . inet_proto . inet_service : verdict
		comment "vmap to drop or reject packets to services with no endpoints"
		elements = { fd00:96::40 . tcp . 80 comment "ns/empty:http" : goto reject-chain }
	}

	set nodeport-ips {
		type ipv6_addr
		comment "IPs that accept NodePort traffic"
	}

	map service-ips {
		type ipv6_addr . inet_proto . inet_service : verdict
		comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
		elements = { fd00:96::10 . udp . 53 : goto service-EV4WC7AO-ns/web/udp/dns,
			     fd00:96::10 . tcp . 80 : goto service-Y6QD5CCT-ns/web/tcp/http,
			     fd00:96::20 . tcp . 80 : goto service-4EINRXLW-ns/np/tcp/http,
			     2001:db8::100 . tcp . 443 : goto external-XI5Y37DP-ns/lb/tcp/https,
			     fd00:96::30 . tcp . 443 : goto service-XI5Y37DP-ns/lb/tcp/https,
			     2001:db8::50 . tcp . 443 : goto external-XI5Y37DP-ns/lb/tcp/https }
	}

	map service-nodeports {
		type inet_proto . inet_service : verdict
		comment "NodePort traffic"
		elements = { tcp . 30080 : goto external-4EINRXLW-ns/np/tcp/http,
			     tcp . 30443 : goto external-XI5Y37DP-ns/lb/tcp/https }
	}

	chain cluster-ips-check {
		ip6 daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
		ip6 daddr fd00:96::/112 drop comment "Drop traffic to unallocated ClusterIPs"
	}

	chain endpoint-AONMIKYT-ns/web/tcp/http__fd00.244.2..2/8080 {
		ip6 saddr fd00:244:2::2 jump mark-for-masquerade
		meta l4proto tcp dnat to [fd00:244:2::2]:8080
	}

	chain endpoint-CGFMX2SX-ns/web/udp/dns__fd00.244.1..2/5353 {
		ip6 saddr fd00:244:1::2 jump mark-for-masquerade
		meta l4proto udp dnat to [fd00:244:1::2]:5353
	}

	chain endpoint-DKVN7GZF-ns/lb/tcp/https__fd00.244.1..4/8443 {
		ip6 saddr fd00:244:1::4 jump mark-for-masquerade
		meta l4proto tcp dnat to [fd00:244:1::4]:8443
	}

	chain endpoint-OCSLC7HC-ns/web/udp/dns__fd00.244.2..2/5353 {
		ip6 saddr fd00:244:2::2 jump mark-for-masquerade
		meta l4proto udp dnat to [fd00:244:2::2]:5353
	}

	chain endpoint-QKRAFSXZ-ns/np/tcp/http__fd00.244.1..3/8080 {
		ip6 saddr fd00:244:1::3 jump mark-for-masquerade
		update @affinity-QKRAFSXZ-ns/np/tcp/http__fd00.244.1..3/8080 { ip6 saddr }
		meta l4proto tcp dnat to [fd00:244:1::3]:8080
	}

	chain endpoint-S4T3ODTX-ns/web/tcp/http__fd00.244.1..2/8080 {
		ip6 saddr fd00:244:1::2 jump mark-for-masquerade
		meta l4proto tcp dnat to [fd00:244:1::2]:8080
	}

	chain endpoint-VVCIGQFP-ns/lb/tcp/https__fd00.244.2..4/8443 {
		ip6 saddr fd00:244:2::4 jump mark-for-masquerade
		meta l4proto tcp dnat to [fd00:244:2::4]:8443
	}

	chain endpoint-ZJDXWGJP-ns/np/tcp/http__fd00.244.2..3/8080 {
		ip6 saddr fd00:244:2::3 jump mark-for-masquerade
		update @affinity-ZJDXWGJP-ns/np/tcp/http__fd00.244.2..3/8080 { ip6 saddr }
		meta l4proto tcp dnat to [fd00:244:2::3]:8080
	}

	chain external-4EINRXLW-ns/np/tcp/http {
		jump mark-for-masquerade
		goto service-4EINRXLW-ns/np/tcp/http
	}

	chain external-XI5Y37DP-ns/lb/tcp/https {
		ip6 saddr fd00:244::/56 goto service-XI5Y37DP-ns/lb/tcp/https comment "short-circuit pod traffic"
		fib saddr type local jump mark-for-masquerade comment "masquerade local traffic"
		fib saddr type local goto service-XI5Y37DP-ns/lb/tcp/https comment "short-circuit local traffic"
		goto local-XI5Y37DP-ns/lb/tcp/https
	}

	chain filter-forward {
		type filter hook forward priority filter; policy accept;
		ct state new jump service-endpoints-check
		ct state new jump cluster-ips-check
	}

	chain filter-input {
		type filter hook input priority filter; policy accept;
		ct state new jump nodeport-endpoints-check
		ct state new jump service-endpoints-check
	}

	chain filter-output {
		type filter hook output priority filter; policy accept;
		ct state new jump service-endpoints-check
		ct state new jump cluster-ips-check
	}

	chain filter-output-pre-dnat {
		type filter hook output priority -110; policy accept;
		ct state new jump firewall-check
	}

	chain filter-prerouting-pre-dnat {
		type filter hook prerouting priority dstnat - 10; policy accept;
		ct state new jump firewall-check
	}

	chain firewall-XI5Y37DP-ns/lb/tcp/https {
		ip6 saddr != 2001:db8:1::/48 drop
	}

	chain firewall-check {
		ip6 daddr . meta l4proto . th dport vmap @firewall-ips
	}

	chain local-XI5Y37DP-ns/lb/tcp/https {
		numgen random mod 1 vmap { 0 : goto endpoint-DKVN7GZF-ns/lb/tcp/https__fd00.244.1..4/8443 }
	}

	chain mark-for-masquerade {
		meta mark set meta mark | 0x00004000
	}

	chain masquerading {
		meta mark & 0x00004000 == 0x00000000 return
		meta mark set meta mark ^ 0x00004000
		masquerade fully-random
	}

	chain nat-output {
		type nat hook output priority -100; policy accept;
		jump services
	}

	chain nat-postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		jump masquerading
	}

	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}

	chain nodeport-endpoints-check {
		fib daddr type local ip6 daddr != ::1 meta l4proto . th dport vmap @no-endpoint-nodeports
	}

	chain reject-chain {
		comment "helper for @no-endpoint-services / @no-endpoint-nodeports"
		reject
	}

	chain service-4EINRXLW-ns/np/tcp/http {
		ip6 daddr fd00:96::20 ip6 saddr != fd00:244::/56 jump mark-for-masquerade
		ip6 saddr @affinity-QKRAFSXZ-ns/np/tcp/http__fd00.244.1..3/8080 goto endpoint-QKRAFSXZ-ns/np/tcp/http__fd00.244.1..3/8080
		ip6 saddr @affinity-ZJDXWGJP-ns/np/tcp/http__fd00.244.2..3/8080 goto endpoint-ZJDXWGJP-ns/np/tcp/http__fd00.244.2..3/8080
		numgen random mod 2 vmap { 0 : goto endpoint-QKRAFSXZ-ns/np/tcp/http__fd00.244.1..3/8080, 1 : goto endpoint-ZJDXWGJP-ns/np/tcp/http__fd00.244.2..3/8080 }
	}

	chain service-EV4WC7AO-ns/web/udp/dns {
		ip6 daddr fd00:96::10 ip6 saddr != fd00:244::/56 jump mark-for-masquerade
		numgen random mod 2 vmap { 0 : goto endpoint-CGFMX2SX-ns/web/udp/dns__fd00.244.1..2/5353, 1 : goto endpoint-OCSLC7HC-ns/web/udp/dns__fd00.244.2..2/5353 }
	}

	chain service-XI5Y37DP-ns/lb/tcp/https {
		ip6 daddr fd00:96::30 ip6 saddr != fd00:244::/56 jump mark-for-masquerade
		numgen random mod 2 vmap { 0 : goto endpoint-DKVN7GZF-ns/lb/tcp/https__fd00.244.1..4/8443, 1 : goto endpoint-VVCIGQFP-ns/lb/tcp/https__fd00.244.2..4/8443 }
	}

	chain service-Y6QD5CCT-ns/web/tcp/http {
		ip6 daddr fd00:96::10 ip6 saddr != fd00:244::/56 jump mark-for-masquerade
		numgen random mod 2 vmap { 0 : goto endpoint-S4T3ODTX-ns/web/tcp/http__fd00.244.1..2/8080, 1 : goto endpoint-AONMIKYT-ns/web/tcp/http__fd00.244.2..2/8080 }
	}

	chain service-endpoints-check {
		ip6 daddr . meta l4proto . th dport vmap @no-endpoint-services
	}

	chain services {
		ip6 daddr . meta l4proto . th dport vmap @service-ips
		fib daddr type local ip6 daddr != ::1 meta l4proto . th dport vmap @service-nodeports
	}
}
"##;

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
            assert_eq!(got.spec, want.spec, "{name}");
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

    #[test]
    fn a_live_ipv4_table_traces_as_the_emitted_one() {
        use Protocol::{Tcp, Udp};
        same_traces(
            LISTING_V4,
            IpFamily::V4,
            &[
                // ClusterIP, TCP and UDP, from a pod and from outside the cluster CIDR.
                packet("10.244.5.5", "10.96.0.10", 80, Tcp),
                packet("10.0.0.99", "10.96.0.10", 53, Udp),
                // NodePort with affinity, and its ClusterIP.
                packet("192.168.1.1", "10.0.0.5", 30080, Tcp),
                packet("10.244.5.5", "10.96.0.20", 80, Tcp),
                // LoadBalancer (eTP Local): allowed ranges, a /32, a stranger.
                packet("203.0.113.9", "192.0.2.100", 443, Tcp),
                packet("198.51.100.7", "192.0.2.100", 443, Tcp),
                packet("8.8.8.8", "192.0.2.100", 443, Tcp),
                // externalIP from a pod, NodePort from the node itself.
                packet("10.244.3.3", "192.0.2.50", 443, Tcp),
                packet("10.0.0.5", "10.0.0.5", 30443, Tcp),
                // No endpoints, a ClusterIP's other port, an unallocated ClusterIP.
                packet("10.244.5.5", "10.96.0.40", 80, Tcp),
                packet("192.168.1.1", "10.0.0.5", 30090, Tcp),
                packet("10.244.5.5", "10.96.0.10", 81, Tcp),
                packet("10.244.5.5", "10.96.9.9", 80, Tcp),
            ],
        );
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
    fn a_live_ipv6_table_traces_as_the_emitted_one() {
        use Protocol::{Tcp, Udp};
        same_traces(
            LISTING_V6,
            IpFamily::V6,
            &[
                packet("fd00:244::55", "fd00:96::10", 80, Tcp),
                packet("fd00::99", "fd00:96::10", 53, Udp),
                packet("2001:db8:9::1", "fd00::5", 30080, Tcp),
                packet("fd00:244::55", "fd00:96::20", 80, Tcp),
                packet("2001:db8:1::9", "2001:db8::100", 443, Tcp),
                packet("2001:db8:2::9", "2001:db8::100", 443, Tcp),
                packet("fd00:244::33", "2001:db8::50", 443, Tcp),
                packet("fd00::5", "fd00::5", 30443, Tcp),
                packet("fd00:244::55", "fd00:96::40", 80, Tcp),
                packet("2001:db8:9::1", "fd00::5", 30090, Tcp),
                packet("fd00:244::55", "fd00:96::10", 81, Tcp),
                packet("fd00:244::55", "fd00:96::99", 80, Tcp),
            ],
        );
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
        let handles = "table ip kube-proxy { # handle 3\n\tchain x { # handle 7\n\t\tmeta l4proto 6 dnat ip to 10.0.0.1:80 # handle 9\n\t}\n}\n";
        let t = parse(handles).expect("nft -a listing");
        assert_eq!(
            t.chains["x"].rules,
            ["meta l4proto tcp dnat to 10.0.0.1:80"]
        );
        assert_eq!(seconds("59m59s980ms"), "3599980ms");
        assert_eq!(seconds("1d2h"), "93600s");
        assert_eq!(seconds("3 hours"), "3 hours");
        assert_eq!(priority("dstnat - 10"), "-110");
    }

    #[test]
    fn a_listing_reads_back_as_the_table_it_lists() {
        for family in [IpFamily::V4, IpFamily::V6] {
            let emitted = nftables::emit(&model(), &node(family), &WriterOptions::default());
            let parsed = parse(&listing(&emitted)).expect("listing");
            assert_eq!(parsed, emitted, "{family:?}");
        }
    }

    #[test]
    fn garbage_is_refused_with_its_line() {
        let err = parse("table ip kube-proxy {\n\tset s {\n\t\tbogus 1\n\t}\n}\n");
        assert_eq!(
            err,
            Err(ListingError::Syntax {
                line: 3,
                text: "bogus 1".into(),
                reason: "unknown set or map attribute",
            })
        );
        let err = parse("hello world\n").expect_err("garbage");
        assert!(
            err.to_string().starts_with("line 1: \"hello world\""),
            "{err}"
        );
        assert_eq!(parse(""), Err(ListingError::NoTable));
        assert_eq!(
            parse("table ip6 kube-proxy {\n\tchain c {\n\t\treject\n"),
            Err(ListingError::Unclosed {
                line: 2,
                text: "chain c {".into()
            })
        );
        assert!(matches!(
            parse("table inet kube-proxy {\n}\n"),
            Err(ListingError::Syntax { line: 1, .. })
        ));
        assert!(matches!(
            parse("table ip t {\n}\ntable ip u {\n}\n"),
            Err(ListingError::Syntax { line: 3, .. })
        ));
    }
}
