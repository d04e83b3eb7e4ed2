//! Kubernetes objects (as [`super::objects`] reads them) → model, with kube-proxy's reading
//! of each field.

use super::{SourceError, objects as obj};
use crate::model::{
    Cidr, DEFAULT_AFFINITY_TIMEOUT_SECONDS, Endpoint, EndpointPort, EndpointSlice, Hints,
    LbAlgorithm, MostlyOne, Name, Protocol, Service, ServicePort, ServiceRef, ServiceType,
    SessionAffinity, Topology, TrafficPolicy, Uid, intern,
};

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The annotation that overrides the node's `--lb-algorithm` for one Service (Cilium's
/// name; `random` or `maglev`). The only annotation the sources keep.
pub const LB_ALGORITHM_ANNOTATION: &str = "service.cilium.io/lb-algorithm";

pub use crate::model::parse_ip;

fn parse_protocol(p: Option<&str>) -> Result<Protocol, String> {
    match p.unwrap_or("TCP") {
        "TCP" => Ok(Protocol::Tcp),
        "UDP" => Ok(Protocol::Udp),
        "SCTP" => Ok(Protocol::Sctp),
        other => Err(other.to_string()),
    }
}

fn parse_port(p: i32) -> Option<u16> {
    u16::try_from(p).ok().filter(|&p| p != 0)
}

fn service_ref(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ServiceRef {
    ServiceRef {
        namespace: intern(meta.namespace.as_deref().unwrap_or("default")),
        name: intern(meta.name.as_deref().unwrap_or_default()),
    }
}

/// What a Service becomes: a model service, nothing (a kind xlb does not proxy), or an error.
pub enum Converted<T> {
    Take(T),
    /// Not proxied (headless, ExternalName, no ClusterIP), with the reason for the log.
    Ignore(String),
}

/// Names the object whose field is invalid.
struct Object<'a> {
    kind: &'static str,
    name: &'a str,
}

impl Object<'_> {
    fn invalid(&self, field: String, value: String, reason: &str) -> SourceError {
        SourceError::Invalid {
            kind: self.kind,
            object: self.name.to_string(),
            field,
            value,
            reason: reason.to_string(),
        }
    }
}

/// Converts a Service. ExternalName and headless services are ignored, as kube-proxy does.
pub fn service(svc: &obj::Service) -> Result<Converted<Service>, SourceError> {
    let id = service_ref(&svc.metadata);
    let name = id.to_string();
    let obj = Object {
        kind: "Service",
        name: &name,
    };
    if id.name.is_empty() {
        return Err(obj.invalid(
            "metadata.name".into(),
            String::new(),
            "a Service needs a name",
        ));
    }
    let spec = svc.spec.clone().unwrap_or_default();
    if spec.type_.as_deref() == Some("ExternalName") {
        return Ok(Converted::Ignore(format!("Service {id} is ExternalName")));
    }
    let Some(cluster_ips) = cluster_ips(&spec, &obj)? else {
        return Ok(Converted::Ignore(format!(
            "Service {id} is headless or has no ClusterIP"
        )));
    };
    let ports = service_ports(&spec, &obj)?;
    let service_type = match spec.type_.as_deref() {
        Some("NodePort") => ServiceType::NodePort,
        Some("LoadBalancer") => ServiceType::LoadBalancer,
        _ => ServiceType::ClusterIp,
    };
    let policy = |p: Option<&str>| match p {
        Some("Local") => TrafficPolicy::Local,
        _ => TrafficPolicy::Cluster,
    };
    Ok(Converted::Take(Service {
        cluster_ips,
        ports,
        service_type,
        external_ips: external_ips(&spec, &id).into(),
        load_balancer_ips: load_balancer_ips(svc, &id).into(),
        load_balancer_source_ranges: source_ranges(&spec, &id).into(),
        session_affinity: session_affinity(&spec),
        external_traffic_policy: policy(spec.external_traffic_policy.as_deref()),
        internal_traffic_policy: policy(spec.internal_traffic_policy.as_deref()),
        health_check_node_port: spec
            .health_check_node_port
            .and_then(|p| u16::try_from(p).ok())
            .filter(|&p| p != 0),
        lb_algorithm: lb_algorithm(svc, &id),
        uid: svc.metadata.uid.as_deref().and_then(Uid::parse),
        id,
    }))
}

/// `clusterIPs` (else `clusterIP`); `None` for a headless service or one without any.
fn cluster_ips(
    spec: &obj::ServiceSpec,
    obj: &Object<'_>,
) -> Result<Option<MostlyOne<std::net::IpAddr>>, SourceError> {
    let mut raw_ips = spec.cluster_ips.clone().unwrap_or_default();
    if raw_ips.is_empty() {
        raw_ips.extend(spec.cluster_ip.clone());
    }
    if raw_ips.is_empty() || raw_ips.iter().any(|ip| ip == "None" || ip.is_empty()) {
        return Ok(None);
    }
    let mut cluster_ips = MostlyOne::new();
    for (i, raw) in raw_ips.iter().enumerate() {
        let ip = parse_ip(raw).ok_or_else(|| {
            obj.invalid(
                format!("spec.clusterIPs[{i}]"),
                raw.clone(),
                "not an IPv4 or IPv6 address",
            )
        })?;
        cluster_ips.push(ip);
    }
    Ok(Some(cluster_ips))
}

/// `spec.ports`: at least one, each with a valid port, protocol and nodePort.
fn service_ports(
    spec: &obj::ServiceSpec,
    obj: &Object<'_>,
) -> Result<MostlyOne<ServicePort>, SourceError> {
    let mut ports = MostlyOne::new();
    for (i, p) in spec.ports.iter().flatten().enumerate() {
        let port = parse_port(p.port).ok_or_else(|| {
            obj.invalid(
                format!("spec.ports[{i}].port"),
                p.port.to_string(),
                "must be 1..=65535",
            )
        })?;
        let protocol = parse_protocol(p.protocol.as_deref()).map_err(|v| {
            obj.invalid(
                format!("spec.ports[{i}].protocol"),
                v,
                "must be TCP, UDP or SCTP",
            )
        })?;
        let node_port = match p.node_port {
            None | Some(0) => None,
            Some(np) => Some(parse_port(np).ok_or_else(|| {
                obj.invalid(
                    format!("spec.ports[{i}].nodePort"),
                    np.to_string(),
                    "must be 1..=65535",
                )
            })?),
        };
        ports.push(ServicePort {
            name: intern(p.name.as_deref().unwrap_or_default()),
            port,
            protocol,
            node_port,
        });
    }
    if ports.is_empty() {
        return Err(obj.invalid(
            "spec.ports".into(),
            "[]".into(),
            "a Service needs at least one port",
        ));
    }
    Ok(ports)
}

// kube-proxy drops externalIPs, ingress IPs and source ranges it cannot parse (they are
// usually of the other family); so does the model, with a log line.

fn external_ips(spec: &obj::ServiceSpec, id: &ServiceRef) -> Vec<std::net::IpAddr> {
    let mut external_ips = Vec::new();
    for raw in spec.external_ips.iter().flatten() {
        match parse_ip(raw) {
            Some(ip) => external_ips.push(ip),
            None => tracing::warn!(service = %id, value = %raw, "externalIP is not an IP; ignored"),
        }
    }
    external_ips
}

/// The LoadBalancer ingress IPs (not those with ipMode Proxy).
fn load_balancer_ips(svc: &obj::Service, id: &ServiceRef) -> Vec<std::net::IpAddr> {
    let mut load_balancer_ips = Vec::new();
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    for ing in ingress.into_iter().flatten() {
        if ing.ip_mode.as_deref() == Some("Proxy") {
            continue;
        }
        let Some(raw) = ing.ip.as_deref() else {
            continue;
        };
        match parse_ip(raw) {
            Some(ip) => load_balancer_ips.push(ip),
            None => {
                tracing::warn!(service = %id, value = %raw, "LoadBalancer ingress IP is not an IP; ignored")
            }
        }
    }
    load_balancer_ips
}

fn source_ranges(spec: &obj::ServiceSpec, id: &ServiceRef) -> Vec<Cidr> {
    let raw = spec
        .load_balancer_source_ranges
        .as_deref()
        .unwrap_or_default();
    let (ranges, refused) = parse_source_ranges(raw, id);
    for why in refused {
        tracing::warn!(service = %id, "{why}");
    }
    ranges
}

/// A Service's loadBalancerSourceRanges of both families: those that parse (as
/// Kubernetes' sloppy parser reads them), and for each one that does not, why, naming the
/// Service and the range (it is left out; the others apply).
fn parse_source_ranges(raw: &[String], id: &ServiceRef) -> (Vec<Cidr>, Vec<String>) {
    let mut ranges = Vec::new();
    let mut refused = Vec::new();
    for r in raw {
        match Cidr::parse_sloppy(r) {
            Ok(c) => ranges.push(c),
            Err(e) => refused.push(format!(
                "Service {id}: loadBalancerSourceRanges {e}; ignored, the other ranges apply"
            )),
        }
    }
    (ranges, refused)
}

/// The [`LB_ALGORITHM_ANNOTATION`] of a Service: none when unset, or when its value is not
/// one xlb knows (then, with a log line, the node's `--lb-algorithm` applies).
fn lb_algorithm(svc: &obj::Service, id: &ServiceRef) -> Option<LbAlgorithm> {
    parse_lb_algorithm(svc, id).unwrap_or_else(|why| {
        tracing::warn!(service = %id, "{why}");
        None
    })
}

/// [`lb_algorithm`]'s reading, or why the value is refused, naming the Service, the
/// annotation, the value and the accepted values.
fn parse_lb_algorithm(svc: &obj::Service, id: &ServiceRef) -> Result<Option<LbAlgorithm>, String> {
    let Some(raw) = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(LB_ALGORITHM_ANNOTATION))
    else {
        return Ok(None);
    };
    raw.parse().map(Some).map_err(|_| {
        format!(
            "Service {id}: annotation {LB_ALGORITHM_ANNOTATION} {raw:?} is not {}; ignored, \
             the node's --lb-algorithm applies",
            LbAlgorithm::ACCEPTED
        )
    })
}

fn session_affinity(spec: &obj::ServiceSpec) -> SessionAffinity {
    match spec.session_affinity.as_deref() {
        Some("ClientIP") => SessionAffinity::ClientIp {
            timeout_seconds: spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds)
                .and_then(|t| u32::try_from(t).ok())
                .filter(|&t| t > 0)
                .unwrap_or(DEFAULT_AFFINITY_TIMEOUT_SECONDS),
        },
        _ => SessionAffinity::None,
    }
}

/// Converts an EndpointSlice. FQDN slices and slices without the service-name label are
/// ignored; an endpoint address of the wrong family is skipped with a log line.
pub fn endpoint_slice(slice: &obj::EndpointSlice) -> Result<Converted<EndpointSlice>, SourceError> {
    let meta = &slice.metadata;
    let name = meta.name.clone().unwrap_or_default();
    let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
    let object = format!("{namespace}/{name}");
    let obj = Object {
        kind: "EndpointSlice",
        name: &object,
    };
    if name.is_empty() {
        // Slices of a service are told apart by name: two without one would replace each
        // other.
        return Err(obj.invalid(
            "metadata.name".into(),
            String::new(),
            "an EndpointSlice needs a name",
        ));
    }
    let Some(svc_name) = meta.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL)) else {
        return Ok(Converted::Ignore(format!(
            "EndpointSlice {object} has no {SERVICE_NAME_LABEL} label"
        )));
    };
    let want_v4 = match slice.address_type.as_str() {
        "IPv4" => true,
        "IPv6" => false,
        "FQDN" => return Ok(Converted::Ignore(format!("EndpointSlice {object} is FQDN"))),
        other => {
            return Err(obj.invalid(
                "addressType".into(),
                other.into(),
                "unknown address family (IPv4, IPv6 or FQDN)",
            ));
        }
    };
    let ports = slice_ports(slice, &obj)?;
    let mut endpoints = Vec::with_capacity(slice.endpoints.len());
    for (i, ep) in slice.endpoints.iter().enumerate() {
        if let Some(e) = endpoint(i, ep, want_v4, &obj)? {
            endpoints.push(e);
        }
    }
    endpoints.shrink_to_fit();
    Ok(Converted::Take(EndpointSlice {
        name: Name::from(name),
        service: ServiceRef {
            namespace: intern(&namespace),
            name: intern(svc_name),
        },
        ports,
        endpoints,
    }))
}

/// The slice's ports (a port without a number is skipped).
fn slice_ports(
    slice: &obj::EndpointSlice,
    obj: &Object<'_>,
) -> Result<MostlyOne<EndpointPort>, SourceError> {
    let mut ports = MostlyOne::new();
    for (i, p) in slice.ports.iter().flatten().enumerate() {
        let Some(raw) = p.port else { continue };
        let port = parse_port(raw).ok_or_else(|| {
            obj.invalid(
                format!("ports[{i}].port"),
                raw.to_string(),
                "must be 1..=65535",
            )
        })?;
        let protocol = parse_protocol(p.protocol.as_deref()).map_err(|v| {
            obj.invalid(
                format!("ports[{i}].protocol"),
                v,
                "must be TCP, UDP or SCTP",
            )
        })?;
        ports.push(EndpointPort {
            name: intern(p.name.as_deref().unwrap_or_default()),
            port,
            protocol,
        });
    }
    Ok(ports)
}

/// Endpoint `i` of a slice; `None` when none of its addresses is of the slice's family.
fn endpoint(
    i: usize,
    ep: &obj::Endpoint,
    want_v4: bool,
    obj: &Object<'_>,
) -> Result<Option<Endpoint>, SourceError> {
    let mut address = None;
    for (j, raw) in ep.addresses.iter().enumerate() {
        let field = format!("endpoints[{i}].addresses[{j}]");
        let ip = parse_ip(raw)
            .ok_or_else(|| obj.invalid(field.clone(), raw.clone(), "not an IP address"))?;
        if ip.is_ipv4() != want_v4 {
            // As kube-proxy: an address of the other family is skipped, with a log line.
            tracing::warn!(
                slice = %obj.name, %field, address = %raw,
                "address of the wrong family for the slice's addressType; skipped"
            );
            continue;
        }
        // The first of the family is the one used; the others are still checked.
        address.get_or_insert(ip);
    }
    let Some(address) = address else {
        return Ok(None);
    };
    let cond = ep.conditions.clone().unwrap_or_default();
    // As kube-proxy reads them: ready and serving unset count as true, terminating as false.
    Ok(Some(Endpoint {
        address,
        ready: cond.ready.unwrap_or(true),
        serving: cond.serving.unwrap_or(true),
        terminating: cond.terminating.unwrap_or(false),
        topology: Topology {
            node_name: ep.node_name.as_deref().map(intern),
            zone: ep.zone.as_deref().map(intern),
            hints: Hints {
                zones: ep
                    .hints
                    .iter()
                    .flat_map(|h| h.for_zones.iter().flatten())
                    .map(|z| intern(&z.name))
                    .collect(),
                nodes: ep
                    .hints
                    .iter()
                    .flat_map(|h| h.for_nodes.iter().flatten())
                    .map(|n| intern(&n.name))
                    .collect(),
            },
        }
        .shared(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Service read from YAML as the file source reads it, with `metadata` lines added.
    fn yaml_service(metadata: &str) -> super::super::Snapshot {
        let yaml = format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  namespace: ns\n  name: web\n{metadata}\
             spec:\n  clusterIP: 10.96.0.1\n  ports: [{{port: 80}}]\n"
        );
        super::super::file::parse("test.yaml", &yaml).expect("parses")
    }

    fn lb_algorithm_of(metadata: &str) -> Option<LbAlgorithm> {
        let snap = yaml_service(metadata);
        assert!(snap.errors.is_empty(), "{:?}", snap.errors);
        let svc = snap.model.services.values().next().expect("the service");
        svc.lb_algorithm
    }

    #[test]
    fn the_lb_algorithm_annotation_overrides_the_node_when_it_is_known() {
        let annotated = |v: &str| {
            format!("  annotations:\n    x: y\n    service.cilium.io/lb-algorithm: {v}\n    z: w\n")
        };
        assert_eq!(
            lb_algorithm_of(&annotated("maglev")),
            Some(LbAlgorithm::Maglev)
        );
        assert_eq!(
            lb_algorithm_of(&annotated("random")),
            Some(LbAlgorithm::Random)
        );
        assert_eq!(lb_algorithm_of(&annotated("bogus")), None);
        assert_eq!(lb_algorithm_of(&annotated("Maglev")), None);
        assert_eq!(lb_algorithm_of(""), None);
        assert_eq!(lb_algorithm_of("  annotations:\n    x: y\n"), None);
        assert_eq!(lb_algorithm_of("  annotations: null\n"), None);
    }

    #[test]
    fn an_unknown_lb_algorithm_is_named_with_its_service_and_the_accepted_values() {
        let id = ServiceRef {
            namespace: intern("ns"),
            name: intern("web"),
        };
        let mut svc = obj::Service::default();
        svc.metadata.annotations = Some(
            [(LB_ALGORITHM_ANNOTATION.to_string(), "bogus".to_string())]
                .into_iter()
                .collect(),
        );
        assert_eq!(
            parse_lb_algorithm(&svc, &id).expect_err("bogus"),
            "Service ns/web: annotation service.cilium.io/lb-algorithm \"bogus\" is not random \
             or maglev; ignored, the node's --lb-algorithm applies"
        );
        assert_eq!(lb_algorithm(&svc, &id), None);
    }

    #[test]
    fn an_lb_algorithm_annotation_that_is_not_a_string_is_an_error_of_its_service() {
        let snap = yaml_service("  annotations:\n    service.cilium.io/lb-algorithm: [maglev]\n");
        assert!(snap.model.services.is_empty());
        let e = snap.errors.first().expect("an error").to_string();
        assert!(
            e.contains("Service ns/web")
                && e.contains("metadata.annotations")
                && e.contains("not a string"),
            "{e}"
        );
    }

    #[test]
    fn source_ranges_of_both_families_parse_and_a_bad_one_is_named_and_left_out() {
        let id = ServiceRef {
            namespace: crate::model::intern("ns"),
            name: crate::model::intern("web"),
        };
        let raw: Vec<String> = [
            "2001:db8:1::/48",
            " 10.0.0.0/8",
            "2001:db8:2::1/129",
            "fd00::zz/64",
            "2001:db8:3::7/64",
        ]
        .map(String::from)
        .to_vec();
        let (ranges, refused) = parse_source_ranges(&raw, &id);
        let shown: Vec<String> = ranges.iter().map(|c| c.to_string()).collect();
        assert_eq!(shown, ["2001:db8:1::/48", "10.0.0.0/8", "2001:db8:3::/64"]);
        assert_eq!(
            refused,
            [
                "Service ns/web: loadBalancerSourceRanges \"2001:db8:2::1/129\": prefix /129 is longer than an IPv6 address (128 bits); ignored, the other ranges apply",
                "Service ns/web: loadBalancerSourceRanges \"fd00::zz/64\" is not a CIDR (ADDRESS/PREFIX); ignored, the other ranges apply",
            ]
        );
    }
}
