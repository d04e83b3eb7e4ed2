//! The tests that need neither root nor a kernel, in one binary (one link instead of five):
//! the desired state computed from sources (`desired`, `incremental`), the emitters'
//! golden output (`emit_golden`), the deploy manifests (`deploy`), and the source's own
//! invariants (`source_rules`: the agent's import layers, the eBPF work area, shared map
//! values).

mod deploy;
mod desired;
mod emit_golden;
mod incremental;
mod source_rules;
