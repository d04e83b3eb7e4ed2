//! From the watchers' events to the source's events: a Service or an EndpointSlice
//! converted (or its removal when it is gone, not proxied or invalid), the slices filed
//! under their service so a relabelled or deleted slice leaves where it was, the Node's zone
//! and deletion, the whole state at once after the first lists, and after a relist the
//! objects that differ from what was sent.
//!
//! As kube-proxy's change trackers, the source keeps no copy of the objects: lists are
//! converted as they arrive, and what was sent is kept as a digest (a 128-bit hash per
//! object) to diff a relist against. The agent's model is the one copy.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Node;
use kube::{Resource, runtime::watcher};
use tracing::{debug, info};

use super::decoded::Decoded;
use crate::{
    model::{Name, ServiceRef, intern},
    source::{
        Snapshot,
        convert::{self, Converted},
        events::{self, Digest, Event},
        objects,
    },
};

/// A watched Service, as decoded.
pub type Service = Decoded<objects::Service>;
/// A watched EndpointSlice, as decoded.
pub type EndpointSlice = Decoded<objects::EndpointSlice>;

/// Adds a listed Service to `loaded`.
fn list_service(loaded: &mut Snapshot, svc: &Service) {
    match svc.object().and_then(convert::service) {
        Ok(Converted::Take(s)) => loaded.model.upsert_service(s),
        Ok(Converted::Ignore(why)) => loaded.ignored.push(why),
        Err(e) => loaded.errors.push(e),
    }
}

/// Adds a listed EndpointSlice to `list`, filed under its service.
fn list_slice(list: &mut SliceList, slice: &EndpointSlice) {
    match slice.object().and_then(convert::endpoint_slice) {
        Ok(Converted::Take(s)) => {
            list.filed
                .insert((slice_key(slice).0, s.name.clone()), s.service.name.clone());
            list.loaded.model.upsert_slice(s);
        }
        Ok(Converted::Ignore(why)) => list.loaded.ignored.push(why),
        Err(e) => list.loaded.errors.push(e),
    }
}

/// A relist's errors (the objects it left out) as events, and what it ignored logged.
fn report(listed: &mut Snapshot) -> Vec<Event> {
    for why in &listed.ignored {
        debug!("ignored: {why}");
    }
    std::mem::take(&mut listed.errors)
        .into_iter()
        .map(Event::Error)
        .collect()
}

/// The label that names a node's zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// True when the node is going away (kube-proxy's healthz then answers 503).
pub fn node_deleting(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_some()
        || node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == "ToBeDeletedByClusterAutoscaler"))
}

/// A watcher event of one of the three kinds (moved along at once: boxing would cost an
/// allocation per event).
#[allow(clippy::large_enum_variant)]
pub(super) enum Watched {
    Service(watcher::Event<Service>),
    Slice(watcher::Event<EndpointSlice>),
    Node(watcher::Event<Node>),
}

/// An EndpointSlice object's namespace and name (the namespace interned; a filed slice's
/// name is its model slice's, shared).
type SliceKey = (Name, Name);

/// EndpointSlice → the Service (in its namespace) it is filed under.
type Filed = HashMap<SliceKey, Name>;

/// A list of EndpointSlices: the slices converted, and where each is filed.
#[derive(Default)]
pub(super) struct SliceList {
    loaded: Snapshot,
    filed: Filed,
}

/// What the source keeps: lists in progress, the first complete ones until every kind has
/// one, the Node, which slice object is filed under which service, and a digest of what
/// was sent.
#[derive(Default)]
pub(super) struct Stores {
    /// Lists in progress (between the watcher's `Init` and `InitDone`).
    listing_services: Option<Snapshot>,
    listing_slices: Option<SliceList>,
    /// Complete first lists, held until the Services, the slices and the Node are all
    /// listed (the first state is sent whole, as kube-proxy waits for its caches to sync).
    listed_services: Option<Snapshot>,
    listed_slices: Option<Snapshot>,
    node_listed: bool,
    /// The first state was sent.
    started: bool,
    /// This node's Node (at most one object).
    node: Option<Node>,
    /// EndpointSlice → its service, for the slices sent: a deleted (or relabelled, or no
    /// longer valid) slice is removed from where it was filed.
    pub(super) filed: Filed,
    /// What was sent of each Service and slice.
    sent: Digest,
}

impl Stores {
    pub(super) fn node_event(&self) -> Event {
        Event::Node {
            deleting: self.node.as_ref().is_some_and(node_deleting),
            zone: self.node.as_ref().and_then(|n| {
                n.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(ZONE_LABEL))
                    .cloned()
            }),
        }
    }

    /// The events of one watcher event.
    pub(super) fn events(&mut self, w: Watched) -> Vec<Event> {
        match w {
            Watched::Service(e) => self.service_watched(e),
            Watched::Slice(e) => self.slice_watched(e),
            Watched::Node(e) => self.node_watched(e),
        }
    }

    fn service_watched(&mut self, e: watcher::Event<Service>) -> Vec<Event> {
        match e {
            watcher::Event::Init => {
                self.listing_services = Some(Snapshot::default());
                Vec::new()
            }
            watcher::Event::InitApply(s) => {
                if let Some(l) = &mut self.listing_services {
                    list_service(l, &s);
                }
                Vec::new()
            }
            watcher::Event::InitDone => {
                let mut listed = self.listing_services.take().unwrap_or_default();
                if self.started {
                    let mut out = report(&mut listed);
                    out.extend(self.sent.diff_services(&listed.model.services));
                    return out;
                }
                self.listed_services = Some(listed);
                self.start()
            }
            watcher::Event::Apply(s) => {
                let out = service_event(&s, false);
                self.deliver(out)
            }
            watcher::Event::Delete(s) => {
                let out = service_event(&s, true);
                self.deliver(out)
            }
        }
    }

    fn slice_watched(&mut self, e: watcher::Event<EndpointSlice>) -> Vec<Event> {
        match e {
            watcher::Event::Init => {
                self.listing_slices = Some(SliceList::default());
                Vec::new()
            }
            watcher::Event::InitApply(s) => {
                if let Some(l) = &mut self.listing_slices {
                    list_slice(l, &s);
                }
                Vec::new()
            }
            watcher::Event::InitDone => {
                let mut listed = self.listing_slices.take().unwrap_or_default();
                self.filed = std::mem::take(&mut listed.filed);
                if self.started {
                    let mut out = report(&mut listed.loaded);
                    out.extend(self.sent.diff_slices(&listed.loaded.model.slices));
                    return out;
                }
                self.listed_slices = Some(listed.loaded);
                self.start()
            }
            watcher::Event::Apply(s) => {
                let out = self.slice_events(&s, false);
                self.deliver(out)
            }
            watcher::Event::Delete(s) => {
                let out = self.slice_events(&s, true);
                self.deliver(out)
            }
        }
    }

    fn node_watched(&mut self, e: watcher::Event<Node>) -> Vec<Event> {
        match e {
            watcher::Event::Init => return Vec::new(),
            watcher::Event::InitApply(n) | watcher::Event::Apply(n) => self.node = Some(n),
            watcher::Event::Delete(_) => self.node = None,
            watcher::Event::InitDone => self.node_listed = true,
        }
        if self.started {
            vec![self.node_event()]
        } else {
            self.start()
        }
    }

    /// The first state, once every kind is listed: the Node, then everything at once.
    fn start(&mut self) -> Vec<Event> {
        if self.started
            || !self.node_listed
            || self.listed_services.is_none()
            || self.listed_slices.is_none()
        {
            return Vec::new();
        }
        let (Some(mut loaded), Some(slices)) =
            (self.listed_services.take(), self.listed_slices.take())
        else {
            return Vec::new();
        };
        loaded.model.slices = slices.model.slices;
        loaded.errors.extend(slices.errors);
        loaded.ignored.extend(slices.ignored);
        self.sent = Digest::of(&loaded.model);
        self.started = true;
        info!(
            services = loaded.model.services.len(),
            slices = self.filed.len(),
            "initial lists complete"
        );
        vec![self.node_event(), Event::Replace(Box::new(loaded))]
    }

    /// Object events: recorded in the digest once the first state is sent; before that,
    /// folded into the complete list they follow (a kind listed before the others may
    /// change meanwhile).
    fn deliver(&mut self, events: Vec<Event>) -> Vec<Event> {
        if self.started {
            for e in &events {
                self.sent.record(e);
            }
            return events;
        }
        for e in events {
            let held = match &e {
                Event::Slice { .. } => self.listed_slices.as_mut(),
                _ => self.listed_services.as_mut(),
            };
            let Some(held) = held else { continue };
            match e {
                Event::Error(err) => held.errors.push(err),
                e => {
                    events::apply(&mut held.model, e);
                }
            }
        }
        Vec::new()
    }

    fn slice_events(&mut self, s: &EndpointSlice, deleted: bool) -> Vec<Event> {
        let key = slice_key(s);
        let mut out = Vec::new();
        let taken = if deleted {
            None
        } else {
            match s.object().and_then(convert::endpoint_slice) {
                Ok(Converted::Take(slice)) => Some(slice),
                Ok(Converted::Ignore(why)) => {
                    debug!("ignored: {why}");
                    None
                }
                Err(e) => {
                    out.push(Event::Error(e));
                    None
                }
            }
        };
        let now_filed = taken.as_ref().map(|t| &t.service.name);
        if let Some(((namespace, name), service)) = self.filed.remove_entry(&key)
            && now_filed != Some(&service)
        {
            out.push(Event::Slice {
                service: ServiceRef {
                    namespace,
                    name: service,
                },
                name,
                slice: None,
            });
        }
        if let Some(slice) = taken {
            self.filed
                .insert((key.0, slice.name.clone()), slice.service.name.clone());
            out.push(Event::Slice {
                service: slice.service.clone(),
                name: slice.name.clone(),
                slice: Some(Box::new(slice)),
            });
        }
        out
    }
}

/// An EndpointSlice object's namespace and name.
fn slice_key(s: &EndpointSlice) -> SliceKey {
    let meta = s.meta();
    (
        intern(meta.namespace.as_deref().unwrap_or("default")),
        Name::from(meta.name.as_deref().unwrap_or_default()),
    )
}

/// A Service changed or gone: its model form, or its removal when it is gone, not proxied
/// or invalid or cannot be decoded (then with the error).
fn service_event(s: &Service, deleted: bool) -> Vec<Event> {
    let meta = s.meta();
    let id = ServiceRef {
        namespace: intern(meta.namespace.as_deref().unwrap_or("default")),
        name: intern(meta.name.as_deref().unwrap_or_default()),
    };
    let gone = Event::Service {
        id: id.clone(),
        service: None,
    };
    if deleted {
        return vec![gone];
    }
    match s.object().and_then(convert::service) {
        Ok(Converted::Take(svc)) => vec![Event::Service {
            id: svc.id.clone(),
            service: Some(Box::new(svc)),
        }],
        Ok(Converted::Ignore(why)) => {
            debug!("ignored: {why}");
            vec![gone]
        }
        Err(e) => vec![Event::Error(e), gone],
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn service(v: serde_json::Value) -> Service {
        serde_json::from_value(v).expect("a Service")
    }

    fn slice(name: &str, service: Option<&str>, address_type: &str, ip: &str) -> EndpointSlice {
        let mut meta = json!({"namespace": "ns", "name": name});
        if let Some(s) = service {
            meta["labels"] = json!({"kubernetes.io/service-name": s});
        }
        serde_json::from_value(json!({
            "metadata": meta,
            "addressType": address_type,
            "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
        }))
        .expect("an EndpointSlice")
    }

    fn stores() -> Stores {
        Stores::default()
    }

    fn web(ip: &str) -> Service {
        service(json!({
            "metadata": {"namespace": "ns", "name": "web"},
            "spec": {"clusterIP": ip, "ports": [{"name": "p", "port": 80}]},
        }))
    }

    fn node(name: &str) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("a Node")
    }

    /// Feeds `events` to `st`; every event it sends, in short.
    fn feed(st: &mut Stores, events: Vec<Watched>) -> Vec<String> {
        events
            .into_iter()
            .flat_map(|w| short(&st.events(w)))
            .collect()
    }

    #[test]
    fn the_first_state_waits_for_every_list_and_takes_what_changed_meanwhile() {
        use watcher::Event as W;
        let mut st = stores();
        let s1 = slice("s1", Some("web"), "IPv4", "10.244.0.1");
        let sent = feed(
            &mut st,
            vec![
                Watched::Service(W::Init),
                Watched::Service(W::InitApply(web("10.96.0.1"))),
                Watched::Service(W::InitDone),
                // Changed after its list, before the others are complete: held, folded in.
                Watched::Service(W::Apply(web("10.96.0.2"))),
                Watched::Slice(W::Init),
                Watched::Slice(W::InitApply(s1.clone())),
                Watched::Slice(W::InitDone),
            ],
        );
        assert!(
            sent.is_empty(),
            "nothing before the Node is listed: {sent:?}"
        );
        let mut events = Vec::new();
        for w in [
            Watched::Node(W::Init),
            Watched::Node(W::InitApply(node("n1"))),
            Watched::Node(W::InitDone),
        ] {
            events.extend(st.events(w));
        }
        assert_eq!(short(&events), ["node", "replace"]);
        let Some(Event::Replace(loaded)) = events.pop() else {
            unreachable!()
        };
        let svc = &loaded.model.services[&id("ns", "web")];
        assert_eq!(
            svc.cluster_ips[..],
            ["10.96.0.2".parse::<std::net::IpAddr>().expect("ip")]
        );
        assert_eq!(loaded.model.slices[&id("ns", "web")].len(), 1);
        // Afterwards: one event per object.
        assert_eq!(
            feed(&mut st, vec![Watched::Service(W::Apply(web("10.96.0.3")))]),
            ["service ns/web"]
        );
    }

    #[test]
    fn a_relist_sends_only_what_differs_from_what_was_sent() {
        use watcher::Event as W;
        let mut st = stores();
        let s1 = slice("s1", Some("web"), "IPv4", "10.244.0.1");
        let s2 = slice("s2", Some("web"), "IPv4", "10.244.0.2");
        feed(
            &mut st,
            vec![
                Watched::Service(W::Init),
                Watched::Service(W::InitApply(web("10.96.0.1"))),
                Watched::Service(W::InitDone),
                Watched::Slice(W::Init),
                Watched::Slice(W::InitApply(s1.clone())),
                Watched::Slice(W::InitDone),
                Watched::Node(W::InitDone),
                Watched::Slice(W::Apply(s2.clone())),
            ],
        );
        // The Services relisted unchanged: nothing to send.
        let relist = vec![
            Watched::Service(W::Init),
            Watched::Service(W::InitApply(web("10.96.0.1"))),
            Watched::Service(W::InitDone),
        ];
        assert!(feed(&mut st, relist).is_empty());
        // The slices relisted: s1 changed, s2 gone (deleted while the watch was down).
        let s1b = slice("s1", Some("web"), "IPv4", "10.244.0.9");
        let relist = vec![
            Watched::Slice(W::Init),
            Watched::Slice(W::InitApply(s1b)),
            Watched::Slice(W::InitDone),
        ];
        assert_eq!(
            feed(&mut st, relist),
            ["slice ns/web s1", "unslice ns/web s2"]
        );
        // And a Service gone while the watch was down.
        let relist = vec![Watched::Service(W::Init), Watched::Service(W::InitDone)];
        assert_eq!(feed(&mut st, relist), ["gone ns/web"]);
        // The filing follows the relist: deleting s1 unfiles it.
        let s1c = slice("s1", Some("web"), "IPv4", "10.244.0.9");
        assert_eq!(
            feed(&mut st, vec![Watched::Slice(W::Delete(s1c))]),
            ["unslice ns/web s1"]
        );
    }

    fn id(namespace: &str, name: &str) -> ServiceRef {
        ServiceRef {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// Each event in short: `service ns/web`, `gone ns/web`, `slice ns/web s1`,
    /// `unslice ns/web s1`, `error`.
    fn short(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                Event::Service {
                    id,
                    service: Some(_),
                } => format!("service {id}"),
                Event::Service { id, service: None } => format!("gone {id}"),
                Event::Slice {
                    service,
                    name,
                    slice: Some(_),
                } => format!("slice {service} {name}"),
                Event::Slice {
                    service,
                    name,
                    slice: None,
                } => format!("unslice {service} {name}"),
                Event::Error(_) => "error".into(),
                Event::Replace(_) => "replace".into(),
                Event::Node { .. } => "node".into(),
            })
            .collect()
    }

    #[test]
    fn a_service_without_a_namespace_is_in_default_and_converted() {
        let e = service_event(
            &service(json!({
                "metadata": {"name": "web"},
                "spec": {"clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1", "fd00::1"],
                         "type": "NodePort", "externalTrafficPolicy": "Local",
                         "ports": [{"name": "http", "port": 80, "nodePort": 30080}]},
            })),
            false,
        );
        assert_eq!(short(&e), ["service default/web"]);
        let Event::Service {
            service: Some(s), ..
        } = &e[0]
        else {
            unreachable!()
        };
        assert_eq!(s.id, id("default", "web"));
        assert_eq!(s.cluster_ips.len(), 2, "both families: {s:?}");
        assert_eq!(s.ports[0].node_port, Some(30080));
        assert_eq!(
            s.external_traffic_policy,
            crate::model::TrafficPolicy::Local
        );
    }

    #[test]
    fn headless_external_name_and_deleted_services_are_removals() {
        let headless = service(json!({
            "metadata": {"namespace": "ns", "name": "h"},
            "spec": {"clusterIP": "None", "ports": [{"port": 80}]},
        }));
        assert_eq!(short(&service_event(&headless, false)), ["gone ns/h"]);
        let ext = service(json!({
            "metadata": {"namespace": "ns", "name": "x"},
            "spec": {"type": "ExternalName", "externalName": "example.com"},
        }));
        assert_eq!(short(&service_event(&ext, false)), ["gone ns/x"]);
        let web = service(json!({
            "metadata": {"namespace": "ns", "name": "web"},
            "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}]},
        }));
        assert_eq!(short(&service_event(&web, true)), ["gone ns/web"]);
    }

    #[test]
    fn an_invalid_service_is_an_error_and_a_removal() {
        let bad = service(json!({
            "metadata": {"namespace": "ns", "name": "bad"},
            "spec": {"clusterIP": "10.96.0.300", "ports": [{"port": 80}]},
        }));
        let e = service_event(&bad, false);
        assert_eq!(short(&e), ["error", "gone ns/bad"]);
        let Event::Error(err) = &e[0] else {
            unreachable!()
        };
        assert!(
            err.to_string().contains("ns/bad"),
            "names the object: {err}"
        );
    }

    #[test]
    fn an_undecodable_service_or_slice_is_an_error_naming_it_and_is_left_out() {
        let bad = service(json!({
            "metadata": {"namespace": "ns", "name": "bad"},
            "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": "eighty"}]},
        }));
        let e = service_event(&bad, false);
        assert_eq!(short(&e), ["error", "gone ns/bad"]);
        let Event::Error(err) = &e[0] else {
            unreachable!()
        };
        let text = err.to_string();
        assert!(
            text.contains("Service ns/bad: cannot decode: spec.ports[0].port"),
            "{text}"
        );
        let mut st = stores();
        let s1 = slice("s1", Some("web"), "IPv4", "10.244.0.1");
        st.slice_events(&s1, false);
        let odd: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "s1",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": "10.244.0.1"}],
        }))
        .expect("decodes as undecodable");
        assert_eq!(
            short(&st.slice_events(&odd, false)),
            ["error", "unslice ns/web s1"]
        );
    }

    #[test]
    fn a_relabelled_slice_leaves_its_old_service() {
        let mut st = stores();
        let s1 = slice("s1", Some("web"), "IPv4", "10.244.0.1");
        assert_eq!(short(&st.slice_events(&s1, false)), ["slice ns/web s1"]);
        // The same slice again: replaced where it is, nothing removed.
        assert_eq!(short(&st.slice_events(&s1, false)), ["slice ns/web s1"]);
        let moved = slice("s1", Some("api"), "IPv4", "10.244.0.1");
        assert_eq!(
            short(&st.slice_events(&moved, false)),
            ["unslice ns/web s1", "slice ns/api s1"]
        );
        assert_eq!(short(&st.slice_events(&moved, true)), ["unslice ns/api s1"]);
        assert!(st.filed.is_empty());
        // Deleting a slice never filed removes nothing.
        assert!(st.slice_events(&moved, true).is_empty());
    }

    #[test]
    fn a_slice_that_stops_being_taken_is_removed_from_its_service() {
        let mut st = stores();
        let s1 = slice("s1", Some("web"), "IPv4", "10.244.0.1");
        st.slice_events(&s1, false);
        // The label gone: ignored now, so no longer the service's.
        let unlabelled = slice("s1", None, "IPv4", "10.244.0.1");
        assert_eq!(
            short(&st.slice_events(&unlabelled, false)),
            ["unslice ns/web s1"]
        );
        st.slice_events(&s1, false);
        // An address of the other family is left out (the slice stays, without it).
        let other = slice("s1", Some("web"), "IPv4", "fd00::1");
        let e = st.slice_events(&other, false);
        assert_eq!(short(&e), ["slice ns/web s1"]);
        let Event::Slice { slice: Some(s), .. } = &e[0] else {
            unreachable!()
        };
        assert!(s.endpoints.is_empty(), "{s:?}");
        // An unknown address type: an error, and the slice leaves.
        let bad = slice("s1", Some("web"), "IPv5", "10.244.0.1");
        assert_eq!(
            short(&st.slice_events(&bad, false)),
            ["error", "unslice ns/web s1"]
        );
        st.slice_events(&s1, false);
        let fqdn = slice("s1", Some("web"), "FQDN", "example.com");
        assert_eq!(short(&st.slice_events(&fqdn, false)), ["unslice ns/web s1"]);
    }

    #[test]
    fn the_node_event_carries_its_zone_and_whether_it_goes_away() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {ZONE_LABEL: "z1"}},
            "spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]},
        }))
        .expect("a Node");
        let st = Stores {
            node: Some(node.clone()),
            ..stores()
        };
        let Event::Node { deleting, zone } = st.node_event() else {
            unreachable!()
        };
        assert!(deleting);
        assert_eq!(zone.as_deref(), Some("z1"));
        let mut calm = node;
        calm.spec = None;
        assert!(!node_deleting(&calm));
        calm.metadata.deletion_timestamp =
            Some(serde_json::from_value(json!("2026-01-01T00:00:00Z")).expect("a time"));
        assert!(node_deleting(&calm));
    }

    #[test]
    fn the_selector_names_the_proxy_or_excludes_every_named_one() {
        assert_eq!(selector_of(None), super::super::DEFAULT_SELECTOR);
        assert_eq!(
            selector_of(Some("xlb")),
            "service.kubernetes.io/service-proxy-name=xlb,!service.kubernetes.io/headless"
        );
    }

    fn selector_of(name: Option<&str>) -> String {
        super::super::selector(name)
    }
}
