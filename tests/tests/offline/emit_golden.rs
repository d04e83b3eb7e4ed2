//! Golden output of the emitters that have no upstream conformance cases (userspace mode),
//! and the IPv6 proxier's loadBalancerSourceRanges rules in every mode.
//! `XLB_BLESS=1` rewrites the golden files.

use std::path::Path;

use lb_userspace::{
    emit::{self, Mode},
    model::NodeSettings,
    source::file,
};

fn golden(mode: Mode, input: &str, expected: &str) {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let loaded = file::load(&fixtures.join(input)).unwrap_or_else(|e| panic!("{e}"));
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    let node = NodeSettings {
        node_name: "node-1".into(),
        node_ips: vec!["10.0.0.5".parse().expect("ip")],
        ..NodeSettings::default()
    };
    let got = emit::render(mode, &loaded.model, &node, &emit::WriterOptions::default());
    let path = fixtures.join(expected);
    if std::env::var_os("XLB_BLESS").is_some() {
        std::fs::write(&path, &got).expect("bless");
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with XLB_BLESS=1 to create it)",
            path.display()
        )
    });
    assert_eq!(got, want, "golden mismatch for {}", path.display());
}

#[test]
fn golden_userspace() {
    golden(Mode::Userspace, "userspace.yaml", "userspace.emit.txt");
}

/// kube-proxy's IPv6 proxier writes a dual-stack LoadBalancer's IPv6 loadBalancerSourceRanges
/// (and only those) into its firewall: ip6tables KUBE-FW- jumps to KUBE-EXT- from each range
/// (and from the LoadBalancer IP when the node's IPv6 address is in a range) with the drop in
/// KUBE-PROXY-FIREWALL, the `ip6` nft table's firewall chain, the `KUBE-6-` ipsets.
#[test]
fn ipv6_source_ranges_are_emitted_by_the_ipv6_proxier() {
    let yaml = "apiVersion: v1\nkind: Service\nmetadata: {namespace: ns1, name: svc1}\nspec:\n  type: LoadBalancer\n  ipFamilies: [IPv4, IPv6]\n  clusterIP: 172.30.0.41\n  clusterIPs: [172.30.0.41, \"fd00:172:30::41\"]\n  loadBalancerSourceRanges: [\"2001:db8:1::/48\", \"10.0.0.0/8\"]\n  ports: [{name: p80, port: 80, protocol: TCP, nodePort: 3001}]\nstatus:\n  loadBalancer:\n    ingress: [{ip: 1.2.3.4}, {ip: \"2001:db8:99::4\"}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {namespace: ns1, name: svc1-6, labels: {kubernetes.io/service-name: svc1}}\naddressType: IPv6\nendpoints: [{addresses: [\"fd00:180::1\"]}]\nports: [{name: p80, port: 80, protocol: TCP}]\n";
    let loaded = file::parse("ranges6.yaml", yaml).unwrap_or_else(|e| panic!("{e}"));
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    let node = NodeSettings {
        node_name: "node-1".into(),
        family: lb_userspace::model::IpFamily::V6,
        node_ips: vec!["2001:db8:1::2".parse().expect("ip")],
        ..NodeSettings::default()
    };
    let out = |mode| emit::render(mode, &loaded.model, &node, &emit::WriterOptions::default());
    let has = |text: &str, line: &str| {
        assert!(
            text.lines().any(|l| l.contains(line)),
            "missing {line:?} in:\n{text}"
        );
    };
    let ipt = out(Mode::Iptables);
    for line in [
        "\"ns1/svc1:p80 loadbalancer IP\" -s 2001:db8:1::/48 -j KUBE-EXT-",
        "\"ns1/svc1:p80 loadbalancer IP\" -s 2001:db8:99::4 -j KUBE-EXT-",
        "-d 2001:db8:99::4 --dport 80 -j KUBE-FW-",
        "traffic not accepted by KUBE-FW-",
    ] {
        has(&ipt, line);
    }
    let nft = out(Mode::Nftables);
    has(
        &nft,
        "ip6 saddr != { 2001:db8:1::/48, 2001:db8:99::4 } drop",
    );
    has(&nft, "2001:db8:99::4 . tcp . 80 : goto firewall-");
    let ipvs = out(Mode::Ipvs);
    has(
        &ipvs,
        "add KUBE-6-LOAD-BALANCER-SOURCE-CIDR 2001:db8:99::4,tcp:80,2001:db8:1::/48",
    );
    has(
        &ipvs,
        "add KUBE-6-LOAD-BALANCER-SOURCE-IP 2001:db8:99::4,tcp:80,2001:db8:99::4",
    );
    for text in [&ipt, &nft, &ipvs] {
        assert!(
            !text.contains("10.0.0.0/8"),
            "an IPv4 range in IPv6 rules:\n{text}"
        );
    }
}
