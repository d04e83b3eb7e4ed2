//! kube-proxy's status endpoints, served beside `/metrics` on the metrics address:
//! `/proxyMode` (the mode as text: scripts, kubeadm checks and the upstream e2e
//! `Networking should check kube-proxy urls` read it) and `/configz` (the running
//! configuration as JSON, under the component's group name as kube-proxy's is). Both are
//! made once at start: a request costs a copy.

use super::{Response, StatusCode};

/// What `/proxyMode` answers for xlb: kube-proxy names its modes after the kernel
/// facility they program (iptables, ipvs, nftables); xlb's is eBPF.
pub const PROXY_MODE: &str = "ebpf";

/// The answers of `/proxyMode` and `/configz`.
#[derive(Clone, Debug)]
pub struct Status {
    mode: &'static str,
    configz: String,
}

impl Status {
    /// `mode` for `/proxyMode`; `configz`, the effective configuration by group name
    /// (e.g. `{"kubeproxy.config.k8s.io": {...}}`).
    pub fn new(mode: &'static str, configz: &serde_json::Value) -> Self {
        Self {
            mode,
            configz: configz.to_string(),
        }
    }

    /// `/proxyMode` and `/configz`; `None` for any other path.
    pub fn handle(&self, path: &str) -> Option<Response> {
        match path {
            "/proxyMode" => Some(super::text(StatusCode::OK, self.mode)),
            "/configz" => Some(super::json(StatusCode::OK, self.configz.clone())),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_mode_and_configz() {
        let s = Status::new(
            PROXY_MODE,
            &serde_json::json!({"kubeproxy.config.k8s.io": {"mode": "ebpf"}}),
        );
        let mode = s.handle("/proxyMode").expect("served");
        assert_eq!(
            (mode.status(), mode.body().as_str()),
            (StatusCode::OK, "ebpf")
        );
        let c = s.handle("/configz").expect("served");
        assert_eq!(c.headers()["content-type"], "application/json");
        let v: serde_json::Value = serde_json::from_str(c.body()).expect("JSON");
        assert_eq!(v["kubeproxy.config.k8s.io"]["mode"], "ebpf");
        assert!(s.handle("/metrics").is_none());
    }
}
