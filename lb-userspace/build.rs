//! Embeds the eBPF object built by `cargo xtask build-ebpf` (nightly, bpfel-unknown-none).
//!
//! The object is looked up in `$XLB_EBPF_OBJECT`, then in lb-ebpf's release target dir. When it
//! is absent the crate still builds (plain `cargo build` works on stable alone) and the agent
//! reports at run time that the object must be built first.
use std::{env, fs, path::PathBuf};

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let default = manifest.join("../lb-ebpf/target/bpfel-unknown-none/release/lb-ebpf");
    let source = env::var_os("XLB_EBPF_OBJECT")
        .map(PathBuf::from)
        .unwrap_or(default);
    println!("cargo:rerun-if-env-changed=XLB_EBPF_OBJECT");
    println!("cargo:rerun-if-changed={}", source.display());
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it")).join("lb-ebpf.o");
    let bytes = fs::read(&source).unwrap_or_default();
    if bytes.is_empty() {
        println!(
            "cargo:warning=eBPF object not found at {}; run `cargo xtask build-ebpf` (xlb agent will refuse to start)",
            source.display()
        );
    }
    fs::write(&out, bytes).expect("write OUT_DIR/lb-ebpf.o");
}
