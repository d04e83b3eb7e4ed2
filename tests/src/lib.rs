//! Support shared by xlb's integration tests and `cargo xtask run`: isolated network
//! namespaces, echo servers that report the peer they saw, clients, and the agent run as a
//! process inside a node namespace.
//!
//! Everything here builds its own namespaces with names unique to the run and removes them on
//! drop, on success and on failure. Nothing touches the root namespace's interfaces.

pub use lb_userspace::lab::{client, echo, netns, topology};

pub mod agent;
pub mod apiserver;
pub mod cgroup;
pub mod datapath;
pub mod prev_layout;
pub mod probe;
pub mod scenario;
pub mod services;
pub mod twonode;

use std::sync::atomic::{AtomicU32, Ordering};

/// A short tag unique to this process and call (namespace and pin names embed it).
pub fn unique_tag(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{}{n}", std::process::id())
}

/// True when running as root. Otherwise prints a loud notice naming the test it skips.
pub fn require_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    eprintln!(
        "\n!!!!! SKIPPED {test}: needs root (BPF, network namespaces). CI runs as root; run `sudo -E cargo xtask test` locally. !!!!!\n"
    );
    false
}

/// The `xlb` binary: `$XLB_BIN`, else the workspace's target dir (debug, then release).
pub fn xlb_bin() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("XLB_BIN") {
        return p.into();
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    for profile in ["debug", "release"] {
        let p = target.join(profile).join("xlb");
        if p.exists() {
            return p;
        }
    }
    panic!(
        "xlb binary not found under {}: run `cargo xtask build` first",
        target.display()
    );
}
