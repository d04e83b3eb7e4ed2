//! Loads the embedded object with every map pinned under one directory, reusing pins that
//! exist (a restarted agent adopts the maps the datapath is using).

use std::path::{Path, PathBuf};

use aya::{
    Ebpf, EbpfLoader,
    programs::{SchedClassifier, Xdp},
};
use lb_common::ALL_MAPS;

use super::DatapathError;

/// The tc ingress program's name in the object.
pub const TC_INGRESS: &str = "xlb_tc_ingress";
/// The XDP program's name in the object.
pub const XDP: &str = "xlb_xdp";
const BPF_FS_MAGIC: i64 = 0xcafe4a11;

/// True when `path` (or its closest existing ancestor) is on a bpf filesystem.
pub fn on_bpffs(path: &Path) -> bool {
    let mut p = path.to_path_buf();
    while !p.exists() {
        if !p.pop() {
            return false;
        }
    }
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid C string and st a valid out-pointer.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    rc == 0 && st.f_type as i64 == BPF_FS_MAGIC
}

/// Creates the pin directory (and `links/` in it) on bpffs.
pub fn ensure_pin_dir(dir: &Path) -> Result<(), DatapathError> {
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

/// Loads the object from `object`, pinning (or reusing) every map in `dir`, and loads the
/// tc program into the kernel.
pub fn load(object: &[u8], dir: &Path) -> Result<Ebpf, DatapathError> {
    if object.is_empty() {
        return Err(DatapathError::ObjectMissing);
    }
    ensure_pin_dir(dir)?;
    let paths: Vec<(&str, PathBuf)> = ALL_MAPS.iter().map(|m| (*m, dir.join(m))).collect();
    let mut loader = EbpfLoader::new();
    for (name, path) in &paths {
        loader.map_pin_path(name, path.as_path());
    }
    let mut ebpf = loader.load(object)?;
    tc_program(&mut ebpf)?
        .load()
        .map_err(|source| DatapathError::Program {
            name: TC_INGRESS,
            source,
        })?;
    xdp_program(&mut ebpf)?
        .load()
        .map_err(|source| DatapathError::Program { name: XDP, source })?;
    Ok(ebpf)
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
    let prog = ebpf.program_mut(TC_INGRESS).ok_or(DatapathError::Program {
        name: TC_INGRESS,
        source: aya::programs::ProgramError::NotLoaded,
    })?;
    prog.try_into().map_err(|source| DatapathError::Program {
        name: TC_INGRESS,
        source,
    })
}
