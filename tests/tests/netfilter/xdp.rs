//! XDP (`--xdp native` and `generic`) under the same firewalls: a flow XDP redirects past
//! the stack must stay out of it in both directions, and one it hands to the stack must be
//! seen whole, or the kernel's conntrack calls half of it INVALID. With all three
//! INVALID-dropping firewalls on node1 at once, an external client's requests to a NodePort
//! with a local backend (XDP translates, the stack delivers) and with a remote, SNATed one
//! (XDP redirects both ways) are served over TCP and UDP in both families, nothing is
//! dropped as INVALID, and XDP redirected some of them itself.

use xlb_tests::netfilter::{Counters, FIREWALLS};

use crate::{From, V4, V6, ask, firewalls, lab, log_tail, paths, wait_served};

/// The three firewalls' counters, summed.
fn counters(lab: &xlb_tests::twonode::Lab) -> Counters {
    FIREWALLS
        .iter()
        .map(|f| f.counters(&lab.topo.node).expect("counters"))
        .fold(Counters::default(), |a, c| Counters {
            established: a.established + c.established,
            invalid: a.invalid + c.invalid,
        })
}

fn xdp_under_firewalls(prefix: &str, mode: &str) {
    let Some(lab) = lab(prefix, &["--xdp", mode]) else {
        return;
    };
    lab.enable_napi_for_redirects();
    // Complete checksums on the way in, so XDP takes the packets itself.
    lab.set_offload(false);
    let external: Vec<_> = [&V4, &V6]
        .into_iter()
        .flat_map(paths)
        .filter(|p| p.from == From::External)
        .collect();
    wait_served(&lab, &external);
    for firewall in FIREWALLS {
        firewalls::install(&lab, firewall);
    }
    let redirected = lab.counter("xdp_redirect");
    let mut report = Vec::new();
    let mut bad = 0;
    for path in &external {
        for protocol in ["TCP", "UDP"] {
            let before = counters(&lab);
            let served = ask(&lab, path, protocol, 5);
            let seen = counters(&lab).since(before);
            let ok = served.is_ok() && seen.invalid == 0;
            bad += usize::from(!ok);
            report.push(format!(
                "{} {} {} over {protocol}: {}; INVALID dropped +{}",
                if ok { "ok " } else { "BAD" },
                path.what,
                path.tcp.ip(),
                served.map_or_else(|e| format!("FAILED ({e})"), |()| "served".into()),
                seen.invalid,
            ));
        }
    }
    let listing: Vec<String> = FIREWALLS
        .iter()
        .map(|f| f.listing(&lab.topo.node))
        .collect();
    assert_eq!(
        bad,
        0,
        "XDP {mode} under the INVALID-dropping firewalls:\n{}\n--- rules:\n{}\n{}",
        report.join("\n"),
        listing.join("\n"),
        log_tail(&lab.agent.log_text())
    );
    assert!(
        lab.counter("xdp_redirect") > redirected,
        "XDP {mode} redirected nothing itself: the test did not exercise it\n{}",
        log_tail(&lab.agent.log_text())
    );
}

#[test]
fn xdp_native_flows_are_served_under_the_firewalls() {
    xdp_under_firewalls("nfxn", "native");
}

#[test]
fn xdp_generic_flows_are_served_under_the_firewalls() {
    xdp_under_firewalls("nfxg", "generic");
}
