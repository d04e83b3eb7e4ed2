//! One look at the node: per service port, frontend and origin, what kube-proxy's live
//! state does with a new connection (the rule tracers of `xlb trace --mode`, on the live
//! rules) against what xlb would do (its desired state's choice of backends, or its refusal);
//! and the frontends kube-proxy serves that xlb does not. A pure function of the model, the
//! node and the live state.
//!
//! Origins: a ClusterIP is reached from a pod (an endpoint address of the family, so
//! kube-proxy's local-traffic matches see a pod); a NodePort, an externalIP and a
//! LoadBalancer IP from a client outside the cluster (a documentation address, or the first
//! allowed source range of a LoadBalancer that has them).

use std::{
    collections::BTreeSet,
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
};

use lb_common::SCOPE_INTERNAL;
use serde::{Deserialize, Serialize};

use super::live::{FamilyState, LiveFrontend, Proxier, frontends, not_understood};
use crate::{
    desired::{Candidate, NodeContext, service_candidates},
    emit::{nftables, trace::Packet},
    model::{IpFamily, Model, NodeSettings, Protocol},
};

/// What a new connection meets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Sent to one of these backends (`ip:port`).
    Backends(BTreeSet<SocketAddr>),
    Drop,
    Reject,
    /// No rule translates it: it goes on untranslated.
    Untranslated,
    /// A frontend only kube-proxy has: served (not traced further).
    Served,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Backends(b) => {
                let list: Vec<String> = b.iter().map(ToString::to_string).collect();
                write!(f, "backends {}", list.join(", "))
            }
            Outcome::Drop => f.write_str("drop"),
            Outcome::Reject => f.write_str("reject"),
            Outcome::Untranslated => f.write_str("untranslated (no rule)"),
            Outcome::Served => f.write_str("served"),
        }
    }
}

impl Outcome {
    /// kube-proxy's answer from a tracer's outputs (DNAT targets, verdicts).
    fn of_outputs<'a>(outputs: impl IntoIterator<Item = &'a str>) -> Self {
        let mut backends = BTreeSet::new();
        let mut verdicts = BTreeSet::new();
        for o in outputs {
            match o.trim().parse::<SocketAddr>() {
                Ok(a) => {
                    backends.insert(a);
                }
                Err(_) => {
                    verdicts.insert(o.trim().to_string());
                }
            }
        }
        if !backends.is_empty() {
            Outcome::Backends(backends)
        } else if verdicts.contains("DROP") {
            Outcome::Drop
        } else if verdicts.contains("REJECT") {
            Outcome::Reject
        } else {
            Outcome::Untranslated
        }
    }

    /// xlb's answer for frontend `c`.
    fn of_candidate(c: &Candidate) -> Self {
        let backends: BTreeSet<SocketAddr> = c
            .backend_addrs()
            .map(|b| SocketAddr::new(b.ip, b.port))
            .collect();
        match (backends.is_empty(), c.drops_when_empty()) {
            (false, _) => Outcome::Backends(backends),
            (true, true) => Outcome::Drop,
            (true, false) => Outcome::Reject,
        }
    }
}

/// Why kube-proxy and xlb disagree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// Both send it on, to different backends.
    BackendsDiffer,
    /// kube-proxy drops or rejects what xlb sends on.
    KubeProxyRefuses,
    /// xlb drops or rejects what kube-proxy sends on.
    XlbRefuses,
    /// One drops, the other rejects.
    RefusalDiffers,
    /// kube-proxy has no rule for a frontend xlb serves.
    MissingInKubeProxy,
    /// kube-proxy serves a frontend xlb does not have.
    MissingInXlb,
}

impl Reason {
    pub const ALL: [Reason; 6] = [
        Reason::BackendsDiffer,
        Reason::KubeProxyRefuses,
        Reason::XlbRefuses,
        Reason::RefusalDiffers,
        Reason::MissingInKubeProxy,
        Reason::MissingInXlb,
    ];

    /// The metric label and the report's word.
    pub fn name(self) -> &'static str {
        match self {
            Reason::BackendsDiffer => "backends-differ",
            Reason::KubeProxyRefuses => "kube-proxy-refuses",
            Reason::XlbRefuses => "xlb-refuses",
            Reason::RefusalDiffers => "refusal-differs",
            Reason::MissingInKubeProxy => "missing-in-kube-proxy",
            Reason::MissingInXlb => "missing-in-xlb",
        }
    }

    fn of(xlb: &Outcome, kube_proxy: &Outcome) -> Option<Self> {
        Some(match (xlb, kube_proxy) {
            (a, b) if a == b => return None,
            (_, Outcome::Untranslated) => Reason::MissingInKubeProxy,
            (Outcome::Untranslated, _) => Reason::MissingInXlb,
            (Outcome::Backends(_), Outcome::Backends(_)) => Reason::BackendsDiffer,
            (Outcome::Backends(_), _) => Reason::KubeProxyRefuses,
            (_, Outcome::Backends(_)) => Reason::XlbRefuses,
            _ => Reason::RefusalDiffers,
        })
    }
}

/// One frontend and origin on which they disagree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Divergence {
    /// The service (`namespace/name`; kube-proxy's name for a frontend only it serves).
    pub service: String,
    /// The service port and frontend (`ns/name:port (nodePort 10.0.0.1)`).
    pub object: String,
    /// `10.96.0.10:80/TCP`.
    pub frontend: String,
    /// `pod` or `external`.
    pub origin: String,
    pub reason: Reason,
    pub xlb: Outcome,
    pub kube_proxy: Outcome,
}

impl Divergence {
    /// What identifies it from one look to the next.
    pub fn key(&self) -> (String, String, String) {
        (
            self.object.clone(),
            self.frontend.clone(),
            self.origin.clone(),
        )
    }
}

/// One look's result.
#[derive(Clone, Debug, Default)]
pub struct Comparison {
    /// `IPv4: iptables (iptables-nft-save)`, one line per family kube-proxy has state for.
    pub proxiers: Vec<String>,
    /// Frontend-origin pairs compared.
    pub compared: usize,
    pub divergences: Vec<Divergence>,
    /// kube-proxy's rules the tracer does not understand.
    pub not_understood: Vec<String>,
    /// Live state that could not be read or used.
    pub errors: Vec<String>,
}

/// Compares the model's services on `node` with kube-proxy's live state of each family.
pub fn compare(
    model: &Model,
    node: &NodeContext,
    families: &[(IpFamily, &FamilyState)],
) -> Comparison {
    let mut out = Comparison::default();
    let mut candidates = Vec::new();
    for id in model.services.keys() {
        let mut errors = Vec::new();
        candidates.extend(
            service_candidates(model, id, node, &mut errors)
                .into_iter()
                .filter(|c| c.key.scope != SCOPE_INTERNAL),
        );
    }
    for (family, state) in families {
        out.errors.extend(state.errors.iter().cloned());
        let Some(proxier) = &state.proxier else {
            continue;
        };
        out.proxiers
            .push(format!("{}: {}", family.name(), proxier.describe()));
        out.not_understood.extend(not_understood(proxier));
        let settings = NodeSettings {
            family: *family,
            ..node.node.clone()
        };
        let pod = pod_address(model, *family);
        let mine: Vec<&Candidate> = candidates
            .iter()
            .filter(|c| family.matches(c.frontend.ip()))
            .collect();
        for c in &mine {
            out.compared += 1;
            let src = if c.external { client_address(c) } else { pod };
            let kube_proxy = answer(proxier, &settings, src, c);
            let xlb = Outcome::of_candidate(c);
            if let Some(reason) = Reason::of(&xlb, &kube_proxy) {
                out.divergences.push(Divergence {
                    service: c.object.split(':').next().unwrap_or_default().to_string(),
                    object: c.object.to_string(),
                    frontend: format!("{}/{}", c.frontend, c.protocol),
                    origin: origin(c).to_string(),
                    reason,
                    xlb,
                    kube_proxy,
                });
            }
        }
        out.divergences.extend(only_in_kube_proxy(proxier, &mine));
    }
    out
}

fn origin(c: &Candidate) -> &'static str {
    if c.external { "external" } else { "pod" }
}

/// What kube-proxy's state does with a new connection from `src` to `c`'s frontend.
fn answer(p: &Proxier, node: &NodeSettings, src: IpAddr, c: &Candidate) -> Outcome {
    let pkt = Packet {
        src,
        dst: c.frontend.ip(),
        dport: c.frontend.port(),
        protocol: c.protocol,
    };
    match p {
        Proxier::Iptables { index, .. } => {
            let sub = index.subset(pkt.dst, pkt.dport);
            let t = crate::emit::trace::trace(&sub, node, pkt);
            Outcome::of_outputs(t.outputs.iter().map(String::as_str))
        }
        Proxier::Nftables { table, index } => {
            let sub = index.subset(table, pkt.dst, pkt.dport);
            let (outputs, _) = nftables::trace(&sub, node, pkt);
            Outcome::of_outputs(outputs.split(", ").filter(|o| !o.is_empty()))
        }
        Proxier::Ipvs(servers) => match servers.get(&(c.protocol, c.frontend)) {
            Some(real) if !real.is_empty() => Outcome::Backends(real.clone()),
            Some(_) => Outcome::Reject,
            None => Outcome::Untranslated,
        },
    }
}

/// Frontends kube-proxy serves that none of xlb's frontends of the family is: a ClusterIP,
/// externalIP or LoadBalancer IP by address, port and protocol; a NodePort by port and
/// protocol.
fn only_in_kube_proxy(p: &Proxier, mine: &[&Candidate]) -> Vec<Divergence> {
    let served: BTreeSet<(Option<IpAddr>, u16, Protocol)> = mine
        .iter()
        .flat_map(|c| {
            let exact = (Some(c.frontend.ip()), c.frontend.port(), c.protocol);
            let node_port =
                c.object
                    .contains("(nodePort ")
                    .then_some((None, c.frontend.port(), c.protocol));
            std::iter::once(exact).chain(node_port)
        })
        .collect();
    let live: BTreeSet<LiveFrontend> = frontends(p).into_iter().collect();
    live.into_iter()
        .filter(|f| !served.contains(&(f.addr, f.port, f.protocol)))
        .map(|f| {
            let frontend = match f.addr {
                Some(a) => format!("{}/{}", SocketAddr::new(a, f.port), f.protocol),
                None => format!("nodePort {}/{}", f.port, f.protocol),
            };
            Divergence {
                service: f.name.split(':').next().unwrap_or_default().to_string(),
                object: f.name.clone(),
                frontend,
                origin: if f.addr.is_some() { "any" } else { "external" }.to_string(),
                reason: Reason::MissingInXlb,
                xlb: Outcome::Untranslated,
                kube_proxy: Outcome::Served,
            }
        })
        .collect()
}

/// A pod's address of `family`: the first endpoint address of that family in the model,
/// else a documentation address.
fn pod_address(model: &Model, family: IpFamily) -> IpAddr {
    model
        .slices
        .values()
        .flat_map(|s| s.values())
        .flat_map(|s| s.endpoints.iter())
        .map(|e| e.address)
        .find(|a| family.matches(*a))
        .unwrap_or(match family {
            IpFamily::V4 => IpAddr::V4(Ipv4Addr::new(198, 51, 100, 10)),
            IpFamily::V6 => IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0x51, 0, 0, 0, 0, 10)),
        })
}

/// A client outside the cluster for external frontend `c`: from its first allowed source
/// range (not the frontend's own address) when it has ranges, else a documentation address.
fn client_address(c: &Candidate) -> IpAddr {
    let allowed = c
        .allowed_sources()
        .iter()
        .map(|(a, _)| *a)
        .find(|a| *a != c.frontend.ip());
    allowed.unwrap_or(match c.frontend {
        SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::new(203, 0, 113, 10)),
        SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0x113, 0, 0, 0, 0, 10)),
    })
}
