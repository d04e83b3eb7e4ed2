//! The watched Services and EndpointSlices as the watch decodes them: read as
//! [`crate::source::objects`] reads them, and an object whose fields the proxy reads cannot
//! be read still decodes, as [`Decoded::Undecodable`] with its name and why. A watch event
//! that failed to decode was lost, and the watch backed off, delaying every later event of
//! its kind; now the event arrives, the object is reported by name and skipped, and the
//! watch goes on.

use std::borrow::Cow;

use k8s_openapi::{NamespaceResourceScope, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use serde::{Deserialize, Deserializer, de::DeserializeOwned};
use serde_json::Value;

use crate::source::{SourceError, objects};

/// A watched kind: its API coordinates and metadata.
pub trait Kind: DeserializeOwned {
    const KIND: &'static str;
    const GROUP: &'static str;
    const VERSION: &'static str;
    const PLURAL: &'static str;
    fn meta(&self) -> &ObjectMeta;
    fn meta_mut(&mut self) -> &mut ObjectMeta;
}

impl Kind for objects::Service {
    const KIND: &'static str = "Service";
    const GROUP: &'static str = "";
    const VERSION: &'static str = "v1";
    const PLURAL: &'static str = "services";
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl Kind for objects::EndpointSlice {
    const KIND: &'static str = "EndpointSlice";
    const GROUP: &'static str = "discovery.k8s.io";
    const VERSION: &'static str = "v1";
    const PLURAL: &'static str = "endpointslices";
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// An object of kind `T`, or what could be read of one that could not be decoded (rare:
/// the object is not boxed, which would cost every object an allocation).
#[derive(Clone, Debug, PartialEq)]
#[allow(clippy::large_enum_variant)]
pub enum Decoded<T> {
    Object(T),
    Undecodable {
        /// Its name, namespace and resourceVersion, as far as they are strings.
        metadata: ObjectMeta,
        /// The field that failed and why (`spec.ports[0].port: invalid type: ...`).
        reason: String,
    },
}

impl<T: Kind> Decoded<T> {
    /// The object, or the error that names it and says why it cannot be read.
    pub fn object(&self) -> Result<&T, SourceError> {
        match self {
            Decoded::Object(t) => Ok(t),
            Decoded::Undecodable { metadata, reason } => Err(SourceError::Undecodable {
                kind: T::KIND,
                object: format!(
                    "{}/{}",
                    metadata.namespace.as_deref().unwrap_or("default"),
                    metadata.name.as_deref().unwrap_or("?")
                ),
                reason: reason.clone(),
            }),
        }
    }
}

impl<'de, T: Kind> Deserialize<'de> for Decoded<T> {
    /// Never fails on a JSON object: what the proxy cannot read of it becomes
    /// [`Decoded::Undecodable`].
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(d)?;
        Ok(match serde_path_to_error::deserialize::<_, T>(&value) {
            Ok(t) => Decoded::Object(t),
            Err(e) => Decoded::Undecodable {
                metadata: lenient_meta(&value),
                reason: format!("{}: {}", e.path(), e.inner()),
            },
        })
    }
}

/// The name, namespace and resourceVersion of an object, those that are strings.
fn lenient_meta(value: &Value) -> ObjectMeta {
    let field = |k: &str| {
        value
            .get("metadata")
            .and_then(|m| m.get(k))
            .and_then(Value::as_str)
            .map(String::from)
    };
    ObjectMeta {
        name: field("name"),
        namespace: field("namespace"),
        resource_version: field("resourceVersion"),
        ..ObjectMeta::default()
    }
}

impl<T: Kind> kube::Resource for Decoded<T> {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        T::KIND.into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        T::GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        T::VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        T::PLURAL.into()
    }
    fn meta(&self) -> &ObjectMeta {
        match self {
            Decoded::Object(t) => t.meta(),
            Decoded::Undecodable { metadata, .. } => metadata,
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Decoded::Object(t) => t.meta_mut(),
            Decoded::Undecodable { metadata, .. } => metadata,
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::{Resource, core::WatchEvent};
    use serde_json::json;

    use super::*;

    type Service = Decoded<objects::Service>;

    #[test]
    fn an_odd_service_decodes_and_a_bad_one_is_named_with_its_field() {
        let line = json!({"type": "MODIFIED", "object": {
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "ns", "name": "odd", "resourceVersion": "12"},
            "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}], "newField": 1},
            "status": {"conditions": [{"type": "X", "status": "True", "lastTransitionTime": null}]},
        }})
        .to_string();
        let ev: WatchEvent<Service> = serde_json::from_str(&line).expect("decodes");
        let WatchEvent::Modified(Decoded::Object(svc)) = ev else {
            panic!("{ev:?}")
        };
        assert_eq!(svc.metadata.name.as_deref(), Some("odd"));

        let line = json!({"type": "ADDED", "object": {
            "metadata": {"namespace": "ns", "name": "bad", "resourceVersion": "13"},
            "spec": {"ports": [{"port": "eighty"}]},
        }})
        .to_string();
        let ev: WatchEvent<Service> = serde_json::from_str(&line).expect("decodes");
        let WatchEvent::Added(bad) = ev else {
            panic!("{ev:?}")
        };
        assert_eq!(bad.meta().resource_version.as_deref(), Some("13"));
        let e = bad.object().expect_err("cannot be read").to_string();
        assert!(
            e.contains("Service ns/bad") && e.contains("spec.ports[0].port"),
            "{e}"
        );
    }

    #[test]
    fn the_kinds_are_where_the_api_serves_them() {
        assert_eq!(Service::url_path(&(), None), "/api/v1/services");
        assert_eq!(
            Decoded::<objects::EndpointSlice>::url_path(&(), None),
            "/apis/discovery.k8s.io/v1/endpointslices"
        );
    }
}
