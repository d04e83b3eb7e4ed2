//! `xlb cleanup`: removes everything xlb pinned (links detach when their pin goes).

use std::path::Path;

use lb_common::ALL_MAPS;

/// What was removed.
#[derive(Debug, Default)]
pub struct Removed {
    pub links: Vec<String>,
    pub maps: Vec<String>,
}

/// Unpins every link and map under `dir` and removes the directory.
pub fn cleanup(dir: &Path) -> std::io::Result<Removed> {
    let mut removed = Removed::default();
    if !dir.exists() {
        return Ok(removed);
    }
    let mut ids = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir.join("links")) {
        for e in entries.flatten() {
            ids.extend(crate::datapath::links::pinned_link_id(&e.path()));
            std::fs::remove_file(e.path())?;
            removed
                .links
                .push(e.file_name().to_string_lossy().into_owned());
        }
    }
    crate::datapath::links::wait_released(&ids);
    let _ = std::fs::remove_dir(dir.join("links"));
    for m in ALL_MAPS {
        let p = dir.join(m);
        if p.exists() {
            std::fs::remove_file(&p)?;
            removed.maps.push(m.to_string());
        }
    }
    // Maps of earlier layouts (an older `_V<n>`) that an upgraded agent left behind.
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("XLB_") {
                std::fs::remove_file(e.path())?;
                removed.maps.push(name);
            }
        }
    }
    std::fs::remove_dir(dir)?;
    Ok(removed)
}
