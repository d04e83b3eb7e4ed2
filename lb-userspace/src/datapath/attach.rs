//! Attaches the tc program with TCX and pins each link, so forwarding survives the agent.
//!
//! Re-attaching is make-before-break: the new link goes first in the TCX chain, then the old
//! pinned link is removed.

use std::path::{Path, PathBuf};

use aya::programs::{
    LinkOrder, SchedClassifier, TcAttachType,
    links::{FdLink, PinnedLink},
    tc::TcAttachOptions,
};

use super::DatapathError;

/// Where the link of `iface` is pinned. bpffs refuses names with a dot, so a dot in an
/// interface name (VLANs such as `eth0.100`) is written as `~`.
pub fn link_pin(dir: &Path, iface: &str) -> PathBuf {
    dir.join("links")
        .join(format!("tc_in_{}", iface.replace('.', "~")))
}

/// Attaches `prog` to the ingress of `iface`, replacing a link xlb pinned there before.
pub fn attach_ingress(
    prog: &mut SchedClassifier,
    dir: &Path,
    iface: &str,
) -> Result<(), DatapathError> {
    let fail = |reason: String| DatapathError::Attach {
        iface: iface.to_string(),
        reason,
    };
    let pin = link_pin(dir, iface);
    let old = PinnedLink::from_pin(&pin).ok();
    let id = prog
        .attach_with_options(
            iface,
            TcAttachType::Ingress,
            TcAttachOptions::TcxOrder(LinkOrder::first()),
        )
        .map_err(|e| fail(chain(&e)))?;
    let link = prog.take_link(id).map_err(|e| fail(e.to_string()))?;
    let fd: FdLink = link
        .try_into()
        .map_err(|e: aya::programs::links::LinkError| fail(e.to_string()))?;
    let mut tmp = pin.clone().into_os_string();
    tmp.push("_new");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    fd.pin(&tmp)
        .map_err(|e| fail(format!("pin {}: {}", tmp.display(), chain(&e))))?;
    if let Some(old) = old {
        // Dropping the unpinned old link detaches it; the new one already runs first.
        let _ = old.unpin();
    }
    std::fs::rename(&tmp, &pin).map_err(|e| fail(format!("rename {}: {e}", pin.display())))?;
    Ok(())
}

/// Removes pinned links whose interface no longer exists; returns their names.
pub fn prune_links(dir: &Path, live: &[String]) -> Vec<String> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir.join("links")) else {
        return removed;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(iface) = name.strip_prefix("tc_in_").map(|i| i.replace('~', "."))
            && !live.contains(&iface)
            && std::fs::remove_file(e.path()).is_ok()
        {
            removed.push(iface);
        }
    }
    removed
}

/// An error and its sources on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
