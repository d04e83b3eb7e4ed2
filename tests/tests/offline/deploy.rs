//! deploy/: every manifest parses into its k8s-openapi type, and the RBAC grants exactly what
//! kube-proxy needs (list/watch services and endpointslices, get/list/watch nodes,
//! create/patch/update events) and nothing else; bpffs reaches the agent without mount
//! propagation; every kustomization names files that exist, and the migration overlays
//! build (`kubectl kustomize`, where kubectl is installed) into what each step says.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{ConfigMap, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};

/// deploy/.
fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// The documents of deploy/base/FILE.
fn docs(file: &str) -> Vec<serde_json::Value> {
    docs_at(&deploy_dir().join("base").join(file))
}

/// The documents of a YAML file.
fn docs_at(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    yaml_docs(&text, &path.display().to_string())
}

fn yaml_docs(text: &str, what: &str) -> Vec<serde_json::Value> {
    lb_userspace::source::yaml::documents(text)
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

fn kind(v: &serde_json::Value) -> &str {
    v.get("kind").and_then(|k| k.as_str()).unwrap_or("")
}

#[test]
fn every_manifest_parses_into_its_type() {
    let dir = deploy_dir().join("base");
    let mut seen = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).expect("deploy/base/") {
        let name = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        if !name.ends_with(".yaml") || name == "kustomization.yaml" {
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
        assert!(seen.contains(k), "no {k} in deploy/base/");
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
        bpffs_without_propagation(file, &pod, privileged);
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

/// The host's bpffs reaches the agent with no mount propagation (a runtime refuses
/// HostToContainer and Bidirectional where the host's mount is private): the mount-bpffs
/// init container mounts it in the host's mount namespace, through the host's /proc.
fn bpffs_without_propagation(
    file: &str,
    pod: &k8s_openapi::api::core::v1::PodSpec,
    privileged: bool,
) {
    let init = pod.init_containers.clone().unwrap_or_default();
    let mount = init
        .iter()
        .find(|c| c.name == "mount-bpffs")
        .unwrap_or_else(|| panic!("{file}: the mount-bpffs init container"));
    assert_eq!(
        mount.image, pod.containers[0].image,
        "{file}: the agent's image"
    );
    let script = mount.command.clone().unwrap_or_default().join(" ");
    assert!(
        script.contains("nsenter --mount=/hostproc/1/ns/mnt -- mount -t bpf bpf /sys/fs/bpf")
            && script.contains("/hostproc/1/mounts"),
        "{file}: mounts bpffs in the host's namespace, once: {script}"
    );
    let host_path = |name: &str| {
        pod.volumes
            .clone()
            .unwrap_or_default()
            .into_iter()
            .find(|v| v.name == name)
            .and_then(|v| v.host_path)
            .map(|h| h.path)
    };
    let mounts = mount.volume_mounts.clone().unwrap_or_default();
    let hostproc = mounts
        .iter()
        .find(|m| m.mount_path == "/hostproc")
        .unwrap_or_else(|| panic!("{file}: the host's /proc at /hostproc"));
    assert_eq!(
        host_path(&hostproc.name).as_deref(),
        Some("/proc"),
        "{file}"
    );
    let sc = mount.security_context.clone().expect("securityContext");
    if privileged {
        assert_eq!(sc.privileged, Some(true), "{file}");
    } else {
        assert_eq!(
            sc.capabilities.and_then(|c| c.add),
            Some(vec![
                "SYS_ADMIN".to_string(),
                "SYS_CHROOT".to_string(),
                "SYS_PTRACE".to_string()
            ]),
            "{file}: mount, setns, and PID 1's namespace"
        );
    }
    for c in init.iter().chain(&pod.containers) {
        for m in c.volume_mounts.clone().unwrap_or_default() {
            assert_eq!(
                m.mount_propagation, None,
                "{file}: {}: {} must not ask for propagation",
                c.name, m.mount_path
            );
        }
    }
    let agent_mounts = pod.containers[0].volume_mounts.clone().unwrap_or_default();
    let bpffs = agent_mounts
        .iter()
        .find(|m| m.mount_path == "/sys/fs/bpf")
        .unwrap_or_else(|| panic!("{file}: bpffs in the agent"));
    assert_eq!(
        host_path(&bpffs.name).as_deref(),
        Some("/sys/fs/bpf"),
        "{file}"
    );
    let lock = agent_mounts
        .iter()
        .find(|m| m.mount_path == "/run/xtables.lock")
        .unwrap_or_else(|| panic!("{file}: the host's xtables lock"));
    assert_eq!(
        host_path(&lock.name).as_deref(),
        Some("/run/xtables.lock"),
        "{file}"
    );
}

/// Every kustomization.yaml under deploy/.
fn kustomizations() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.file_name().is_some_and(|n| n == "kustomization.yaml") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&deploy_dir(), &mut out);
    out.sort();
    out
}

#[test]
fn every_kustomization_names_files_that_exist() {
    let all = kustomizations();
    let names: Vec<String> = all
        .iter()
        .map(|p| {
            p.strip_prefix(deploy_dir())
                .expect("under deploy/")
                .display()
                .to_string()
        })
        .collect();
    for want in [
        "kustomization.yaml",
        "base/kustomization.yaml",
        "migrate/shadow/kustomization.yaml",
        "migrate/kube-proxy-exclude/kustomization.yaml",
        "migrate/takeover/kustomization.yaml",
        "migrate/rollback/kustomization.yaml",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "no deploy/{want}: {names:?}"
        );
    }
    for path in all {
        let k = docs_at(&path).remove(0);
        let root = path
            .parent()
            .expect("a directory")
            .canonicalize()
            .expect("root");
        assert_eq!(kind(&k), "Kustomization", "{}", path.display());
        let list = |key: &str| {
            k.get(key)
                .and_then(|v| v.as_array())
                .cloned()
                .unwrap_or_default()
        };
        let mut files: Vec<String> = list("patches")
            .iter()
            .filter_map(|p| p.get("path").and_then(|p| p.as_str()).map(String::from))
            .collect();
        for r in list("resources") {
            let r = r.as_str().expect("a resource path").to_string();
            let target = root
                .join(&r)
                .canonicalize()
                .unwrap_or_else(|e| panic!("{}: {r}: {e}", path.display()));
            if target.is_dir() {
                // A base: a kustomization of its own, not containing this one (kustomize
                // refuses the cycle).
                assert!(
                    target.join("kustomization.yaml").is_file(),
                    "{}: {r}",
                    path.display()
                );
                assert!(
                    !root.starts_with(&target),
                    "{}: {r} contains it",
                    path.display()
                );
            } else {
                files.push(r);
            }
        }
        for f in files {
            // Files must be in or below the kustomization's root (kustomize's load rule).
            let target = root
                .join(&f)
                .canonicalize()
                .unwrap_or_else(|e| panic!("{}: {f}: {e}", path.display()));
            assert!(
                target.starts_with(&root),
                "{}: {f} is outside its root",
                path.display()
            );
            assert!(
                !docs_at(&target).is_empty(),
                "{}: {f} is empty",
                path.display()
            );
        }
    }
}

/// `kubectl kustomize DIR`'s documents, or None where kubectl is not installed.
fn kustomize(dir: &str) -> Option<Vec<serde_json::Value>> {
    let out = match std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(deploy_dir().join(dir))
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("kubectl: {e}"),
    };
    assert!(
        out.status.success(),
        "kubectl kustomize deploy/{dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(yaml_docs(&String::from_utf8_lossy(&out.stdout), dir))
}

/// The one DaemonSet named `name` among `docs`.
fn daemon_set<'a>(docs: &'a [serde_json::Value], name: &str) -> &'a serde_json::Value {
    let found: Vec<_> = docs
        .iter()
        .filter(|d| kind(d) == "DaemonSet" && d["metadata"]["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "one DaemonSet {name}");
    found[0]
}

/// The xlb DaemonSet of an overlay, parsed; its agent container's args and capabilities,
/// and its node selector.
fn xlb_agent(docs: &[serde_json::Value]) -> (Vec<String>, Vec<String>, Option<serde_json::Value>) {
    let ds: DaemonSet =
        serde_json::from_value(daemon_set(docs, "xlb").clone()).expect("a DaemonSet");
    let pod = ds.spec.expect("spec").template.spec.expect("pod spec");
    let c = &pod.containers[0];
    assert_eq!(
        c.command,
        Some(vec!["xlb".to_string(), "agent".to_string()])
    );
    assert!(
        pod.init_containers
            .is_some_and(|i| i.iter().any(|c| c.name == "mount-bpffs"))
    );
    let caps = c
        .security_context
        .clone()
        .and_then(|s| s.capabilities)
        .and_then(|c| c.add)
        .unwrap_or_default();
    let selector = pod
        .node_selector
        .map(|s| serde_json::to_value(s).expect("json"));
    (c.args.clone().unwrap_or_default(), caps, selector)
}

#[test]
fn the_migration_overlays_build_into_their_steps() {
    let Some(base) = kustomize(".") else {
        xlb_tests::skip("kubectl is not installed (apt-get install kubectl, or any kubectl 1.14+)");
        return;
    };
    let kinds: BTreeSet<&str> = base.iter().map(kind).collect();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet",
            "ServiceAccount"
        ]
        .into()
    );
    let (args, _, selector) = xlb_agent(&base);
    assert!(
        args.is_empty() && selector.is_none(),
        "the base: every node, no mode"
    );

    let shadow = kustomize("migrate/shadow").expect("kubectl");
    let (args, caps, selector) = xlb_agent(&shadow);
    assert_eq!(args, ["--shadow"]);
    assert_eq!(
        caps,
        ["BPF", "NET_ADMIN", "NET_RAW"],
        "legacy iptables-save needs NET_RAW"
    );
    assert_eq!(selector, None, "shadow runs on every node");

    let takeover = kustomize("migrate/takeover").expect("kubectl");
    let (args, caps, selector) = xlb_agent(&takeover);
    assert_eq!(args, ["--takeover-from", "kube-proxy"]);
    assert_eq!(caps, ["BPF", "NET_ADMIN", "NET_RAW"]);
    assert_eq!(
        selector,
        Some(serde_json::json!({"xlb.io/datapath": "true"}))
    );

    // kube-proxy's DaemonSet keeps off exactly the nodes the takeover selects, and the
    // overlay touches nothing else.
    let exclude = kustomize("migrate/kube-proxy-exclude").expect("kubectl");
    assert_eq!(exclude.len(), 1);
    let kp = daemon_set(&exclude, "kube-proxy");
    assert_eq!(kp["metadata"]["namespace"], "kube-system");
    let terms = &kp["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    assert_eq!(
        terms,
        &serde_json::json!([{"matchExpressions": [
            {"key": "xlb.io/datapath", "operator": "NotIn", "values": ["true"]}
        ]}])
    );

    // Rollback: the same manager's kube-proxy with nothing of its own.
    let rollback = kustomize("migrate/rollback").expect("kubectl");
    assert_eq!(rollback.len(), 1);
    let kp = daemon_set(&rollback, "kube-proxy");
    assert_eq!(kp["metadata"]["namespace"], "kube-system");
    assert!(kp.get("spec").is_none(), "no affinity left: {kp}");
}
