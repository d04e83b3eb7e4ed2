//! The cgroup socket hooks (connect-time load balancing): loaded from the object, attached
//! to a cgroup v2 directory with `bpf_link` and pinned beside the tc links, so a restarted
//! or upgraded agent leaves no gap: the new links are attached before the old pins go.

use std::{
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf,
    programs::{
        CgroupAttachMode, CgroupSockAddr,
        links::{FdLink, PinnedLink},
    },
};

use super::DatapathError;

/// `--socket-lb`: which sockets the hooks translate (Cilium's `socketLB.enabled` and
/// `socketLB.hostNamespaceOnly`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SocketLb {
    /// Every socket in the cgroup: the node's and its pods' (pods' TCP then needs no NAT).
    #[default]
    All,
    /// Only sockets of the agent's (the host's) network namespace; pods are left to tc.
    Host,
    /// No socket hooks (the node's own processes do not reach services).
    Off,
}

/// The hooks: program name in the object, and the link's pin name.
pub const HOOKS: [(&str, &str); 8] = [
    ("xlb_connect4", "sock_connect4"),
    ("xlb_sendmsg4", "sock_sendmsg4"),
    ("xlb_recvmsg4", "sock_recvmsg4"),
    ("xlb_getpeername4", "sock_getpeername4"),
    ("xlb_connect6", "sock_connect6"),
    ("xlb_sendmsg6", "sock_sendmsg6"),
    ("xlb_recvmsg6", "sock_recvmsg6"),
    ("xlb_getpeername6", "sock_getpeername6"),
];

/// The cgroup v2 hierarchy's mount point, from `/proc/self/mountinfo`: `/sys/fs/cgroup` on
/// a unified host, `/sys/fs/cgroup/unified` on a hybrid one. `None` without cgroup v2.
pub fn cgroup2_root() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|line| {
        // `id parent major:minor root mountpoint options… - fstype source superoptions`
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        left.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// True when `path` is a directory on a cgroup v2 filesystem.
pub fn is_cgroup2(path: &Path) -> bool {
    use nix::sys::statfs::{CGROUP2_SUPER_MAGIC, statfs};
    statfs(path).is_ok_and(|s| s.filesystem_type() == CGROUP2_SUPER_MAGIC)
}

fn pin_path(dir: &Path, pin: &str) -> PathBuf {
    dir.join("links").join(pin)
}

fn fail(cgroup: &Path, reason: String) -> DatapathError {
    DatapathError::Socket {
        cgroup: cgroup.to_path_buf(),
        reason,
    }
}

/// Loads the socket programs and attaches each to `cgroup`, pinning its link under `dir`.
/// A link pinned there by an earlier agent is removed only once the new one runs (both may
/// run for an instant: the second sees a backend, not a frontend, and does nothing).
pub fn attach(ebpf: &mut Ebpf, dir: &Path, cgroup: &Path) -> Result<(), DatapathError> {
    if !is_cgroup2(cgroup) {
        return Err(fail(
            cgroup,
            "not a cgroup v2 directory (is cgroup v2 mounted? see --cgroup-path)".into(),
        ));
    }
    let file = std::fs::File::open(cgroup).map_err(|e| fail(cgroup, e.to_string()))?;
    for (name, pin) in HOOKS {
        let prog: &mut CgroupSockAddr = ebpf
            .program_mut(name)
            .ok_or(DatapathError::Program {
                name,
                source: aya::programs::ProgramError::NotLoaded,
            })?
            .try_into()
            .map_err(|source| DatapathError::Program { name, source })?;
        if prog.fd().is_err() {
            prog.load()
                .map_err(|source| DatapathError::Program { name, source })?;
        }
        // A bpf_link on a cgroup always allows other programs beside it.
        let id = prog
            .attach(&file, CgroupAttachMode::Single)
            .map_err(|source| DatapathError::Program { name, source })?;
        let link: FdLink = prog
            .take_link(id)
            .map_err(|source| DatapathError::Program { name, source })?
            .try_into()
            .map_err(|e: aya::programs::links::LinkError| fail(cgroup, e.to_string()))?;
        let path = pin_path(dir, pin);
        // bpffs refuses names with a dot.
        let tmp = dir.join("links").join(format!("{pin}_new"));
        let _ = std::fs::remove_file(&tmp);
        link.pin(&tmp)
            .map_err(|e| fail(cgroup, format!("pin {}: {e}", tmp.display())))?;
        if let Ok(old) = PinnedLink::from_pin(&path) {
            // The old link detaches when its last reference (this one) goes.
            let _ = old.unpin();
        }
        std::fs::rename(&tmp, &path)
            .map_err(|e| fail(cgroup, format!("rename {}: {e}", path.display())))?;
    }
    Ok(())
}

/// Removes the socket hooks' pinned links (`--socket-lb off`); returns how many there were.
/// Returns once they are detached, so that no hook runs any more.
pub fn detach(dir: &Path) -> usize {
    HOOKS
        .iter()
        .filter(|(_, pin)| super::links::detach_pinned(&pin_path(dir, pin)).unwrap_or(false))
        .count()
}

/// The network namespace cookie of the calling thread's namespace (`SO_NETNS_COOKIE`).
pub fn netns_cookie() -> std::io::Result<u64> {
    const SO_NETNS_COOKIE: libc::c_int = 71;
    let sock = std::net::UdpSocket::bind("0.0.0.0:0")?;
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: a valid socket, and an out-buffer of the size given.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cookie)
}
