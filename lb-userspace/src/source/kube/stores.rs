//! From the reflectors' stores to the source's events: a Service or an EndpointSlice
//! converted (or its removal when it is gone, not proxied or invalid), the slices filed
//! under their service so a relabelled or deleted slice leaves where it was, the Node's zone
//! and deletion, and the whole state at once after a (re)list.

use k8s_openapi::api::core::v1::Node;
use kube::{
    Resource,
    runtime::{reflector::Store, watcher},
};
use tracing::debug;

use super::decoded::Decoded;
use crate::{
    model::{Name, ServiceRef, intern},
    source::{
        convert::{self, Converted},
        events::Event,
        file::Loaded,
        objects,
    },
};

/// A watched Service, as decoded.
pub type Service = Decoded<objects::Service>;
/// A watched EndpointSlice, as decoded.
pub type EndpointSlice = Decoded<objects::EndpointSlice>;

/// Builds the model from the stores' current contents.
pub fn snapshot(services: &Store<Service>, slices: &Store<EndpointSlice>) -> Loaded {
    let mut loaded = Loaded::default();
    for svc in services.state() {
        match svc.object().and_then(convert::service) {
            Ok(Converted::Take(s)) => loaded.model.upsert_service(s),
            Ok(Converted::Ignore(why)) => loaded.ignored.push(why),
            Err(e) => loaded.errors.push(e),
        }
    }
    for slice in slices.state() {
        match slice.object().and_then(convert::endpoint_slice) {
            Ok(Converted::Take(s)) => loaded.model.upsert_slice(s),
            Ok(Converted::Ignore(why)) => loaded.ignored.push(why),
            Err(e) => loaded.errors.push(e),
        }
    }
    loaded
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

/// The three stores, and which slice object is filed under which service.
pub(super) struct Stores {
    pub(super) services: Store<Service>,
    pub(super) slices: Store<EndpointSlice>,
    pub(super) node: Store<Node>,
    /// EndpointSlice `namespace/name` → (its service, its name), for the slices sent: a
    /// deleted (or relabelled, or no longer valid) slice is removed from where it was filed.
    pub(super) filed: std::collections::HashMap<String, (ServiceRef, Name)>,
}

impl Stores {
    pub(super) fn node_event(&self) -> Event {
        let node = self.node.state();
        Event::Node {
            deleting: node.iter().any(|n| node_deleting(n)),
            zone: node.iter().find_map(|n| {
                n.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(ZONE_LABEL))
                    .cloned()
            }),
        }
    }

    /// Everything in the stores, and the slices filed afresh.
    pub(super) fn replace(&mut self) -> Event {
        let loaded = snapshot(&self.services, &self.slices);
        self.filed = self
            .slices
            .state()
            .iter()
            .filter_map(|s| match s.object().and_then(convert::endpoint_slice) {
                Ok(Converted::Take(t)) => Some((slice_key(s), (t.service, t.name))),
                _ => None,
            })
            .collect();
        Event::Replace(Box::new(loaded))
    }

    /// The events of one watcher event after the initial lists: a Service or a slice
    /// changed or gone, a relist complete (everything, from the swapped store), the Node.
    pub(super) fn events(&mut self, w: Watched) -> Vec<Event> {
        match w {
            Watched::Service(watcher::Event::Apply(s)) => service_event(&s, false),
            Watched::Service(watcher::Event::Delete(s)) => service_event(&s, true),
            Watched::Slice(watcher::Event::Apply(s)) => self.slice_events(&s, false),
            Watched::Slice(watcher::Event::Delete(s)) => self.slice_events(&s, true),
            Watched::Service(watcher::Event::InitDone)
            | Watched::Slice(watcher::Event::InitDone) => vec![self.replace()],
            Watched::Node(
                watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone,
            ) => vec![self.node_event()],
            _ => Vec::new(),
        }
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
        let now_filed = taken.as_ref().map(|t| (t.service.clone(), t.name.clone()));
        if let Some(was) = self.filed.remove(&key)
            && now_filed.as_ref() != Some(&was)
        {
            out.push(Event::Slice {
                service: was.0,
                name: was.1,
                slice: None,
            });
        }
        if let Some(slice) = taken {
            self.filed
                .insert(key, (slice.service.clone(), slice.name.clone()));
            out.push(Event::Slice {
                service: slice.service.clone(),
                name: slice.name.clone(),
                slice: Some(Box::new(slice)),
            });
        }
        out
    }
}

/// An EndpointSlice object's `namespace/name`.
fn slice_key(s: &EndpointSlice) -> String {
    let meta = s.meta();
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or_default()
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
    use kube::runtime::reflector;
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
        Stores {
            services: reflector::store::<Service>().0,
            slices: reflector::store::<EndpointSlice>().0,
            node: reflector::store::<Node>().0,
            filed: Default::default(),
        }
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
        let (store, mut writer) = reflector::store::<Node>();
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {ZONE_LABEL: "z1"}},
            "spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]},
        }))
        .expect("a Node");
        writer.apply_watcher_event(&watcher::Event::Apply(node.clone()));
        let st = Stores {
            node: store,
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
