//! The socket hooks from the agent's side: attached (or removed) at start. The connected
//! UDP sockets of removed backends are destroyed after each sync by the agent's worker
//! (`stale_udp`).

use std::path::PathBuf;

use tracing::{error, info};

use super::SocketOptions;
use crate::datapath::{
    pins::Pins,
    socket::{self, SocketLb},
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
