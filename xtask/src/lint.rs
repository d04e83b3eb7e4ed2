//! The lint step: rustfmt and clippy (warnings are errors) for the workspace and for
//! lb-ebpf, which sits outside the workspace (its own nightly toolchain and target), so no
//! workspace command looks at it. `cargo xtask lint` runs it alone; a whole
//! `cargo xtask test` (no filter) runs it after the test tiers and counts each step as a test.

use std::process::Command;

use anyhow::{Result, bail};

use crate::build::{ebpf_object, nightly_cargo, workspace_root};

/// One lint step: its name and its command.
struct Step {
    name: &'static str,
    cmd: Command,
}

fn steps() -> Vec<Step> {
    let ebpf = workspace_root().join("lb-ebpf");
    let mut fmt_ebpf = nightly_cargo();
    fmt_ebpf.current_dir(&ebpf).args(["fmt", "--check"]);
    let mut clippy_ebpf = nightly_cargo();
    clippy_ebpf
        .current_dir(&ebpf)
        .args(["clippy", "--release", "--", "-D", "warnings"]);
    let mut fmt = Command::new("cargo");
    fmt.args(["fmt", "--all", "--check"]);
    let mut clippy = Command::new("cargo");
    clippy
        .args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ])
        .env("XLB_EBPF_OBJECT", ebpf_object());
    vec![
        Step {
            name: "rustfmt (workspace)",
            cmd: fmt,
        },
        Step {
            name: "rustfmt (lb-ebpf)",
            cmd: fmt_ebpf,
        },
        Step {
            name: "clippy -D warnings (workspace)",
            cmd: clippy,
        },
        Step {
            name: "clippy -D warnings (lb-ebpf)",
            cmd: clippy_ebpf,
        },
    ]
}

/// Runs every step (all of them, even after one fails) and returns (passed, failed names),
/// printing a `lint NAME ... ok|FAILED` line per step as cargo test prints a test's.
pub fn steps_run() -> (u64, Vec<&'static str>) {
    let mut passed = 0;
    let mut failed = Vec::new();
    for mut step in steps() {
        println!("xtask: lint {}: {:?}", step.name, step.cmd);
        let ok = step.cmd.status().is_ok_and(|s| s.success());
        println!(
            "lint {} ... {}",
            step.name,
            if ok { "ok" } else { "FAILED" }
        );
        if ok {
            passed += 1;
        } else {
            failed.push(step.name);
        }
    }
    (passed, failed)
}

/// `cargo xtask lint`.
pub fn run() -> Result<()> {
    let (_, failed) = steps_run();
    if !failed.is_empty() {
        bail!("lint failed: {}", failed.join(", "));
    }
    Ok(())
}
