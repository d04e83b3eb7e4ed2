//! The emitter's `kube-proxy` table as `nft -j list table ip kube-proxy` would print it
//! (libnftables' JSON), for the shadow bench: a node's live state without a node (loading
//! 10,000 services into a namespace with `nft -f` takes minutes). The emitter's rules are
//! its own small vocabulary (`emit::nftables`), turned into nft's statements word by word;
//! `emit::nft_json::parse` reads them back (the bench fails on any rule it cannot trace).

use lb_userspace::emit::nftables::{Collection, Element, NftTable, TABLE};
use lb_userspace::model::IpFamily;
use serde_json::{Value, json};

/// `nft -j list table FAMILY kube-proxy` of `t`.
pub fn listing(t: &NftTable) -> String {
    let family = match t.family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    };
    let head = json!({"family": family, "table": TABLE});
    let with = |mut v: Value, extra: Value| {
        if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
            o.extend(e);
        }
        v
    };
    let mut out = vec![json!({"table": {"family": family, "name": TABLE}})];
    for (name, c) in &t.chains {
        let mut chain = with(head.clone(), json!({"name": name}));
        let words: Vec<&str> = c.spec.split_whitespace().collect();
        if let ["type", kind, "hook", hook, "priority", prio, ..] = words.as_slice() {
            let prio: i64 = prio.parse().unwrap_or(0);
            chain = with(
                chain,
                json!({"type": kind, "hook": hook, "prio": prio, "policy": "accept"}),
            );
        }
        if let Some(c) = c.spec.split(" ; ").find_map(|p| p.strip_prefix("comment ")) {
            chain = with(chain, json!({"comment": c.trim_matches('"')}));
        }
        out.push(json!({ "chain": chain }));
    }
    for (name, s) in &t.sets {
        let kind = if s.is_map { "map" } else { "set" };
        out.push(json!({ kind: with(with(head.clone(), json!({"name": name})), set(s)) }));
    }
    for (name, c) in &t.chains {
        for r in &c.rules {
            let (stmts, comment) = rule(r);
            let mut rule = with(head.clone(), json!({"chain": name, "expr": stmts}));
            if let Some(c) = comment {
                rule = with(rule, json!({ "comment": c }));
            }
            out.push(json!({ "rule": rule }));
        }
    }
    json!({ "nftables": out }).to_string()
}

/// A set's declaration (`type … ; flags … ; timeout Ns ; comment "…"`) and elements.
fn set(s: &Collection) -> Value {
    let mut o = serde_json::Map::new();
    for part in s.spec.split(" ; ") {
        let (key, value) = part.split_once(' ').unwrap_or((part, ""));
        match key {
            "type" => {
                let (k, v) = value.split_once(" : ").unwrap_or((value, ""));
                o.insert("type".into(), types(k));
                if !v.is_empty() {
                    o.insert("map".into(), types(v));
                }
            }
            "flags" => {
                let flags: Vec<&str> = value.split(',').filter(|f| *f != "dynamic").collect();
                o.insert("flags".into(), json!(flags));
                o.insert("size".into(), json!(65535));
            }
            "timeout" => {
                let secs: u64 = value.trim_end_matches('s').parse().unwrap_or(0);
                o.insert("timeout".into(), json!(secs));
            }
            "comment" => {
                o.insert("comment".into(), json!(value.trim_matches('"')));
            }
            _ => {}
        }
    }
    if !s.elements.is_empty() {
        let elem: Vec<Value> = s.elements.iter().map(element).collect();
        o.insert("elem".into(), json!(elem));
    }
    Value::Object(o)
}

/// `ipv4_addr . inet_proto` as nft lists a concatenated type.
fn types(t: &str) -> Value {
    let parts: Vec<&str> = t.split(" . ").collect();
    match parts.as_slice() {
        [one] => json!(one),
        many => json!(many),
    }
}

fn element(e: &Element) -> Value {
    let parts: Vec<Value> = e.key.split(" . ").map(value).collect();
    let mut key = match parts.as_slice() {
        [one] => one.clone(),
        _ => json!({ "concat": parts }),
    };
    if let Some(c) = &e.comment {
        key = json!({"elem": {"val": key, "comment": c}});
    }
    match &e.value {
        Some(v) => json!([key, verdict(v)]),
        None => key,
    }
}

/// An immediate: a number, an address or prefix, a name.
fn value(w: &str) -> Value {
    if let Ok(n) = w.parse::<u64>() {
        return json!(n);
    }
    if let Some(h) = w.strip_prefix("0x")
        && let Ok(n) = u64::from_str_radix(h, 16)
    {
        return json!(n);
    }
    match w.split_once('/') {
        Some((addr, len)) if addr.contains(['.', ':']) => {
            json!({"prefix": {"addr": addr, "len": len.parse::<u8>().unwrap_or(0)}})
        }
        _ => json!(w),
    }
}

/// `goto X`, `jump X`, `drop`, … as a verdict.
fn verdict(v: &str) -> Value {
    match v.split_once(' ') {
        Some((how, target)) => json!({ how: {"target": target} }),
        None => json!({ v: null }),
    }
}

/// The rule's words, quotes and braces kept together.
fn words(r: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let (mut cur, mut quoted, mut depth) = (String::new(), false, 0);
    for ch in r.chars() {
        match ch {
            '"' => quoted = !quoted,
            '{' if !quoted => depth += 1,
            '}' if !quoted => depth -= 1,
            _ => {}
        }
        if ch == ' ' && !quoted && depth == 0 {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
        } else {
            cur.push(ch);
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// A selector starting `w` (`ip daddr`, `meta l4proto`, `th dport`, `ct state`,
/// `fib saddr type`, `mark`, `numgen random mod N`) and the words it took.
fn selector(w: &[String]) -> Option<(Value, usize)> {
    let s = |i: usize| w.get(i).map(String::as_str).unwrap_or("");
    Some(match s(0) {
        "ip" | "ip6" | "th" => (json!({"payload": {"protocol": s(0), "field": s(1)}}), 2),
        "meta" => (json!({"meta": {"key": s(1)}}), 2),
        "ct" => (json!({"ct": {"key": s(1)}}), 2),
        "fib" => (json!({"fib": {"result": s(2), "flags": [s(1)]}}), 3),
        "mark" => (json!({"meta": {"key": "mark"}}), 1),
        "numgen" => {
            let m: u64 = s(3).parse().ok()?;
            (json!({"numgen": {"mode": s(1), "mod": m, "offset": 0}}), 4)
        }
        _ => return None,
    })
}

/// `a . b . c` of selectors and the words taken.
fn key(w: &[String]) -> Option<(Value, usize)> {
    let (first, mut n) = selector(w)?;
    let mut parts = vec![first];
    while w.get(n).map(String::as_str) == Some(".") {
        let (next, k) = selector(&w[n + 1..])?;
        parts.push(next);
        n += 1 + k;
    }
    Some(match parts.len() {
        1 => (parts.remove(0), n),
        _ => (json!({ "concat": parts }), n),
    })
}

/// A right-hand side: `@set`, `{ a, b }`, an address, a name.
fn right(w: &str) -> Value {
    match w.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
        Some(list) => json!({"set": list.split(',').map(|i| value(i.trim())).collect::<Vec<_>>()}),
        None => value(w),
    }
}

/// `{ 0 : goto a , 1 : goto b }` as a vmap's anonymous set.
fn arms(w: &str) -> Value {
    let inner = w.trim_start_matches('{').trim_end_matches('}');
    let arms: Vec<Value> = inner
        .split(',')
        .filter_map(|a| a.split_once(':'))
        .map(|(k, v)| json!([value(k.trim()), verdict(v.trim())]))
        .collect();
    json!({ "set": arms })
}

/// A rule's statements and comment.
fn rule(r: &str) -> (Vec<Value>, Option<String>) {
    let w = words(r);
    let (mut stmts, mut comment, mut i) = (Vec::new(), None, 0);
    while i < w.len() {
        let s = |k: usize| w.get(i + k).map(String::as_str).unwrap_or("");
        match s(0) {
            "comment" => {
                comment = Some(s(1).trim_matches('"').to_string());
                i += 2;
            }
            "jump" | "goto" => {
                stmts.push(verdict(&format!("{} {}", s(0), s(1))));
                i += 2;
            }
            "drop" | "return" | "accept" => {
                stmts.push(verdict(s(0)));
                i += 1;
            }
            "reject" => {
                stmts.push(json!({"reject": null}));
                i += 1;
            }
            "masquerade" => {
                stmts.push(json!({"masquerade": {"flags": s(1)}}));
                i += 2;
            }
            "dnat" => {
                let dest = s(2);
                let (addr, port) = dest.rsplit_once(':').unwrap_or((dest, "0"));
                let addr = addr.trim_start_matches('[').trim_end_matches(']');
                let port: u64 = port.parse().unwrap_or(0);
                stmts.push(json!({"dnat": {"addr": addr, "port": port}}));
                i += 3;
            }
            "update" => {
                let elem = s(2).trim_start_matches('{').trim_end_matches('}').trim();
                let elem_words: Vec<String> = elem.split(' ').map(str::to_string).collect();
                let elem = key(&elem_words).map_or(Value::Null, |(k, _)| k);
                stmts.push(json!({"set": {"op": "update", "elem": elem, "set": s(1)}}));
                i += 3;
            }
            _ => {
                let Some((left, n)) = key(&w[i..]) else {
                    // Not the emitter's vocabulary: kept as a name the tracer refuses.
                    stmts.push(json!({"match": {"op": "==", "left": s(0), "right": s(0)}}));
                    i += 1;
                    continue;
                };
                i += n;
                stmts.push(after_key(left, &w, &mut i));
            }
        }
    }
    (stmts, comment)
}

/// What follows a selector: `vmap …`, `set mark or M`, `and M == V`, `!= V`, `V`.
fn after_key(left: Value, w: &[String], i: &mut usize) -> Value {
    let s = |k: usize| w.get(*i + k).map(String::as_str).unwrap_or("");
    let op = |o: &str| match o {
        "or" => "|",
        "xor" => "^",
        _ => "&",
    };
    match s(0) {
        "vmap" => {
            let data = if s(1).starts_with('{') {
                arms(s(1))
            } else {
                json!(s(1))
            };
            *i += 2;
            json!({"vmap": {"key": left, "data": data}})
        }
        "set" => {
            // `mark set mark or M`
            let value = json!({ op(s(2)): [left.clone(), value(s(3))] });
            *i += 4;
            json!({"mangle": {"key": left, "value": value}})
        }
        o @ ("and" | "or" | "xor") => {
            // `mark and M == V`
            let l = json!({ op(o): [left, value(s(1))] });
            let r = value(s(3));
            *i += 4;
            json!({"match": {"op": "==", "left": l, "right": r}})
        }
        "!=" => {
            let r = right(s(1));
            *i += 2;
            json!({"match": {"op": "!=", "left": left, "right": r}})
        }
        v => {
            let op = if left.get("ct").is_some() { "in" } else { "==" };
            let r = right(v);
            *i += 1;
            json!({"match": {"op": op, "left": left, "right": r}})
        }
    }
}

#[cfg(test)]
mod tests {
    use lb_userspace::{
        emit::{WriterOptions, nft_json, nftables},
        model::{Cidr, IpFamily, LocalDetector, NodeSettings},
        source::file,
    };

    /// The services `emit::nft_json`'s tests read live listings of (ClusterIP, NodePort
    /// with affinity, LoadBalancer with source ranges, one without endpoints; dual-stack).
    const SERVICES: &str =
        include_str!("../../../lb-userspace/src/emit/testdata/nft-services.yaml");

    /// Both families' emitted tables read back equal from their listings.
    #[test]
    fn the_emitted_table_reads_back_from_its_listing() {
        let model = file::parse("t.yaml", SERVICES).expect("yaml").model;
        for (family, pods) in [
            (IpFamily::V4, "10.244.0.0/16"),
            (IpFamily::V6, "fd00:244::/56"),
        ] {
            let node = NodeSettings {
                node_name: "node1".into(),
                family,
                node_ips: vec![
                    "10.0.0.5".parse().expect("ip"),
                    "fd00::5".parse().expect("ip"),
                ],
                detector: LocalDetector::ClusterCidr(Cidr::parse_sloppy(pods).expect("cidr")),
                service_cidrs: ["10.96.0.0/16", "fd00:96::/112"]
                    .map(|c| Cidr::parse_sloppy(c).expect("cidr"))
                    .to_vec(),
                ..NodeSettings::default()
            };
            let t = nftables::emit(&model, &node, &WriterOptions::default());
            assert!(t.chains.keys().any(|c| c.starts_with("firewall-")), "{t:?}");
            assert!(t.sets.keys().any(|s| s.starts_with("affinity-")), "{t:?}");
            let back = nft_json::parse(&super::listing(&t)).expect("listing");
            assert_eq!(back, t, "{family:?}");
        }
    }
}
