//! Invariants of the source that neither rustc nor the verifier checks.
//!
//! The agent's layers: no module of `lb-userspace` imports from a layer above its own (see
//! [`LAYERS`]; test code apart).
//!
//! The eBPF programs: the per-CPU
//! work area (`lb-ebpf/src/work.rs`) is turned into a `&mut` only at the programs' entries,
//! no other per-CPU scratch map appears unannounced, and every raw `&mut *` dereference is
//! one of the known, commented ones. A new one fails here until it is reviewed and counted.
//! lb-ebpf's modules import in no circle, and no IPv4 leaf imports an IPv6 one. Each hook
//! is one flow for both families, generic over `family::Family` (`ingress.rs`, `egress.rs`,
//! `xdp.rs`, `out_dnat.rs`): those modules name no family's types, and only the program
//! entries reach a family's leaf (`v4.rs`, `v6/`), neither of which imports the other.
//! A map value other CPUs write or a delete frees (conntrack, affinity) is never a Rust
//! reference: looked up only into a `Shared` (`lb-ebpf/src/shared.rs`, the rule on the
//! crate page).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

/// Raw `&mut *` dereferences per file: the work area itself, the SNAT port search's
/// callback (its context and the scratch lent to it), the route request scratches and XDP
/// route caches (per CPU), the socket hooks' context. None of a shared map value.
const RAW_MUT_DEREFS: [(&str, usize); 4] = [
    ("work.rs", 1),
    ("conntrack.rs", 2),
    ("fib.rs", 3),
    ("sock.rs", 1),
];

/// The value types per-CPU arrays may hold: counters, the work area, the route request
/// scratches, the XDP route caches and XDP's way out per backend.
const PER_CPU_VALUES: [&str; 7] = [
    "Counter",
    "WorkArea",
    "RouteScratch",
    "RouteScratch6",
    "CachedRoute",
    "CachedRoute6",
    "BackendWay",
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

/// The maps whose values other CPUs write in place or a delete frees, as the eBPF source
/// names them (a family's tables are `T::ct()` and `T::cta()` in the generic flow code).
const SHARED_TABLES: [&str; 7] = [
    "T::ct()",
    "T::cta()",
    "XLB_CT_V3",
    "XLB_CTA_V1",
    "XLB_CT6_V1",
    "XLB_CTA6_V1",
    "XLB_AFF_V2",
];

/// Where the call opened at `open` (the index of its `(`) closes, in `code`.
fn closing(code: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in code[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}

/// The places in `code` (whitespace removed) that look a shared table's value up other
/// than into a `Shared`: `get` (a `&V` for as long as the caller likes), or a `get_ptr_mut`
/// whose pointer is kept (neither wrapped in `Shared::of`, nor only tested for presence,
/// nor dropped at once).
fn unshared_lookups(code: &str) -> Vec<String> {
    let code: String = code.chars().filter(|c| !c.is_whitespace()).collect();
    let mut wrong = Vec::new();
    for table in SHARED_TABLES {
        for (i, _) in code.match_indices(&format!("{table}.get(")) {
            wrong.push(format!("`get` on {table} at {i}"));
        }
        let call = format!("{table}.get_ptr_mut(");
        for (i, _) in code.match_indices(&call) {
            let before = &code[..i];
            let after = closing(&code, i + call.len() - 1).map_or("", |end| &code[end + 1..]);
            let wrapped = before.ends_with("Shared::of(");
            let tested = after.starts_with(".is_some()") || after.starts_with(".is_none()");
            let dropped = before.ends_with("let_=") || before.ends_with("let _ =");
            if !(wrapped || tested || dropped) {
                wrong.push(format!(
                    "`get_ptr_mut` on {table} kept as a raw pointer at {i}"
                ));
            }
        }
    }
    wrong
}

#[test]
fn shared_map_values_are_held_through_shared_never_as_references() {
    let root = ebpf_src();
    let mut files = BTreeMap::new();
    sources(&root, &root, &mut files);
    assert!(
        files.contains_key("shared.rs"),
        "lb-ebpf/src/shared.rs exists"
    );
    let mut wrong = Vec::new();
    for (name, code) in &files {
        if code.contains("&'static mut") {
            wrong.push(format!("{name}: a `&'static mut`"));
        }
        // A map lookup's lifetime: what a reference to a shared entry would carry (the
        // scratch's own values are lent with the work area's, never `'static`).
        for value in ["CtValue", "CtValue6", "T::Value", "AffinityValue"] {
            if code.contains(&format!("&'static {value}")) {
                wrong.push(format!(
                    "{name}: `&'static {value}` (a shared entry as a reference)"
                ));
            }
        }
        for w in unshared_lookups(code) {
            wrong.push(format!("{name}: {w}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "shared map values held other than through `Shared`:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_shared_lookup_check_sees_what_it_must_refuse() {
    assert!(unshared_lookups("Shared::of(T::cta().get_ptr_mut(k))").is_empty());
    assert!(unshared_lookups("T::cta()\n  .get_ptr_mut(k).is_some()").is_empty());
    assert!(unshared_lookups("let _ = T::ct().get_ptr_mut(&key_of(a, b));").is_empty());
    assert_eq!(unshared_lookups("unsafe { T::ct().get(k) }").len(), 1);
    assert_eq!(
        unshared_lookups("XLB_AFF_V2.get_ptr_mut(key(c, s)).map(|p| unsafe { &mut *p })").len(),
        1
    );
}

/// The full paths a `use` tree names, from `rest` (the text after `prefix`), its groups
/// expanded (`{a::{b, c}, d}` → `a::b`, `a::c`, `d`).
fn use_paths(prefix: &str, rest: &str) -> Vec<String> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let path: String = rest.chars().take_while(|c| ident(*c)).collect();
    let Some(group) = rest[path.len()..].strip_prefix('{') else {
        return vec![format!("{prefix}{path}")];
    };
    let prefix = format!("{prefix}{path}");
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (j, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                out.extend(use_paths(&prefix, group[start..j].trim_start()));
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.extend(use_paths(&prefix, group[start..j].trim_start()));
                start = j + 1;
            }
            _ => {}
        }
    }
    out
}

/// The lb-ebpf modules `code` (of module `me`: `xdp`, `v6::xdp`, `v6` for `v6/mod.rs`)
/// names through `crate::` paths (and `super::` in `v6/`), each resolved to the longest
/// module it names (`crate::v6::xdp::xdp` → `v6::xdp`, `crate::{nat::BOTH, v6::{maps::X}}`
/// → `nat`, `v6::maps`).
fn ebpf_imports(me: &str, code: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let resolve = |path: &str| -> Option<String> {
        let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
        (1..=segs.len().min(2))
            .rev()
            .map(|n| segs[..n].join("::"))
            .find(|m| known.contains(m))
    };
    for (prefix, base) in [("crate::", ""), ("super::", "v6::")] {
        if prefix == "super::" && !me.starts_with("v6::") {
            continue;
        }
        for (i, _) in code.match_indices(prefix) {
            if code[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
                continue;
            }
            for full in use_paths(base, &code[i + prefix.len()..]) {
                if let Some(m) = resolve(&full).or_else(|| resolve(base)) {
                    out.insert(m);
                }
            }
        }
    }
    out.remove(me);
    out
}

/// lb-ebpf's modules and what each imports.
fn ebpf_graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = ebpf_src();
    let mut files = BTreeMap::new();
    sources(&root, &root, &mut files);
    let module = |file: &str| {
        let m = file.trim_end_matches(".rs").replace('/', "::");
        m.strip_suffix("::mod").map_or(m.clone(), str::to_string)
    };
    let known: BTreeSet<String> = files.keys().map(|f| module(f)).collect();
    files
        .iter()
        .map(|(f, code)| {
            let me = module(f);
            let imports = ebpf_imports(&me, code, &known);
            (me, imports)
        })
        .collect()
}

/// The import circles of `graph`: its strongly connected components of more than one
/// module (Kosaraju).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    fn visit<'a>(
        v: &'a str,
        g: &'a BTreeMap<String, BTreeSet<String>>,
        seen: &mut BTreeSet<&'a str>,
        out: &mut Vec<&'a str>,
    ) {
        if !seen.insert(v) {
            return;
        }
        for w in g.get(v).into_iter().flatten() {
            visit(w, g, seen, out);
        }
        out.push(v);
    }
    let mut reversed: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, bs) in graph {
        for b in bs {
            reversed.entry(b.clone()).or_default().insert(a.clone());
        }
    }
    let (mut seen, mut order) = (BTreeSet::new(), Vec::new());
    for v in graph.keys() {
        visit(v, graph, &mut seen, &mut order);
    }
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for v in order.into_iter().rev() {
        if assigned.contains(v) {
            continue;
        }
        let mut comp = Vec::new();
        visit(v, &reversed, &mut assigned, &mut comp);
        if comp.len() > 1 {
            out.push(comp.into_iter().map(str::to_string).collect());
        }
    }
    out
}

#[test]
fn ebpf_modules_import_in_no_circle_and_ipv4_leaves_never_import_ipv6() {
    let graph = ebpf_graph();
    assert!(
        graph.len() > 30,
        "lb-ebpf's modules are read: {:?}",
        graph.keys()
    );
    assert!(
        graph["xdp"].contains("nat"),
        "the import parser sees `crate::{{…}}` groups"
    );
    assert!(
        graph["v6::family"].contains("v6::dsr"),
        "the import parser sees `super::` paths"
    );
    let found = circles(&graph);
    assert!(found.is_empty(), "import circles in lb-ebpf: {found:?}");
    // Only the program entries (which dispatch by the Ethernet type), the work area (each
    // family's part) and the family module (each family's types) name the IPv6 leaves.
    for (module, imports) in &graph {
        if module.starts_with("v6") || ["main", "work", "family"].contains(&module.as_str()) {
            continue;
        }
        let v6: Vec<&String> = imports.iter().filter(|m| m.starts_with("v6")).collect();
        assert!(v6.is_empty(), "{module} imports IPv6 modules {v6:?}");
    }
}

/// The hooks' one flows, generic over `family::Family`, and the steps they share.
const GENERIC_FLOWS: [&str; 11] = [
    "ingress",
    "egress",
    "xdp",
    "out_dnat",
    "flow",
    "translate",
    "conntrack",
    "icmp",
    "reject",
    "quote",
    "dsr",
];

/// What only a family's leaf may name: its parsed tuple, its entries and scratch, its
/// header parse and rewrite.
const FAMILY_TYPES: [&str; 9] = [
    "Tuple6",
    "CtValue6",
    "CtKey6",
    "FlowScratch6",
    "Work6",
    "parse::Tuple",
    "parse::{",
    "Parsed::",
    "nat::apply",
];

#[test]
fn each_hook_is_one_generic_flow_and_the_family_leaves_are_apart() {
    let graph = ebpf_graph();
    for module in ["v4", "v6::family", "ingress", "egress", "xdp", "out_dnat"] {
        assert!(graph.contains_key(module), "lb-ebpf has a module {module}");
    }
    for (module, imports) in &graph {
        // A family's leaves never import the other family's.
        if module.starts_with("v6") {
            assert!(
                !imports.contains("v4"),
                "{module} (IPv6's leaf) imports IPv4's leaf"
            );
        }
        if module == "v4" {
            let v6: Vec<&String> = imports.iter().filter(|m| m.starts_with("v6")).collect();
            assert!(v6.is_empty(), "v4 (IPv4's leaf) imports {v6:?}");
        }
        // Only the program entries dispatch to IPv4's leaf.
        if module != "main" {
            assert!(
                !imports.contains("v4"),
                "{module} imports v4: only the entries (main.rs) reach a family's leaf"
            );
        }
    }
    let root = ebpf_src();
    let mut files = BTreeMap::new();
    sources(&root, &root, &mut files);
    for flow in GENERIC_FLOWS {
        let code = &files[&format!("{flow}.rs")];
        for ty in FAMILY_TYPES {
            assert!(
                !code.contains(ty),
                "{flow}.rs names {ty}: a hook's flow is generic over `Family`, the family's \
                 code belongs in its leaf (v4.rs, v6/)"
            );
        }
    }
    for hook in ["ingress", "egress", "xdp", "out_dnat"] {
        let code = &files[&format!("{hook}.rs")];
        assert!(
            code.contains("pub fn flow<F: Family>(")
                || code.contains("pub fn flow<'a, F: Family>("),
            "{hook}.rs: the hook's one flow is `pub fn flow<F: Family>`"
        );
    }
}

/// IPv6's leaves (`lb-ebpf/src/v6/`), in lines of code (comments and blank lines apart): a
/// ratchet, lowered as more of what they hold becomes the families' one code (the aim of
/// issue 40: under 800).
const V6_LINES_AT_MOST: usize = 506;

#[test]
fn ipv6_leaves_do_not_grow_back() {
    let root = ebpf_src();
    let mut files = BTreeMap::new();
    sources(&root, &root.join("v6"), &mut files);
    let lines: usize = files
        .values()
        .map(|code| code.lines().filter(|l| !l.trim().is_empty()).count())
        .sum();
    assert!(
        lines <= V6_LINES_AT_MOST,
        "lb-ebpf/src/v6/ has {lines} lines of code, at most {V6_LINES_AT_MOST}: write it once \
         for both families (generic over `family::Family`), with only the IPv6 header's own \
         code in the leaf"
    );
}

#[test]
fn the_circle_finder_sees_a_circle() {
    let g: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
        .iter()
        .map(|(a, b)| (a.to_string(), BTreeSet::from([b.to_string()])))
        .collect();
    let found = circles(&g);
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0],
        BTreeSet::from(["a".into(), "b".into(), "c".into()])
    );
}

#[test]
fn the_ebpf_import_parser_expands_nested_groups() {
    assert_eq!(
        use_paths("", "{a::{b, c::D}, d};"),
        ["a::b", "a::c::D", "d"]
    );
    let known: BTreeSet<String> = ["xdp", "v6", "v6::maps", "nat"].map(String::from).into();
    let got = ebpf_imports(
        "v6::xdp",
        "use super::{maps::X, nat};\nuse crate::{nat::BOTH, xdp::{Hop, Way}};",
        &known,
    );
    assert_eq!(
        got,
        ["nat", "v6", "v6::maps", "xdp"].map(String::from).into()
    );
}

/// The longest a function of `lb-userspace` may be, in lines from its `fn` line to its
/// closing brace (comments and blank lines inside count; test code too).
const FN_MAX_LINES: usize = 100;

/// `code` with its comments, string and character literals blanked (each newline kept, so
/// line numbers hold): what is left of the braces is the code's.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    // The bytes of `b[from..to]` as blanks, but for the newlines.
    let blank = |out: &mut String, from: usize, to: usize| {
        out.extend(b[from..to].iter().filter(|&&c| c == b'\n').map(|_| '\n'));
    };
    while i < b.len() {
        let rest = &text[i..];
        let after_ident = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            let end = rest.find("*/").map_or(rest.len(), |e| e + 2);
            blank(&mut out, i, i + end);
            i += end;
        } else if !after_ident
            && let Some(hashes) = rest
                .strip_prefix("br")
                .or_else(|| rest.strip_prefix('r'))
                .map(|r| r.len() - r.trim_start_matches('#').len())
                .filter(|&h| {
                    rest[rest.len() - rest.trim_start_matches(['b', 'r', '#']).len()..]
                        .starts_with('"')
                        && h < 8
                })
        {
            let open = rest.find('"').unwrap_or(0) + 1;
            let close = format!("\"{}", "#".repeat(hashes));
            let end = rest[open..]
                .find(&close)
                .map_or(rest.len(), |e| open + e + close.len());
            out.push_str("\"\"");
            blank(&mut out, i, i + end);
            i += end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            blank(&mut out, i, (j + 1).min(b.len()));
            i = j + 1;
        } else if b[i] == b'\'' {
            // A character literal ('x', '\n', '\u{7b}'), or a lifetime (left as it is).
            let len = match (b.get(i + 1), rest[1..].find('\'')) {
                (Some(b'\\'), Some(e)) => e + 2,
                (Some(_), _) => {
                    let c = rest[1..].chars().next().map_or(1, char::len_utf8);
                    if rest[1 + c..].starts_with('\'') {
                        c + 2
                    } else {
                        1
                    }
                }
                _ => 1,
            };
            out.push_str(if len > 1 { "' '" } else { "'" });
            i += len;
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// Each function with a body in `code` (as [`code_only`] leaves it): its name, its first
/// line (1-based) and its length in lines, from the `fn` line to the closing brace.
fn function_lengths(code: &str) -> Vec<(String, usize, usize)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(found) = code[at..].find("fn ") {
        let start = at + found;
        at = start + 3;
        if start > 0 && (b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_') {
            continue;
        }
        let name: String = code[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        // The body's `{` (a `;` first: a declaration without one), past the signature's
        // brackets.
        let mut depth = 0i32;
        let mut body = None;
        for (k, c) in code[at..].char_indices() {
            match c {
                '(' | '[' => depth += 1,
                ')' | ']' => depth -= 1,
                '{' if depth == 0 => {
                    body = Some(at + k);
                    break;
                }
                ';' if depth == 0 => break,
                _ => {}
            }
        }
        let Some(open) = body else { continue };
        let mut depth = 0usize;
        let mut close = code.len();
        for (k, c) in code[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = open + k;
                        break;
                    }
                }
                _ => {}
            }
        }
        let first = code[..start].matches('\n').count() + 1;
        let last = code[..close].matches('\n').count() + 1;
        out.push((name, first, last - first + 1));
    }
    out
}

#[test]
fn no_function_of_the_agent_crate_is_over_100_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../lb-userspace/src");
    let mut paths = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).expect("read a source directory") {
            let path = entry.expect("dir entry").path();
            match path.is_dir() {
                true => dirs.push(path),
                false if path.extension().is_some_and(|e| e == "rs") => paths.push(path),
                false => {}
            }
        }
    }
    assert!(paths.len() > 50, "lb-userspace's sources are read");
    let mut long = Vec::new();
    for path in &paths {
        let text = fs::read_to_string(path).expect("read a source file");
        for (name, line, len) in function_lengths(&code_only(&text)) {
            if len > FN_MAX_LINES {
                let rel = path.strip_prefix(&root).expect("under src").display();
                long.push(format!("{rel}:{line}: fn {name} is {len} lines"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {FN_MAX_LINES} lines (split them into steps that read in one sitting):\n{}",
        long.join("\n")
    );
}

#[test]
fn the_function_length_check_sees_braces_of_code_only() {
    let code = "fn a() {\n    let s = \"}}}\";\n    let c = '}';\n    // }\n    /* }\n */\n    let r = r#\"}\"#;\n}\n\nfn b<'x>(v: &'x [u8; 2]) -> u8 where u8: Copy { v[0] }\ntrait T { fn c(&self); }\n";
    let got = function_lengths(&code_only(code));
    assert_eq!(
        got,
        [("a".to_string(), 1, 8), ("b".to_string(), 10, 1)],
        "{}",
        code_only(code)
    );
}

#[test]
fn only_the_sys_module_calls_bpf_directly() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../lb-userspace/src");
    let mut files = BTreeMap::new();
    sources(&root, &root, &mut files);
    let direct: Vec<&String> = files
        .iter()
        .filter(|(name, code)| name.as_str() != "datapath/sys_bpf.rs" && code.contains("SYS_bpf"))
        .map(|(name, _)| name)
        .collect();
    assert!(
        direct.is_empty(),
        "raw bpf(2) outside datapath/sys_bpf.rs (add a method to its `Bpf` trait, and to the fake): {direct:?}"
    );
}
