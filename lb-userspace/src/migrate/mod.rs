//! From kube-proxy to xlb with nothing lost (issue `[migrate]`): the flows kube-proxy's rules
//! translated live in the kernel's conntrack table (`datapath::kernel_ct` reads it); each
//! one to a frontend xlb serves becomes xlb's own assured conntrack entries with
//! kube-proxy's backend and masquerade source (`adopt`), so that once xlb's programs are
//! attached its next packet goes on where it went. Removing kube-proxy's rules is
//! `datapath::netfilter`'s. The way back (`hand_back`) writes xlb's flows into the
//! kernel's table with their NAT, for kube-proxy's rules to carry on.
//!
//! | file | what it does |
//! |---|---|
//! | `adopt.rs` | a kernel flow → xlb's forward, reply (and egress) conntrack entries |
//! | `hand_back.rs` | xlb's flows → the kernel's entries with their NAT |

pub mod adopt;
pub mod hand_back;
