//! Desired state as text: frontends and backends in `a.b.c.d:port/PROTO` form, and the
//! sorted dump golden tests and `xlb desired` print.

use std::fmt::Write as _;

use lb_common::{
    BE_F_REMOTE, Backend, SCOPE_EXTERNAL, SCOPE_INTERNAL, SVC_F_DROP_EMPTY, SVC_F_SNAT_REMOTE,
    SVC_F_SRC_RANGES, SVC_F_TWO_SCOPES, SvcKey,
};

use super::{Desired, svc_name_str};
use crate::model::Protocol;

/// `a.b.c.d:port`, or `[v6]:port`.
fn sock(addr_be: [u32; 4], family: u8, port_be: u16) -> String {
    std::net::SocketAddr::new(
        super::values::words_addr(addr_be, family),
        u16::from_be(port_be),
    )
    .to_string()
}

fn proto_name(p: u8) -> String {
    Protocol::from_number(p).map_or_else(|| format!("proto{p}"), |p| p.to_string())
}

/// `a.b.c.d:port/PROTO` of a service key (` internal` added for an internal scope).
pub fn show_frontend(k: &SvcKey) -> String {
    format!(
        "{}/{}{}",
        sock(k.addr_be, k.family, k.port_be),
        proto_name(k.proto),
        if k.scope == SCOPE_INTERNAL {
            " internal"
        } else {
            ""
        }
    )
}

/// `a.b.c.d:port/PROTO` of a backend.
pub fn show_backend(b: &Backend) -> String {
    format!(
        "{}/{}",
        sock(b.addr_be, b.family, b.port_be),
        proto_name(b.proto)
    )
}

impl Desired {
    /// Sorted text of every entry, for golden tests and `xlb list --raw`.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        let mut entries: Vec<_> = self.services.iter().collect();
        entries.sort_by_key(|(k, _)| (show_frontend(k), k.slot));
        for (k, v) in entries {
            if k.slot == 0 {
                let name = self
                    .names
                    .get(&v.svc_id)
                    .map(svc_name_str)
                    .unwrap_or_default();
                let mut extra = String::new();
                if v.flags & SVC_F_DROP_EMPTY != 0 {
                    extra.push_str(" drop-when-empty");
                }
                if v.flags & SVC_F_SNAT_REMOTE != 0 {
                    extra.push_str(" snat-remote");
                }
                if v.flags & SVC_F_TWO_SCOPES != 0 {
                    extra.push_str(" two-scopes");
                }
                if v.flags & SVC_F_SRC_RANGES != 0 && k.scope == SCOPE_EXTERNAL {
                    let ranges: Vec<String> = self
                        .src_ranges
                        .iter()
                        .filter(|r| r.svc_id == v.svc_id)
                        .map(|r| format!("{}/{}", r.addr, r.prefix))
                        .collect();
                    let _ = write!(extra, " source-ranges={}", ranges.join(","));
                }
                if v.affinity_timeout_s != 0 {
                    let _ = write!(extra, " affinity={}s", v.affinity_timeout_s);
                }
                let _ = writeln!(
                    out,
                    "service {} id={} name={} count={}{extra}",
                    show_frontend(k),
                    v.svc_id,
                    name,
                    v.count
                );
            } else {
                let be = self.backends.get(&v.backend_id).map(show_backend);
                let _ = writeln!(
                    out,
                    "  slot {} -> backend {} {}",
                    k.slot,
                    v.backend_id,
                    be.unwrap_or_else(|| "MISSING".into())
                );
            }
        }
        for (id, b) in &self.backends {
            let remote = if b.flags & BE_F_REMOTE != 0 {
                " remote"
            } else {
                ""
            };
            let _ = writeln!(out, "backend {id} {}{remote}", show_backend(b));
        }
        out
    }
}
