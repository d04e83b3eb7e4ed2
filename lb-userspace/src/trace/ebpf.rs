//! A packet through the loaded programs: a test run of tc ingress on a scratch instance
//! ([`crate::datapath::scratch`]), or for the node's own sockets the connect4 decision
//! computed from the same maps, explained in Kubernetes terms.

use std::{
    collections::BTreeSet,
    net::{Ipv4Addr, SocketAddrV4},
    path::Path,
};

use lb_common::{
    AffinityKey, AffinityValue, BE_F_REMOTE, BE_F_TERMINATING, Backend, CT_DIR_FORWARD,
    CT_F_HAIRPIN, CT_F_SNAT, CtKey, FAMILY_NETNS, FAMILY_V4, NodeConfig, REASON_NAMES,
    SCOPE_EXTERNAL, SCOPE_INTERNAL, SVC_F_DROP_EMPTY, SVC_F_SNAT_REMOTE, SVC_F_SRC_RANGES,
    SVC_F_TWO_SCOPES, SvcKey, SvcValue,
};

use super::{
    Report,
    packet::{PacketBuilder, TCP_SYN, parse},
    request::{Resolved, Source, frontend_kind, policy_words},
};
use crate::{
    datapath::{
        DatapathError,
        kernel::{KernelMaps, open_pinned},
        scratch::{Run, Scratch},
        writer::MapWriter,
    },
    desired::{Desired, show_backend, svc_name_str},
    list::monotonic_coarse_ns,
    model::{NodeSettings, Protocol, select::service_ports},
};

const TC_ACT_OK: i32 = 0;
const TC_ACT_SHOT: i32 = 2;
const TC_ACT_REDIRECT: i32 = 7;

/// What the trace knows besides the maps.
pub struct Context<'a> {
    pub pins: &'a Path,
    pub source: &'a Source,
    /// This node's name (which endpoints are local).
    pub node_name: &'a str,
}

fn be32(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

fn ip_of(addr_be: u32) -> Ipv4Addr {
    Ipv4Addr::from(addr_be.to_ne_bytes())
}

fn sock(addr_be: u32, port_be: u16) -> SocketAddrV4 {
    SocketAddrV4::new(ip_of(addr_be), u16::from_be(port_be))
}

fn svc_key(dst: SocketAddrV4, proto: Protocol, scope: u8, slot: u16) -> SvcKey {
    SvcKey {
        addr_be: [be32(*dst.ip()), 0, 0, 0],
        port_be: dst.port().to_be(),
        slot,
        proto: proto.number(),
        family: FAMILY_V4,
        scope,
        _pad: 0,
    }
}

/// The frontend's service entry and its backends, slot by slot.
struct Frontend {
    key: SvcKey,
    svc: SvcValue,
    slots: Vec<(u16, u32, Option<Backend>)>,
}

fn frontend(state: &Desired, key: SvcKey) -> Option<Frontend> {
    let svc = *state.services.get(&key)?;
    let slots = (1..=svc.count)
        .map(|slot| {
            let id = state
                .services
                .get(&SvcKey { slot, ..key })
                .map_or(0, |v| v.backend_id);
            (slot, id, state.backends.get(&id).copied())
        })
        .collect();
    Some(Frontend { key, svc, slots })
}

fn flag_words(flags: u16) -> Vec<&'static str> {
    [
        (SVC_F_DROP_EMPTY, "drops when empty (a Local policy)"),
        (SVC_F_SNAT_REMOTE, "SNATs flows to remote backends"),
        (SVC_F_SRC_RANGES, "loadBalancerSourceRanges"),
        (
            SVC_F_TWO_SCOPES,
            "cluster-wide entries for the node's own traffic",
        ),
    ]
    .iter()
    .filter(|(f, _)| flags & f != 0)
    .map(|(_, w)| *w)
    .collect()
}

fn backend_words(b: &Backend) -> String {
    let mut w = vec![if b.flags & BE_F_REMOTE != 0 {
        "not on this node by nodeName"
    } else {
        "on this node"
    }];
    if b.flags & BE_F_TERMINATING != 0 {
        w.push("terminating");
    }
    format!("{} ({})", show_backend(b), w.join(", "))
}

/// The frontend step: which Kubernetes frontend the destination is.
fn frontend_step(r: &mut Report, ctx: &Context, state: &Desired, f: &Frontend, dst: SocketAddrV4) {
    let name = state
        .names
        .get(&f.svc.svc_id)
        .map(svc_name_str)
        .unwrap_or_else(|| format!("service index {}", f.svc.svc_id));
    let proto = Protocol::from_number(f.key.proto).unwrap_or_default();
    let mut line = match ctx
        .source
        .model
        .as_ref()
        .and_then(|m| frontend_kind(m, dst, proto).map(|k| (m, k)))
    {
        Some((m, (kind, svc, port))) => format!(
            "{dst}/{proto} is the {kind} of service {svc} port {port} ({}; map name {name})",
            policy_words(m, &svc, kind)
        ),
        None => format!("{dst}/{proto} is a frontend of {name}"),
    };
    let flags = flag_words(f.svc.flags);
    if !flags.is_empty() {
        line.push_str(&format!("; {}", flags.join(", ")));
    }
    r.line("frontend", line);
}

/// The endpoints step: the backends in the frontend's slots, and (with a source) the
/// service's other endpoints and why the policies left them out.
fn endpoints_step(r: &mut Report, ctx: &Context, f: &Frontend, dst: SocketAddrV4) {
    let mut lines: Vec<String> = Vec::new();
    if f.slots.is_empty() {
        lines.push("none left: the frontend has no backends".into());
    }
    let mut kept = BTreeSet::new();
    for (slot, id, be) in &f.slots {
        match be {
            Some(b) => {
                kept.insert(sock(b.addr_be[0], b.port_be));
                lines.push(format!("slot {slot}: {}", backend_words(b)));
            }
            None => lines.push(format!("slot {slot}: backend index {id} is missing")),
        }
    }
    let proto = Protocol::from_number(f.key.proto).unwrap_or_default();
    if let Some(model) = ctx.source.model.as_ref()
        && let Some((kind, svc, _)) = frontend_kind(model, dst, proto)
    {
        let settings = NodeSettings {
            node_name: ctx.node_name.to_string(),
            ..NodeSettings::default()
        };
        let view = service_ports(model, &settings).into_iter().find(|v| {
            v.service.id == svc
                && v.port.protocol == proto
                && (v.port.port == dst.port() || v.node_port == Some(dst.port()))
        });
        let local_policy = kind != "ClusterIP" && f.key.scope == SCOPE_EXTERNAL;
        for ep in view.iter().flat_map(|v| v.endpoints.iter()) {
            let std::net::IpAddr::V4(ip) = ep.ip else {
                continue;
            };
            let target_port = f
                .slots
                .iter()
                .find_map(|(_, _, b)| b.map(|b| u16::from_be(b.port_be)))
                .unwrap_or(ep.port);
            if kept.contains(&SocketAddrV4::new(ip, target_port))
                || kept.contains(&SocketAddrV4::new(ip, ep.port))
            {
                continue;
            }
            let why = if !ep.ready && !ep.serving {
                "not ready"
            } else if ep.serving_terminating() {
                "terminating (a fallback only when no endpoint is ready)"
            } else if !ep.local
                && view.as_ref().is_some_and(|v| {
                    (local_policy && v.external_policy_local())
                        || (kind == "ClusterIP" && v.internal_policy_local())
                })
            {
                "on another node (traffic policy Local)"
            } else {
                "left out by topology hints for another zone or node"
            };
            lines.push(format!("left out: {ep} {why}"));
        }
    }
    r.step("endpoints", lines);
}

fn affinity_key(svc_id: u32, words: [u32; 2], family: u8) -> AffinityKey {
    AffinityKey {
        svc_id,
        client_be: [words[0], words[1], 0, 0],
        family,
        _pad0: 0,
        _pad1: 0,
    }
}

/// The affinity step as the live map has it (before the run).
fn affinity_before(
    svc: &SvcValue,
    key: &AffinityKey,
    live: Option<&AffinityValue>,
    state: &Desired,
) -> String {
    if svc.affinity_timeout_s == 0 {
        return "sessionAffinity None: every new flow picks a backend".into();
    }
    let timeout = svc.affinity_timeout_s;
    let Some(a) = live else {
        return format!(
            "sessionAffinity ClientIP ({timeout} s): miss, no entry for this client (key svc {} family {})",
            key.svc_id, key.family
        );
    };
    let idle = monotonic_coarse_ns().saturating_sub(a.last_seen_ns) / 1_000_000_000;
    let be = state
        .backends
        .get(&a.backend_id)
        .filter(|b| b.generation == a.backend_gen);
    match be {
        Some(b) if idle <= timeout as u64 => format!(
            "sessionAffinity ClientIP ({timeout} s): hit, this client went to {} {idle} s ago",
            show_backend(b)
        ),
        Some(b) => format!(
            "sessionAffinity ClientIP ({timeout} s): expired, {} was {idle} s ago",
            show_backend(b)
        ),
        None => format!(
            "sessionAffinity ClientIP ({timeout} s): stale, its backend index {} is gone",
            a.backend_id
        ),
    }
}

fn open_state(pins: &Path) -> Result<(Desired, NodeConfig), DatapathError> {
    let state = KernelMaps::open(pins)?.read()?;
    let cfg: aya::maps::Array<aya::maps::MapData, NodeConfig> = aya::maps::Array::try_from(
        open_pinned(pins, lb_common::MAP_CONFIG)?,
    )
    .map_err(|source| DatapathError::Map {
        name: lb_common::MAP_CONFIG,
        source,
    })?;
    let cfg = cfg.get(&0, 0).map_err(|source| DatapathError::Map {
        name: lb_common::MAP_CONFIG,
        source,
    })?;
    Ok((state, cfg))
}

/// Traces `req` through the datapath pinned at `ctx.pins` (see the module docs). Nothing
/// live is written.
pub fn trace(object: &[u8], ctx: &Context, req: &Resolved) -> Result<Report, DatapathError> {
    let (state, cfg) = open_state(ctx.pins)?;
    match req.src {
        Some(src) => trace_tc(object, ctx, req, src, &state),
        None => Ok(trace_connect(ctx, req, &state, &cfg)),
    }
}

fn reason_name(r: u32) -> &'static str {
    REASON_NAMES.get(r as usize).copied().unwrap_or("unknown")
}

fn trace_tc(
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
        let be = state.backends.get(&v.backend_id);
        let how = if run.affinity.iter().any(|a| a.before.is_some()) {
            "by the client's affinity entry".to_string()
        } else {
            format!("at random among {} slot(s)", f.slots.len())
        };
        r.line(
            "backend",
            format!(
                "{} chosen {how}",
                be.map_or_else(|| sock(v.daddr_be, v.dport_be).to_string(), backend_words)
            ),
        );
    }
    let mut rewrites = Vec::new();
    if run.verdict == TC_ACT_REDIRECT {
        rewrites.push(match before.as_ref().map(|p| p.protocol) {
            Some(Protocol::Udp) => {
                "answered: ICMP port unreachable back to the client (no endpoints: kube-proxy's REJECT)".to_string()
            }
            _ => "answered: TCP RST back to the client (no endpoints: kube-proxy's REJECT)".into(),
        });
    } else if let (Some(b), Some(a)) = (&before, &after) {
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
    if !rewrites.is_empty() {
        r.step("rewrite", rewrites);
    }
    let mut ct = run.conntrack.clone();
    ct.sort_by_key(|c| c.key.dir);
    let mut writes: Vec<String> = ct
        .iter()
        .map(|c| {
            format!(
                "{} conntrack {} {}:{} -> {}:{} => {} -> {}",
                if c.before.is_some() {
                    "would refresh"
                } else {
                    "would create"
                },
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
            if a.before.is_some() {
                "would refresh"
            } else {
                "would create"
            },
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
    r.step("state", writes);
    let dst = after.as_ref().map(|p| p.dst);
    let (verdict, outcome) = match run.verdict {
        TC_ACT_OK
            if after.as_ref().map(|p| (p.src, p.dst))
                != before.as_ref().map(|p| (p.src, p.dst)) =>
        {
            (
                "TC_ACT_OK: forwarded, rewritten".to_string(),
                dst.map_or("forwarded".into(), |d| d.to_string()),
            )
        }
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
    };
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

/// The node's own socket: what connect4 decides, computed from the live maps as the program
/// does (`sock.rs`): the kernel cannot test-run cgroup sock_addr programs.
fn trace_connect(ctx: &Context, req: &Resolved, state: &Desired, cfg: &NodeConfig) -> Report {
    let mut r = Report::new(format!(
        "xlb trace (datapath): {} -> {} {}",
        req.from, req.to, req.protocol
    ));
    r.line(
        "socket",
        format!(
            "connect({}) from the node: cgroup connect4 hook (xlb_connect4); computed from the live maps as the program decides (the kernel cannot test-run cgroup sock_addr programs); nothing is written",
            req.dst
        ),
    );
    let Some(outer) = frontend(state, svc_key(req.dst, req.protocol, SCOPE_EXTERNAL, 0)) else {
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
    let f = if outer.svc.flags & SVC_F_TWO_SCOPES != 0 {
        match frontend(state, svc_key(req.dst, req.protocol, SCOPE_INTERNAL, 0)) {
            Some(inner) => {
                r.line(
                    "scope",
                    "the node's own traffic uses the frontend's internal entries: every cluster endpoint (kube-proxy sends local-origin traffic to the cluster chain)",
                );
                inner
            }
            None => outer,
        }
    } else {
        outer
    };
    endpoints_step(&mut r, ctx, &f, req.dst);
    if f.svc.flags & SVC_F_SRC_RANGES != 0 {
        r.line(
            "source",
            "loadBalancerSourceRanges: an unbound socket is checked as the frontend address (allowed when a range holds a node address)",
        );
    }
    if f.svc.count == 0 {
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
        return r;
    }
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
    let remembered = live.filter(|a| {
        f.svc.affinity_timeout_s != 0
            && monotonic_coarse_ns().saturating_sub(a.last_seen_ns)
                <= f.svc.affinity_timeout_s as u64 * 1_000_000_000
            && f.slots.iter().any(|(slot, id, b)| {
                *slot == a.slot
                    && *id == a.backend_id
                    && b.is_some_and(|b| b.generation == a.backend_gen)
            })
    });
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
    let mut state_lines =
        vec!["a socket-map reverse entry for the socket (would create)".to_string()];
    if f.svc.affinity_timeout_s != 0 {
        state_lines.push(format!(
            "affinity for the node's namespace, service index {} (would {})",
            f.svc.svc_id,
            if live.is_some() { "refresh" } else { "create" }
        ));
    }
    r.step("state", state_lines);
    r.line("verdict", "connect() allowed, to the backend");
    r.line("counter", "sock_xlate +1 (would)");
    r.outcome = if choices.len() == 1 {
        choices[0]
            .trim_end_matches(&format!("/{}", req.protocol))
            .to_string()
    } else {
        format!(
            "one of {}",
            choices
                .iter()
                .map(|c| c.trim_end_matches(&format!("/{}", req.protocol)))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    r
}

fn affinity_entry(pins: &Path, key: &AffinityKey) -> Option<AffinityValue> {
    let map = open_pinned(pins, lb_common::MAP_AFFINITY).ok()?;
    let aff: aya::maps::HashMap<aya::maps::MapData, AffinityKey, AffinityValue> =
        aya::maps::HashMap::try_from(map).ok()?;
    aff.get(key, 0).ok()
}
