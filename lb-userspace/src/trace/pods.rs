//! Pods named in a source file, for `--from pod/NAMESPACE/NAME`: `kind: Pod` documents and
//! their `status.podIP` and `status.podIPs` (a dual-stack pod has one address per family).

use std::{collections::BTreeMap, net::IpAddr};

use serde::Deserialize;

/// Pods by namespace and name: their addresses, `status.podIP` first.
pub type Pods = BTreeMap<(String, String), Vec<IpAddr>>;

#[derive(Deserialize)]
struct PodDoc {
    kind: Option<String>,
    #[serde(default)]
    metadata: PodMeta,
    #[serde(default)]
    status: PodStatus,
}

#[derive(Deserialize, Default)]
struct PodMeta {
    name: Option<String>,
    namespace: Option<String>,
}

#[derive(Deserialize, Default)]
struct PodStatus {
    #[serde(rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(rename = "podIPs", default)]
    pod_ips: Vec<PodIp>,
}

#[derive(Deserialize)]
struct PodIp {
    ip: Option<String>,
}

/// The pods of a multi-document YAML text (other documents, and pods without an address
/// that parses, are skipped).
pub fn pods(text: &str) -> Pods {
    let mut out = Pods::new();
    let docs = crate::source::yaml::documents(text).unwrap_or_default();
    for doc in docs {
        let Ok(p) = serde_json::from_value::<PodDoc>(doc) else {
            continue;
        };
        if p.kind.as_deref() != Some("Pod") {
            continue;
        }
        let Some(name) = p.metadata.name else {
            continue;
        };
        let mut ips: Vec<IpAddr> = Vec::new();
        let listed = p.status.pod_ips.into_iter().filter_map(|i| i.ip);
        for raw in p.status.pod_ip.into_iter().chain(listed) {
            if let Ok(ip) = raw.trim().parse::<IpAddr>()
                && !ips.contains(&ip)
            {
                ips.push(ip);
            }
        }
        if !ips.is_empty() {
            let ns = p.metadata.namespace.unwrap_or_else(|| "default".into());
            out.insert((ns, name), ips);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_come_from_pod_documents_with_both_families() {
        let text = "kind: Pod\nmetadata: {name: a, namespace: n}\nstatus: {podIP: 10.1.2.3}\n---\nkind: Service\nmetadata: {name: s}\n---\nkind: Pod\nmetadata: {name: d}\nstatus:\n  podIP: 10.1.2.4\n  podIPs: [{ip: 10.1.2.4}, {ip: \"fd00::4\"}]\n---\nkind: Pod\nmetadata: {name: none}\nstatus: {}\n";
        let p = pods(text);
        assert_eq!(
            p.get(&("n".into(), "a".into())),
            Some(&vec!["10.1.2.3".parse::<IpAddr>().expect("ip")])
        );
        assert_eq!(
            p.get(&("default".into(), "d".into())),
            Some(&vec![
                "10.1.2.4".parse::<IpAddr>().expect("ip"),
                "fd00::4".parse().expect("ip")
            ])
        );
        assert_eq!(p.len(), 2);
    }
}
