//! `xlb trace` run against a scenario's agent, and the live flow maps it must leave alone
//! (shared by the trace/ test files).

use std::{net::SocketAddr, path::Path, time::Duration};

use crate::{
    datapath::{RawEntries, dump_pinned},
    scenario::Scenario,
};

/// `xlb trace ARGS…` in the node namespace against the scenario's agent; the flow maps must
/// be byte-identical before and after it.
pub fn trace(s: &Scenario, args: &[&str]) -> String {
    let before = settled_flow_maps(&s.agent.pins);
    let text = trace_only(s, args);
    let after = flow_maps(&s.agent.pins);
    // The live collector may delete flows that are over meanwhile (a pass every 5 s); a
    // trace's instance writes only its own copies, so nothing may be added or changed.
    let kept = |b: &RawEntries, a: &RawEntries| -> RawEntries {
        b.iter()
            .filter(|(k, _)| a.contains_key(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let before = (kept(&before.0, &after.0), kept(&before.1, &after.1));
    assert!(
        after == before,
        "xlb trace {args:?} changed the live flow or affinity maps\n{text}\nconntrack: {}\naffinity: {}",
        changed(&before.0, &after.0),
        changed(&before.1, &after.1)
    );
    text
}

/// The entries that differ between two dumps, for the failure message.
fn changed(before: &RawEntries, after: &RawEntries) -> String {
    let mut out = Vec::new();
    for (k, v) in after {
        match before.get(k) {
            Some(b) if b == v => {}
            Some(b) => out.push(format!("changed {k:02x?}: {b:02x?} -> {v:02x?}")),
            None => out.push(format!("added {k:02x?}: {v:02x?}")),
        }
    }
    for k in before.keys().filter(|k| !after.contains_key(*k)) {
        out.push(format!("removed {k:02x?}"));
    }
    out.join("; ")
}

/// `xlb trace ARGS…` (its output; it must succeed), without the map comparison.
pub fn trace_only(s: &Scenario, args: &[&str]) -> String {
    succeeded(trace_command(s, args), args)
}

/// The output of `xlb trace ARGS…`, which must have succeeded.
pub fn succeeded(out: std::process::Output, args: &[&str]) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "xlb trace {args:?} failed: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// `xlb trace ARGS…` with the scenario's pins and source, as it ended.
pub fn trace_command(s: &Scenario, args: &[&str]) -> std::process::Output {
    trace_in(&s.topo.node, &s.agent.pins, &s.yaml, args)
}

/// `xlb trace ARGS…` in the node namespace `node`, against the agent's `pins` and the
/// Service file `source`.
pub fn trace_in(
    node: &crate::netns::Netns,
    pins: &Path,
    source: &Path,
    args: &[&str],
) -> std::process::Output {
    node.command(crate::xlb_bin())
        .arg("trace")
        .args(args)
        .arg("--pin-dir")
        .arg(pins)
        .arg("--source")
        .arg(format!("file:{}", source.display()))
        .output()
        .expect("run xlb trace")
}

/// The slot and backend (`IP:PORT`) a trace's Maglev line names for a flow of `hash` over
/// a table of `m` entries (`algorithm  maglev: flow hash H -> entry E of M=m -> slot S
/// (IP:PORT)`); panics naming what is missing.
pub fn maglev_choice(text: &str, hash: u32, m: u32) -> (String, String) {
    let head = format!(
        "algorithm  maglev: flow hash {hash:#010x} -> entry {} of M={m} -> slot ",
        hash % m
    );
    let line = text
        .lines()
        .find_map(|l| l.split_once(&head).map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no line with {head:?}:\n{text}"));
    let (slot, backend) = line
        .strip_suffix(')')
        .and_then(|l| l.split_once(" ("))
        .unwrap_or_else(|| panic!("{line:?}"));
    (slot.to_string(), backend.to_string())
}

/// The `=> OUTCOME` line of a trace.
pub fn outcome(text: &str) -> String {
    text.lines()
        .find_map(|l| l.trim().strip_prefix("=> "))
        .unwrap_or_else(|| panic!("no outcome in:\n{text}"))
        .to_string()
}

/// The flow maps the datapath writes, byte by byte: the conntrack tables of both families
/// (IPv4's two, then IPv6's two), then affinity.
pub fn flow_maps(pins: &Path) -> (RawEntries, RawEntries) {
    let mut ct = RawEntries::new();
    for (i, name) in [
        lb_common::MAP_CT,
        lb_common::MAP_CT_ASSURED,
        lb_common::MAP_CT6,
        lb_common::MAP_CT6_ASSURED,
    ]
    .into_iter()
    .enumerate()
    {
        let table = dump_pinned(pins, name).unwrap_or_else(|e| panic!("dump {name}: {e}"));
        // Keyed by table too: the IPv4 and IPv6 keys never collide, but say so.
        ct.extend(table.into_iter().map(|(mut k, v)| {
            k.insert(0, i as u8);
            (k, v)
        }));
    }
    (
        ct,
        dump_pinned(pins, lb_common::MAP_AFFINITY).expect("dump affinity"),
    )
}

/// The flow maps once the real traffic before them has settled (two dumps 300 ms apart
/// alike, for at most 6 s): a connection's last packets (its FIN and ACKs, a late UDP
/// answer, seen by tc ingress and again by tc egress) still update their entries after the
/// request returned, later on a loaded machine.
pub fn settled_flow_maps(pins: &Path) -> (RawEntries, RawEntries) {
    let mut last = flow_maps(pins);
    for _ in 0..20 {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let now = flow_maps(pins);
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

/// One request on a connection left open: the answer, and the connection.
pub fn open_request(
    to: SocketAddr,
    timeout: Duration,
) -> Result<(crate::client::Answer, std::net::TcpStream), String> {
    use std::io::{BufRead, BufReader, Write};
    let mut c = std::net::TcpStream::connect_timeout(&to, timeout).map_err(|e| e.to_string())?;
    c.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    c.write_all(b"hello\n").map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(&c)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let mut w = line.split_whitespace();
    let answer = crate::client::Answer {
        backend: w.next().unwrap_or_default().to_string(),
        seen_client: w.next().unwrap_or_default().to_string(),
    };
    Ok((answer, c))
}
