//! Everything that touches the kernel: loading the object, pinning, attaching, map writes.

pub mod attach;
pub mod batch;
pub mod bpflog;
pub mod clock;
pub mod counts;
pub mod ct_egress;
pub mod ct_gc;
pub mod diverged;
pub mod kernel;
pub mod kernel_ct;
pub mod links;
pub mod loader;
pub mod names_file;
pub mod netfilter;
pub mod netif;
pub mod netlink;
pub mod pending;
pub mod pins;
pub mod routing;
pub mod rows;
pub mod scratch;
pub mod sizes;
pub mod socket;
pub mod stale;
pub mod status_file;
pub mod sync;
pub mod sys_bpf;
pub mod sysctl;
pub mod upgrade;
pub mod writer;

/// An error and every error under it (`source()`) on one line, each said once: a load's
/// errno (a map's creation or pin, `BPF_PROG_LOAD`) is a source, which `to_string` alone
/// drops; a source whose text the line already holds is not repeated.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = c.source();
    }
    s
}

use std::path::PathBuf;

use thiserror::Error;

/// Errors of the datapath layer, each naming the object and what to do.
#[derive(Debug, Error)]
pub enum DatapathError {
    #[error("the eBPF object is not embedded in this xlb binary: run `cargo xtask build` first")]
    ObjectMissing,
    #[error("{path} is not a mounted bpf filesystem: mount it with `mount -t bpf bpf /sys/fs/bpf`")]
    BpffsNotMounted { path: PathBuf },
    #[error(
        "pin directory {path} is in use by another xlb agent: one agent per pin directory (stop it, or give this one another --bpffs)"
    )]
    Locked { path: PathBuf },
    #[error(
        "map {map} pinned in {dir} holds {pinned} entries, {wanted} were asked for: a pinned map keeps its size; start with the old size, or `xlb cleanup --bpffs {dir}` (this drops its flows) and start again",
        dir = dir.display()
    )]
    SizeChanged {
        map: &'static str,
        pinned: u32,
        wanted: u32,
        dir: PathBuf,
    },
    #[error("cannot create pin directory {path}: {source}")]
    PinDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("loading the eBPF object failed (kernel too old, no BTF, or not root?): {0}")]
    Load(#[from] aya::EbpfError),
    #[error("program {name}: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error(
        "map {name} is not pinned in {dir}: no xlb agent of this version has run with this pin directory (--bpffs)",
        dir = dir.display()
    )]
    NotPinned { name: &'static str, dir: PathBuf },
    #[error("map {name} is missing from the object or the pin directory")]
    MapMissing { name: &'static str },
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error(transparent)]
    Write(#[from] writer::WriteError),
    #[error("names file {path}: {source} (is /run writable?)", path = path.display())]
    NamesFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cgroup {cgroup}: cannot attach the socket hooks: {reason}")]
    Socket { cgroup: PathBuf, reason: String },
    #[error("the programs' debug log (--bpf-log): {reason}")]
    Log { reason: String },
    #[error("interface {iface}: cannot attach tc ingress: {reason}")]
    Attach { iface: String, reason: String },
    #[error("cannot count this machine's possible CPUs ({what}): {source}")]
    Cpus {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "counter map {name} holds {len} entries, not a whole row for each of this machine's {cpus} possible CPUs: it was pinned on other hardware; `xlb cleanup` and start again"
    )]
    CounterRows {
        name: &'static str,
        len: u32,
        cpus: u32,
    },
}
