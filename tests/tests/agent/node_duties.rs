//! What kube-proxy does to the node besides its rules, done by the real agent in a network
//! namespace of its own: the kernel conntrack's per-namespace timeouts and `tcp_be_liberal`
//! set from `--config` (a 0 left alone, a value another component raised not lowered), the
//! host's table size computed and reported but left alone (this is not the initial
//! namespace), a read-only `/proc/sys` named while the agent goes on, kube-proxy's
//! `/proxyMode` and `/configz` on the metrics address, and whether the node's routes
//! depend on the source (the node config's routing flags, from its `ip rule`s).

use xlb_tests::{http::ok_body, netns::Netns, require_root};

use super::metrics::{Lab, METRICS, Start, value};

const NF: &str = "/proc/sys/net/netfilter";

/// A sysctl of the kernel's conntrack as `ns` sees it.
fn sysctl(ns: &Netns, name: &str) -> u64 {
    let out = ns
        .command("cat")
        .arg(format!("{NF}/{name}"))
        .output()
        .expect("cat");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {e}: {out:?}"))
}

fn set_sysctl(ns: &Netns, name: &str, value: u64) {
    let status = ns
        .command("sh")
        .args(["-c", &format!("echo {value} > {NF}/{name}")])
        .status()
        .expect("sh");
    assert!(status.success(), "setting {name}");
}

fn host_sysctl(name: &str) -> u64 {
    std::fs::read_to_string(format!("{NF}/{name}"))
        .expect(name)
        .trim()
        .parse()
        .expect(name)
}

const CONFIG: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
conntrack:
  maxPerCore: 65536
  min: 131072
  tcpEstablishedTimeout: 2h0m0s
  tcpCloseWaitTimeout: 0s
  tcpBeLiberal: true
  udpTimeout: 45s
  udpStreamTimeout: 2m30s
";

/// The sample of `xlb_node_sysctl` for `sysctl` with `outcome`.
fn node_sysctl(text: &str, sysctl: &str, outcome: &str) -> f64 {
    value(
        text,
        &format!("xlb_node_sysctl{{sysctl=\"net.netfilter.{sysctl}\",outcome=\"{outcome}\"}}"),
    )
}

#[test]
fn the_kernel_conntrack_is_set_as_kube_proxy_sets_it() {
    if !require_root() {
        return;
    }
    // Before the agent: another component raised the UDP stream timeout above what the
    // file asks, and the close-wait timeout (which the file leaves alone) is not the
    // kernel's default either.
    let before = |ns: &Netns| {
        set_sysctl(ns, "nf_conntrack_udp_timeout_stream", 600);
        set_sysctl(ns, "nf_conntrack_tcp_timeout_close_wait", 77);
    };
    let host_max = host_sysctl("nf_conntrack_max");
    let lab = Lab::start_in(
        "xnd",
        2,
        2,
        Start {
            config: Some(CONFIG),
            before: Some(&before),
            ..Default::default()
        },
    );
    let ns = &lab.ns;
    assert_eq!(sysctl(ns, "nf_conntrack_tcp_timeout_established"), 7_200);
    assert_eq!(
        sysctl(ns, "nf_conntrack_tcp_timeout_close_wait"),
        77,
        "0s leaves it"
    );
    assert_eq!(sysctl(ns, "nf_conntrack_tcp_be_liberal"), 1);
    assert_eq!(sysctl(ns, "nf_conntrack_udp_timeout"), 45);
    assert_eq!(
        sysctl(ns, "nf_conntrack_udp_timeout_stream"),
        600,
        "a value another component raised is not lowered"
    );
    // The table's size is the host's: computed as kube-proxy computes it, not written.
    assert_eq!(host_sysctl("nf_conntrack_max"), host_max);
    let cpus = u64::from(aya::util::nr_cpus().expect("cpus") as u32);
    let computed = (65_536 * cpus).max(131_072);
    let log = lab.agent.log_text();
    let line = log
        .lines()
        .find(|l| {
            l.contains("not the initial network namespace")
                && l.contains("net.netfilter.nf_conntrack_max")
        })
        .unwrap_or_else(|| panic!("no line on nf_conntrack_max in:\n{log}"));
    assert!(line.contains(&format!("computed={computed}")), "{line}");
    assert!(
        log.contains(
            "sysctl=\"net.netfilter.nf_conntrack_tcp_timeout_established\" value=7200 was=432000"
        ),
        "{log}"
    );

    let text = lab.scrape();
    let set = node_sysctl(&text, "nf_conntrack_tcp_timeout_established", "set");
    assert_eq!(set, 7_200.0);
    assert_eq!(
        node_sysctl(&text, "nf_conntrack_tcp_timeout_close_wait", "left"),
        77.0
    );
    assert_eq!(
        node_sysctl(&text, "nf_conntrack_udp_timeout_stream", "higher"),
        600.0
    );
    assert_eq!(
        node_sysctl(&text, "nf_conntrack_max", "not-owned"),
        host_max as f64
    );

    let mode = lab.get(METRICS, "/proxyMode").expect("/proxyMode");
    assert_eq!(ok_body(&mode).expect("200"), "ebpf");
    let configz = lab.get(METRICS, "/configz").expect("/configz");
    assert!(configz.contains("application/json"), "{configz}");
    let v: serde_json::Value = serde_json::from_str(ok_body(&configz).expect("200")).expect("JSON");
    let c = &v["kubeproxy.config.k8s.io"];
    assert_eq!(c["mode"], "ebpf");
    assert_eq!(c["metricsBindAddress"], METRICS.to_string());
    let ct = &c["conntrack"];
    assert_eq!(ct["maxPerCore"], 65_536);
    assert_eq!(ct["tcpEstablishedTimeout"], "2h0m0s");
    assert_eq!(ct["tcpCloseWaitTimeout"], "0s");
    assert_eq!(ct["tcpBeLiberal"], true);
    assert_eq!(ct["udpStreamTimeout"], "2m30s");
}

#[test]
fn a_read_only_proc_sys_is_named_and_the_agent_goes_on() {
    if !require_root() {
        return;
    }
    // A container without the right to write sysctls: /proc/sys mounted read-only in the
    // agent's own mount namespace.
    let wrapper = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        "mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec \"$@\"",
        "sh",
    ];
    let lab = Lab::start_in(
        "xnr",
        2,
        2,
        Start {
            wrapper: &wrapper,
            config: Some(CONFIG),
            ..Default::default()
        },
    );
    // It synced and serves (Lab::start_in waited for both); the settings stay the kernel's.
    assert_eq!(
        sysctl(&lab.ns, "nf_conntrack_tcp_timeout_established"),
        432_000
    );
    let log = lab.agent.log_text();
    assert!(
        log.lines().any(|l| l
            .contains("cannot write /proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established")
            && l.contains("read-only")),
        "{log}"
    );
    let text = lab.scrape();
    assert_eq!(
        node_sysctl(&text, "nf_conntrack_tcp_timeout_established", "failed"),
        432_000.0
    );
}

#[test]
fn a_node_with_ipv6_turned_off_programs_the_ipv4_side_and_reports_the_ipv6_one() {
    if !require_root() {
        return;
    }
    let off = |ns: &Netns| {
        let status = ns
            .command("sh")
            .args(["-c", "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"])
            .status()
            .expect("sh");
        assert!(status.success(), "turning IPv6 off");
    };
    let lab = Lab::start_in(
        "xn6",
        1,
        2,
        Start {
            before: Some(&off),
            ..Default::default()
        },
    );
    let log = lab.agent.log_text();
    assert!(
        log.contains("the node has IPv6 turned off")
            && log.contains("net.ipv6.conf.all.disable_ipv6 = 1"),
        "{log}"
    );
    let dual = xlb_tests::services::dual_stack_service_yaml(
        "dual",
        (
            std::net::Ipv4Addr::new(10, 96, 7, 1),
            "fd00::7:1".parse().expect("ip"),
        ),
        (80, "TCP", 8080),
        &[std::net::Ipv4Addr::new(10, 128, 7, 1)],
        &["fd00:128::7:1".parse().expect("ip")],
    );
    let yaml = lab.workdir.join("services.yaml");
    let before = std::fs::read_to_string(&yaml).expect("services");
    xlb_tests::services::write_atomic(&yaml, &(before + &dual)).expect("yaml");
    lab.agent
        .wait_log("frontend failing", 1, std::time::Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}\n{}", lab.agent.log_text()));
    let rows = lb_userspace::list::services(&xlb_tests::pins(&lab.agent.pins)).expect("rows");
    let dual_rows: Vec<_> = rows.iter().filter(|r| r.service == "test/dual:p").collect();
    assert!(
        dual_rows
            .iter()
            .any(|r| r.frontend == "10.96.7.1:80/TCP" && r.status == "programmed"),
        "the IPv4 ClusterIP is programmed: {dual_rows:#?}"
    );
    assert!(
        dual_rows.iter().any(|r| r.frontend == "-"
            && r.status.starts_with("FamilyMissing since ")
            && r.status.contains("IPv6 turned off")),
        "the IPv6 side is reported: {dual_rows:#?}"
    );
    assert!(
        !rows.iter().any(|r| r.frontend.contains("fd00::7:1")),
        "nothing IPv6 is programmed: {rows:#?}"
    );
    let text = lab.scrape();
    assert_eq!(
        value(&text, "xlb_frontends_failing{reason=\"FamilyMissing\"}"),
        1.0,
        "{text}"
    );
}

/// The node config's routing flags as the agent's pinned config map holds them now.
fn routing_flags(pins: &std::path::Path) -> u32 {
    let map = aya::maps::MapData::from_pin(pins.join(lb_common::MAP_CONFIG)).expect("config pin");
    let cfg: aya::maps::Array<_, lb_common::NodeConfig> =
        aya::maps::Array::try_from(aya::maps::Map::Array(map)).expect("config array");
    let flags = cfg.get(&0, 0).expect("config").flags;
    flags & (lb_common::CFG_F_ROUTES_BY_DST | lb_common::CFG_F_ROUTES6_BY_DST)
}

/// Waits (up to 10 s, to fail) for the routing flags to become `want`.
fn wait_routing_flags(pins: &std::path::Path, want: u32, what: &str) {
    let start = std::time::Instant::now();
    while routing_flags(pins) != want {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "{what}: flags {:#x}, want {want:#x}",
            routing_flags(pins)
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// XDP may keep the way out per backend only while no rule routes by source: the agent
/// says so in the node config (`datapath::routing`) from its namespace's rules at start, and
/// again on the rtnetlink event of a rule by source coming or going, per family.
#[test]
fn the_agent_tells_xdp_whether_routes_depend_on_the_source() {
    if !require_root() {
        return;
    }
    let lab = Lab::start_in("xrt", 1, 1, Start::default());
    let pins = lab.agent.pins.clone();
    let both = lb_common::CFG_F_ROUTES_BY_DST | lb_common::CFG_F_ROUTES6_BY_DST;
    wait_routing_flags(&pins, both, "no rule by source at start");
    let rule4 = ["-4", "rule", "add", "from", "192.0.2.7/32", "lookup", "100"];
    lab.ns.ip(&rule4).expect("ip rule");
    wait_routing_flags(
        &pins,
        lb_common::CFG_F_ROUTES6_BY_DST,
        "an IPv4 rule by source",
    );
    let rule6 = [
        "-6",
        "rule",
        "add",
        "from",
        "2001:db8::7/128",
        "lookup",
        "100",
    ];
    lab.ns.ip(&rule6).expect("ip -6 rule");
    wait_routing_flags(&pins, 0, "rules by source in both families");
    lab.ns
        .ip(&["-4", "rule", "del", "from", "192.0.2.7/32", "lookup", "100"])
        .expect("ip rule del");
    lab.ns
        .ip(&[
            "-6",
            "rule",
            "del",
            "from",
            "2001:db8::7/128",
            "lookup",
            "100",
        ])
        .expect("ip -6 rule del");
    wait_routing_flags(&pins, both, "the rules by source gone");
    // A rule without a source selector (by input interface) changes nothing.
    lab.ns
        .ip(&["-4", "rule", "add", "iif", "lo", "lookup", "100"])
        .expect("ip rule iif");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(routing_flags(&pins), both, "a rule by input interface");
    let log = lab.agent.log_text();
    assert!(
        log.contains("routing by destination alone"),
        "the change is logged:\n{log}"
    );
}
