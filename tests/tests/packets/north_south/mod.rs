//! Packet tests for the north-south rewrites, through the loaded tc and XDP programs
//! (BPF_PROG_TEST_RUN) as tables run in both families: NodePort DNAT + SNAT to a remote
//! backend and its reverse, a local backend keeping the client, Local policy without local
//! endpoints, source ranges, hairpin, ICMP / ICMPv6 inner-header translation and
//! fragmentation needed / Packet Too Big.
//!
//! The programs run in a dual-stack namespace of their own whose routes they consult
//! (`bpf_fib_lookup`): node1's underlay (`10.0.0.1/24`, `fd00::1/64`) on a veth (peer in
//! the same namespace) with MTU 1280, and node2's pods (10.245.0.0/16, fd00:10:245::/48)
//! behind `10.0.0.2` / `fd00::2` (`xlb_tests::suites::packets_north_south`).

mod tc;
mod xdp;
