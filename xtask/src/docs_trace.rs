//! `cargo xtask docs-trace`: writes docs/how-a-packet-reaches-a-pod.md from real `xlb trace`
//! output. It builds the two-node lab (`xlb_tests::twonode`: node1 with a client pod, a
//! backend pod and the agent in a cgroup of its own; node2 across an underlay with a pod; an
//! external client on node1's uplink), programs a few services, and traces one packet per
//! case through the loaded datapath and through every kube-proxy mode's rules. Everything it
//! created is removed when it returns (the lab's guards), on success and on error.

use std::{fmt::Write as _, net::SocketAddr, path::Path, time::Duration};

use anyhow::{Context, Result, bail};
use xlb_tests::{client, services::service_on_nodes, twonode::Lab};

const OUT: &str = "docs/how-a-packet-reaches-a-pod.md";

/// The node flags the rule modes need (the datapath knows them from its maps).
const NODE_FLAGS: [&str; 10] = [
    "--node-name",
    "node1",
    "--node-ip",
    "192.0.2.1",
    "--local-address",
    "192.0.2.1,10.0.0.1,127.0.0.1",
    "--cluster-cidr",
    "10.244.0.0/15",
    "--nodeport-addresses",
    "192.0.2.1/32",
];

/// The lab's services: `web` (NodePort, one endpoint on each node), `np-local` and
/// `np-remote` (NodePorts whose one endpoint is on node1, on node2), `local`
/// (externalTrafficPolicy Local, its endpoint on node2), `sticky` (ClientIP affinity),
/// `empty` (no endpoints), and the client pod.
fn services() -> String {
    let node1 = "10.244.2.2".parse().expect("ip");
    let node2 = "10.245.1.2".parse().expect("ip");
    let svc = |name: &str, ip: &str, np: Option<u16>, spec: &str, eps: &[_]| {
        service_on_nodes(
            name,
            if np.is_some() {
                "NodePort"
            } else {
                "ClusterIP"
            },
            ip,
            "TCP",
            80,
            xlb_tests::scenario::TCP_PORT,
            np,
            spec,
            "",
            eps,
        )
    };
    svc(
        "web",
        "10.96.0.10",
        Some(30080),
        "",
        &[(node1, "node1"), (node2, "node2")],
    ) + &svc(
        "np-local",
        "10.96.0.11",
        Some(30081),
        "",
        &[(node1, "node1")],
    ) + &svc(
        "np-remote",
        "10.96.0.12",
        Some(30082),
        "",
        &[(node2, "node2")],
    ) + &svc(
        "local",
        "10.96.0.13",
        Some(30083),
        "  externalTrafficPolicy: Local\n",
        &[(node2, "node2")],
    ) + &svc(
        "sticky",
        "10.96.0.14",
        None,
        "  sessionAffinity: ClientIP\n",
        &[(node1, "node1"), (node2, "node2")],
    ) + &svc("empty", "10.96.0.15", None, "", &[])
        + "---\napiVersion: v1\nkind: Pod\nmetadata: {namespace: ns, name: client}\nstatus: {podIP: 10.244.1.2}\n"
}

/// One case of the page.
struct Case {
    title: &'static str,
    what: &'static str,
    from: &'static str,
    to: &'static str,
}

const CASES: [Case; 7] = [
    Case {
        title: "ClusterIP from a pod",
        what: "The client pod connects to `web`'s ClusterIP. xlb's tc program on the pod's veth DNATs the first packet to one of the endpoints and records the flow; kube-proxy's modes do the same in netfilter, IPVS, or a proxy process.",
        from: "pod/ns/client",
        to: "svc/ns/web",
    },
    Case {
        title: "ClusterIP from the node",
        what: "A process of the node itself connects to the same ClusterIP. Its packets cross no tc hook before they are routed, so xlb answers at connect(): the cgroup socket hook rewrites the address the socket connects to (the trace computes that decision from the maps: the kernel cannot test-run cgroup programs). kube-proxy's rules see the packet in nat OUTPUT.",
        from: "node",
        to: "svc/ns/web",
    },
    Case {
        title: "NodePort to a local backend",
        what: "A client outside the cluster reaches `np-local` on node1's address and nodePort; its one endpoint is on node1, so the packet is DNATed and its source kept.",
        from: "192.0.2.10",
        to: "192.0.2.1:30081",
    },
    Case {
        title: "NodePort to a remote backend",
        what: "The same for `np-remote`, whose one endpoint is on node2: with externalTrafficPolicy Cluster the flow is SNATed to node1, so the reply comes back through node1 to be translated back.",
        from: "192.0.2.10",
        to: "192.0.2.1:30082",
    },
    Case {
        title: "No endpoints",
        what: "`empty` has no endpoints: the connection is refused at once (kube-proxy's REJECT), not left to time out.",
        from: "pod/ns/client",
        to: "svc/ns/empty",
    },
    Case {
        title: "Session affinity",
        what: "`sticky` has sessionAffinity ClientIP. The client pod made one real connection before this trace, so the datapath finds its affinity entry and sends the new flow to the same backend; the rule modes show the affinity rules that would.",
        from: "pod/ns/client",
        to: "svc/ns/sticky",
    },
    Case {
        title: "externalTrafficPolicy Local",
        what: "`local` has externalTrafficPolicy Local and its only endpoint on node2. An external client reaching node1's nodePort is dropped: node1 has no local endpoint, and a Local policy never sends external traffic to another node (the client keeps its source address).",
        from: "192.0.2.10",
        to: "192.0.2.1:30083",
    },
];

/// `xlb trace` in node1 against the lab's agent; stdout with the pin directory's name made
/// stable.
fn trace(lab: &Lab, xlb: &Path, yaml: &Path, c: &Case, mode: &str) -> Result<String> {
    let out = lab
        .topo
        .node
        .command(xlb)
        .args(["trace", "--from", c.from, "--to", c.to, "--mode", mode])
        .arg("--pin-dir")
        .arg(&lab.agent.pins)
        .arg("--source")
        .arg(format!("file:{}", yaml.display()))
        .args(NODE_FLAGS)
        .output()
        .context("run xlb trace")?;
    if !out.status.success() {
        bail!(
            "xlb trace {} -> {} --mode {mode}: {}",
            c.from,
            c.to,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let pins = lab.agent.pins.display().to_string();
    Ok(String::from_utf8_lossy(&out.stdout).replace(&pins, "/sys/fs/bpf/xlb"))
}

/// The `=> …` line of a trace.
fn outcome(text: &str) -> &str {
    text.lines()
        .find_map(|l| l.trim().strip_prefix("=> "))
        .unwrap_or("?")
}

/// Builds the lab, traces every case in every mode, writes the page.
pub fn run(xlb: &Path) -> Result<()> {
    // SAFETY: single-threaded here; the lab's agent and tools read it.
    unsafe { std::env::set_var("XLB_BIN", xlb) };
    let yaml_text = services();
    let lab = Lab::start("xdt", &yaml_text, 1500, "192.0.2.1:30083/TCP");
    let yaml = std::env::temp_dir().join(format!("{}-docs-trace.yaml", lab.topo.tag));
    std::fs::write(&yaml, &yaml_text).context("write the services file")?;
    let result = write_page(&lab, xlb, &yaml);
    let _ = std::fs::remove_file(&yaml);
    result
}

fn write_page(lab: &Lab, xlb: &Path, yaml: &Path) -> Result<()> {
    // One real connection to `sticky`, so its affinity entry exists.
    let to = SocketAddr::from(([10, 96, 0, 14], 80));
    lab.topo
        .client
        .ns
        .run(move || client::tcp_request(to, Duration::from_secs(3)))
        .map_err(anyhow::Error::msg)?
        .map_err(anyhow::Error::msg)
        .context("the real request to sticky")?;
    let modes = ["datapath", "iptables", "nftables", "ipvs", "userspace"];
    let mut page = String::new();
    page.push_str(HEADER);
    writeln!(page, "```yaml\n{}```\n", services())?;
    let mut summary = String::from("| case | ");
    summary.push_str(&modes.join(" | "));
    summary.push_str(" |\n|---|");
    summary.push_str(&"---|".repeat(modes.len()));
    summary.push('\n');
    let mut body = String::new();
    for c in &CASES {
        writeln!(
            body,
            "## {}\n\n{}\n\n`xlb trace --from {} --to {}`\n",
            c.title, c.what, c.from, c.to
        )?;
        write!(summary, "| {} |", c.title)?;
        for mode in modes {
            let text = trace(lab, xlb, yaml, c, mode)?;
            write!(summary, " {} |", outcome(&text))?;
            writeln!(body, "### {mode}\n\n```text\n{text}```\n")?;
        }
        summary.push('\n');
    }
    writeln!(page, "## At a glance\n\n{summary}")?;
    page.push_str(&body);
    std::fs::write(OUT, page).with_context(|| format!("write {OUT}"))?;
    println!("xtask: wrote {OUT}");
    Ok(())
}

const HEADER: &str = "# How a packet reaches a pod

Generated by `cargo xtask docs-trace` from real `xlb trace` output: do not edit by hand.

The lab is two nodes in network namespaces. node1 runs `xlb agent` (tc on the pod veths and
the node's interfaces, cgroup socket hooks on a cgroup of its own) with the client pod
10.244.1.2 and a backend pod 10.244.2.2; node2 (10.0.0.2, across an underlay) has the
backend pod 10.245.1.2; an external client 192.0.2.10 sits on node1's uplink 192.0.2.1,
where NodePorts are served. Every pod runs an echo server on 8080.

Each case traces one packet (or, from the node, one `connect()`) five ways:

* **datapath**: through the programs xlb has loaded, with `BPF_PROG_TEST_RUN` on a second
  instance of them that shares the agent's service maps and has its own copies of the
  conntrack and affinity maps (the live ones are left byte-identical): the frontend it
  matched, the endpoints the policies left, affinity, the backend chosen, each rewrite, the
  verdict and the counter it bumps;
* **iptables**, **nftables**, **ipvs**, **userspace**: through the rules `xlb emit` writes for
  that kube-proxy mode, rule by rule. A rule that picks at random (`-m statistic`,
  `numgen`) is followed both ways, so these list every backend the mode could choose, where
  the datapath shows the one this run chose.

The services:

";
