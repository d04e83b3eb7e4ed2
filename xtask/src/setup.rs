//! `cargo xtask setup`: installs or verifies, idempotently, everything the project needs on a
//! fresh Debian machine: packages, the nightly's rust-src, bpf-linker against the nightly's
//! LLVM, bpffs on /sys/fs/bpf, and `promtool` (the metrics test's linter).

use std::{
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

use crate::build::{is_root, run as exec, workspace_root};

/// Commands the project and its tests use, and the Debian package of each.
const PACKAGES: &[(&str, &str)] = &[
    ("bpftool", "bpftool"),
    ("iptables", "iptables"),
    ("nft", "nftables"),
    ("ipvsadm", "ipvsadm"),
    ("ipset", "ipset"),
    ("ip", "iproute2"),
    ("conntrack", "conntrack"),
    ("ethtool", "ethtool"),
    ("trafgen", "netsniff-ng"),
    ("nsenter", "util-linux"),
    ("kubectl", "kubectl"),
];

const BPF_LINKER_VERSION: &str = "0.13";

fn on_path(cmd: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .any(|d| d.join(cmd).is_file())
}

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs every step; prints what it did.
pub fn run() -> Result<()> {
    let root = is_root();
    let mut missing = Vec::new();
    packages(root, &mut missing)?;
    toolchain_components()?;
    bpf_linker()?;
    bpffs(root, &mut missing)?;
    promtool(root, &mut missing)?;
    if !missing.is_empty() {
        println!(
            "xtask setup: {}these stay missing (privileged tests will be skipped):",
            if root { "" } else { "NOT ROOT, so " }
        );
        for m in &missing {
            println!("  - {m}");
        }
    }
    Ok(())
}

fn packages(root: bool, missing: &mut Vec<String>) -> Result<()> {
    let absent: Vec<&str> = PACKAGES
        .iter()
        .filter(|(cmd, _)| !on_path(cmd))
        .map(|(_, pkg)| *pkg)
        .collect();
    if absent.is_empty() {
        println!(
            "xtask setup: packages present ({})",
            PACKAGES.iter().map(|p| p.1).collect::<Vec<_>>().join(" ")
        );
        return Ok(());
    }
    if !root {
        missing.push(format!(
            "Debian packages: sudo apt-get install {}",
            absent.join(" ")
        ));
        return Ok(());
    }
    println!("xtask setup: installing {}", absent.join(" "));
    exec(Command::new("apt-get").args(["update", "-qq"]))?;
    exec(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&absent)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .with_context(|| format!("apt-get install {}", absent.join(" ")))?;
    Ok(())
}

fn toolchain_components() -> Result<()> {
    let toolchains = output(Command::new("rustup").args(["toolchain", "list"])).unwrap_or_default();
    if !toolchains.lines().any(|l| l.starts_with("nightly")) {
        bail!(
            "the nightly toolchain is missing (the eBPF crate needs it): rustup toolchain install nightly"
        );
    }
    // The eBPF crate builds core from source; the lint step runs rustfmt and clippy on
    // both toolchains (the workspace's and the eBPF crate's).
    components("nightly", &["rust-src", "rustfmt", "clippy"])?;
    let default =
        output(Command::new("rustup").args(["show", "active-toolchain"])).unwrap_or_default();
    match default.split_whitespace().next() {
        Some(t) => components(t, &["rustfmt", "clippy"]),
        None => Ok(()),
    }
}

/// Adds what of `wanted` `toolchain` lacks.
fn components(toolchain: &str, wanted: &[&str]) -> Result<()> {
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        toolchain,
        "--installed",
    ]))
    .unwrap_or_default();
    let absent: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|c| !installed.lines().any(|l| l.starts_with(c)))
        .collect();
    if absent.is_empty() {
        println!("xtask setup: {toolchain} has {}", wanted.join(", "));
        return Ok(());
    }
    println!("xtask setup: adding {} to {toolchain}", absent.join(", "));
    exec(
        Command::new("rustup")
            .args(["component", "add", "--toolchain", toolchain])
            .args(&absent),
    )
}

/// The nightly toolchain's libLLVM and its major version.
fn nightly_llvm() -> Result<(PathBuf, String)> {
    let sysroot = output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))
        .context("rustc +nightly --print sysroot")?;
    let lib = PathBuf::from(sysroot.trim()).join("lib");
    for e in std::fs::read_dir(&lib).with_context(|| lib.display().to_string())? {
        let name = e?.file_name().to_string_lossy().into_owned();
        if let Some(rest) = name.strip_prefix("libLLVM.so.") {
            let major = rest.split('.').next().unwrap_or_default().to_string();
            return Ok((lib.join(&name), major));
        }
    }
    bail!(
        "no libLLVM.so.* in {}: is the nightly toolchain complete?",
        lib.display()
    )
}

fn bpf_linker() -> Result<()> {
    // bpf-linker finds the nightly's libLLVM through the toolchain's library path.
    let version =
        output(Command::new("rustup").args(["run", "nightly", "bpf-linker", "--version"]));
    if version
        .as_deref()
        .is_some_and(|v| v.contains(&format!(" {BPF_LINKER_VERSION}.")))
    {
        println!("xtask setup: {}", version.unwrap_or_default().trim());
        return Ok(());
    }
    let (llvm, major) = nightly_llvm()?;
    let prefix = workspace_root().join("target/xtask-llvm");
    std::fs::create_dir_all(prefix.join("lib"))?;
    let link = prefix.join("lib/libLLVM.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&llvm, &link).with_context(|| link.display().to_string())?;
    println!(
        "xtask setup: building bpf-linker {BPF_LINKER_VERSION} against {} (about a minute)",
        llvm.display()
    );
    exec(
        Command::new("cargo")
            .args([
                "install",
                "--locked",
                "bpf-linker",
                "--version",
                &format!("~{BPF_LINKER_VERSION}"),
            ])
            .args([
                "--no-default-features",
                "--features",
                &format!("llvm-{major}"),
            ])
            .env("LLVM_PREFIX", &prefix),
    )
    .context("cargo install bpf-linker")
}

fn bpffs(root: bool, missing: &mut Vec<String>) -> Result<()> {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let mounted = mounts.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.get(1) == Some(&"/sys/fs/bpf") && f.get(2) == Some(&"bpf")
    });
    if mounted {
        println!("xtask setup: bpffs mounted on /sys/fs/bpf");
        return Ok(());
    }
    if !root {
        missing.push("bpffs: sudo mount -t bpf bpf /sys/fs/bpf".into());
        return Ok(());
    }
    println!("xtask setup: mounting bpffs on /sys/fs/bpf");
    // Building needs no bpffs: where root cannot mount (a container build, Containerfile's
    // builder stage) setup says so and goes on; the agent and the packet tests need it.
    if let Err(e) = exec(Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"])) {
        missing.push(format!("bpffs on /sys/fs/bpf: {e:#}"));
    }
    Ok(())
}

/// Where setup puts the tools it extracts from Debian packages rather than installs.
fn tools_dir() -> PathBuf {
    workspace_root().join("target/xtask-tools")
}

/// `promtool` for the metrics test (`promtool check metrics`): on `PATH`, or extracted from
/// Debian's `prometheus` package into `target/xtask-tools` (the package is not installed:
/// installing it would start a Prometheus server). Where apt offers no such package the
/// test skips and says why.
fn promtool(root: bool, missing: &mut Vec<String>) -> Result<()> {
    let dest = tools_dir().join("promtool");
    if on_path("promtool") || dest.is_file() {
        println!("xtask setup: promtool present");
        return Ok(());
    }
    if !root {
        missing.push("promtool: run `cargo xtask setup` as root (it extracts promtool from Debian's prometheus package)".into());
        return Ok(());
    }
    let work = tools_dir().join("prometheus-deb");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let download = || {
        Command::new("apt-get")
            .args(["download", "-qq", "prometheus"])
            .current_dir(&work)
            .status()
            .is_ok_and(|s| s.success())
    };
    if !download() {
        exec(Command::new("apt-get").args(["update", "-qq"]))?;
        if !download() {
            println!(
                "xtask setup: apt offers no prometheus package here, so no promtool: the metrics lint test will skip"
            );
            return Ok(());
        }
    }
    let deb = std::fs::read_dir(&work)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .context("apt-get download prometheus left no .deb")?;
    // dpkg-deb --fsys-tarfile DEB | tar -x ./usr/bin/promtool
    let mut fsys = Command::new("dpkg-deb")
        .arg("--fsys-tarfile")
        .arg(&deb)
        .stdout(Stdio::piped())
        .spawn()
        .context("dpkg-deb")?;
    let tar = Command::new("tar")
        .args(["-x", "-C"])
        .arg(&work)
        .arg("./usr/bin/promtool")
        .stdin(fsys.stdout.take().context("dpkg-deb stdout")?)
        .status()
        .context("tar")?;
    let unpacked = fsys.wait()?;
    if !tar.success() || !unpacked.success() {
        bail!("cannot extract promtool from {}", deb.display());
    }
    std::fs::rename(work.join("usr/bin/promtool"), &dest)
        .with_context(|| dest.display().to_string())?;
    std::fs::remove_dir_all(&work)?;
    println!(
        "xtask setup: promtool extracted from {} into {}",
        deb.display(),
        dest.display()
    );
    Ok(())
}
