//! A small lab of network namespaces for tests, the demo, benchmarks and `xlb compare`: a
//! node namespace, pods on veths, echo servers that report the peer they saw, and clients.
//!
//! Everything here builds its own namespaces with names unique to the caller and removes them
//! on drop, on success and on failure. Nothing touches the root namespace's interfaces; a
//! namespace is entered only on a dedicated thread.

pub mod cgroup;
pub mod client;
pub mod echo;
pub mod netns;
pub mod process;
pub mod topology;
