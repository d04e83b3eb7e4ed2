//! Services and EndpointSlices as the proxy reads them: only the fields kube-proxy uses
//! (a Service's status only for its LoadBalancer ingress IPs), every other field ignored,
//! unknown ones included. Field names follow k8s-openapi's; a `null` where a list, map or
//! string is expected reads as empty, as the API server's own defaulting would have it.
//!
//! Decoding the whole k8s-openapi types made one odd field anywhere in an object (a status
//! condition with `lastTransitionTime: null`, which the API server accepts) fail the object,
//! and with it the watch event that carried it; these types never look at such fields.

use std::{collections::BTreeMap, fmt};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{
    Deserialize, Deserializer,
    de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor},
};
use serde_json::Value;

use super::convert::LB_ALGORITHM_ANNOTATION;

/// `null` read as the type's default (an absent field is too, with `#[serde(default)]`).
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(d: D) -> Result<T, D::Error> {
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}

/// The metadata the proxy reads: name, namespace, uid (for Events), labels (an EndpointSlice's service-name
/// label), the resourceVersion a watch resumes from, and of the annotations only
/// [`LB_ALGORITHM_ANNOTATION`]. Everything else (managed fields, the other annotations,
/// owner references, timestamps) is skipped while decoding, never stored.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Meta {
    #[serde(deserialize_with = "nullable")]
    name: Option<String>,
    #[serde(deserialize_with = "nullable")]
    namespace: Option<String>,
    #[serde(deserialize_with = "nullable")]
    resource_version: Option<String>,
    #[serde(deserialize_with = "nullable")]
    uid: Option<String>,
    #[serde(deserialize_with = "nullable")]
    labels: Option<BTreeMap<String, String>>,
    #[serde(rename = "annotations", deserialize_with = "lb_algorithm")]
    lb_algorithm: Option<String>,
}

impl From<Meta> for ObjectMeta {
    fn from(m: Meta) -> Self {
        ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            resource_version: m.resource_version,
            uid: m.uid,
            labels: m.labels,
            annotations: annotations(m.lb_algorithm),
            ..ObjectMeta::default()
        }
    }
}

/// The annotations as k8s-openapi holds them: only [`LB_ALGORITHM_ANNOTATION`], when set.
pub(crate) fn annotations(lb_algorithm: Option<String>) -> Option<BTreeMap<String, String>> {
    lb_algorithm.map(|v| BTreeMap::from([(LB_ALGORITHM_ANNOTATION.to_string(), v)]))
}

/// `metadata.annotations` read for [`LB_ALGORITHM_ANNOTATION`] alone (a wrong type is an
/// error, as for every field the proxy reads).
fn lb_algorithm<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let a = KeptAnnotations::deserialize(d)?;
    match a.error {
        Some(e) => Err(de::Error::custom(e)),
        None => Ok(a.lb_algorithm),
    }
}

/// Of an object's annotations, only the value of [`LB_ALGORITHM_ANNOTATION`]: every other
/// one is skipped while decoding (its key compared in place, its value never stored).
///
/// Never fails on JSON, so that the watch decoder can name an object with odd metadata
/// instead of losing its event: what is not as the API writes it (annotations that are not
/// a map, the value not a string) is `error`, saying why. `null` reads as none.
#[derive(Debug, Default)]
pub(crate) struct KeptAnnotations {
    pub lb_algorithm: Option<String>,
    pub error: Option<String>,
}

impl<'de> Deserialize<'de> for KeptAnnotations {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(AnnotationsVisitor)
    }
}

struct AnnotationsVisitor;

impl AnnotationsVisitor {
    fn not_a_map(v: impl fmt::Display) -> KeptAnnotations {
        KeptAnnotations {
            lb_algorithm: None,
            error: Some(format!("not a map: {v}")),
        }
    }
}

impl<'de> Visitor<'de> for AnnotationsVisitor {
    type Value = KeptAnnotations;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map of annotations")
    }

    fn visit_unit<E>(self) -> Result<KeptAnnotations, E> {
        Ok(KeptAnnotations::default())
    }

    fn visit_none<E>(self) -> Result<KeptAnnotations, E> {
        Ok(KeptAnnotations::default())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KeptAnnotations, A::Error> {
        let mut kept = KeptAnnotations::default();
        while let Some(IsLbAlgorithm(wanted)) = map.next_key()? {
            if !wanted {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            match map.next_value::<Value>()? {
                Value::String(s) => kept.lb_algorithm = Some(s),
                Value::Null => kept.lb_algorithm = None,
                other => {
                    kept.error.get_or_insert_with(|| {
                        format!("{LB_ALGORITHM_ANNOTATION}: not a string: {other}")
                    });
                }
            }
        }
        Ok(kept)
    }

    // Anything else where the annotations should be: none, and why.
    fn visit_str<E>(self, v: &str) -> Result<KeptAnnotations, E> {
        Ok(Self::not_a_map(format_args!("{v:?}")))
    }
    fn visit_bool<E>(self, v: bool) -> Result<KeptAnnotations, E> {
        Ok(Self::not_a_map(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<KeptAnnotations, E> {
        Ok(Self::not_a_map(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<KeptAnnotations, E> {
        Ok(Self::not_a_map(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<KeptAnnotations, E> {
        Ok(Self::not_a_map(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<KeptAnnotations, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Self::not_a_map("a list"))
    }
}

/// An annotation's key, compared with [`LB_ALGORITHM_ANNOTATION`] where the decoder holds
/// it (no copy).
struct IsLbAlgorithm(bool);

impl<'de> Deserialize<'de> for IsLbAlgorithm {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = IsLbAlgorithm;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an annotation key")
            }
            fn visit_str<E>(self, v: &str) -> Result<IsLbAlgorithm, E> {
                Ok(IsLbAlgorithm(v == LB_ALGORITHM_ANNOTATION))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// Reads an object's metadata (what [`Meta`] keeps) into k8s-openapi's type.
pub(crate) fn object_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    nullable::<D, Meta>(d).map(ObjectMeta::from)
}

/// A v1 Service.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Service {
    #[serde(deserialize_with = "object_meta")]
    pub metadata: ObjectMeta,
    #[serde(deserialize_with = "nullable")]
    pub spec: Option<ServiceSpec>,
    #[serde(deserialize_with = "nullable")]
    pub status: Option<ServiceStatus>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct ServiceSpec {
    #[serde(rename = "type", deserialize_with = "nullable")]
    pub type_: Option<String>,
    #[serde(rename = "clusterIP", deserialize_with = "nullable")]
    pub cluster_ip: Option<String>,
    #[serde(rename = "clusterIPs", deserialize_with = "nullable")]
    pub cluster_ips: Option<Vec<String>>,
    #[serde(deserialize_with = "nullable")]
    pub ports: Option<Vec<ServicePort>>,
    #[serde(rename = "externalIPs", deserialize_with = "nullable")]
    pub external_ips: Option<Vec<String>>,
    #[serde(deserialize_with = "nullable")]
    pub load_balancer_source_ranges: Option<Vec<String>>,
    #[serde(deserialize_with = "nullable")]
    pub session_affinity: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub session_affinity_config: Option<SessionAffinityConfig>,
    #[serde(deserialize_with = "nullable")]
    pub external_traffic_policy: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub internal_traffic_policy: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub health_check_node_port: Option<i32>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct ServicePort {
    #[serde(deserialize_with = "nullable")]
    pub name: Option<String>,
    /// Required by the API; 0 when absent (then refused, naming the field).
    #[serde(deserialize_with = "nullable")]
    pub port: i32,
    #[serde(deserialize_with = "nullable")]
    pub protocol: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub node_port: Option<i32>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct SessionAffinityConfig {
    #[serde(rename = "clientIP", deserialize_with = "nullable")]
    pub client_ip: Option<ClientIpConfig>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct ClientIpConfig {
    #[serde(deserialize_with = "nullable")]
    pub timeout_seconds: Option<i32>,
}

/// Of a Service's status, only its LoadBalancer ingress (conditions are never read).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct ServiceStatus {
    #[serde(deserialize_with = "nullable")]
    pub load_balancer: Option<LoadBalancerStatus>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct LoadBalancerStatus {
    #[serde(deserialize_with = "nullable")]
    pub ingress: Option<Vec<LoadBalancerIngress>>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct LoadBalancerIngress {
    #[serde(deserialize_with = "nullable")]
    pub ip: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub ip_mode: Option<String>,
}

/// A discovery.k8s.io/v1 EndpointSlice.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct EndpointSlice {
    #[serde(deserialize_with = "object_meta")]
    pub metadata: ObjectMeta,
    /// Required by the API; empty when absent (then refused as an unknown family).
    #[serde(deserialize_with = "nullable")]
    pub address_type: String,
    #[serde(deserialize_with = "nullable")]
    pub endpoints: Vec<Endpoint>,
    #[serde(deserialize_with = "nullable")]
    pub ports: Option<Vec<EndpointPort>>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct Endpoint {
    #[serde(deserialize_with = "nullable")]
    pub addresses: Vec<String>,
    #[serde(deserialize_with = "nullable")]
    pub conditions: Option<EndpointConditions>,
    #[serde(deserialize_with = "nullable")]
    pub node_name: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub zone: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub hints: Option<EndpointHints>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct EndpointConditions {
    #[serde(deserialize_with = "nullable")]
    pub ready: Option<bool>,
    #[serde(deserialize_with = "nullable")]
    pub serving: Option<bool>,
    #[serde(deserialize_with = "nullable")]
    pub terminating: Option<bool>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct EndpointHints {
    #[serde(deserialize_with = "nullable")]
    pub for_zones: Option<Vec<HintName>>,
    #[serde(deserialize_with = "nullable")]
    pub for_nodes: Option<Vec<HintName>>,
}

/// A zone or node named by a hint.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct HintName {
    #[serde(deserialize_with = "nullable")]
    pub name: String,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct EndpointPort {
    #[serde(deserialize_with = "nullable")]
    pub name: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub port: Option<i32>,
    #[serde(deserialize_with = "nullable")]
    pub protocol: Option<String>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn status_conditions_unknown_fields_and_nulls_never_fail_a_service() {
        let svc: Service = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "namespace": "ns", "name": "web", "resourceVersion": "7",
                "managedFields": [{"time": null, "manager": 5}],
                "creationTimestamp": "not a time",
                "labels": null,
            },
            "spec": {
                "clusterIP": "10.96.0.1", "ports": [{"port": 80, "appProtocol": null}],
                "externalIPs": null, "someFutureField": {"x": [1, 2]},
            },
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": null}],
                "loadBalancer": {"ingress": [{"ip": "192.0.2.1", "ipMode": "VIP", "ports": null}]},
            },
            "whatever": true,
        }))
        .expect("decodes");
        assert_eq!(svc.metadata.name.as_deref(), Some("web"));
        assert_eq!(svc.metadata.resource_version.as_deref(), Some("7"));
        assert!(svc.metadata.managed_fields.is_none() && svc.metadata.labels.is_none());
        let spec = svc.spec.expect("spec");
        assert_eq!(spec.ports.expect("ports")[0].port, 80);
        assert_eq!(spec.external_ips, None);
        let ingress = svc.status.and_then(|s| s.load_balancer?.ingress);
        assert_eq!(
            ingress.expect("ingress")[0].ip.as_deref(),
            Some("192.0.2.1")
        );
    }

    #[test]
    fn a_slice_keeps_its_labels_conditions_and_hints() {
        let s: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "web-1",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": null,
            "endpoints": [{
                "addresses": ["10.0.0.1"],
                "conditions": {"ready": null, "serving": true, "terminating": false},
                "hints": {"forZones": [{"name": "z1"}], "forNodes": null},
                "deprecatedTopology": {"a": "b"},
            }],
        }))
        .expect("decodes");
        assert_eq!(
            s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("kubernetes.io/service-name"))
                .map(String::as_str),
            Some("web")
        );
        let c = s.endpoints[0].conditions.clone().expect("conditions");
        assert_eq!((c.ready, c.serving), (None, Some(true)));
        let zones = s.endpoints[0].hints.clone().and_then(|h| h.for_zones);
        assert_eq!(zones.expect("zones")[0].name, "z1");
        assert!(s.ports.is_none());
    }

    #[test]
    fn a_field_the_proxy_reads_of_the_wrong_type_is_still_an_error() {
        let e = serde_json::from_value::<Service>(json!({
            "metadata": {"name": "web"},
            "spec": {"ports": [{"port": "eighty"}]},
        }))
        .expect_err("a port must be a number");
        assert!(e.to_string().contains("eighty"), "{e}");
    }
}
