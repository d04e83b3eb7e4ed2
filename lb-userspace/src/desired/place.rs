//! Placing a frontend: its service index, its backends' indices and generations, its slots;
//! admitted into the desired state when every map it needs has room.

use lb_common::user::{backend_value, remote_backend_value, svc_name};
use lb_common::{
    Backend, MAP_BACKEND, MAP_SRC_RANGE, MAP_SRC_RANGE6, MAP_SVC, MAP_SVC_STATS, SCOPE_EXTERNAL,
    SVC_NAME_LEN, SvcKey, SvcName, SvcValue,
};

use super::{
    Desired, DesiredError, Ids, Limits, SrcRange, candidates::Candidate, journal::Journal,
};

/// One frontend's entries, backends, name and source ranges, before admission.
struct Planned {
    object: String,
    key: SvcKey,
    slots: u16,
    entries: Vec<(SvcKey, SvcValue)>,
    backends: Vec<(u32, Backend)>,
    name: (u32, SvcName),
    pub(super) src_ranges: Vec<SrcRange>,
}

/// Places one frontend: its index, its backends' indices, its slots; admitted into
/// `desired` when it fits (else the reason is in `errors`), what it overwrites recorded in
/// `journal` when there is one. Returns what it added.
pub(super) fn place(
    desired: &mut Desired,
    c: Candidate,
    ids: &mut Ids,
    limits: Limits,
    errors: &mut Vec<DesiredError>,
    journal: Option<&mut Journal>,
) -> Option<Placed> {
    let Candidate {
        key,
        object,
        backends,
        flags,
        affinity_timeout_s,
        src_ranges,
    } = c;
    // Both scopes of a frontend are one service port: one id, one name, one counter.
    let Some(svc_id) = ids.svc_id(external(key)) else {
        errors.push(DesiredError::MapFull {
            object,
            map: MAP_SVC_STATS,
            capacity: limits.services,
            needed: 1,
        });
        return None;
    };
    let mut plan = Planned {
        object,
        key,
        slots: 0,
        entries: Vec::new(),
        backends: Vec::new(),
        name: (
            svc_id,
            SvcName {
                name: [0; SVC_NAME_LEN],
            },
        ),
        src_ranges: src_ranges
            .iter()
            .map(|&(addr, prefix)| SrcRange {
                svc_id,
                addr,
                prefix,
            })
            .collect(),
    };
    plan.name.1 = svc_name(&plan.object);
    let mut slot = 0u16;
    for (b, local) in &backends {
        let ip = b.ip;
        let be = if *local {
            backend_value(ip, b.port, b.protocol)
        } else {
            remote_backend_value(ip, b.port, b.protocol)
        };
        let Some((backend_id, generation)) = ids.backend_id(be) else {
            errors.push(DesiredError::MapFull {
                object: plan.object,
                map: MAP_BACKEND,
                capacity: limits.backends,
                needed: backends.len(),
            });
            return None;
        };
        let be = Backend { generation, ..be };
        slot += 1;
        plan.backends.push((backend_id, be));
        plan.entries.push((
            SvcKey { slot, ..key },
            SvcValue {
                backend_id,
                svc_id,
                ..SvcValue::default()
            },
        ));
    }
    plan.slots = slot;
    plan.entries.push((
        key,
        SvcValue {
            count: slot,
            svc_id,
            flags,
            affinity_timeout_s,
            ..SvcValue::default()
        },
    ));
    admit(desired, plan, limits, errors, journal)
}

/// What one placed frontend added to the desired state: its entry's key and slot count
/// (the slot keys and their backend indices follow from them and the desired state), its
/// name's index and its source ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Placed {
    pub(super) key: SvcKey,
    pub(super) slots: u16,
    pub(super) name: u32,
    pub(super) src_ranges: Box<[SrcRange]>,
}

impl Placed {
    /// Its service map keys: slots, then the entry.
    pub(super) fn entries(&self) -> impl Iterator<Item = SvcKey> + use<> {
        let key = self.key;
        (1..=self.slots)
            .map(move |slot| SvcKey { slot, ..key })
            .chain(std::iter::once(key))
    }

    /// The backend index of each slot, as `desired` has them (while this frontend is in it).
    pub(super) fn backends<'a>(&self, desired: &'a Desired) -> impl Iterator<Item = u32> + 'a {
        let key = self.key;
        (1..=self.slots).filter_map(move |slot| {
            desired
                .services
                .get(&SvcKey { slot, ..key })
                .map(|v| v.backend_id)
        })
    }
}

/// The order candidates are placed in (stable: model order within): programmed frontends
/// first, then IPv4 before IPv6.
pub(super) fn placing_order(ids: &Ids, c: &Candidate) -> (bool, bool) {
    (
        !ids.has_svc(&external(c.key)),
        c.key.family != lb_common::FAMILY_V4,
    )
}

/// The external-scope key of a frontend's entry.
pub(super) fn external(key: SvcKey) -> SvcKey {
    SvcKey {
        scope: SCOPE_EXTERNAL,
        ..key
    }
}

/// Adds `plan` to `desired` when the service, backend and source-range maps all have room
/// for it (else the map, its capacity and what was needed are in `errors`).
fn admit(
    desired: &mut Desired,
    plan: Planned,
    limits: Limits,
    errors: &mut Vec<DesiredError>,
    journal: Option<&mut Journal>,
) -> Option<Placed> {
    let svc_needed = plan.entries.len();
    if desired.services.len() + svc_needed > limits.svc_entries as usize {
        errors.push(DesiredError::MapFull {
            object: plan.object,
            map: MAP_SVC,
            capacity: limits.svc_entries,
            needed: svc_needed,
        });
        return None;
    }
    let new_backends = plan
        .backends
        .iter()
        .filter(|(id, _)| !desired.backends.contains_key(id))
        .count();
    if desired.backends.len() + new_backends > limits.backends as usize {
        errors.push(DesiredError::MapFull {
            object: plan.object,
            map: MAP_BACKEND,
            capacity: limits.backends,
            needed: new_backends,
        });
        return None;
    }
    if let Some((map, capacity, needed)) = src_ranges_full(desired, &plan.src_ranges, limits) {
        errors.push(DesiredError::MapFull {
            object: plan.object,
            map,
            capacity,
            needed,
        });
        return None;
    }
    let placed = Placed {
        key: plan.key,
        slots: plan.slots,
        name: plan.name.0,
        src_ranges: plan.src_ranges.clone().into_boxed_slice(),
    };
    if let Some(j) = journal {
        for (k, _) in &plan.entries {
            j.service(desired, *k);
        }
        for (id, _) in &plan.backends {
            j.backend(desired, *id);
        }
        j.name(desired, plan.name.0);
        for r in &plan.src_ranges {
            j.src_range(desired, *r);
        }
    }
    desired.services.extend(plan.entries);
    desired.backends.extend(plan.backends);
    desired.names.insert(plan.name.0, plan.name.1);
    desired.src_ranges.extend(plan.src_ranges);
    Some(placed)
}

/// The source-range trie (name, capacity, ranges needed) that has no room for `new`, if
/// one has none: each family's ranges go into a trie of their own. Counting per family
/// walks the ranges, which only a near-full state needs (when all of them together fit the
/// smaller trie, both fit).
fn src_ranges_full(
    desired: &Desired,
    new: &[SrcRange],
    limits: Limits,
) -> Option<(&'static str, u32, usize)> {
    let smaller = limits.src_ranges.min(limits.src_ranges6) as usize;
    if new.is_empty() || desired.src_ranges.len() + new.len() <= smaller {
        return None;
    }
    let v6 = |r: &&SrcRange| r.addr.is_ipv6();
    let have6 = desired.src_ranges.iter().filter(v6).count();
    let have4 = desired.src_ranges.len() - have6;
    let new6 = new.iter().filter(v6).count();
    let new4 = new.len() - new6;
    if new4 > 0 && have4 + new4 > limits.src_ranges as usize {
        return Some((MAP_SRC_RANGE, limits.src_ranges, new4));
    }
    if new6 > 0 && have6 + new6 > limits.src_ranges6 as usize {
        return Some((MAP_SRC_RANGE6, limits.src_ranges6, new6));
    }
    None
}
