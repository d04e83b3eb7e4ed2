//! Builds: the eBPF object with the nightly toolchain, then `xlb` with it embedded.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

/// The workspace root (xtask's parent directory).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where `build-ebpf` leaves the object.
pub fn ebpf_object() -> PathBuf {
    workspace_root().join("lb-ebpf/target/bpfel-unknown-none/release/lb-ebpf")
}

/// Runs a command, failing with its name when it fails.
pub fn run(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {shown}"))?;
    if !status.success() {
        bail!("{shown} failed with {status}");
    }
    Ok(())
}

/// A cargo command for the nightly toolchain, without the stable toolchain's environment
/// that `cargo xtask` inherited.
pub fn nightly_cargo() -> Command {
    let mut c = Command::new("rustup");
    c.args(["run", "nightly", "cargo"]);
    for var in [
        "RUSTUP_TOOLCHAIN",
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTFLAGS",
        "CARGO",
        "CARGO_TARGET_DIR",
    ] {
        c.env_remove(var);
    }
    c
}

/// Builds lb-ebpf for bpfel-unknown-none; returns the object's path.
pub fn ebpf() -> Result<PathBuf> {
    println!("xtask: building the eBPF object (nightly, bpf-linker)");
    run(nightly_cargo()
        .current_dir(workspace_root().join("lb-ebpf"))
        .args(["build", "--release"]))
    .context("building lb-ebpf (run `cargo xtask setup` if bpf-linker or rust-src is missing)")?;
    let obj = ebpf_object();
    if !obj.exists() {
        bail!("the eBPF build succeeded but {} is missing", obj.display());
    }
    Ok(obj)
}

/// Builds the eBPF object, `xlb`, `xlb-probe` and `xlb-compare`; returns the path of `xlb`.
pub fn all(release: bool) -> Result<PathBuf> {
    let obj = ebpf()?;
    println!("xtask: building xlb");
    let mut c = Command::new("cargo");
    // xlb-lab's binaries land beside xlb: xlb-probe (the client process of the socket-hook
    // tests, the demo, xlb-compare and the benches) and xlb-compare.
    c.args([
        "build",
        "--package",
        "lb-userspace",
        "--package",
        "xlb-lab",
        "--bin",
        "xlb",
        "--bin",
        "xlb-probe",
        "--bin",
        "xlb-compare",
    ])
    .env("XLB_EBPF_OBJECT", &obj);
    if release {
        c.arg("--release");
    }
    run(&mut c)?;
    Ok(target_dir()
        .join(if release { "release" } else { "debug" })
        .join("xlb"))
}

/// Cargo's target directory: `$CARGO_TARGET_DIR`, else the workspace's `target/`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Runs the workspace's tests with the built object and binary, echoing cargo's output,
/// then (a whole run, no filter) the lint step ([`crate::lint`]),
/// and ends with one summary line over every test binary: `tests: N passed, N failed, N
/// skipped`, where skipped counts ignored tests and tests that skipped for want of root or of
/// a tool (each leaves a marker in a directory passed as `XLB_SKIP_DIR`; see
/// `xlb_tests::require_root` and `xlb_tests::skip`).
pub fn test(extra: &[String]) -> Result<()> {
    let xlb = all(false)?;
    if !is_root() {
        if xlb_tests::root_required() {
            println!(
                "\n!!!!! NOT ROOT under CI=true or XLB_REQUIRE_ROOT=1: every packet and traffic test will FAIL. !!!!!\n"
            );
        } else {
            println!(
                "\n!!!!! NOT ROOT: the packet and traffic tests will SKIP (they need BPF and network namespaces). CI runs as root. !!!!!\n"
            );
        }
    }
    let skips = SkipDir::create()?;
    println!("xtask: running every test tier (unit, golden, packet, traffic)");
    // Every test binary runs even after one fails: a run reports all its failures at once.
    let no_fail_fast = (!extra.iter().any(|a| a == "--no-fail-fast")).then_some("--no-fail-fast");
    let mut child = Command::new("cargo")
        .args(["test", "--workspace"])
        .args(no_fail_fast)
        .args(extra)
        .env("XLB_EBPF_OBJECT", ebpf_object())
        .env("XLB_BIN", &xlb)
        .env(xlb_tests::SKIP_DIR_ENV, &skips.0)
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start cargo test")?;
    let mut totals = [0u64; 3];
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let line = line?;
            println!("{line}");
            if let Some(counts) = result_counts(&line) {
                for (t, c) in totals.iter_mut().zip(counts) {
                    *t += c;
                }
            }
        }
    }
    let status = child.wait()?;
    // A whole run (no filter, as CI's) lints too; each step counts as a test.
    let lint_failed = if extra.is_empty() {
        let (passed, failed) = crate::lint::steps_run();
        totals[0] += passed;
        totals[1] += failed.len() as u64;
        failed
    } else {
        Vec::new()
    };
    let skipped = skips.names()?;
    if !skipped.is_empty() {
        println!(
            "xtask: {} tests SKIPPED (for want of root, unless a reason is given): {}",
            skipped.len(),
            skipped.join(", ")
        );
    }
    println!("{}", summary(totals, skipped.len() as u64));
    if !status.success() {
        bail!("cargo test failed with {status}");
    }
    if !lint_failed.is_empty() {
        bail!("lint failed: {}", lint_failed.join(", "));
    }
    Ok(())
}

/// The closing line (CI reads it): a privileged test that skipped returned normally, so
/// cargo counted it as passed; it is moved to skipped.
fn summary(totals: [u64; 3], skipped_privileged: u64) -> String {
    let [passed, failed, ignored] = totals;
    format!(
        "tests: {} passed, {failed} failed, {} skipped",
        passed.saturating_sub(skipped_privileged),
        ignored + skipped_privileged
    )
}

/// The directory where skipped privileged tests leave their markers; removed on drop.
struct SkipDir(PathBuf);

impl SkipDir {
    fn create() -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("xlb-skips-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
        Ok(Self(dir))
    }

    /// The skipped tests' names, sorted (one marker per skip).
    fn names(&self) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.0).with_context(|| self.0.display().to_string())? {
            let path = entry?.path();
            names.push(
                std::fs::read_to_string(&path).unwrap_or_else(|_| path.display().to_string()),
            );
        }
        names.sort();
        Ok(names)
    }
}

impl Drop for SkipDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// (passed, failed, ignored) of a `test result:` line.
fn result_counts(line: &str) -> Option<[u64; 3]> {
    let rest = line.strip_prefix("test result: ")?;
    let mut counts = [0u64; 3];
    for part in rest.split(['.', ';']) {
        let mut words = part.split_whitespace();
        if let (Some(n), Some(what)) = (words.next(), words.next()) {
            let slot = match what {
                "passed" => 0,
                "failed" => 1,
                "ignored" => 2,
                _ => continue,
            };
            counts[slot] = n.parse().ok()?;
        }
    }
    Some(counts)
}

/// True when running as root.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_counts_privileged_skips_as_skipped() {
        let totals = result_counts(
            "test result: ok. 12 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.01s",
        )
        .expect("a result line");
        assert_eq!(totals, [12, 0, 2]);
        assert_eq!(summary(totals, 5), "tests: 7 passed, 0 failed, 7 skipped");
        assert_eq!(summary(totals, 0), "tests: 12 passed, 0 failed, 2 skipped");
    }
}
