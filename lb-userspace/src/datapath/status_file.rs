//! The failing frontends, kept beside the pins for `xlb list services`: bpffs holds only
//! pins, so the agent writes them to a file of its pin directory's under [`DIR`] — at
//! start (none failing yet) and when a frontend starts failing or recovers, never per sync
//! of healthy services. Written whole to a temporary file and renamed: a reader sees the
//! old list or the new one. The agent removes it when it stops, `xlb cleanup` with the
//! pins.

use std::{
    io,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

/// Where the files are (a tmpfs: gone at reboot, as the pins are).
pub const DIR: &str = "/run/xlb/status";

/// A failing frontend.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failing {
    /// `namespace/name`.
    pub service: String,
    /// Its object name (`namespace/name:port`, with ` (nodePort a.b.c.d)` and the like).
    pub frontend: String,
    /// Why (`MapFull`, `FrontendConflict`, `WriteFailed`, ...).
    pub reason: String,
    /// What the log says.
    pub message: String,
    /// Since when (Unix seconds).
    pub since: u64,
}

/// The file of pin directory `pins`: its path with `/` as `_`
/// (`/sys/fs/bpf/xlb` → `/run/xlb/status/_sys_fs_bpf_xlb.json`).
pub fn path(pins: &Path) -> PathBuf {
    beside(DIR, pins, "json")
}

/// The file of pin directory `pins` under `dir` (a tmpfs beside bpffs), with extension
/// `ext`: the pin directory's path with `/` as `_`, so each pin directory (each parallel
/// test's) has its own.
pub fn beside(dir: &str, pins: &Path, ext: &str) -> PathBuf {
    let name = pins.to_string_lossy().replace('/', "_");
    Path::new(dir).join(format!("{name}.{ext}"))
}

/// Replaces the list of `pins`' agent.
pub fn write(pins: &Path, failing: &[Failing]) -> io::Result<()> {
    let path = path(pins);
    std::fs::create_dir_all(DIR)?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(failing)?)?;
    std::fs::rename(&tmp, &path)
}

/// The list of `pins`' agent; none when it never wrote one.
pub fn read(pins: &Path) -> io::Result<Vec<Failing>> {
    match std::fs::read(path(pins)) {
        Ok(bytes) => Ok(serde_json::from_slice(&bytes)?),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Removes it (with the pins).
pub fn remove(pins: &Path) -> io::Result<()> {
    match std::fs::remove_file(path(pins)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pin_directory_has_a_file_of_its_own() {
        assert_eq!(
            path(Path::new("/sys/fs/bpf/xlb")),
            Path::new("/run/xlb/status/_sys_fs_bpf_xlb.json")
        );
        assert_ne!(
            path(Path::new("/sys/fs/bpf/a")),
            path(Path::new("/sys/fs/bpf/b"))
        );
    }
}
