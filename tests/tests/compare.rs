//! `xlb compare` on inputs that can run here: xlb's datapath and kube-proxy's iptables and
//! nftables rules (as xlb emits them) reach the same backends and refuse the same flows;
//! the userspace mode agrees wherever a service has endpoints (for a service without any,
//! kube-proxy's userspace proxy accepted and reset the connection instead of refusing it).

use std::path::{Path, PathBuf};

use lb_userspace::compare::{CompareOptions, Impl, Outcome, compare};
use xlb_tests::{require_root, unique_tag, xlb_bin};

fn check(source: PathBuf) {
    let opts = CompareOptions {
        source: source.clone(),
        node_name: "node1".into(),
        // Backend sets are compared: with 40 requests per flow the chance that random
        // selection misses one of 3 backends is 3 × (2/3)^40 ≈ 3e-7.
        requests: 40,
        modes: Impl::ALL.to_vec(),
        xlb: xlb_bin(),
        tag: unique_tag("xq"),
    };
    let report = compare(&opts).unwrap_or_else(|e| panic!("{}: {e}", source.display()));
    assert!(!report.flows.is_empty(), "{}: no flows", source.display());
    for (flow, by) in &report.flows {
        let ebpf = &by[&Impl::Ebpf];
        for m in [Impl::Iptables, Impl::Nftables] {
            assert_eq!(
                &by[&m],
                ebpf,
                "{}: {flow:?}: {} and xlb-ebpf differ\n{}",
                source.display(),
                m.name(),
                report.render()
            );
        }
        if matches!(ebpf, Outcome::Backends(_)) {
            assert_eq!(
                &by[&Impl::Userspace],
                ebpf,
                "{flow:?}: userspace differs\n{}",
                report.render()
            );
        }
    }
}

fn case(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
        "../../shared/conformance/kube-proxy/cases/{name}.input.yaml"
    ))
}

#[test]
fn modes_agree_on_the_demo_services() {
    if !require_root("modes_agree_on_the_demo_services") {
        return;
    }
    check(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/demo-services.yaml"));
}

#[test]
fn modes_agree_on_kube_proxys_overall_case() {
    if !require_root("modes_agree_on_kube_proxys_overall_case") {
        return;
    }
    check(case("iptables-01-overall"));
}

#[test]
fn modes_agree_on_refusing_a_service_without_endpoints() {
    if !require_root("modes_agree_on_refusing_a_service_without_endpoints") {
        return;
    }
    check(case("iptables-30-flows-no-endpoints-reject"));
}
