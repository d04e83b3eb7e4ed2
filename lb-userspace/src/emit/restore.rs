//! An in-memory `iptables-restore --noflush`: the tables a sequence of payloads leaves
//! behind, with iptables' refusals (a rule in an undeclared chain, deleting a chain that
//! another rule still jumps to). It stands in for the kernel when checking emitters, the
//! way kube-proxy's own tests use a fake iptables.

use std::collections::{BTreeMap, BTreeSet};

use thiserror::Error;

/// Why a payload was refused; the tables are then left as they were.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RestoreError {
    #[error("line {line}: {text:?}: {reason}")]
    Syntax {
        line: usize,
        text: String,
        reason: &'static str,
    },
    #[error("line {line}: chain {chain} does not exist in table {table}")]
    NoSuchChain {
        line: usize,
        table: String,
        chain: String,
    },
    #[error("line {line}: cannot delete chain {chain} in table {table}: still used by {by}")]
    InUse {
        line: usize,
        table: String,
        chain: String,
        by: String,
    },
}

/// Targets iptables knows without a chain.
const BUILTIN_TARGETS: [&str; 12] = [
    "ACCEPT",
    "DROP",
    "REJECT",
    "RETURN",
    "MARK",
    "MASQUERADE",
    "DNAT",
    "SNAT",
    "REDIRECT",
    "LOG",
    "CONNMARK",
    "NOTRACK",
];

/// Splits a rule line into arguments, keeping `"quoted words"` together (quotes kept).
pub fn split_args(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    for ch in line.chars() {
        match ch {
            '"' => {
                quoted = !quoted;
                cur.push(ch);
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(cur);
    }
    out
}

/// The `-j` target of a rule line, if any.
pub fn jump_target(args: &[String]) -> Option<&str> {
    args.iter()
        .position(|a| a == "-j")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// Tables → chains → rule lines (`-A CHAIN …`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tables {
    tables: BTreeMap<String, BTreeMap<String, Vec<String>>>,
}

impl Tables {
    /// Empty tables.
    pub fn new() -> Self {
        Self::default()
    }

    /// The chains of `table` (what `iptables-save -t TABLE` lists).
    pub fn chains(&self, table: &str) -> BTreeSet<String> {
        self.tables
            .get(table)
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The rule lines of a chain, in order (empty when the chain does not exist).
    pub fn rules(&self, table: &str, chain: &str) -> &[String] {
        self.tables
            .get(table)
            .and_then(|t| t.get(chain))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Whether the chain exists.
    pub fn has_chain(&self, table: &str, chain: &str) -> bool {
        self.tables
            .get(table)
            .is_some_and(|t| t.contains_key(chain))
    }

    /// Appends a rule line (`-A CHAIN …`) outside any payload, creating the chain: how a
    /// test injects a foreign rule.
    pub fn append(&mut self, table: &str, line: &str) {
        let args = split_args(line);
        if let Some(chain) = args.get(1) {
            self.tables
                .entry(table.to_string())
                .or_default()
                .entry(chain.clone())
                .or_default()
                .push(line.to_string());
        }
    }

    /// Applies a restore payload with `--noflush` semantics: declared chains are created or
    /// flushed, rules appended, `-X` chains deleted; all or nothing.
    pub fn apply(&mut self, payload: &str) -> Result<(), RestoreError> {
        let mut work = self.clone();
        let mut table: Option<String> = None;
        for (i, raw) in payload.lines().enumerate() {
            let line = i + 1;
            let text = raw.trim();
            let syntax = |reason| RestoreError::Syntax {
                line,
                text: text.to_string(),
                reason,
            };
            if text.is_empty() || text.starts_with('#') {
                continue;
            }
            if let Some(name) = text.strip_prefix('*') {
                table = Some(name.to_string());
                work.tables.entry(name.to_string()).or_default();
                continue;
            }
            let Some(tname) = table.clone() else {
                return Err(syntax("outside a table"));
            };
            if text == "COMMIT" {
                work.check_jumps(&tname, line)?;
                table = None;
                continue;
            }
            let t = work.tables.entry(tname.clone()).or_default();
            if let Some(decl) = text.strip_prefix(':') {
                let name = decl
                    .split_whitespace()
                    .next()
                    .ok_or_else(|| syntax("empty chain"))?;
                t.insert(name.to_string(), Vec::new());
            } else if let Some(rest) = text.strip_prefix("-A ") {
                let chain = rest
                    .split_whitespace()
                    .next()
                    .ok_or_else(|| syntax("no chain"))?;
                let rules = t.get_mut(chain).ok_or_else(|| RestoreError::NoSuchChain {
                    line,
                    table: tname.clone(),
                    chain: chain.to_string(),
                })?;
                rules.push(text.to_string());
            } else if let Some(rest) = text.strip_prefix("-X ") {
                let chain = rest.trim();
                if !t.contains_key(chain) {
                    return Err(RestoreError::NoSuchChain {
                        line,
                        table: tname.clone(),
                        chain: chain.to_string(),
                    });
                }
                for (other, rules) in t.iter() {
                    if other == chain {
                        continue;
                    }
                    for r in rules {
                        if jump_target(&split_args(r)) == Some(chain) {
                            return Err(RestoreError::InUse {
                                line,
                                table: tname.clone(),
                                chain: chain.to_string(),
                                by: r.clone(),
                            });
                        }
                    }
                }
                t.remove(chain);
            } else {
                return Err(syntax("unknown command"));
            }
        }
        if table.is_some() {
            return Err(RestoreError::Syntax {
                line: payload.lines().count(),
                text: String::new(),
                reason: "missing COMMIT",
            });
        }
        *self = work;
        Ok(())
    }

    fn check_jumps(&self, table: &str, line: usize) -> Result<(), RestoreError> {
        let Some(t) = self.tables.get(table) else {
            return Ok(());
        };
        for rules in t.values() {
            for r in rules {
                if let Some(target) = jump_target(&split_args(r))
                    && !BUILTIN_TARGETS.contains(&target)
                    && !t.contains_key(target)
                {
                    return Err(RestoreError::NoSuchChain {
                        line,
                        table: table.to_string(),
                        chain: target.to_string(),
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deleting_a_referenced_chain_fails_and_changes_nothing() {
        let mut t = Tables::new();
        t.apply("*nat\n:A - [0:0]\n:B - [0:0]\n-A A -j B\nCOMMIT\n")
            .expect("apply");
        let before = t.clone();
        let err = t
            .apply("*nat\n:B - [0:0]\n-X B\nCOMMIT\n")
            .expect_err("in use");
        assert!(matches!(err, RestoreError::InUse { .. }));
        assert_eq!(t, before);
        t.apply("*nat\n:A - [0:0]\n:B - [0:0]\n-X B\nCOMMIT\n")
            .expect("flushed first");
        assert_eq!(t.chains("nat").into_iter().collect::<Vec<_>>(), ["A"]);
    }

    #[test]
    fn quoted_comments_stay_one_argument() {
        let a = split_args(r#"-A X -m comment --comment "a b c" -j Y"#);
        assert_eq!(a[5], "\"a b c\"");
        assert_eq!(jump_target(&a), Some("Y"));
    }
}
