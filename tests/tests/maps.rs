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
