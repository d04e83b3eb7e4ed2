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
    if !require_root("every_map_of_the_object_matches_lb_common") {
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
    if !require_root("a_batched_cold_sync_reads_back_exactly") {
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
        &mut lb_userspace::desired::Ids::default(),
        dp.maps.limits(),
    );
    assert_eq!(
        programmed.services.len(),
        want.services.len(),
        "service map entries"
    );
    assert!(programmed.services.len() > 2 * lb_userspace::datapath::batch::CHUNK);
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
