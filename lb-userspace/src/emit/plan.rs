//! What kube-proxy decides for a service port before it writes a rule (its
//! `syncProxyRules` locals), computed once and shared by the iptables and nftables writers.

use crate::model::select::{EndpointView, PortView};

/// One service port's decisions: which traffic has endpoints under its traffic policy and
/// which per-service chains exist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decisions {
    /// Any usable endpoint at all (ready, or serving-and-terminating).
    pub has_endpoints: bool,
    /// Cluster-internal traffic has endpoints under internalTrafficPolicy.
    pub has_internal: bool,
    /// External traffic has endpoints under externalTrafficPolicy.
    pub has_external: bool,
    /// The cluster (`SVC`) policy chain is written.
    pub uses_cluster_chain: bool,
    /// The local (`SVL`) policy chain is written.
    pub uses_local_chain: bool,
    /// The external (`EXT`) chain is written.
    pub uses_ext: bool,
    /// The LoadBalancer firewall (`FW`) chain is written.
    pub uses_fw: bool,
}

impl Decisions {
    pub fn of(pv: &PortView<'_>) -> Self {
        let cat = &pv.categorized;
        let has_endpoints = cat.has_any;
        let usable = |local: bool| has_endpoints && !policy_endpoints(pv, local).is_empty();
        Self {
            has_endpoints,
            has_internal: usable(pv.internal_policy_local()),
            has_external: usable(pv.external_policy_local()),
            uses_cluster_chain: !cat.cluster.is_empty() && pv.uses_cluster_endpoints(),
            uses_local_chain: !cat.local.is_empty() && pv.uses_local_endpoints(),
            uses_ext: has_endpoints && pv.externally_accessible(),
            uses_fw: has_endpoints
                && !pv.load_balancer_ips.is_empty()
                && !pv.source_ranges.is_empty(),
        }
    }
}

/// The endpoints of a traffic policy: this node's when Local, else the cluster's.
pub fn policy_endpoints<'a>(pv: &'a PortView<'_>, local: bool) -> &'a [EndpointView] {
    if local {
        &pv.categorized.local
    } else {
        &pv.categorized.cluster
    }
}
