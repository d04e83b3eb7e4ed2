//! Desired state and make-before-break writes, without the kernel: golden dumps of fixture
//! inputs, the order of writes, and full maps.

use std::path::Path;

use lb_common::{SvcKey, SvcValue};
use lb_userspace::{
    datapath::{
        sync::apply,
        writer::{MapWriter, MemoryMaps, WriteError},
    },
    desired::{self, Desired, Limits},
    model::Model,
    reconcile::{self, Ids},
    source::file,
};

fn load(path: &Path) -> lb_userspace::source::Snapshot {
    file::load(path).unwrap_or_else(|e| panic!("{e}"))
}

/// Errors and the desired dump, as a golden file holds them (computed on `node`).
fn render(path: &Path, node: &desired::NodeContext) -> String {
    let loaded = load(path);
    let (d, problems) =
        desired::compute_on(&loaded.model, node, &mut Ids::default(), Limits::default());
    let mut out = String::new();
    let mut errors: Vec<String> = loaded.errors.iter().map(|e| e.to_string()).collect();
    errors.extend(problems.iter().map(|p| p.to_string()));
    errors.sort();
    for e in errors {
        out.push_str(&format!("# error: {e}\n"));
    }
    out.push_str(&d.dump());
    out
}

/// Compares with `<name>.desired.txt`; `XLB_BLESS=1` rewrites it.
fn golden(input: &Path, expected: &Path) {
    golden_on(input, expected, &desired::NodeContext::default());
}

fn golden_on(input: &Path, expected: &Path, node: &desired::NodeContext) {
    let got = render(input, node);
    if std::env::var_os("XLB_BLESS").is_some() {
        std::fs::write(expected, &got).expect("bless");
        return;
    }
    let want = std::fs::read_to_string(expected).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with XLB_BLESS=1 to create it)",
            expected.display()
        )
    });
    assert_eq!(got, want, "golden mismatch for {}", input.display());
}

fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

#[test]
fn golden_demo_services() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    golden(
        &root.join("examples/demo-services.yaml"),
        &fixtures().join("demo.desired.txt"),
    );
}

#[test]
fn golden_multi_slice_multi_port() {
    golden(
        &fixtures().join("multi.yaml"),
        &fixtures().join("multi.desired.txt"),
    );
}

#[test]
fn golden_traffic_policies_topology_and_affinity_on_node1() {
    let mut node = desired::NodeContext::new("node1", &["192.168.0.2".parse().expect("ip")], false);
    node.node.zone = Some("z1".into());
    golden_on(
        &fixtures().join("policies.yaml"),
        &fixtures().join("policies.desired.txt"),
        &node,
    );
}

#[test]
fn golden_ipv6_source_ranges_on_node1() {
    let addrs = [
        "192.168.0.2".parse().expect("ip"),
        "2001:db8:1::2".parse().expect("ip"),
    ];
    golden_on(
        &fixtures().join("ranges6.yaml"),
        &fixtures().join("ranges6.desired.txt"),
        &desired::NodeContext::new("node1", &addrs, false),
    );
}

#[test]
fn golden_bad_input() {
    golden(
        &fixtures().join("bad.yaml"),
        &fixtures().join("bad.desired.txt"),
    );
}

/// A writer that checks, after every single write, that no programmed slot names a missing
/// backend and every service entry's slots exist: the make-before-break invariant.
struct Checked {
    inner: MemoryMaps,
}

impl Checked {
    fn check(&self, op: &str) {
        let s = &self.inner.state;
        for (k, v) in &s.services {
            assert_eq!(v.slots.len(), v.count as usize, "after `{op}`: {k:?}");
            for (i, id) in v.slots.iter().enumerate() {
                assert!(
                    s.backends.contains_key(id),
                    "after `{op}`: {k:?} slot {} names missing backend {id}",
                    i + 1
                );
            }
        }
        // Every frontend and every backend programmed has its address filter bit set (a clear
        // bit hides it from the datapath).
        let live = lb_userspace::desired::live_filter_bits(s, lb_common::FilterSize::DEFAULT);
        assert!(
            live.is_subset(&s.filter),
            "after `{op}`: filter bits {:?} missing",
            live.difference(&s.filter).collect::<Vec<_>>()
        );
        // A frontend limited to source ranges has its ranges in before it is flagged.
        for (k, v) in s
            .services
            .iter()
            .filter(|(_, v)| v.flags & lb_common::SVC_F_SRC_RANGES != 0)
        {
            assert!(
                s.src_ranges.iter().any(|r| r.svc_id == v.svc_id),
                "after `{op}`: {k:?} is limited to source ranges it does not have"
            );
        }
        // A frontend flagged for Maglev has its table in before it is flagged.
        for (k, v) in s
            .services
            .iter()
            .filter(|(_, v)| v.flags & lb_common::SVC_F_MAGLEV != 0)
        {
            assert!(
                s.maglev.contains_key(&v.svc_id),
                "after `{op}`: {k:?} is flagged for a Maglev table it does not have"
            );
        }
    }
}

impl MapWriter for Checked {
    fn read(&self) -> Result<Desired, WriteError> {
        self.inner.read()
    }
    fn put_backend(&mut self, id: u32, be: &lb_common::Backend) -> Result<(), WriteError> {
        self.inner.put_backend(id, be)?;
        self.check("put backend");
        Ok(())
    }
    fn del_backend(&mut self, id: u32) -> Result<(), WriteError> {
        self.inner.del_backend(id)?;
        self.check("del backend");
        Ok(())
    }
    fn put_svc(&mut self, key: &SvcKey, value: &SvcValue) -> Result<(), WriteError> {
        self.inner.put_svc(key, value)?;
        self.check("put svc");
        Ok(())
    }
    fn del_svc(&mut self, key: &SvcKey) -> Result<(), WriteError> {
        self.inner.del_svc(key)?;
        self.check("del svc");
        Ok(())
    }
    fn put_slots(&mut self, base: u32, ids: &[u32]) -> Result<(), WriteError> {
        self.inner.put_slots(base, ids)?;
        self.check("put slots");
        Ok(())
    }
    fn put_name(&mut self, id: u32, name: &desired::ObjectName) -> Result<(), WriteError> {
        self.inner.put_name(id, name)
    }
    fn del_name(&mut self, id: u32) -> Result<(), WriteError> {
        self.inner.del_name(id)
    }
    fn put_src_range(&mut self, r: &lb_userspace::desired::SrcRange) -> Result<(), WriteError> {
        self.inner.put_src_range(r)?;
        self.check("put range");
        Ok(())
    }
    fn del_src_range(&mut self, r: &lb_userspace::desired::SrcRange) -> Result<(), WriteError> {
        self.inner.del_src_range(r)?;
        self.check("del range");
        Ok(())
    }
    fn put_filter_word(&mut self, word: u32, bits: u64) -> Result<(), WriteError> {
        self.inner.put_filter_word(word, bits)?;
        self.check("put filter word");
        Ok(())
    }
    fn put_maglev(
        &mut self,
        id: u32,
        table: &lb_userspace::desired::MaglevTable,
    ) -> Result<(), WriteError> {
        self.inner.put_maglev(id, table)?;
        self.check("put maglev");
        Ok(())
    }
    fn del_maglev(&mut self, id: u32) -> Result<(), WriteError> {
        self.inner.del_maglev(id)?;
        self.check("del maglev");
        Ok(())
    }
}

fn model_with(backends: &[&str]) -> Model {
    let ips: Vec<std::net::Ipv4Addr> = backends.iter().map(|b| b.parse().expect("ip")).collect();
    let yaml = xlb_tests::services::service_yaml(
        "web",
        "10.96.0.10".parse().expect("ip"),
        80,
        "TCP",
        8080,
        &ips,
    );
    file::parse("t.yaml", &yaml).expect("yaml").model
}

#[test]
fn every_sync_is_make_before_break() {
    let mut w = Checked {
        inner: MemoryMaps::default(),
    };
    let mut ids = Ids::default();
    let mut current = Desired::default();
    let steps: [&[&str]; 6] = [
        &["10.0.0.1", "10.0.0.2", "10.0.0.3"],
        &["10.0.0.2", "10.0.0.3"],
        &["10.0.0.4", "10.0.0.5", "10.0.0.2", "10.0.0.6"],
        &[],
        &["10.0.0.7"],
        &["10.0.0.1", "10.0.0.2", "10.0.0.3"],
    ];
    for backends in steps {
        let (want, _) = reconcile::recompute(
            &model_with(backends),
            &desired::NodeContext::default(),
            &mut ids,
            Limits::default(),
        );
        let (now, report) = apply(&mut w, &current, &want);
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        assert_eq!(now, want);
        assert_eq!(w.inner.state, want);
        current = now;
    }
    // Deleting the service: the entry goes first (its range is left to its quarantine),
    // backends last.
    w.inner.log.clear();
    let (want, _) = reconcile::recompute(
        &Model::default(),
        &desired::NodeContext::default(),
        &mut ids,
        Limits::default(),
    );
    let (now, _) = apply(&mut w, &current, &want);
    assert_eq!(
        Desired {
            filter: Default::default(),
            ..now.clone()
        },
        Desired::default(),
        "nothing left but the address filter bits"
    );
    assert!(
        !now.filter.is_empty(),
        "the filter keeps the bits of addresses that went, for a day"
    );
    let log = &w.inner.log;
    assert_eq!(
        log.first().map(String::as_str),
        Some("del svc 10.96.0.10:80/TCP"),
        "{log:?}"
    );
    let first_backend_delete = log
        .iter()
        .position(|l| l.starts_with("del backend"))
        .expect("backend deletes");
    assert!(
        log[..first_backend_delete]
            .iter()
            .all(|l| l.starts_with("del svc") || l.starts_with("del name")),
        "{log:?}"
    );
}

#[test]
fn ids_survive_resyncs_and_adoption() {
    let mut ids = Ids::default();
    let (a, _) = reconcile::recompute(
        &model_with(&["10.0.0.1", "10.0.0.2"]),
        &desired::NodeContext::default(),
        &mut ids,
        Limits::default(),
    );
    let (b, _) = reconcile::recompute(
        &model_with(&["10.0.0.2", "10.0.0.1"]),
        &desired::NodeContext::default(),
        &mut ids,
        Limits::default(),
    );
    assert_eq!(a, b, "the same model must give the same maps");
    let mut adopted = Ids::adopt(&a);
    let (c, _) = reconcile::recompute(
        &model_with(&["10.0.0.1", "10.0.0.2"]),
        &desired::NodeContext::default(),
        &mut adopted,
        Limits::default(),
    );
    assert_eq!(
        a, c,
        "an agent that adopts the pins must compute the same maps"
    );
}

#[test]
fn a_full_map_rejects_new_services_and_keeps_programmed_ones() {
    let yaml = |names: &[&str]| {
        names
            .iter()
            .map(|n| {
                xlb_tests::services::service_yaml(
                    n,
                    format!("10.96.0.{}", n.as_bytes()[0]).parse().expect("ip"),
                    80,
                    "TCP",
                    8080,
                    &[
                        "10.0.0.1".parse().expect("ip"),
                        "10.0.0.2".parse().expect("ip"),
                    ],
                )
            })
            .collect::<String>()
    };
    // Each service needs 1 entry; room for 2 services.
    let limits = Limits {
        svc_entries: 2,
        backends: 100,
        ..Limits::default()
    };
    let mut ids = Ids::default();
    let m1 = file::parse("t", &yaml(&["b", "c"])).expect("yaml").model;
    let (d1, e1) = reconcile::recompute(&m1, &desired::NodeContext::default(), &mut ids, limits);
    assert!(e1.is_empty(), "{e1:?}");
    // "a" sorts first but is new: it is the one refused, and the error names the limit.
    let m2 = file::parse("t", &yaml(&["a", "b", "c"]))
        .expect("yaml")
        .model;
    let (d2, e2) = reconcile::recompute(&m2, &desired::NodeContext::default(), &mut ids, limits);
    let msgs: Vec<String> = e2.iter().map(|e| e.to_string()).collect();
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert!(
        msgs[0].contains("test/a:p")
            && msgs[0].contains(lb_common::MAP_SVC)
            && msgs[0].contains("capacity 2"),
        "{msgs:?}"
    );
    let fronts = |d: &Desired| {
        d.services
            .keys()
            .map(lb_common::user::show_frontend)
            .collect::<Vec<_>>()
    };
    assert_eq!(fronts(&d1), fronts(&d2), "programmed services must be kept");

    // A kernel map that refuses a write mid-sync: the failing service stays as it was.
    let mut w = MemoryMaps {
        svc_capacity: Some(1),
        ..MemoryMaps::default()
    };
    let (now, report) = apply(&mut w, &Desired::default(), &d1);
    assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
    assert!(
        report.errors[0]
            .to_string()
            .contains("map is full (capacity 1)")
    );
    let programmed = now.services.len();
    assert_eq!(
        programmed, 1,
        "one service fits, the other is left out whole"
    );
    assert_eq!(now, w.state);
}

#[test]
fn golden_policies_with_the_socket_hooks_on_node1() {
    // Socket LB adds NodePorts on 127.0.0.1 (cluster endpoints) and, for external frontends
    // with externalTrafficPolicy Local, an internal scope with every cluster endpoint.
    let mut node = desired::NodeContext::new("node1", &["192.168.0.2".parse().expect("ip")], true);
    node.node.zone = Some("z1".into());
    golden_on(
        &fixtures().join("policies.yaml"),
        &fixtures().join("policies.socket-lb.desired.txt"),
        &node,
    );
}

#[test]
fn internal_policy_local_refuses_without_any_endpoint_and_drops_without_a_local_one() {
    // kube-proxy: "has no endpoints" → REJECT; "has no local endpoints" → DROP.
    let yaml = |eps: &str| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{namespace: ns, name: web}}\nspec:\n  clusterIP: 10.96.0.1\n  internalTrafficPolicy: Local\n  ports: [{{name: p, port: 80, protocol: TCP}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{namespace: ns, name: web-1, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{name: p, port: 8080, protocol: TCP}}]\nendpoints: {eps}\n"
        )
    };
    let node = desired::NodeContext::new("node1", &[], false);
    for (eps, drops) in [
        ("[]", false),
        (
            "[{addresses: [10.244.9.9], conditions: {ready: true}, nodeName: node2}]",
            true,
        ),
    ] {
        let loaded = file::parse("t.yaml", &yaml(eps)).expect("yaml");
        let (d, _) =
            desired::compute_on(&loaded.model, &node, &mut Ids::default(), Limits::default());
        let entry = d
            .services
            .values()
            .next()
            .map(|v| v.value)
            .expect("service entry");
        assert_eq!(entry.count, 0, "{eps}");
        assert_eq!(
            entry.flags & lb_common::SVC_F_DROP_EMPTY != 0,
            drops,
            "endpoints {eps}: {}",
            d.dump()
        );
    }
}
