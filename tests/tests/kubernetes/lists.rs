//! Lists and watches: paging at one resource version, the compaction point, nothing
//! programmed before the initial lists, watches from the current state.

use std::{net::Ipv4Addr, time::Duration};

use xlb_tests::suites::kubernetes::{
    Load, SERVICES, SLICES, WAIT, WEB, launch, ready, service, slice, start,
};
use xlb_tests::{
    apiserver::{ApiServer, Gate},
    require_root,
    scenario::TCP_PORT,
    topology::pod_ip,
};

#[test]
fn a_watch_from_the_compaction_point_is_served() {
    if !require_root() {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
    let mut c = start("xc", false, &[]);
    c.api.apply_yaml(&service("web", WEB, "")).expect("svc");
    c.api.apply_yaml(&slice("web", &ready(&b))).expect("slice");
    c.wait_backends(3);
    c.wait_watches_current();
    let lists = c.api.served().iter().filter(|s| !s.is_watch()).count();

    // Compacted at the agent's own resourceVersion: its re-watches are served, no relist.
    c.api.compact();
    c.api.cut_watches();
    c.api
        .apply_yaml(&slice("web", &ready(&b[..2])))
        .expect("slice");
    c.wait_backends(2);
    c.wait_watches_current();
    assert_eq!(
        c.api.served().iter().filter(|s| !s.is_watch()).count(),
        lists,
        "a watch from the compaction point was refused (the agent relisted): {:#?}",
        c.api.requests()
    );
    assert_eq!(c.api.watch_errors(), vec![], "no watch may get 410 here");

    // One change older than the compaction point: 410 Gone, a relist, the change arrives.
    c.api
        .apply_unseen(&slice("web", &ready(&b[..1])))
        .expect("slice");
    c.wait_backends(1);
    assert!(
        c.api.watch_errors().iter().any(|(_, code)| *code == 410),
        "a watch from before the compaction point must get 410: {:?}",
        c.api.watch_errors()
    );
    assert!(c.lists(SLICES).len() >= 2, "no relist after 410");
}

/// Service `m{i}` (ClusterIP in 10.97/16) and its EndpointSlice (one ready endpoint).
fn numbered(i: usize, port: u16) -> [serde_json::Value; 2] {
    let name = format!("m{i:04}");
    let ip = Ipv4Addr::new(10, 97, (i / 200) as u8, (i % 200 + 1) as u8);
    [
        serde_json::json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "test", "name": name},
            "spec": {"clusterIP": ip.to_string(), "ports": [{"name": "http", "port": port, "protocol": "TCP"}]}}),
        serde_json::json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"namespace": "test", "name": format!("{name}-abc"), "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": TCP_PORT, "protocol": "TCP"}],
            "endpoints": [{"addresses": [pod_ip(2).to_string()], "conditions": {"ready": true}}]}),
    ]
}

fn frontend_of(i: usize, port: u16) -> String {
    format!("10.97.{}.{}:{port}/TCP", i / 200, i % 200 + 1)
}

#[test]
fn lists_are_paged_at_one_resource_version() {
    if !require_root() {
        return;
    }
    const MANY: usize = 1200;
    let mut c = start("xp", true, &[]);
    c.api.apply_all((0..MANY).flat_map(|i| numbered(i, 80)));
    // The agent gets the first page of Services, then waits for the second.
    c.api.hold("Service", Gate::Continues);
    c.api.hold_lists(false);
    c.wait_server("a second page of Services asked for", WAIT, |api| {
        api.held_requests("Service") == 1
    });
    // Changes between the pages: the rest of the list stays the first page's snapshot, the
    // watch from its resourceVersion brings them.
    c.api.delete("Service", "test/m0000");
    c.api.apply(numbered(700, 81)[0].clone());
    c.api.apply_all(numbered(MANY, 80));
    c.api.release("Service", Gate::Continues);
    let want_in = [frontend_of(700, 81), frontend_of(MANY, 80)];
    let want_out = [frontend_of(0, 80), frontend_of(700, 80)];
    let took = c
        .agent
        .wait_for(Duration::from_secs(30), |rows| {
            let fronts: std::collections::BTreeSet<&str> =
                rows.iter().map(|r| r.frontend.as_str()).collect();
            fronts.len() == MANY
                && want_in.iter().all(|f| fronts.contains(f.as_str()))
                && want_out.iter().all(|f| !fronts.contains(f.as_str()))
        })
        .expect("every Service of the paged list, with the changes");
    eprintln!("{MANY} services programmed {took:?} after the second page");
    for path in [SERVICES, SLICES] {
        let pages = c.lists(path);
        assert_eq!(pages.len(), 3, "{path}: 3 pages of 500: {pages:#?}");
        assert!(pages.iter().all(|p| p.target.contains("limit=500")));
        assert_eq!(pages.iter().filter(|p| p.is_continue()).count(), 2);
        assert!(
            pages.iter().all(|p| p.list_rv == pages[0].list_rv),
            "{path}: every page at the first page's resourceVersion: {pages:#?}"
        );
    }

    // An expired continue token: the agent starts its list over, and keeps the datapath.
    c.api.hold("EndpointSlice", Gate::Continues);
    c.api
        .apply_unseen(&serde_json::to_string(&numbered(1, 82)[0]).expect("json"))
        .expect("svc");
    c.wait_server("a second page of slices asked for", WAIT, |api| {
        api.held_requests("EndpointSlice") == 1
    });
    // While it waits: a slice moves to another pod and the history is compacted past the
    // list's resourceVersion. Only the restarted list can bring that change.
    let mut moved = numbered(2, 80)[1].clone();
    moved["endpoints"][0]["addresses"][0] = serde_json::json!(pod_ip(3).to_string());
    c.api.apply(moved);
    c.api.compact();
    let rows = lb_userspace::list::services(&xlb_tests::pins(&c.agent.pins)).expect("rows");
    assert_eq!(
        rows.len(),
        MANY,
        "a relist in progress changed the datapath"
    );
    c.api.release("EndpointSlice", Gate::Continues);
    let moved_to = vec![format!("{}:{TCP_PORT}/TCP", pod_ip(3))];
    c.agent
        .wait_for(Duration::from_secs(30), |rows| {
            rows.len() == MANY
                && rows.iter().any(|r| r.frontend == frontend_of(1, 82))
                && rows
                    .iter()
                    .any(|r| r.frontend == frontend_of(2, 80) && r.backends == moved_to)
        })
        .expect("the changes after a restarted list");
    let slices = c.lists(SLICES);
    let expired = slices
        .iter()
        .position(|p| p.is_continue() && p.status == 410)
        .unwrap_or_else(|| panic!("no 410 for an expired continue token: {slices:#?}"));
    assert!(
        slices[expired + 1..]
            .iter()
            .any(|p| !p.is_continue() && p.status == 200),
        "the list did not start over after 410: {slices:#?}"
    );
}

#[test]
fn no_service_is_programmed_before_its_endpoint_slices_are_listed() {
    if !require_root() {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
    let mut c = launch(
        "xe",
        true,
        |api| {
            api.apply_yaml(&service("web", WEB, "")).expect("svc");
            api.apply_yaml(&slice("web", &ready(&b))).expect("slice");
            api.hold("EndpointSlice", Gate::Lists);
        },
        &[],
    );
    let services_listed = |api: &ApiServer| {
        api.held_requests("EndpointSlice") == 1
            && api
                .served()
                .iter()
                .any(|s| s.is_for(SERVICES) && !s.is_watch() && s.status == 200)
    };
    c.wait_server(
        "Services listed, EndpointSlices held",
        WAIT,
        services_listed,
    );
    std::thread::sleep(Duration::from_millis(1000));
    let rows = lb_userspace::list::services(&xlb_tests::pins(&c.agent.pins)).unwrap_or_default();
    assert!(
        rows.is_empty(),
        "Services were programmed before the EndpointSlice list completed: {rows:?}"
    );
    c.api.release("EndpointSlice", Gate::Lists);
    c.wait_backends(3);

    // A restarted agent, with EndpointSlices held: the pinned datapath keeps serving.
    let load = Load::start(&c);
    std::thread::sleep(Duration::from_millis(200));
    c.api.hold("EndpointSlice", Gate::Lists);
    let before = c.api.served().len();
    c.agent
        .restart(c.workdir.join("agent2.log"))
        .expect("restart");
    c.wait_server(
        "the new agent's Services listed, EndpointSlices held",
        WAIT,
        |api| {
            api.held_requests("EndpointSlice") == 1
                && api.served()[before..]
                    .iter()
                    .any(|s| s.is_for(SERVICES) && !s.is_watch() && s.status == 200)
        },
    );
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(c.backends_of().len(), 3, "the restarted agent emptied web");
    // …and a relist of both (410) while EndpointSlices are held changes nothing either.
    c.api.release("EndpointSlice", Gate::Lists);
    c.wait_watches_current();
    c.api.hold("EndpointSlice", Gate::Lists);
    c.api
        .apply_unseen(&slice("web", &ready(&b[..2])))
        .expect("slice");
    c.wait_server("EndpointSlices relist held", WAIT, |api| {
        api.held_requests("EndpointSlice") == 1
    });
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(c.backends_of().len(), 3, "a held relist changed web");
    c.api.release("EndpointSlice", Gate::Lists);
    c.wait_backends(2);
    load.stop()
        .expect_no_failures("the restart and relists with EndpointSlices held");
}

/// What kube-rs (the agent's client) sees of watches that start without a resourceVersion.
#[derive(Debug)]
struct InitialWatches {
    /// EndpointSlice events of a watch from resourceVersion "0", then one with none.
    from_zero: Vec<String>,
    from_unset: Vec<String>,
    /// Service events of kube-runtime's watcher in streaming-list mode, to `InitDone`.
    streamed: Vec<String>,
}

/// The events of a watch of EndpointSlices from `rv` in 1.5 s: "TYPE name endpoints".
async fn slice_events(
    api: &kube::Api<k8s_openapi::api::discovery::v1::EndpointSlice>,
    rv: &str,
) -> Result<Vec<String>, String> {
    use futures::StreamExt;
    use kube::{ResourceExt, api::WatchEvent};
    let stream = api
        .watch(&kube::api::WatchParams::default(), rv)
        .await
        .map_err(|e| e.to_string())?;
    let mut stream = std::pin::pin!(stream);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1500);
    let mut out = Vec::new();
    while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, stream.next()).await {
        let (kind, s) = match ev.map_err(|e| e.to_string())? {
            WatchEvent::Added(s) => ("ADDED", s),
            WatchEvent::Modified(s) => ("MODIFIED", s),
            WatchEvent::Deleted(s) => ("DELETED", s),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(e) => return Err(format!("watch from {rv:?}: {e:?}")),
        };
        out.push(format!("{kind} {} {}", s.name_any(), s.endpoints.len()));
    }
    Ok(out)
}

/// kube-runtime's watcher in streaming-list mode (`sendInitialEvents`), up to `InitDone`.
async fn streamed_services(client: kube::Client) -> Result<Vec<String>, String> {
    use futures::StreamExt;
    use kube::{ResourceExt, runtime::watcher};
    let api = kube::Api::<k8s_openapi::api::core::v1::Service>::all(client);
    let events = watcher(api, watcher::Config::default().streaming_lists());
    let mut events = std::pin::pin!(events);
    let mut out = Vec::new();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(5), events.next())
            .await
            .map_err(|_| format!("no InitDone in 5 s: {out:?}"))?
            .ok_or("the watcher ended")?
            .map_err(|e| e.to_string())?;
        out.push(match ev {
            watcher::Event::Init => "Init".to_string(),
            watcher::Event::InitApply(s) => format!("InitApply {}", s.name_any()),
            watcher::Event::InitDone => {
                out.push("InitDone".into());
                return Ok(out);
            }
            other => format!("unexpected {other:?}"),
        });
    }
}

fn initial_watches(addr: std::net::SocketAddr) -> Result<InitialWatches, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let url = format!("http://{addr}")
            .parse()
            .map_err(|e| format!("{e}"))?;
        let client = kube::Client::try_from(kube::Config::new(url)).map_err(|e| e.to_string())?;
        let slices = kube::Api::all(client.clone());
        Ok(InitialWatches {
            from_zero: slice_events(&slices, "0").await?,
            from_unset: slice_events(&slices, "").await?,
            streamed: streamed_services(client).await?,
        })
    })
}

#[test]
fn watches_without_a_resource_version_start_from_the_current_state() {
    if !require_root() {
        return;
    }
    let b: Vec<Ipv4Addr> = (2..=4).map(pod_ip).collect();
    let mut c = start("xw", false, &[]);
    // A history: web scaled 30 times, a Service created and deleted.
    c.api.apply_yaml(&service("web", WEB, "")).expect("svc");
    for i in 0..30 {
        c.api
            .apply_yaml(&slice("web", &ready(&b[..1 + i % 3])))
            .expect("slice");
    }
    c.api.apply_yaml(&slice("web", &ready(&b))).expect("slice");
    c.api
        .apply_yaml(&service("gone", Ipv4Addr::new(10, 96, 0, 30), ""))
        .expect("svc");
    c.api.delete("Service", "test/gone");
    c.wait_backends(3);
    let addr = c.api.addr;
    let seen = c
        .topo
        .node
        .run(move || initial_watches(addr))
        .expect("client thread")
        .expect("kube client");
    let current = vec!["ADDED web-abc 3".to_string()];
    assert_eq!(
        seen.from_zero, current,
        "resourceVersion=0: the state, not the history"
    );
    assert_eq!(
        seen.from_unset, current,
        "no resourceVersion: the state, not the history"
    );
    assert_eq!(seen.streamed, ["Init", "InitApply web", "InitDone"]);
    assert!(
        c.api.served().iter().any(|s| s.is_watch()
            && s.target.contains("sendInitialEvents=true")
            && s.status == 200),
        "a streaming list must be served"
    );
    // The agent, watching from resourceVersions, got no replay either: still 3 backends.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(c.backends_of().len(), 3);
}
