//! YAML as the sources read it, through serde-saphyr with YAML 1.2's core schema: `n`, `no`,
//! `on`, `0755` and `1_000` stay strings in untyped data (as serde_yaml read them; a
//! namespace called `n` is a name, not `false`), and a budget bounds what a hostile document
//! (alias bombs, deep nesting) can make the parser do.

use serde::de::DeserializeOwned;

/// The parser's options for `text`: YAML 1.2 core booleans, numbers only where YAML 1.2 sees
/// them. The budget keeps serde-saphyr's limits on what multiplies work (aliases, anchors,
/// nesting depth) and lets the counts that only grow with the text (documents, events,
/// nodes, scalar bytes) grow with it: a file of 100,000 Services is 200,000 documents, and
/// nothing in it can cost more than its own length.
fn options(text: &str) -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    let len = text.len();
    budget.max_documents = budget.max_documents.max(len);
    budget.max_events = budget.max_events.max(len);
    budget.max_nodes = budget.max_nodes.max(len);
    budget.max_total_scalar_bytes = budget.max_total_scalar_bytes.max(len);
    serde_saphyr::options! {
        budget: Some(budget),
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
    }
}

/// Every document of a multi-document text, as plain data (a Kubernetes object is JSON's
/// data model); empty documents are `Null`.
pub fn documents(text: &str) -> Result<Vec<serde_json::Value>, serde_saphyr::Error> {
    serde_saphyr::from_multiple_with_options(text, options(text))
}

/// Every document of a multi-document text, read one at a time and handed to `each`
/// (empty documents skipped) before the next is read, so only one document's plain data
/// exists at once: the whole stream as plain data first ([`documents`]) took 250 MiB for a
/// 10 MB file of 10,000 Services × 10 endpoints, and the objects built from it while it was
/// freed were scattered among its pages, which glibc could not give back (the agent's RSS
/// 184 MiB against 70 streamed). The same options; the budget is counted per document (the
/// text is in memory already, so no cap on its bytes). The first error ends the read and is
/// returned; the documents before it were handed over.
pub fn each_document(
    text: &str,
    mut each: impl FnMut(serde_json::Value),
) -> Result<(), serde_saphyr::Error> {
    let mut options = options(text);
    if let Some(budget) = options.budget.as_mut() {
        budget.max_reader_input_bytes = None;
    }
    let mut bytes = text.as_bytes();
    for document in serde_saphyr::read_with_options(&mut bytes, options) {
        each(document?);
    }
    Ok(())
}

/// One document decoded into `T`.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, serde_saphyr::Error> {
    serde_saphyr::from_str_with_options(text, options(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_1_1_words_and_octal_like_numbers_stay_strings() {
        let docs =
            documents("a: n\nb: on\nc: 0755\nd: 1_000\ne: true\nf: 8080\n---\n").expect("yaml");
        let want = serde_json::json!({"a": "n", "b": "on", "c": "0755", "d": "1_000", "e": true, "f": 8080});
        assert_eq!(docs.first(), Some(&want));
    }

    #[test]
    fn a_file_of_many_documents_is_read_and_an_alias_bomb_is_refused() {
        let many = "a: 1\n---\n".repeat(5000);
        assert_eq!(documents(&many).expect("5,000 documents").len(), 5000);
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let p = i - 1;
            bomb.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        assert!(documents(&bomb).is_err(), "10^12 nodes from a few lines");
        assert!(
            each_document(&bomb, |_| {}).is_err(),
            "streamed too: 10^12 nodes from a few lines"
        );
    }

    #[test]
    fn documents_streamed_are_the_documents_read_whole() {
        let text = "\u{feff}a: n\nb: on\nc: 0755\n---\n---\nd: 1_000\n---\n".to_string()
            + &"kind: Service\nspec: {ports: [{port: 80}]}\n---\n".repeat(3000);
        let mut streamed = Vec::new();
        each_document(&text, |v| streamed.push(v)).expect("yaml");
        assert_eq!(streamed.len(), 3002, "empty documents skipped");
        assert_eq!(streamed, documents(&text).expect("yaml"));
    }

    #[test]
    fn a_streamed_text_that_is_not_yaml_fails_after_the_documents_before() {
        let mut seen = 0;
        let e = each_document("a: 1\n---\nb: [1, 2\n---\nc: 3\n", |_| seen += 1)
            .expect_err("unclosed sequence");
        assert_eq!(seen, 1);
        assert!(e.to_string().contains("line"), "{e}");
        let e = each_document("a: 1\n---\n{[x]: 1}\n---\nc: 3\n", |_| {})
            .expect_err("a sequence as a key is not plain data");
        assert!(e.to_string().contains("line 3"), "{e}");
        assert!(
            each_document("a: 1\na: 2\n", |_| {}).is_err(),
            "duplicate key"
        );
    }
}
