//! The agent as a process against real pins: one definition of each map (`maps`), failed
//! writes retried per service (`write_retry`), `/metrics` as Prometheus scrapes it
//! (`metrics`). (The faults, which kill an agent in the middle of a sync, are a binary of
//! their own: beside a cold sync of thousands of services the kill never found its moment.)

mod maps;
mod metrics;
mod write_retry;
