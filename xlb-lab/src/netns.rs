//! Network namespaces owned by a test: created with `ip netns add`, removed on drop.

use std::{
    fs::File,
    process::{Command, Output},
    thread,
};

/// A named network namespace, deleted (with its interfaces) when dropped.
#[derive(Debug)]
pub struct Netns {
    pub name: String,
}

/// Runs a command and fails with its stderr when it exits non-zero.
pub fn run(cmd: &mut Command) -> Result<Output, String> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| format!("{shown}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{shown}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(out)
}

impl Netns {
    /// Creates the namespace with `lo` up, and without IPv6 duplicate address detection:
    /// a link's link-local address is usable at once. (Under DAD it stays tentative for a
    /// second or two, and meanwhile the kernel sends no neighbour solicitation for packets
    /// it forwards: the first one over a fresh link waits a second, longer than a test's
    /// connect timeout.)
    pub fn new(name: &str) -> Result<Self, String> {
        run(Command::new("ip").args(["netns", "add", name]))?;
        let ns = Netns {
            name: name.to_string(),
        };
        ns.sysctl(&[
            "net.ipv6.conf.all.accept_dad=0",
            "net.ipv6.conf.default.accept_dad=0",
        ])?;
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// `ip -n NAME ARGS...`.
    pub fn ip(&self, args: &[&str]) -> Result<Output, String> {
        run(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }

    /// A command that runs inside this namespace's network (mounts stay those of the
    /// caller, so /sys/fs/bpf stays visible; `ip netns exec` would remount /sys).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.name))
            .arg("--")
            .arg(program);
        c
    }

    /// Runs `program args…` inside the namespace with `input` on its stdin (e.g.
    /// `iptables-restore`, `nft -f -`); fails with its stderr.
    pub fn feed(&self, program: &str, args: &[&str], input: &str) -> Result<(), String> {
        use std::io::Write as _;
        let mut child = self
            .command(program)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("{program}: {e}"))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(input.as_bytes())
                .map_err(|e| format!("{program}: {e}"))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| format!("{program}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{program} {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(())
    }

    /// Sets sysctls inside the namespace (`key=value`).
    pub fn sysctl(&self, settings: &[&str]) -> Result<(), String> {
        let mut c = self.command("sysctl");
        c.arg("-qw").args(settings);
        run(&mut c).map(|_| ())
    }

    /// Runs `f` on a new thread that has entered this namespace; sockets it creates live
    /// there. The calling thread's namespace is never changed.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> thread::JoinHandle<Result<T, String>> {
        let path = format!("/run/netns/{}", self.name);
        thread::spawn(move || {
            enter(&path)?;
            Ok(f())
        })
    }

    /// Runs `f` inside this namespace on a dedicated thread and waits for it.
    pub fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, String> {
        self.spawn(f)
            .join()
            .map_err(|_| "thread in netns panicked".to_string())?
    }
}

/// Moves the current thread into the network namespace at `path`.
pub fn enter(path: &str) -> Result<(), String> {
    let f = File::open(path).map_err(|e| format!("{path}: {e}"))?;
    // Affects only the calling thread.
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("setns {path}: {e}"))?;
    Ok(())
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// A child process killed (and reaped) on drop.
#[derive(Debug)]
pub struct Reap(pub std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
