//! Attaches the tc program with TCX and pins each link, so forwarding survives the agent.
//!
//! Re-attaching is make-before-break: the new link goes first in the TCX chain, then the old
//! pinned link is removed.

use std::path::{Path, PathBuf};

use aya::programs::{
    LinkOrder, SchedClassifier, TcAttachType, Xdp, XdpMode,
    links::{FdLink, PinnedLink},
    tc::TcAttachOptions,
};

use super::{DatapathError, chain};

/// Where the tc ingress link of `iface` is pinned. bpffs refuses names with a dot, so a dot
/// in an interface name (VLANs such as `eth0.100`) is written as `~`.
pub fn link_pin(dir: &Path, iface: &str) -> PathBuf {
    hook_pin(dir, iface, TcAttachType::Ingress)
}

/// Where the tc link of `iface` at `hook` is pinned (`tc_in_IFACE`, `tc_out_IFACE`).
pub fn hook_pin(dir: &Path, iface: &str, hook: TcAttachType) -> PathBuf {
    let prefix = match hook {
        TcAttachType::Egress => "tc_out_",
        _ => "tc_in_",
    };
    dir.join("links")
        .join(format!("{prefix}{}", iface.replace('.', "~")))
}

/// Attaches `prog` to the ingress of `iface`, replacing a link xlb pinned there before.
pub fn attach_ingress(
    prog: &mut SchedClassifier,
    dir: &Path,
    iface: &str,
) -> Result<(), DatapathError> {
    attach_tc(prog, dir, iface, TcAttachType::Ingress)
}

/// Attaches `prog` to the egress of `iface`, replacing a link xlb pinned there before.
pub fn attach_egress(
    prog: &mut SchedClassifier,
    dir: &Path,
    iface: &str,
) -> Result<(), DatapathError> {
    attach_tc(prog, dir, iface, TcAttachType::Egress)
}

/// Attaches `prog` to `hook` of `iface` with TCX, first in the chain, and pins the link,
/// replacing (make-before-break) a link xlb pinned there before.
fn attach_tc(
    prog: &mut SchedClassifier,
    dir: &Path,
    iface: &str,
    hook: TcAttachType,
) -> Result<(), DatapathError> {
    let fail = |reason: String| DatapathError::Attach {
        iface: iface.to_string(),
        reason,
    };
    let pin = hook_pin(dir, iface, hook);
    let old = PinnedLink::from_pin(&pin).ok();
    let id = prog
        .attach_with_options(iface, hook, TcAttachOptions::TcxOrder(LinkOrder::first()))
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

/// How XDP is attached to the node interfaces (`--xdp`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum XdpSetting {
    /// No XDP: tc does everything (the default, as Cilium's acceleration is opt-in).
    #[default]
    Off,
    /// In the driver; generic (skb) mode where the driver cannot.
    Native,
    /// Generic (skb) mode, whatever the driver.
    Generic,
}

/// Where the XDP link of `iface` is pinned.
pub fn xdp_link_pin(dir: &Path, iface: &str) -> PathBuf {
    dir.join("links")
        .join(format!("xdp_{}", iface.replace('.', "~")))
}

/// Attaches `prog` to `iface` in the mode `setting` asks for and pins the link; returns the
/// mode it runs in. A link xlb pinned there before is removed first (XDP allows one program
/// per interface; meanwhile tc handles every packet, so nothing is lost).
pub fn attach_xdp(
    prog: &mut Xdp,
    dir: &Path,
    iface: &str,
    ifindex: u32,
    setting: XdpSetting,
) -> Result<&'static str, DatapathError> {
    let fail = |reason: String| DatapathError::Attach {
        iface: iface.to_string(),
        reason,
    };
    let pin = xdp_link_pin(dir, iface);
    if let Ok(old) = PinnedLink::from_pin(&pin) {
        let _ = old.unpin();
    }
    let (id, mode) = match setting {
        XdpSetting::Off => return Err(fail("XDP is off".into())),
        XdpSetting::Generic => (
            prog.attach_to_if_index(ifindex, XdpMode::Skb)
                .map_err(|e| fail(format!("generic XDP: {}", chain(&e))))?,
            "generic",
        ),
        XdpSetting::Native => match prog.attach_to_if_index(ifindex, XdpMode::Driver) {
            Ok(id) => (id, "native"),
            Err(native) => {
                tracing::warn!(
                    iface,
                    "native XDP refused ({}); using generic XDP",
                    chain(&native)
                );
                (
                    prog.attach_to_if_index(ifindex, XdpMode::Skb)
                        .map_err(|e| fail(format!("generic XDP: {}", chain(&e))))?,
                    "generic",
                )
            }
        },
    };
    let link = prog.take_link(id).map_err(|e| fail(e.to_string()))?;
    let fd: FdLink = link
        .try_into()
        .map_err(|e: aya::programs::links::LinkError| fail(e.to_string()))?;
    fd.pin(&pin)
        .map_err(|e| fail(format!("pin {}: {}", pin.display(), chain(&e))))?;
    Ok(mode)
}

/// Removes pinned links whose interface no longer exists; returns their names.
pub fn prune_links(dir: &Path, live: &[String]) -> Vec<String> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir.join("links")) else {
        return removed;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(iface) = name
            .strip_prefix("tc_in_")
            .or_else(|| name.strip_prefix("tc_out_"))
            .or_else(|| name.strip_prefix("xdp_"))
            .map(|i| i.replace('~', "."))
            && !live.contains(&iface)
            && std::fs::remove_file(e.path()).is_ok()
        {
            removed.push(iface);
        }
    }
    removed
}
