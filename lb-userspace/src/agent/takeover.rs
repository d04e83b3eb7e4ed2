//! `--takeover-from kube-proxy`: kube-proxy's connections go on through xlb.
//!
//! kube-proxy's NAT of a connection lives in the kernel's conntrack entry. After the first
//! sync (the maps hold every frontend and backend), before xlb's programs attach:
//! 1. every kernel flow to a frontend xlb serves, from a pod or from outside the node,
//!    becomes xlb's assured conntrack entries with kube-proxy's backend and masquerade
//!    source, and for a ClientIP-affinity Service the client's affinity entry
//!    (`migrate::adopt`);
//! 2. the programs attach; the kernel is asked again for flows begun meanwhile;
//! 3. the kernel's entries of the adopted flows are deleted (netfilter sees them again as
//!    xlb translates them, and picks them up mid-stream), and kube-proxy's rules removed.
//!
//! Flows from the node's own sockets keep their kernel entry and its NAT: the socket hooks
//! never see a socket connected before them, and the kernel keeps translating it until it
//! ends, as long as some NAT chain registers the kernel's NAT hooks. kube-proxy's nftables
//! table may have been the only one, so a table of empty NAT chains (`inet xlb-keep-nat`)
//! is added before kube-proxy's rules go and removed once those flows have ended. Both
//! families are taken over. Killed at any step and started again, it completes (entries already there are
//! kept, rules already gone are not looked for twice). On a node without kube-proxy it
//! finds nothing and says so.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use tracing::{info, warn};

use super::AgentError;
use crate::{
    datapath::{
        DatapathError, clock,
        kernel_ct::{self, Ends, KernelFlow},
        netfilter, netif,
        pins::Pins,
        upgrade,
    },
    desired::Desired,
    migrate::adopt::{self, Entries, Skip},
    model::IpFamily,
};

/// What one pass over the kernel's table did.
#[derive(Default)]
struct Pass {
    adopted: Vec<KernelFlow>,
    entries: usize,
    /// Affinity entries written (clients of ClientIP-affinity Services).
    affinity: usize,
    /// Translated flows of the node's own sockets (left to the kernel's NAT).
    from_node: BTreeSet<(u8, Ends)>,
    skipped: BTreeMap<Skip, usize>,
}

/// Adopts the kernel's flows to frontends of `current` into the pinned maps of `pins`,
/// but those of `known` (adopted by an earlier pass).
fn adopt_flows(
    pins: &Pins,
    current: &Desired,
    local: &BTreeSet<IpAddr>,
    known: &BTreeSet<(u8, Ends)>,
) -> Result<Pass, AgentError> {
    let mut flows = Vec::new();
    for family in [IpFamily::V4, IpFamily::V6] {
        flows.extend(kernel_ct::dump(family).map_err(|e| {
            AgentError::Takeover(format!("cannot read the kernel's conntrack: {e}"))
        })?);
    }
    let now = clock::monotonic_coarse_ns();
    let mut pass = Pass::default();
    let (mut v4_items, mut v6_items, mut affinity) = (Vec::new(), Vec::new(), Vec::new());
    for f in flows {
        if known.contains(&(f.proto, f.orig)) {
            continue;
        }
        if local.contains(&f.orig.src) {
            // A node socket's flow: its kernel entry keeps its NAT (see the module doc).
            if f.dnat() {
                pass.from_node.insert((f.proto, f.orig));
            }
            continue;
        }
        match adopt::adopt(&f, current, now) {
            Ok(a) => {
                match a.conntrack {
                    Entries::V4(e) => v4_items.extend(e),
                    Entries::V6(e) => v6_items.extend(e),
                }
                affinity.extend(a.affinity);
                pass.adopted.push(f);
            }
            Err(Skip::NotTranslated) => {}
            Err(why) => *pass.skipped.entry(why).or_default() += 1,
        }
    }
    pass.entries = upgrade::adopt_assured(pins, &v4_items, &v6_items)?;
    pass.affinity = upgrade::adopt_affinity(pins, &affinity)?;
    Ok(pass)
}

/// The takeover (see the module doc); `attach` attaches xlb's programs.
pub(super) fn from_kube_proxy(
    pins: &Pins,
    current: &Desired,
    attach: impl FnOnce() -> Result<(), DatapathError>,
) -> Result<(), AgentError> {
    let local = netif::local_addresses();
    let before = adopt_flows(pins, current, &local, &BTreeSet::new())?;
    attach()?;
    info!(
        flows = before.adopted.len(),
        "takeover: kube-proxy's flows adopted, xlb attached; next, the flows begun meanwhile and kube-proxy's rules"
    );
    let known = before.adopted.iter().map(|f| (f.proto, f.orig)).collect();
    let meanwhile = adopt_flows(pins, current, &local, &known)?;
    let mut deleted = 0;
    for f in before.adopted.iter().chain(&meanwhile.adopted) {
        match kernel_ct::delete(f) {
            Ok(()) => deleted += 1,
            Err(e) => warn!(flow = ?f.orig, "cannot delete the kernel's conntrack entry: {e}"),
        }
    }
    let node_flows: BTreeSet<(u8, Ends)> = before
        .from_node
        .union(&meanwhile.from_node)
        .copied()
        .collect();
    if !node_flows.is_empty() {
        // Before kube-proxy's rules go: its nftables table may be what registers the
        // kernel's NAT hooks.
        netfilter::keep_nat_hooks().map_err(|e| {
            AgentError::Takeover(format!(
                "cannot keep the kernel's NAT for the node's {} connections: {e}",
                node_flows.len()
            ))
        })?;
        release_nat_hooks_when_ended(node_flows.clone());
    }
    let rules = netfilter::find_kube_proxy()
        .map_err(|e| AgentError::Takeover(format!("cannot read kube-proxy's rules: {e}")))?;
    let removed = rules.describe();
    for e in netfilter::remove_kube_proxy(&rules) {
        warn!("kube-proxy's rules not all removed: {e}");
    }
    let adopted = before.adopted.len() + meanwhile.adopted.len();
    if adopted == 0 && removed.is_empty() {
        info!("no kube-proxy on this node (no flows it translated, no rules): starting normally");
        return Ok(());
    }
    let skipped: Vec<String> = before
        .skipped
        .iter()
        .chain(&meanwhile.skipped)
        .map(|(why, n)| format!("{why:?}: {n}"))
        .collect();
    info!(
        flows = adopted,
        begun_meanwhile = meanwhile.adopted.len(),
        entries = before.entries + meanwhile.entries,
        affinity_entries = before.affinity + meanwhile.affinity,
        kernel_entries_deleted = deleted,
        node_flows_left_to_the_kernel = node_flows.len(),
        skipped = %skipped.join(", "),
        rules_removed = %removed.join("; "),
        "took over from kube-proxy: its flows are xlb's, its rules are gone"
    );
    Ok(())
}

/// How often the node's leftover NAT flows are looked for.
const NODE_FLOWS_LOOK: std::time::Duration = std::time::Duration::from_secs(60);

/// A thread that looks for the node's connections `flows` in the kernel's conntrack every
/// [`NODE_FLOWS_LOOK`] and, once none is left, removes the table that kept the kernel's
/// NAT hooks for them.
fn release_nat_hooks_when_ended(flows: BTreeSet<(u8, Ends)>) {
    let spawned = std::thread::Builder::new()
        .name("xlb-keep-nat".into())
        .spawn(move || {
            loop {
                std::thread::sleep(NODE_FLOWS_LOOK);
                let mut left = 0;
                for family in [IpFamily::V4, IpFamily::V6] {
                    match kernel_ct::dump(family) {
                        Ok(live) => {
                            left += live
                                .iter()
                                .filter(|f| flows.contains(&(f.proto, f.orig)))
                                .count()
                        }
                        Err(e) => {
                            warn!("cannot read the kernel's conntrack: {e}");
                            left += 1;
                        }
                    }
                }
                if left == 0 {
                    match netfilter::release_nat_hooks() {
                        Ok(()) => info!(
                            "takeover: the node's connections begun under kube-proxy have ended; table inet {} removed",
                            netfilter::KEEP_NAT_TABLE
                        ),
                        Err(e) => warn!("cannot remove the NAT-keeping table: {e}"),
                    }
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        warn!(
            "cannot watch the node's connections begun under kube-proxy (table inet {} stays): {e}",
            netfilter::KEEP_NAT_TABLE
        );
    }
}
