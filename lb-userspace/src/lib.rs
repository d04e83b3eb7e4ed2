//! xlb's agent: sources → model → desired maps → pinned BPF maps, and the tools around them.
//!
//! One way in (the model), several ways out (the map writer, the emitters, `xlb list`).
//! Test and comparison scaffolding (labs, `xlb-probe`, `xlb-compare`) lives in `xlb-lab`.
//!
//! The crate page (its data flow and a line per module) follows.
#![doc = include_str!("../README.md")]

pub mod agent;
pub mod cleanup;
pub mod config;
pub mod datapath;
pub mod desired;
pub mod emit;
pub mod glob;
pub mod list;
pub mod migrate;
pub mod model;
pub mod proxy;
pub mod reconcile;
pub mod serve;
pub mod shadow;
pub mod source;
pub mod trace;

/// The packet builder (it lives with `xlb trace`, which builds the packets it traces).
pub use trace::packet;

/// The eBPF object built from `lb-ebpf`, embedded at build time (empty when it was not built).
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lb-ebpf.o"));

/// Default directory for xlb's pinned maps and links (a layout version is in every map name).
pub const DEFAULT_BPFFS_DIR: &str = "/sys/fs/bpf/xlb";
