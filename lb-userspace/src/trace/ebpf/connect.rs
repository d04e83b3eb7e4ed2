//! The node's own socket: connect4's (or, to an IPv6 frontend, connect6's) decision
//! computed from the live maps.

use lb_common::user::show_backend;
use lb_common::{
    FAMILY_NETNS, NodeConfig, SCOPE_EXTERNAL, SCOPE_INTERNAL, SVC_F_DROP_EMPTY, SVC_F_MAGLEV,
    SVC_F_SRC_RANGES, SVC_F_TWO_SCOPES,
};

use super::{
    Context, Frontend, affinity_before, affinity_entry, affinity_key, algorithm::affinity_hit,
    endpoints_step, frontend, frontend_step, svc_key,
};
use crate::{
    desired::Desired,
    trace::{Report, request::Resolved},
};

/// The node's own socket: what connect4 (connect6 for an IPv6 frontend) decides, computed
/// from the live maps as the program does (`sock.rs`, one code for both families): the
/// kernel cannot test-run cgroup sock_addr programs.
pub(super) fn trace_connect(
    ctx: &Context,
    req: &Resolved,
    state: &Desired,
    cfg: &NodeConfig,
) -> Report {
    let mut r = Report::new(format!(
        "xlb trace (datapath): {} -> {} {}",
        req.from, req.to, req.protocol
    ));
    let hook = if req.dst.is_ipv6() { 6 } else { 4 };
    r.line(
        "socket",
        format!(
            "connect({}) from the node: cgroup connect{hook} hook (xlb_connect{hook}); computed from the live maps as the program decides (the kernel cannot test-run cgroup sock_addr programs); nothing is written",
            req.dst
        ),
    );
    let Some(outer) = frontend(state, svc_key(req.dst, req.protocol, SCOPE_EXTERNAL)) else {
        r.line(
            "frontend",
            format!(
                "{}/{} is no frontend: connect() goes on unchanged",
                req.dst, req.protocol
            ),
        );
        r.line("counter", "sock_pass +1 (would)");
        r.outcome = "passed".into();
        return r;
    };
    frontend_step(&mut r, ctx, state, &outer, req.dst);
    let f = node_scope(&mut r, req, state, outer);
    endpoints_step(&mut r, ctx, &f, req.dst);
    if f.svc.flags & SVC_F_SRC_RANGES != 0 {
        r.line(
            "source",
            "loadBalancerSourceRanges: an unbound socket is checked as the frontend address (allowed when a range holds a node address)",
        );
    }
    if f.svc.count == 0 {
        refused(&mut r, &f);
        return r;
    }
    let (choices, state_lines) = backend_choice(&mut r, ctx, state, cfg, &f);
    r.step(
        "rewrite",
        vec![
            format!(
                "connect() address {} -> the backend: the socket's packets need no NAT (tc sees the backend as destination)",
                req.dst
            ),
            format!("getpeername()/recvmsg() show {} again (a socket-map reverse entry)", req.dst),
        ],
    );
    r.step("state", state_lines);
    r.line("verdict", "connect() allowed, to the backend");
    r.line("counter", "sock_xlate +1 (would)");
    r.outcome = outcome(&choices, req);
    r
}

/// The frontend entries the node's own traffic uses: the internal ones of a two-scope service.
fn node_scope(r: &mut Report, req: &Resolved, state: &Desired, outer: Frontend) -> Frontend {
    if outer.svc.flags & SVC_F_TWO_SCOPES == 0 {
        return outer;
    }
    match frontend(state, svc_key(req.dst, req.protocol, SCOPE_INTERNAL)) {
        Some(inner) => {
            r.line(
                "scope",
                "the node's own traffic uses the frontend's internal entries: every cluster endpoint (kube-proxy sends local-origin traffic to the cluster chain)",
            );
            inner
        }
        None => outer,
    }
}

/// No endpoints: connect() fails, refused or unreachable.
fn refused(r: &mut Report, f: &Frontend) {
    let drop = f.svc.flags & SVC_F_DROP_EMPTY != 0;
    r.line(
        "verdict",
        if drop {
            "connect() fails with EHOSTUNREACH (no local endpoints under a Local policy)"
        } else {
            "connect() fails with ECONNREFUSED (no endpoints: kube-proxy's REJECT)"
        },
    );
    r.line(
        "counter",
        if drop {
            "sock_unreach +1 (would)"
        } else {
            "sock_reject +1 (would)"
        },
    );
    r.outcome = if drop { "dropped" } else { "refused" }.into();
}

/// The backends connect() may go to (the node's live affinity entry's, or every slot's),
/// after reporting the affinity and backend steps; and the state step's lines.
fn backend_choice(
    r: &mut Report,
    ctx: &Context,
    state: &Desired,
    cfg: &NodeConfig,
    f: &Frontend,
) -> (Vec<String>, Vec<String>) {
    let cookie = cfg.host_netns_cookie;
    let key = affinity_key(
        f.svc.svc_id,
        [cookie as u32, (cookie >> 32) as u32],
        FAMILY_NETNS,
    );
    let live = affinity_entry(ctx.pins, &key);
    r.line(
        "affinity",
        affinity_before(&f.svc, &key, live.as_ref(), state),
    );
    let remembered = live.filter(|a| affinity_hit(f, Some(a)));
    r.line("algorithm", algorithm_line(state, f, remembered.is_some()));
    let choices: Vec<String> = match remembered {
        Some(a) => state
            .backends
            .get(&a.backend_id)
            .map(show_backend)
            .into_iter()
            .collect(),
        None => f
            .slots
            .iter()
            .filter_map(|(_, _, b)| b.as_ref().map(show_backend))
            .collect(),
    };
    r.line(
        "backend",
        if remembered.is_some() {
            format!("{} (the node's affinity entry)", choices.join(""))
        } else {
            format!("one of {} at random: {}", choices.len(), choices.join(", "))
        },
    );
    let mut state_lines =
        vec!["a socket-map reverse entry for the socket (would create)".to_string()];
    if f.svc.affinity_timeout_s != 0 {
        state_lines.push(format!(
            "affinity for the node's namespace, service index {} (would {})",
            f.svc.svc_id,
            if live.is_some() { "refresh" } else { "create" }
        ));
    }
    (choices, state_lines)
}

/// How connect() picks (`select::choose` without a hash): at random, a Maglev frontend's
/// too (a socket has no flow to hash before it connects).
fn algorithm_line(state: &Desired, f: &Frontend, by_affinity: bool) -> String {
    let count = f.slots.len();
    let mut line = if f.svc.flags & SVC_F_MAGLEV != 0 {
        format!(
            "random: connect() has no flow to hash yet, so it picks uniformly among {count} slot(s), not by the frontend's table ({})",
            crate::desired::show_maglev(state.maglev.get(&f.svc.svc_id))
        )
    } else {
        format!("random: connect() picks uniformly among {count} slot(s)")
    };
    if by_affinity {
        line.push_str("; not consulted: the node's affinity entry decides");
    }
    line
}

/// The trace's outcome: the backend, or the ones it may be.
fn outcome(choices: &[String], req: &Resolved) -> String {
    let proto = format!("/{}", req.protocol);
    if choices.len() == 1 {
        choices[0].trim_end_matches(&proto).to_string()
    } else {
        format!(
            "one of {}",
            choices
                .iter()
                .map(|c| c.trim_end_matches(&proto))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}
