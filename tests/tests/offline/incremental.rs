//! Property test of the incremental control plane (`reconcile::Incremental`,
//! `datapath::sync::apply_touched`, `source::events`): random sequences of per-object events
//! (Services and EndpointSlices added, changed, deleted; node changes) are applied to a
//! model in place and the desired state is updated service by service. After every event the
//! incremental state must equal a full computation of the same model (up to the numbering of
//! indices), and the maps written only where the update says must equal the desired state.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr},
};

use lb_common::{Backend, SvcKey};
use lb_userspace::{
    datapath::{sync, writer::MemoryMaps},
    desired::{self, Desired, Limits, NodeContext, Tally},
    model::{
        Cidr, Endpoint, EndpointPort, EndpointSlice, Hints, LbAlgorithm, Model, Protocol, Service,
        ServicePort, ServiceRef, ServiceType, SessionAffinity, Topology, TrafficPolicy,
    },
    reconcile::{self, Ids, Incremental, Journal},
    source::events::{self, Event},
};
use proptest::prelude::*;

const SERVICES: u8 = 6;

fn sref(i: u8) -> ServiceRef {
    ServiceRef {
        namespace: "ns".into(),
        name: format!("s{i}").into(),
    }
}

/// A generated Service's form: ports, kind (ClusterIP, NodePort, LoadBalancer) and options.
#[derive(Clone, Copy, Debug)]
struct Shape {
    ports: u8,
    kind: u8,
    external: bool,
    local: bool,
    affinity: bool,
    ranges: bool,
    /// Dual-stack: an IPv6 ClusterIP too (slice 2 of each service is IPv6).
    dual: bool,
}

/// A generated change.
#[derive(Clone, Debug)]
enum Op {
    Service {
        i: u8,
        shape: Shape,
    },
    DeleteService(u8),
    Slice {
        i: u8,
        j: u8,
        endpoints: Vec<(u8, u8, bool)>,
    },
    DeleteSlice(u8, u8),
    Node {
        zone: bool,
        addresses: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..SERVICES, 1..3u8, 0..3u8, any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(i, ports, kind, external, local, affinity, ranges, dual)| Op::Service {
                i, shape: Shape { ports, kind, external, local, affinity, ranges, dual }
            }),
        1 => (0..SERVICES).prop_map(Op::DeleteService),
        6 => (0..SERVICES, 0..3u8, prop::collection::vec((0..12u8, 0..8u8, any::<bool>()), 0..6))
            .prop_map(|(i, j, endpoints)| Op::Slice { i, j, endpoints }),
        2 => (0..SERVICES, 0..3u8).prop_map(|(i, j)| Op::DeleteSlice(i, j)),
        1 => (any::<bool>(), 0..3u8).prop_map(|(zone, addresses)| Op::Node { zone, addresses }),
    ]
}

fn service(i: u8, shape: Shape) -> Service {
    let Shape {
        ports,
        kind,
        external,
        local,
        affinity,
        ranges,
        dual,
    } = shape;
    let service_type = match kind {
        0 => ServiceType::ClusterIp,
        1 => ServiceType::NodePort,
        _ => ServiceType::LoadBalancer,
    };
    let policy = |l| {
        if l {
            TrafficPolicy::Local
        } else {
            TrafficPolicy::Cluster
        }
    };
    Service {
        id: sref(i),
        cluster_ips: if dual {
            vec![
                IpAddr::V4(Ipv4Addr::new(10, 96, 0, i + 1)),
                IpAddr::V6(std::net::Ipv6Addr::new(
                    0xfd00,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    u16::from(i) + 1,
                )),
            ]
        } else {
            vec![IpAddr::V4(Ipv4Addr::new(10, 96, 0, i + 1))]
        }
        .into(),
        ports: (0..ports)
            .map(|p| ServicePort {
                name: format!("p{p}").into(),
                port: 80 + u16::from(p),
                protocol: if p == 1 { Protocol::Udp } else { Protocol::Tcp },
                node_port: (kind > 0).then_some(30000 + u16::from(i) * 10 + u16::from(p)),
            })
            .collect(),
        service_type,
        external_ips: if external {
            [IpAddr::V4(Ipv4Addr::new(192, 0, 2, i + 1))].into()
        } else {
            Box::default()
        },
        load_balancer_ips: if kind == 2 {
            [IpAddr::V4(Ipv4Addr::new(198, 51, 100, i + 1))].into()
        } else {
            Box::default()
        },
        load_balancer_source_ranges: if ranges && kind == 2 {
            ["203.0.113.0/24".parse::<Cidr>().expect("cidr")].into()
        } else {
            Box::default()
        },
        session_affinity: if affinity {
            SessionAffinity::ClientIp {
                timeout_seconds: 60,
            }
        } else {
            SessionAffinity::None
        },
        external_traffic_policy: policy(local),
        internal_traffic_policy: policy(local && affinity),
        health_check_node_port: None,
        // Every other Service picks by Maglev on its external frontends.
        lb_algorithm: i.is_multiple_of(2).then_some(LbAlgorithm::Maglev),
        uid: None,
    }
}

/// Endpoint `(ip, flags, zone hint)`: flags bit 0 ready, 1 serving, 2 terminating; the
/// address's low bit picks the node. Slice 2 of a service is IPv6.
fn slice(i: u8, j: u8, endpoints: &[(u8, u8, bool)]) -> EndpointSlice {
    EndpointSlice {
        name: format!("s{i}-{j}").into(),
        service: sref(i),
        ports: vec![
            EndpointPort {
                name: "p0".into(),
                port: 8080,
                protocol: Protocol::Tcp,
            },
            EndpointPort {
                name: "p1".into(),
                port: 5353,
                protocol: Protocol::Udp,
            },
        ]
        .into(),
        endpoints: endpoints
            .iter()
            .map(|&(ip, flags, hint)| Endpoint {
                address: if j == 2 {
                    IpAddr::V6(std::net::Ipv6Addr::new(
                        0xfd00,
                        0x244,
                        0,
                        0,
                        0,
                        0,
                        0,
                        u16::from(ip) + 1,
                    ))
                } else {
                    IpAddr::V4(Ipv4Addr::new(10, 244, 0, ip + 1))
                },
                ready: flags & 1 != 0,
                serving: flags & 2 != 0,
                terminating: flags & 4 != 0,
                topology: Topology {
                    node_name: Some(if ip % 2 == 0 { "node-a" } else { "node-b" }.into()),
                    zone: Some("z1".into()),
                    hints: Hints {
                        zones: if hint { vec!["z1".into()] } else { Vec::new() },
                        nodes: Vec::new(),
                    },
                }
                .shared(),
            })
            .collect(),
    }
}

fn node(zone: bool, addresses: u8, socket_lb: bool) -> NodeContext {
    // Each IPv4 NodePort address has an IPv6 one beside it (a dual-stack node).
    let addrs: Vec<std::net::IpAddr> = (0..addresses)
        .flat_map(|a| {
            let v6 = std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, u16::from(a) + 1);
            [Ipv4Addr::new(192, 168, 0, a + 1).into(), v6.into()]
        })
        .collect();
    let mut c = NodeContext::new("node-a", &addrs, socket_lb);
    c.node.zone = zone.then(|| "z1".to_string());
    c.lb.maglev_size = 251;
    c
}

/// One frontend as the datapath sees it, without indices: its entry (count, flags,
/// affinity), its name, its backends in slot order (without generations), its ranges, its
/// Maglev table.
type Shown = (
    u16,
    u16,
    u32,
    String,
    Vec<Backend>,
    Vec<(IpAddr, u8)>,
    Option<Vec<u16>>,
);

fn canonical(d: &Desired) -> BTreeMap<SvcKey, Shown> {
    d.services
        .iter()
        .map(|(k, v)| {
            assert_eq!(v.slots.len(), v.count as usize, "{k:?}");
            let backends = v
                .slots
                .iter()
                .map(|id| Backend {
                    generation: 0,
                    ..d.backends[id]
                })
                .collect();
            let ranges = d
                .src_ranges
                .iter()
                .filter(|r| r.svc_id == v.svc_id)
                .map(|r| (r.addr, r.prefix))
                .collect();
            let name = d.names[&v.svc_id].to_string();
            let maglev = (v.flags & lb_common::SVC_F_MAGLEV != 0).then(|| {
                d.maglev
                    .get(&v.svc_id)
                    .map(|t| t.slots.to_vec())
                    .unwrap_or_default()
            });
            (
                *k,
                (
                    v.count,
                    v.flags,
                    v.affinity_timeout_s,
                    name,
                    backends,
                    ranges,
                    maglev,
                ),
            )
        })
        .collect()
}

/// What holds for any desired state: every slot names a backend and every backend is
/// named; names exactly for the ids in use; every live address in the filter.
fn consistent(d: &Desired) {
    let used: std::collections::BTreeSet<u32> = d
        .services
        .values()
        .flat_map(|v| v.slots.iter().copied())
        .collect();
    assert_eq!(
        used,
        d.backends.keys().copied().collect(),
        "backends = those named"
    );
    let ids: std::collections::BTreeSet<u32> = d.services.values().map(|v| v.svc_id).collect();
    assert_eq!(ids, d.names.keys().copied().collect(), "names = ids in use");
    let flagged: std::collections::BTreeSet<u32> = d
        .services
        .iter()
        .filter(|(_, v)| v.flags & lb_common::SVC_F_MAGLEV != 0)
        .map(|(_, v)| v.svc_id)
        .collect();
    assert_eq!(
        flagged,
        d.maglev.keys().copied().collect(),
        "Maglev tables = frontends flagged"
    );
    assert!(
        desired::live_filter_bits(d, lb_common::FilterSize::DEFAULT).is_subset(&d.filter),
        "live filter bits set"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn incremental_updates_equal_a_full_computation(
        ops in prop::collection::vec(op(), 1..40),
        socket_lb in any::<bool>(),
    ) {
        let limits = Limits::default();
        let mut model = Model::default();
        let mut ctx = node(false, 1, socket_lb);
        let mut ids = Ids::default();
        let mut engine = Incremental::default();
        engine.full(&model, &ctx, &mut ids, limits);
        let mut maps = MemoryMaps::default();
        for op in ops {
            let mut full = false;
            let event = match op {
                Op::Service { i, shape } => Some(Event::Service {
                    id: sref(i),
                    service: Some(Box::new(service(i, shape))),
                }),
                Op::DeleteService(i) => Some(Event::Service { id: sref(i), service: None }),
                Op::Slice { i, j, endpoints } => Some(Event::Slice {
                    service: sref(i),
                    name: format!("s{i}-{j}").into(),
                    slice: Some(Box::new(slice(i, j, &endpoints))),
                }),
                Op::DeleteSlice(i, j) => Some(Event::Slice {
                    service: sref(i),
                    name: format!("s{i}-{j}").into(),
                    slice: None,
                }),
                Op::Node { zone, addresses } => {
                    ctx = node(zone, addresses, socket_lb);
                    full = true;
                    None
                }
            };
            // No programmed copy: a full computation applies against the desired state it
            // replaces, an update against the journal of what it changed.
            let (touched, mut programmed) = if full {
                let before = engine.full(&model, &ctx, &mut ids, limits);
                (sync::everything(&before, engine.desired()), before)
            } else {
                let changed = event.and_then(|e| events::apply(&mut model, e));
                let touched = engine.update(&model, &ctx, &mut ids, limits, changed);
                let programmed = engine.programmed_before(&touched);
                (touched, programmed)
            };
            // The journal's view is what the maps hold of what the update touched.
            prop_assert_eq!(&programmed, &Journal::default().programmed(&maps.state, &touched));
            let inc = engine.desired().clone();
            consistent(&inc);
            prop_assert_eq!(
                engine.frontends(),
                inc.services.len()
            );
            // The fill metrics' running totals are a count of the state.
            prop_assert_eq!(engine.tally(), Tally::recount(&inc));
            let (want, want_errors) = desired::compute_on(&model, &ctx, &mut Ids::default(), limits);
            prop_assert_eq!(canonical(&inc), canonical(&want));
            let mut got_errors: Vec<String> = engine.problems().map(|e| e.to_string()).collect();
            let mut want_errors: Vec<String> = want_errors.iter().map(|e| e.to_string()).collect();
            got_errors.sort();
            want_errors.sort();
            prop_assert_eq!(got_errors, want_errors);
            // Writing only what the update touched brings the maps to the desired state.
            let report = sync::apply_touched(&mut maps, &mut programmed, &inc, &touched);
            prop_assert!(report.errors.is_empty());
            prop_assert_eq!(&programmed, &Journal::default().programmed(&inc, &touched));
            prop_assert_eq!(&maps.state, &inc);
        }
        // A full computation with the same indices gives exactly the same state.
        let before = engine.desired().clone();
        engine.full(&model, &ctx, &mut ids, limits);
        prop_assert_eq!(canonical(engine.desired()), canonical(&before));
        prop_assert_eq!(engine.tally(), Tally::recount(&before));
        // The indices found their backends in the engine's state: their own copies back.
        ids.unlend(&engine.desired().backends);
        let (again, _) = reconcile::recompute(&model, &ctx, &mut ids, limits);
        prop_assert_eq!(&again.services, &before.services);
        prop_assert_eq!(&again.backends, &before.backends);
    }
}

/// Two services claim one external IP: the first keeps it; when it lets it go, the other
/// takes it, without a full computation.
#[test]
fn a_frontend_freed_by_its_owner_goes_to_the_service_waiting_for_it() {
    let limits = Limits::default();
    let ctx = node(false, 0, false);
    let mut ids = Ids::default();
    let mut engine = Incremental::default();
    let mut model = Model::default();
    let shape = Shape {
        ports: 1,
        kind: 0,
        external: true,
        local: false,
        affinity: false,
        ranges: false,
        dual: false,
    };
    let mut a = service(0, shape);
    let mut b = service(1, shape);
    b.external_ips = a.external_ips.clone();
    for (svc, s) in [(&a, 0), (&b, 1)] {
        model.upsert_service(svc.clone());
        model.upsert_slice(slice(s, 0, &[(s, 1, false)]));
    }
    engine.full(&model, &ctx, &mut ids, limits);
    let ext = lb_common::user::frontend_key(Ipv4Addr::new(192, 0, 2, 1), 80, Protocol::Tcp);
    let owner = |e: &Incremental| canonical(e.desired()).get(&ext).map(|s| s.4.clone());
    // 10.244.0.1 is on this node (node-a), 10.244.0.2 on node-b.
    let backend = |n: u8| {
        let ip = Ipv4Addr::new(10, 244, 0, n + 1);
        vec![if n == 0 {
            lb_common::user::backend_value(ip, 8080, Protocol::Tcp)
        } else {
            lb_common::user::remote_backend_value(ip, 8080, Protocol::Tcp)
        }]
    };
    assert_eq!(owner(&engine), Some(backend(0)), "s0 owns it");
    assert!(
        engine
            .problems()
            .any(|p| p.to_string().contains("already used"))
    );
    a.external_ips = Box::default();
    events::apply(
        &mut model,
        Event::Service {
            id: sref(0),
            service: Some(Box::new(a)),
        },
    );
    let touched = engine.update(&model, &ctx, &mut ids, limits, [sref(0)]);
    assert!(touched.frontends.contains(&ext));
    assert_eq!(owner(&engine), Some(backend(1)), "s1 took it over");
    assert!(
        !engine
            .problems()
            .any(|p| p.to_string().contains("already used"))
    );
}
