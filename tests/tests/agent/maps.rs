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

/// A cold sync writes its backends, names, slots and entries in batches
/// (`BPF_MAP_UPDATE_BATCH`, `datapath::batch`), more than one chunk of each: the kernel maps
/// then hold exactly the desired state, every counter starts from zero, and a resync that
/// moves every backend lands on top (make-before-break, batched again).
#[test]
fn a_batched_cold_sync_reads_back_exactly() {
    if !require_root() {
        return;
    }
    let yaml = |n: usize, first: u8| -> String {
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
    };
    let mut dp = LoadedDatapath::load(&unique_tag("xmb")).expect("load");
    let model = lb_userspace::source::file::parse("t.yaml", &yaml(5000, 1))
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
    let changed = lb_userspace::source::file::parse("t.yaml", &yaml(5000, 100))
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
