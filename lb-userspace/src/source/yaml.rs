//! YAML as the sources read it, through serde-saphyr with YAML 1.2's core schema: `n`, `no`,
//! `on`, `0755` and `1_000` stay strings in untyped data (as serde_yaml read them; a
//! namespace called `n` is a name, not `false`), and a budget bounds what a hostile document
//! (alias bombs, deep nesting) can make the parser do.

use serde::de::DeserializeOwned;

/// The parser's options: YAML 1.2 core booleans, numbers only where YAML 1.2 sees them.
fn options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
    }
}

/// Every document of a multi-document text, as plain data (a Kubernetes object is JSON's
/// data model); empty documents are `Null`.
pub fn documents(text: &str) -> Result<Vec<serde_json::Value>, serde_saphyr::Error> {
    serde_saphyr::from_multiple_with_options(text, options())
}

/// One document decoded into `T`.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, serde_saphyr::Error> {
    serde_saphyr::from_str_with_options(text, options())
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
}
