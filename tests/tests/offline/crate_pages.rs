//! Every crate's page (its README.md) names each of its source files (`src/….rs`), so a
//! page cannot fall behind the code unseen: a module added, moved or renamed without a word
//! on its page fails here. The tests crate's test binaries (`tests/tests/`) are named as
//! their page lists them: a one-file binary by its file (`faults.rs`), a folder's files by
//! their path in it (`kubernetes/follow.rs`), or by the folder (`kubernetes/`) and the
//! module's name in backticks (`` `follow` ``); a folder's `main.rs` or `mod.rs` by the
//! folder.

use std::path::{Path, PathBuf};

/// The crates with a page, and the source folders each page answers for.
const CRATES: [(&str, &[&str]); 6] = [
    ("lb-common", &["src"]),
    ("lb-ebpf", &["src"]),
    ("lb-userspace", &["src"]),
    ("xlb-lab", &["src"]),
    ("tests", &["src", "tests"]),
    ("xtask", &["src"]),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Whether `page` names the file at `rel` (relative to its crate).
fn named(page: &str, rel: &str) -> bool {
    if page.contains(rel) {
        return true;
    }
    // A test binary's file, named as the tests crate's page lists them.
    let Some(test) = rel.strip_prefix("tests/") else {
        return false;
    };
    if page.contains(test) {
        return true;
    }
    let Some((folder, _)) = test.split_once('/') else {
        return false;
    };
    let stem = test
        .rsplit('/')
        .next()
        .unwrap_or(test)
        .trim_end_matches(".rs");
    page.contains(&format!("{folder}/"))
        && (stem == "main"
            || stem == "mod"
            || page.contains(&format!("`{stem}`"))
            || page.contains(&format!("`{stem}.rs`")))
}

#[test]
fn every_source_file_is_named_on_its_crates_page() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut missing = Vec::new();
    for (krate, dirs) in CRATES {
        let dir = root.join(krate);
        let page = std::fs::read_to_string(dir.join("README.md"))
            .unwrap_or_else(|e| panic!("{krate}/README.md: {e}"));
        let mut files = Vec::new();
        for d in dirs {
            rust_files(&dir.join(d), &mut files);
        }
        assert!(!files.is_empty(), "{krate}: no source files found");
        for f in files {
            let rel = f
                .strip_prefix(&dir)
                .expect("below the crate")
                .to_string_lossy()
                .into_owned();
            if !named(&page, &rel) {
                missing.push(format!("{krate}: {rel}"));
            }
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "source files no crate page names ({}):\n{}",
        missing.len(),
        missing.join("\n")
    );
}
