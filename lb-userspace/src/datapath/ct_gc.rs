//! The assured conntrack table's collector. The datapath moves a flow that was answered and
//! went on into `XLB_CTA_V1`, a hash nothing evicts (so a flood of new flows cannot push it
//! out, as the kernel's conntrack never early-drops an assured flow); this deletes the
//! entries of flows that are over, with the kernel conntrack's timeouts as the agent set
//! them at start ([`Timeouts`], from `--config`'s `conntrack` section; see
//! `datapath::sysctl`), so xlb's entry of a flow ends when the kernel's does:
//!
//! | flow | deleted when idle for (default) |
//! |---|---|
//! | TCP reset, or closed both ways | 10 s (the datapath's own SNAT-port reuse time) |
//! | TCP closed one way | `tcpCloseWaitTimeout` (1 h) |
//! | TCP | `tcpEstablishedTimeout` (24 h) |
//! | UDP | `udpStreamTimeout`, else the kernel's `nf_conntrack_udp_timeout_stream` (120 s) |
//!
//! A reply entry whose forward entry is gone (a UDP flow re-balanced, a reused TCP port)
//! goes after 10 s idle. An entry deleted here takes its pending counts with it
//! (`CtValue::pending`, `datapath::pending`): the packets of its flow's last second or so
//! (at most 127, or 8 MiB) that no refresh, FIN or RST moved to the counter rows, which
//! the service's and backend's counters never get (a UDP flow, a TCP flow that went idle
//! without closing). One pass reads every entry once (batched: `counts::entries`);
//! deletions are collected, so the pass never restarts its walk. Each pass also reports how
//! full the conntrack tables are (the assured ones from the pass itself, the LRU ones
//! counted every [`LRU_EVERY`] passes), for the metrics.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use aya::maps::{HashMap, MapData};
use lb_common::{
    CT_DIR_FORWARD, CT_DIR_REPLY, CT_DIR_SNAT_OUT, CT_F_CLOSING, CT_F_PORT_IN, CT_F_RESET,
    CT_F_SNAT, CtKey, CtKey6, CtValue, CtValue6, IPPROTO_UDP, MAP_CT, MAP_CT_ASSURED, MAP_CT6,
    MAP_CT6_ASSURED,
};
use tracing::{debug, warn};

use super::{
    DatapathError,
    counts::{self, Fill},
    pins::Pins,
};

const SECOND: u64 = 1_000_000_000;
/// Idle time after which a flow that is over (reset, closed both ways) is deleted.
pub const CLOSED_NS: u64 = 10 * SECOND;

/// The idle times after which an open flow is over, in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// An open TCP flow (kube-proxy's `tcpEstablishedTimeout`).
    pub tcp_established_s: u64,
    /// A TCP flow closed one way only (kube-proxy's `tcpCloseWaitTimeout`).
    pub tcp_close_wait_s: u64,
    /// A UDP flow that was answered (the kernel's UDP stream timeout).
    pub udp_stream_s: u64,
}

impl Default for Timeouts {
    /// kube-proxy's defaults, and the kernel's UDP stream timeout.
    fn default() -> Self {
        Self {
            tcp_established_s: 24 * 3600,
            tcp_close_wait_s: 3600,
            udp_stream_s: 120,
        }
    }
}

/// How often the collector looks.
pub const INTERVAL: Duration = Duration::from_secs(5);
/// The LRU tables (which nothing here deletes from) are counted every this many passes
/// (30 s): a count reads every entry, up to the table's capacity.
pub const LRU_EVERY: u32 = 6;

/// One pass over one family's tables.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TablePass {
    /// The assured table after the pass's deletions.
    pub assured: Fill,
    /// The LRU table, when this pass counted it.
    pub lru: Option<Fill>,
    /// Entries the pass deleted.
    pub deleted: u64,
    /// How long the pass over the assured table took.
    pub took: Duration,
}

/// One pass of the collector: IPv4's tables, and IPv6's (missing under the pins of an agent
/// from before IPv6 flows were tracked).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    pub v4: TablePass,
    pub v6: Option<TablePass>,
}

/// What the collector reads of a conntrack value (IPv4's and IPv6's).
pub trait CtTimes {
    fn flags(&self) -> u16;
    fn last_seen_ns(&self) -> u64;
}

/// A conntrack key (IPv4's and IPv6's) and how it names the other entry of its flow.
pub trait Tracked: Copy + Eq + std::hash::Hash + aya::Pod + bytemuck::Pod {
    type Value: CtTimes + Copy + aya::Pod + bytemuck::Pod;
    fn dir(&self) -> u8;
    fn proto(&self) -> u8;
    /// The reply key of the flow whose forward entry (under this key) is `fwd`.
    fn reply_of(&self, fwd: &Self::Value) -> Self;
    /// The forward key of the flow whose reply entry (under this key) is `reply`.
    fn forward_of(&self, reply: &Self::Value) -> Self;
    /// The egress entries' keys of the SNATed flow whose forward entry (under this key) is
    /// `fwd`: its request as netfilter sees it (client → backend, `CT_DIR_SNAT_OUT`) and its
    /// reply likewise (backend → client, `CT_DIR_REPLY`).
    fn egress_of(&self, fwd: &Self::Value) -> [Self; 2];
    /// Whether the flow whose forward entry (under this key) is `fwd` has its source
    /// address translated (SNAT to the node, hairpin): it has egress entries then.
    fn translated(&self, fwd: &Self::Value) -> bool;
}

macro_rules! tracked {
    ($k:ty, $v:ty) => {
        impl CtTimes for $v {
            fn flags(&self) -> u16 {
                self.flags
            }
            fn last_seen_ns(&self) -> u64 {
                self.last_seen_ns
            }
        }
        impl Tracked for $k {
            type Value = $v;
            fn dir(&self) -> u8 {
                self.dir
            }
            fn proto(&self) -> u8 {
                self.proto
            }
            fn reply_of(&self, fwd: &$v) -> Self {
                Self {
                    saddr_be: fwd.daddr_be,
                    daddr_be: fwd.saddr_be,
                    sport_be: fwd.dport_be,
                    dport_be: fwd.sport_be,
                    proto: self.proto,
                    dir: CT_DIR_REPLY,
                    _pad: 0,
                }
            }
            fn forward_of(&self, reply: &$v) -> Self {
                Self {
                    saddr_be: reply.daddr_be,
                    daddr_be: reply.saddr_be,
                    sport_be: reply.dport_be,
                    dport_be: reply.sport_be,
                    proto: self.proto,
                    dir: CT_DIR_FORWARD,
                    _pad: 0,
                }
            }
            fn translated(&self, fwd: &$v) -> bool {
                fwd.flags & CT_F_SNAT != 0 && fwd.saddr_be != self.saddr_be
            }
            fn egress_of(&self, fwd: &$v) -> [Self; 2] {
                // The client's port as netfilter sees it (remapped at ingress, or its own).
                let port = if fwd.flags & CT_F_PORT_IN != 0 {
                    fwd.sport_be
                } else {
                    self.sport_be
                };
                let out = Self {
                    saddr_be: self.saddr_be,
                    daddr_be: fwd.daddr_be,
                    sport_be: port,
                    dport_be: fwd.dport_be,
                    proto: self.proto,
                    dir: CT_DIR_SNAT_OUT,
                    _pad: 0,
                };
                let back = Self {
                    saddr_be: fwd.daddr_be,
                    daddr_be: self.saddr_be,
                    sport_be: fwd.dport_be,
                    dport_be: port,
                    proto: self.proto,
                    dir: CT_DIR_REPLY,
                    _pad: 0,
                };
                [out, back]
            }
        }
    };
}
tracked!(CtKey, CtValue);
tracked!(CtKey6, CtValue6);

/// The idle time after which the flow of forward entry `fwd` and reply entry `reply` is
/// over. A missing entry counts as neither closing nor reset.
pub fn timeout<V: CtTimes>(t: &Timeouts, proto: u8, fwd: &V, reply: Option<&V>) -> u64 {
    let flags = fwd.flags() | reply.map_or(0, |r| r.flags());
    let closed_both =
        fwd.flags() & CT_F_CLOSING != 0 && reply.is_some_and(|r| r.flags() & CT_F_CLOSING != 0);
    if flags & CT_F_RESET != 0 || closed_both {
        CLOSED_NS
    } else if proto == IPPROTO_UDP {
        t.udp_stream_s.saturating_mul(SECOND)
    } else if flags & CT_F_CLOSING != 0 {
        t.tcp_close_wait_s.saturating_mul(SECOND)
    } else {
        t.tcp_established_s.saturating_mul(SECOND)
    }
}

/// Whether the flow is over at `now_ns` (the datapath's clock).
pub fn over<V: CtTimes>(t: &Timeouts, proto: u8, fwd: &V, reply: Option<&V>, now_ns: u64) -> bool {
    let last = fwd
        .last_seen_ns()
        .max(reply.map_or(0, |r| r.last_seen_ns()));
    now_ns.saturating_sub(last) >= timeout(t, proto, fwd, reply)
}

/// The reply key of the flow whose forward entry is `fwd`.
pub fn reply_key<K: Tracked>(k: &K, fwd: &K::Value) -> K {
    k.reply_of(fwd)
}

/// The forward key of the flow whose reply entry is `reply`.
pub fn forward_key<K: Tracked>(k: &K, reply: &K::Value) -> K {
    k.forward_of(reply)
}

/// The keys to delete from a table holding `entries`, at `now_ns`: every entry of each flow
/// that is over (forward, reply, and a SNATed flow's two egress entries), and entries left
/// without their forward entry once idle.
pub fn expired<K: Tracked>(
    entries: &std::collections::HashMap<K, K::Value>,
    t: &Timeouts,
    now_ns: u64,
) -> Vec<K> {
    let mut gone = std::collections::HashSet::new();
    // The egress entries of live SNATed flows: kept with their flow.
    let mut owned = std::collections::HashSet::new();
    for (k, v) in entries.iter().filter(|(k, _)| k.dir() == CT_DIR_FORWARD) {
        let rk = reply_key(k, v);
        let reply = entries.get(&rk);
        let egress = k.translated(v).then(|| k.egress_of(v));
        if over(t, k.proto(), v, reply, now_ns) {
            gone.insert(*k);
            if reply.is_some() {
                gone.insert(rk);
            }
            for ek in egress.iter().flatten() {
                if entries.contains_key(ek) {
                    gone.insert(*ek);
                }
            }
        } else {
            owned.extend(egress.into_iter().flatten());
        }
    }
    for (k, v) in entries.iter().filter(|(k, _)| k.dir() != CT_DIR_FORWARD) {
        if owned.contains(k) || gone.contains(k) {
            continue;
        }
        let fk = forward_key(k, v);
        let paired =
            k.dir() == CT_DIR_REPLY && entries.get(&fk).is_some_and(|f| reply_key(&fk, f) == *k);
        if !paired && now_ns.saturating_sub(v.last_seen_ns()) >= CLOSED_NS {
            gone.insert(*k);
        }
    }
    gone.into_iter().collect()
}

/// One pass over the pinned assured tables of `pins` (IPv4's and IPv6's; the IPv6 one may be
/// missing, pinned by an agent before IPv6 flows were tracked): returns how many entries it
/// deleted.
pub fn sweep(pins: &Pins, t: &Timeouts) -> Result<usize, DatapathError> {
    let p = pass(pins, t, false)?;
    Ok((p.v4.deleted + p.v6.map_or(0, |t| t.deleted)) as usize)
}

/// [`sweep`], with how full each table is; the LRU tables are counted when `count_lru`.
pub fn pass(pins: &Pins, t: &Timeouts, count_lru: bool) -> Result<Pass, DatapathError> {
    let v4 = table_pass::<CtKey>(pins, t, MAP_CT_ASSURED, count_lru.then_some(MAP_CT))?;
    let v6 = match pins.has(MAP_CT6_ASSURED) {
        true => Some(table_pass::<CtKey6>(
            pins,
            t,
            MAP_CT6_ASSURED,
            count_lru.then_some(MAP_CT6),
        )?),
        false => None,
    };
    Ok(Pass { v4, v6 })
}

/// One pass over the pinned assured table `name`, and a count of LRU table `lru`.
fn table_pass<K: Tracked>(
    pins: &Pins,
    t: &Timeouts,
    name: &'static str,
    lru: Option<&'static str>,
) -> Result<TablePass, DatapathError> {
    let started = Instant::now();
    let err = |source| DatapathError::Map { name, source };
    let map = pins.map(name)?;
    let capacity = match &map {
        aya::maps::Map::HashMap(d) => d.info().map_or(0, |i| i.max_entries()),
        _ => 0,
    };
    // Bounded by the table's size (64 bytes an IPv4 entry, 112 an IPv6 one).
    let entries: std::collections::HashMap<K, K::Value> =
        counts::entries::<K, K::Value>(&map, name)?
            .into_iter()
            .collect();
    let gone = expired(&entries, t, super::clock::monotonic_coarse_ns());
    let mut table: HashMap<MapData, K, K::Value> = HashMap::try_from(map).map_err(err)?;
    for k in &gone {
        // Already gone (the datapath started the flow over) is fine.
        let _ = table.remove(k);
    }
    let took = started.elapsed();
    let lru = match lru {
        Some(lru) => Some(counts::count::<K, K::Value>(pins, lru)?),
        None => None,
    };
    Ok(TablePass {
        assured: Fill {
            entries: entries.len().saturating_sub(gone.len()) as u64,
            capacity,
        },
        lru,
        deleted: gone.len() as u64,
        took,
    })
}

/// Runs [`pass`] at once and then every [`INTERVAL`] on a thread of its own until `stop`,
/// handing each pass to `report`.
pub fn spawn(
    pins: Pins,
    timeouts: Timeouts,
    stop: Arc<AtomicBool>,
    mut report: impl FnMut(&Pass) + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("xlb-ct-gc".into())
        .spawn(move || {
            let mut waited = INTERVAL;
            let mut passes = 0u32;
            while !stop.load(Ordering::Relaxed) {
                if waited < INTERVAL {
                    std::thread::sleep(Duration::from_millis(200));
                    waited += Duration::from_millis(200);
                    continue;
                }
                waited = Duration::ZERO;
                match pass(&pins, &timeouts, passes.is_multiple_of(LRU_EVERY)) {
                    Ok(p) => {
                        let deleted = p.v4.deleted + p.v6.map_or(0, |t| t.deleted);
                        if deleted > 0 {
                            debug!(deleted, "assured conntrack: flows that are over deleted");
                        }
                        report(&p);
                    }
                    Err(e) => warn!("assured conntrack collector: {e}"),
                }
                passes = passes.wrapping_add(1);
            }
        })
}

#[cfg(test)]
mod tests {
    use lb_common::IPPROTO_TCP;

    use super::*;

    fn flow(now: u64, idle_s: u64, fwd_flags: u16, reply_flags: u16) -> [(CtKey, CtValue); 2] {
        let k = CtKey {
            saddr_be: 1,
            daddr_be: 2,
            sport_be: 3,
            dport_be: 4,
            proto: IPPROTO_TCP,
            dir: CT_DIR_FORWARD,
            _pad: 0,
        };
        let last = now - idle_s * SECOND;
        let fwd = CtValue {
            saddr_be: 1,
            daddr_be: 9,
            sport_be: 3,
            dport_be: 8,
            flags: fwd_flags,
            last_seen_ns: last,
            ..Default::default()
        };
        let rk = reply_key(&k, &fwd);
        let reply = CtValue {
            saddr_be: 2,
            daddr_be: 1,
            sport_be: 4,
            dport_be: 3,
            flags: reply_flags,
            last_seen_ns: last,
            ..Default::default()
        };
        [(k, fwd), (rk, reply)]
    }

    const NOW: u64 = 100_000 * SECOND;

    #[test]
    fn an_open_tcp_flow_stays_a_day_and_a_closed_one_ten_seconds() {
        let table = |f: [(CtKey, CtValue); 2]| f.into_iter().collect();
        assert!(expired(&table(flow(NOW, 3600, 0, 0)), &Timeouts::default(), NOW).is_empty());
        assert_eq!(
            expired(
                &table(flow(NOW, 24 * 3600, 0, 0)),
                &Timeouts::default(),
                NOW
            )
            .len(),
            2
        );
        assert!(
            expired(
                &table(flow(NOW, 5, CT_F_CLOSING, CT_F_CLOSING)),
                &Timeouts::default(),
                NOW
            )
            .is_empty()
        );
        assert_eq!(
            expired(
                &table(flow(NOW, 11, CT_F_CLOSING, CT_F_CLOSING)),
                &Timeouts::default(),
                NOW
            )
            .len(),
            2
        );
        assert_eq!(
            expired(
                &table(flow(NOW, 11, 0, CT_F_RESET)),
                &Timeouts::default(),
                NOW
            )
            .len(),
            2
        );
        // Half closed: the other side may still stream.
        assert!(
            expired(
                &table(flow(NOW, 600, CT_F_CLOSING, 0)),
                &Timeouts::default(),
                NOW
            )
            .is_empty()
        );
    }

    #[test]
    fn the_configured_timeouts_decide() {
        let table = |f: [(CtKey, CtValue); 2]| f.into_iter().collect();
        let t = Timeouts {
            tcp_established_s: 7_200,
            tcp_close_wait_s: 300,
            udp_stream_s: 30,
        };
        assert!(expired(&table(flow(NOW, 7_199, 0, 0)), &t, NOW).is_empty());
        assert_eq!(expired(&table(flow(NOW, 7_200, 0, 0)), &t, NOW).len(), 2);
        assert!(expired(&table(flow(NOW, 299, CT_F_CLOSING, 0)), &t, NOW).is_empty());
        assert_eq!(
            expired(&table(flow(NOW, 300, CT_F_CLOSING, 0)), &t, NOW).len(),
            2
        );
        let mut udp = flow(NOW, 30, 0, 0);
        udp.iter_mut().for_each(|(k, _)| k.proto = IPPROTO_UDP);
        assert_eq!(expired(&table(udp), &t, NOW).len(), 2);
    }

    #[test]
    fn a_udp_flow_goes_after_two_minutes_idle() {
        let mut f = flow(NOW, 119, 0, 0);
        for (k, _) in &mut f {
            k.proto = IPPROTO_UDP;
        }
        let t: std::collections::HashMap<_, _> = f.into_iter().collect();
        assert!(expired(&t, &Timeouts::default(), NOW).is_empty());
        assert_eq!(expired(&t, &Timeouts::default(), NOW + SECOND).len(), 2);
    }

    #[test]
    fn a_snated_flows_egress_entries_live_and_go_with_it() {
        let [(k, mut fwd), (_, reply)] = flow(NOW, 3600, CT_F_SNAT, CT_F_SNAT);
        // SNATed to 7:70: its reply entry is keyed by that tuple.
        fwd.saddr_be = 7;
        fwd.sport_be = 70;
        let rk = reply_key(&k, &fwd);
        let [ok, bk] = k.egress_of(&fwd);
        assert_eq!((ok.saddr_be, ok.daddr_be, ok.dir), (1, 9, CT_DIR_SNAT_OUT));
        assert_eq!((bk.saddr_be, bk.daddr_be, bk.dir), (9, 1, CT_DIR_REPLY));
        let t: std::collections::HashMap<_, _> =
            [(k, fwd), (rk, reply), (ok, fwd), (bk, reply)].into();
        // Idle an hour: an open TCP flow, its egress entries stay with it.
        assert!(expired(&t, &Timeouts::default(), NOW).is_empty());
        // Over: all four go.
        let mut gone = expired(&t, &Timeouts::default(), NOW + 24 * 3600 * SECOND);
        gone.sort_by_key(|k| (k.dir, k.saddr_be, k.daddr_be));
        let mut want = vec![k, rk, ok, bk];
        want.sort_by_key(|k| (k.dir, k.saddr_be, k.daddr_be));
        assert_eq!(gone, want);
        // Left without their flow: they go once idle, as an orphaned reply entry.
        let orphans: std::collections::HashMap<_, _> = [(ok, fwd), (bk, reply)].into();
        assert_eq!(expired(&orphans, &Timeouts::default(), NOW).len(), 2);
    }

    #[test]
    fn a_reply_entry_without_its_forward_entry_goes_once_idle() {
        let [_, (rk, reply)] = flow(NOW, 11, 0, 0);
        let t: std::collections::HashMap<_, _> = [(rk, reply)].into_iter().collect();
        assert_eq!(expired(&t, &Timeouts::default(), NOW), vec![rk]);
        let [_, (rk, reply)] = flow(NOW, 2, 0, 0);
        let t: std::collections::HashMap<_, _> = [(rk, reply)].into_iter().collect();
        assert!(
            expired(&t, &Timeouts::default(), NOW).is_empty(),
            "it may be a flow being moved"
        );
    }

    #[test]
    fn ipv6_flows_are_collected_as_ipv4_ones() {
        let addr = |w: u32| [0xfd00_0000u32.to_be(), 0, 0, w.to_be()];
        let k = CtKey6 {
            saddr_be: addr(1),
            daddr_be: addr(2),
            sport_be: 3,
            dport_be: 4,
            proto: IPPROTO_UDP,
            dir: CT_DIR_FORWARD,
            _pad: 0,
        };
        let fwd = CtValue6 {
            saddr_be: addr(1),
            daddr_be: addr(9),
            sport_be: 3,
            dport_be: 8,
            last_seen_ns: NOW - 119 * SECOND,
            ..Default::default()
        };
        let rk = reply_key(&k, &fwd);
        assert_eq!(
            (rk.saddr_be, rk.daddr_be, rk.dir),
            (addr(9), addr(1), CT_DIR_REPLY)
        );
        let reply = CtValue6 {
            saddr_be: addr(2),
            daddr_be: addr(1),
            sport_be: 4,
            dport_be: 3,
            last_seen_ns: NOW - 119 * SECOND,
            ..Default::default()
        };
        assert_eq!(forward_key(&rk, &reply), k);
        let t: std::collections::HashMap<_, _> = [(k, fwd), (rk, reply)].into_iter().collect();
        assert!(expired(&t, &Timeouts::default(), NOW).is_empty());
        let mut gone = expired(&t, &Timeouts::default(), NOW + SECOND);
        gone.sort_by_key(|k| k.dir);
        assert_eq!(gone, vec![k, rk]);
    }
}
