//! The agent as a process against real pins: one definition of each map (`maps`), failed
//! writes retried per service (`write_retry`), `/metrics` as Prometheus scrapes it
//! (`metrics`), the kernel conntrack set as kube-proxy sets it, `/proxyMode` and `/configz`
//! (`node_duties`), map sizes that follow the pins unless a flag asks (`sizes`). (The
//! faults, which kill an agent in the middle of a sync, are a binary of their own: beside a
//! cold sync of thousands of services the kill never found its moment.)

mod maps;
mod metrics;
mod node_duties;
mod sizes;
mod write_retry;
