//! Builds: the eBPF object with the nightly toolchain, then `xlb` with it embedded.

use std::{
    path::{Path, PathBuf},
    process::Command,
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
    let status = cmd.status().with_context(|| format!("cannot start {shown}"))?;
    if !status.success() {
        bail!("{shown} failed with {status}");
    }
    Ok(())
}

/// A cargo command for the nightly toolchain, without the stable toolchain's environment
/// that `cargo xtask` inherited.
fn nightly_cargo() -> Command {
    let mut c = Command::new("rustup");
    c.args(["run", "nightly", "cargo"]);
    for var in ["RUSTUP_TOOLCHAIN", "RUSTC", "RUSTC_WRAPPER", "RUSTFLAGS", "CARGO", "CARGO_TARGET_DIR"] {
        c.env_remove(var);
    }
    c
}

/// Builds lb-ebpf for bpfel-unknown-none; returns the object's path.
pub fn ebpf() -> Result<PathBuf> {
    println!("xtask: building the eBPF object (nightly, bpf-linker)");
    run(nightly_cargo().current_dir(workspace_root().join("lb-ebpf")).args(["build", "--release"]))
        .context("building lb-ebpf (run `cargo xtask setup` if bpf-linker or rust-src is missing)")?;
    let obj = ebpf_object();
    if !obj.exists() {
        bail!("the eBPF build succeeded but {} is missing", obj.display());
    }
    Ok(obj)
}

/// Builds the eBPF object and `xlb`; returns the path of `xlb`.
pub fn all(release: bool) -> Result<PathBuf> {
    let obj = ebpf()?;
    println!("xtask: building xlb");
    let mut c = Command::new("cargo");
    c.args(["build", "--package", "lb-userspace", "--bin", "xlb"]).env("XLB_EBPF_OBJECT", &obj);
    if release {
        c.arg("--release");
    }
    run(&mut c)?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    Ok(target.join(if release { "release" } else { "debug" }).join("xlb"))
}

/// Runs the workspace's tests with the built object and binary.
pub fn test(extra: &[String]) -> Result<()> {
    let xlb = all(false)?;
    println!("xtask: running every test tier (unit, golden, packet, traffic)");
    run(Command::new("cargo")
        .args(["test", "--workspace"])
        .args(extra)
        .env("XLB_EBPF_OBJECT", ebpf_object())
        .env("XLB_BIN", &xlb))
}
