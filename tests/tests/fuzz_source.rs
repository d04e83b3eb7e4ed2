//! Property tests (proptest) of the YAML → model → desired path (`source::file`,
//! `source::convert`, the model, `desired`): generated files of Services and EndpointSlices,
//! valid and broken — bad IPs, ports out of range, unknown protocols, missing fields, fields
//! of the wrong type, duplicated frontends, huge counts, arbitrary values where objects
//! belong, mangled text. Properties: nothing panics; every error names its object; a bad
//! object never keeps the others out of the model or the maps; the desired maps are
//! consistent, stable and within their limits.

use std::collections::BTreeMap;

use lb_common::{MAX_BACKENDS_PER_SVC, SCOPE_EXTERNAL, SvcKey};
use lb_userspace::{
    desired::{self, Desired, DesiredError, Ids, Limits, NodeContext},
    model::{Model, Protocol, ServiceRef},
    source::file,
};
use proptest::{prelude::*, sample::Index};
use serde_json::{Value, json};

const NAMESPACES: [&str; 3] = ["default", "demo", "kube-system"];
const PORT_NAMES: [&str; 4] = ["", "http", "dns", "grpc"];

/// What is wrong with a generated Service, if anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SvcFault {
    None,
    BadIp,
    PortOutOfRange(i64),
    PortBeyondI32,
    UnknownProtocol,
    NoPorts,
    MissingName,
    PortNotANumber,
    PortsNotAList,
    SpecNotAMap,
    NameNotAString,
    BadNodePort,
    Headless,
    ExternalName,
}

/// What is wrong with a generated EndpointSlice, if anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SliceFault {
    None,
    /// An IPv6 address in an IPv4 slice: skipped, the slice kept (as kube-proxy).
    WrongFamilyAddress,
    BadAddress,
    BadAddressType,
    Fqdn,
    NoLabel,
    MissingName,
    MissingAddressType,
    PortOutOfRange,
    UnknownProtocol,
    EndpointsNotAList,
    AddressesNotAList,
    PortNotANumber,
}

#[derive(Clone, Debug)]
struct GenPort {
    name: &'static str,
    port: u16,
    target: u16,
    /// `None`: left out (TCP).
    protocol: Option<&'static str>,
}

#[derive(Clone, Debug)]
struct GenService {
    ns: &'static str,
    omit_ns: bool,
    cluster_ip: String,
    ports: Vec<GenPort>,
    external_ips: Vec<String>,
    fault: SvcFault,
}

#[derive(Clone, Debug)]
struct GenEndpoint {
    ip: String,
    ready: Option<bool>,
    serving: Option<bool>,
    terminating: Option<bool>,
}

#[derive(Clone, Debug)]
struct GenSlice {
    /// Which generated Service it belongs to (none: a Service that does not exist).
    service: Option<Index>,
    endpoints: Vec<GenEndpoint>,
    fault: SliceFault,
}

/// What parsing must make of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    /// In the model under this key (Services) or service and slice name (slices).
    Kept,
    /// Left out without an error (headless, ExternalName, FQDN, no service label).
    Ignored,
    /// Left out with exactly one error containing this text.
    Error(String),
}

fn svc_fault() -> impl Strategy<Value = SvcFault> {
    prop_oneof![
        12 => Just(SvcFault::None),
        1 => Just(SvcFault::BadIp),
        1 => prop_oneof![Just(0i64), Just(-1), Just(65536), Just(100_000)]
            .prop_map(SvcFault::PortOutOfRange),
        1 => Just(SvcFault::PortBeyondI32),
        1 => Just(SvcFault::UnknownProtocol),
        1 => Just(SvcFault::NoPorts),
        1 => Just(SvcFault::MissingName),
        1 => Just(SvcFault::PortNotANumber),
        1 => Just(SvcFault::PortsNotAList),
        1 => Just(SvcFault::SpecNotAMap),
        1 => Just(SvcFault::NameNotAString),
        1 => Just(SvcFault::BadNodePort),
        1 => Just(SvcFault::Headless),
        1 => Just(SvcFault::ExternalName),
    ]
}

fn slice_fault() -> impl Strategy<Value = SliceFault> {
    prop_oneof![
        12 => Just(SliceFault::None),
        1 => Just(SliceFault::WrongFamilyAddress),
        1 => Just(SliceFault::BadAddress),
        1 => Just(SliceFault::BadAddressType),
        1 => Just(SliceFault::Fqdn),
        1 => Just(SliceFault::NoLabel),
        1 => Just(SliceFault::MissingName),
        1 => Just(SliceFault::MissingAddressType),
        1 => Just(SliceFault::PortOutOfRange),
        1 => Just(SliceFault::UnknownProtocol),
        1 => Just(SliceFault::EndpointsNotAList),
        1 => Just(SliceFault::AddressesNotAList),
        1 => Just(SliceFault::PortNotANumber),
    ]
}

/// Ports from small pools, so that frontends are often duplicated (within a Service and
/// across Services sharing a ClusterIP).
fn port() -> impl Strategy<Value = GenPort> {
    (
        prop::sample::select(&PORT_NAMES[..]),
        prop_oneof![Just(53u16), Just(80), Just(443), 1u16..=65535],
        prop_oneof![Just(8080u16), Just(5353), 1u16..=65535],
        prop_oneof![
            Just(None),
            Just(Some("TCP")),
            Just(Some("UDP")),
            Just(Some("SCTP")),
        ],
    )
        .prop_map(|(name, port, target, protocol)| GenPort {
            name,
            port,
            target,
            protocol,
        })
}

fn service() -> impl Strategy<Value = GenService> {
    (
        prop::sample::select(&NAMESPACES[..]),
        any::<bool>(),
        prop_oneof![
            8 => (1u8..=6).prop_map(|i| format!("10.96.0.{i}")),
            1 => Just("010.096.000.007".to_string()),
            1 => Just("2001:db8::1".to_string()),
        ],
        prop::collection::vec(port(), 1..4),
        prop::collection::vec(
            prop_oneof![
                (1u8..=3).prop_map(|i| format!("198.51.100.{i}")),
                Just("not-an-ip".to_string()),
            ],
            0..2,
        ),
        svc_fault(),
    )
        .prop_map(
            |(ns, omit_ns, cluster_ip, ports, external_ips, fault)| GenService {
                ns,
                omit_ns: omit_ns && ns == "default",
                cluster_ip,
                ports,
                external_ips,
                fault,
            },
        )
}

fn endpoint() -> impl Strategy<Value = GenEndpoint> {
    (
        (1u8..=20, 1u8..=20),
        any::<Option<bool>>(),
        any::<Option<bool>>(),
        any::<Option<bool>>(),
    )
        .prop_map(|((a, b), ready, serving, terminating)| GenEndpoint {
            ip: format!("10.244.{a}.{b}"),
            ready,
            serving,
            terminating,
        })
}

fn slice() -> impl Strategy<Value = GenSlice> {
    (
        prop::option::weighted(0.9, any::<Index>()),
        prop::collection::vec(endpoint(), 0..6),
        slice_fault(),
    )
        .prop_map(|(service, endpoints, fault)| GenSlice {
            service,
            endpoints,
            fault,
        })
}

/// A generated file: its objects, in document order, with what must become of each.
#[derive(Debug)]
struct GenFile {
    docs: Vec<Value>,
    /// (kind, namespace/name, outcome) of each Service and EndpointSlice document.
    expect: Vec<(&'static str, ServiceRef, Option<String>, Outcome)>,
}

impl GenFile {
    fn text(&self) -> String {
        self.docs
            .iter()
            .map(|d| serde_yaml::to_string(d).expect("serializable"))
            .collect::<Vec<_>>()
            .join("---\n")
    }
}

fn file_of(services: Vec<GenService>, slices: Vec<GenSlice>, configmap: bool) -> GenFile {
    let mut f = GenFile {
        docs: Vec::new(),
        expect: Vec::new(),
    };
    if configmap {
        f.docs
            .push(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}));
    }
    for (i, s) in services.iter().enumerate() {
        let name = format!("s{i}");
        let index = f.docs.len();
        let (doc, outcome) = service_doc(s, &name, index);
        f.docs.push(doc);
        let id = ServiceRef {
            namespace: s.ns.into(),
            name,
        };
        f.expect.push(("Service", id, None, outcome));
    }
    for (j, sl) in slices.iter().enumerate() {
        let owner = sl
            .service
            .as_ref()
            .filter(|_| !services.is_empty())
            .map(|ix| (ix.index(services.len()), ix));
        let (svc_name, ns, ports) = match owner {
            Some((k, _)) => (format!("s{k}"), services[k].ns, services[k].ports.clone()),
            None => ("gone".to_string(), "demo", vec![]),
        };
        let name = format!("{svc_name}-e{j}");
        let index = f.docs.len();
        let (doc, outcome) = slice_doc(sl, ns, &name, &svc_name, &ports, index);
        f.docs.push(doc);
        let id = ServiceRef {
            namespace: ns.into(),
            name: svc_name,
        };
        f.expect.push(("EndpointSlice", id, Some(name), outcome));
    }
    f
}

fn port_json(p: &GenPort) -> Value {
    let mut v = json!({"port": p.port, "targetPort": p.target});
    if !p.name.is_empty() {
        v["name"] = json!(p.name);
    }
    if let Some(proto) = p.protocol {
        v["protocol"] = json!(proto);
    }
    v
}

/// A Service document and what must become of it.
fn service_doc(s: &GenService, name: &str, index: usize) -> (Value, Outcome) {
    let mut ports: Vec<Value> = s.ports.iter().map(port_json).collect();
    let mut doc = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"namespace": s.ns, "name": name},
        "spec": {"clusterIP": s.cluster_ip, "externalIPs": s.external_ips},
    });
    if s.omit_ns {
        doc["metadata"] = json!({ "name": name });
    }
    let invalid = Outcome::Error(format!("Service {}/{name}:", s.ns));
    let undecodable = Outcome::Error(format!("document {index}: Service {}/{name}:", s.ns));
    let outcome = match s.fault {
        SvcFault::None => Outcome::Kept,
        SvcFault::BadIp => {
            doc["spec"]["clusterIP"] = json!("10.96.0.999");
            invalid
        }
        SvcFault::PortOutOfRange(p) => {
            ports[0]["port"] = json!(p);
            invalid
        }
        SvcFault::PortBeyondI32 => {
            ports[0]["port"] = json!(1i64 << 40);
            undecodable
        }
        SvcFault::UnknownProtocol => {
            ports[0]["protocol"] = json!("ICMP");
            invalid
        }
        SvcFault::NoPorts => {
            ports.clear();
            invalid
        }
        SvcFault::MissingName => {
            doc["metadata"] = json!({"namespace": s.ns});
            Outcome::Error(format!("Service {}/:", s.ns))
        }
        SvcFault::PortNotANumber => {
            ports[0]["port"] = json!("eighty");
            undecodable
        }
        SvcFault::PortsNotAList => {
            doc["spec"]["ports"] = json!(5);
            return (doc, undecodable);
        }
        SvcFault::SpecNotAMap => {
            doc["spec"] = json!("spec");
            return (doc, undecodable);
        }
        SvcFault::NameNotAString => {
            doc["metadata"]["name"] = json!(["not", "a", "name"]);
            Outcome::Error(format!("document {index}: Service {}/?:", s.ns))
        }
        SvcFault::BadNodePort => {
            doc["spec"]["type"] = json!("NodePort");
            ports[0]["nodePort"] = json!(70000);
            invalid
        }
        SvcFault::Headless => {
            doc["spec"]["clusterIP"] = json!("None");
            Outcome::Ignored
        }
        SvcFault::ExternalName => {
            doc["spec"]["type"] = json!("ExternalName");
            Outcome::Ignored
        }
    };
    doc["spec"]["ports"] = Value::Array(ports);
    (doc, outcome)
}

/// An EndpointSlice document for `svc_name`, its ports those the Service targets.
fn slice_doc(
    sl: &GenSlice,
    ns: &str,
    name: &str,
    svc_name: &str,
    svc_ports: &[GenPort],
    index: usize,
) -> (Value, Outcome) {
    let mut ports: Vec<Value> = svc_ports
        .iter()
        .map(|p| {
            port_json(&GenPort {
                port: p.target,
                ..p.clone()
            })
        })
        .collect();
    for p in &mut ports {
        if let Some(o) = p.as_object_mut() {
            o.remove("targetPort");
        }
    }
    let mut endpoints: Vec<Value> = sl
        .endpoints
        .iter()
        .map(|e| {
            let mut c = serde_json::Map::new();
            for (k, v) in [
                ("ready", e.ready),
                ("serving", e.serving),
                ("terminating", e.terminating),
            ] {
                if let Some(v) = v {
                    c.insert(k.into(), json!(v));
                }
            }
            json!({"addresses": [e.ip], "conditions": c})
        })
        .collect();
    let mut doc = json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "namespace": ns,
            "name": name,
            "labels": {"kubernetes.io/service-name": svc_name},
        },
        "addressType": "IPv4",
    });
    let invalid = Outcome::Error(format!("EndpointSlice {ns}/{name}:"));
    let undecodable = Outcome::Error(format!("document {index}: EndpointSlice {ns}/{name}:"));
    let outcome = match sl.fault {
        SliceFault::None => Outcome::Kept,
        SliceFault::WrongFamilyAddress => {
            endpoints.push(json!({"addresses": ["2001:db8::7"]}));
            Outcome::Kept
        }
        SliceFault::BadAddress => {
            endpoints.push(json!({"addresses": ["10.244.0.300"]}));
            invalid
        }
        SliceFault::BadAddressType => {
            doc["addressType"] = json!("IPX");
            invalid
        }
        SliceFault::Fqdn => {
            doc["addressType"] = json!("FQDN");
            Outcome::Ignored
        }
        SliceFault::NoLabel => {
            doc["metadata"]["labels"] = json!({});
            Outcome::Ignored
        }
        SliceFault::MissingName => {
            if let Some(m) = doc["metadata"].as_object_mut() {
                m.remove("name");
            }
            Outcome::Error(format!("EndpointSlice {ns}/:"))
        }
        SliceFault::MissingAddressType => {
            // k8s-openapi reads it as "", an unknown address family.
            if let Some(m) = doc.as_object_mut() {
                m.remove("addressType");
            }
            invalid
        }
        SliceFault::PortOutOfRange => {
            ports.push(json!({"name": "bad", "port": 0}));
            invalid
        }
        SliceFault::UnknownProtocol => {
            ports.push(json!({"name": "bad", "port": 9, "protocol": "QUIC"}));
            invalid
        }
        SliceFault::EndpointsNotAList => {
            doc["endpoints"] = json!("many");
            doc["ports"] = Value::Array(ports);
            return (doc, undecodable);
        }
        SliceFault::AddressesNotAList => {
            endpoints.push(json!({"addresses": 5}));
            undecodable
        }
        SliceFault::PortNotANumber => {
            ports.push(json!({"name": "bad", "port": "nine"}));
            undecodable
        }
    };
    doc["ports"] = Value::Array(ports);
    doc["endpoints"] = Value::Array(endpoints);
    (doc, outcome)
}

/// Each source error matches one object expected to fail (its text names it), and each such
/// object has its error.
fn check_errors(f: &GenFile, loaded: &file::Loaded) -> Result<(), TestCaseError> {
    let mut due: Vec<&String> = f
        .expect
        .iter()
        .filter_map(|(_, _, _, o)| match o {
            Outcome::Error(tag) => Some(tag),
            _ => None,
        })
        .collect();
    for e in &loaded.errors {
        let msg = e.to_string();
        let at = due.iter().position(|tag| msg.contains(tag.as_str()));
        prop_assert!(
            at.is_some(),
            "error names no failing object: {msg}\nstill due: {due:?}"
        );
        if let Some(at) = at {
            due.remove(at);
        }
    }
    prop_assert!(due.is_empty(), "objects without their error: {due:?}");
    Ok(())
}

/// Every valid object is in the model, every other one is not.
fn check_model(f: &GenFile, model: &Model) -> Result<(), TestCaseError> {
    for (kind, id, slice, outcome) in &f.expect {
        let present = match slice {
            None => model.services.contains_key(id),
            Some(name) => model.slices.get(id).is_some_and(|s| s.contains_key(name)),
        };
        prop_assert_eq!(
            present,
            *outcome == Outcome::Kept,
            "{} {} {:?}: {:?}",
            kind,
            id,
            slice,
            outcome
        );
    }
    Ok(())
}

/// The frontends the model's Services claim (ClusterIP and externalIP, per port), with the
/// objects claiming each.
fn claims(model: &Model) -> BTreeMap<SvcKey, Vec<String>> {
    let mut out: BTreeMap<SvcKey, Vec<String>> = BTreeMap::new();
    for (id, svc) in &model.services {
        let Some(std::net::IpAddr::V4(vip)) =
            svc.cluster_ips.iter().copied().find(|ip| ip.is_ipv4())
        else {
            continue;
        };
        for p in svc.ports.iter().filter(|p| p.protocol != Protocol::Sctp) {
            let object = if p.name.is_empty() {
                format!("{id}:{}", p.port)
            } else {
                format!("{id}:{}", p.name)
            };
            out.entry(desired::frontend_key(vip, p.port, p.protocol))
                .or_default()
                .push(object.clone());
            for ip in &svc.external_ips {
                if let std::net::IpAddr::V4(ip) = ip {
                    out.entry(desired::frontend_key(*ip, p.port, p.protocol))
                        .or_default()
                        .push(format!("{object} (externalIP {ip})"));
                }
            }
        }
    }
    out
}

fn error_object(e: &DesiredError) -> &str {
    match e {
        DesiredError::Unsupported { object, .. }
        | DesiredError::FrontendConflict { object, .. }
        | DesiredError::MapFull { object, .. }
        | DesiredError::TooManyBackends { object, .. }
        | DesiredError::NoEndpointSlice { object } => object,
    }
}

/// Each claimed frontend has one owner, programmed or refused for a full map by name; every
/// other claimant is told whose it is.
fn check_frontends(
    model: &Model,
    d: &Desired,
    errors: &[DesiredError],
) -> Result<(), TestCaseError> {
    for (key, objects) in claims(model) {
        let shown = desired::show_frontend(&key);
        let conflicts = errors
            .iter()
            .filter(|e| matches!(e, DesiredError::FrontendConflict { frontend, .. } if *frontend == shown))
            .count();
        prop_assert_eq!(
            conflicts,
            objects.len() - 1,
            "{} claimed by {:?}",
            shown,
            objects
        );
        let programmed = d.services.contains_key(&key);
        let refused = errors
            .iter()
            .any(|e| matches!(e, DesiredError::MapFull { object, .. } if objects.contains(object)));
        prop_assert!(
            programmed || refused,
            "{} ({:?}) neither programmed nor refused",
            shown,
            objects
        );
    }
    Ok(())
}

/// Every desired error names a Service of the model (`ns/name`, then a port or nothing).
fn check_desired_errors(model: &Model, errors: &[DesiredError]) -> Result<(), TestCaseError> {
    for e in errors {
        let object = error_object(e);
        let named = model.services.keys().any(|id| {
            let id = id.to_string();
            object == id || object.starts_with(&format!("{id}:"))
        });
        prop_assert!(named, "error names no Service: {}", e);
    }
    Ok(())
}

/// The maps are consistent: each frontend's slots exist and point at programmed backends,
/// each frontend has a name, nothing exceeds its limit.
fn check_maps(d: &Desired, limits: Limits) -> Result<(), TestCaseError> {
    prop_assert!(d.services.len() <= limits.svc_entries as usize);
    prop_assert!(d.backends.len() <= limits.backends as usize);
    prop_assert!(d.src_ranges.len() <= limits.src_ranges as usize);
    for (k, v) in d.services.iter().filter(|(k, _)| k.slot == 0) {
        prop_assert!(v.count <= MAX_BACKENDS_PER_SVC, "{:?}", k);
        prop_assert!(
            d.names.contains_key(&v.svc_id),
            "frontend {:?} has no name",
            k
        );
        for slot in 1..=v.count {
            let s = d.services.get(&SvcKey { slot, ..*k });
            prop_assert!(s.is_some(), "{:?}: slot {} missing", k, slot);
            if let Some(s) = s {
                prop_assert_eq!(s.svc_id, v.svc_id);
                prop_assert!(
                    d.backends.contains_key(&s.backend_id),
                    "{:?}: slot {} has no backend",
                    k,
                    slot
                );
            }
        }
    }
    for k in d.services.keys().filter(|k| k.slot > 0) {
        let head = d.services.get(&SvcKey { slot: 0, ..*k });
        prop_assert!(
            head.is_some_and(|h| k.slot <= h.count),
            "stray slot {:?}",
            k
        );
    }
    Ok(())
}

fn limits(small: Option<(u32, u32)>) -> Limits {
    match small {
        Some((svc_entries, backends)) => Limits {
            svc_entries,
            backends,
            src_ranges: 8,
            ..Limits::default()
        },
        None => Limits::default(),
    }
}

/// The whole path, checked: parse, model, desired on a node with NodePort addresses, twice
/// (the second computation, with the ids of the first, must give the same maps).
fn run_file(f: &GenFile, small: Option<(u32, u32)>) -> Result<(), TestCaseError> {
    let text = f.text();
    let loaded = file::parse("gen.yaml", &text);
    prop_assert!(
        loaded.is_ok(),
        "the file failed whole: {:?}\n{}",
        loaded.err(),
        text
    );
    let Ok(loaded) = loaded else { return Ok(()) };
    check_errors(f, &loaded)?;
    check_model(f, &loaded.model)?;
    let limits = limits(small);
    let node = NodeContext::new("node1", &[std::net::Ipv4Addr::new(192, 0, 2, 1)], false);
    let mut ids = Ids::default();
    let (d, errors) = desired::compute_on(&loaded.model, &node, &mut ids, limits);
    check_maps(&d, limits)?;
    check_desired_errors(&loaded.model, &errors)?;
    check_frontends(&loaded.model, &d, &errors)?;
    let (again, _) = desired::compute_on(&loaded.model, &node, &mut ids, limits);
    prop_assert_eq!(&again, &d, "a second computation changed the maps");
    Ok(())
}

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
            text.push_str(&serde_yaml::to_string(&doc).expect("serializable"));
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
        let text = docs.iter().map(|d| serde_yaml::to_string(d).expect("yaml")).collect::<Vec<_>>().join("---\n");
        let loaded = file::parse("big.yaml", &text).expect("parses");
        prop_assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
        let (d, errors) = desired::compute(&loaded.model, &mut Ids::default(), Limits::default());
        let key = desired::frontend_key(std::net::Ipv4Addr::new(10, 96, 9, 9), 80, Protocol::Tcp);
        prop_assert_eq!(d.services.get(&key).map(|v| v.count), Some(MAX_BACKENDS_PER_SVC));
        prop_assert!(key.scope == SCOPE_EXTERNAL);
        prop_assert!(
            errors.iter().any(|e| matches!(e, DesiredError::TooManyBackends { object, count, .. } if object == "big/many:p" && *count == n)),
            "{:?}", errors
        );
        check_maps(&d, Limits::default())?;
    }
}
