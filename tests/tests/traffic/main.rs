//! Real traffic through the attached datapath: a client pod, three backend pods, the agent in
//! the node namespace, real TCP and UDP sockets.

mod agent;
mod reuse;
mod sctp;
mod spread;
