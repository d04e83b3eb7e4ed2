//! The kernel's conntrack agrees with xlb: for TCP flows the tc datapath serves (pod →
//! ClusterIP to a local and to a remote backend, external client → NodePort to a local
//! and to a remote, SNATed backend; both families), `conntrack -L` in the node namespace
//! holds an ESTABLISHED, ASSURED entry from the client to the backend's address, whose
//! reply comes from the backend, as under kube-proxy.

use std::{
    io::{BufRead, BufReader, Write},
    net::{IpAddr, SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use xlb_tests::{
    netfilter::{Entry, conntrack_entries, track_connections},
    scenario::TCP_PORT,
    topology::{pod_ip, pod_ip6, remote_pod_ip, remote_pod_ip6},
    twonode::Lab,
};

use crate::{Frontends, Path, TIMEOUT, V4, V6, lab, log_tail, origin, paths, wait_served};

/// A connection kept open: where it went, its client address, the backend it must reach.
struct Open {
    what: &'static str,
    stream: TcpStream,
    client: SocketAddr,
    backend: IpAddr,
}

/// Opens a connection along `path`, asks once, and keeps it open.
fn open(lab: &Lab, path: &Path, backend: IpAddr) -> Open {
    let to = path.tcp;
    let (stream, client) = origin(lab, path.from)
        .run(move || -> Result<(TcpStream, SocketAddr), String> {
            let mut s = TcpStream::connect_timeout(&to, TIMEOUT).map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(TIMEOUT))
                .map_err(|e| e.to_string())?;
            s.write_all(b"hello\n").map_err(|e| e.to_string())?;
            let mut line = String::new();
            BufReader::new(&s)
                .read_line(&mut line)
                .map_err(|e| e.to_string())?;
            let client = s.local_addr().map_err(|e| e.to_string())?;
            Ok((s, client))
        })
        .expect("client thread")
        .unwrap_or_else(|e| {
            panic!(
                "{} to {to}: {e}\n{}",
                path.what,
                log_tail(&lab.agent.log_text())
            )
        });
    Open {
        what: path.what,
        stream,
        client,
        backend,
    }
}

/// The entry of `flow` in `entries` if it is as under kube-proxy: ESTABLISHED and ASSURED,
/// from the client to the backend, the reply from the backend.
fn agrees(flow: &Open, entries: &[Entry]) -> Result<(), String> {
    let (ip, port) = (flow.client.ip(), flow.client.port());
    let entry = entries
        .iter()
        .find(|e| e.protocol == "tcp" && e.orig.0 == ip && e.orig.1 == port)
        .ok_or_else(|| format!("no entry from the client {}", flow.client))?;
    let backend = (flow.backend, TCP_PORT);
    let good = entry.state == "ESTABLISHED"
        && entry.assured
        && (entry.orig.2, entry.orig.3) == backend
        && (entry.reply.0, entry.reply.1) == backend;
    good.then_some(()).ok_or_else(|| entry.line.clone())
}

/// Every TCP path of `family` that leaves node1's pods or uplink for a backend, kept open
/// until the node's conntrack holds each as kube-proxy's would (waiting up to 5 s).
fn tracked(prefix: &str, family: &Frontends, backends: [IpAddr; 2]) {
    let Some(lab) = lab(prefix, &[]) else {
        return;
    };
    wait_served(&lab, &paths(family));
    track_connections(&lab.topo.node).expect("conntrack on node1");
    let flows: Vec<Open> = paths(family)
        .iter()
        .filter(|p| !p.what.starts_with("hairpin"))
        .map(|p| {
            let backend = if p.backend == "backend-1" {
                backends[0]
            } else {
                backends[1]
            };
            open(&lab, p, backend)
        })
        .collect();
    let family_name = if backends[0].is_ipv4() {
        "ipv4"
    } else {
        "ipv6"
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let entries = conntrack_entries(&lab.topo.node, family_name).expect("conntrack -L");
        let verdicts: Vec<(&Open, Result<(), String>)> =
            flows.iter().map(|f| (f, agrees(f, &entries))).collect();
        if verdicts.iter().all(|(_, v)| v.is_ok()) {
            break;
        }
        if Instant::now() > deadline {
            let lines: Vec<String> = verdicts
                .iter()
                .map(|(f, v)| match v {
                    Ok(()) => format!("ok  {}", f.what),
                    Err(e) => format!("BAD {} ({} → {}): {e}", f.what, f.client, f.backend),
                })
                .collect();
            let table: Vec<&str> = entries.iter().map(|e| e.line.as_str()).collect();
            panic!(
                "node1's conntrack does not hold the flows tc serves as ESTABLISHED, ASSURED, \
                 client → backend:\n{}\n--- conntrack -L -f {family_name}:\n{}\n{}",
                lines.join("\n"),
                table.join("\n"),
                log_tail(&lab.agent.log_text())
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(flows.into_iter().map(|f| f.stream).collect::<Vec<_>>());
}

#[test]
fn conntrack_holds_ipv4_flows_served_by_tc_as_established_to_the_backend() {
    let backends = [pod_ip(2).into(), remote_pod_ip(1).into()];
    tracked("nft4", &V4, backends);
}

#[test]
fn conntrack_holds_ipv6_flows_served_by_tc_as_established_to_the_backend() {
    let backends = [pod_ip6(2).into(), remote_pod_ip6(1).into()];
    tracked("nft6", &V6, backends);
}
