//! Packet tests: crafted packets through the loaded tc program (BPF_PROG_TEST_RUN), as a
//! table of cases, Katran-style.

use xlb_tests::checksums;

mod rewrites;
mod robust;
mod state;
