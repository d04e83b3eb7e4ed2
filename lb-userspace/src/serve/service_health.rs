//! kube-proxy's service health server: for each Service with externalTrafficPolicy Local and
//! a healthCheckNodePort, an HTTP server on that port (on each NodePort address) answers 200
//! while this node has local endpoints for it and 503 otherwise, so an external load
//! balancer only sends traffic to nodes that can serve it without a second hop.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use tracing::{info, warn};

use super::{Response, health::Health, spawn_until};
use crate::model::{
    Model, ServiceRef,
    node::{IpFamily, NodeSettings},
    select::service_ports,
};

/// What one health-check node port reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedService {
    pub service: ServiceRef,
    pub local_endpoints: usize,
}

/// The health-check node ports `model` asks for on node `node_name`: port → service.
pub fn desired(model: &Model, node_name: &str) -> BTreeMap<u16, CheckedService> {
    let mut out: BTreeMap<u16, CheckedService> = BTreeMap::new();
    // Both families' service ports (an IPv6-only Service has a health check too); a
    // dual-stack Service's one port is answered for both, by the family with more local
    // endpoints (kube-proxy runs a server per family, each counting its own).
    let views = [IpFamily::V4, IpFamily::V6].into_iter().flat_map(|family| {
        let settings = NodeSettings {
            node_name: node_name.to_string(),
            family,
            ..NodeSettings::default()
        };
        service_ports(model, &settings)
    });
    for view in views {
        let Some(port) = view.health_check_node_port.filter(|p| *p != 0) else {
            continue;
        };
        if !view.external_policy_local() {
            continue;
        }
        let local = view.categorized.local.len();
        let entry = out.entry(port).or_insert_with(|| CheckedService {
            service: view.service.id.clone(),
            local_endpoints: 0,
        });
        // One Service, several ports: the port with the most local endpoints speaks for it.
        entry.local_endpoints = entry.local_endpoints.max(local);
    }
    out
}

/// The answer for one service, in kube-proxy's format.
pub fn response(s: &CheckedService, proxy_healthy: bool) -> Response {
    let body = format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {:?},\n\t\t\"name\": {:?}\n\t}},\n\t\"localEndpoints\": {},\n\t\"serviceProxyHealthy\": {}\n}}\n",
        s.service.namespace, s.service.name, s.local_endpoints, proxy_healthy
    );
    Response {
        status: if s.local_endpoints > 0 && proxy_healthy {
            "200 OK"
        } else {
            "503 Service Unavailable"
        },
        content_type: "application/json",
        headers: vec![
            "X-Content-Type-Options: nosniff".into(),
            format!("X-Load-Balancing-Endpoint-Weight: {}", s.local_endpoints),
        ],
        body,
    }
}

struct Server {
    state: Arc<Mutex<CheckedService>>,
    stop: Arc<AtomicBool>,
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
                server.stop.store(true, Ordering::Relaxed);
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
                let stop = Arc::new(AtomicBool::new(false));
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
            s.stop.store(true, Ordering::Relaxed);
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
        assert_eq!(ok.status, "200 OK");
        assert!(ok.body.contains("\"localEndpoints\": 2"), "{}", ok.body);
        assert!(ok.body.contains("\"namespace\": \"ns\""), "{}", ok.body);
        assert!(
            ok.headers
                .contains(&"X-Load-Balancing-Endpoint-Weight: 2".to_string())
        );
        assert_eq!(response(&svc(0), true).status, "503 Service Unavailable");
        assert_eq!(response(&svc(2), false).status, "503 Service Unavailable");
    }
}
