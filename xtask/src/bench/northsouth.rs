//! Bench `northsouth`: a NodePort from an external client to a backend on the other node
//! (SNAT on node1), through xlb with tc only, with generic XDP and with native XDP, beside
//! plain routing to the pod without any translation (the floor). The two-node lab of the
//! north-south tests (`xlb_tests::twonode`), with checksum offload off on every veth so that
//! XDP sees complete checksums and takes the packets itself (with offload on, a veth sender's
//! packets carry partial checksums and XDP leaves them to tc).
//!
//! Direct server return side by side with SNAT in the same lab shape: node2 runs its own
//! agent and has its own link to the client (`Lab::direct_return`), both agents in
//! `--lb-mode dsr` or both in `--lb-mode snat`; the only difference is the mode (with SNAT
//! the replies come back through node1, with DSR they leave node2 straight to the client).
//! Besides the upload, a download (`SOURCE <len>` to the echo server): the bulk direction
//! whose packets are the replies DSR reroutes.
//!
//! `XLB_BENCH_TRIALS=N` (other than 3) runs N trials, prints the section and leaves
//! docs/benchmarks.md alone.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use anyhow::{Result, anyhow};
use xlb_lab::load::{Measured, measure, wait_ready};
use xlb_tests::{
    client::tcp_upload,
    scenario::TCP_PORT,
    topology::{NODE1_UNDERLAY, NODE2_UNDERLAY, remote_pod_ip},
    twonode::{Lab, WEB_NODE_PORT, web_node_port},
};

use super::{
    Summary,
    report::{self, Section},
    verdict,
};

const TRIALS: usize = 3;
const UPLOAD: usize = 32 << 20;
const DOWNLOAD: usize = 32 << 20;
const NODE_PORT: u16 = WEB_NODE_PORT;

/// One path measured: its name, node1's `--xdp` (None: plain routing, no xlb in the way),
/// and the `--lb-mode` of both agents when node2 runs one too and has its own link to the
/// client (`Lab::direct_return`).
struct Path {
    name: &'static str,
    xdp: Option<&'static str>,
    lb_mode: Option<&'static str>,
}

/// The paths measured, in table order.
const PATHS: [Path; 6] = [
    Path {
        name: "routed to the pod (no NAT)",
        xdp: None,
        lb_mode: None,
    },
    Path {
        name: "xlb, tc",
        xdp: Some("off"),
        lb_mode: None,
    },
    Path {
        name: "xlb, XDP generic",
        xdp: Some("generic"),
        lb_mode: None,
    },
    Path {
        name: "xlb, XDP native",
        xdp: Some("native"),
        lb_mode: None,
    },
    Path {
        name: "xlb, tc, node2 agent: SNAT",
        xdp: Some("off"),
        lb_mode: Some("snat"),
    },
    Path {
        name: "xlb, tc, node2 agent: DSR",
        xdp: Some("off"),
        lb_mode: Some("dsr"),
    },
];
/// Indices in [`PATHS`] of the SNAT and DSR rows of the same lab shape.
const SNAT2: usize = 4;
const DSR: usize = 5;
/// The DSR bulk target: DSR ÷ SNAT in the same lab shape.
const DSR_TARGET: f64 = 1.1;

struct Trial {
    m: Measured,
    upload_mb_s: f64,
    download_mb_s: f64,
    xdp_redirects: u64,
    /// Flows node1 sent with the frontend option, and node2 learnt from it.
    dsr_out: u64,
    dsr_in: u64,
}

fn yaml() -> String {
    web_node_port(&[(remote_pod_ip(1), "node2")])
}

/// Downloads `len` bytes from the echo server at `target` (`SOURCE <len>`); MB/s from
/// connect to the server's close.
fn download(target: SocketAddr, len: usize, timeout: Duration) -> Result<f64> {
    let t = Instant::now();
    let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(1))?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(format!("SOURCE {len}\n").as_bytes())?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0usize;
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        got += n;
        if t.elapsed() > timeout {
            return Err(anyhow!("download: {got} of {len} bytes in {timeout:?}"));
        }
    }
    if got != len {
        return Err(anyhow!("download: {got} of {len} bytes"));
    }
    Ok(len as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64())
}

fn one(path: &Path) -> Result<Trial> {
    let xdp = path.xdp;
    let mode = xdp.unwrap_or("off");
    let mut extra = vec!["--xdp", mode, "--snat-port-range", "10000-65535"];
    if let Some(lb) = path.lb_mode {
        extra.extend(["--lb-mode", lb]);
    }
    let mut lab = Lab::start_with(
        "xlbn",
        &yaml(),
        1500,
        "192.0.2.1:30080/TCP",
        // Thousands of connections a second: a range that holds them while they close.
        &extra,
    );
    if let Some(lb) = path.lb_mode {
        lab.direct_return(
            &format!("{NODE2_UNDERLAY}:{NODE_PORT}/TCP"),
            &["--lb-mode", lb],
        );
        // node2's link to the client as every other veth: checksum offload off.
        for (ns, iface) in [(&lab.remote.ns, "dr0"), (&lab.ext.ns, "eth1")] {
            let out = ns
                .command("ethtool")
                .args(["-K", iface, "rx", "off", "tx", "off"])
                .output()?;
            if !out.status.success() {
                return Err(anyhow!("ethtool -K {iface} rx/tx off failed"));
            }
        }
    }
    lab.set_offload(false);
    lab.enable_napi_for_redirects();
    let target = match xdp {
        Some(_) => SocketAddr::from((Ipv4Addr::new(192, 0, 2, 1), NODE_PORT)),
        None => {
            // Plain routing: the client reaches the pod through node1, node2 routes back.
            lab.ext
                .ns
                .ip(&["route", "add", "10.245.0.0/16", "via", "192.0.2.1"])
                .map_err(|e| anyhow!(e))?;
            lab.remote
                .ns
                .ip(&[
                    "route",
                    "add",
                    "192.0.2.0/24",
                    "via",
                    &NODE1_UNDERLAY.to_string(),
                ])
                .map_err(|e| anyhow!(e))?;
            SocketAddr::from((remote_pod_ip(1), TCP_PORT))
        }
    };
    let (m, up, down) = lab.outside(move || {
        // One connection first (neighbour entries along the path, for every path alike): a
        // first SYN or SYN-ACK lost to an unresolved neighbour costs a 1 s retransmit.
        let _ = wait_ready(target, Duration::from_secs(5));
        let m = measure(target, Duration::from_millis(1500));
        let t = Instant::now();
        let up = tcp_upload(target, UPLOAD, Duration::from_secs(30))
            .map(|u| (u.sha256_matches, t.elapsed()));
        let down = download(target, DOWNLOAD, Duration::from_secs(30));
        (m, up, down)
    });
    let name = path.name;
    let (ok, took) = up.map_err(|e| anyhow!("upload through {name}: {e}"))?;
    if !ok {
        return Err(anyhow!("upload through {name}: the bytes arrived changed"));
    }
    let download_mb_s = down.map_err(|e| anyhow!("download through {name}: {e}"))?;
    let dsr_in = lab.node2_agent.as_ref().map_or(0, |a| {
        xlb_tests::datapath::reason_counts(&a.pins)
            .get("dsr_in")
            .copied()
            .unwrap_or(0)
    });
    Ok(Trial {
        m,
        upload_mb_s: UPLOAD as f64 / (1 << 20) as f64 / took.as_secs_f64(),
        download_mb_s,
        xdp_redirects: lab.counter("xdp_redirect"),
        dsr_out: lab.counter("dsr_out"),
        dsr_in,
    })
}

/// Runs the bench; returns its report section, and whether it is the full run (written to
/// docs/benchmarks.md).
pub fn run() -> Result<(Section, bool)> {
    let (trials, full) = super::trials(TRIALS)?;
    let mut results: BTreeMap<usize, Vec<Trial>> = BTreeMap::new();
    for _ in 0..trials {
        for (i, path) in PATHS.iter().enumerate() {
            let t = one(path)?;
            println!(
                "{:>28}: {:.0} conn/s, {:.0} req/s, connect p50 {:.0} µs p99 {:.0} µs, upload {:.0} MB/s, download {:.0} MB/s, {} XDP redirects, DSR {} out / {} in, {} failures",
                path.name,
                t.m.conns_per_s,
                t.m.reqs_per_s,
                t.m.connect_p50_us,
                t.m.connect_p99_us,
                t.upload_mb_s,
                t.download_mb_s,
                t.xdp_redirects,
                t.dsr_out,
                t.dsr_in,
                t.m.failures
            );
            results.entry(i).or_default().push(t);
        }
    }
    let stat = |i: usize, f: fn(&Trial) -> f64| {
        Summary::of(&results[&i].iter().map(f).collect::<Vec<_>>())
    };
    let mut body = format!(
        "NodePort `192.0.2.1:{NODE_PORT}` from the external client to a backend on node2 (externalTrafficPolicy Cluster: DNAT + SNAT on node1), \
         in the two-node lab of the north-south tests, checksum offload off on every veth (with it on, XDP leaves a veth sender's \
         partial-checksum packets to tc). *routed* = the client sends to the pod's address and node1 only forwards it (xlb's tc program sees it and passes it): the floor. \
         *node2 agent: SNAT / DSR* = the same NodePort with node2 running its own agent and its own link to the client (`Lab::direct_return`: \
         node2 `dr0` 192.0.3.2 ↔ client `eth1` 192.0.3.10), both agents in `--lb-mode snat` or both in `--lb-mode dsr`, tc only: the same lab shape, \
         only the mode differs (SNAT's replies come back through node1, DSR's leave node2 straight to the client). \
         Median [min–max] of {trials} trials, paths interleaved; *upload* = {} MB over one connection, SHA-256 checked; \
         *download* = {} MB from the backend over one connection (`SOURCE`), byte count checked: its data packets are the replies.\n\n",
        UPLOAD >> 20,
        DOWNLOAD >> 20,
    );
    let headers: Vec<String> = [
        "path",
        "new conn/s",
        "req/s (kept)",
        "connect p50 (µs)",
        "upload MB/s",
        "download MB/s",
        "XDP redirects",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows: Vec<Vec<String>> = PATHS
        .iter()
        .enumerate()
        .map(|(i, path)| {
            vec![
                path.name.to_string(),
                stat(i, |t| t.m.conns_per_s).show(0),
                stat(i, |t| t.m.reqs_per_s).show(0),
                stat(i, |t| t.m.connect_p50_us).show(0),
                stat(i, |t| t.upload_mb_s).show(0),
                stat(i, |t| t.download_mb_s).show(0),
                stat(i, |t| t.xdp_redirects as f64).show(0),
            ]
        })
        .collect();
    body.push_str(&report::table(&headers, &rows));
    let conns = |i: usize| stat(i, |t| t.m.conns_per_s).median;
    let reqs = |i: usize| stat(i, |t| t.m.reqs_per_s).median;
    let upload = |i: usize| stat(i, |t| t.upload_mb_s).median;
    let download = |i: usize| stat(i, |t| t.download_mb_s).median;
    let _ = write!(
        body,
        "\n**Ratios** (medians of this run, ÷ routed): new conn/s tc {:.2}×, XDP generic {:.2}×, XDP native {:.2}×; \
         upload tc {:.2}×, XDP generic {:.2}×, XDP native {:.2}×; download tc {:.2}×, XDP generic {:.2}×, XDP native {:.2}×.\n\n\
         **DSR ÷ SNAT** (same lab shape, medians of this run): new conn/s {:.2}×, req/s {:.2}×, upload {:.2}× ({:.0} vs {:.0} MB/s), \
         download {:.2}× ({:.0} vs {:.0} MB/s).\n\n",
        conns(1) / conns(0),
        conns(2) / conns(0),
        conns(3) / conns(0),
        upload(1) / upload(0),
        upload(2) / upload(0),
        upload(3) / upload(0),
        download(1) / download(0),
        download(2) / download(0),
        download(3) / download(0),
        conns(DSR) / conns(SNAT2),
        reqs(DSR) / reqs(SNAT2),
        upload(DSR) / upload(SNAT2),
        upload(DSR),
        upload(SNAT2),
        download(DSR) / download(SNAT2),
        download(DSR),
        download(SNAT2),
    );
    let dsr_carried = results[&DSR].iter().all(|t| t.dsr_out > 0 && t.dsr_in > 0)
        && results[&SNAT2].iter().all(|t| t.dsr_out == 0);
    let down_ratio = download(DSR) / download(SNAT2);
    let up_ratio = upload(DSR) / upload(SNAT2);
    let _ = write!(
        body,
        "**Targets**\n\n* XDP forwards the flows itself (redirect counter > 0 in every XDP trial): **{}**.\n\
         * native XDP upload at least as fast as tc: **{}** ({:.0} vs {:.0} MB/s).\n\
         * DSR takes the flows (node1 counts `dsr_out` and node2 `dsr_in` in every DSR trial, node1 no `dsr_out` with SNAT): **{}**.\n",
        verdict(
            results[&2]
                .iter()
                .chain(&results[&3])
                .all(|t| t.xdp_redirects > 0)
        ),
        verdict(upload(3) >= upload(1)),
        upload(3),
        upload(1),
        verdict(dsr_carried),
    );
    let _ = write!(
        body,
        "* DSR bulk ≥ {DSR_TARGET}× SNAT, download (the replies' direction): **{}** ({down_ratio:.2}×: {:.0} vs {:.0} MB/s){}\n\
         * DSR bulk ≥ {DSR_TARGET}× SNAT, upload: **{}** ({up_ratio:.2}×: {:.0} vs {:.0} MB/s){}\n",
        verdict(down_ratio >= DSR_TARGET),
        download(DSR),
        download(SNAT2),
        if down_ratio >= DSR_TARGET {
            "."
        } else {
            DOWNLOAD_MISSED
        },
        verdict(up_ratio >= DSR_TARGET),
        upload(DSR),
        upload(SNAT2),
        if up_ratio >= DSR_TARGET {
            "."
        } else {
            UPLOAD_MISSED
        },
    );
    let bars: Vec<(String, f64)> = PATHS
        .iter()
        .enumerate()
        .map(|(i, path)| (path.name.to_string(), upload(i)))
        .collect();
    if full {
        report::bar_plot(
            "bench-northsouth.svg",
            "NodePort to a remote backend: upload MB/s",
            "MB/s",
            &bars,
        )?;
    }
    body.push_str(
        "\nReading: on veth, XDP does not pay here. A frame redirected into a veth is received by \
         the peer's NAPI poll (GRO on, which native redirects need) and turned into an skb there anyway, and XDP looks the \
         route up for every packet to redirect it, where tc caches the route MTU in the flow's entry and lets the kernel \
         route. What XDP saves, the skb before the decision, shows on physical NICs at line rate, which this VM does not \
         have; `--xdp` stays off by default.\n\n![northsouth](bench-northsouth.svg)\n",
    );
    Ok((
        Section {
            title: "northsouth: NodePort through tc and XDP, DSR beside SNAT".into(),
            body,
        },
        full,
    ))
}

/// What would close the DSR download target when it is missed.
const DOWNLOAD_MISSED: &str = ". What would close it: DSR saves the replies one hop (node2 → node1's veth, node1's \
     tc programs and reverse NAT, node1 → client) and nothing else; in this lab both nodes are namespaces \
     on the same 2 cores, so the hop saved is CPU time the rest of the path shares, not a link's \
     capacity. Nodes that do not share cores (or an uplink whose bandwidth the replies saturate) are \
     where the saved hop shows; on the datapath side, node2's replies reverse-NATed and redirected at \
     XDP instead of tc egress.";
/// What would close the DSR upload target when it is missed.
const UPLOAD_MISSED: &str = ". What would close it: nothing in DSR. An upload's data crosses \
     node1 in both modes (DSR takes only the ACKs off node1 and saves node1's SNAT rewrite), so it \
     stays near 1× by design: the bulk DSR speeds up is the replies' direction, the download above.";
