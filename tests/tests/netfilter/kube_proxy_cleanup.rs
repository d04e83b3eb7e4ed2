//! `xlb cleanup --kube-proxy` on a node whose netfilter tables hold more than kube-proxy's:
//! kubelet's `KUBE-FIREWALL`, a CNI's NAT chain, a Calico-like per-interface filter and a
//! host firewall's nftables table beside kube-proxy's rules of both modes (iptables and
//! nftables, both families, as `xlb emit` writes them and the real tools apply them).
//! Afterwards exactly kube-proxy's are gone (but the inert `KUBE-MARK-MASQ`, which
//! kube-proxy's own cleanup leaves too) and everything else is as it was; a second run
//! finds nothing and says so.

use std::net::{Ipv4Addr, Ipv6Addr};

use lb_userspace::{
    emit::{Mode, WriterOptions},
    model::{IpFamily, NodeSettings},
    source::file,
};
use xlb_lab::{compare::install_rules, netns::run};
use xlb_tests::{
    netfilter::Firewall,
    netns::Netns,
    require_root,
    services::{Port, dual_stack_service_on_nodes, dual_stack_service_yaml},
    unique_tag, xlb_bin,
};

/// kubelet's chains (it keeps them; kube-proxy's cleanup must too) and a CNI's NAT chain.
const KUBELET_AND_CNI: &str = "*filter
:KUBE-FIREWALL - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
-A INPUT -j KUBE-FIREWALL
-A OUTPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL -m comment --comment \"kubernetes firewall for dropping marked packets\" -m mark --mark 0x8000/0x8000 -j DROP
COMMIT
*nat
:CNI-HOSTPORT-DNAT - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
COMMIT
";

/// What netfilter holds in `node`: both families' iptables tables, without counters and
/// the tools' comment lines, and the nftables tables (their names, and the host firewall's
/// rules). Left out: `KUBE-MARK-MASQ`'s lines (kube-proxy's cleanup leaves that chain) and
/// the rules of kubelet's `KUBE-FIREWALL` (kube-proxy ensures them too, and leaves them).
fn ruleset(node: &Netns) -> String {
    let mut text = String::new();
    for tool in ["iptables-save", "ip6tables-save"] {
        let out = run(&mut node.command(tool)).expect(tool);
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if line.starts_with('#')
                || line.contains("KUBE-MARK-MASQ")
                || line.contains("-j KUBE-FIREWALL")
                || line.starts_with("-A KUBE-FIREWALL ")
            {
                continue;
            }
            // Chain declarations carry packet counts.
            let line = match line.split_once(" [") {
                Some((decl, _)) if line.starts_with(':') => decl,
                _ => line,
            };
            text.push_str(line);
            text.push('\n');
        }
    }
    for args in [
        &["list", "tables"][..],
        &["list", "table", "inet", "filter"],
    ] {
        let out = run(node.command("nft").args(args)).expect("nft");
        text.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    text
}

fn cleanup(node: &Netns) -> String {
    let out = run(node.command(xlb_bin()).args(["cleanup", "--kube-proxy"]))
        .expect("xlb cleanup --kube-proxy");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn cleanup_removes_exactly_kube_proxys_rules_of_every_mode_and_family() {
    if !require_root() {
        return;
    }
    let node = Netns::new(&unique_tag("kpc")).expect("netns");
    node.ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p",
    ])
    .expect("eth0");
    node.feed("iptables-restore", &["--noflush"], KUBELET_AND_CNI)
        .expect("kubelet and CNI rules");
    node.feed("ip6tables-restore", &["--noflush"], KUBELET_AND_CNI)
        .expect("kubelet and CNI rules (IPv6)");
    Firewall::CalicoLike
        .install(&node, &["eth0"])
        .expect("calico-like");
    Firewall::NftInet
        .install(&node, &[])
        .expect("host firewall");
    let before = ruleset(&node);

    let yaml = dual_stack_service_yaml(
        "web",
        (
            Ipv4Addr::new(10, 96, 0, 10),
            "fd00:10:96::10".parse().expect("ip"),
        ),
        (80, "TCP", 8080),
        &[Ipv4Addr::new(10, 244, 0, 2)],
        &["fd00:10:244::2".parse::<Ipv6Addr>().expect("ip")],
    ) + &dual_stack_service_on_nodes(
        "lb",
        "LoadBalancer",
        (
            Ipv4Addr::new(10, 96, 0, 20),
            "fd00:10:96::20".parse().expect("ip"),
        ),
        &[Port {
            name: "p",
            port: 80,
            protocol: "TCP",
            target: 8080,
            node_port: 30080,
        }],
        "  externalTrafficPolicy: Local\n  sessionAffinity: ClientIP\n",
        (
            &[(Ipv4Addr::new(10, 244, 0, 3), "node1")],
            &["fd00:10:244::3"
                .parse::<Ipv6Addr>()
                .map(|ip| (ip, "node2"))
                .expect("ip")],
        ),
    );
    let model = file::parse("kp.yaml", &yaml).expect("yaml").model;
    let settings = NodeSettings {
        node_name: "node1".into(),
        ..NodeSettings::default()
    };
    let families = [IpFamily::V4, IpFamily::V6];
    for mode in [Mode::Iptables, Mode::Nftables] {
        install_rules(
            &node,
            mode,
            &model,
            &settings,
            &WriterOptions::default(),
            &families,
        )
        .unwrap_or_else(|e| panic!("{mode:?} rules: {e}"));
    }
    let installed = ruleset(&node);
    assert!(
        installed.contains("KUBE-SVC-") && installed.contains("table ip6 kube-proxy"),
        "kube-proxy's rules of both modes are installed:\n{installed}"
    );

    let said = cleanup(&node);
    assert!(said.contains("kube-proxy's rules are gone"), "{said}");
    assert!(said.contains("nftables table ip6 kube-proxy"), "{said}");
    let after = ruleset(&node);
    assert_eq!(
        after, before,
        "only kube-proxy's rules are removed; xlb said:\n{said}"
    );

    assert!(
        after.contains(":KUBE-FIREWALL -") && after.contains(":KUBE-KUBELET-CANARY -"),
        "kubelet's chains stay"
    );
    let again = cleanup(&node);
    assert!(
        again.contains("no kube-proxy rules on this node"),
        "{again}"
    );
}
