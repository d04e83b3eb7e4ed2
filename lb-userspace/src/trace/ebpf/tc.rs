//! A packet through tc ingress: BPF_PROG_TEST_RUN on a scratch instance, explained. IPv4
//! and IPv6 alike (the program's IPv6 path, `v6/mod.rs`, writes the IPv6 conntrack tables).

use std::net::{IpAddr, SocketAddr};

use lb_common::{CT_F_HAIRPIN, CT_F_SNAT, FAMILY_NETNS, FAMILY_V6, SCOPE_EXTERNAL};

use super::{
    Context, Frontend, TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, affinity_before,
    algorithm::{affinity_hit, algorithm},
    backend_words, client_key, endpoints_step,
    flows::{self, Flow},
    frontend, frontend_step, reason_name, sock, svc_key,
};
use crate::{
    datapath::{
        DatapathError,
        scratch::{Run, Scratch},
    },
    desired::Desired,
    model::Protocol,
    trace::{
        Report,
        frame::{Seen, first_packet, seen},
        request::Resolved,
    },
};

/// A packet from `src` through tc ingress of a scratch instance sharing the live service maps.
pub(super) fn trace_tc(
    object: &[u8],
    ctx: &Context,
    req: &Resolved,
    src: SocketAddr,
    state: &Desired,
) -> Result<Report, DatapathError> {
    let mut r = Report::new(format!(
        "xlb trace (datapath): {} -> {} {}",
        req.from, req.to, req.protocol
    ));
    // `request::resolve` gives both ends one family.
    let Some(pkt) = first_packet(src, req.dst, req.protocol) else {
        r.line(
            "packet",
            format!("{src} and {} are of two families", req.dst),
        );
        r.outcome = "not traced".into();
        return Ok(r);
    };
    let mut scratch = Scratch::load(object, ctx.pins)?;
    r.line(
        "packet",
        format!(
            "{}{} {src} -> {} enters tc ingress (xlb_tc_ingress), then tc egress (xlb_tc_egress) of the interface it leaves by; BPF_PROG_TEST_RUN on a second instance: service maps shared from {}, {} conntrack and {} affinity entries copied into its own maps",
            if req.dst.is_ipv6() { "IPv6 " } else { "" },
            match req.protocol {
                Protocol::Udp => "UDP",
                Protocol::Sctp => "SCTP INIT",
                Protocol::Tcp => "TCP SYN",
            },
            req.dst,
            ctx.pins.dir().display(),
            scratch.conntrack_len(),
            scratch.affinity_before().len()
        ),
    );
    let tracked = flows::tracked(&scratch, src, req.dst, req.protocol);
    r.line(
        "conntrack",
        match &tracked {
            Some(to) => format!(
                "tracked flow: this tuple already goes to {to} (its entry decides, no service lookup)"
            ),
            None => "no entry for this tuple: a new flow".into(),
        },
    );
    let f = frontend(state, svc_key(req.dst, req.protocol, SCOPE_EXTERNAL));
    // The client's live affinity entry decides a new flow's backend (before any table).
    let mut by_affinity = false;
    match &f {
        Some(f) => {
            frontend_step(&mut r, ctx, state, f, req.dst);
            endpoints_step(&mut r, ctx, f, req.dst);
            let key = client_key(f.svc.svc_id, src.ip());
            let live = scratch
                .affinity_before()
                .get(bytemuck::bytes_of(&key))
                .map(|(_, v)| v);
            r.line("affinity", affinity_before(&f.svc, &key, live, state));
            by_affinity = affinity_hit(f, live);
        }
        None => r.line(
            "frontend",
            format!(
                "{}/{} is no frontend of this node's maps",
                req.dst, req.protocol
            ),
        ),
    }
    let run = scratch.run_tc(&pkt)?;
    let prior = Prior {
        tracked: tracked.is_some(),
        by_affinity,
    };
    explain_run(&mut r, state, &pkt, &run, f.as_ref(), prior);
    Ok(r)
}

/// What the live maps said of the packet's flow before the run.
#[derive(Clone, Copy)]
struct Prior {
    /// Its tuple has a conntrack entry: no backend is chosen.
    tracked: bool,
    /// The client's affinity entry decides its backend.
    by_affinity: bool,
}

/// What the test run did: how the backend was chosen (the algorithm: the Maglev table entry
/// the packet hashed to, or random), the rewrites, the flow state, the verdict.
fn explain_run(
    r: &mut Report,
    state: &Desired,
    input: &[u8],
    run: &Run,
    f: Option<&Frontend>,
    prior: Prior,
) {
    let before = seen(input);
    let after = seen(&run.packet);
    let fwd = flows::forward(run);
    if let (Some(v), Some(f), Some(p)) = (fwd, f, before)
        && !prior.tracked
    {
        let how = algorithm(
            state,
            f,
            (p.src, p.dst, p.protocol),
            Some(v.backend_id),
            prior.by_affinity,
        );
        r.line("algorithm", how.line);
        let by = if prior.by_affinity {
            By::Affinity
        } else if how.by_table {
            By::Table
        } else {
            By::Random
        };
        r.line("backend", chosen_backend(state, f, &v, by));
    }
    let rewrites = rewrites(run, before.as_ref(), after.as_ref(), fwd.as_ref());
    if !rewrites.is_empty() {
        r.step("rewrite", rewrites);
    }
    r.line("egress", egress_step(run));
    let client = before.map(|p| p.src.ip());
    r.step("state", state_writes(run, client));
    let (verdict, outcome) = verdict(run, before.as_ref(), after.as_ref());
    r.line("verdict", verdict);
    r.line(
        "counter",
        run.reasons
            .iter()
            .map(|(reason, n)| format!("{} +{n}", reason_name(*reason)))
            .collect::<Vec<_>>()
            .join(", "),
    );
    r.outcome = outcome;
}

/// What tc egress (of the interface the packet leaves by) did with what ingress passed.
fn egress_step(run: &Run) -> String {
    match &run.egress {
        None => "not reached: tc ingress did not pass the packet on".into(),
        Some((_, reasons)) => {
            let counted = reasons
                .iter()
                .map(|(reason, _)| reason_name(*reason))
                .collect::<Vec<_>>()
                .join(", ");
            let what = if run.ingress_packet == run.packet {
                "nothing to restore on the source side"
            } else {
                "the source side rewritten (after routing and netfilter)"
            };
            format!("xlb_tc_egress: {what} ({counted})")
        }
    }
}

/// What chose a new flow's backend.
#[derive(Clone, Copy)]
enum By {
    Affinity,
    Table,
    Random,
}

/// The backend a new flow went to, and how it was chosen.
fn chosen_backend(state: &Desired, f: &Frontend, v: &Flow, by: By) -> String {
    let be = state.backends.get(&v.backend_id);
    let how = match by {
        By::Affinity => "by the client's affinity entry".to_string(),
        By::Table => "by the frontend's Maglev table".to_string(),
        By::Random => format!("at random among {} slot(s)", f.slots.len()),
    };
    format!(
        "{} chosen {how}",
        be.map_or_else(|| v.to_dst.to_string(), backend_words)
    )
}

/// The packet's rewrites (DNAT, SNAT and why), or the answer sent back instead.
fn rewrites(
    run: &Run,
    before: Option<&Seen>,
    after: Option<&Seen>,
    fwd: Option<&Flow>,
) -> Vec<String> {
    let mut rewrites = Vec::new();
    if run.verdict == TC_ACT_REDIRECT {
        let v6 = before.is_some_and(|p| p.dst.is_ipv6());
        rewrites.push(match before.map(|p| p.protocol) {
            Some(Protocol::Udp) => format!(
                "answered: {} port unreachable back to the client (no endpoints: kube-proxy's REJECT)",
                if v6 { "ICMPv6" } else { "ICMP" }
            ),
            _ => "answered: TCP RST back to the client (no endpoints: kube-proxy's REJECT)".into(),
        });
    } else if let (Some(b), Some(a)) = (before, after) {
        if a.dst != b.dst {
            rewrites.push(format!(
                "DNAT {} -> {} (tc ingress, before routing: netfilter sees the backend, as under kube-proxy's PREROUTING DNAT)",
                b.dst, a.dst
            ));
        }
        if fwd.is_some_and(|v| v.flags & lb_common::CT_F_DSR != 0) {
            let (carrier, len) = if b.dst.is_ipv6() {
                ("IPv6 destination option", lb_common::DSR6_HDR_LEN)
            } else {
                ("IPv4 option", lb_common::DSR_OPT_LEN)
            };
            rewrites.push(format!(
                "DSR (--lb-mode): no SNAT, the backend sees the client; at tc egress toward the backend's node, a TCP SYN or UDP datagram gets the {carrier} naming {} ({len} bytes), and the backend's node answers the client directly",
                b.dst
            ));
        }
        if a.src != b.src {
            let why = match fwd.map(|v| v.flags) {
                Some(fl) if fl & CT_F_HAIRPIN != 0 => {
                    "hairpin: the pod is its own backend, so its source is the hairpin address"
                }
                Some(fl) if fl & CT_F_SNAT != 0 && a.src.ip() == b.src.ip() => {
                    "port only: the reply tuple would clash with another flow's"
                }
                _ => "to the node: the backend is on another node, its reply must come back here",
            };
            rewrites.push(format!(
                "SNAT {} -> {} at tc egress, after netfilter ({why})",
                b.src, a.src
            ));
        }
        if rewrites.is_empty() {
            rewrites.push("none".into());
        }
    }
    rewrites
}

/// The conntrack and affinity entries the run would create or refresh (`client`: the
/// packet's source, whose affinity key an IPv6 address is folded into).
fn state_writes(run: &Run, client: Option<IpAddr>) -> Vec<String> {
    let would = |before: bool| {
        if before {
            "would refresh"
        } else {
            "would create"
        }
    };
    let mut writes: Vec<String> = flows::written(run)
        .iter()
        .map(|c| {
            format!(
                "{} {}conntrack {} {} -> {} => {} -> {}",
                would(c.existed),
                if c.key_dst.is_ipv6() { "IPv6 " } else { "" },
                if c.dir == lb_common::CT_DIR_FORWARD {
                    "forward"
                } else {
                    "reply"
                },
                c.key_src,
                c.key_dst,
                c.to_src,
                c.to_dst,
            )
        })
        .collect();
    writes.extend(run.affinity.iter().map(|a| {
        let who = match (a.key.family, client) {
            (FAMILY_NETNS, _) => "netns".to_string(),
            (FAMILY_V6, Some(ip)) => format!("{ip} (its IPv6 address folded to two words)"),
            _ => sock(a.key.client_be, a.key.family, 0).ip().to_string(),
        };
        format!(
            "{} affinity {who} for service index {} -> backend index {}",
            would(a.before.is_some()),
            a.key.svc_id,
            a.after.backend_id
        )
    }));
    if writes.is_empty() {
        writes.push("none".into());
    }
    writes.push("(written to the trace's own copies; the live maps are untouched)".into());
    writes
}

/// The tc action in words, and the trace's one-word outcome.
fn verdict(run: &Run, before: Option<&Seen>, after: Option<&Seen>) -> (String, String) {
    let dst = after.map(|p| p.dst);
    match run.verdict {
        TC_ACT_OK if after.map(|p| (p.src, p.dst)) != before.map(|p| (p.src, p.dst)) => (
            "TC_ACT_OK: forwarded, rewritten".to_string(),
            dst.map_or("forwarded".into(), |d| d.to_string()),
        ),
        TC_ACT_OK => (
            "TC_ACT_OK: passed on untouched (not service traffic)".into(),
            "passed".into(),
        ),
        TC_ACT_SHOT => ("TC_ACT_SHOT: dropped".into(), "dropped".into()),
        TC_ACT_REDIRECT => (
            "TC_ACT_REDIRECT: the answer goes back out the interface it came in".into(),
            "refused".into(),
        ),
        v => (format!("tc action {v}"), format!("action {v}")),
    }
}
