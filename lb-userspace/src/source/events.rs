//! What sources send the agent: one event per changed object (a Service or an EndpointSlice
//! added, changed or gone), or the whole state when a source (re)lists; applied to the
//! agent's model in place.

use std::{
    collections::BTreeMap,
    hash::{BuildHasher, Hash, RandomState},
    time::Instant,
};

use super::{Snapshot, SourceError};
use crate::model::{EndpointSlice, Model, Name, Service, ServiceRef, Slices};

/// One change a source saw.
#[derive(Debug)]
pub enum Event {
    /// Everything the source holds now (the first complete list, a relist, the file's first
    /// read): the agent diffs it against its model.
    Replace(Box<Snapshot>),
    /// A Service is new or changed (`Some`), or gone or no longer proxied (`None`).
    Service {
        id: ServiceRef,
        service: Option<Box<Service>>,
    },
    /// An EndpointSlice of `service` is new or changed (`Some`), or gone (`None`).
    Slice {
        service: ServiceRef,
        name: Name,
        slice: Option<Box<EndpointSlice>>,
    },
    /// This node's Node object changed.
    Node {
        deleting: bool,
        zone: Option<String>,
    },
    /// An object the source could not take (it is left out), or the source itself could
    /// not be read (what is programmed stays).
    Error(SourceError),
}

/// An event and when the source saw it (for the event → maps latency).
#[derive(Debug)]
pub struct Stamped {
    pub event: Event,
    pub since: Instant,
}

impl Stamped {
    pub fn now(event: Event) -> Self {
        Self {
            event,
            since: Instant::now(),
        }
    }
}

/// The services whose desired state an event may change (a slice changes its service).
pub fn touched(event: &Event) -> Option<&ServiceRef> {
    match event {
        Event::Service { id, .. } => Some(id),
        Event::Slice { service, .. } => Some(service),
        _ => None,
    }
}

/// Applies an object event to `model`; returns the service it touched, `None` when the
/// model did not change.
pub fn apply(model: &mut Model, event: Event) -> Option<ServiceRef> {
    match event {
        Event::Service { id, service } => {
            let changed = match service {
                Some(s) => {
                    model.services.get(&id) != Some(&*s) && {
                        model.services.insert(id.clone(), *s);
                        true
                    }
                }
                None => model.services.remove(&id).is_some(),
            };
            changed.then_some(id)
        }
        Event::Slice {
            service,
            name,
            slice,
        } => {
            let changed = match slice {
                Some(s) => {
                    let slices = model.slices.entry(service.clone()).or_default();
                    slices.get(&name) != Some(&*s) && {
                        slices.insert(*s);
                        true
                    }
                }
                None => {
                    let removed = model
                        .slices
                        .get_mut(&service)
                        .is_some_and(|s| s.remove(&name).is_some());
                    if model.slices.get(&service).is_some_and(|s| s.is_empty()) {
                        model.slices.remove(&service);
                    }
                    removed
                }
            };
            changed.then_some(service)
        }
        _ => None,
    }
}

/// The object events that take `old` to `new`: one per service and per slice that differs.
pub fn diff(old: &Model, new: &Model) -> Vec<Event> {
    let mut out = Vec::new();
    for (id, svc) in &new.services {
        if old.services.get(id) != Some(svc) {
            out.push(Event::Service {
                id: id.clone(),
                service: Some(Box::new(svc.clone())),
            });
        }
    }
    for id in old
        .services
        .keys()
        .filter(|k| !new.services.contains_key(k))
    {
        out.push(Event::Service {
            id: id.clone(),
            service: None,
        });
    }
    let none = Default::default();
    for (svc, slices) in &new.slices {
        let before = old.slices.get(svc).unwrap_or(&none);
        for (name, s) in slices {
            if before.get(name) != Some(s) {
                out.push(Event::Slice {
                    service: svc.clone(),
                    name: name.clone(),
                    slice: Some(Box::new(s.clone())),
                });
            }
        }
    }
    for (svc, slices) in &old.slices {
        let after = new.slices.get(svc).unwrap_or(&none);
        for name in slices.keys().filter(|n| !after.contains_key(n)) {
            out.push(Event::Slice {
                service: svc.clone(),
                name: name.clone(),
                slice: None,
            });
        }
    }
    out
}

/// A model's objects by name, each with a 128-bit digest of its contents: what a source
/// keeps of its last read to diff the next one against, at a fraction of the model's size.
#[derive(Debug, Default)]
pub struct Digest {
    services: BTreeMap<ServiceRef, u128>,
    slices: BTreeMap<(ServiceRef, Name), u128>,
    keys: (RandomState, RandomState),
}

impl Digest {
    /// The digest of `model`.
    pub fn of(model: &Model) -> Self {
        let mut d = Digest::default();
        d.services = model
            .services
            .iter()
            .map(|(id, s)| (id.clone(), d.hash(s)))
            .collect();
        d.slices = model
            .slices
            .iter()
            .flat_map(|(svc, slices)| slices.iter().map(move |(n, s)| (svc, n, s)))
            .map(|(svc, n, s)| ((svc.clone(), n.clone()), d.hash(s)))
            .collect();
        d
    }

    /// Two independent SipHashes, so a changed object passing for unchanged is out of reach.
    fn hash(&self, x: &impl Hash) -> u128 {
        let a = self.keys.0.hash_one(x);
        let b = self.keys.1.hash_one(x);
        (u128::from(a) << 64) | u128::from(b)
    }

    /// The object events that take what this digest describes to `new`, and the digest of
    /// `new` in place of this one.
    pub fn diff(&mut self, new: &Model) -> Vec<Event> {
        let mut out = self.diff_services(&new.services);
        out.extend(self.diff_slices(&new.slices));
        out
    }

    /// [`Digest::diff`] of the Services only (a relist of Services; the slices stay).
    pub fn diff_services(&mut self, new: &BTreeMap<ServiceRef, Service>) -> Vec<Event> {
        let mut out = Vec::new();
        let mut services = BTreeMap::new();
        for (id, svc) in new {
            let h = self.hash(svc);
            if self.services.remove(id) != Some(h) {
                out.push(Event::Service {
                    id: id.clone(),
                    service: Some(Box::new(svc.clone())),
                });
            }
            services.insert(id.clone(), h);
        }
        for id in std::mem::replace(&mut self.services, services).into_keys() {
            out.push(Event::Service { id, service: None });
        }
        out
    }

    /// [`Digest::diff`] of the EndpointSlices only (a relist of slices; the Services stay).
    pub fn diff_slices(&mut self, new: &BTreeMap<ServiceRef, Slices>) -> Vec<Event> {
        let mut out = Vec::new();
        let mut slices = BTreeMap::new();
        for (svc, named) in new {
            for (name, s) in named {
                let key = (svc.clone(), name.clone());
                let h = self.hash(s);
                if self.slices.remove(&key) != Some(h) {
                    out.push(Event::Slice {
                        service: svc.clone(),
                        name: name.clone(),
                        slice: Some(Box::new(s.clone())),
                    });
                }
                slices.insert(key, h);
            }
        }
        for (service, name) in std::mem::replace(&mut self.slices, slices).into_keys() {
            out.push(Event::Slice {
                service,
                name,
                slice: None,
            });
        }
        out
    }

    /// Keeps the digest up to date with an object event sent.
    pub fn record(&mut self, e: &Event) {
        match e {
            Event::Service {
                id,
                service: Some(s),
            } => {
                let h = self.hash(&**s);
                self.services.insert(id.clone(), h);
            }
            Event::Service { id, service: None } => {
                self.services.remove(id);
            }
            Event::Slice {
                service,
                name,
                slice: Some(s),
            } => {
                let h = self.hash(s);
                self.slices.insert((service.clone(), name.clone()), h);
            }
            Event::Slice {
                service,
                name,
                slice: None,
            } => {
                self.slices.remove(&(service.clone(), name.clone()));
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::file;

    const TWO: &str = "apiVersion: v1\nkind: Service\nmetadata: {namespace: ns, name: a}\nspec:\n  clusterIP: 10.96.0.1\n  ports: [{port: 80}]\n---\napiVersion: v1\nkind: Service\nmetadata: {namespace: ns, name: b}\nspec:\n  clusterIP: 10.96.0.2\n  ports: [{port: 80}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {namespace: ns, name: a-1, labels: {kubernetes.io/service-name: a}}\naddressType: IPv4\nports: [{port: 80}]\nendpoints:\n- {addresses: [10.244.0.1]}\n";

    #[test]
    fn a_diff_applied_gives_the_new_model_and_names_only_what_changed() {
        let old = file::parse("t", TWO).expect("parse").model;
        let text = TWO
            .replace("10.96.0.2", "10.96.0.3")
            .replace("10.244.0.1", "10.244.0.9");
        let new = file::parse("t", &text).expect("parse").model;
        let events = diff(&old, &new);
        assert_eq!(events.len(), 2, "{events:?}");
        let mut m = old.clone();
        let touched: Vec<String> = events
            .into_iter()
            .filter_map(|e| apply(&mut m, e))
            .map(|s| s.to_string())
            .collect();
        assert_eq!(m, new);
        assert_eq!(touched, ["ns/b", "ns/a"]);
        // Back to empty: every object goes.
        let events = diff(&m, &Model::default());
        assert_eq!(events.len(), 3);
        for e in events {
            apply(&mut m, e);
        }
        assert_eq!(m, Model::default());
        // The same object again changes nothing.
        let mut m = new.clone();
        for e in diff(&old, &new) {
            assert!(apply(&mut m, e).is_none());
        }
    }

    #[test]
    fn a_digest_diffs_as_the_models_do() {
        let old = file::parse("t", TWO).expect("parse").model;
        let text = TWO
            .replace("10.96.0.2", "10.96.0.3")
            .replace("10.244.0.1", "10.244.0.9");
        let new = file::parse("t", &text).expect("parse").model;
        let mut d = Digest::of(&old);
        let mut m = old.clone();
        let events = d.diff(&new);
        assert_eq!(events.len(), 2, "{events:?}");
        for e in events {
            apply(&mut m, e);
        }
        assert_eq!(m, new);
        assert!(d.diff(&new).is_empty(), "the digest is of `new` now");
        let events = d.diff(&Model::default());
        assert_eq!(events.len(), 3, "every object goes: {events:?}");
    }
}
