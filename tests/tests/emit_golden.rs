//! Golden output of the emitters that have no upstream conformance cases (userspace mode).
//! `XLB_BLESS=1` rewrites the golden files.

use std::path::Path;

use lb_userspace::{
    emit::{self, Mode},
    model::NodeSettings,
    source::file,
};

fn golden(mode: Mode, input: &str, expected: &str) {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let loaded = file::load(&fixtures.join(input)).unwrap_or_else(|e| panic!("{e}"));
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    let node = NodeSettings {
        node_name: "node-1".into(),
        node_ips: vec!["10.0.0.5".parse().expect("ip")],
        ..NodeSettings::default()
    };
    let got = emit::render(mode, &loaded.model, &node, &emit::Options::default());
    let path = fixtures.join(expected);
    if std::env::var_os("XLB_BLESS").is_some() {
        std::fs::write(&path, &got).expect("bless");
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with XLB_BLESS=1 to create it)",
            path.display()
        )
    });
    assert_eq!(got, want, "golden mismatch for {}", path.display());
}

#[test]
fn golden_userspace() {
    golden(Mode::Userspace, "userspace.yaml", "userspace.emit.txt");
}
