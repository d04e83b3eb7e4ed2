//! Label and field selectors as the API server parses them: `k`, `!k`, `k=v`, `k==v`,
//! `k!=v`, comma-separated (all must hold). Field selectors take `metadata.name` and
//! `metadata.namespace`; any other field is refused (400), as the real server refuses a
//! field it does not index.

use serde_json::Value;

use super::status::Status;

#[derive(Clone, Debug, PartialEq)]
enum Requirement {
    Exists(String),
    Absent(String),
    Equals(String, String),
    Differs(String, String),
}

impl Requirement {
    fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let valid_key = |k: &str| !k.is_empty() && !k.contains(['=', '!', ' ', '(', ')']);
        let req = if let Some(k) = text.strip_prefix('!') {
            Requirement::Absent(k.to_string())
        } else if let Some((k, v)) = text.split_once("!=") {
            Requirement::Differs(k.to_string(), v.to_string())
        } else if let Some((k, v)) = text.split_once("==").or_else(|| text.split_once('=')) {
            Requirement::Equals(k.to_string(), v.to_string())
        } else {
            Requirement::Exists(text.to_string())
        };
        if valid_key(req.key()) {
            Ok(req)
        } else {
            Err(format!("unable to parse requirement: {text:?}"))
        }
    }

    fn key(&self) -> &str {
        match self {
            Requirement::Exists(k)
            | Requirement::Absent(k)
            | Requirement::Equals(k, _)
            | Requirement::Differs(k, _) => k,
        }
    }

    /// Does the requirement hold for `value` (the label or field, if the object has it)?
    fn holds(&self, value: Option<&str>) -> bool {
        match self {
            Requirement::Exists(_) => value.is_some(),
            Requirement::Absent(_) => value.is_none(),
            Requirement::Equals(_, v) => value == Some(v.as_str()),
            Requirement::Differs(_, v) => value != Some(v.as_str()),
        }
    }
}

/// A request's label and field selectors.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Selector {
    labels: Vec<Requirement>,
    fields: Vec<Requirement>,
}

const FIELDS: [&str; 2] = ["metadata.name", "metadata.namespace"];

fn parse_all(text: &str) -> Result<Vec<Requirement>, String> {
    text.split(',')
        .filter(|r| !r.trim().is_empty())
        .map(Requirement::parse)
        .collect()
}

impl Selector {
    /// Parses `labelSelector` and `fieldSelector`; a malformed one is a 400.
    pub fn parse(labels: &str, fields: &str) -> Result<Self, Status> {
        let labels = parse_all(labels).map_err(Status::bad_request)?;
        let fields = parse_all(fields).map_err(Status::bad_request)?;
        if let Some(f) = fields.iter().find(|f| !FIELDS.contains(&f.key())) {
            return Err(Status::bad_request(format!(
                "field label not supported: {}",
                f.key()
            )));
        }
        if fields
            .iter()
            .any(|f| matches!(f, Requirement::Exists(_) | Requirement::Absent(_)))
        {
            return Err(Status::bad_request(
                "field selectors take only = , == and !=".to_string(),
            ));
        }
        Ok(Selector { labels, fields })
    }

    /// True when the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let meta = &obj["metadata"];
        let labels = &meta["labels"];
        self.labels
            .iter()
            .all(|r| r.holds(labels.get(r.key()).and_then(Value::as_str)))
            && self.fields.iter().all(|r| {
                let field = r.key().strip_prefix("metadata.").unwrap_or(r.key());
                // An object without a namespace (a Node) has the empty one.
                r.holds(Some(meta[field].as_str().unwrap_or("")))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sel(labels: &str, fields: &str) -> Selector {
        Selector::parse(labels, fields).expect("selector")
    }

    #[test]
    fn label_and_field_selectors() {
        let obj = json!({"metadata": {"name": "n1", "labels": {"a": "1"}}});
        assert!(sel("a=1,!b", "").matches(&obj));
        assert!(sel("a==1", "").matches(&obj));
        assert!(!sel("!a", "").matches(&obj));
        assert!(sel("", "metadata.name=n1").matches(&obj));
        assert!(!sel("", "metadata.name=n2").matches(&obj));
        assert!(sel("", "metadata.namespace=").matches(&obj));
        assert!(sel("a!=2", "").matches(&obj));
        assert!(sel("", "").is_empty());
    }

    #[test]
    fn kube_proxy_selector() {
        let s = sel(
            "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless",
            "",
        );
        assert!(s.matches(&json!({"metadata": {"name": "web"}})));
        assert!(!s.matches(
            &json!({"metadata": {"name": "web", "labels": {"service.kubernetes.io/headless": ""}}})
        ));
    }

    #[test]
    fn refuses_what_the_server_refuses() {
        assert_eq!(
            Selector::parse("", "spec.clusterIP=1.2.3.4")
                .map(|_| ())
                .map_err(|s| s.code),
            Err(400)
        );
        assert!(Selector::parse("a=1,=b", "").is_err());
    }
}
