//! kube-proxy's service health server: for each Service with externalTrafficPolicy Local and
//! a healthCheckNodePort, an HTTP server on that port (on each NodePort address) answers 200
//! while this node has ready local endpoints for it and 503 otherwise, so an external load
//! balancer only sends traffic to nodes that can serve it without a second hop, and drains
//! a node whose pods are shutting down (serving-terminating endpoints still get traffic
//! through the fallback, but do not count here, as in kube-proxy).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::{Arc, Mutex},
};

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Response, StatusCode, health::Health, spawn_until};
use crate::model::{
    Model, ServiceRef,
    node::{IpFamily, NodeSettings},
    select::ports_of_service,
};

/// What one health-check node port reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedService {
    pub service: ServiceRef,
    /// Ready endpoints on this node, by address over all the Service's ports.
    pub local_endpoints: usize,
}

/// The Services of `model` with a health-check node port: the ones [`desired`] looks at.
pub fn checked_services(model: &Model) -> BTreeSet<ServiceRef> {
    model
        .services
        .iter()
        .filter(|(_, s)| s.health_check_node_port.is_some())
        .map(|(id, _)| id.clone())
        .collect()
}

/// The health-check node ports `model` asks for on node `node_name`: port → service, from
/// the Services in `checked` ([`checked_services`], kept up to date by the caller), so the
/// cost follows the Services with a health check, never the whole model.
pub fn desired(
    model: &Model,
    node_name: &str,
    checked: &BTreeSet<ServiceRef>,
) -> BTreeMap<u16, CheckedService> {
    let mut out: BTreeMap<u16, CheckedService> = BTreeMap::new();
    // Both families' service ports (an IPv6-only Service has a health check too); a
    // dual-stack Service's one port is answered for both, by the family with more ready
    // local endpoints (kube-proxy runs a proxier per family, each counting its own).
    for family in [IpFamily::V4, IpFamily::V6] {
        let settings = NodeSettings {
            node_name: node_name.to_string(),
            family,
            ..NodeSettings::default()
        };
        // kube-proxy's LocalReadyEndpoints: the ready endpoints on this node, counted by
        // address over all the Service's ports (10.0.0.1:80 and 10.0.0.1:443 are one), never
        // the serving-terminating fallback.
        let mut ready_local: BTreeMap<u16, BTreeSet<IpAddr>> = BTreeMap::new();
        let views = checked
            .iter()
            .flat_map(|id| ports_of_service(model, id, &settings));
        for view in views {
            let Some(port) = view.health_check_node_port.filter(|p| *p != 0) else {
                continue;
            };
            if !view.external_policy_local() {
                continue;
            }
            let entry = out.entry(port).or_insert_with(|| CheckedService {
                service: view.service.id.clone(),
                local_endpoints: 0,
            });
            if entry.service != view.service.id {
                // Another Service with the same port: the first one keeps it.
                continue;
            }
            let ips = ready_local.entry(port).or_default();
            ips.extend(
                view.endpoints
                    .iter()
                    .filter(|e| e.local && e.ready)
                    .map(|e| e.ip),
            );
            entry.local_endpoints = entry.local_endpoints.max(ips.len());
        }
    }
    out
}

/// The answer for one service, as kube-proxy's: 200 while it has ready local endpoints and
/// the proxy is healthy, else 503; `application/json`, `nosniff`, the endpoint count as the
/// load-balancing weight (kube-proxy sends it even when 0), and its JSON body (tab-indented,
/// no final newline).
pub fn response(s: &CheckedService, proxy_healthy: bool) -> Response {
    let body = format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {:?},\n\t\t\"name\": {:?}\n\t}},\n\t\"localEndpoints\": {},\n\t\"serviceProxyHealthy\": {}\n}}",
        s.service.namespace, s.service.name, s.local_endpoints, proxy_healthy
    );
    let status = match s.local_endpoints > 0 && proxy_healthy {
        true => StatusCode::OK,
        false => StatusCode::SERVICE_UNAVAILABLE,
    };
    let mut r = super::json(status, body);
    let headers = r.headers_mut();
    headers.insert(
        "x-content-type-options",
        hyper::header::HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        "x-load-balancing-endpoint-weight",
        hyper::header::HeaderValue::from(s.local_endpoints),
    );
    r
}

struct Server {
    state: Arc<Mutex<CheckedService>>,
    stop: CancellationToken,
}

/// The running health-check servers, one per (address, port).
pub struct ServiceHealth {
    servers: BTreeMap<(IpAddr, u16), Server>,
    health: Arc<Health>,
}

impl ServiceHealth {
    pub fn new(health: Arc<Health>) -> Self {
        Self {
            servers: BTreeMap::new(),
            health,
        }
    }

    /// Starts, updates and stops servers so that exactly `want` is served on `addresses`
    /// (either family; none: every IPv4 address). A port that cannot be bound is logged with
    /// the service and retried at the next call.
    pub fn update(&mut self, want: &BTreeMap<u16, CheckedService>, addresses: &[IpAddr]) {
        let all = [IpAddr::V4(Ipv4Addr::UNSPECIFIED)];
        let addresses = if addresses.is_empty() {
            &all[..]
        } else {
            addresses
        };
        self.servers.retain(|(addr, port), server| {
            let keep = addresses.contains(addr) && want.contains_key(port);
            if !keep {
                server.stop.cancel();
                info!(%addr, port, "health-check node port closed");
            }
            keep
        });
        for (port, svc) in want {
            for addr in addresses {
                if let Some(server) = self.servers.get(&(*addr, *port)) {
                    *server.state.lock().unwrap_or_else(|p| p.into_inner()) = svc.clone();
                    continue;
                }
                let state = Arc::new(Mutex::new(svc.clone()));
                let stop = CancellationToken::new();
                let (st, health) = (state.clone(), self.health.clone());
                let handler = move |_path: &str| {
                    let s = st.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    Some(response(&s, health.is_healthy()))
                };
                match spawn_until(SocketAddr::from((*addr, *port)), handler, stop.clone()) {
                    Ok(bound) => {
                        info!(%bound, service = %svc.service, "health-check node port open");
                        self.servers.insert((*addr, *port), Server { state, stop });
                    }
                    Err(e) => warn!(service = %svc.service, "health-check node port: {e}"),
                }
            }
        }
    }
}

impl Drop for ServiceHealth {
    fn drop(&mut self) {
        for s in self.servers.values() {
            s.stop.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(n: usize) -> CheckedService {
        CheckedService {
            service: ServiceRef {
                namespace: "ns".into(),
                name: "web".into(),
            },
            local_endpoints: n,
        }
    }

    #[test]
    fn local_endpoints_decide_the_status_as_in_kube_proxy() {
        let ok = response(&svc(2), true);
        assert_eq!(ok.status(), StatusCode::OK);
        assert!(ok.body().contains("\"localEndpoints\": 2"), "{}", ok.body());
        assert!(ok.body().contains("\"namespace\": \"ns\""), "{}", ok.body());
        assert_eq!(ok.headers()["x-load-balancing-endpoint-weight"], "2");
        let unavailable = StatusCode::SERVICE_UNAVAILABLE;
        assert_eq!(response(&svc(0), true).status(), unavailable);
        assert_eq!(response(&svc(2), false).status(), unavailable);
        assert_eq!(
            response(&svc(0), true).headers()["x-load-balancing-endpoint-weight"],
            "0"
        );
        assert_eq!(
            response(&svc(1), true).body(),
            "{\n\t\"service\": {\n\t\t\"namespace\": \"ns\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 1,\n\t\"serviceProxyHealthy\": true\n}"
        );
    }

    /// An eTP Local LoadBalancer `ns/web` with health-check node port 32000, ports 80 and
    /// 443, and a slice of `(ip, node, ready, serving, terminating)` endpoints.
    fn local_lb(eps: &[(&str, &str, bool, bool, bool)]) -> Model {
        let mut y = String::from(
            "apiVersion: v1\nkind: Service\nmetadata: {namespace: ns, name: web}\nspec:\n  type: LoadBalancer\n  clusterIP: 10.96.0.1\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 32000\n  ports: [{name: a, port: 80, nodePort: 30080}, {name: b, port: 443, nodePort: 30443}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {namespace: ns, name: web-1, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: a, port: 8080}, {name: b, port: 8443}]\nendpoints:\n",
        );
        for (ip, node, ready, serving, terminating) in eps {
            y.push_str(&format!(
                "- {{addresses: [{ip}], nodeName: {node}, conditions: {{ready: {ready}, serving: {serving}, terminating: {terminating}}}}}\n"
            ));
        }
        let loaded = crate::source::file::parse("t.yaml", &y).expect("yaml");
        assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
        loaded.model
    }

    #[test]
    fn only_ready_local_endpoints_count_by_address_over_the_ports() {
        let count = |eps: &[(&str, &str, bool, bool, bool)]| {
            let model = local_lb(eps);
            desired(&model, "n1", &checked_services(&model))
                .get(&32000)
                .expect("served")
                .local_endpoints
        };
        // One pod serves both ports: one endpoint, as kube-proxy counts it.
        assert_eq!(count(&[("10.0.0.1", "n1", true, true, false)]), 1);
        // Remote and not-ready ones do not count.
        assert_eq!(
            count(&[
                ("10.0.0.1", "n1", true, true, false),
                ("10.0.0.2", "n2", true, true, false),
                ("10.0.0.3", "n1", false, false, false),
            ]),
            1
        );
        // Only serving-terminating local endpoints: traffic still goes to them (the
        // fallback), but the node reports none, so a load balancer drains it.
        assert_eq!(
            count(&[
                ("10.0.0.1", "n1", false, true, true),
                ("10.0.0.4", "n1", false, true, true),
            ]),
            0
        );
    }
}
