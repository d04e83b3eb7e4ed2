//! The interfaces and what xlb attaches to them, behind a trait: the kernel's (tc and XDP on
//! the loaded object, pinned) and, for unit tests of the agent's interface handling, a fake.

use std::{collections::BTreeMap, path::Path};

use aya::{
    Ebpf,
    maps::{DevMapHash, MapData},
};
use lb_common::MAP_XDP_TX;

use super::netif;
use super::sys_bpf::{Bpf, Kernel};
use super::{
    DatapathError,
    attach::{self, XdpSetting},
    loader,
};

/// What the agent's interface handling needs from the system.
pub trait Links {
    /// The interfaces by name, with their index.
    fn interfaces(&self) -> BTreeMap<String, u32>;
    /// Attaches tc egress and ingress to `iface` (replacing pinned links of an earlier
    /// agent).
    fn attach_tc(&mut self, iface: &str) -> Result<(), DatapathError>;
    /// Attaches XDP to `iface` as `setting` asks; returns the mode it runs in.
    fn attach_xdp(
        &mut self,
        iface: &str,
        ifindex: u32,
        setting: XdpSetting,
    ) -> Result<&'static str, DatapathError>;
    /// Removes an XDP link an earlier agent pinned on `iface`; whether there was one.
    fn detach_xdp(&mut self, iface: &str) -> bool;
    /// Removes pinned links of interfaces not in `live`; returns their names.
    fn prune(&mut self, live: &[String]) -> Vec<String>;
}

/// The kernel: the loaded object's programs, links pinned under `dir`.
pub struct KernelLinks<'a> {
    pub ebpf: &'a mut Ebpf,
    pub dir: &'a Path,
}

impl Links for KernelLinks<'_> {
    fn interfaces(&self) -> BTreeMap<String, u32> {
        netif::interfaces()
    }

    fn attach_tc(&mut self, iface: &str) -> Result<(), DatapathError> {
        // Egress first: a newer ingress program leaves the source side of replies to it,
        // so it runs before that ingress program does (an earlier agent's ingress did both
        // sides, and the egress step then finds nothing left to do).
        attach::attach_egress(loader::tc_egress_program(self.ebpf)?, self.dir, iface)?;
        attach::attach_ingress(loader::tc_program(self.ebpf)?, self.dir, iface)
    }

    fn attach_xdp(
        &mut self,
        iface: &str,
        ifindex: u32,
        setting: XdpSetting,
    ) -> Result<&'static str, DatapathError> {
        let prog = loader::xdp_program(self.ebpf)?;
        let mode = attach::attach_xdp(prog, self.dir, iface, ifindex, setting)?;
        let map = self
            .ebpf
            .map_mut(MAP_XDP_TX)
            .ok_or(DatapathError::MapMissing { name: MAP_XDP_TX })?;
        let mut tx: DevMapHash<&mut MapData> =
            DevMapHash::try_from(map).map_err(|source| DatapathError::Map {
                name: MAP_XDP_TX,
                source,
            })?;
        if let Err(e) = tx.insert(ifindex, ifindex, None, 0) {
            tracing::warn!(
                iface,
                "XDP cannot redirect to {iface}: {e}; translated packets go through the stack"
            );
        }
        Ok(mode)
    }

    fn detach_xdp(&mut self, iface: &str) -> bool {
        aya::programs::links::PinnedLink::from_pin(attach::xdp_link_pin(self.dir, iface))
            .is_ok_and(|old| old.unpin().is_ok())
    }

    fn prune(&mut self, live: &[String]) -> Vec<String> {
        attach::prune_links(self.dir, live)
    }
}

/// Detaches the link pinned at `path` from its hook and removes the pin; `Ok(false)` when
/// there was no pin. The detach is synchronous (`BPF_LINK_DETACH`): when this returns, no
/// packet or socket call meets the program any more. Merely unpinning is not: the kernel
/// drops a link's last reference from a workqueue, and until that work runs the link is
/// unreachable by id yet still attached (a flow handed back to the kernel's conntrack met
/// xlb's tc ingress tens of milliseconds after its pin was gone). A kernel without the
/// command (or a link type without detach) gets the unpin, then a wait until the link's
/// id is gone.
pub fn detach_pinned(path: &Path) -> std::io::Result<bool> {
    use std::os::fd::AsFd;
    if !path.exists() {
        return Ok(false);
    }
    let fd = Kernel.obj_get(path)?;
    let detached = Kernel.link_detach(fd.as_fd()).is_ok();
    let id = if detached { None } else { pinned_link_id(path) };
    std::fs::remove_file(path)?;
    drop(fd);
    wait_released(&Vec::from_iter(id));
    Ok(true)
}

/// The kernel id of the link pinned at `path`.
fn pinned_link_id(path: &Path) -> Option<u32> {
    let link = aya::programs::links::PinnedLink::from_pin(path).ok()?;
    let fd: aya::programs::links::FdLink = link.into();
    fd.info().ok().map(|i| i.id())
}

/// The ids of the kernel's links, whether or not a reference can still be taken (a link
/// whose last reference went keeps its id until it is released).
fn link_ids() -> Vec<u32> {
    let mut ids = Vec::new();
    while let Ok(id) = Kernel.link_next_id(ids.last().copied().unwrap_or(0)) {
        ids.push(id);
    }
    ids
}

/// Waits (up to 2 s) until the kernel has released the links `ids` (their ids are gone):
/// a link whose last reference goes is freed from a workqueue, a moment later.
fn wait_released(ids: &[u32]) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while !ids.is_empty() && std::time::Instant::now() < deadline {
        if !link_ids().iter().any(|id| ids.contains(id)) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
