//! The agent as a process against real pins: one definition of each map (`maps`), faults
//! (`faults`), failed writes retried per service (`write_retry`), `/metrics` as Prometheus
//! scrapes it (`metrics`).

mod faults;
mod maps;
mod metrics;
mod write_retry;
