//! What each mode did with each flow, and where the modes disagree.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
};

use lb_userspace::emit::Mode;

use super::{Flow, Impl};

/// What a mode did with a flow's requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The backends (`ip:port`) that answered.
    Backends(BTreeSet<String>),
    /// Refused at once (TCP RST or ICMP port unreachable).
    Refused,
    /// Nothing came back (dropped).
    Dropped,
    /// Some requests failed otherwise.
    Failed(String),
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Backends(b) => {
                write!(f, "{}", b.iter().cloned().collect::<Vec<_>>().join(" "))
            }
            Outcome::Refused => f.write_str("REFUSED"),
            Outcome::Dropped => f.write_str("DROPPED"),
            Outcome::Failed(e) => write!(f, "FAILED ({e})"),
        }
    }
}

impl std::str::FromStr for Outcome {
    type Err = String;

    /// Parses what [`Outcome`]'s `Display` writes (the line `xlb client flows` prints).
    fn from_str(line: &str) -> Result<Self, String> {
        Ok(match line.trim() {
            "REFUSED" => Outcome::Refused,
            "DROPPED" => Outcome::Dropped,
            l => match l.strip_prefix("FAILED (").and_then(|r| r.strip_suffix(')')) {
                Some(e) => Outcome::Failed(e.to_string()),
                None => Outcome::Backends(l.split_whitespace().map(String::from).collect()),
            },
        })
    }
}

/// The comparison: every flow, every mode's outcome.
#[derive(Debug, Default)]
pub struct Report {
    pub flows: Vec<(Flow, BTreeMap<Impl, Outcome>)>,
    /// xlb's datapath counters (`xlb list counters`) after each xlb lab's flows: which path
    /// (tc or the socket hooks) did the work.
    pub counters: BTreeMap<Impl, Counts>,
}

/// Counter values by reason name.
pub type Counts = BTreeMap<&'static str, u64>;

/// The counters the report shows: tc's new flows and refusals, the hooks' translations
/// and refusals.
const SHOWN_COUNTERS: [&str; 4] = ["new_flow", "reject", "sock_xlate", "sock_reject"];

impl Report {
    /// Flows where the modes did not all do the same.
    pub fn disagreements(&self) -> Vec<&Flow> {
        self.flows
            .iter()
            .filter(|(f, by)| !agree(f, by))
            .map(|(f, _)| f)
            .collect()
    }

    /// The side-by-side table: per flow, its service, frontend kind, frontend and origin,
    /// then each mode's outcome (xlb's with the path that served it).
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (flow, by) in &self.flows {
            let _ = writeln!(
                out,
                "{} {} {}/{} from {}: {}",
                flow.service,
                flow.kind.name(),
                flow.frontend,
                flow.protocol,
                flow.origin.name(),
                if agree(flow, by) { "agree" } else { "DISAGREE" }
            );
            for (m, o) in by {
                let _ = writeln!(out, "    {:<29} {}", m.label(flow), shown(flow, o));
            }
        }
        for (m, counts) in &self.counters {
            let shown: Vec<String> = SHOWN_COUNTERS
                .iter()
                .map(|c| format!("{c}={}", counts.get(c).copied().unwrap_or(0)))
                .collect();
            let _ = writeln!(out, "{} counters: {}", m.name(), shown.join(" "));
        }
        out
    }
}

/// Whether every mode did the same with `flow`. For an affinity service (`flow.eligible`)
/// each mode must have answered from exactly one eligible backend, not necessarily the same
/// one: each stuck to its own pick. Otherwise the outcomes must be equal.
fn agree(flow: &Flow, by: &BTreeMap<Impl, Outcome>) -> bool {
    if let Some(eligible) = &flow.eligible
        && by.values().all(|o| sticks_to_one(o, eligible))
    {
        return true;
    }
    by.values()
        .map(|o| o.to_string())
        .collect::<BTreeSet<_>>()
        .len()
        <= 1
}

/// Whether two modes' outcomes for `flow` agree (as [`Report::disagreements`] judges).
pub fn outcomes_agree(flow: &Flow, a: &Outcome, b: &Outcome) -> bool {
    let by = BTreeMap::from([
        (Impl::Ebpf, a.clone()),
        (Impl::KubeProxy(Mode::Iptables), b.clone()),
    ]);
    agree(flow, &by)
}

/// The outcome answered from exactly one backend, and it is one of `eligible`.
fn sticks_to_one(outcome: &Outcome, eligible: &BTreeSet<String>) -> bool {
    matches!(outcome, Outcome::Backends(b) if b.len() == 1 && b.is_subset(eligible))
}

/// A mode's outcome in the report: for an affinity flow answered from backends, the
/// eligible set and what it stuck to (`one of {a b}: a`).
fn shown(flow: &Flow, outcome: &Outcome) -> String {
    match (&flow.eligible, outcome) {
        (Some(eligible), Outcome::Backends(_)) => format!(
            "one of {{{}}}: {outcome}",
            eligible.iter().cloned().collect::<Vec<_>>().join(" ")
        ),
        _ => outcome.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use lb_userspace::model::Protocol;

    use super::*;
    use crate::compare::{Frontend, Origin};

    #[test]
    fn an_outcome_survives_its_line() {
        for o in [
            Outcome::Backends(["10.244.2.2:8080".into(), "10.244.3.2:8080".into()].into()),
            Outcome::Refused,
            Outcome::Dropped,
            Outcome::Failed("send to 10.96.0.30:53: Operation not permitted (os error 1)".into()),
        ] {
            assert_eq!(o.to_string().parse::<Outcome>(), Ok(o));
        }
    }

    fn affinity_flow(eligible: Option<&[&str]>) -> Flow {
        Flow {
            service: "demo/sticky:http".into(),
            kind: Frontend::ClusterIp,
            frontend: "10.96.0.40:80".parse().expect("addr"),
            protocol: Protocol::Tcp,
            origin: Origin::Pod,
            eligible: eligible.map(|e| e.iter().map(|s| s.to_string()).collect()),
        }
    }

    fn backends(b: &[&str]) -> Outcome {
        Outcome::Backends(b.iter().map(|s| s.to_string()).collect())
    }

    const ELIGIBLE: &[&str] = &["10.244.2.2:8080", "10.244.3.2:8080", "10.244.4.2:8080"];

    #[test]
    fn affinity_modes_agree_when_each_sticks_to_one_eligible_backend() {
        let flow = affinity_flow(Some(ELIGIBLE));
        let by = BTreeMap::from([
            (Impl::Ebpf, backends(&["10.244.2.2:8080"])),
            (
                Impl::KubeProxy(Mode::Iptables),
                backends(&["10.244.3.2:8080"]),
            ),
            (
                Impl::KubeProxy(Mode::Nftables),
                backends(&["10.244.4.2:8080"]),
            ),
        ]);
        assert!(agree(&flow, &by));
        let report = Report {
            flows: vec![(flow.clone(), by)],
            counters: BTreeMap::new(),
        };
        assert!(report.disagreements().is_empty());
        let table = report.render();
        assert!(table.contains(": agree"), "{table}");
        assert!(
            table.contains(
                "one of {10.244.2.2:8080 10.244.3.2:8080 10.244.4.2:8080}: 10.244.3.2:8080"
            ),
            "{table}"
        );
    }

    #[test]
    fn affinity_modes_disagree_on_two_backends_an_ineligible_one_or_a_refusal() {
        let flow = affinity_flow(Some(ELIGIBLE));
        let one = backends(&["10.244.2.2:8080"]);
        for other in [
            backends(&["10.244.2.2:8080", "10.244.3.2:8080"]),
            backends(&["10.244.9.2:8080"]),
            Outcome::Refused,
            Outcome::Dropped,
        ] {
            assert!(!outcomes_agree(&flow, &one, &other), "{other}");
        }
        // Refused everywhere is still agreement (an affinity service without endpoints).
        assert!(outcomes_agree(&flow, &Outcome::Refused, &Outcome::Refused));
    }

    #[test]
    fn without_affinity_the_backend_sets_must_be_equal() {
        let flow = affinity_flow(None);
        let a = backends(&["10.244.2.2:8080"]);
        let b = backends(&["10.244.3.2:8080"]);
        assert!(!outcomes_agree(&flow, &a, &b));
        assert!(outcomes_agree(&flow, &a, &a.clone()));
        assert_eq!(shown(&flow, &a), "10.244.2.2:8080");
    }
}
