//! Desired state as text: the sorted dump golden tests and `xlb desired` print (frontends
//! and backends in `lb_common::user`'s `a.b.c.d:port/PROTO` form).

use std::fmt::Write as _;

use lb_common::{
    BE_F_REMOTE, SCOPE_EXTERNAL, SVC_F_DROP_EMPTY, SVC_F_MAGLEV, SVC_F_SNAT_REMOTE,
    SVC_F_SRC_RANGES, SVC_F_TWO_SCOPES, SvcKey, SvcValue,
    user::{show_backend, show_frontend},
};

use sha2::{Digest, Sha256};

use super::{Desired, MaglevTable};

/// A Maglev table in a word: `maglev M=<size> table=<the first 8 hex digits of the SHA-256
/// of its entries>`; two nodes with the same word have the same table.
pub fn show_maglev(t: Option<&MaglevTable>) -> String {
    let Some(t) = t else {
        return "maglev MISSING".into();
    };
    let mut h = Sha256::new();
    for s in t.slots.iter() {
        h.update(s.to_le_bytes());
    }
    let d = h.finalize();
    format!(
        "maglev M={} table={:02x}{:02x}{:02x}{:02x}",
        t.size(),
        d[0],
        d[1],
        d[2],
        d[3]
    )
}

impl Desired {
    /// A frontend entry's flags, source ranges, affinity and Maglev table, as words.
    fn extra(&self, k: &SvcKey, v: &SvcValue) -> String {
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
        if v.flags & SVC_F_MAGLEV != 0 {
            let _ = write!(extra, " {}", show_maglev(self.maglev.get(&v.svc_id)));
        }
        extra
    }

    /// Sorted text of every entry, for golden tests and `xlb list --raw`.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        let mut entries: Vec<_> = self.services.iter().collect();
        entries.sort_by_cached_key(|(k, _)| show_frontend(k));
        for (k, v) in entries {
            let name = self.names.get(&v.svc_id).map(|n| &**n).unwrap_or_default();
            let _ = writeln!(
                out,
                "service {} id={} name={} count={}{}",
                show_frontend(k),
                v.svc_id,
                name,
                v.count,
                self.extra(k, v)
            );
            for (n, id) in v.slots.iter().enumerate() {
                let be = self.backends.get(id).map(show_backend);
                let _ = writeln!(
                    out,
                    "  slot {} -> backend {} {}",
                    n + 1,
                    id,
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
