//! Packet tests: crafted packets through the loaded tc program (BPF_PROG_TEST_RUN), as a
//! table of cases, Katran-style.

#[path = "../support/checksums.rs"]
mod checksums;

mod rewrites;
mod robust;
mod state;
