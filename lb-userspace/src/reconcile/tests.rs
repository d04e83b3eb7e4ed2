//! One sync after another on memory maps: a failed write is retried per service.

use std::time::Duration;

use super::*;
use crate::{datapath::writer::MemoryMaps, source::file};

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
    ServiceRef::new("ns", name)
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
        self.sync_told(changed).0
    }

    /// A sync's errors and transitions, each as `Failed|Recovered service frontend reason`.
    fn sync_told(&mut self, changed: &[&str]) -> (u64, Vec<String>) {
        let changed = changed.iter().map(|n| id(n)).collect();
        let full = std::mem::take(&mut self.full);
        let node = NodeContext::default();
        let scope = match full {
            true => Scope::Everything,
            false => Scope::Changed(&changed),
        };
        let s = self
            .books
            .sync(&self.model, &node, &mut self.maps, scope, GoneUdp::Ignore);
        let told = s.transitions.iter().map(|t| match t {
            Transition::Failed {
                service,
                frontend,
                reason,
                ..
            } => format!("Failed {service} {frontend} {reason}"),
            Transition::Recovered {
                service,
                frontend,
                reason,
                ..
            } => format!("Recovered {service} {frontend} {reason}"),
        });
        (s.errors, told.collect())
    }

    /// The next sync is an incremental one.
    fn incremental(&self) -> bool {
        !self.full && !self.books.needs_full()
    }
}

#[test]
fn a_first_sync_into_empty_maps_records_no_copy_and_one_that_fails_reads_back_what_it_wrote() {
    let web = svc("web", "10.96.0.1", &["10.244.0.1", "10.244.0.2"]);
    let api = svc("api", "10.96.0.2", &["10.244.0.3", "10.244.0.4"]);
    let ok = Bench::new(&web, Duration::from_secs(3600));
    assert_eq!(ok.maps.state, *ok.books.desired(), "everything written");
    assert!(
        ok.incremental(),
        "nothing is kept apart from the desired state"
    );
    // The same first sync with room for one frontend only: the other one is refused,
    // retried alone once there is room, and only it is written then.
    let mut books = Reconciler::adopt(Desired::default(), Limits::default());
    books.retries = Retries::with_backoff(Duration::from_secs(3600));
    let mut b = Bench {
        model: file::parse("t.yaml", &(web.clone() + &api))
            .expect("yaml")
            .model,
        books,
        maps: MemoryMaps {
            svc_capacity: Some(1),
            ..MemoryMaps::default()
        },
        full: false,
    };
    assert!(b.sync(&[]) > 0, "the full map refuses a frontend");
    assert_eq!(b.maps.state.services.len(), 1);
    assert_eq!(
        b.books.retries.len(),
        1,
        "the refused service is kept for its retry"
    );
    assert!(
        b.incremental(),
        "what was written is read back, no full sync follows"
    );
    b.maps.svc_capacity = None;
    b.books.retries.make_due();
    b.maps.log.clear();
    assert_eq!(b.sync(&[]), 0);
    assert_eq!(b.books.retries.len(), 0);
    assert_eq!(b.maps.state, *b.books.desired());
    let writes = |what: &str| b.maps.log.iter().filter(|l| l.starts_with(what)).count();
    assert_eq!(
        (writes("put slots"), writes("put svc")),
        (1, 1),
        "only the refused frontend: {:?}",
        b.maps.log
    );
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

#[test]
fn what_is_given_back_while_a_write_fails_is_held_until_the_maps_hold_the_desired_state() {
    let web = |b: &str| svc("web", "10.96.0.1", &["10.244.0.1", b]);
    let api = svc("api", "10.96.0.2", &["10.244.0.3"]);
    let mut b = Bench::new(&web("10.244.0.2"), Duration::from_secs(3600));
    assert_eq!(b.books.ids.held(), 0);
    // web's backend is replaced: its index is given back; a clean sync confirms it.
    assert_eq!(b.change(&web("10.244.0.5"), &["web"]), 0);
    assert_eq!(b.books.ids.held(), 0, "confirmed by the clean sync");
    // api's write fails: what web gives back meanwhile is held (a failed write's entry may
    // still name it), however many syncs pass…
    b.maps.svc_capacity = Some(b.maps.state.services.len());
    assert!(b.change(&(web("10.244.0.5") + &api), &["api"]) > 0);
    assert_eq!(b.change(&(web("10.244.0.6") + &api), &["web"]), 0);
    assert_eq!(b.change(&(web("10.244.0.7") + &api), &["web"]), 0);
    assert_eq!(b.books.ids.held(), 2, "web's two old backend indices");
    // …until the maps hold the desired state: then their quarantine starts.
    b.maps.svc_capacity = None;
    b.books.retries.make_due();
    assert_eq!(b.sync(&[]), 0);
    assert_eq!(b.books.ids.held(), 0);
}

#[test]
fn a_failed_write_is_a_failing_frontend_told_once_and_its_recovery_once() {
    let web = svc("web", "10.96.0.1", &["10.244.0.1"]);
    let api = svc("api", "10.96.0.2", &["10.244.0.3"]);
    let mut b = Bench::new(&web, Duration::ZERO);
    b.maps.svc_capacity = Some(b.maps.state.services.len());
    b.model = file::parse("t.yaml", &(web.clone() + &api))
        .expect("yaml")
        .model;
    let (errors, told) = b.sync_told(&["api"]);
    assert!(errors > 0);
    assert_eq!(told, ["Failed ns/api ns/api:p WriteFailed"]);
    // Retried (and failing) at every sync: nothing more to tell; web changing neither.
    assert_eq!(b.sync_told(&[]).1, Vec::<String>::new());
    assert_eq!(b.sync_told(&["web"]).1, Vec::<String>::new());
    assert_eq!(b.books.statuses().counts()[&Reason::WriteFailed], 1);
    b.maps.svc_capacity = None;
    assert_eq!(
        b.sync_told(&[]),
        (0, vec!["Recovered ns/api ns/api:p WriteFailed".to_string()])
    );
    assert_eq!(b.sync_told(&[]).1, Vec::<String>::new());
    assert_eq!(b.books.statuses().failing().count(), 0);
}

#[test]
fn a_service_the_limits_leave_out_fails_until_it_fits_and_healthy_ones_are_never_told() {
    let web = svc("web", "10.96.0.1", &["10.244.0.1"]);
    let api = svc("api", "10.96.0.2", &["10.244.0.3"]);
    let mut b = Bench::new(&web, Duration::ZERO);
    // Room for web's entry, not for api's.
    b.books.limits.svc_entries = 1;
    b.model = file::parse("t.yaml", &(web.clone() + &api))
        .expect("yaml")
        .model;
    let (_, told) = b.sync_told(&["api"]);
    assert_eq!(told, ["Failed ns/api ns/api:p MapFull"]);
    match b.books.statuses().status(&id("api"), "ns/api:p") {
        Status::Failed(f) => assert!(f.message.contains("is full (capacity 1"), "{}", f.message),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        b.books.statuses().status(&id("web"), "ns/web:p"),
        Status::Programmed
    );
    // The prune computes everything again: the same failure, not told again.
    b.full = true;
    assert_eq!(b.sync_told(&[]).1, Vec::<String>::new());
    // web goes: the room it made is retried at once, and api is told it recovered.
    b.model = file::parse("t.yaml", &api).expect("yaml").model;
    assert_eq!(b.sync_told(&["web"]).1, Vec::<String>::new());
    assert!(
        b.books
            .next_retry()
            .is_some_and(|at| at <= std::time::Instant::now())
    );
    let (_, told) = b.sync_told(&[]);
    assert_eq!(told, ["Recovered ns/api ns/api:p MapFull"]);
    assert_eq!(b.books.next_retry(), None);
    assert_eq!(b.maps.state.services, b.books.desired().services);
    // A deleted failing Service is forgotten without a word.
    b.books.limits.svc_entries = 0;
    b.full = true;
    assert_eq!(b.sync_told(&[]).1, ["Failed ns/api ns/api:p MapFull"]);
    b.model = Model::default();
    assert_eq!(b.sync_told(&["api"]).1, Vec::<String>::new());
    assert_eq!(b.books.statuses().failing().count(), 0);
}

#[test]
fn a_failing_ipv6_frontend_is_filed_under_its_service() {
    // The suffix's address holds colons: the Service is still `ns/web`, not `web:http (…`.
    let id = super::service_of("ns/web:http (nodePort fd00::1)");
    assert_eq!(id, Some(ServiceRef::new("ns", "web")));
    let id = super::service_of("ns/web:http (nodePort 10.0.0.1)");
    assert_eq!(id, Some(ServiceRef::new("ns", "web")));
}

#[test]
fn freed_room_wakes_as_many_left_out_services_in_turn_not_all_of_them() {
    let web = svc("web", "10.96.0.1", &["10.244.0.1"]);
    let mut b = Bench::new(&web, Duration::ZERO);
    b.books.limits.svc_entries = 1;
    let others: String = (2..7)
        .map(|i| svc(&format!("s{i}"), &format!("10.96.0.{i}"), &["10.244.0.9"]))
        .collect();
    b.model = file::parse("t.yaml", &(web.clone() + &others))
        .expect("yaml")
        .model;
    let names: Vec<String> = (2..7).map(|i| format!("s{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let (_, told) = b.sync_told(&refs);
    assert_eq!(told.len(), 5, "{told:?}");
    let woken = |b: &mut Bench, n| -> Vec<String> {
        b.books
            .wake(n)
            .into_iter()
            .map(|id| id.name.to_string())
            .collect()
    };
    // As many as the room freed, the next ones each time, round.
    assert_eq!(woken(&mut b, 2), ["s2", "s3"]);
    assert_eq!(woken(&mut b, 2), ["s4", "s5"]);
    assert_eq!(woken(&mut b, 2), ["s2", "s6"]);
    assert_eq!(woken(&mut b, 0), ["s3"], "one at least");
    // web goes: its one entry lets one in, the next in turn; the others still wait.
    b.model = file::parse("t.yaml", &others).expect("yaml").model;
    b.sync_told(&["web"]);
    let (_, told) = b.sync_told(&[]);
    assert_eq!(told, ["Recovered ns/s4 ns/s4:p MapFull"]);
    assert_eq!(b.books.statuses().failing().count(), 4);
}

#[test]
fn a_problem_is_logged_when_it_appears_or_changes_and_a_sync_logs_a_bounded_number() {
    use super::{LOGGED_PER_SYNC, ProblemLog};
    let problem = |o: &str| DesiredError::Unsupported {
        object: o.into(),
        what: "x".into(),
    };
    let mut logged = std::collections::HashMap::new();
    let (web, api) = (id("web"), id("api"));
    let mut log = ProblemLog::default();
    log.note(&web, &[problem("ns/web:p")], &mut logged);
    log.note(&web, &[problem("ns/web:p")], &mut logged);
    assert_eq!(log.lines, 1, "the same problem again is not logged");
    log.note(&web, &[problem("ns/web:q")], &mut logged);
    assert_eq!(log.lines, 2, "a changed one is");
    let many: Vec<DesiredError> = (0..LOGGED_PER_SYNC + 10)
        .map(|i| problem(&format!("ns/api:{i}")))
        .collect();
    log.note(&api, &many, &mut logged);
    assert_eq!((log.lines, log.more), (LOGGED_PER_SYNC, 12));
}

/// A LoadBalancer `ns/{name}` on both families (LoadBalancer IPs 203.0.113.9 and
/// 2001:db8:100::9) admitting `ranges`, one endpoint per family.
fn dual_stack_lb(name: &str, ranges: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: ns, name: {name}}}\nspec:\n  type: LoadBalancer\n  clusterIP: 10.96.1.1\n  clusterIPs: [10.96.1.1, \"fd00::1\"]\n  ipFamilies: [IPv4, IPv6]\n  loadBalancerSourceRanges: {ranges}\n  ports: [{{name: p, port: 80, nodePort: 30080, protocol: TCP}}]\nstatus:\n  loadBalancer:\n    ingress: [{{ip: 203.0.113.9}}, {{ip: \"2001:db8:100::9\"}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{namespace: ns, name: {name}-4, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: p, port: 8080, protocol: TCP}}]\nendpoints:\n- {{addresses: [10.244.1.1], conditions: {{ready: true}}}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{namespace: ns, name: {name}-6, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv6\nports: [{{name: p, port: 8080, protocol: TCP}}]\nendpoints:\n- {{addresses: [\"fd00:244::1\"], conditions: {{ready: true}}}}\n"
    )
}

/// The running totals the fill metrics read, which must be a from-scratch count of what
/// is programmed.
fn tally(b: &Bench) -> Tally {
    let t = b.books.tally();
    assert_eq!(t, Tally::recount(b.books.programmed()), "running totals");
    t
}

#[test]
fn the_running_totals_of_slots_and_ipv6_ranges_equal_a_recount_after_every_change() {
    let web = |n: usize| {
        let backends: Vec<String> = (1..=n).map(|i| format!("10.244.0.{i}")).collect();
        let backends: Vec<&str> = backends.iter().map(String::as_str).collect();
        svc("web", "10.96.0.1", &backends)
    };
    let api = svc("api", "10.96.0.2", &["10.244.0.9"]);
    let two6 = r#"["2001:db8:1::/48", "10.0.0.0/8", "2001:db8:2::/64"]"#;
    let one6 = r#"["2001:db8:1::/48", "10.0.0.0/8"]"#;
    // A full sync: web's 3 slots take a range of 4.
    let mut b = Bench::new(&web(3), Duration::from_secs(3600));
    assert_eq!(
        tally(&b),
        Tally {
            slots: 4,
            src_ranges6: 0
        }
    );
    // Added: api (1 slot), then the load balancer with two IPv6 ranges and an IPv4 one.
    assert_eq!(b.change(&(web(3) + &api), &["api"]), 0);
    assert_eq!(tally(&b).slots, 5);
    let all = |n, ranges| web(n) + &api + &dual_stack_lb("lb", ranges);
    assert_eq!(b.change(&all(3, two6), &["lb"]), 0);
    let with_lb = tally(&b);
    assert_eq!(with_lb.src_ranges6, 2);
    assert_eq!(b.books.programmed().src_ranges.len(), 3);
    // web's range resized: 5 slots take 8.
    assert_eq!(b.change(&all(5, two6), &["web"]), 0);
    assert_eq!(tally(&b).slots, with_lb.slots + 4);
    // An IPv6 range removed, then added back.
    assert_eq!(b.change(&all(5, one6), &["lb"]), 0);
    assert_eq!(tally(&b).src_ranges6, 1);
    assert_eq!(b.change(&all(5, two6), &["lb"]), 0);
    assert_eq!(tally(&b).src_ranges6, 2);
    // Shrunk back, and api removed.
    assert_eq!(
        b.change(&(web(2) + &dual_stack_lb("lb", two6)), &["web", "api"]),
        0
    );
    assert_eq!(tally(&b).slots, with_lb.slots - 1 - 2);
    // A full sync counts the same.
    let before = tally(&b);
    b.full = true;
    assert_eq!(b.sync(&[]), 0);
    assert_eq!(tally(&b), before);
    // The load balancer removed: no IPv6 range left.
    assert_eq!(b.change(&web(2), &["lb"]), 0);
    assert_eq!(
        tally(&b),
        Tally {
            slots: 2,
            src_ranges6: 0
        }
    );
    assert!(b.incremental());
}
