//! Types shared by the eBPF datapath (`lb-ebpf`) and the agent (`lb-userspace`).
//!
//! This crate is the only definition of anything that crosses the kernel/user boundary.
//! Every type is `#[repr(C)]` with explicit padding, is `bytemuck::Pod`, and has its size
//! asserted at compile time. Byte order is part of the field name (`_be` = network order).
//! A layout change bumps the `_V<n>` suffix of the map that holds the type, so a new agent
//! never misreads a map pinned by an older one.
//!
//! The crate page (its data flow and a line per module) follows.
#![doc = include_str!("../README.md")]
#![no_std]

pub mod catalog;
pub mod counters;
pub mod crc32c;
pub mod maps;
pub mod prev;
#[cfg(feature = "user")]
pub mod user;
pub mod v6;

pub use catalog::*;
pub use counters::*;
pub use maps::*;
pub use v6::*;

/// IP protocol numbers carried in `proto` fields.
pub const IPPROTO_TCP: u8 = 6;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;
/// IP protocol number of SCTP.
pub const IPPROTO_SCTP: u8 = 132;

/// `family` value for IPv4 addresses (`addr_be[0]` holds the address, the rest is zero).
pub const FAMILY_V4: u8 = 4;
/// `family` value for IPv6 addresses (all four words hold the address).
pub const FAMILY_V6: u8 = 6;
