//! The watched Services and EndpointSlices as the watch decodes them: read as
//! [`crate::source::objects`] reads them, and an object whose fields the proxy reads cannot
//! be read still decodes, as [`Decoded::Undecodable`] with its name and why. A watch event
//! that failed to decode was lost, and the watch backed off, delaying every later event of
//! its kind; now the event arrives, the object is reported by name and skipped, and the
//! watch goes on.

use std::borrow::Cow;

use k8s_openapi::{NamespaceResourceScope, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use std::marker::PhantomData;

use serde::{
    Deserialize, Deserializer,
    de::{DeserializeOwned, IgnoredAny, MapAccess, Visitor},
};
use serde_json::Value;

use crate::source::{SourceError, objects};

/// A watched kind: its API coordinates, the top-level fields the proxy reads besides the
/// metadata, and its metadata.
pub trait Kind: DeserializeOwned {
    const KIND: &'static str;
    const READ: &'static [&'static str];
    const GROUP: &'static str;
    const VERSION: &'static str;
    const PLURAL: &'static str;
    fn meta(&self) -> &ObjectMeta;
    fn meta_mut(&mut self) -> &mut ObjectMeta;
}

impl Kind for objects::Service {
    const KIND: &'static str = "Service";
    const READ: &'static [&'static str] = &["spec", "status"];
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
    const READ: &'static [&'static str] = &["addressType", "endpoints", "ports"];
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
    /// [`Decoded::Undecodable`]. One pass: the fields the proxy does not read (managed
    /// fields, annotations but one, most of the status) are skipped without being stored; only
    /// the few it reads are held as JSON before they are decoded, so a wrong one can be
    /// named and the rest of the stream read on.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(ObjectVisitor(PhantomData))
    }
}

struct ObjectVisitor<T>(PhantomData<T>);

impl<'de, T: Kind> Visitor<'de> for ObjectVisitor<T> {
    type Value = Decoded<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "a {} object", T::KIND)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Decoded<T>, A::Error> {
        let mut meta = Meta::default();
        let mut read = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if key == "metadata" {
                meta = map.next_value()?;
            } else if T::READ.contains(&key.as_str()) {
                read.insert(key, map.next_value()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        let value = Value::Object(read);
        let object = match (T::deserialize(&value), meta.error.take()) {
            (Ok(mut t), None) => {
                *t.meta_mut() = meta.into_object_meta();
                return Ok(Decoded::Object(t));
            }
            (_, Some(reason)) => reason,
            // Decoded again to name the field (only an object that failed pays for it).
            (Err(e), None) => match serde_path_to_error::deserialize::<_, T>(&value) {
                Err(e) => format!("{}: {}", e.path(), e.inner()),
                Ok(_) => e.to_string(),
            },
        };
        Ok(Decoded::Undecodable {
            metadata: meta.into_object_meta(),
            reason: object,
        })
    }
}

/// An object's metadata as far as it can be read: name, namespace, resourceVersion, uid (each
/// when a string), labels (when a map of strings), of the annotations only the value of
/// [`LB_ALGORITHM_ANNOTATION`] (when a string), everything else skipped; what could not be
/// read, for the report.
///
/// [`LB_ALGORITHM_ANNOTATION`]: crate::source::convert::LB_ALGORITHM_ANNOTATION
#[derive(Default)]
struct Meta {
    name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
    uid: Option<String>,
    labels: Option<std::collections::BTreeMap<String, String>>,
    lb_algorithm: Option<String>,
    error: Option<String>,
}

impl Meta {
    fn into_object_meta(self) -> ObjectMeta {
        ObjectMeta {
            name: self.name,
            namespace: self.namespace,
            resource_version: self.resource_version,
            uid: self.uid,
            labels: self.labels,
            annotations: objects::annotations(self.lb_algorithm),
            ..ObjectMeta::default()
        }
    }
}

impl<'de> Deserialize<'de> for Meta {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(MetaVisitor)
    }
}

struct MetaVisitor;

impl<'de> Visitor<'de> for MetaVisitor {
    type Value = Meta;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("object metadata")
    }

    /// `metadata: null`: none.
    fn visit_unit<E>(self) -> Result<Meta, E> {
        Ok(Meta::default())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Meta, A::Error> {
        let mut m = Meta::default();
        while let Some(key) = map.next_key::<String>()? {
            let text = |v: Value, m: &mut Meta| match v {
                Value::String(s) => Some(s),
                Value::Null => None,
                other => {
                    m.error
                        .get_or_insert_with(|| format!("metadata.{key}: not a string: {other}"));
                    None
                }
            };
            match key.as_str() {
                "name" => m.name = text(map.next_value()?, &mut m),
                "namespace" => m.namespace = text(map.next_value()?, &mut m),
                "resourceVersion" => m.resource_version = text(map.next_value()?, &mut m),
                "uid" => m.uid = text(map.next_value()?, &mut m),
                "labels" => {
                    let v: Value = map.next_value()?;
                    match serde_json::from_value(v) {
                        Ok(labels) => m.labels = labels,
                        Err(e) => {
                            m.error
                                .get_or_insert_with(|| format!("metadata.labels: {e}"));
                        }
                    }
                }
                "annotations" => {
                    let a: objects::KeptAnnotations = map.next_value()?;
                    m.lb_algorithm = a.lb_algorithm;
                    if let Some(e) = a.error {
                        m.error
                            .get_or_insert_with(|| format!("metadata.annotations: {e}"));
                    }
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(m)
    }

    // Anything else where metadata should be: none, and why.
    fn visit_str<E>(self, v: &str) -> Result<Meta, E> {
        Ok(not_an_object(v))
    }
    fn visit_bool<E>(self, v: bool) -> Result<Meta, E> {
        Ok(not_an_object(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Meta, E> {
        Ok(not_an_object(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Meta, E> {
        Ok(not_an_object(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Meta, E> {
        Ok(not_an_object(v))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Meta, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(not_an_object("a list"))
    }
}

fn not_an_object(v: impl std::fmt::Debug) -> Meta {
    Meta {
        error: Some(format!("metadata: not an object: {v:?}")),
        ..Meta::default()
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
    fn odd_metadata_is_named_and_never_fails_the_event() {
        for (meta, says) in [
            (
                json!({"namespace": "ns", "name": "m", "labels": {"a": 5}}),
                "metadata.labels",
            ),
            (json!({"namespace": "ns", "name": 5}), "metadata.name"),
            (json!([1, 2]), "metadata: not an object"),
        ] {
            let line = json!({"type": "ADDED", "object": {
                "metadata": meta, "spec": {"ports": [{"port": 80}]},
            }})
            .to_string();
            let ev: WatchEvent<Service> = serde_json::from_str(&line).expect("decodes");
            let WatchEvent::Added(d) = ev else {
                panic!("{ev:?}")
            };
            let e = d.object().expect_err("cannot be read").to_string();
            assert!(e.contains(says), "{e}");
        }
        // The object before the type (as a buffering decoder sees it), and a null metadata.
        let line =
            r#"{"object": {"metadata": null, "spec": {"clusterIP": "10.0.0.1"}}, "type": "ADDED"}"#;
        let ev: WatchEvent<Service> = serde_json::from_str(line).expect("decodes");
        let WatchEvent::Added(Decoded::Object(svc)) = ev else {
            panic!("{ev:?}")
        };
        assert_eq!(
            svc.spec.and_then(|s| s.cluster_ip).as_deref(),
            Some("10.0.0.1")
        );
    }

    #[test]
    fn a_list_decodes_each_item_and_keeps_only_what_is_read() {
        let list = json!({"kind": "ServiceList", "apiVersion": "v1",
        "metadata": {"resourceVersion": "9"},
        "items": [
            {"metadata": {"namespace": "ns", "name": "a", "resourceVersion": "3",
                          "labels": {"app": "a"}, "annotations": {"x": "y"},
                          "managedFields": [{"time": null}]},
             "spec": {"clusterIP": "10.0.0.1", "ports": [{"port": 80}]},
             "status": {"conditions": [{"lastTransitionTime": null}]}},
            {"metadata": {"namespace": "ns", "name": "b"}, "spec": {"ports": 5}},
        ]})
        .to_string();
        let l: kube::core::ObjectList<Service> = serde_json::from_str(&list).expect("decodes");
        let Decoded::Object(a) = &l.items[0] else {
            panic!("{:?}", l.items[0])
        };
        assert_eq!(a.metadata.resource_version.as_deref(), Some("3"));
        assert!(a.metadata.annotations.is_none() && a.metadata.managed_fields.is_none());
        assert_eq!(
            a.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app"))
                .map(String::as_str),
            Some("a")
        );
        let e = l.items[1].object().expect_err("ports: 5").to_string();
        assert!(
            e.contains("Service ns/b") && e.contains("spec.ports"),
            "{e}"
        );
    }

    #[test]
    fn of_the_annotations_only_the_lb_algorithm_is_kept() {
        let line = json!({"type": "ADDED", "object": {
            "metadata": {"namespace": "ns", "name": "m",
                         "annotations": {"x": "y", "service.cilium.io/lb-algorithm": "maglev",
                                         "big": {"nested": [1, 2, null]}}},
            "spec": {"clusterIP": "10.0.0.1", "ports": [{"port": 80}]},
        }})
        .to_string();
        let ev: WatchEvent<Service> = serde_json::from_str(&line).expect("decodes");
        let WatchEvent::Added(Decoded::Object(svc)) = ev else {
            panic!("{ev:?}")
        };
        let kept: Vec<(&str, &str)> = svc
            .metadata
            .annotations
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(kept, [("service.cilium.io/lb-algorithm", "maglev")]);

        // null annotations are none; a value that is not a string names the object.
        for (annotations, says) in [
            (json!(null), None),
            (json!({"service.cilium.io/lb-algorithm": null}), None),
            (
                json!({"service.cilium.io/lb-algorithm": 5}),
                Some("metadata.annotations: service.cilium.io/lb-algorithm: not a string: 5"),
            ),
            (json!("x"), Some("metadata.annotations: not a map")),
        ] {
            let line = json!({"type": "ADDED", "object": {
                "metadata": {"namespace": "ns", "name": "m", "annotations": annotations},
                "spec": {"clusterIP": "10.0.0.1", "ports": [{"port": 80}]},
            }})
            .to_string();
            let ev: WatchEvent<Service> = serde_json::from_str(&line).expect("decodes");
            let WatchEvent::Added(d) = ev else {
                panic!("{ev:?}")
            };
            match says {
                None => {
                    let svc = d.object().expect("readable");
                    assert!(svc.metadata.annotations.is_none(), "{svc:?}");
                }
                Some(says) => {
                    let e = d.object().expect_err("cannot be read").to_string();
                    assert!(e.contains("Service ns/m") && e.contains(says), "{e}");
                }
            }
        }
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
