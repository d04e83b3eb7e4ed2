//! Generated files: Services and EndpointSlices, valid or with one fault each, as YAML
//! documents.

use crate::checks::Outcome;
use lb_userspace::model::ServiceRef;
use proptest::{prelude::*, sample::Index};
use serde_json::{Value, json};

pub(crate) const NAMESPACES: [&str; 3] = ["default", "demo", "kube-system"];
pub(crate) const PORT_NAMES: [&str; 4] = ["", "http", "dns", "grpc"];

/// What is wrong with a generated Service, if anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SvcFault {
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
pub(crate) enum SliceFault {
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
pub(crate) struct GenPort {
    pub(crate) name: &'static str,
    pub(crate) port: u16,
    pub(crate) target: u16,
    /// `None`: left out (TCP).
    pub(crate) protocol: Option<&'static str>,
}

#[derive(Clone, Debug)]
pub(crate) struct GenService {
    pub(crate) ns: &'static str,
    pub(crate) omit_ns: bool,
    pub(crate) cluster_ip: String,
    pub(crate) ports: Vec<GenPort>,
    pub(crate) external_ips: Vec<String>,
    pub(crate) fault: SvcFault,
}

#[derive(Clone, Debug)]
pub(crate) struct GenEndpoint {
    pub(crate) ip: String,
    pub(crate) ready: Option<bool>,
    pub(crate) serving: Option<bool>,
    pub(crate) terminating: Option<bool>,
}

#[derive(Clone, Debug)]
pub(crate) struct GenSlice {
    /// Which generated Service it belongs to (none: a Service that does not exist).
    pub(crate) service: Option<Index>,
    pub(crate) endpoints: Vec<GenEndpoint>,
    pub(crate) fault: SliceFault,
}

pub(crate) fn svc_fault() -> impl Strategy<Value = SvcFault> {
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

pub(crate) fn slice_fault() -> impl Strategy<Value = SliceFault> {
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
pub(crate) fn port() -> impl Strategy<Value = GenPort> {
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

pub(crate) fn service() -> impl Strategy<Value = GenService> {
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

pub(crate) fn endpoint() -> impl Strategy<Value = GenEndpoint> {
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

pub(crate) fn slice() -> impl Strategy<Value = GenSlice> {
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
pub(crate) struct GenFile {
    pub(crate) docs: Vec<Value>,
    /// (kind, namespace/name, outcome) of each Service and EndpointSlice document.
    pub(crate) expect: Vec<(&'static str, ServiceRef, Option<String>, Outcome)>,
}

impl GenFile {
    pub(crate) fn text(&self) -> String {
        self.docs
            .iter()
            .map(|d| serde_saphyr::to_string(d).expect("serializable"))
            .collect::<Vec<_>>()
            .join("---\n")
    }
}

pub(crate) fn file_of(
    services: Vec<GenService>,
    slices: Vec<GenSlice>,
    configmap: bool,
) -> GenFile {
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
            name: name.into(),
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
            name: svc_name.into(),
        };
        f.expect.push(("EndpointSlice", id, Some(name), outcome));
    }
    f
}

pub(crate) fn port_json(p: &GenPort) -> Value {
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
pub(crate) fn service_doc(s: &GenService, name: &str, index: usize) -> (Value, Outcome) {
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
pub(crate) fn slice_doc(
    sl: &GenSlice,
    ns: &str,
    name: &str,
    svc_name: &str,
    svc_ports: &[GenPort],
    index: usize,
) -> (Value, Outcome) {
    let (mut ports, mut endpoints) = slice_parts(sl, svc_ports);
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
    let mut parts = SliceParts {
        doc: &mut doc,
        ports: &mut ports,
        endpoints: &mut endpoints,
    };
    let outcome = match apply_slice_fault(sl.fault, &mut parts, ns, name, index) {
        Some(o) => o,
        None => {
            doc["ports"] = Value::Array(ports);
            return (
                doc,
                Outcome::Error(format!("document {index}: EndpointSlice {ns}/{name}:")),
            );
        }
    };
    doc["ports"] = Value::Array(ports);
    doc["endpoints"] = Value::Array(endpoints);
    (doc, outcome)
}

/// The slice's ports (the Service's target ports) and endpoints, before any fault.
fn slice_parts(sl: &GenSlice, svc_ports: &[GenPort]) -> (Vec<Value>, Vec<Value>) {
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
    let endpoints: Vec<Value> = sl
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
    (ports, endpoints)
}

/// A slice document being built.
struct SliceParts<'a> {
    doc: &'a mut Value,
    ports: &'a mut Vec<Value>,
    endpoints: &'a mut Vec<Value>,
}

/// Breaks the slice as `fault` says; the outcome, or `None` when the document cannot be
/// decoded at all (its endpoints are not a list; the ports are still to be set).
fn apply_slice_fault(
    fault: SliceFault,
    p: &mut SliceParts<'_>,
    ns: &str,
    name: &str,
    index: usize,
) -> Option<Outcome> {
    let invalid = Outcome::Error(format!("EndpointSlice {ns}/{name}:"));
    let undecodable = Outcome::Error(format!("document {index}: EndpointSlice {ns}/{name}:"));
    Some(match fault {
        SliceFault::None => Outcome::Kept,
        SliceFault::WrongFamilyAddress => {
            p.endpoints.push(json!({"addresses": ["2001:db8::7"]}));
            Outcome::Kept
        }
        SliceFault::BadAddress => {
            p.endpoints.push(json!({"addresses": ["10.244.0.300"]}));
            invalid
        }
        SliceFault::BadAddressType => {
            p.doc["addressType"] = json!("IPX");
            invalid
        }
        SliceFault::Fqdn => {
            p.doc["addressType"] = json!("FQDN");
            Outcome::Ignored
        }
        SliceFault::NoLabel => {
            p.doc["metadata"]["labels"] = json!({});
            Outcome::Ignored
        }
        SliceFault::MissingName => {
            if let Some(m) = p.doc["metadata"].as_object_mut() {
                m.remove("name");
            }
            Outcome::Error(format!("EndpointSlice {ns}/:"))
        }
        SliceFault::MissingAddressType => {
            // k8s-openapi reads it as "", an unknown address family.
            if let Some(m) = p.doc.as_object_mut() {
                m.remove("addressType");
            }
            invalid
        }
        SliceFault::PortOutOfRange => {
            p.ports.push(json!({"name": "bad", "port": 0}));
            invalid
        }
        SliceFault::UnknownProtocol => {
            p.ports
                .push(json!({"name": "bad", "port": 9, "protocol": "QUIC"}));
            invalid
        }
        SliceFault::EndpointsNotAList => {
            p.doc["endpoints"] = json!("many");
            return None;
        }
        SliceFault::AddressesNotAList => {
            p.endpoints.push(json!({"addresses": 5}));
            undecodable
        }
        SliceFault::PortNotANumber => {
            p.ports.push(json!({"name": "bad", "port": "nine"}));
            undecodable
        }
    })
}
