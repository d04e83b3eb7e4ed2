//! `xlb agent` as a process inside a node namespace, with its own pin directory; stopped and
//! cleaned up on drop.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{cgroup::Cgroup, netns::Netns};

/// A running agent.
pub struct Agent {
    /// The cgroup its socket hooks are attached to (`--cgroup-path`), unless the caller
    /// passed one: never the machine's root cgroup. Removed after the agent's cleanup.
    pub cgroup: Option<Cgroup>,
    child: Option<Child>,
    pub pins: PathBuf,
    pub log: PathBuf,
    xlb: PathBuf,
    /// The full command line (nsenter … xlb agent …), to start it again on the same pins.
    command: Vec<std::ffi::OsString>,
}

impl Agent {
    /// Starts `xlb agent` in `node` on `source` (a YAML file), attached to `pod_glob`.
    pub fn start(
        node: &Netns,
        source: &Path,
        pod_glob: &str,
        pins: PathBuf,
        log: PathBuf,
    ) -> Result<Self, String> {
        let args = vec![
            "--source".into(),
            format!("file:{}", source.display()),
            "--pod-interfaces".into(),
            pod_glob.into(),
        ];
        Self::start_with(node, &args, pins, log)
    }

    /// Starts `xlb agent ARGS… --bpffs PINS` in `node`.
    pub fn start_with(
        node: &Netns,
        args: &[String],
        pins: PathBuf,
        log: PathBuf,
    ) -> Result<Self, String> {
        Self::start_wrapped(node, &[], args, pins, log)
    }

    /// Like [`Agent::start_with`], with `wrapper` (e.g. `setpriv …`) before `xlb`.
    pub fn start_wrapped(
        node: &Netns,
        wrapper: &[&str],
        args: &[String],
        pins: PathBuf,
        log: PathBuf,
    ) -> Result<Self, String> {
        let xlb = crate::xlb_bin();
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = node.command(first);
                c.args(rest).arg(&xlb);
                c
            }
            None => node.command(&xlb),
        };
        cmd.arg("agent").args(args).arg("--bpffs").arg(&pins);
        let cgroup = if args.iter().any(|a| a == "--cgroup-path") {
            None
        } else {
            let cg = Cgroup::new(&crate::unique_tag("agent"))?;
            cmd.arg("--cgroup-path").arg(&cg.path);
            Some(cg)
        };
        let mut command = vec![cmd.get_program().to_os_string()];
        command.extend(cmd.get_args().map(|a| a.to_os_string()));
        let mut agent = Agent {
            cgroup,
            child: None,
            pins,
            log,
            xlb,
            command,
        };
        agent.spawn()?;
        Ok(agent)
    }

    fn spawn(&mut self) -> Result<(), String> {
        let out =
            std::fs::File::create(&self.log).map_err(|e| format!("{}: {e}", self.log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(&self.command[0])
            .args(&self.command[1..])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", self.xlb.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// Stops the agent, leaving its pins, and starts a new one on them, logging to `log`.
    pub fn restart(&mut self, log: PathBuf) -> Result<(), String> {
        self.stop();
        self.log = log;
        self.spawn()
    }

    /// Stops the agent, leaving its pins, and starts one with other flags `args` on the
    /// same pins (and the same cgroup), logging to `log`.
    pub fn restart_with(&mut self, args: &[String], log: PathBuf) -> Result<(), String> {
        let at = |word: &str| {
            self.command
                .iter()
                .position(|a| a == word)
                .ok_or(format!("no {word:?} in the agent's command"))
        };
        let (from, to) = (at("agent")? + 1, at("--bpffs")?);
        self.command
            .splice(from..to, args.iter().map(std::ffi::OsString::from));
        self.restart(log)
    }

    /// The agent process's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Waits until the agent's log has `n` lines containing `what`; how long it took.
    pub fn wait_log(&self, what: &str, n: usize, timeout: Duration) -> Result<Duration, String> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if self.log_text().matches(what).count() >= n {
                return Ok(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Err(format!("no {n}× {what:?} in:\n{}", self.log_text()))
    }

    /// The agent's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `pred` holds for the programmed services (read from the pinned maps).
    pub fn wait_for(
        &mut self,
        timeout: Duration,
        pred: impl Fn(&[lb_userspace::list::ServiceRow]) -> bool,
    ) -> Result<Duration, String> {
        let start = Instant::now();
        loop {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                return Err(format!("agent exited with {status}:\n{}", self.log_text()));
            }
            if let Ok(rows) = lb_userspace::list::services(&crate::pins(&self.pins))
                && pred(&rows)
            {
                return Ok(start.elapsed());
            }
            if start.elapsed() > timeout {
                return Err(format!(
                    "agent not in the expected state after {timeout:?}:\n{}",
                    self.log_text()
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops the agent (SIGTERM) and leaves its pins in place.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            use nix::{sys::signal, unistd::Pid};
            let _ = signal::kill(Pid::from_raw(c.id() as i32), signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
        let _ = Command::new(&self.xlb)
            .arg("cleanup")
            .arg("--bpffs")
            .arg(&self.pins)
            .output();
    }
}
