//! Packet tests for the north-south rewrites, through the loaded tc program
//! (BPF_PROG_TEST_RUN) as a table: NodePort DNAT + SNAT to a remote backend and its reverse,
//! a local backend keeping the client, Local policy without local endpoints, source ranges,
//! hairpin, ICMP inner-header translation and fragmentation needed.
//!
//! The program runs in a namespace of its own whose routes it consults (`bpf_fib_lookup`):
//! node1's underlay `10.0.0.1/24` on a veth (peer in the same namespace) with MTU 1280, and node2's pods
//! (10.245.0.0/16) behind `10.0.0.2`.

mod tc;
mod xdp;
