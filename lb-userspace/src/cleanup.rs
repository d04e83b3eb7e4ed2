//! `xlb cleanup`: removes everything xlb pinned (links detach when their pin goes).

use std::path::Path;

use lb_common::ALL_MAPS;

/// What was removed.
#[derive(Debug, Default)]
pub struct Removed {
    pub links: Vec<String>,
    pub maps: Vec<String>,
}

/// The kernel id of the link pinned at `path`.
fn link_id(path: &Path) -> Option<u32> {
    let link = aya::programs::links::PinnedLink::from_pin(path).ok()?;
    let fd: aya::programs::links::FdLink = link.into();
    fd.info().ok().map(|i| i.id())
}

/// Waits (up to 2 s) until the kernel has released the links `ids`: a link whose last
/// reference goes is freed from a workqueue, a moment later. When cleanup returns, nothing
/// of the datapath runs any more.
fn wait_detached(ids: &[u32]) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < deadline {
        let live = aya::programs::loaded_links()
            .flatten()
            .any(|l| ids.contains(&l.id()));
        if !live {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
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
            ids.extend(link_id(&e.path()));
            std::fs::remove_file(e.path())?;
            removed
                .links
                .push(e.file_name().to_string_lossy().into_owned());
        }
    }
    wait_detached(&ids);
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
