//! Invariants of the source that neither rustc nor the verifier checks.
//!
//! The agent's layers: no module of `lb-userspace` imports from a layer above its own (see
//! [`LAYERS`]; test code apart).
//!
//! The eBPF programs: the per-CPU
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

/// `lb-userspace`'s top-level modules by layer, lowest first: a module may import from
/// lower layers only (and from itself). The model is at the centre; sources feed it, the
/// desired state and the emitters are pure functions of it; `datapath/` is all kernel
/// access; the readers and servers sit on those, the agent on them, the command line (the
/// binary) on top.
const LAYERS: [&[&str]; 6] = [
    &["model", "glob"],
    &["source", "emit", "desired"],
    &["datapath", "proxy"],
    &[
        "reconcile",
        "migrate",
        "shadow",
        "list",
        "trace",
        "serve",
        "config",
        "cleanup",
    ],
    &["agent"],
    &["cli", "main", "lib"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The top-level modules `code` imports (`crate::m`, `crate::{m::…, n}`, and
/// `lb_userspace::m` in the binary's files).
fn imported_modules(code: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for prefix in ["crate::", "lb_userspace::"] {
        for (i, _) in code.match_indices(prefix) {
            let rest = &code[i + prefix.len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // The group's top-level items, up to its closing brace.
                let (mut depth, mut item_start) = (0usize, 0usize);
                for (j, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => {
                            out.insert(ident(&group[item_start..j]));
                            break;
                        }
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            out.insert(ident(&group[item_start..j]));
                            item_start = j + 1;
                        }
                        _ => {}
                    }
                }
            } else {
                out.insert(ident(rest));
            }
        }
    }
    out.retain(|m| !m.is_empty() && m.chars().next().is_some_and(|c| c.is_ascii_lowercase()));
    out
}

#[test]
fn no_module_of_the_agent_imports_from_a_layer_above_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../lb-userspace/src");
    let mut files = BTreeMap::new();
    sources(&root, &root, &mut files);
    assert!(files.len() > 50, "lb-userspace's sources are read");
    let mut wrong = Vec::new();
    for (name, code) in &files {
        let module = name
            .split('/')
            .next()
            .unwrap_or(name)
            .trim_end_matches(".rs");
        // Test code may use any layer as a fixture (the file source builds models).
        if name.ends_with("/tests.rs") {
            continue;
        }
        let code = code.split("#[cfg(test)]\nmod ").next().unwrap_or(code);
        let Some(mine) = layer_of(module) else {
            wrong.push(format!(
                "{name}: top-level module {module} has no layer in LAYERS"
            ));
            continue;
        };
        for used in imported_modules(code) {
            if used == module {
                continue;
            }
            match layer_of(&used) {
                Some(theirs) if theirs < mine => {}
                Some(theirs) => wrong.push(format!(
                    "{name}: {module} (layer {mine}) imports {used} (layer {theirs})"
                )),
                // Crate-root items (the embedded object, re-exports) are not modules.
                None => {}
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
}

/// What would make the desired state depend on more than the model, the node and the
/// indices it is handed: the clock, randomness, the environment, files, the kernel, state
/// kept between calls.
const IMPURE: [&str; 9] = [
    "Instant",
    "SystemTime",
    "rand::",
    "std::env",
    "std::fs",
    "static mut",
    "thread_local!",
    "Mutex",
    "Cell<",
];

#[test]
fn the_desired_state_is_a_pure_function_of_the_model_node_and_indices() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../lb-userspace/src");
    let mut files = BTreeMap::new();
    sources(&root, &root.join("desired"), &mut files);
    assert!(files.len() >= 4, "desired/ is read: {:?}", files.keys());
    for (name, code) in &files {
        if name.ends_with("/tests.rs") {
            continue;
        }
        let code = code.split("#[cfg(test)]\nmod ").next().unwrap_or(code);
        for word in IMPURE {
            assert!(
                !code.contains(word),
                "{name} uses {word}: desired/ is only the function model → map contents (keep books in reconcile/)"
            );
        }
        for used in imported_modules(code) {
            assert!(
                ["model", "desired"].contains(&used.as_str()),
                "{name} imports crate::{used}: desired/ depends on the model alone"
            );
        }
    }
}

#[test]
fn the_import_parser_sees_grouped_and_plain_imports() {
    let code =
        "use crate::{\n    datapath::{a, b},\n    model::X,\n};\nlet _ = crate::list::f();\n";
    let got: Vec<String> = imported_modules(code).into_iter().collect();
    assert_eq!(got, ["datapath", "list", "model"]);
}

fn ebpf_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../lb-ebpf/src")
}

/// Every `.rs` file under `dir`, by its path relative to `root`, without comment lines.
fn sources(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    for entry in fs::read_dir(dir).expect("read a source directory") {
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
