//! Which interfaces get the datapath: tc ingress on pod interfaces (`--pod-interfaces`) and
//! node interfaces, XDP on node interfaces (`--xdp`). Interfaces are known by name and index:
//! a re-created interface (a restarted pod's veth) has the same name, a new index and nothing
//! attached, so it is attached again. A failed attach is retried after [`ATTACH_RETRY`].
//!
//! Attaching is slow in the kernel: each TCX link swaps the hook's program list and waits
//! for an RCU grace period (`BPF_LINK_CREATE` took 10–16 ms on a busy 2-core node, two per
//! interface), so 250 new pod veths take seconds. The agent's loop attaches at most
//! [`ATTACH_BATCH`] interfaces per turn and lets a due sync run between batches: a burst of
//! new pods never holds a Service change back by more than one batch.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use tracing::{error, info, warn};

use crate::{
    datapath::{DatapathError, attach::XdpSetting, links::Links},
    glob,
};

/// How long a failed attach waits before it is tried again.
pub const ATTACH_RETRY: Duration = Duration::from_secs(5);

/// At most this many interfaces get tc per [`Interfaces::sync`] (the rest at the next).
pub const ATTACH_BATCH: usize = 16;

/// Which interfaces the agent wants, and how.
#[derive(Clone, Debug)]
pub struct Wanted<'a> {
    /// Glob(s) of pod interfaces, comma-separated.
    pub pod_interfaces: &'a str,
    /// Node interfaces (tc, and XDP as `xdp` says).
    pub node_interfaces: &'a [String],
    pub xdp: XdpSetting,
}

impl<'a> Wanted<'a> {
    /// The interfaces the agent's options ask for.
    pub fn of(opts: &'a super::InterfaceOptions) -> Self {
        Self {
            pod_interfaces: &opts.pod_interfaces,
            node_interfaces: &opts.node_interfaces,
            xdp: opts.xdp,
        }
    }
}

/// What is attached where.
#[derive(Default)]
pub struct Interfaces {
    /// tc ingress attached: name → ifindex.
    attached: BTreeMap<String, u32>,
    /// Node interfaces with XDP attached (or, with XDP off, checked): name → ifindex.
    xdp: BTreeMap<String, u32>,
    /// When XDP last failed on an interface.
    xdp_failed: BTreeMap<String, Instant>,
    /// When tc last failed on an interface.
    failed: BTreeMap<String, Instant>,
    missing_reported: BTreeSet<String>,
    /// Interfaces wait for tc beyond the last call's batch.
    pending: bool,
}

/// Whether a failure at `t` is recent enough to wait before trying again.
fn backing_off(failures: &BTreeMap<String, Instant>, iface: &str) -> bool {
    failures
        .get(iface)
        .is_some_and(|t| t.elapsed() < ATTACH_RETRY)
}

impl Interfaces {
    /// An attach failed and waits for its retry (the caller looks again every so often).
    pub fn retrying(&self) -> bool {
        !self.failed.is_empty() || !self.xdp_failed.is_empty()
    }

    /// Interfaces wait for tc beyond the last [`Interfaces::sync`]'s batch: call it again
    /// soon (after a due sync).
    pub fn pending(&self) -> bool {
        self.pending
    }

    /// Brings the attachments in line with the interfaces that exist now, tc on at most
    /// [`ATTACH_BATCH`] of them (node interfaces first).
    pub fn sync(&mut self, links: &mut dyn Links, want: &Wanted<'_>) -> Result<(), DatapathError> {
        let live = links.interfaces();
        // Forget what is gone or was re-created (same name, another index).
        self.attached.retain(|i, idx| live.get(i) == Some(idx));
        self.xdp.retain(|i, idx| live.get(i) == Some(idx));
        // A failure is the interface's: one that is gone waits for no retry (a pod's veth
        // deleted mid-attach would otherwise keep the loop polling, and its name, for ever).
        self.failed.retain(|i, _| live.contains_key(i));
        self.xdp_failed.retain(|i, _| live.contains_key(i));
        for iface in want.node_interfaces {
            if let Some(&idx) = live.get(iface)
                && !self.xdp.contains_key(iface)
            {
                self.sync_xdp(links, iface, idx, want.xdp);
            }
        }
        let names: Vec<String> = live.keys().cloned().collect();
        for gone in links.prune(&names) {
            info!(iface = %gone, "interface gone; its link pin removed");
        }
        for name in want.node_interfaces {
            if !live.contains_key(name) && self.missing_reported.insert(name.clone()) {
                warn!(iface = %name, "node interface (--node-interfaces) does not exist; will attach when it appears");
            }
        }
        let todo = live.iter().filter(|(i, _)| {
            wanted(want, i) && !self.attached.contains_key(*i) && !backing_off(&self.failed, i)
        });
        let (node, pods): (Vec<_>, Vec<_>) =
            todo.partition(|(i, _)| want.node_interfaces.contains(i));
        let todo: Vec<_> = node.into_iter().chain(pods).collect();
        self.pending = todo.len() > ATTACH_BATCH;
        for (iface, &idx) in todo.into_iter().take(ATTACH_BATCH) {
            self.attach_tc(links, iface, idx);
        }
        Ok(())
    }

    /// [`Interfaces::sync`] until no interface waits (at start, for an upgrade's or a
    /// takeover's attach: everything at once).
    pub fn sync_all(
        &mut self,
        links: &mut dyn Links,
        want: &Wanted<'_>,
    ) -> Result<(), DatapathError> {
        loop {
            self.sync(links, want)?;
            if !self.pending {
                return Ok(());
            }
        }
    }

    fn attach_tc(&mut self, links: &mut dyn Links, iface: &str, idx: u32) {
        match links.attach_tc(iface) {
            Ok(()) => {
                info!(iface = %iface, "attached tc ingress (TCX, pinned)");
                self.failed.remove(iface);
                self.missing_reported.remove(iface);
                self.attached.insert(iface.to_string(), idx);
            }
            Err(e) => {
                error!("{e}; retrying in {}s", ATTACH_RETRY.as_secs());
                self.failed.insert(iface.to_string(), Instant::now());
            }
        }
    }

    /// Attaches XDP to node interface `iface` as asked (or removes an XDP link an earlier
    /// agent left when it is off).
    fn sync_xdp(&mut self, links: &mut dyn Links, iface: &str, idx: u32, setting: XdpSetting) {
        if setting == XdpSetting::Off {
            if links.detach_xdp(iface) {
                info!(
                    iface,
                    "XDP is off: removed the XDP link an earlier agent attached"
                );
            }
            self.xdp.insert(iface.to_string(), idx);
            return;
        }
        if backing_off(&self.xdp_failed, iface) {
            return;
        }
        match links.attach_xdp(iface, idx, setting) {
            Ok(mode) => {
                info!(iface, mode, "attached XDP (pinned)");
                self.xdp_failed.remove(iface);
                self.xdp.insert(iface.to_string(), idx);
            }
            Err(e) => {
                error!(
                    "{e}; tc handles {iface}; retrying XDP in {}s",
                    ATTACH_RETRY.as_secs()
                );
                self.xdp_failed.insert(iface.to_string(), Instant::now());
            }
        }
    }
}

/// Whether tc goes on `iface`: a pod or node interface, never `lo`.
fn wanted(want: &Wanted<'_>, iface: &str) -> bool {
    iface != "lo"
        && (glob::matches_any(want.pod_interfaces, iface)
            || want.node_interfaces.iter().any(|n| n == iface))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Interfaces and attach results set by the test; every call recorded.
    #[derive(Default)]
    struct Fake {
        live: BTreeMap<String, u32>,
        fail_tc: BTreeSet<String>,
        fail_xdp: bool,
        calls: Vec<String>,
    }

    impl Links for Fake {
        fn interfaces(&self) -> BTreeMap<String, u32> {
            self.live.clone()
        }
        fn attach_tc(&mut self, iface: &str) -> Result<(), DatapathError> {
            self.calls.push(format!("tc {iface}"));
            if self.fail_tc.contains(iface) {
                return Err(DatapathError::Attach {
                    iface: iface.into(),
                    reason: "refused".into(),
                });
            }
            Ok(())
        }
        fn attach_xdp(
            &mut self,
            iface: &str,
            _: u32,
            _: XdpSetting,
        ) -> Result<&'static str, DatapathError> {
            self.calls.push(format!("xdp {iface}"));
            if self.fail_xdp {
                return Err(DatapathError::Attach {
                    iface: iface.into(),
                    reason: "no XDP".into(),
                });
            }
            Ok("native")
        }
        fn detach_xdp(&mut self, iface: &str) -> bool {
            self.calls.push(format!("detach-xdp {iface}"));
            false
        }
        fn prune(&mut self, _: &[String]) -> Vec<String> {
            Vec::new()
        }
    }

    fn fake(ifaces: &[(&str, u32)]) -> Fake {
        Fake {
            live: ifaces.iter().map(|(n, i)| (n.to_string(), *i)).collect(),
            ..Fake::default()
        }
    }

    fn want<'a>(node: &'a [String], xdp: XdpSetting) -> Wanted<'a> {
        Wanted {
            pod_interfaces: "veth*",
            node_interfaces: node,
            xdp,
        }
    }

    #[test]
    fn matching_interfaces_are_attached_once_and_lo_never() {
        let mut links = fake(&[("lo", 1), ("veth1", 5), ("eth9", 6)]);
        let node = vec!["lo".to_string()];
        let mut ifs = Interfaces::default();
        for _ in 0..3 {
            ifs.sync(&mut links, &want(&node, XdpSetting::Off))
                .expect("sync");
        }
        assert_eq!(links.calls, ["detach-xdp lo", "tc veth1"]);
    }

    #[test]
    fn a_recreated_interface_is_attached_again() {
        let mut links = fake(&[("veth1", 5)]);
        let mut ifs = Interfaces::default();
        let w = want(&[], XdpSetting::Off);
        ifs.sync(&mut links, &w).expect("sync");
        links.live.insert("veth1".into(), 7);
        ifs.sync(&mut links, &w).expect("sync");
        ifs.sync(&mut links, &w).expect("sync");
        assert_eq!(links.calls, ["tc veth1", "tc veth1"]);
    }

    #[test]
    fn a_burst_of_interfaces_is_attached_a_batch_a_call_node_interfaces_first() {
        let mut pods: Vec<(String, u32)> =
            (0..40).map(|i| (format!("veth{i:02}"), 10 + i)).collect();
        pods.push(("eth0".into(), 2));
        let mut links = Fake {
            live: pods.into_iter().collect(),
            ..Fake::default()
        };
        let node = vec!["eth0".to_string()];
        let mut ifs = Interfaces::default();
        let w = want(&node, XdpSetting::Off);
        let mut batches = Vec::new();
        for _ in 0..4 {
            let before = links.calls.len();
            ifs.sync(&mut links, &w).expect("sync");
            let tc = links.calls[before..]
                .iter()
                .filter(|c| c.starts_with("tc "))
                .count();
            batches.push((tc, ifs.pending()));
        }
        assert_eq!(
            batches,
            [(16, true), (16, true), (9, false), (0, false)],
            "41 interfaces, 16 a call"
        );
        assert_eq!(links.calls[1], "tc eth0", "the node interface first");
    }

    #[test]
    fn failures_back_off_and_xdp_failures_do_not_stop_tc() {
        let mut links = fake(&[("veth1", 5), ("eth0", 2)]);
        links.fail_tc.insert("veth1".into());
        links.fail_xdp = true;
        let node = vec!["eth0".to_string()];
        let mut ifs = Interfaces::default();
        for _ in 0..3 {
            ifs.sync(&mut links, &want(&node, XdpSetting::Native))
                .expect("sync");
        }
        // One try each within ATTACH_RETRY; tc on the node interface despite XDP failing.
        assert_eq!(links.calls, ["xdp eth0", "tc eth0", "tc veth1"]);
    }

    #[test]
    fn a_failed_interface_that_is_gone_waits_for_no_retry() {
        let mut links = fake(&[("veth1", 5), ("eth0", 2)]);
        links.fail_tc.insert("veth1".into());
        links.fail_xdp = true;
        let node = vec!["eth0".to_string()];
        let mut ifs = Interfaces::default();
        let w = want(&node, XdpSetting::Native);
        ifs.sync(&mut links, &w).expect("sync");
        assert!(ifs.retrying(), "veth1's tc and eth0's XDP failed");
        links.live.clear();
        ifs.sync(&mut links, &w).expect("sync");
        assert!(
            !ifs.retrying(),
            "both interfaces are gone: nothing to retry"
        );
    }
}
