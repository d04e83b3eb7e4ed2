//! One sync after another on memory maps: a failed write is retried per service.

use std::time::Duration;

use super::*;
use crate::{datapath::writer::MemoryMaps, model::intern, source::file};

fn svc(name: &str, ip: &str, backends: &[&str]) -> String {
    let mut y = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: ns, name: {name}}}\nspec:\n  clusterIP: {ip}\n  ports: [{{name: p, port: 80, protocol: TCP}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{namespace: ns, name: {name}-1, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: p, port: 8080, protocol: TCP}}]\nendpoints:\n"
    );
    for b in backends {
        y.push_str(&format!(
            "- {{addresses: [{b}], conditions: {{ready: true}}}}\n"
        ));
    }
    y
}

fn id(name: &str) -> ServiceRef {
    ServiceRef {
        namespace: intern("ns"),
        name: intern(name),
    }
}

/// A reconciler on memory maps, and its model.
struct Bench {
    model: Model,
    books: Reconciler,
    maps: MemoryMaps,
    /// The next sync is a full one.
    full: bool,
}

impl Bench {
    fn new(yaml: &str, backoff: Duration) -> Self {
        let mut books = Reconciler::adopt(Desired::default(), Limits::default());
        books.retries = Retries::with_backoff(backoff);
        let mut b = Bench {
            model: file::parse("t.yaml", yaml).expect("yaml").model,
            books,
            maps: MemoryMaps::default(),
            full: false,
        };
        assert_eq!(b.sync(&[]), 0);
        b
    }

    /// A sync of `changed` against `yaml` (the whole model); its errors.
    fn change(&mut self, yaml: &str, changed: &[&str]) -> u64 {
        self.model = file::parse("t.yaml", yaml).expect("yaml").model;
        self.sync(changed)
    }

    fn sync(&mut self, changed: &[&str]) -> u64 {
        let changed = changed.iter().map(|n| id(n)).collect();
        let full = std::mem::take(&mut self.full);
        let node = NodeContext::default();
        let s = self
            .books
            .sync(&self.model, &node, &mut self.maps, full, &changed, false);
        s.errors
    }

    /// The next sync is an incremental one.
    fn incremental(&self) -> bool {
        !self.full && !self.books.needs_full()
    }
}

#[test]
fn a_service_a_full_map_refuses_is_retried_alone_while_the_others_sync_incrementally() {
    let web = |b: &str| svc("web", "10.96.0.1", &["10.244.0.1", b]);
    let api = svc("api", "10.96.0.2", &["10.244.0.3", "10.244.0.4"]);
    // A long backoff: api is not retried by web's sync.
    let mut b = Bench::new(&web("10.244.0.2"), Duration::from_secs(3600));
    b.maps.svc_capacity = Some(b.maps.state.services.len());
    let both = web("10.244.0.2") + &api;
    assert!(b.change(&both, &["api"]) > 0, "the full map refuses api");
    assert!(b.incremental(), "a failed write makes no full sync");
    assert_eq!(b.books.retries.tries(), [("ns/api:p".to_string(), 1)]);
    // web changes an endpoint (the same number of slots): applied incrementally, api
    // not tried again before its time.
    let moved = web("10.244.0.9") + &api;
    assert_eq!(b.change(&moved, &["web"]), 0);
    assert!(b.incremental());
    assert_eq!(b.books.retries.tries(), [("ns/api:p".to_string(), 1)]);
    let be: Vec<String> = b
        .maps
        .state
        .backends
        .values()
        .map(lb_common::user::show_backend)
        .collect();
    assert!(be.iter().any(|s| s.contains("10.244.0.9")), "{be:?}");
    assert!(!be.iter().any(|s| s.contains("10.244.0.2")), "{be:?}");
    // With room again, api's retry programs it, alone.
    b.maps.svc_capacity = None;
    b.books.retries.make_due();
    b.maps.log.clear();
    assert_eq!(b.sync(&[]), 0);
    assert_eq!(b.books.retries.len(), 0);
    assert_eq!(b.maps.state.services, b.books.desired().services);
    assert!(
        b.maps.log.iter().all(|l| !l.contains("10.96.0.1")),
        "only api is written: {:?}",
        b.maps.log
    );
}

#[test]
fn a_due_retry_that_still_fails_backs_off_and_the_others_still_sync() {
    let web = |b: &str| svc("web", "10.96.0.1", &["10.244.0.1", b]);
    let api = svc("api", "10.96.0.2", &["10.244.0.3"]);
    let mut b = Bench::new(&web("10.244.0.2"), Duration::ZERO);
    b.maps.svc_capacity = Some(b.maps.state.services.len());
    let both = web("10.244.0.2") + &api;
    assert!(b.change(&both, &["api"]) > 0);
    // Due at once (no backoff here): every sync tries api again, and web's change
    // still applies.
    let moved = web("10.244.0.9") + &api;
    assert!(b.change(&moved, &["web"]) > 0, "api still fails");
    assert!(b.incremental());
    assert_eq!(b.books.retries.tries(), [("ns/api:p".to_string(), 2)]);
    let be: Vec<String> = b
        .maps
        .state
        .backends
        .values()
        .map(lb_common::user::show_backend)
        .collect();
    assert!(
        be.iter().any(|s| s.contains("10.244.0.9")) && !be.iter().any(|s| s.contains("10.244.0.2")),
        "web's change is applied: {be:?}"
    );
    // A full sync (the prune) takes it in too, and keeps it failing, not lost.
    b.full = true;
    assert!(b.sync(&[]) > 0);
    assert_eq!(b.books.retries.tries(), [("ns/api:p".to_string(), 3)]);
    b.maps.svc_capacity = None;
    assert_eq!(b.sync(&[]), 0);
    assert_eq!(b.books.retries.len(), 0);
    assert_eq!(b.maps.state, *b.books.desired());
}
