//! Clients as processes: `xlb-probe …` run in a network namespace and, for the socket
//! hooks, in a cgroup it joins before it runs (the hooks act on the processes of a cgroup,
//! and a thread cannot leave its process's cgroup). Each run is bounded in time.

use std::{
    io::Read,
    path::Path,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use crate::{cgroup::Cgroup, netns::Netns};

/// Runs `PROBE ARGS…` (the `xlb-probe` binary) in `ns` (and in `cgroup`, when given) and
/// returns what it printed; a client still running after `limit` is killed and the run
/// fails.
pub fn run_client(
    probe: &Path,
    ns: &Netns,
    cgroup: Option<&Cgroup>,
    args: &[String],
    limit: Duration,
) -> Result<String, String> {
    let mut cmd = ns.command(probe);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(cg) = cgroup {
        cg.enter_on_exec(&mut cmd);
    }
    let child = cmd
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", probe.display()))?;
    wait_bounded(child, limit).map_err(|e| format!("xlb-probe {}: {e}", args.join(" ")))
}

/// Reads a pipe to the end on a thread of its own.
fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_string(&mut text);
        }
        text
    })
}

/// Waits for `child` at most `limit` (killing it then); its stdout if it succeeded.
fn wait_bounded(mut child: Child, limit: Duration) -> Result<String, String> {
    let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(format!("still running after {limit:?}: killed"));
            }
            Err(e) => break Err(e.to_string()),
        }
    };
    let (out, err) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    match status? {
        s if s.success() => Ok(out),
        s => Err(format!("{s}: {}", err.trim())),
    }
}
