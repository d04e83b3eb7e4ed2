//! How a new flow's backend is picked (`select::choose` in the programs): the client's
//! affinity entry, else for a frontend flagged `SVC_F_MAGLEV` the slot its Maglev table
//! (`XLB_MAGLEV_V2`) holds for the flow's hash, else uniformly at random. The trace's
//! `algorithm` step, recomputed from the live maps and the traced packet as the program
//! computes it.

use std::net::SocketAddr;

use lb_common::{AffinityValue, MAGLEV_ROW_SLOTS, MAP_MAGLEV, SVC_F_MAGLEV, user::addr_words};

use super::{Frontend, backend_addr};
use crate::{datapath::clock::monotonic_coarse_ns, desired::Desired, model::Protocol};

/// Where a frontend's Maglev table sends a flow: its hash, the entry it reads and the slot
/// that entry names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MaglevPick {
    pub hash: u32,
    /// The table's size `M`.
    pub size: u32,
    /// `hash % size`.
    pub entry: u32,
    /// The slot the entry holds (`1..=count`; anything else: the program picks at random).
    pub slot: u16,
}

/// The 5-tuple's hash as the programs compute it (`lb_common::flow_hash`; an IPv4 address
/// in word 0 of its words, as `select::flow_hash`, an IPv6 one in all four, as `v6/mod.rs`).
pub(super) fn flow_hash(src: SocketAddr, dst: SocketAddr, protocol: Protocol) -> u32 {
    lb_common::flow_hash(
        &addr_words(src.ip()).0,
        &addr_words(dst.ip()).0,
        src.port().to_be(),
        dst.port().to_be(),
        protocol.number(),
    )
}

/// The Maglev table entry the flow `src` → `dst` reads (`select::xlb_maglev_slot`), if the
/// frontend has a table (flagged or not: the caller checks the flag).
pub(super) fn maglev_pick(
    state: &Desired,
    svc_id: u32,
    src: SocketAddr,
    dst: SocketAddr,
    protocol: Protocol,
) -> Option<MaglevPick> {
    let table = state.maglev.get(&svc_id)?;
    let size = table.size();
    if size == 0 {
        return None;
    }
    let hash = flow_hash(src, dst, protocol);
    // Masked as the program masks it (no change for a table the agent writes).
    let entry = (hash % size) as usize & (MAGLEV_ROW_SLOTS - 1);
    Some(MaglevPick {
        hash,
        size,
        entry: entry as u32,
        slot: table.slots.get(entry).copied().unwrap_or(0),
    })
}

/// Whether the client's live affinity entry `live` decides the backend (`affinity::lookup`):
/// affinity on, not expired, its backend still in the slot it was chosen from.
pub(super) fn affinity_hit(f: &Frontend, live: Option<&AffinityValue>) -> bool {
    live.is_some_and(|a| {
        f.svc.affinity_timeout_s != 0
            && monotonic_coarse_ns().saturating_sub(a.last_seen_ns)
                <= f.svc.affinity_timeout_s as u64 * 1_000_000_000
            && f.slots.iter().any(|(slot, id, b)| {
                *slot == a.slot
                    && *id == a.backend_id
                    && b.is_some_and(|b| b.generation == a.backend_gen)
            })
    })
}

/// How a new flow to `f` was picked: the step's line, and whether the Maglev table chose
/// the backend the run went to.
pub(super) struct Algorithm {
    pub line: String,
    pub by_table: bool,
}

/// The `algorithm` step of a new flow `src` → `dst` to `f`: `random: …`, or for a frontend
/// flagged `SVC_F_MAGLEV` `maglev: flow hash 0x… -> entry E of M=… -> slot S (backend)`.
/// `chosen`: the backend index the test run's flow went to; `by_affinity`: the client's
/// affinity entry decided it (the table is not read).
pub(super) fn algorithm(
    state: &Desired,
    f: &Frontend,
    (src, dst, protocol): (SocketAddr, SocketAddr, Protocol),
    chosen: Option<u32>,
    by_affinity: bool,
) -> Algorithm {
    let count = f.slots.len();
    let not_consulted = "; not consulted: the client's affinity entry decides";
    if f.svc.flags & SVC_F_MAGLEV == 0 {
        let mut line = format!("random: a new flow picks uniformly among {count} slot(s)");
        if by_affinity {
            line.push_str(not_consulted);
        }
        return Algorithm {
            line,
            by_table: false,
        };
    }
    let Some(p) = maglev_pick(state, f.svc.svc_id, src, dst, protocol) else {
        return Algorithm {
            line: format!(
                "maglev: no table for service index {} in {MAP_MAGLEV}: a new flow picks at random among {count} slot(s)",
                f.svc.svc_id
            ),
            by_table: false,
        };
    };
    let mut line = format!(
        "maglev: flow hash {:#010x} -> entry {} of M={} -> slot {}",
        p.hash, p.entry, p.size, p.slot
    );
    let named = (p.slot >= 1 && p.slot as usize <= count)
        .then(|| f.slots.get(p.slot as usize - 1))
        .flatten();
    let by_table = match named {
        Some((_, id, Some(b))) => {
            line.push_str(&format!(" ({})", backend_addr(b)));
            !by_affinity && chosen.is_none_or(|c| c == *id)
        }
        Some((_, id, None)) => {
            line.push_str(&format!(" (backend index {id}, missing)"));
            false
        }
        None => {
            line.push_str(&format!(
                ", not one of the {count} slot(s): picked at random instead"
            ));
            false
        }
    };
    if by_affinity {
        line.push_str(not_consulted);
    } else if let (Some((_, id, Some(_))), Some(c)) = (named, chosen)
        && c != *id
    {
        line.push_str(&format!(
            "; but the test run went to backend index {c} (the maps changed meanwhile?)"
        ));
    }
    Algorithm { line, by_table }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use lb_common::{Backend, FAMILY_V4, SvcKey, SvcValue};

    use super::*;
    use crate::desired::MaglevTable;

    fn backend(ip: [u8; 4]) -> Backend {
        Backend {
            addr_be: [u32::from_ne_bytes(ip), 0, 0, 0],
            port_be: 8080u16.to_be(),
            proto: lb_common::IPPROTO_TCP,
            family: FAMILY_V4,
            generation: 1,
            ..Backend::default()
        }
    }

    /// A frontend of service index 7 on two backends (indices 11, 12), flagged or not, and a
    /// state with a table of size 5 for it.
    fn setup(flags: u16) -> (Desired, Frontend) {
        let mut state = Desired::default();
        state.maglev.insert(
            7,
            MaglevTable {
                slots: Arc::from(vec![1u16, 2, 2, 1, 3]),
            },
        );
        let f = Frontend {
            key: SvcKey::default(),
            svc: SvcValue {
                svc_id: 7,
                count: 2,
                flags,
                ..SvcValue::default()
            },
            slots: vec![
                (1, 11, Some(backend([10, 244, 1, 2]))),
                (2, 12, Some(backend([10, 244, 1, 3]))),
            ],
        };
        (state, f)
    }

    #[test]
    fn the_hash_is_the_programs_for_both_families() {
        let (src, dst): (SocketAddr, SocketAddr) = (
            "10.244.1.9:40000".parse().expect("src"),
            "203.0.113.7:80".parse().expect("dst"),
        );
        assert_eq!(
            flow_hash(src, dst, Protocol::Tcp),
            lb_common::flow_hash(
                &[u32::from_ne_bytes([10, 244, 1, 9]), 0, 0, 0],
                &[u32::from_ne_bytes([203, 0, 113, 7]), 0, 0, 0],
                40000u16.to_be(),
                80u16.to_be(),
                lb_common::IPPROTO_TCP,
            )
        );
        let (src6, dst6): (SocketAddr, SocketAddr) = (
            "[fd00:244:1::9]:40000".parse().expect("src"),
            "[2001:db8::7]:80".parse().expect("dst"),
        );
        let words = |a: SocketAddr| addr_words(a.ip()).0;
        assert_eq!(
            flow_hash(src6, dst6, Protocol::Udp),
            lb_common::flow_hash(
                &words(src6),
                &words(dst6),
                40000u16.to_be(),
                80u16.to_be(),
                lb_common::IPPROTO_UDP,
            )
        );
    }

    #[test]
    fn a_maglev_frontend_names_the_entry_and_the_slot_it_holds() {
        let (state, f) = setup(SVC_F_MAGLEV);
        // Source ports until each kind of entry (slot 1, slot 2, slot 3: none of the two)
        // has come up.
        let dst: SocketAddr = "203.0.113.7:80".parse().expect("dst");
        let mut seen = [false; 3];
        for port in 40000..40100u16 {
            let src = SocketAddr::from(([10, 244, 1, 9], port));
            let p = maglev_pick(&state, 7, src, dst, Protocol::Tcp).expect("a table");
            assert_eq!(p.entry, p.hash % 5);
            assert_eq!(p.slot, [1, 2, 2, 1, 3][p.entry as usize]);
            let id = [0, 11, 12, 0][p.slot as usize];
            let a = algorithm(&state, &f, (src, dst, Protocol::Tcp), Some(id), false);
            let head = format!(
                "maglev: flow hash {:#010x} -> entry {} of M=5 -> slot {}",
                p.hash, p.entry, p.slot
            );
            let want = match p.slot {
                1 => format!("{head} (10.244.1.2:8080)"),
                2 => format!("{head} (10.244.1.3:8080)"),
                _ => format!("{head}, not one of the 2 slot(s): picked at random instead"),
            };
            assert_eq!(a.line, want);
            assert_eq!(a.by_table, p.slot <= 2);
            seen[p.slot as usize - 1] = true;
            if p.slot <= 2 {
                let other = 23 - id;
                let a = algorithm(&state, &f, (src, dst, Protocol::Tcp), Some(other), false);
                assert!(!a.by_table && a.line.contains("the test run went to backend index"));
                let a = algorithm(&state, &f, (src, dst, Protocol::Tcp), Some(other), true);
                assert!(!a.by_table && a.line.ends_with("affinity entry decides"));
            }
        }
        assert_eq!(seen, [true; 3]);
    }

    #[test]
    fn an_unflagged_frontend_is_random_and_a_missing_table_said() {
        let (mut state, f) = setup(0);
        let src = SocketAddr::from(([10, 244, 1, 9], 40000));
        let dst: SocketAddr = "10.96.0.10:80".parse().expect("dst");
        let a = algorithm(&state, &f, (src, dst, Protocol::Tcp), Some(11), false);
        assert_eq!(a.line, "random: a new flow picks uniformly among 2 slot(s)");
        assert!(!a.by_table);
        let (_, flagged) = setup(SVC_F_MAGLEV);
        state.maglev.clear();
        let a = algorithm(&state, &flagged, (src, dst, Protocol::Tcp), Some(11), false);
        assert_eq!(
            a.line,
            format!(
                "maglev: no table for service index 7 in {MAP_MAGLEV}: a new flow picks at random among 2 slot(s)"
            )
        );
    }
}
