//! The control: the firewall tests' own checks hold under kube-proxy. The same dual-stack
//! lab with the agent removed (its tc programs detached) and kube-proxy's iptables rules
//! for the same Services installed instead (`xlb emit`'s, as `xlb compare` applies them):
//! with each INVALID-dropping firewall, every path of both families is served, every
//! request's replies are counted as ESTABLISHED and nothing as INVALID. What the checks ask
//! of xlb is what netfilter sees under kube-proxy, and they can pass in this lab.

use lb_userspace::{
    emit::{self, Mode},
    model::{IpFamily, LocalDetector, NodeSettings},
    source::file,
};
use xlb_lab::compare::install_rules;
use xlb_tests::{
    netfilter::Firewall,
    twonode::{Lab, NODE6},
};

use crate::{NODE4, V4, V6, firewalls, lab, paths, services, wait_served};

/// Stops the agent, detaches and unpins its datapath, and installs kube-proxy's iptables
/// rules for the lab's Services on node1 (both families; pod traffic told by its `xv-`
/// interfaces; NodePorts on the uplink's addresses).
pub fn kube_proxy_instead(lab: &mut Lab) {
    lab.agent.stop();
    lb_userspace::cleanup::cleanup(&lab.agent.pins).expect("xlb cleanup");
    let model = file::parse("services.yaml", &services())
        .expect("the lab's Services")
        .model;
    let settings = NodeSettings {
        node_name: "node1".into(),
        node_ips: vec![NODE4.into(), NODE6.into()],
        local_addresses: vec![NODE4.into(), NODE6.into()],
        node_port_addresses: vec![
            "192.0.2.1/32".parse().expect("cidr"),
            format!("{NODE6}/128").parse().expect("cidr"),
        ],
        detector: LocalDetector::InterfaceNamePrefix("xv-".into()),
        ..NodeSettings::default()
    };
    let families = [IpFamily::V4, IpFamily::V6];
    let options = emit::WriterOptions::default();
    install_rules(
        &lab.topo.node,
        Mode::Iptables,
        &model,
        &settings,
        &options,
        &families,
    )
    .expect("kube-proxy's iptables rules");
}

fn control(prefix: &str, firewall: Firewall) {
    let Some(mut lab) = lab(prefix, &[]) else {
        return;
    };
    kube_proxy_instead(&mut lab);
    for family in [&V4, &V6] {
        wait_served(&lab, &paths(family));
    }
    firewalls::install(&lab, firewall);
    for (name, family) in [("IPv4", &V4), ("IPv6", &V6)] {
        let (bad, report) = firewalls::check_paths(&lab, firewall, family);
        assert_eq!(
            bad,
            0,
            "under kube-proxy's own rules, {firewall:?}, {name}: the checks fail:\n{report}\n\
             --- rules:\n{}",
            firewall.listing(&lab.topo.node)
        );
    }
}

#[test]
fn control_the_checks_hold_under_kube_proxy_with_kube_forward() {
    control("nfck", Firewall::KubeForward);
}

#[test]
fn control_the_checks_hold_under_kube_proxy_with_an_nft_firewall() {
    control("nfcn", Firewall::NftInet);
}

#[test]
fn control_the_checks_hold_under_kube_proxy_with_calico_like_chains() {
    control("nfcc", Firewall::CalicoLike);
}
