//! kube-proxy conformance: the cases in `shared/conformance/kube-proxy/cases` (beside the
//! workspace), one test per case. Each case's `TestConfig` header gives the node settings;
//! the emitters' output is normalised as the cases' README says and compared with the
//! expected file, or traced packet by packet for `packet-flow` cases.
//!
//! Multi-step cases run a stateful proxier against an in-memory `iptables-restore`
//! ([`lb_userspace::emit::restore::Tables`]), so partial syncs, stale-chain deletion and
//! the failed restore of iptables-03 step 9 happen as they would on a node. Where a case's
//! objects carry no `present-in-steps` annotation, the step schedule its header describes
//! is transcribed in [`xlb_tests::suites::conformance::schedule`] (input only; expectations always come from the files).

mod iptables;
mod ipvs;
mod nftables;

use std::collections::BTreeSet;

use iptables::iptables_case;
use ipvs::ipvs_case;
use nftables::nftables_case;
use xlb_tests::suites::conformance::{case, cases_dir};

fn run_case(name: &str) {
    let mode = case(name).config.mode;
    match mode.as_str() {
        "iptables" => iptables_case(name),
        "nftables" => nftables_case(name),
        "ipvs" => ipvs_case(name),
        other => panic!("{name}: mode {other} not implemented yet"),
    }
}

macro_rules! cases {
    ($($f:ident => $name:literal,)*) => {
        $(#[test] fn $f() { run_case($name) })*

        #[test]
        fn every_case_file_has_a_test() {
            let ours: BTreeSet<&str> = [$($name),*].into_iter().collect();
            let mut missing = Vec::new();
            for e in std::fs::read_dir(cases_dir()).expect("read cases") {
                let n = e.expect("entry").file_name().to_string_lossy().into_owned();
                if let Some(case) = n.strip_suffix(".input.yaml") && !ours.contains(case) {
                    missing.push(case.to_string());
                }
            }
            assert!(missing.is_empty(), "cases without a test: {missing:?}");
        }
    };
}

cases! {
    iptables_01_overall => "iptables-01-overall",
    iptables_02_bad_ips => "iptables-02-bad-ips",
    iptables_03_sync_repeated => "iptables-03-sync-repeated",
    iptables_04_nodeports_kube_firewall_1 => "iptables-04-nodeports-kube-firewall-1",
    iptables_05_nodeports_kube_firewall_2 => "iptables-05-nodeports-kube-firewall-2",
    iptables_06_nodeports_kube_firewall_3 => "iptables-06-nodeports-kube-firewall-3",
    iptables_07_nodeports_kube_firewall_4 => "iptables-07-nodeports-kube-firewall-4",
    iptables_08_nodeports_kube_firewall_5 => "iptables-08-nodeports-kube-firewall-5",
    iptables_09_nodeports_kube_firewall_6 => "iptables-09-nodeports-kube-firewall-6",
    iptables_10_nodeports_kube_firewall_7 => "iptables-10-nodeports-kube-firewall-7",
    iptables_11_drop_invalid_1 => "iptables-11-drop-invalid-1",
    iptables_12_drop_invalid_2 => "iptables-12-drop-invalid-2",
    iptables_13_drop_invalid_3 => "iptables-13-drop-invalid-3",
    iptables_14_masquerade_rule_randomfully_false => "iptables-14-masquerade-rule-randomfully-false",
    iptables_15_masquerade_rule_randomfully_true => "iptables-15-masquerade-rule-randomfully-true",
    iptables_16_large_cluster_mode => "iptables-16-large-cluster-mode",
    iptables_17_flows_internal_external_masquerade_base => "iptables-17-flows-internal-external-masquerade-base",
    iptables_18_flows_internal_external_masquerade_no_local_detector => "iptables-18-flows-internal-external-masquerade-no-local-detector",
    iptables_19_flows_internal_external_masquerade_masquerade_all => "iptables-19-flows-internal-external-masquerade-masquerade-all",
    iptables_20_flows_internal_external_masquerade_masquerade_all_no_local_detector => "iptables-20-flows-internal-external-masquerade-masquerade-all-no-local-detector",
    iptables_21_flows_terminating_etp_local_1 => "iptables-21-flows-terminating-etp-local-1",
    iptables_22_flows_terminating_etp_local_2 => "iptables-22-flows-terminating-etp-local-2",
    iptables_23_flows_terminating_etp_local_3 => "iptables-23-flows-terminating-etp-local-3",
    iptables_24_flows_terminating_etp_local_4 => "iptables-24-flows-terminating-etp-local-4",
    iptables_25_flows_terminating_etp_cluster_1 => "iptables-25-flows-terminating-etp-cluster-1",
    iptables_26_flows_terminating_etp_cluster_2 => "iptables-26-flows-terminating-etp-cluster-2",
    iptables_27_flows_terminating_etp_cluster_3 => "iptables-27-flows-terminating-etp-cluster-3",
    iptables_28_flows_terminating_etp_cluster_4 => "iptables-28-flows-terminating-etp-cluster-4",
    iptables_29_flows_loadbalancer_source_ranges => "iptables-29-flows-loadbalancer-source-ranges",
    iptables_30_flows_no_endpoints_reject => "iptables-30-flows-no-endpoints-reject",
    ipvs_01_nodeport_ipv4_two_slices => "ipvs-01-nodeport-ipv4-two-slices",
    ipvs_02_nodeport_ipv4_udp => "ipvs-02-nodeport-ipv4-udp",
    ipvs_03_nodeport_ipv4_no_endpoints => "ipvs-03-nodeport-ipv4-no-endpoints",
    ipvs_04_nodeport_ipv4_sctp_multi_nodeip => "ipvs-04-nodeport-ipv4-sctp-multi-nodeip",
    ipvs_05_nodeport_ipv4_sctp_etp_local => "ipvs-05-nodeport-ipv4-sctp-etp-local",
    ipvs_06_nodeport_ipv6_two_slices => "ipvs-06-nodeport-ipv6-two-slices",
    ipvs_07_nodeport_ipv6_wrong_family_service => "ipvs-07-nodeport-ipv6-wrong-family-service",
    ipvs_08_nodeport_ipv6_no_endpoints => "ipvs-08-nodeport-ipv6-no-endpoints",
    ipvs_09_nodeport_ipv6_sctp_multi_nodeip => "ipvs-09-nodeport-ipv6-sctp-multi-nodeip",
    nftables_01_overall => "nftables-01-overall",
    nftables_02_sync_repeated => "nftables-02-sync-repeated",
    nftables_03_three_clusterip_services => "nftables-03-three-clusterip-services",
    nftables_04_service_without_endpoints => "nftables-04-service-without-endpoints",
    nftables_05_three_services_after_delete => "nftables-05-three-services-after-delete",
    nftables_06_flows_clusterip_general => "nftables-06-flows-clusterip-general",
    nftables_07_flows_no_endpoints_reject => "nftables-07-flows-no-endpoints-reject",
}
