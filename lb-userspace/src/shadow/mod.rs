//! Shadow mode (`xlb agent --shadow`, issue `[migrate]`): beside a running kube-proxy, xlb
//! watches the same Services and EndpointSlices, loads nothing and changes nothing, reads
//! kube-proxy's live rules on the node and compares, per service port and origin, what
//! they do with what xlb would do. A divergence that outlasts a grace period (kube-proxy's
//! sync period) is reported by service and reason.
//!
//! | file | what it does |
//! |---|---|
//! | `live.rs` | kube-proxy's live state (saved rules, the nft table, IPVS) parsed per family |
//! | `prune.rs` | the part of a big rule set one frontend's packet can meet |
//! | `compare.rs` | per frontend and origin: kube-proxy's answer against xlb's |
//! | `report.rs` | divergences aged against the grace period; the report and its metrics |

/// Where `xlb agent --shadow` writes its report and `xlb shadow report` reads it.
pub const DEFAULT_REPORT: &str = "/run/xlb/shadow.json";

pub mod compare;
pub mod live;
pub mod prune;
pub mod report;

use crate::{datapath::netfilter::LiveText, desired::NodeContext, model::IpFamily, model::Model};

/// One look, as `xlb agent --shadow` takes it every interval once the live text is read:
/// each family's text (what `iptables-save` and `nft -j list table` printed, see
/// `datapath::netfilter::read_kube_proxy_state`; `ipvs`: `/proc/net/ip_vs`) parsed
/// ([`live::parse`]) and compared with the model's services on `node`
/// ([`compare::compare`]). Pure: nothing on the node is read or changed.
pub fn look(
    model: &Model,
    node: &NodeContext,
    live: &[(IpFamily, &LiveText)],
    ipvs: Option<&str>,
) -> compare::Comparison {
    let families: Vec<(IpFamily, live::FamilyState)> = live
        .iter()
        .map(|(f, text)| (*f, live::parse(*f, text, ipvs)))
        .collect();
    let refs: Vec<(IpFamily, &live::FamilyState)> = families.iter().map(|(f, s)| (*f, s)).collect();
    compare::compare(model, node, &refs)
}
