//! A packet through tc ingress: BPF_PROG_TEST_RUN on a scratch instance, explained.

use std::net::SocketAddrV4;

use lb_common::{
    CT_DIR_FORWARD, CT_F_HAIRPIN, CT_F_SNAT, CtKey, CtValue, FAMILY_NETNS, FAMILY_V4,
    SCOPE_EXTERNAL,
};

use super::{
    Context, Frontend, TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, affinity_before, affinity_key,
    backend_words, be32, endpoints_step, frontend, frontend_step, ip_of, reason_name, sock,
    svc_key,
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
        packet::{PacketBuilder, Parsed, TCP_SYN, parse},
        request::Resolved,
    },
};

/// A packet from `src` through tc ingress of a scratch instance sharing the live service maps.
pub(super) fn trace_tc(
    object: &[u8],
    ctx: &Context,
    req: &Resolved,
    src: SocketAddrV4,
    state: &Desired,
) -> Result<Report, DatapathError> {
    let mut r = Report::new(format!(
        "xlb trace (datapath): {} -> {} {}",
        req.from, req.to, req.protocol
    ));
    let mut scratch = Scratch::load(object, ctx.pins)?;
    let pkt = match req.protocol {
        Protocol::Udp => PacketBuilder::udp(src, req.dst),
        _ => PacketBuilder::tcp(src, req.dst).flags(TCP_SYN),
    }
    .payload(b"xlb trace")
    .build();
    r.line(
        "packet",
        format!(
            "{} {src} -> {} enters tc ingress (xlb_tc_ingress); BPF_PROG_TEST_RUN on a second instance: service maps shared from {}, {} conntrack and {} affinity entries copied into its own maps",
            if req.protocol == Protocol::Udp { "UDP" } else { "TCP SYN" },
            req.dst,
            ctx.pins.display(),
            scratch.conntrack_len(),
            scratch.affinity_before().len()
        ),
    );
    let fwd_key = CtKey {
        saddr_be: be32(*src.ip()),
        daddr_be: be32(*req.dst.ip()),
        sport_be: src.port().to_be(),
        dport_be: req.dst.port().to_be(),
        proto: req.protocol.number(),
        dir: CT_DIR_FORWARD,
        _pad: 0,
    };
    let tracked = scratch.conntrack_entry(&fwd_key);
    r.line(
        "conntrack",
        match &tracked {
            Some(v) => format!(
                "tracked flow: this tuple already goes to {} (its entry decides, no service lookup)",
                sock(v.daddr_be, v.dport_be)
            ),
            None => "no entry for this tuple: a new flow".into(),
        },
    );
    let f = frontend(state, svc_key(req.dst, req.protocol, SCOPE_EXTERNAL, 0));
    match &f {
        Some(f) => {
            frontend_step(&mut r, ctx, state, f, req.dst);
            endpoints_step(&mut r, ctx, f, req.dst);
            let key = affinity_key(f.svc.svc_id, [be32(*src.ip()), 0], FAMILY_V4);
            let live = scratch
                .affinity_before()
                .get(bytemuck::bytes_of(&key))
                .map(|(_, v)| v);
            r.line("affinity", affinity_before(&f.svc, &key, live, state));
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
    explain_run(&mut r, state, &pkt, &run, f.as_ref(), tracked.is_some());
    Ok(r)
}

/// What the test run did: the backend chosen, the rewrites, the flow state, the verdict.
fn explain_run(
    r: &mut Report,
    state: &Desired,
    input: &[u8],
    run: &Run,
    f: Option<&Frontend>,
    tracked: bool,
) {
    let before = parse(input);
    let after = parse(&run.packet);
    let fwd = run
        .conntrack
        .iter()
        .find(|c| c.key.dir == CT_DIR_FORWARD)
        .map(|c| c.after);
    if let (Some(v), Some(f)) = (fwd, f)
        && !tracked
    {
        r.line("backend", chosen_backend(state, run, f, &v));
    }
    let rewrites = rewrites(run, before.as_ref(), after.as_ref(), fwd.as_ref());
    if !rewrites.is_empty() {
        r.step("rewrite", rewrites);
    }
    r.step("state", state_writes(run));
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

/// The backend a new flow went to, and how it was chosen.
fn chosen_backend(state: &Desired, run: &Run, f: &Frontend, v: &CtValue) -> String {
    let be = state.backends.get(&v.backend_id);
    let how = if run.affinity.iter().any(|a| a.before.is_some()) {
        "by the client's affinity entry".to_string()
    } else {
        format!("at random among {} slot(s)", f.slots.len())
    };
    format!(
        "{} chosen {how}",
        be.map_or_else(|| sock(v.daddr_be, v.dport_be).to_string(), backend_words)
    )
}

/// The packet's rewrites (DNAT, SNAT and why), or the answer sent back instead.
fn rewrites(
    run: &Run,
    before: Option<&Parsed>,
    after: Option<&Parsed>,
    fwd: Option<&CtValue>,
) -> Vec<String> {
    let mut rewrites = Vec::new();
    if run.verdict == TC_ACT_REDIRECT {
        rewrites.push(match before.map(|p| p.protocol) {
            Some(Protocol::Udp) => {
                "answered: ICMP port unreachable back to the client (no endpoints: kube-proxy's REJECT)".to_string()
            }
            _ => "answered: TCP RST back to the client (no endpoints: kube-proxy's REJECT)".into(),
        });
    } else if let (Some(b), Some(a)) = (before, after) {
        if a.dst != b.dst {
            rewrites.push(format!("DNAT {} -> {}", b.dst, a.dst));
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
            rewrites.push(format!("SNAT {} -> {} ({why})", b.src, a.src));
        }
        if rewrites.is_empty() {
            rewrites.push("none".into());
        }
    }
    rewrites
}

/// The conntrack and affinity entries the run would create or refresh.
fn state_writes(run: &Run) -> Vec<String> {
    let would = |before: bool| {
        if before {
            "would refresh"
        } else {
            "would create"
        }
    };
    let mut ct = run.conntrack.clone();
    ct.sort_by_key(|c| c.key.dir);
    let mut writes: Vec<String> = ct
        .iter()
        .map(|c| {
            format!(
                "{} conntrack {} {}:{} -> {}:{} => {} -> {}",
                would(c.before.is_some()),
                if c.key.dir == CT_DIR_FORWARD {
                    "forward"
                } else {
                    "reply"
                },
                ip_of(c.key.saddr_be),
                u16::from_be(c.key.sport_be),
                ip_of(c.key.daddr_be),
                u16::from_be(c.key.dport_be),
                sock(c.after.saddr_be, c.after.sport_be),
                sock(c.after.daddr_be, c.after.dport_be),
            )
        })
        .collect();
    writes.extend(run.affinity.iter().map(|a| {
        format!(
            "{} affinity {} for service index {} -> backend index {}",
            would(a.before.is_some()),
            if a.key.family == FAMILY_NETNS {
                "netns".to_string()
            } else {
                ip_of(a.key.client_be[0]).to_string()
            },
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
fn verdict(run: &Run, before: Option<&Parsed>, after: Option<&Parsed>) -> (String, String) {
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
