//! Packet tests: crafted packets through the loaded tc program (BPF_PROG_TEST_RUN), as a
//! table of cases, Katran-style.
//!
//! One binary, a module per topic. Each runs its cases in both families from one body
//! (`xlb_tests::suites::packets::Family` gives a family's addresses and builds its
//! packets): `flows`, `rewrites`, `refusals`, `robust`, `state`, `hairpin`, `routed` (XDP
//! and SNAT in a routed namespace), `sctp`, `maglev`, `slots` (slot ranges that move, the
//! slot array's end), `north_south` (NodePort, SNAT, hairpin, XDP, in a dual-stack node
//! namespace); a case that runs in one family says why. `ranges`
//! (loadBalancerSourceRanges of each family on a dual-stack Service).

use xlb_tests::checksums;

mod flows;
mod hairpin;
mod maglev;
mod north_south;
mod ranges;
mod refusals;
mod rewrites;
mod robust;
mod routed;
mod sctp;
mod slots;
mod state;
