//! The properties, over generated files and over junk text.

use crate::checks::check_maps;
use crate::checks::run_file;
use crate::generate::file_of;
use crate::generate::service;
use crate::generate::slice;
use lb_common::{MAX_BACKENDS_PER_SVC, SCOPE_EXTERNAL};
use lb_userspace::{
    desired::{self, DesiredError, Limits, NodeContext},
    model::Protocol,
    reconcile::Ids,
    source::file,
};
use proptest::{prelude::*, sample::Index};
use serde_json::{Value, json};

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        // No regression files in the source tree; a failure prints its minimal case.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(96))]

    /// Generated files, valid and broken objects mixed: see the module comment.
    #[test]
    fn generated_files_keep_every_good_object_and_name_every_bad_one(
        services in prop::collection::vec(service(), 0..8),
        slices in prop::collection::vec(slice(), 0..10),
        configmap in any::<bool>(),
        small in prop::option::weighted(0.3, (0u32..40, 0u32..20)),
    ) {
        run_file(&file_of(services, slices, configmap), small)?;
    }
}

/// Arbitrary YAML values (from field names the decoder knows) where a Service's or a slice's
/// parts belong.
fn junk() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (0u32..70_000).prop_map(Value::from),
        prop::sample::select(vec!["10.96.0.1", "TCP", "UDP", "None", "IPv4", "x", ""])
            .prop_map(Value::from),
        "[a-z0-9.:/-]{0,10}".prop_map(Value::from),
    ];
    let keys = prop::sample::select(vec![
        "name",
        "namespace",
        "port",
        "ports",
        "protocol",
        "targetPort",
        "nodePort",
        "clusterIP",
        "clusterIPs",
        "type",
        "externalIPs",
        "addresses",
        "endpoints",
        "conditions",
        "ready",
        "addressType",
        "labels",
        "kubernetes.io/service-name",
        "sessionAffinity",
    ]);
    leaf.prop_recursive(3, 32, 4, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(keys.clone(), inner, 0..4).prop_map(|m| Value::Object(
                m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
            )),
        ]
    })
}

proptest! {
    #![proptest_config(config(128))]

    /// Arbitrary values in the metadata, spec, ports and endpoints: the file is read, every
    /// error names its document's kind and a namespace/name as far as one can be read, and the
    /// desired state is computed without a panic.
    #[test]
    fn arbitrary_values_in_objects_never_panic_and_errors_name_the_object(
        docs in prop::collection::vec((any::<bool>(), junk(), junk(), junk()), 1..6),
    ) {
        let mut text = String::new();
        for (i, (is_service, metadata, body, extra)) in docs.iter().enumerate() {
            let doc = if *is_service {
                json!({"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": body, "status": extra})
            } else {
                json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": metadata,
                       "addressType": "IPv4", "endpoints": body, "ports": extra})
            };
            text.push_str(&serde_saphyr::to_string(&doc).expect("serializable"));
            if i + 1 < docs.len() {
                text.push_str("---\n");
            }
        }
        let loaded = file::parse("junk.yaml", &text);
        prop_assert!(loaded.is_ok(), "{:?}", loaded.err());
        let Ok(loaded) = loaded else { return Ok(()) };
        for e in &loaded.errors {
            let msg = e.to_string();
            prop_assert!(
                msg.contains("Service ") || msg.contains("EndpointSlice "),
                "error names no object: {}", msg
            );
            prop_assert!(msg.contains('/'), "error names no namespace/name: {}", msg);
        }
        let (d, _) = desired::compute_on(&loaded.model, &NodeContext::default(), &mut Ids::default(), Limits::default());
        check_maps(&d, Limits::default())?;
    }

    /// Mangled text (a character inserted or replaced anywhere in a valid file): the file is
    /// read or refused whole, never a panic.
    #[test]
    fn mangled_text_never_panics(
        services in prop::collection::vec(service(), 1..4),
        slices in prop::collection::vec(slice(), 0..4),
        at in any::<Index>(),
        with in prop::sample::select(vec![':', '-', '[', ']', '{', '}', '"', '\'', ' ', '\n', '\t', '#', '&', '*', '!', '|', '>', '%', '@', '`', '\0']),
        replace in any::<bool>(),
    ) {
        let mut text: Vec<char> = file_of(services, slices, false).text().chars().collect();
        let i = at.index(text.len());
        if replace {
            text[i] = with;
        } else {
            text.insert(i, with);
        }
        let text: String = text.into_iter().collect();
        if let Ok(loaded) = file::parse("mangled.yaml", &text) {
            let (d, _) = desired::compute_on(&loaded.model, &NodeContext::default(), &mut Ids::default(), Limits::default());
            check_maps(&d, Limits::default())?;
        }
    }
}

proptest! {
    #![proptest_config(config(4))]

    /// Huge counts: a slice with more endpoints than a service port may have backends: the
    /// first `MAX_BACKENDS_PER_SVC` are programmed and the excess is reported by name.
    #[test]
    fn more_endpoints_than_a_port_may_have_are_cut_and_named(extra in 1usize..40) {
        let n = MAX_BACKENDS_PER_SVC as usize + extra;
        let endpoints: Vec<Value> = (0..n)
            .map(|i| json!({"addresses": [format!("10.{}.{}.{}", 100 + i / 65536, (i / 256) % 256, i % 256)]}))
            .collect();
        let docs = [
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "big", "name": "many"},
                   "spec": {"clusterIP": "10.96.9.9", "ports": [{"name": "p", "port": 80, "targetPort": 8080}]}}),
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                   "metadata": {"namespace": "big", "name": "many-1", "labels": {"kubernetes.io/service-name": "many"}},
                   "addressType": "IPv4", "ports": [{"name": "p", "port": 8080}], "endpoints": endpoints}),
        ];
        let text = docs.iter().map(|d| serde_saphyr::to_string(d).expect("yaml")).collect::<Vec<_>>().join("---\n");
        let loaded = file::parse("big.yaml", &text).expect("parses");
        prop_assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
        let (d, errors) = desired::compute(&loaded.model, &mut Ids::default(), Limits::default());
        let key = lb_common::user::frontend_key(std::net::Ipv4Addr::new(10, 96, 9, 9), 80, Protocol::Tcp);
        prop_assert_eq!(d.services.get(&key).map(|v| v.count), Some(MAX_BACKENDS_PER_SVC));
        prop_assert!(key.scope == SCOPE_EXTERNAL);
        prop_assert!(
            errors.iter().any(|e| matches!(e, DesiredError::TooManyBackends { object, count, .. } if object == "big/many:p" && *count == n)),
            "{:?}", errors
        );
        check_maps(&d, Limits::default())?;
    }
}
