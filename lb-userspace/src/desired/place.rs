//! Placing a frontend: its service index, its backends' indices and generations, its slot
//! range and slots; planned, checked against the room every map it needs has, then applied.

use lb_common::user::{backend_value, remote_backend_value};
use lb_common::{
    Backend, MAP_BACKEND, MAP_MAGLEV, MAP_SLOT, MAP_SRC_RANGE, MAP_SRC_RANGE6, MAP_SVC,
    MAP_SVC_STATS, SCOPE_EXTERNAL, SVC_F_MAGLEV, SvcKey, SvcValue,
};
use std::net::IpAddr;

use super::{
    Desired, DesiredError, Indices, Limits, MaglevTable, ObjectName, SrcRange, SvcEntry, Tally,
    candidates::Candidate, shared_object_name,
};
use crate::model::BackendAddr;

/// One frontend's entries, backends, name and source ranges, checked to fit the desired
/// state it was planned against.
#[derive(Debug)]
pub struct Plan {
    key: SvcKey,
    /// Its entry (written last) and slots.
    entry: SvcEntry,
    /// Its backends, slot by slot.
    backends: Vec<(u32, Backend)>,
    name: (u32, ObjectName),
    src_ranges: Vec<SrcRange>,
    /// Its Maglev table, by its service index.
    maglev: Option<(u32, MaglevTable)>,
}

impl Plan {
    /// The frontend it writes.
    pub fn key(&self) -> SvcKey {
        self.key
    }

    /// The backend indices it writes.
    pub fn backend_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.backends.iter().map(|(id, _)| *id)
    }

    /// The index of its name.
    pub fn name_id(&self) -> u32 {
        self.name.0
    }

    /// Its name (shared with the desired state once applied).
    pub fn name(&self) -> &ObjectName {
        &self.name.1
    }

    pub fn src_ranges(&self) -> &[SrcRange] {
        &self.src_ranges
    }

    /// The service index its Maglev table is written under, if it has one.
    pub fn maglev_id(&self) -> Option<u32> {
        self.maglev.as_ref().map(|(id, _)| *id)
    }

    /// Adds it to `desired`; returns what it added.
    pub fn apply(self, desired: &mut Desired) -> Placed {
        self.apply_counted(desired, &mut Tally::default())
    }

    /// [`Plan::apply`], `tally` (that of `desired`) kept: the entry it adds (less one it
    /// replaces), the source ranges the set did not have.
    pub fn apply_counted(self, desired: &mut Desired, tally: &mut Tally) -> Placed {
        let placed = Placed {
            key: self.key,
            slots: self.entry.count,
            name: self.name.0,
            src_ranges: self.src_ranges.clone().into_boxed_slice(),
            maglev: self.maglev_id(),
        };
        tally.service(&self.entry, true);
        if let Some(was) = desired.services.insert(self.key, self.entry) {
            tally.service(&was, false);
        }
        desired.maglev.extend(self.maglev);
        desired.backends.extend(self.backends);
        desired.names.insert(self.name.0, self.name.1);
        for r in self.src_ranges {
            if desired.src_ranges.insert(r) {
                tally.src_range(&r, true);
            }
        }
        placed
    }
}

impl Plan {
    /// A plan of frontend `key` with index `svc_id`, its name and source ranges, no slots
    /// yet.
    fn new(
        key: SvcKey,
        svc_id: u32,
        object: &std::sync::Arc<str>,
        src_ranges: &[(IpAddr, u8)],
    ) -> Plan {
        Plan {
            key,
            entry: SvcEntry::default(),
            backends: Vec::new(),
            name: (svc_id, shared_object_name(object)),
            src_ranges: src_ranges
                .iter()
                .map(|&(addr, prefix)| SrcRange {
                    svc_id,
                    addr,
                    prefix,
                })
                .collect(),
            maglev: None,
        }
    }
}

/// A slot per backend added to `plan`, each backend with its index and generation from
/// `ids`, in order until the backend array has no index left; how many.
fn place_backends(
    desired: &Desired,
    plan: &mut Plan,
    backends: &[(BackendAddr, bool)],
    ids: &mut impl Indices,
    limits: Limits,
) -> u16 {
    let mut slot = 0u16;
    plan.backends.reserve_exact(backends.len());
    for (b, local) in backends {
        let be = match local {
            true => backend_value(b.ip, b.port, b.protocol),
            false => remote_backend_value(b.ip, b.port, b.protocol),
        };
        let Some((backend_id, generation)) = ids.backend_id(be, limits.backends, &desired.backends)
        else {
            break;
        };
        let be = Backend { generation, ..be };
        slot += 1;
        plan.backends.push((backend_id, be));
    }
    slot
}

/// Plans one frontend: its index, its backends' indices, its slots. `None` when it does not
/// fit `desired` within `limits` (the reason is in `errors`).
pub fn plan(
    desired: &Desired,
    c: Candidate,
    ids: &mut impl Indices,
    limits: Limits,
    errors: &mut Vec<DesiredError>,
) -> Option<Plan> {
    let Candidate {
        key,
        object,
        backends,
        flags,
        affinity_timeout_s,
        src_ranges,
        maglev,
        ..
    } = c;
    // Both scopes of a frontend are one service port: one id, one name, one counter.
    let Some(svc_id) = ids.svc_id(external(key), limits.services) else {
        errors.push(DesiredError::MapFull {
            object: object.to_string(),
            map: MAP_SVC_STATS,
            capacity: limits.services,
            needed: 1,
        });
        return None;
    };
    let mut plan = Plan::new(key, svc_id, &object, &src_ranges);
    let placed = place_backends(desired, &mut plan, &backends, ids, limits);
    let slot = match short_of_indices(&object, placed, backends.len(), limits) {
        Some(e @ DesiredError::MapFull { .. }) => {
            errors.push(e);
            return None;
        }
        short => {
            let slot = fit(
                desired,
                &mut plan,
                (placed, ids),
                limits,
                (&object, backends.len()),
                errors,
            )?;
            // `fit` named its own trim; else the index shortage is the frontend's problem.
            errors.extend(short.filter(|_| slot == placed));
            slot
        }
    };
    let mut flags = flags;
    if let Some((m, seed)) = maglev.filter(|_| slot > 0) {
        if desired.maglev.len() < limits.maglev as usize {
            let names: Vec<String> = backends[..slot as usize]
                .iter()
                .map(|(b, _)| b.to_string())
                .collect();
            let slots = ids.maglev_table(&names, m, seed.as_bytes());
            plan.maglev = Some((svc_id, MaglevTable { slots }));
            flags |= SVC_F_MAGLEV;
        } else {
            errors.push(DesiredError::MaglevFull {
                object: object.to_string(),
                map: MAP_MAGLEV,
                capacity: limits.maglev,
            });
        }
    }
    plan.entry.value = SvcValue {
        count: slot,
        svc_id,
        flags,
        affinity_timeout_s,
        ..plan.entry.value
    };
    plan.entry.slots = plan.backends.iter().map(|(id, _)| *id).collect();
    // `fit` made sure of the service map, the slot array and the backend array.
    match src_ranges_full(desired, &plan.src_ranges, limits) {
        None => Some(plan),
        Some((map, capacity, needed)) => {
            errors.push(DesiredError::MapFull {
                object: object.to_string(),
                map,
                capacity,
                needed,
            });
            None
        }
    }
}

/// The problem of a frontend that got backend indices for only `placed` of its `count`
/// backends (the backend array has no index left): left out when it got none, else
/// programmed with the first `placed`.
fn short_of_indices(
    object: &str,
    placed: u16,
    count: usize,
    limits: Limits,
) -> Option<DesiredError> {
    if placed as usize == count {
        return None;
    }
    let (object, map, capacity) = (object.to_string(), MAP_BACKEND, limits.backends);
    let needed = count - placed as usize;
    Some(match placed {
        0 => DesiredError::MapFull {
            object,
            map,
            capacity,
            needed,
        },
        kept => DesiredError::MapFullPartly {
            object,
            map,
            capacity,
            needed,
            count,
            kept,
        },
    })
}

/// What one placed frontend added to the desired state: its entry's key and slot count
/// (its slots' backend indices are in the desired state), its name's index and its source
/// ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placed {
    pub key: SvcKey,
    pub slots: u16,
    pub name: u32,
    pub src_ranges: Box<[SrcRange]>,
    /// The service index of its Maglev table, if it has one.
    pub maglev: Option<u32>,
}

impl Placed {
    /// The backend index of each slot, as `desired` has them (while this frontend is in it).
    pub fn backends<'a>(&self, desired: &'a Desired) -> impl Iterator<Item = u32> + 'a {
        desired
            .services
            .get(&self.key)
            .into_iter()
            .flat_map(|e| e.slots.iter().copied())
    }
}

/// The order candidates are placed in (stable: model order within): programmed frontends
/// first, then IPv4 before IPv6.
pub fn placing_order(ids: &impl Indices, c: &Candidate) -> (bool, bool) {
    (
        !ids.has_svc(&external(c.key)),
        c.key.family != lb_common::FAMILY_V4,
    )
}

/// The external-scope key of a frontend's entry.
pub fn external(key: SvcKey) -> SvcKey {
    SvcKey {
        scope: SCOPE_EXTERNAL,
        ..key
    }
}

/// The slots of `plan` (the `placed` of `object`'s `count` backends that got an index) that
/// fit beside `desired`, in the slot range `ids` gives it: all, or the first ones that fit
/// (named in `errors`: a scale-up past a full map keeps the frontend serving rather than
/// taking it out); `None` when not one does, or the service map has no room for its entry.
fn fit(
    desired: &Desired,
    plan: &mut Plan,
    (placed, ids): (u16, &mut impl Indices),
    limits: Limits,
    (object, count): (&str, usize),
    errors: &mut Vec<DesiredError>,
) -> Option<u16> {
    let mut short = fitting_slots(desired, plan, placed, limits).err();
    let keep = short.as_ref().map_or(placed, |s| s.keep);
    let full = |map, capacity, needed| DesiredError::MapFull {
        object: object.to_string(),
        map,
        capacity,
        needed,
    };
    if let Some(s) = short.as_ref().filter(|s| s.keep == 0) {
        errors.push(full(s.map, s.capacity, s.needed));
        return None;
    }
    let Some((base, room)) = ids.slot_range(plan.key, keep, limits.slots) else {
        errors.push(full(MAP_SLOT, limits.slots, keep as usize));
        return None;
    };
    let keep = if room < keep {
        short = Some(Short {
            map: MAP_SLOT,
            capacity: limits.slots,
            needed: count,
            keep: room,
        });
        room
    } else {
        keep
    };
    plan.entry.value.slot_base = base;
    if let Some(Short {
        map,
        capacity,
        needed,
        keep,
    }) = short
    {
        errors.push(DesiredError::MapFullPartly {
            object: object.to_string(),
            map,
            capacity,
            needed,
            count,
            kept: keep,
        });
        plan.backends.truncate(keep as usize);
    }
    Some(keep)
}

/// A frontend whose backends do not all fit: the map short of room, its capacity, the
/// entries the whole frontend needs, and how many of its first backends fit (0: none).
struct Short {
    map: &'static str,
    capacity: u32,
    needed: usize,
    keep: u16,
}

/// Whether `plan`'s entry and its `slots` backends fit the service map and the backend
/// array beside `desired`; else how many of its first backends do (0 when the entry does
/// not).
fn fitting_slots(desired: &Desired, plan: &Plan, slots: u16, limits: Limits) -> Result<(), Short> {
    if desired.services.len() >= limits.svc_entries as usize {
        return Err(Short {
            map: MAP_SVC,
            capacity: limits.svc_entries,
            needed: 1,
            keep: 0,
        });
    }
    let be_free = (limits.backends as usize).saturating_sub(desired.backends.len());
    let mut new = 0;
    let be_fit = plan
        .backends
        .iter()
        .take_while(|(id, _)| {
            new += usize::from(!desired.backends.contains_key(id));
            new <= be_free
        })
        .count();
    if be_fit == slots as usize {
        return Ok(());
    }
    let needed = plan
        .backends
        .iter()
        .filter(|(id, _)| !desired.backends.contains_key(id))
        .count();
    Err(Short {
        map: MAP_BACKEND,
        capacity: limits.backends,
        needed,
        keep: be_fit as u16,
    })
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
