//! What must hold for every generated file: errors name their objects, bad objects keep no
//! good one out, the desired maps are consistent and within their limits.

use std::collections::BTreeMap;

use crate::generate::GenFile;
use lb_common::{MAX_BACKENDS_PER_SVC, SvcKey};
use lb_userspace::{
    desired::{Desired, DesiredError, Limits, NodeContext},
    model::Model,
    reconcile::{Ids, recompute},
    source::file,
};
use proptest::prelude::*;

/// What parsing must make of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// In the model under this key (Services) or service and slice name (slices).
    Kept,
    /// Left out without an error (headless, ExternalName, FQDN, no service label).
    Ignored,
    /// Left out with exactly one error containing this text.
    Error(String),
}

/// Each source error matches one object expected to fail (its text names it), and each such
/// object has its error.
pub(crate) fn check_errors(
    f: &GenFile,
    loaded: &lb_userspace::source::Snapshot,
) -> Result<(), TestCaseError> {
    let mut due: Vec<&String> = f
        .expect
        .iter()
        .filter_map(|(_, _, _, o)| match o {
            Outcome::Error(tag) => Some(tag),
            _ => None,
        })
        .collect();
    for e in &loaded.errors {
        let msg = e.to_string();
        let at = due.iter().position(|tag| msg.contains(tag.as_str()));
        prop_assert!(
            at.is_some(),
            "error names no failing object: {msg}\nstill due: {due:?}"
        );
        if let Some(at) = at {
            due.remove(at);
        }
    }
    prop_assert!(due.is_empty(), "objects without their error: {due:?}");
    Ok(())
}

/// Every valid object is in the model, every other one is not.
pub(crate) fn check_model(f: &GenFile, model: &Model) -> Result<(), TestCaseError> {
    for (kind, id, slice, outcome) in &f.expect {
        let present = match slice {
            None => model.services.contains_key(id),
            Some(name) => model
                .slices
                .get(id)
                .is_some_and(|s| s.contains_key(name.as_str())),
        };
        prop_assert_eq!(
            present,
            *outcome == Outcome::Kept,
            "{} {} {:?}: {:?}",
            kind,
            id,
            slice,
            outcome
        );
    }
    Ok(())
}

/// The frontends the model's Services claim (ClusterIP and externalIP, per port), with the
/// objects claiming each.
pub(crate) fn claims(model: &Model) -> BTreeMap<SvcKey, Vec<String>> {
    let mut out: BTreeMap<SvcKey, Vec<String>> = BTreeMap::new();
    for (id, svc) in &model.services {
        let Some(std::net::IpAddr::V4(vip)) =
            svc.cluster_ips.iter().copied().find(|ip| ip.is_ipv4())
        else {
            continue;
        };
        for p in &svc.ports {
            let object = if p.name.is_empty() {
                format!("{id}:{}", p.port)
            } else {
                format!("{id}:{}", p.name)
            };
            out.entry(lb_common::user::frontend_key(vip, p.port, p.protocol))
                .or_default()
                .push(object.clone());
            for ip in &svc.external_ips {
                if let std::net::IpAddr::V4(ip) = ip {
                    out.entry(lb_common::user::frontend_key(*ip, p.port, p.protocol))
                        .or_default()
                        .push(format!("{object} (externalIP {ip})"));
                }
            }
        }
    }
    out
}

/// Each claimed frontend has one owner, programmed or refused for a full map by name; every
/// other claimant is told whose it is.
pub(crate) fn check_frontends(
    model: &Model,
    d: &Desired,
    errors: &[DesiredError],
) -> Result<(), TestCaseError> {
    for (key, objects) in claims(model) {
        let shown = lb_common::user::show_frontend(&key);
        let conflicts = errors
            .iter()
            .filter(|e| matches!(e, DesiredError::FrontendConflict { frontend, .. } if *frontend == shown))
            .count();
        prop_assert_eq!(
            conflicts,
            objects.len() - 1,
            "{} claimed by {:?}",
            shown,
            objects
        );
        let programmed = d.services.contains_key(&key);
        let refused = errors
            .iter()
            .any(|e| matches!(e, DesiredError::MapFull { object, .. } if objects.contains(object)));
        prop_assert!(
            programmed || refused,
            "{} ({:?}) neither programmed nor refused",
            shown,
            objects
        );
    }
    Ok(())
}

/// Every desired error names a Service of the model (`ns/name`, then a port or nothing).
pub(crate) fn check_desired_errors(
    model: &Model,
    errors: &[DesiredError],
) -> Result<(), TestCaseError> {
    for e in errors {
        let object = e.object();
        let named = model.services.keys().any(|id| {
            let id = id.to_string();
            object == id || object.starts_with(&format!("{id}:"))
        });
        prop_assert!(named, "error names no Service: {}", e);
    }
    Ok(())
}

/// The maps are consistent: each frontend's slots exist and point at programmed backends,
/// each frontend has a name, nothing exceeds its limit.
pub(crate) fn check_maps(d: &Desired, limits: Limits) -> Result<(), TestCaseError> {
    prop_assert!(d.services.len() <= limits.svc_entries as usize);
    prop_assert!(d.backends.len() <= limits.backends as usize);
    let v6 = d.src_ranges.iter().filter(|r| r.addr.is_ipv6()).count();
    prop_assert!(d.src_ranges.len() - v6 <= limits.src_ranges as usize);
    prop_assert!(v6 <= limits.src_ranges6 as usize);
    let mut ranges = Vec::new();
    for (k, v) in &d.services {
        prop_assert!(v.count <= MAX_BACKENDS_PER_SVC, "{:?}", k);
        prop_assert!(
            d.names.contains_key(&v.svc_id),
            "frontend {:?} has no name",
            k
        );
        prop_assert_eq!(v.slots.len(), v.count as usize, "{:?}", k);
        for (i, id) in v.slots.iter().enumerate() {
            prop_assert!(
                d.backends.contains_key(id),
                "{:?}: slot {} has no backend",
                k,
                i + 1
            );
        }
        if v.count > 0 {
            // A power of two aligned to its size, inside the slot array.
            let size = u64::from(v.count.next_power_of_two());
            let base = u64::from(v.slot_base);
            prop_assert_eq!(base % size, 0, "{:?}: range not aligned", k);
            prop_assert!(base + u64::from(v.count) <= u64::from(limits.slots));
            ranges.push((base, base + u64::from(v.count), *k));
        }
    }
    ranges.sort();
    for w in ranges.windows(2) {
        prop_assert!(
            w[0].1 <= w[1].0,
            "{:?} and {:?} share slots",
            w[0].2,
            w[1].2
        );
    }
    Ok(())
}

pub(crate) fn limits(small: Option<(u32, u32)>) -> Limits {
    match small {
        Some((svc_entries, backends)) => Limits {
            svc_entries,
            backends,
            src_ranges: 8,
            src_ranges6: 8,
            ..Limits::default()
        },
        None => Limits::default(),
    }
}

/// The whole path, checked: parse, model, desired on a node with NodePort addresses, twice
/// (the second computation, with the ids of the first, must give the same maps).
pub(crate) fn run_file(f: &GenFile, small: Option<(u32, u32)>) -> Result<(), TestCaseError> {
    let text = f.text();
    let loaded = file::parse("gen.yaml", &text);
    prop_assert!(
        loaded.is_ok(),
        "the file failed whole: {:?}\n{}",
        loaded.err(),
        text
    );
    let Ok(loaded) = loaded else { return Ok(()) };
    check_errors(f, &loaded)?;
    check_model(f, &loaded.model)?;
    let limits = limits(small);
    let node = NodeContext::new(
        "node1",
        &[std::net::Ipv4Addr::new(192, 0, 2, 1).into()],
        false,
    );
    let mut ids = Ids::default();
    let (d, errors) = recompute(&loaded.model, &node, &mut ids, limits);
    check_maps(&d, limits)?;
    check_desired_errors(&loaded.model, &errors)?;
    check_frontends(&loaded.model, &d, &errors)?;
    let (again, _) = recompute(&loaded.model, &node, &mut ids, limits);
    prop_assert_eq!(&again, &d, "a second computation changed the maps");
    Ok(())
}
