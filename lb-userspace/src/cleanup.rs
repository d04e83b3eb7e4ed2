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
        remove_files_beside(dir)?;
        return Ok(removed);
    }
    // Ingress (tc, XDP) and socket hooks first, egress last: a packet that met xlb's
    // ingress meets its egress too, never a half-detached datapath (a NATed flow's
    // kernel conntrack entry, as a hand-back writes it, then carries the packets that
    // no longer meet xlb at all).
    let links: Vec<_> = std::fs::read_dir(dir.join("links"))
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    let egress = |p: &std::path::PathBuf| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("tc_out_"))
    };
    let (first, last): (Vec<_>, Vec<_>) = links.into_iter().partition(|p| !egress(p));
    for path in first.into_iter().chain(last) {
        crate::datapath::links::detach_pinned(&path)?;
        removed.links.push(
            path.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
    }
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
    remove_files_beside(dir)?;
    Ok(removed)
}

/// The agent's list of failing frontends and its names file, kept beside the pins.
fn remove_files_beside(dir: &Path) -> std::io::Result<()> {
    crate::datapath::status_file::remove(dir)?;
    crate::datapath::names_file::remove(dir)
}
