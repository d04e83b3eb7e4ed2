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
    }
}
