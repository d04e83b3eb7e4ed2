//! Loads the embedded object with every map pinned under one directory, reusing pins that
//! exist (a restarted agent adopts the maps the datapath is using).

use std::path::{Path, PathBuf};

use aya::{
    Ebpf, EbpfLoader,
    programs::{SchedClassifier, Xdp},
};
use lb_common::{ALL_MAPS, RETIRED_PINS};

use super::{DatapathError, rows, sizes::MapSizes};

/// The tc ingress program's name in the object.
pub const TC_INGRESS: &str = "xlb_tc_ingress";
/// The tc egress program's name in the object.
pub const TC_EGRESS: &str = "xlb_tc_egress";
/// The XDP program's name in the object.
pub const XDP: &str = "xlb_xdp";

/// True when `path` (or its closest existing ancestor) is on a bpf filesystem.
pub fn on_bpffs(path: &Path) -> bool {
    let mut p = path.to_path_buf();
    while !p.exists() {
        if !p.pop() {
            return false;
        }
    }
    use nix::sys::statfs::{BPF_FS_MAGIC, statfs};
    statfs(&p).is_ok_and(|s| s.filesystem_type() == BPF_FS_MAGIC)
}

/// Where bpffs lives by convention; mounted by the agent when it is not (as Cilium does):
/// `ip netns exec` and some container runtimes hide the host's.
pub const BPFFS_ROOT: &str = "/sys/fs/bpf";

/// Mounts a bpf filesystem on [`BPFFS_ROOT`] when `dir` is below it and it is not one.
fn mount_bpffs(dir: &Path) -> Result<(), DatapathError> {
    let root = Path::new(BPFFS_ROOT);
    if !dir.starts_with(root) || on_bpffs(root) {
        return Ok(());
    }
    let fail = |reason: String| DatapathError::PinDir {
        path: root.to_path_buf(),
        source: std::io::Error::other(reason),
    };
    std::fs::create_dir_all(root).map_err(|e| fail(format!("mkdir: {e}")))?;
    let mounted = nix::mount::mount(
        Some("bpf"),
        BPFFS_ROOT,
        Some("bpf"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    );
    if mounted.is_err() {
        return Err(DatapathError::BpffsNotMounted {
            path: dir.to_path_buf(),
        });
    }
    tracing::warn!(
        "{BPFFS_ROOT} was not a bpf filesystem (ip netns exec remounts /sys): mounted one; its pins are this mount namespace's own"
    );
    Ok(())
}

/// Creates the pin directory (and `links/` in it) on bpffs, mounting bpffs on
/// `/sys/fs/bpf` first when the directory is below it and it is missing.
pub fn ensure_pin_dir(dir: &Path) -> Result<(), DatapathError> {
    mount_bpffs(dir)?;
    if !on_bpffs(dir) {
        return Err(DatapathError::BpffsNotMounted {
            path: dir.to_path_buf(),
        });
    }
    let links = dir.join("links");
    std::fs::create_dir_all(&links).map_err(|source| DatapathError::PinDir {
        path: links,
        source,
    })
}

/// Holds the pin directory for one agent: a second agent on the same directory refuses to
/// start instead of writing the same maps. Released when dropped (or the process dies).
#[derive(Debug)]
pub struct PinLock {
    _dir: std::fs::File,
}

/// Takes the pin directory's lock (`File::try_lock`: `flock` on the directory, which bpffs allows).
pub fn lock(dir: &Path) -> Result<PinLock, DatapathError> {
    ensure_pin_dir(dir)?;
    let file = std::fs::File::open(dir).map_err(|source| DatapathError::PinDir {
        path: dir.to_path_buf(),
        source,
    })?;
    match file.try_lock() {
        Ok(()) => Ok(PinLock { _dir: file }),
        Err(std::fs::TryLockError::WouldBlock) => Err(DatapathError::Locked {
            path: dir.to_path_buf(),
        }),
        Err(std::fs::TryLockError::Error(source)) => Err(DatapathError::PinDir {
            path: dir.to_path_buf(),
            source,
        }),
    }
}

/// Whether `dir` holds a pin of either counter array: else the load creates them, all zero
/// (see [`super::kernel::KernelMaps::counters_created`]).
pub fn counters_pinned(dir: &Path) -> bool {
    [lb_common::MAP_SVC_STATS, lb_common::MAP_BACKEND_STATS]
        .iter()
        .any(|name| dir.join(name).exists())
}

/// Loads the object from `object`, pinning (or reusing) every map in `dir`, and loads the
/// tc program into the kernel.
pub fn load(object: &[u8], dir: &Path, sizes: &MapSizes) -> Result<Ebpf, DatapathError> {
    if object.is_empty() {
        return Err(DatapathError::ObjectMissing);
    }
    ensure_pin_dir(dir)?;
    let cpus = rows::cpus()?;
    let sizes = &sizes.keeping_pinned(dir, cpus)?;
    sizes.check_pinned(dir, cpus)?;
    let paths: Vec<(&str, PathBuf)> = ALL_MAPS.iter().map(|m| (*m, dir.join(m))).collect();
    let strides = sizes.strides();
    let mut loader = EbpfLoader::new();
    for (name, path) in &paths {
        loader.map_pin_path(name, path.as_path());
    }
    for (name, size) in sizes.by_map(cpus) {
        loader.map_max_entries(name, size);
    }
    strides.set(&mut loader);
    let mut ebpf = loader.load(object)?;
    remove_retired(dir);
    for name in [TC_INGRESS, TC_EGRESS] {
        classifier(&mut ebpf, name)?
            .load()
            .map_err(|source| DatapathError::Program { name, source })?;
    }
    xdp_program(&mut ebpf)?
        .load()
        .map_err(|source| DatapathError::Program { name: XDP, source })?;
    Ok(ebpf)
}

/// Removes the pins of earlier layouts that hold only counters or configuration
/// ([`RETIRED_PINS`]): programs
/// still using one keep it (the kernel frees it with them), nothing reads it any more.
fn remove_retired(dir: &Path) {
    for name in RETIRED_PINS {
        match std::fs::remove_file(dir.join(name)) {
            Ok(()) => tracing::info!(map = name, "removed a retired pin"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(map = name, "cannot remove a retired pin: {e}"),
        }
    }
}

/// The loaded object's XDP program.
pub fn xdp_program(ebpf: &mut Ebpf) -> Result<&mut Xdp, DatapathError> {
    let prog = ebpf.program_mut(XDP).ok_or(DatapathError::Program {
        name: XDP,
        source: aya::programs::ProgramError::NotLoaded,
    })?;
    prog.try_into()
        .map_err(|source| DatapathError::Program { name: XDP, source })
}

/// The loaded object's tc ingress program.
pub fn tc_program(ebpf: &mut Ebpf) -> Result<&mut SchedClassifier, DatapathError> {
    classifier(ebpf, TC_INGRESS)
}

/// The loaded object's tc egress program.
pub fn tc_egress_program(ebpf: &mut Ebpf) -> Result<&mut SchedClassifier, DatapathError> {
    classifier(ebpf, TC_EGRESS)
}

/// The loaded object's tc program `name`.
fn classifier<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut SchedClassifier, DatapathError> {
    let prog = ebpf.program_mut(name).ok_or(DatapathError::Program {
        name,
        source: aya::programs::ProgramError::NotLoaded,
    })?;
    prog.try_into()
        .map_err(|source| DatapathError::Program { name, source })
}
