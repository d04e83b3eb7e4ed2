//! Helpers shared by the `conformance` test files.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use lb_userspace::{
    emit::trace,
    model::{Model, Protocol, ServiceRef},
    source::{file, testconfig::TestConfig},
};

pub fn cases_dir() -> PathBuf {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/conformance/kube-proxy/cases");
    assert!(
        dir.is_dir(),
        "conformance cases not found at {} (expected shared/conformance/kube-proxy/cases beside the workspace)",
        dir.display()
    );
    dir
}

pub struct Case {
    pub name: String,
    pub text: String,
    pub expected: String,
    pub config: TestConfig,
}

pub fn case(name: &str) -> Case {
    let dir = cases_dir();
    let input = dir.join(format!("{name}.input.yaml"));
    let text =
        std::fs::read_to_string(&input).unwrap_or_else(|e| panic!("{}: {e}", input.display()));
    let exp_path = dir.join(format!("{name}.expected.txt"));
    let expected = std::fs::read_to_string(&exp_path)
        .unwrap_or_else(|e| panic!("{}: {e}", exp_path.display()));
    let loaded = file::parse(name, &text).unwrap_or_else(|e| panic!("{name}: {e}"));
    let config = loaded
        .test_config
        .unwrap_or_else(|| panic!("{name}: no TestConfig document"));
    Case {
        name: name.to_string(),
        text,
        expected,
        config,
    }
}

/// The model of `step` (objects annotated with present-in-steps are filtered).
pub fn model_at(c: &Case, step: Option<u32>) -> Model {
    let loaded =
        file::parse_step(&c.name, &c.text, step).unwrap_or_else(|e| panic!("{}: {e}", c.name));
    for e in &loaded.errors {
        eprintln!(
            "{}: input error (left out, as kube-proxy would ignore it): {e}",
            c.name
        );
    }
    loaded.model
}

/// Expected-file sections: `(step number, body)`; a file without `### step` headers is one
/// section with no number.
pub fn sections(expected: &str) -> Vec<(Option<u32>, String)> {
    let mut out: Vec<(Option<u32>, String)> = Vec::new();
    let mut cur: Option<(Option<u32>, String)> = None;
    for line in expected.lines() {
        if let Some(rest) = line.strip_prefix("### step ") {
            if let Some(c) = cur.take() {
                out.push(c);
            }
            let n = rest
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|d| d.parse().ok());
            cur = Some((n, String::new()));
            continue;
        }
        let c = cur.get_or_insert((None, String::new()));
        c.1.push_str(line);
        c.1.push('\n');
    }
    out.extend(cur);
    out
}

pub fn assert_text(case: &str, what: &str, got: &str, want: &str) {
    if got != want {
        let mut diff = String::new();
        let g: Vec<&str> = got.lines().collect();
        let w: Vec<&str> = want.lines().collect();
        for l in &w {
            if !g.contains(l) {
                diff.push_str(&format!("- {l}\n"));
            }
        }
        for l in &g {
            if !w.contains(l) {
                diff.push_str(&format!("+ {l}\n"));
            }
        }
        panic!(
            "{case} {what}: output differs (- expected only, + emitted only)\n{diff}\n--- emitted:\n{got}\n--- expected:\n{want}"
        );
    }
}

// ---------------------------------------------------------------- step schedules

/// How a case's inputs change from step to step.
pub enum Step {
    /// The objects annotated for this step.
    Annotated(u32),
    /// Everything in the file.
    All,
    /// Everything but EndpointSlices (iptables-21..28 step 2: "EndpointSlice deleted").
    WithoutSlices,
    /// iptables-16: objects by the header's step list.
    LargeCluster(u32),
}

pub fn svc_ref(ns: &str, name: &str) -> ServiceRef {
    ServiceRef {
        namespace: ns.into(),
        name: name.into(),
    }
}

pub fn build_model(c: &Case, step: &Step) -> Model {
    match step {
        Step::Annotated(n) => model_at(c, Some(*n)),
        Step::All => model_at(c, None),
        Step::WithoutSlices => {
            let mut m = model_at(c, None);
            m.slices.clear();
            m
        }
        Step::LargeCluster(n) => {
            // Header of iptables-16: step 2 adds svc3's slice; step 4 adds Service ns4/svc4
            // and its slice; step 5 deletes the Service (the slice stays).
            let mut m = model_at(c, None);
            if *n < 2 {
                m.slices.remove(&svc_ref("ns3", "svc3"));
            }
            if *n < 4 {
                m.services.remove(&svc_ref("ns4", "svc4"));
                m.slices.remove(&svc_ref("ns4", "svc4"));
            }
            if *n >= 5 {
                m.services.remove(&svc_ref("ns4", "svc4"));
            }
            m
        }
    }
}

pub fn schedule(c: &Case) -> Vec<Step> {
    let steps: BTreeSet<u32> = sections(&c.expected)
        .iter()
        .filter_map(|(n, _)| *n)
        .collect();
    if c.name.starts_with("iptables-16") {
        return (1..=7).map(Step::LargeCluster).collect();
    }
    if c.text
        .contains(lb_userspace::source::testconfig::PRESENT_IN_STEPS)
    {
        return steps.into_iter().map(Step::Annotated).collect();
    }
    if steps.len() == 2 {
        return vec![Step::All, Step::WithoutSlices];
    }
    vec![Step::All]
}

pub fn parse_flow(line: &str) -> Option<(String, trace::Packet, String)> {
    let rest = line.strip_prefix("FLOW ")?;
    let (name, rest) = rest.split_once(" | ")?;
    let (pkt, result) = rest.split_once(" => ").map_or((rest, ""), |(a, b)| (a, b));
    let (src, dst) = pkt.split_once(" -> ")?;
    let (dst, proto) = dst.rsplit_once('/')?;
    let (dst_ip, port) = dst.rsplit_once(':')?;
    let protocol = match proto {
        "TCP" => Protocol::Tcp,
        "UDP" => Protocol::Udp,
        "SCTP" => Protocol::Sctp,
        _ => return None,
    };
    Some((
        name.to_string(),
        trace::Packet {
            src: src.trim().parse().ok()?,
            dst: dst_ip.trim_matches(|c| c == '[' || c == ']').parse().ok()?,
            dport: port.parse().ok()?,
            protocol,
        },
        result.trim().to_string(),
    ))
}

pub fn check_flows(
    c: &Case,
    step: Option<u32>,
    body: &str,
    run: &dyn Fn(trace::Packet) -> (String, bool),
) {
    let mut failures = Vec::new();
    let mut count = 0;
    for line in body.lines().filter(|l| l.starts_with("FLOW ")) {
        let (name, pkt, want) =
            parse_flow(line).unwrap_or_else(|| panic!("{}: bad FLOW line {line:?}", c.name));
        count += 1;
        let (result, masq) = run(pkt);
        let got = if masq {
            format!("{result} [masq]")
        } else {
            result
        };
        let got = got.trim().to_string();
        if got != want {
            failures.push(format!(
                "step {step:?} {name}: expected {want:?}, got {got:?}"
            ));
        }
    }
    assert!(count > 0, "{}: no FLOW lines", c.name);
    assert!(
        failures.is_empty(),
        "{}: {} flow(s) differ:\n{}",
        c.name,
        failures.len(),
        failures.join("\n")
    );
}
