//! xlb's test and comparison scaffolding, apart from the agent crate (nothing here ships in
//! `xlb`): a small lab of network namespaces for tests, the demo, benchmarks and
//! `xlb-compare` — a node namespace, pods on veths, echo servers that report the peer they
//! saw, clients (on a thread, or as `xlb-probe` processes, in a cgroup for the socket
//! hooks), a cgroup of the lab's own, and a bounded load generator — and [`compare`], the
//! same services through xlb and kube-proxy's modes side by side.
//!
//! Everything here builds its own namespaces and cgroups with names unique to the caller and
//! removes them on drop, on success and on failure. Nothing touches the root namespace's
//! interfaces or the root cgroup; a namespace is entered only on a dedicated thread or by a
//! child process (`nsenter`).

pub mod bridge;
pub mod cgroup;
pub mod client;
pub mod compare;
pub mod echo;
pub mod load;
pub mod netns;
pub mod probe;
pub mod process;
pub mod sctp;
pub mod topology;
