//! The socket hooks from the agent's side: attached (or removed) at start, and the connected
//! UDP sockets of removed backends destroyed after each sync.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use tracing::{debug, error, info, warn};

use super::SocketOptions;
use crate::datapath::{
    pins::Pins,
    socket::{self, SocketLb},
    stale,
};

/// Whether the socket hooks are to be attached (on, with a cgroup v2 to attach them to).
pub(super) fn wanted(opts: &SocketOptions) -> bool {
    opts.socket_lb != SocketLb::Off
        && (opts.cgroup_path.is_some() || socket::cgroup2_root().is_some())
}

/// Attaches (or, with `--socket-lb off`, removes) the socket hooks; returns the cgroup they
/// run in. Without cgroup v2, or when attaching fails, the error is logged and the agent
/// goes on with the tc path alone.
pub(super) fn sync_socket_hooks(
    opts: &SocketOptions,
    pins: &Pins,
    ebpf: &mut aya::Ebpf,
) -> Option<PathBuf> {
    // The hooks' links are pinned beside the maps.
    if opts.socket_lb == SocketLb::Off {
        if socket::detach(pins.dir()) > 0 {
            info!("--socket-lb off: removed the socket hooks an earlier agent attached");
        }
        return None;
    }
    let Some(cgroup) = opts.cgroup_path.clone().or_else(socket::cgroup2_root) else {
        error!(
            "no cgroup v2 hierarchy is mounted: the socket hooks are off, so the node's own processes do not reach services (pods do, through tc)"
        );
        return None;
    };
    match socket::attach(ebpf, pins.dir(), &cgroup) {
        Ok(()) => {
            info!(cgroup = %cgroup.display(), mode = ?opts.socket_lb, "attached the socket hooks (connect, sendmsg, recvmsg, getpeername; IPv4 and IPv6; pinned)");
            Some(cgroup)
        }
        Err(e) => {
            error!("{e}; the node's own processes do not reach services (pods do, through tc)");
            None
        }
    }
}

/// The socket hooks as attached: their options, the pins, their cgroup.
#[derive(Clone, Copy)]
pub(super) struct Attached<'a> {
    pub opts: &'a SocketOptions,
    pub pins: &'a Pins,
    pub cgroup: &'a Path,
}

/// Destroys the connected UDP sockets that went to a backend of a frontend that no longer
/// has it (`gone`: frontend and backend).
pub(super) fn destroy_stale_udp(hooks: Attached<'_>, gone: &BTreeSet<stale::Pair>) {
    let Attached { opts, pins, cgroup } = hooks;
    if gone.is_empty() {
        return;
    }
    let cookies = match stale::cookies(pins, gone) {
        Ok(c) if c.is_empty() => return,
        Ok(c) => c,
        Err(e) => {
            warn!("cannot read the socket map: {e}; UDP sockets of removed backends stay");
            return;
        }
    };
    let scope = (opts.socket_lb == SocketLb::All).then_some(cgroup);
    let mut destroyed = 0;
    for ns in stale::namespaces(scope) {
        match stale::destroy_in(&ns, &cookies) {
            Ok(n) => destroyed += n,
            Err(e) => debug!(ns = %ns.display(), "cannot destroy UDP sockets there: {e}"),
        }
    }
    info!(
        sockets = destroyed,
        backends = gone.len(),
        "destroyed connected UDP sockets of removed backends"
    );
}
