//! The Maglev rows: a new flow through tc to frontends whose backend comes from their
//! Maglev table (`select::xlb_maglev_slot`: one more hash lookup and a table read, in a
//! global BPF function) beside random choice, in the same trial, on the same flows. The
//! bench writes the tables into the pinned maps as the agent does (`XLB_MAGLEV_V2`, keyed
//! by service index; the table before the flag): each of the first 8,192 IPv4 TCP
//! frontends (the map's default size) flagged `SVC_F_MAGLEV` with the table (M = 16381) of
//! two backends, whose entries name slots 1 and 2 (every bench service has at least two);
//! both algorithms run the flows to those frontends. Each flow's backend is checked
//! against the table: the case is what it claims. The frontends are restored afterwards.

use std::net::{Ipv4Addr, SocketAddrV4};

use anyhow::{Context, Result, bail};
use aya::maps::{HashMap, Map, MapData};
use lb_common::{
    IPPROTO_TCP, MAGLEV_MAP_CAPACITY, MAP_MAGLEV, MAP_SVC, MaglevRow, R_NEW_FLOW, SVC_F_MAGLEV,
    SvcKey, SvcValue, flow_hash,
};
use lb_userspace::{desired::maglev, packet::parse};

use super::{Flows, HOOKS, each};
use crate::bench::fixture::{Datapath, PROG_INGRESS, Probe, SVC_PORT, svc_key, vip};

/// The table size: Cilium's default, the largest.
const M: u32 = maglev::DEFAULT_TABLE_SIZE;

/// The Maglev table of two backends, in slot terms (1 and 2).
fn table() -> Vec<u16> {
    let names = ["slot-1".to_string(), "slot-2".to_string()];
    let (sorted, t) = maglev::table(&names, M, b"xlb-bench");
    t.iter()
        .map(|i| {
            names
                .iter()
                .position(|n| *n == sorted[*i as usize])
                .unwrap_or(0) as u16
                + 1
        })
        .collect()
}

fn pinned(dp: &Datapath, name: &str) -> Result<Map> {
    let data = MapData::from_pin(dp.pins.join(name)).with_context(|| format!("open {name}"))?;
    Ok(Map::from_map_data(data)?)
}

/// One trial: ns of a new flow with random choice (before and after), and with Maglev,
/// over the same flows: those to the first `MAGLEV_MAP_CAPACITY` of the `services` IPv4 TCP
/// frontends (the map's default size; all of them up to that scale).
pub(super) fn trial(
    dp: &mut Datapath,
    f: &Flows,
    services: usize,
    ifindex: u32,
) -> Result<(f64, f64)> {
    let tables = (MAGLEV_MAP_CAPACITY as usize).min(services.max(1));
    let flagged: std::collections::BTreeSet<Ipv4Addr> = (0..tables).map(vip).collect();
    let flows: Vec<Vec<u8>> = f
        .to_service
        .iter()
        .filter(|p| parse(p).is_some_and(|p| flagged.contains(p.dst.ip())))
        .cloned()
        .collect();
    let (random, _) = new_flows(dp, &flows, ifindex)?;
    let entries = table();
    let mut row: Box<MaglevRow> = Box::new(bytemuck::Zeroable::zeroed());
    row.size = M;
    row.slots[..entries.len()].copy_from_slice(&entries);
    let mut table_map: HashMap<MapData, u32, MaglevRow> =
        HashMap::try_from(pinned(dp, MAP_MAGLEV)?)?;
    let mut svc: HashMap<MapData, SvcKey, SvcValue> = HashMap::try_from(pinned(dp, MAP_SVC)?)?;
    let mut saved = Vec::with_capacity(tables);
    for i in 0..tables {
        let key = svc_key(vip(i), SVC_PORT);
        let v = svc.get(&key, 0)?;
        // As the agent: the table first (keyed by the frontend's service index), then the flag.
        table_map.insert(v.svc_id, *row, 0)?;
        saved.push((key, v));
        let mut m = v;
        m.flags |= SVC_F_MAGLEV;
        svc.insert(key, m, 0)?;
    }
    let measured = new_flows(dp, &flows, ifindex);
    for (key, v) in &saved {
        svc.insert(*key, *v, 0)?;
        table_map.remove(&v.svc_id)?;
    }
    let (maglev_ns, outs) = measured?;
    check(dp, &flows, &entries, &outs)?;
    // Random again after: the mean of the runs before and after, so neither algorithm
    // gains from running first or second (caches, the LRU map's state after clearing).
    let (again, _) = new_flows(dp, &flows, ifindex)?;
    Ok(((random + again) / 2.0, maglev_ns))
}

/// Each flow's first packet through tc, conntrack emptied first: the median ns and the
/// packets as tc left them.
fn new_flows(dp: &mut Datapath, flows: &[Vec<u8>], ifindex: u32) -> Result<(f64, Vec<Vec<u8>>)> {
    dp.clear_ct()?;
    let tc = HOOKS[0];
    each(dp, tc, PROG_INGRESS, flows, Some(R_NEW_FLOW), ifindex)
}

/// Every flow reached the backend in the slot its table entry names.
fn check(dp: &Datapath, flows: &[Vec<u8>], entries: &[u16], outs: &[Vec<u8>]) -> Result<()> {
    let probe = Probe::open(&dp.pins)?;
    for (sent, out) in flows.iter().zip(outs) {
        let (Some(s), Some(o)) = (parse(sent), parse(out)) else {
            bail!("a bench packet does not parse");
        };
        let h = flow_hash(
            &[word(*s.src.ip()), 0, 0, 0],
            &[word(*s.dst.ip()), 0, 0, 0],
            s.src.port().to_be(),
            s.dst.port().to_be(),
            IPPROTO_TCP,
        );
        let slot = entries[(h % M) as usize] as usize;
        let backends = probe.backends(*s.dst.ip(), s.dst.port())?;
        let want: SocketAddrV4 = backends[slot - 1];
        if *o.dst.ip() != *want.ip() {
            bail!(
                "{} → {}: reached {}, its Maglev entry names slot {slot} ({want})",
                s.src,
                s.dst,
                o.dst
            );
        }
    }
    Ok(())
}

fn word(a: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(a.octets())
}
