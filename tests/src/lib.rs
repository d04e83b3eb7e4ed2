//! Support shared by xlb's integration tests and `cargo xtask run`: isolated network
//! namespaces, echo servers that report the peer they saw, clients, and the agent run as a
//! process inside a node namespace.
//!
//! Everything here builds its own namespaces with names unique to the run and removes them on
//! drop, on success and on failure. Nothing touches the root namespace's interfaces.

pub use xlb_lab::{bridge, cgroup, client, echo, netns, probe, topology};

pub mod agent;
pub mod apiserver;
pub mod capture;
pub mod checksums;
pub mod datapath;
pub mod frame6;
pub mod frames;
pub mod http;
pub mod netfilter;
pub mod prev_layout;
pub mod scenario;
pub mod services;
pub mod suites;
pub mod trace_support;
pub mod twonode;

use std::sync::atomic::{AtomicU32, Ordering};

/// A short tag unique to this process and call (namespace and pin names embed it).
pub fn unique_tag(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{}{n}", std::process::id())
}

/// The environment variable naming the directory where a skipped privileged test leaves a
/// marker file (`cargo xtask test` sets it and counts the files in its summary).
pub const SKIP_DIR_ENV: &str = "XLB_SKIP_DIR";

/// True when this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// True where a privileged test must not skip: `CI=true` or `XLB_REQUIRE_ROOT=1`.
pub fn root_required() -> bool {
    let set = |var: &str, want: &[&str]| {
        std::env::var(var).is_ok_and(|v| want.contains(&v.trim().to_ascii_lowercase().as_str()))
    };
    set("CI", &["true", "1"]) || set("XLB_REQUIRE_ROOT", &["1", "true"])
}

/// The running test's name: the name libtest gives the thread it runs a test on (the test's
/// path in its binary, `module::test_name`). A thread the test spawned has no such name: it
/// is "a thread of <process>", so a test that asks from its own threads captures the name
/// first.
pub fn test_name() -> String {
    match std::thread::current().name() {
        Some(name) if name != "main" => name.to_string(),
        _ => format!("a thread of {}", std::process::id()),
    }
}

/// True when running as root. Otherwise: under `CI=true` or `XLB_REQUIRE_ROOT=1` it panics
/// (a privileged test that cannot run fails); elsewhere it prints a loud notice naming the
/// running test ([`test_name`]), leaves a skip marker for `cargo xtask test` to count, and
/// returns false.
pub fn require_root() -> bool {
    if is_root() {
        return true;
    }
    let test = test_name();
    assert!(
        !root_required(),
        "{test} needs root (BPF, network namespaces) and must not skip here (CI=true or XLB_REQUIRE_ROOT=1): run it as root"
    );
    eprintln!(
        "\n!!!!! SKIPPED {test}: needs root (BPF, network namespaces). CI runs as root; run `sudo -E cargo xtask test` locally. !!!!!\n"
    );
    if let Err(e) = mark_skipped(&test) {
        eprintln!("!!!!! cannot record the skip of {test}: {e} !!!!!");
    }
    false
}

/// The running test cannot run here for want of a tool (not of root): prints a loud notice
/// naming it ([`test_name`]) and `why`, and leaves a skip marker for `cargo xtask test` to
/// count.
pub fn skip(why: &str) {
    let test = test_name();
    eprintln!("\n!!!!! SKIPPED {test}: {why} !!!!!\n");
    if let Err(e) = mark_skipped(&format!("{test} ({why})")) {
        eprintln!("!!!!! cannot record the skip of {test}: {e} !!!!!");
    }
}

/// `promtool` (Prometheus' own linter): `$XLB_PROMTOOL`, else on `PATH`, else where
/// `cargo xtask setup` extracts it from Debian's `prometheus` package
/// (`target/xtask-tools/promtool`).
pub fn promtool() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("XLB_PROMTOOL") {
        return Some(p.into());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    std::env::split_paths(&path)
        .map(|d| d.join("promtool"))
        .chain([target.join("xtask-tools").join("promtool")])
        .find(|p| p.is_file())
}

/// Leaves a marker file for a skipped test under `$XLB_SKIP_DIR` (when set): one file per
/// skip, named by test, process and call, so parallel tests and test binaries never share one.
fn mark_skipped(test: &str) -> std::io::Result<()> {
    match std::env::var_os(SKIP_DIR_ENV) {
        Some(dir) => mark_skipped_in(std::path::Path::new(&dir), test),
        None => Ok(()),
    }
}

fn mark_skipped_in(dir: &std::path::Path, test: &str) -> std::io::Result<()> {
    let safe: String = test
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '-'
            }
        })
        // The file's name stays far below NAME_MAX (255); the file holds the whole name.
        .take(120)
        .collect();
    let path = dir.join(format!("{}-{safe}", unique_tag("skip")));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, test.as_bytes()))
}

/// The `xlb` binary: `$XLB_BIN`, else the workspace's target dir (debug, then release).
pub fn xlb_bin() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("XLB_BIN") {
        return p.into();
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    for profile in ["debug", "release"] {
        let p = target.join(profile).join("xlb");
        if p.exists() {
            return p;
        }
    }
    panic!(
        "xlb binary not found under {}: run `cargo xtask build` first",
        target.display()
    );
}

/// The maps pinned in `dir`, opened as `xlb list` opens them (a map not pinned there is an
/// error only when it is read).
pub fn pins(dir: &std::path::Path) -> lb_userspace::datapath::pins::Pins {
    lb_userspace::datapath::pins::Pins::open(dir).expect("open the pinned maps")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_name_is_the_running_tests_path() {
        assert_eq!(
            test_name(),
            "tests::the_test_name_is_the_running_tests_path"
        );
        let spawned = std::thread::spawn(test_name).join().expect("thread");
        assert_eq!(spawned, format!("a thread of {}", std::process::id()));
    }

    #[test]
    fn every_skip_leaves_its_own_marker_naming_the_test() {
        let dir = std::env::temp_dir().join(unique_tag("xlb-skiptest"));
        std::fs::create_dir_all(&dir).expect("dir");
        for test in ["a_test", "a_test", "cargo xtask run"] {
            mark_skipped_in(&dir, test).expect("marker");
        }
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .expect("read dir")
            .map(|e| std::fs::read_to_string(e.expect("entry").path()).expect("read"))
            .collect();
        names.sort();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(names, ["a_test", "a_test", "cargo xtask run"]);
    }
}
