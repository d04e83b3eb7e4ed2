//! Bench `northsouth`: a NodePort from an external client to a backend on the other node
//! (SNAT on node1), through xlb with tc only, with generic XDP and with native XDP, beside
//! plain routing to the pod without any translation (the floor). The two-node lab of the
//! north-south tests (`xlb_tests::twonode`), with checksum offload off on every veth so that
//! XDP sees complete checksums and takes the packets itself (with offload on, a veth sender's
//! packets carry partial checksums and XDP leaves them to tc).

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::{Ipv4Addr, SocketAddr},
    time::Duration,
};

use anyhow::{Result, anyhow};
use xlb_lab::load::{Measured, measure};
use xlb_tests::{
    client::tcp_upload,
    scenario::TCP_PORT,
    topology::{NODE1_UNDERLAY, remote_pod_ip},
    twonode::{Lab, WEB_NODE_PORT, web_node_port},
};

use super::{
    Summary,
    report::{self, Section},
    verdict,
};

const TRIALS: usize = 3;
const UPLOAD: usize = 32 << 20;
const NODE_PORT: u16 = WEB_NODE_PORT;

/// The paths measured, in table order.
const PATHS: [(&str, Option<&str>); 4] = [
    ("routed to the pod (no NAT)", None),
    ("xlb, tc", Some("off")),
    ("xlb, XDP generic", Some("generic")),
    ("xlb, XDP native", Some("native")),
];

struct Trial {
    m: Measured,
    upload_mb_s: f64,
    xdp_redirects: u64,
}

fn yaml() -> String {
    web_node_port(&[(remote_pod_ip(1), "node2")])
}

fn one(xdp: Option<&str>) -> Result<Trial> {
    let mode = xdp.unwrap_or("off");
    let lab = Lab::start_with(
        "xlbn",
        &yaml(),
        1500,
        "192.0.2.1:30080/TCP",
        // Thousands of connections a second: a range that holds them while they close.
        &["--xdp", mode, "--snat-port-range", "10000-65535"],
    );
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
    let (m, up) = lab.outside(move || {
        let m = measure(target, Duration::from_millis(1500));
        let t = std::time::Instant::now();
        let up = tcp_upload(target, UPLOAD, Duration::from_secs(30))
            .map(|u| (u.sha256_matches, t.elapsed()));
        (m, up)
    });
    let (ok, took) = up.map_err(|e| anyhow!("upload through {mode}: {e}"))?;
    if !ok {
        return Err(anyhow!("upload through {mode}: the bytes arrived changed"));
    }
    Ok(Trial {
        m,
        upload_mb_s: UPLOAD as f64 / (1 << 20) as f64 / took.as_secs_f64(),
        xdp_redirects: lab.counter("xdp_redirect"),
    })
}

/// Runs the bench; returns its report section.
pub fn run() -> Result<Section> {
    let mut results: BTreeMap<usize, Vec<Trial>> = BTreeMap::new();
    for _ in 0..TRIALS {
        for (i, (name, xdp)) in PATHS.iter().enumerate() {
            let t = one(*xdp)?;
            println!(
                "{name:>28}: {:.0} conn/s, {:.0} req/s, connect p50 {:.0} µs, upload {:.0} MB/s, {} XDP redirects, {} failures",
                t.m.conns_per_s,
                t.m.reqs_per_s,
                t.m.connect_p50_us,
                t.upload_mb_s,
                t.xdp_redirects,
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
         Median [min–max] of {TRIALS} trials, paths interleaved; *upload* = {} MB over one connection, SHA-256 checked.\n\n",
        UPLOAD >> 20
    );
    let headers: Vec<String> = [
        "path",
        "new conn/s",
        "req/s (kept)",
        "connect p50 (µs)",
        "upload MB/s",
        "XDP redirects",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows: Vec<Vec<String>> = PATHS
        .iter()
        .enumerate()
        .map(|(i, (name, _))| {
            vec![
                name.to_string(),
                stat(i, |t| t.m.conns_per_s).show(0),
                stat(i, |t| t.m.reqs_per_s).show(0),
                stat(i, |t| t.m.connect_p50_us).show(0),
                stat(i, |t| t.upload_mb_s).show(0),
                stat(i, |t| t.xdp_redirects as f64).show(0),
            ]
        })
        .collect();
    body.push_str(&report::table(&headers, &rows));
    let conns = |i: usize| stat(i, |t| t.m.conns_per_s).median;
    let upload = |i: usize| stat(i, |t| t.upload_mb_s).median;
    let _ = write!(
        body,
        "\n**Ratios** (medians of this run, ÷ routed): new conn/s tc {:.2}×, XDP generic {:.2}×, XDP native {:.2}×; \
         upload tc {:.2}×, XDP generic {:.2}×, XDP native {:.2}×.\n\n\
         **Targets**\n\n* XDP forwards the flows itself (redirect counter > 0 in every XDP trial): **{}**.\n\
         * native XDP upload at least as fast as tc: **{}** ({:.0} vs {:.0} MB/s).\n",
        conns(1) / conns(0),
        conns(2) / conns(0),
        conns(3) / conns(0),
        upload(1) / upload(0),
        upload(2) / upload(0),
        upload(3) / upload(0),
        verdict(
            results[&2]
                .iter()
                .chain(&results[&3])
                .all(|t| t.xdp_redirects > 0)
        ),
        verdict(upload(3) >= upload(1)),
        upload(3),
        upload(1),
    );
    let bars: Vec<(String, f64)> = PATHS
        .iter()
        .enumerate()
        .map(|(i, (name, _))| (name.to_string(), upload(i)))
        .collect();
    report::bar_plot(
        "bench-northsouth.svg",
        "NodePort to a remote backend: upload MB/s",
        "MB/s",
        &bars,
    )?;
    body.push_str(
        "\nReading: on veth, XDP does not pay here. A frame redirected into a veth is received by \
         the peer's NAPI poll (GRO on, which native redirects need) and turned into an skb there anyway, and XDP looks the \
         route up for every packet to redirect it, where tc caches the route MTU in the flow's entry and lets the kernel \
         route. What XDP saves, the skb before the decision, shows on physical NICs at line rate, which this VM does not \
         have; `--xdp` stays off by default.\n\n![northsouth](bench-northsouth.svg)\n",
    );
    Ok(Section {
        title: "northsouth: NodePort through tc and XDP".into(),
        body,
    })
}
