//! Proxies that run in userspace, for comparison with the datapath.

pub mod userspace;
