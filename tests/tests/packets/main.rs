//! Packet tests: crafted packets through the loaded tc program (BPF_PROG_TEST_RUN), as a
//! table of cases, Katran-style.

//!
//! One binary, a module per topic: `rewrites`, `robust`, `state` (IPv4 east-west), `slots`
//! (slot ranges that move, and the slot array's end), `v6`
//! (the same over IPv6), `north_south` (NodePort, SNAT, hairpin, XDP, in a routed
//! namespace).

use xlb_tests::checksums;

mod families;
mod maglev;
mod north_south;
mod rewrites;
mod robust;
mod sctp;
mod slots;
mod state;
mod v6;
