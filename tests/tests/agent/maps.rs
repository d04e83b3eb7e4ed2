//! One definition of each map: the object's maps (as the kernel created them) match
//! lb-common's `MAP_DEFS` in name, kind, key and value size, and nothing else is pinned.

use lb_common::{ALL_MAPS, MAP_DEFS};
use xlb_tests::{datapath::LoadedDatapath, require_root, unique_tag};

#[test]
fn every_map_of_the_object_matches_lb_common() {
    assert_eq!(
        MAP_DEFS.map(|d| d.name),
        ALL_MAPS,
        "MAP_DEFS and ALL_MAPS list the same maps in the same order"
    );
    if !require_root() {
        return;
    }
    let dp = LoadedDatapath::load(&unique_tag("xmd")).expect("load");
    for d in MAP_DEFS {
        let info = aya::maps::MapInfo::from_pin(dp.pins.join(d.name))
            .unwrap_or_else(|e| panic!("{}: not pinned: {e}", d.name));
        let kind = info.map_type().map(|t| t as u32).unwrap_or(u32::MAX);
        assert_eq!(
            (kind, info.key_size() as usize, info.value_size() as usize),
            (d.kind, d.key_size, d.value_size),
            "{}: (kind, key size, value size) in the object differ from lb-common",
            d.name
        );
    }
    let pinned: Vec<String> = std::fs::read_dir(&dp.pins)
        .expect("pins")
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    for name in &pinned {
        assert!(
            ALL_MAPS.contains(&name.as_str()),
            "{name} is pinned but not defined in lb-common"
        );
    }
}

/// `n` Services `s0…` at 10.96.0.0 up, 3 endpoints each from 10.244.x.`first`.
fn services_yaml(n: usize, first: u8) -> String {
    (0..n)
        .map(|i| {
            let vip = std::net::Ipv4Addr::from(
                u32::from(std::net::Ipv4Addr::new(10, 96, 0, 0)) + i as u32,
            );
            let eps: Vec<std::net::Ipv4Addr> = (0..3)
                .map(|k| {
                    std::net::Ipv4Addr::new(
                        10,
                        244,
                        (i / 200) as u8,
                        first + (i % 200) as u8 / 4 + k,
                    )
                })
                .collect();
            xlb_tests::services::service_yaml(&format!("s{i}"), vip, 80, "TCP", 8080, &eps)
        })
        .collect()
}

/// A cold sync writes its backends, names, slots and entries in batches
/// (`BPF_MAP_UPDATE_BATCH`, `datapath::batch`), more than one chunk of each: the kernel maps
/// then hold exactly the desired state, every counter starts from zero, and a resync that
/// moves every backend lands on top (make-before-break, batched again).
#[test]
fn a_batched_cold_sync_reads_back_exactly() {
    if !require_root() {
        return;
    }
    let mut dp = LoadedDatapath::load(&unique_tag("xmb")).expect("load");
    let model = lb_userspace::source::file::parse("t.yaml", &services_yaml(5000, 1))
        .expect("yaml")
        .model;
    dp.program(&model).expect("cold sync");
    let programmed = dp.state();
    let (want, _) = lb_userspace::desired::compute(
        &model,
        &mut lb_userspace::reconcile::Ids::default(),
        dp.maps.limits(),
    );
    assert_eq!(
        programmed.services.len(),
        want.services.len(),
        "service map entries"
    );
    // More than one batch of entries, and more than two of slots.
    let chunk = lb_userspace::datapath::batch::CHUNK;
    let slots: usize = programmed.services.values().map(|v| v.slots.len()).sum();
    assert!(programmed.services.len() > chunk && slots > 2 * chunk);
    assert!(
        programmed
            .services
            .iter()
            .all(|(k, v)| want.services.get(k).is_some_and(|w| w.count == v.count)),
        "every frontend with its slots"
    );
    assert_eq!(programmed.backends.len(), want.backends.len(), "backends");
    assert_eq!(programmed.names.len(), 5000, "names");
    let rows = lb_userspace::list::services_of(&programmed);
    assert!(
        rows.iter()
            .all(|r| r.backends.len() == 3 && !r.backends.iter().any(|b| b == "MISSING"))
    );
    for id in [1, 2500, 5000] {
        let c = dp.maps.service_counter(id);
        assert_eq!(
            (c.packets, c.bytes),
            (0, 0),
            "service {id}'s counters start from zero"
        );
    }
    // Every service's backends move.
    let changed = lb_userspace::source::file::parse("t.yaml", &services_yaml(5000, 100))
        .expect("yaml")
        .model;
    dp.program(&changed).expect("resync");
    let again = dp.state();
    assert_eq!(again.services.len(), programmed.services.len());
    let rows = lb_userspace::list::services_of(&again);
    assert!(rows.iter().all(|r| {
        r.backends
            .iter()
            .all(|b| b.starts_with("10.244.") && b != "MISSING")
    }));
}

/// The metrics' batched reads (`BPF_MAP_LOOKUP_BATCH`) against the kernel's maps: entries
/// counted, per-CPU counters summed slot by slot, and the conntrack collector's pass, each
/// compared with what was written one entry at a time.
#[test]
fn batched_reads_count_and_sum_what_was_written() {
    use aya::maps::{HashMap, MapData, PerCpuArray, PerCpuValues};
    use lb_common::{
        CT_DIR_FORWARD, Counter, CtKey, CtValue, IPPROTO_UDP, MAP_CT, MAP_CT_ASSURED, MAP_STATS,
    };
    use lb_userspace::datapath::{counts, ct_gc};

    if !require_root() {
        return;
    }
    let dp = LoadedDatapath::load(&unique_tag("xbr")).expect("load");
    let pins = xlb_tests::pins(&dp.pins);
    let key = |i: u32| CtKey {
        saddr_be: i,
        daddr_be: 7,
        sport_be: 1,
        dport_be: 2,
        proto: IPPROTO_UDP,
        dir: CT_DIR_FORWARD,
        _pad: 0,
    };
    // More than one batch of a MiB (16-byte keys, 48-byte values: 16,384 a batch).
    const LRU: u32 = 20_000;
    let mut lru: HashMap<MapData, CtKey, CtValue> =
        HashMap::try_from(pins.map(MAP_CT).expect("ct")).expect("ct map");
    for i in 0..LRU {
        lru.insert(key(i), CtValue::default(), 0).expect("insert");
    }
    let fill = counts::count::<CtKey, CtValue>(&pins, MAP_CT).expect("count");
    assert_eq!(fill.entries, u64::from(LRU));
    assert!(fill.capacity >= LRU, "{fill:?}");

    // The assured table: 10 flows idle for 3 minutes (UDP: over after 2), 5 just seen.
    let now = lb_userspace::datapath::clock::monotonic_coarse_ns();
    let mut assured: HashMap<MapData, CtKey, CtValue> =
        HashMap::try_from(pins.map(MAP_CT_ASSURED).expect("cta")).expect("cta map");
    for i in 0..15u32 {
        let idle = if i < 10 { 180_000_000_000 } else { 0 };
        let v = CtValue {
            last_seen_ns: now.saturating_sub(idle),
            ..CtValue::default()
        };
        assured.insert(key(i), v, 0).expect("insert");
    }
    let pass = ct_gc::pass(&pins, &ct_gc::Timeouts::default(), true).expect("pass");
    assert_eq!(pass.v4.deleted, 10, "{pass:?}");
    assert_eq!(pass.v4.assured.entries, 5, "{pass:?}");
    assert_eq!(pass.v4.lru.map(|f| f.entries), Some(u64::from(LRU)));
    assert_eq!(assured.keys().count(), 5, "the expired flows deleted");

    // Per-CPU counters: slot 3 holds packets 1, 2, … on each CPU.
    let cpus = aya::util::nr_cpus().expect("cpus");
    let mut stats_map = pins.map(MAP_STATS).expect("stats");
    {
        let mut stats: PerCpuArray<&mut MapData, Counter> =
            PerCpuArray::try_from(&mut stats_map).expect("per-CPU array");
        let values: Vec<Counter> = (1..=cpus as u64)
            .map(|c| Counter {
                packets: c,
                bytes: 100 * c,
            })
            .collect();
        stats
            .set(3, PerCpuValues::try_from(values).expect("values"), 0)
            .expect("set");
    }
    let mut sums = Vec::new();
    counts::counter_sums(&stats_map, MAP_STATS, |i, c| sums.push((i, c))).expect("sums");
    let n = cpus as u64;
    assert_eq!(sums.len(), lb_common::R_COUNT as usize);
    assert_eq!(
        sums[3],
        (
            3,
            Counter {
                packets: n * (n + 1) / 2,
                bytes: 100 * n * (n + 1) / 2,
            }
        )
    );
    assert!(
        sums.iter()
            .filter(|(i, _)| *i != 3)
            .all(|(_, c)| *c == Counter::default())
    );
}

/// A batch of service entries that a full map refuses part-way: the entries before the
/// refusal are written, and every frontend left out is named with its service (the
/// reconciler retries that service alone), the map and its limit; nothing else fails.
#[test]
fn a_batch_a_full_map_refuses_names_each_service_left_out() {
    use aya::maps::{HashMap, Map, MapData};
    use lb_common::{MAP_SVC, SvcKey, SvcValue};
    if !require_root() {
        return;
    }
    const MAP: u32 = 64;
    const FOREIGN: u16 = 24;
    let sizes = lb_userspace::datapath::sizes::MapSizes {
        services: MAP,
        ..Default::default()
    };
    let mut dp = LoadedDatapath::load_sized(&unique_tag("xmf"), &sizes).expect("load");
    // Entries another writer left: 40 of the 64 places free.
    let data = MapData::from_pin(dp.pins.join(MAP_SVC)).expect("the pinned service map");
    let mut svc: HashMap<MapData, SvcKey, SvcValue> =
        HashMap::try_from(Map::HashMap(data)).expect("a hash map");
    for port in 1..=FOREIGN {
        let key = xlb_tests::datapath::foreign_frontend(port);
        svc.insert(key, SvcValue::default(), 0)
            .expect("a foreign entry");
    }
    // 50 frontends, one batch (more than `BATCH_MIN`): 40 fit.
    let model = lb_userspace::source::file::parse("t.yaml", &services_yaml(50, 1))
        .expect("yaml")
        .model;
    let (want, _) = lb_userspace::reconcile::recompute(
        &model,
        &Default::default(),
        &mut lb_userspace::reconcile::Ids::default(),
        dp.maps.limits(),
    );
    assert_eq!(
        want.services.len(),
        50,
        "the desired state counts on the room"
    );
    let (now, report) =
        lb_userspace::datapath::sync::apply(&mut dp.maps, &Default::default(), &want);
    let programmed: Vec<&SvcKey> = want
        .services
        .keys()
        .filter(|k| svc.get(k, 0).is_ok())
        .collect();
    assert_eq!(
        programmed.len(),
        40,
        "the batch's entries up to the full map"
    );
    let left_out: Vec<(&SvcKey, u32)> = want
        .services
        .iter()
        .filter(|(k, _)| svc.get(k, 0).is_err())
        .map(|(k, e)| (k, e.svc_id))
        .collect();
    assert_eq!(report.errors.len(), 10, "{:?}", report.errors);
    assert_eq!(report.by_service.len(), 10, "{:?}", report.by_service);
    for (key, svc_id) in left_out {
        let e = report
            .by_service
            .get(&svc_id)
            .unwrap_or_else(|| panic!("service {svc_id} left out without its error"));
        assert_eq!((e.map, e.op), (MAP_SVC, "insert"));
        assert_eq!(e.entry, lb_common::user::show_frontend(key));
        assert_eq!(e.cause, format!("map is full (capacity {MAP})"));
        assert!(
            !now.services.contains_key(key),
            "recorded as not programmed"
        );
    }
}

/// Counter arrays this load created hold zero, so a cold sync does not zero them; an index
/// used again (a backend written anew there) has its counters zeroed, one by one or batched.
#[test]
fn an_index_used_again_has_its_counters_zeroed_in_maps_the_load_created() {
    use aya::maps::{Array, MapData};
    use lb_common::{Backend, Counter, MAP_BACKEND_STATS};
    use lb_userspace::datapath::writer::MapWriter;
    if !require_root() {
        return;
    }
    let mut dp = LoadedDatapath::load(&unique_tag("xmz")).expect("load");
    dp.maps.counters_created();
    let be = |id: u32| Backend {
        addr_be: [u32::from_ne_bytes([10, 244, 0, id as u8]), 0, 0, 0],
        port_be: 8080u16.to_be(),
        proto: libc::IPPROTO_TCP as u8,
        family: lb_common::FAMILY_V4,
        generation: id + 1,
        ..Default::default()
    };
    let first: Vec<(u32, Backend)> = (0..64).map(|id| (id, be(id))).collect();
    assert!(dp.maps.put_backends(&first).is_empty(), "written");
    // Traffic counted on backends 5, 6 and 7 (cell `id` is CPU 0's).
    let data = MapData::from_pin(dp.pins.join(MAP_BACKEND_STATS)).expect("counters");
    let mut rows: Array<MapData, Counter> =
        Array::try_from(aya::maps::Map::Array(data)).expect("an array");
    let counted = Counter {
        packets: 3,
        bytes: 300,
    };
    for id in [5, 6, 7] {
        rows.set(id, counted, 0).expect("a counter");
        assert_eq!(dp.maps.backend_counter(id).packets, 3);
    }
    dp.maps.put_backend(5, &be(5)).expect("written anew");
    assert_eq!(dp.maps.backend_counter(5).packets, 0, "zeroed one by one");
    let again: Vec<(u32, Backend)> = [6, 7]
        .into_iter()
        .chain(64..100)
        .map(|id| (id, be(id)))
        .collect();
    assert!(dp.maps.put_backends(&again).is_empty(), "written");
    for id in [6, 7] {
        let c = dp.maps.backend_counter(id);
        assert_eq!(
            (c.packets, c.bytes),
            (0, 0),
            "backend {id} zeroed in the batch"
        );
    }
}
