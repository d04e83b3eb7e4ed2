//! Emitters: pure functions from the model, a node's settings and the writer's options to
//! the rules kube-proxy would write in each of its modes, plus helpers to check them.
//!
//! * [`iptables`]: `iptables-restore` input (filter and nat tables), full and partial syncs;
//! * [`nftables`]: the `kube-proxy` nftables table (`nft -f` input), with a packet tracer;
//! * [`nft_json`]: reads `nft -j list table ip kube-proxy` (JSON) back into that table, for tracing;
//! * [`ipvs`]: IPVS services, ipsets, `kube-ipvs0` addresses and the iptables rules ipvs needs;
//! * [`userspace`]: the legacy userspace mode's portal rules and proxy ports;
//! * [`plan`]: what kube-proxy decides per service port, shared by iptables and nftables;
//! * [`rules`]: the iptables rule vocabulary iptables, ipvs and userspace share (restore
//!   payloads, jumps, masquerade and forwarding rules);
//! * [`restore`]: an in-memory `iptables-restore --noflush` (tables, chains, references);
//! * [`trace`]: follows a packet through emitted iptables rules (reachable DNAT targets).

pub mod iptables;
pub mod ipvs;
pub mod leftovers;
pub mod names;
pub mod nft_json;
pub mod nftables;
pub mod plan;
pub mod restore;
pub mod rules;
pub mod trace;
pub mod userspace;

use crate::model::{Model, NodeSettings};

pub use crate::model::proxy::{
    HostFeatures, IptablesOptions, IpvsOptions, MasqueradeMark, WriterOptions,
};
pub use rules::{Jump, Payload, Table};

/// A kube-proxy mode: what `xlb emit` writes rules for, what `xlb compare` runs beside
/// xlb, what `xlb proxy` runs (the one type for all three).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum Mode {
    Iptables,
    Nftables,
    Ipvs,
    Userspace,
}

impl Mode {
    /// The mode's name, as kube-proxy's `--proxy-mode` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Iptables => "iptables",
            Mode::Nftables => "nftables",
            Mode::Ipvs => "ipvs",
            Mode::Userspace => "userspace",
        }
    }
}

/// The text `xlb emit MODE` prints: what kube-proxy's first (full) sync would program.
///
/// * iptables: the `iptables-restore --noflush` payload;
/// * nftables: `nft -f` input creating the `kube-proxy` table;
/// * ipvs: four sections (`ipvsadm-restore`, `ipset restore`, `ip -batch` for
///   `kube-ipvs0`, `iptables-restore`), each introduced by a `#` line;
/// * userspace: the proxy-port allocation as `#` lines, then `iptables-restore` input.
pub fn render(mode: Mode, model: &Model, node: &NodeSettings, opts: &WriterOptions) -> String {
    match mode {
        Mode::Iptables => iptables::emit(model, node, opts).render(),
        Mode::Nftables => nftables::emit(model, node, opts).render(),
        Mode::Ipvs => {
            let st = ipvs::emit(model, node, opts);
            format!(
                "# ipvsadm-restore\n{}# ipset restore\n{}# ip -batch (kube-ipvs0)\n{}# iptables-restore --noflush\n{}",
                st.render_ipvsadm(),
                st.render_ipset(),
                st.render_addresses(),
                st.iptables.render()
            )
        }
        Mode::Userspace => userspace::emit(model, node, userspace::PortRange::default()).render(),
    }
}
