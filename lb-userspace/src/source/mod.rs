//! Sources: translate what they read (Kubernetes objects) into the [`crate::model::Model`].

pub mod convert;
pub mod events;
pub mod file;
pub mod kube;
pub mod objects;
pub mod testconfig;
pub mod yaml;

use thiserror::Error;

use crate::model::Model;

/// Everything a source holds at one moment (a read of the file, a complete list of the API
/// server's objects): the model of every object that was valid, the errors of those that
/// were not, and what was ignored on purpose.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub model: Model,
    pub errors: Vec<SourceError>,
    pub ignored: Vec<String>,
    /// The `kind: TestConfig` header of a kube-proxy conformance case, when the file has one.
    pub test_config: Option<testconfig::TestConfig>,
}

/// An object a source could not take, named so a user can find and fix it.
#[derive(Debug, Error)]
pub enum SourceError {
    #[error("{path}: cannot read: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not valid YAML: {source}")]
    Yaml {
        path: String,
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    /// A document whose fields have the wrong types (`port: "eighty"`); only it is left out.
    #[error("{path}: document {index}: {kind} {object}: {field}: cannot decode: {source}")]
    Decode {
        path: String,
        index: usize,
        kind: String,
        /// `namespace/name` as far as the document says.
        object: String,
        /// Where in the document (`spec.ports[0].port`).
        field: String,
        #[source]
        source: serde_json::Error,
    },
    /// A watched object a field of which the proxy reads could not be decoded: it is
    /// skipped, the watch goes on.
    #[error("{kind} {object}: cannot decode: {reason}; skipped")]
    Undecodable {
        kind: &'static str,
        object: String,
        reason: String,
    },
    #[error("{kind} {object}: {field} {value:?} is invalid: {reason}")]
    Invalid {
        kind: &'static str,
        object: String,
        field: String,
        value: String,
        reason: String,
    },
}
