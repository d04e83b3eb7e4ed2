//! The egress entries of SNATed flows that an agent of the previous datapath began. Before
//! tc egress existed, tc ingress rewrote both sides of a flow's packets, and a SNATed flow
//! had two entries; now its source side is rewritten at egress, which finds it under two
//! more (`CT_DIR_SNAT_OUT`, and its reply as netfilter sees it: see
//! `lb_common::CT_DIR_SNAT_OUT`). An agent adds them for every SNATed flow pinned without
//! them, before its programs replace the previous ones and once more right after (for flows
//! the previous programs began meanwhile), so no flow breaks on the upgrade.

use std::collections::HashMap as Entries;

use aya::maps::{HashMap, MapData};
use lb_common::{CT_DIR_FORWARD, CtKey, CtKey6, MAP_CT, MAP_CT_ASSURED, MAP_CT6, MAP_CT6_ASSURED};

use super::{DatapathError, ct_gc::Tracked, pins::Pins};

/// Adds the missing egress entries of SNATed flows in every conntrack table of `pins`;
/// returns how many it wrote.
pub fn backfill(pins: &Pins) -> Result<usize, DatapathError> {
    let mut n = 0;
    for name in [MAP_CT, MAP_CT_ASSURED] {
        n += table::<CtKey>(pins, name)?;
    }
    for name in [MAP_CT6, MAP_CT6_ASSURED] {
        if pins.has(name) {
            n += table::<CtKey6>(pins, name)?;
        }
    }
    Ok(n)
}

/// The keys and values to add to a table holding `entries`: for each SNATed flow (its
/// forward entry), the egress entries it lacks (the reply one only while its reply entry is
/// there to copy).
pub fn missing<K: Tracked>(entries: &Entries<K, K::Value>) -> Vec<(K, K::Value)> {
    let mut add = Vec::new();
    for (k, v) in entries {
        if k.dir() != CT_DIR_FORWARD || !k.translated(v) {
            continue;
        }
        let [out, back] = k.egress_of(v);
        if !entries.contains_key(&out) {
            add.push((out, *v));
        }
        if !entries.contains_key(&back)
            && let Some(reply) = entries.get(&k.reply_of(v))
        {
            add.push((back, *reply));
        }
    }
    add
}

/// [`backfill`] of one pinned table (a hash or an LRU hash of the same key and value).
fn table<K: Tracked>(pins: &Pins, name: &'static str) -> Result<usize, DatapathError> {
    let err = |source| DatapathError::Map { name, source };
    let mut map: HashMap<MapData, K, K::Value> = HashMap::try_from(pins.map(name)?).map_err(err)?;
    // Bounded by the table's size, as the collector's pass.
    let mut entries = Entries::new();
    for kv in map.iter() {
        let (k, v) = kv.map_err(err)?;
        entries.insert(k, v);
    }
    let add = missing(&entries);
    for (k, v) in &add {
        map.insert(k, v, 0).map_err(err)?;
    }
    Ok(add.len())
}

#[cfg(test)]
mod tests {
    use lb_common::{CT_DIR_REPLY, CT_DIR_SNAT_OUT, CT_F_SNAT, CtValue, IPPROTO_TCP};

    use super::*;

    #[test]
    fn a_snated_flow_without_egress_entries_gets_both() {
        let k = CtKey {
            saddr_be: 1,
            daddr_be: 2,
            sport_be: 3,
            dport_be: 4,
            proto: IPPROTO_TCP,
            dir: CT_DIR_FORWARD,
            _pad: 0,
        };
        // client 1:3 → frontend 2:4, SNATed to 7:70 toward backend 9:8.
        let fwd = CtValue {
            saddr_be: 7,
            sport_be: 70,
            daddr_be: 9,
            dport_be: 8,
            flags: CT_F_SNAT,
            ..Default::default()
        };
        let reply = CtValue {
            saddr_be: 2,
            sport_be: 4,
            daddr_be: 1,
            dport_be: 3,
            flags: CT_F_SNAT,
            ..Default::default()
        };
        let rk = k.reply_of(&fwd);
        let mut t: Entries<_, _> = [(k, fwd), (rk, reply)].into();
        let add = missing(&t);
        assert_eq!(add.len(), 2);
        let out = add
            .iter()
            .find(|(k, _)| k.dir == CT_DIR_SNAT_OUT)
            .expect("out");
        assert_eq!((out.0.saddr_be, out.0.daddr_be, out.0.dport_be), (1, 9, 8));
        assert_eq!((out.1.saddr_be, out.1.sport_be), (7, 70));
        let back = add
            .iter()
            .find(|(k, _)| k.dir == CT_DIR_REPLY)
            .expect("back");
        assert_eq!(
            (back.0.saddr_be, back.0.daddr_be, back.0.dport_be),
            (9, 1, 3)
        );
        assert_eq!((back.1.saddr_be, back.1.sport_be), (2, 4));
        // Once there, nothing more; a flow that is not SNATed never gets any.
        t.extend(add);
        assert!(missing(&t).is_empty());
        let plain = CtValue { flags: 0, ..fwd };
        let t: Entries<_, _> = [(k, plain)].into();
        assert!(missing(&t).is_empty());
    }
}
