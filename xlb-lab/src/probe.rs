//! `xlb-probe`, the labs' client process: running it in a cgroup and a network namespace
//! and reading what it printed (one [`Line`] per request), and its `flows` summary
//! ([`flows`]: one [`Outcome`] per target).

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::Duration,
};

use lb_userspace::model::Protocol;

use crate::{
    cgroup::Cgroup,
    client::{tcp_request, udp_request},
    compare::{Outcome, parse_target},
    netns::Netns,
    sctp::sctp_request,
};

/// One request as the probe saw it.
#[derive(Clone, Debug, PartialEq)]
pub enum Line {
    /// Answered: how long it took, the backend's name, the client address the backend saw,
    /// and the peer address the client's socket saw (getpeername/recvfrom).
    Ok {
        ms: f64,
        backend: String,
        seen_client: String,
        peer: SocketAddr,
    },
    /// Failed: how long it took, the errno (0 for none, e.g. end of stream) and the message.
    Err {
        ms: f64,
        errno: i32,
        message: String,
    },
}

impl Line {
    /// The answer's backend, if it was answered.
    pub fn backend(&self) -> Option<&str> {
        match self {
            Line::Ok { backend, .. } => Some(backend),
            Line::Err { .. } => None,
        }
    }
}

/// The `xlb-probe` binary beside `xlb` (cargo builds both into one directory), or
/// `$XLB_PROBE`.
pub fn bin_beside(xlb: &Path) -> PathBuf {
    match std::env::var_os("XLB_PROBE") {
        Some(p) => p.into(),
        None => xlb.with_file_name("xlb-probe"),
    }
}

/// The `xlb-probe` binary: `$XLB_PROBE`, else beside `$XLB_BIN`, else beside the running
/// executable (or one directory up, for a test binary in `target/*/deps`).
pub fn probe_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("XLB_PROBE") {
        return p.into();
    }
    if let Some(xlb) = std::env::var_os("XLB_BIN") {
        return bin_beside(Path::new(&xlb));
    }
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(2) {
            let p = dir.join("xlb-probe");
            if p.exists() {
                return p;
            }
        }
    }
    PathBuf::from("xlb-probe")
}

fn parse(line: &str) -> Result<Line, String> {
    let w: Vec<&str> = line.splitn(5, ' ').collect();
    let ms = |s: &str| s.parse::<f64>().map_err(|e| format!("{line:?}: {e}"));
    match w.as_slice() {
        ["ok", t, backend, seen, peer] => Ok(Line::Ok {
            ms: ms(t)?,
            backend: backend.to_string(),
            seen_client: seen.to_string(),
            peer: peer.parse().map_err(|e| format!("{line:?}: {e}"))?,
        }),
        ["err", t, errno, rest @ ..] => Ok(Line::Err {
            ms: ms(t)?,
            errno: errno.parse().map_err(|e| format!("{line:?}: {e}"))?,
            message: rest.join(" "),
        }),
        _ => Err(format!("unexpected probe output {line:?}")),
    }
}

/// Parses what a probe printed.
pub fn lines(stdout: &str) -> Result<Vec<Line>, String> {
    stdout
        .lines()
        .filter(|l| !l.is_empty())
        .map(parse)
        .collect()
}

/// Starts `xlb-probe ARGS…` in `cg` and `ns`; its stdout is piped.
pub fn spawn(cg: &Cgroup, ns: &Netns, args: &[String]) -> Result<Child, String> {
    cg.command(ns, probe_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", probe_bin().display()))
}

/// Waits for a probe started with [`spawn`] and parses its lines.
pub fn finish(child: Child) -> Result<Vec<Line>, String> {
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "xlb-probe failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    lines(&String::from_utf8_lossy(&out.stdout))
}

/// Runs `xlb-probe MODE TO N…` to the end.
pub fn run(cg: &Cgroup, ns: &Netns, args: &[String]) -> Result<Vec<Line>, String> {
    finish(spawn(cg, ns, args)?)
}

/// Reads a running probe's lines as they come, each with when it arrived; the channel
/// closes when the probe ends (a line it cannot parse ends it too, as an `Err` line).
pub fn stream(mut child: Child) -> std::sync::mpsc::Receiver<(std::time::Instant, Line)> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        if let Some(out) = child.stdout.take() {
            for l in std::io::BufReader::new(out).lines() {
                let line = l
                    .map_err(|e| e.to_string())
                    .and_then(|l| parse(&l))
                    .unwrap_or_else(|message| Line::Err {
                        ms: 0.0,
                        errno: -1,
                        message,
                    });
                if tx.send((std::time::Instant::now(), line)).is_err() {
                    break;
                }
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    });
    rx
}

/// A running `udp-stay` probe: one connected UDP socket in `ns` (under `cg`) asking `to`
/// every 20 ms, for 3 s; its lines, and the backend its first answer came from
/// (`backend-k`: its name, and `k`).
pub fn udp_stay(
    cg: &Cgroup,
    ns: &Netns,
    to: SocketAddr,
) -> (
    std::sync::mpsc::Receiver<(std::time::Instant, Line)>,
    String,
    usize,
) {
    let args: Vec<String> = ["udp-stay", &to.to_string(), "3", "20"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    let rx = stream(spawn(cg, ns, &args).expect("probe"));
    let (_, first) = rx.recv_timeout(Duration::from_secs(3)).expect("an answer");
    let on = first.backend().expect("answered").to_string();
    let index: usize = on
        .strip_prefix("backend-")
        .and_then(|k| k.parse().ok())
        .expect("backend-k");
    (rx, on, index)
}

/// A `udp-stay` probe's lines `after` backend `on` was removed at `removed`: the socket was
/// destroyed (a call failed with EDESTADDRREQ or ECONNABORTED), its client answered by
/// another backend within a second, and never by `on` after that. `who` and `log` (the
/// agent's) name a failure.
pub fn assert_left_removed_backend(
    who: &str,
    on: &str,
    removed: std::time::Instant,
    after: &[(std::time::Instant, Line)],
    log: &str,
) {
    let moved = after
        .iter()
        .find(|(_, l)| l.backend().is_some_and(|b| b != on))
        .unwrap_or_else(|| panic!("{who}: never left {on}: {after:?}\n{log}"));
    let took = moved.0.duration_since(removed);
    assert!(
        took < Duration::from_secs(1),
        "{who}: moved off {on} after {took:?}"
    );
    let stayed = after
        .iter()
        .filter(|(t, l)| *t > moved.0 && l.backend() == Some(on))
        .count();
    assert_eq!(
        stayed, 0,
        "{who}: answers from {on} after the move: {after:?}"
    );
    assert!(
        after.iter().any(|(_, l)| matches!(
            l,
            Line::Err {
                errno: 89 | 103,
                ..
            }
        )),
        "{who}: the socket was destroyed (its next call failed with EDESTADDRREQ or ECONNABORTED): {after:?}\n{log}"
    );
}

/// How long one request of a flow may take (connect, then the answer).
pub const REQUEST_TIMEOUT: Duration = Duration::from_millis(500);

/// `xlb-probe flows --requests N TARGET…`: `requests` requests for each target
/// (`tcp/IP:PORT`, `udp/IP:PORT`, `sctp/IP:PORT`: a whole association each); one
/// [`Outcome`] line per target, in order.
pub fn flows(requests: usize, targets: &[String]) -> Result<String, String> {
    let mut out = String::new();
    for t in targets {
        let (protocol, to) = parse_target(t)?;
        let _ = writeln!(out, "{}", drive(protocol, to, requests.max(1)));
    }
    Ok(out)
}

/// Sends `requests` requests on fresh connections (sockets); classifies the result.
fn drive(protocol: Protocol, to: SocketAddr, requests: usize) -> Outcome {
    let mut backends = BTreeSet::new();
    for _ in 0..requests {
        let r = match protocol {
            Protocol::Udp => udp_request(to, REQUEST_TIMEOUT),
            Protocol::Sctp => sctp_request(to, REQUEST_TIMEOUT),
            _ => tcp_request(to, REQUEST_TIMEOUT),
        };
        match r {
            Ok(a) => {
                backends.insert(a.backend);
            }
            Err(e) if e.contains("refused") => return Outcome::Refused,
            Err(e)
                if e.contains("timed out")
                    || e.contains("no INIT ACK within")
                    || e.contains("WouldBlock")
                    || e.contains("temporarily unavailable") =>
            {
                return if backends.is_empty() {
                    Outcome::Dropped
                } else {
                    Outcome::Failed(e)
                };
            }
            Err(e) => return Outcome::Failed(e),
        }
    }
    Outcome::Backends(backends)
}
