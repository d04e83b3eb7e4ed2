//! `metav1.Status` failures, as the API server sends them: the HTTP status of a refused
//! request, or the object of a watch `ERROR` event.

use serde_json::{Value, json};

/// A failure: its code, reason and message, and what some reasons carry.
#[derive(Clone, Debug, PartialEq)]
pub struct Status {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// `details` (e.g. `retryAfterSeconds`).
    pub details: Option<Value>,
    /// `metadata.continue` of an expired continue token: the inconsistent continuation.
    pub continue_token: Option<String>,
    /// The `Retry-After` header, in seconds.
    pub retry_after: Option<u32>,
}

impl Status {
    fn new(code: u16, reason: &'static str, message: String) -> Self {
        Status {
            code,
            reason,
            message,
            details: None,
            continue_token: None,
            retry_after: None,
        }
    }

    pub fn bad_request(message: String) -> Self {
        Status::new(400, "BadRequest", message)
    }

    pub fn not_found(path: &str) -> Self {
        Status::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// 404 for a named object (`events.events.k8s.io "x" not found`).
    pub fn not_found_named(message: String) -> Self {
        Status::new(404, "NotFound", message)
    }

    /// 409: a create of a name that exists.
    pub fn already_exists(message: String) -> Self {
        Status::new(409, "AlreadyExists", message)
    }

    /// 415: a patch type the resource does not take.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Status::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {content_type})"
            ),
        )
    }

    pub fn method_not_allowed(method: &str) -> Self {
        Status::new(
            405,
            "MethodNotAllowed",
            format!("{method} is not supported by this test server"),
        )
    }

    /// 410 Gone: the history a request needs was compacted.
    pub fn expired(message: String) -> Self {
        Status::new(410, "Expired", message)
    }

    /// 422: options the server refuses together.
    pub fn invalid(message: String) -> Self {
        Status::new(422, "Invalid", message)
    }

    /// 504: a resourceVersion newer than the server's.
    pub fn too_large(rv: u64, current: u64) -> Self {
        Status::new(
            504,
            "Timeout",
            format!("Too large resource version: {rv}, current: {current}"),
        )
    }

    /// 403 for `verb` on `resource` (missing RBAC).
    pub fn forbidden(verb: &str, resource: &str, group: &str) -> Self {
        let mut s = Status::new(
            403,
            "Forbidden",
            format!(
                "{resource} is forbidden: User \"system:serviceaccount:kube-system:xlb\" cannot {verb} resource \"{resource}\" in API group \"{group}\" at the cluster scope"
            ),
        );
        s.details = Some(json!({"group": group, "kind": resource}));
        s
    }

    /// 429 with `Retry-After` (API priority and fairness rejecting a request).
    pub fn too_many_requests(retry_after: u32) -> Self {
        let mut s = Status::new(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.".to_string(),
        );
        s.details = Some(json!({"retryAfterSeconds": retry_after}));
        s.retry_after = Some(retry_after);
        s
    }

    pub fn internal_error() -> Self {
        Status::new(
            500,
            "InternalError",
            "Internal error occurred: injected by the test API server".to_string(),
        )
    }

    pub fn service_unavailable() -> Self {
        Status::new(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request".to_string(),
        )
    }

    /// The Status object.
    pub fn body(&self) -> Value {
        let mut metadata = json!({});
        if let Some(c) = &self.continue_token {
            metadata["continue"] = json!(c);
        }
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": metadata,
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}
