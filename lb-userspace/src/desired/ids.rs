//! Ids handed out to frontends and backends, stable across syncs and agent restarts.

use std::collections::{BTreeMap, BTreeSet};

use lb_common::{Backend, SvcKey};

use super::Desired;

/// Ids handed out to frontends and backends. Ids are never reused while the agent runs, so a
/// conntrack entry can never point at an unrelated backend that took a freed id.
#[derive(Clone, Debug, Default)]
pub struct Ids {
    svc: BTreeMap<SvcKey, u32>,
    backend: BTreeMap<Backend, u32>,
    next_svc: u32,
    next_backend: u32,
}

impl Ids {
    /// Takes over the ids of what is already programmed (a restarted agent adopts its pins).
    pub fn adopt(current: &Desired) -> Self {
        let mut ids = Ids::default();
        for (k, v) in current.services.iter().filter(|(k, _)| k.slot == 0) {
            ids.svc.insert(*k, v.svc_id);
            ids.next_svc = ids.next_svc.max(v.svc_id);
        }
        for (id, be) in &current.backends {
            ids.backend.insert(*be, *id);
            ids.next_backend = ids.next_backend.max(*id);
        }
        ids
    }

    pub(super) fn svc_id(&mut self, key: SvcKey) -> u32 {
        *self.svc.entry(key).or_insert_with(|| {
            self.next_svc = self.next_svc.wrapping_add(1).max(1);
            self.next_svc
        })
    }

    pub(super) fn backend_id(&mut self, be: Backend) -> u32 {
        *self.backend.entry(be).or_insert_with(|| {
            self.next_backend = self.next_backend.wrapping_add(1).max(1);
            self.next_backend
        })
    }

    pub(super) fn has_svc(&self, key: &SvcKey) -> bool {
        self.svc.contains_key(key)
    }

    /// Forgets ids of what is no longer desired (the counters never go back).
    pub(super) fn retain(&mut self, desired: &Desired) {
        self.svc.retain(|k, _| desired.services.contains_key(k));
        let live: BTreeSet<&Backend> = desired.backends.values().collect();
        self.backend.retain(|b, _| live.contains(b));
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::{
        desired::{backend_value, frontend_key},
        model::Protocol,
    };

    #[test]
    fn ids_are_kept_across_adoption_and_never_reused_while_running() {
        let mut ids = Ids::default();
        let web = frontend_key(Ipv4Addr::new(10, 96, 0, 1), 80, Protocol::Tcp);
        let dns = frontend_key(Ipv4Addr::new(10, 96, 0, 2), 53, Protocol::Udp);
        let (a, b) = (ids.svc_id(web), ids.svc_id(dns));
        assert_ne!(a, b);
        assert_eq!(ids.svc_id(web), a, "stable");
        // Adopted from what is programmed: the same ids come back.
        let mut d = Desired::default();
        d.services.insert(
            web,
            lb_common::SvcValue {
                svc_id: a,
                ..Default::default()
            },
        );
        let be = backend_value(Ipv4Addr::new(10, 244, 0, 1), 8080, Protocol::Tcp);
        d.backends.insert(7, be);
        let mut adopted = Ids::adopt(&d);
        assert_eq!(adopted.svc_id(web), a);
        assert_eq!(adopted.backend_id(be), 7);
        // A forgotten frontend's id is not handed out again.
        adopted.retain(&Desired::default());
        assert!(!adopted.has_svc(&web));
        assert_ne!(adopted.svc_id(dns), a);
    }
}
