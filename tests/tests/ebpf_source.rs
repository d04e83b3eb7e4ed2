//! Invariants of the eBPF source that neither rustc nor the verifier checks: the per-CPU
//! work area (`lb-ebpf/src/work.rs`) is turned into a `&mut` only at the programs' entries,
//! no other per-CPU scratch map appears unannounced, and every raw `&mut *` dereference is
//! one of the known, commented ones. A new one fails here until it is reviewed and counted.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

/// Raw `&mut *` dereferences per file: the work area itself, the SNAT port search's
/// callback (its context and the scratch lent to it), the shared conntrack and affinity
/// entries, the route request scratches and XDP route caches, the socket hooks' context.
const RAW_MUT_DEREFS: [(&str, usize); 6] = [
    ("work.rs", 1),
    ("conntrack.rs", 4),
    ("affinity.rs", 2),
    ("fib.rs", 2),
    ("v6/fib.rs", 2),
    ("sock.rs", 1),
];

/// The value types per-CPU arrays may hold: counters, the work area, the route request
/// scratches and the XDP route caches.
const PER_CPU_VALUES: [&str; 6] = [
    "Counter",
    "WorkArea",
    "RouteScratch",
    "RouteScratch6",
    "CachedRoute",
    "CachedRoute6",
];

fn ebpf_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../lb-ebpf/src")
}

/// Every `.rs` file under `dir`, by its path relative to `root`, without comment lines.
fn sources(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    for entry in fs::read_dir(dir).expect("read lb-ebpf/src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            sources(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = fs::read_to_string(&path).expect("read a source file");
            let code: Vec<&str> = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect();
            let rel = path.strip_prefix(root).expect("under src");
            out.insert(rel.to_string_lossy().replace('\\', "/"), code.join("\n"));
        }
    }
}

#[test]
fn the_work_area_is_acquired_at_the_entries_only_and_raw_derefs_are_counted() {
    let root = ebpf_src();
    let mut files = BTreeMap::new();
    sources(&root, &root, &mut files);
    assert!(files.contains_key("work.rs"), "lb-ebpf/src/work.rs exists");

    for (name, code) in &files {
        if name != "work.rs" {
            assert!(
                !code.contains("XLB_WORK"),
                "{name}: XLB_WORK is named outside work.rs (take the work area from the caller)"
            );
        }
        if name != "main.rs" && name != "xdp.rs" {
            assert!(
                !code.contains("work::acquire("),
                "{name}: work::acquire is called below the programs' entries (main.rs, xdp.rs)"
            );
        }
        for decl in code.split("PerCpuArray<").skip(1) {
            let value = decl.split([',', '>']).next().unwrap_or("").trim();
            if value.is_empty() || value == "T" {
                continue;
            }
            assert!(
                PER_CPU_VALUES.contains(&value),
                "{name}: a per-CPU array of {value}: scratch belongs in work::WorkArea"
            );
        }
        let raw = code.matches("&mut *").count();
        let allowed = RAW_MUT_DEREFS
            .iter()
            .find(|(f, _)| f == name)
            .map_or(0, |(_, n)| *n);
        assert_eq!(
            raw, allowed,
            "{name}: {raw} raw `&mut *` dereferences, {allowed} known (review, then count)"
        );
    }
}
