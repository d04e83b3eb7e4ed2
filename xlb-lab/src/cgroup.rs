//! A cgroup v2 directory owned by a test, a demo or a bench: the socket hooks are attached
//! there (never to the machine's root cgroup) and its clients run in it. Removed on drop,
//! its processes killed first.

use std::{
    os::{fd::AsRawFd, unix::process::CommandExt},
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use crate::netns::Netns;
use lb_userspace::datapath::socket::cgroup2_root;

/// A cgroup under the cgroup v2 root, named uniquely.
#[derive(Debug)]
pub struct Cgroup {
    pub path: PathBuf,
}

impl Cgroup {
    /// Creates `<cgroup v2 root>/xlb-<tag>`.
    pub fn new(tag: &str) -> Result<Self, String> {
        let root = cgroup2_root().ok_or("no cgroup v2 hierarchy is mounted")?;
        let path = root.join(format!("xlb-{tag}"));
        std::fs::create_dir(&path).map_err(|e| format!("mkdir {}: {e}", path.display()))?;
        Ok(Cgroup { path })
    }

    /// `program` as a process in this cgroup (it joins before it runs) and in the network
    /// namespace `ns`.
    pub fn command(&self, ns: &Netns, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = ns.command(program);
        self.enter_on_exec(&mut c);
        c
    }

    /// Makes the process `c` starts join this cgroup before it execs.
    pub fn enter_on_exec(&self, c: &mut Command) {
        let procs = std::fs::OpenOptions::new()
            .write(true)
            .open(self.path.join("cgroup.procs"));
        // SAFETY: the closure only calls write(2) on a descriptor opened before the fork.
        unsafe {
            c.pre_exec(move || match &procs {
                Ok(f) => {
                    if libc::write(f.as_raw_fd(), b"0".as_ptr().cast(), 1) == 1 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                }
                Err(e) => Err(std::io::Error::new(e.kind(), "cgroup.procs")),
            });
        }
    }

    /// The pids in this cgroup.
    pub fn pids(&self) -> Vec<u32> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.path.join("cgroup.kill"), "1");
        let deadline = Instant::now() + Duration::from_secs(2);
        while !self.pids().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        while std::fs::remove_dir(&self.path).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
