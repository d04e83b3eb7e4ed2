//! deploy/: every manifest parses into its k8s-openapi type, and the RBAC grants exactly what
//! kube-proxy needs (list/watch services and endpointslices, get/list/watch nodes,
//! create/patch/update events) and nothing else.

use std::{collections::BTreeSet, path::Path};

use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{ConfigMap, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};

fn docs(file: &str) -> Vec<serde_json::Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    lb_userspace::source::yaml::documents(&text)
        .unwrap_or_else(|e| panic!("{file}: {e}"))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

fn kind(v: &serde_json::Value) -> &str {
    v.get("kind").and_then(|k| k.as_str()).unwrap_or("")
}

#[test]
fn every_manifest_parses_into_its_type() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let mut seen = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).expect("deploy/") {
        let name = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        if !name.ends_with(".yaml") {
            continue;
        }
        for doc in docs(&name) {
            let k = kind(&doc).to_string();
            let ok = match k.as_str() {
                "ServiceAccount" => serde_json::from_value::<ServiceAccount>(doc).map(|_| ()),
                "ClusterRole" => serde_json::from_value::<ClusterRole>(doc).map(|_| ()),
                "ClusterRoleBinding" => {
                    serde_json::from_value::<ClusterRoleBinding>(doc).map(|_| ())
                }
                "DaemonSet" => serde_json::from_value::<DaemonSet>(doc).map(|_| ()),
                "ConfigMap" => serde_json::from_value::<ConfigMap>(doc).map(|_| ()),
                other => panic!("{name}: unexpected kind {other:?}"),
            };
            ok.unwrap_or_else(|e| panic!("{name}: {k}: {e}"));
            seen.insert(k);
        }
    }
    for k in [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "ConfigMap",
    ] {
        assert!(seen.contains(k), "no {k} in deploy/");
    }
}

#[test]
fn the_cluster_role_grants_exactly_what_kube_proxy_needs() {
    let role: ClusterRole = docs("rbac.yaml")
        .into_iter()
        .find(|d| kind(d) == "ClusterRole")
        .map(|d| serde_json::from_value(d).expect("ClusterRole"))
        .expect("a ClusterRole");
    let mut granted = BTreeSet::new();
    for rule in role.rules.unwrap_or_default() {
        for group in rule.api_groups.unwrap_or_default() {
            for res in rule.resources.clone().unwrap_or_default() {
                for verb in &rule.verbs {
                    granted.insert(format!("{group}/{res}:{verb}"));
                }
            }
        }
        assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
    }
    let want: BTreeSet<String> = [
        "/services:list",
        "/services:watch",
        "discovery.k8s.io/endpointslices:list",
        "discovery.k8s.io/endpointslices:watch",
        "/nodes:get",
        "/nodes:list",
        "/nodes:watch",
        "/events:create",
        "/events:patch",
        "/events:update",
        "events.k8s.io/events:create",
        "events.k8s.io/events:patch",
        "events.k8s.io/events:update",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(granted, want);
    assert!(
        granted
            .iter()
            .all(|g| !g.contains("secrets") && !g.contains('*'))
    );
}

#[test]
fn daemon_sets_run_on_every_node_with_probes_and_bpffs() {
    for (file, privileged) in [
        ("daemonset.yaml", true),
        ("daemonset-capabilities.yaml", false),
    ] {
        let ds: DaemonSet = serde_json::from_value(docs(file).remove(0)).expect("DaemonSet");
        let pod = ds.spec.expect("spec").template.spec.expect("pod spec");
        assert_eq!(pod.host_network, Some(true), "{file}");
        assert_eq!(
            pod.priority_class_name.as_deref(),
            Some("system-node-critical"),
            "{file}"
        );
        assert!(
            pod.tolerations
                .unwrap_or_default()
                .iter()
                .any(|t| t.operator.as_deref() == Some("Exists")),
            "{file}: every node"
        );
        assert!(
            pod.volumes.clone().unwrap_or_default().iter().any(|v| v
                .host_path
                .as_ref()
                .is_some_and(|h| h.path == "/sys/fs/bpf")),
            "{file}: /sys/fs/bpf hostPath"
        );
        let cgroup_mounted = pod.volumes.clone().unwrap_or_default().iter().any(|v| {
            v.host_path
                .as_ref()
                .is_some_and(|h| h.path == "/sys/fs/cgroup")
        });
        assert!(
            cgroup_mounted,
            "{file}: the host's cgroup v2 for the socket hooks"
        );
        let c = &pod.containers[0];
        let probe_path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
            p.as_ref()
                .and_then(|p| p.http_get.as_ref())
                .and_then(|h| h.path.clone())
        };
        assert_eq!(
            probe_path(&c.liveness_probe).as_deref(),
            Some("/livez"),
            "{file}"
        );
        assert_eq!(
            probe_path(&c.readiness_probe).as_deref(),
            Some("/healthz"),
            "{file}"
        );
        let sc = c.security_context.clone().expect("securityContext");
        assert_eq!(sc.privileged, Some(privileged), "{file}");
        if !privileged {
            let caps = sc.capabilities.expect("capabilities");
            assert_eq!(caps.drop, Some(vec!["ALL".to_string()]));
            assert_eq!(
                caps.add,
                Some(vec!["BPF".to_string(), "NET_ADMIN".to_string()])
            );
        }
        assert!(
            c.env_from.clone().unwrap_or_default().iter().any(|e| e
                .config_map_ref
                .as_ref()
                .is_some_and(|r| r.name == "xlb-config")),
            "{file}: settings from the ConfigMap"
        );
        let env = c.env.clone().unwrap_or_default();
        let var = |name: &str| {
            env.iter()
                .find(|e| e.name == name)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(
            var("XLB_CGROUP_PATH").as_deref(),
            Some("/run/xlb/cgroupv2"),
            "{file}: the socket hooks attach to the host's cgroup, not the container's"
        );
        assert!(
            c.volume_mounts
                .clone()
                .unwrap_or_default()
                .iter()
                .any(|m| m.mount_path == "/run/xlb/cgroupv2"),
            "{file}"
        );
        if privileged {
            assert_eq!(
                pod.host_pid,
                Some(true),
                "{file}: pods' namespaces via /proc"
            );
        } else {
            assert_eq!(var("XLB_SOCKET_LB").as_deref(), Some("host"), "{file}");
        }
    }
}
