//! The tests that need neither root nor a kernel, in one binary (one link instead of five):
//! the desired state computed from sources (`desired`, `incremental`), the emitters'
//! golden output (`emit_golden`), the deploy manifests (`deploy`), the maps' page rendered
//! from lb-common's catalogue (`maps_page`), every crate page naming its files
//! (`crate_pages`), and the source's own invariants (`source_rules`: the agent's import
//! layers, the eBPF work area, shared map values, lb-ebpf's import graph).

mod crate_pages;
mod deploy;
mod desired;
mod emit_golden;
mod incremental;
mod maps_page;
mod source_rules;
