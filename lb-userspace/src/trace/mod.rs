//! `xlb trace`: one packet's path, in Kubernetes terms — through the loaded programs
//! ([`ebpf`], a test run against scratch copies of the flow maps) and through the rules each
//! kube-proxy mode would write ([`rules`]).
//!
//! [`request`] turns `--from`/`--to` into a packet of either family ([`frame`] builds it);
//! [`Report`] is what every tracer prints.

pub mod ebpf;
pub mod frame;
pub mod packet;
pub mod pods;
pub mod request;
pub mod rules;

use std::fmt;

/// One step of a trace: what was looked at and what it said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// A short name (`frontend`, `endpoints`, `affinity`, …).
    pub what: String,
    /// What happened, one line per entry.
    pub lines: Vec<String>,
}

/// A trace: a title and its steps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub title: String,
    pub steps: Vec<Step>,
    /// Where the packet ends: a backend `ip:port`, or `refused`, `dropped`, `passed`.
    pub outcome: String,
}

impl Report {
    pub fn new(title: impl Into<String>) -> Self {
        Self {
            title: title.into(),
            ..Self::default()
        }
    }

    /// Adds a step.
    pub fn step(&mut self, what: &str, lines: Vec<String>) {
        self.steps.push(Step {
            what: what.into(),
            lines,
        });
    }

    /// Adds a one-line step.
    pub fn line(&mut self, what: &str, line: impl Into<String>) {
        self.step(what, vec![line.into()]);
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.title)?;
        let width = self.steps.iter().map(|s| s.what.len()).max().unwrap_or(0);
        for (i, s) in self.steps.iter().enumerate() {
            for (j, l) in s.lines.iter().enumerate() {
                if j == 0 {
                    writeln!(f, "{:>3}. {:<width$}  {l}", i + 1, s.what)?;
                } else {
                    writeln!(f, "     {:<width$}  {l}", "")?;
                }
            }
        }
        writeln!(f, "  => {}", self.outcome)
    }
}

/// Reports side by side, in columns of `width` characters (`--mode all`).
pub fn side_by_side(reports: &[Report], width: usize) -> String {
    let columns: Vec<Vec<String>> = reports
        .iter()
        .map(|r| r.to_string().lines().flat_map(|l| wrap(l, width)).collect())
        .collect();
    let rows = columns.iter().map(Vec::len).max().unwrap_or(0);
    let mut out = String::new();
    for i in 0..rows {
        let cells: Vec<String> = columns
            .iter()
            .map(|c| format!("{:<width$}", c.get(i).map_or("", String::as_str)))
            .collect();
        out.push_str(cells.join(" | ").trim_end());
        out.push('\n');
    }
    out
}

/// `line` in pieces of at most `width` characters (continuations indented).
fn wrap(line: &str, width: usize) -> Vec<String> {
    let chars: Vec<char> = line.chars().collect();
    if chars.len() <= width || width < 8 {
        return vec![line.to_string()];
    }
    let mut out = vec![chars[..width].iter().collect::<String>()];
    let mut rest = &chars[width..];
    while !rest.is_empty() {
        let n = rest.len().min(width - 6);
        out.push(format!("      {}", rest[..n].iter().collect::<String>()));
        rest = &rest[n..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_render_numbered_and_side_by_side() {
        let mut r = Report::new("t");
        r.line("frontend", "ClusterIP");
        r.step("endpoints", vec!["a".into(), "b".into()]);
        r.outcome = "10.0.0.1:80".into();
        let text = r.to_string();
        assert_eq!(
            text,
            "t\n  1. frontend   ClusterIP\n  2. endpoints  a\n                b\n  => 10.0.0.1:80\n"
        );
        let both = side_by_side(&[r.clone(), r], 30);
        assert!(
            both.lines()
                .next()
                .is_some_and(|l| l.starts_with("t ") && l.ends_with("| t"))
        );
    }
}
