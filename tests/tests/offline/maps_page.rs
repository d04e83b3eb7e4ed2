//! docs/maps.md's catalogue of pinned maps is rendered from `lb_common::catalog::MAP_DEFS`,
//! the one list kernel and agent share: a map added, renamed or resized there and not on the
//! page fails here. `XLB_BLESS=1` rewrites the page's table.

use lb_common::catalog::{MAP_DEFS, MapDef, kind_name};

const BEGIN: &str =
    "<!-- maps:begin (rendered from lb_common::catalog::MAP_DEFS; XLB_BLESS=1 rewrites it) -->\n";
const END: &str = "<!-- maps:end -->\n";

/// `n` with a comma between thousands, as the page writes sizes.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn row(m: &MapDef) -> String {
    let d = &m.doc;
    format!(
        "| `{}` | {}{} | {} | {} | {} B → {} B, {} |\n",
        m.name,
        kind_name(m.kind),
        d.kind_note,
        d.what,
        d.writer,
        thousands(m.key_size),
        thousands(m.value_size),
        d.capacity
    )
}

fn table() -> String {
    let mut t =
        String::from("| map | type | key → value | written by | size |\n|---|---|---|---|---|\n");
    for m in &MAP_DEFS {
        t.push_str(&row(m));
    }
    t
}

#[test]
fn the_maps_page_is_rendered_from_the_catalogue() {
    for m in &MAP_DEFS {
        for (field, text) in [
            ("what", m.doc.what),
            ("writer", m.doc.writer),
            ("capacity", m.doc.capacity),
        ] {
            assert!(
                !text.is_empty(),
                "{}: no {field} in lb_common::catalog",
                m.name
            );
        }
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/maps.md");
    let page = std::fs::read_to_string(&path).expect("docs/maps.md");
    let (Some(b), Some(e)) = (page.find(BEGIN), page.find(END)) else {
        panic!("docs/maps.md has no {BEGIN:?} … {END:?} section");
    };
    let current = &page[b + BEGIN.len()..e];
    let want = table();
    if std::env::var_os("XLB_BLESS").is_some() {
        let new = format!("{}{BEGIN}{want}{}", &page[..b], &page[e..]);
        std::fs::write(&path, new).expect("write docs/maps.md");
        return;
    }
    assert_eq!(
        current, want,
        "docs/maps.md's table differs from lb_common::catalog (XLB_BLESS=1 rewrites it)"
    );
}

#[test]
fn sizes_are_written_with_thousands() {
    assert_eq!(thousands(16), "16");
    assert_eq!(thousands(32_776), "32,776");
    assert_eq!(thousands(1_048_576), "1,048,576");
}
