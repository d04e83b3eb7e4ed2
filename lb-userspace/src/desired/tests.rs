//! The desired state of one service on a node: what each kind of frontend, policy and
//! endpoint set programs.

use std::net::{IpAddr, Ipv4Addr};

use lb_common::{
    BE_F_REMOTE, FAMILY_V6, SCOPE_INTERNAL, SVC_F_DROP_EMPTY, SVC_F_SNAT_REMOTE, SVC_F_TWO_SCOPES,
    SvcKey,
};

use lb_common::user::{frontend_key, show_frontend, words_addr};

use super::*;
use crate::{model::Protocol, reconcile::Ids, source::file};

const NODE: &str = "node-a";
const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 1, 10);

/// One Service `ns/web` (its `spec` lines as given) and, unless `endpoints` is none, its
/// slice: each endpoint `(ip, node)`, ready, on port 8080 named `p`.
fn yaml(spec: &str, endpoints: Option<&[(&str, &str)]>) -> String {
    let mut y = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{namespace: ns, name: web}}\nspec:\n{spec}\n"
    );
    if let Some(eps) = endpoints {
        let v6 = eps.first().is_some_and(|(ip, _)| ip.contains(':'));
        y.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{namespace: ns, name: web-{}, labels: {{kubernetes.io/service-name: web}}}}\naddressType: {}\nports: [{{name: p, port: 8080, protocol: TCP}}]\nendpoints:\n",
            if v6 { "v6" } else { "v4" },
            if v6 { "IPv6" } else { "IPv4" },
        ));
        for (ip, node) in eps {
            y.push_str(&format!(
                "- {{addresses: [\"{ip}\"], nodeName: {node}, conditions: {{ready: true}}}}\n"
            ));
        }
    }
    y
}

/// The desired state of `yaml` on NODE (NodePorts on NODE_IP), socket hooks as given.
fn on_node(yaml: &str, socket_lb: bool) -> (Desired, Vec<DesiredError>) {
    on_node_at(yaml, &[NODE_IP.into()], socket_lb)
}

/// [`on_node`] with NodePorts on `addrs`.
fn on_node_at(yaml: &str, addrs: &[IpAddr], socket_lb: bool) -> (Desired, Vec<DesiredError>) {
    let loaded = file::parse("t.yaml", yaml).expect("yaml");
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    let node = NodeContext::new(NODE, addrs, socket_lb);
    compute_on(&loaded.model, &node, &mut Ids::default(), Limits::default())
}

/// The frontend entry at `ip:port`/TCP, external scope.
fn entry(d: &Desired, ip: impl Into<IpAddr>, port: u16) -> SvcValue {
    let key = frontend_key(ip, port, Protocol::Tcp);
    d.services
        .get(&key)
        .unwrap_or_else(|| panic!("no frontend {}: {:?}", show_frontend(&key), d.services))
        .value
}

/// The backends in the slots of the entry at `key`, as `ip` strings, in slot order.
fn slot_ips(d: &Desired, key: SvcKey) -> Vec<String> {
    d.services[&key]
        .slots
        .iter()
        .map(|id| {
            let b = d.backends[id];
            words_addr(b.addr_be, b.family).to_string()
        })
        .collect()
}

const TWO: &[(&str, &str)] = &[("10.244.0.1", NODE), ("10.244.1.1", "node-b")];

#[test]
fn a_cluster_ip_has_an_entry_a_slot_per_endpoint_and_its_name() {
    let (d, errors) = on_node(
        &yaml(
            "  clusterIP: 10.96.0.1\n  ports: [{name: p, port: 80, protocol: TCP}]",
            Some(TWO),
        ),
        false,
    );
    assert!(errors.is_empty(), "{errors:?}");
    let e = entry(&d, Ipv4Addr::new(10, 96, 0, 1), 80);
    assert_eq!((e.count, e.flags, e.affinity_timeout_s), (2, 0, 0));
    let key = frontend_key(Ipv4Addr::new(10, 96, 0, 1), 80, Protocol::Tcp);
    assert_eq!(slot_ips(&d, key), ["10.244.0.1", "10.244.1.1"]);
    assert_eq!(&*d.names[&e.svc_id], "ns/web:p");
    // Only the ClusterIP: one entry, its two slots in a range of the slot array.
    assert_eq!(d.services.len(), 1);
    assert_eq!(d.services[&key].slots.len(), 2);
    let remote: Vec<bool> = d
        .backends
        .values()
        .map(|b| b.flags & BE_F_REMOTE != 0)
        .collect();
    assert_eq!(
        remote.iter().filter(|r| **r).count(),
        1,
        "one endpoint is on node-b"
    );
}

#[test]
fn a_node_port_is_served_on_the_node_addresses_and_with_socket_hooks_on_loopback() {
    let spec = "  type: NodePort\n  clusterIP: 10.96.0.1\n  ports: [{name: p, port: 80, nodePort: 30080, protocol: TCP}]";
    let (d, errors) = on_node(&yaml(spec, Some(TWO)), false);
    assert!(errors.is_empty(), "{errors:?}");
    let np = entry(&d, NODE_IP, 30080);
    assert_eq!(np.count, 2);
    // Cluster policy: flows to a remote backend are SNATed to the node.
    assert_eq!(np.flags, SVC_F_SNAT_REMOTE);
    // Each frontend has its own index (its counters), its object name says which it is.
    let cluster = entry(&d, Ipv4Addr::new(10, 96, 0, 1), 80);
    assert_ne!(np.svc_id, cluster.svc_id);
    assert_eq!(
        &*d.names[&np.svc_id],
        format!("ns/web:p (nodePort {NODE_IP})")
    );
    let lo = frontend_key(Ipv4Addr::LOCALHOST, 30080, Protocol::Tcp);
    assert!(
        !d.services.contains_key(&lo),
        "no loopback without the hooks"
    );
    let (d, _) = on_node(&yaml(spec, Some(TWO)), true);
    assert_eq!(entry(&d, Ipv4Addr::LOCALHOST, 30080).count, 2);
}

#[test]
fn local_policy_takes_this_nodes_endpoints_and_drops_when_there_are_none() {
    let spec = "  type: NodePort\n  clusterIP: 10.96.0.1\n  externalTrafficPolicy: Local\n  ports: [{name: p, port: 80, nodePort: 30080, protocol: TCP}]";
    let (d, _) = on_node(&yaml(spec, Some(TWO)), false);
    let np = entry(&d, NODE_IP, 30080);
    let key = frontend_key(NODE_IP, 30080, Protocol::Tcp);
    assert_eq!(slot_ips(&d, key), ["10.244.0.1"]);
    assert_eq!(
        np.flags & SVC_F_SNAT_REMOTE,
        0,
        "Local keeps the client's source"
    );
    // The ClusterIP follows internalTrafficPolicy (Cluster): both endpoints.
    assert_eq!(entry(&d, Ipv4Addr::new(10, 96, 0, 1), 80).count, 2);
    // With the socket hooks: a second, internal scope for the node's own sockets with
    // every cluster endpoint.
    let (d, _) = on_node(&yaml(spec, Some(TWO)), true);
    assert_ne!(entry(&d, NODE_IP, 30080).flags & SVC_F_TWO_SCOPES, 0);
    let internal = SvcKey {
        scope: SCOPE_INTERNAL,
        ..key
    };
    assert_eq!(d.services[&internal].count, 2);
    // No endpoint on this node: the entry drops.
    let remote_only: &[(&str, &str)] = &[("10.244.1.1", "node-b")];
    let (d, _) = on_node(&yaml(spec, Some(remote_only)), false);
    let np = entry(&d, NODE_IP, 30080);
    assert_eq!(
        (np.count, np.flags & SVC_F_DROP_EMPTY),
        (0, SVC_F_DROP_EMPTY)
    );
}

#[test]
fn a_service_without_endpoints_is_programmed_empty_and_reported() {
    let spec = "  clusterIP: 10.96.0.1\n  ports: [{name: p, port: 80, protocol: TCP}]";
    let (d, errors) = on_node(&yaml(spec, None), false);
    assert_eq!(
        errors,
        [DesiredError::NoEndpointSlice {
            object: "ns/web".into()
        }]
    );
    let e = entry(&d, Ipv4Addr::new(10, 96, 0, 1), 80);
    // Count 0 and no drop flag: connections are refused, as kube-proxy's REJECT.
    assert_eq!((e.count, e.flags), (0, 0));
    assert!(d.backends.is_empty());
    // An empty slice: no error, still refused.
    let (d, errors) = on_node(&yaml(spec, Some(&[])), false);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(entry(&d, Ipv4Addr::new(10, 96, 0, 1), 80).count, 0);
}

#[test]
fn client_ip_affinity_carries_its_timeout() {
    let spec = "  clusterIP: 10.96.0.1\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}\n  ports: [{name: p, port: 80, protocol: TCP}]";
    let (d, _) = on_node(&yaml(spec, Some(TWO)), false);
    assert_eq!(
        entry(&d, Ipv4Addr::new(10, 96, 0, 1), 80).affinity_timeout_s,
        60
    );
    let spec = "  clusterIP: 10.96.0.1\n  sessionAffinity: ClientIP\n  ports: [{name: p, port: 80, protocol: TCP}]";
    let (d, _) = on_node(&yaml(spec, Some(TWO)), false);
    assert_eq!(
        entry(&d, Ipv4Addr::new(10, 96, 0, 1), 80).affinity_timeout_s,
        crate::model::DEFAULT_AFFINITY_TIMEOUT_SECONDS
    );
}

#[test]
fn a_dual_stack_service_gets_each_familys_cluster_ip_with_that_familys_endpoints() {
    let spec = "  type: NodePort\n  clusterIP: 10.96.0.1\n  clusterIPs: [10.96.0.1, \"fd00::1\"]\n  ipFamilies: [IPv4, IPv6]\n  ports: [{name: p, port: 80, nodePort: 30080, protocol: TCP}]";
    let mut y = yaml(spec, Some(TWO));
    let v6 = yaml("", Some(&[("fd00:244::1", NODE)]));
    // The IPv6 slice alone (its Service document is the first one).
    y.push_str(&v6[v6.find("---").expect("a slice")..]);
    let node6: IpAddr = "2001:db8::5".parse().expect("ip");
    let (d, errors) = on_node_at(&y, &[NODE_IP.into(), node6], true);
    let v6_ip: IpAddr = "fd00::1".parse().expect("ip");
    let v6_entry = entry(&d, v6_ip, 80);
    assert_eq!(v6_entry.count, 1);
    let key = frontend_key(v6_ip, 80, Protocol::Tcp);
    assert_eq!(key.family, FAMILY_V6);
    assert_eq!(slot_ips(&d, key), ["fd00:244::1"]);
    let v4_key = frontend_key(Ipv4Addr::new(10, 96, 0, 1), 80, Protocol::Tcp);
    assert_eq!(slot_ips(&d, v4_key), ["10.244.0.1", "10.244.1.1"]);
    // Each family is its own service port (index), named alike.
    let v4_entry = entry(&d, Ipv4Addr::new(10, 96, 0, 1), 80);
    assert_ne!(v4_entry.svc_id, v6_entry.svc_id);
    // Each family's NodePort on that family's node address, with that family's endpoints;
    // 127.0.0.1 serves the IPv4 one to the node's sockets, ::1 none (as kube-proxy).
    assert_eq!(errors, []);
    assert_eq!(entry(&d, NODE_IP, 30080).count, 2);
    assert_eq!(
        slot_ips(&d, frontend_key(node6, 30080, Protocol::Tcp)),
        ["fd00:244::1"]
    );
    let lo6 = frontend_key(
        IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
        30080,
        Protocol::Tcp,
    );
    assert!(!d.services.contains_key(&lo6));
    assert_eq!(entry(&d, Ipv4Addr::LOCALHOST, 30080).count, 2);
}

/// A dual-stack LoadBalancer `ns/web` (LoadBalancer IPs 203.0.113.9 and 2001:db8:100::9)
/// with `ranges`, one endpoint per family on this node.
fn dual_stack_lb(ranges: &str) -> String {
    let spec = format!(
        "  type: LoadBalancer\n  clusterIP: 10.96.0.1\n  clusterIPs: [10.96.0.1, \"fd00::1\"]\n  ipFamilies: [IPv4, IPv6]\n  loadBalancerSourceRanges: {ranges}\n  ports: [{{name: p, port: 80, nodePort: 30080, protocol: TCP}}]\nstatus:\n  loadBalancer:\n    ingress: [{{ip: 203.0.113.9}}, {{ip: \"2001:db8:100::9\"}}]"
    );
    let mut y = yaml(&spec, Some(&[("10.244.0.1", NODE)]));
    let v6 = yaml("", Some(&[("fd00:244::1", NODE)]));
    y.push_str(&v6[v6.find("---").expect("a slice")..]);
    y
}

const LB4: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 9);
const LB6: std::net::Ipv6Addr = std::net::Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 9);

/// The ranges the entry at `ip`:80 admits (`addr/prefix`), if it is flagged for ranges.
fn ranges_of(d: &Desired, ip: impl Into<IpAddr>) -> Option<Vec<String>> {
    let v = entry(d, ip, 80);
    (v.flags & lb_common::SVC_F_SRC_RANGES != 0).then(|| {
        d.src_ranges
            .iter()
            .filter(|r| r.svc_id == v.svc_id)
            .map(|r| format!("{}/{}", r.addr, r.prefix))
            .collect()
    })
}

#[test]
fn each_familys_load_balancer_ip_admits_that_familys_source_ranges() {
    let y = dual_stack_lb(r#"["2001:db8:1::/48", "10.0.0.0/8", "2001:db8:2::1/64"]"#);
    let node6: IpAddr = "fd00:192::1".parse().expect("ip");
    let (d, errors) = on_node_at(&y, &[NODE_IP.into(), node6], false);
    assert_eq!(errors, []);
    assert_eq!(
        ranges_of(&d, LB6),
        Some(vec!["2001:db8:1::/48".into(), "2001:db8:2::/64".into()])
    );
    assert_eq!(ranges_of(&d, LB4), Some(vec!["10.0.0.0/8".into()]));
    // The ClusterIPs and NodePorts of either family admit everyone.
    for ip in [
        IpAddr::from(Ipv4Addr::new(10, 96, 0, 1)),
        "fd00::1".parse().expect("ip"),
    ] {
        assert_eq!(ranges_of(&d, ip), None, "{ip}");
    }
    let np6 = &d.services[&frontend_key(node6, 30080, Protocol::Tcp)];
    assert_eq!(np6.flags & lb_common::SVC_F_SRC_RANGES, 0);
    // Each range is in the trie of its family.
    let maps: BTreeSet<&str> = d.src_ranges.iter().map(SrcRange::map).collect();
    assert_eq!(
        maps,
        BTreeSet::from([lb_common::MAP_SRC_RANGE, lb_common::MAP_SRC_RANGE6])
    );
}

#[test]
fn a_node_address_inside_an_ipv6_range_admits_the_load_balancer_ip_itself() {
    let y = dual_stack_lb(r#"["2001:db8:1::/48", "10.0.0.0/8"]"#);
    let node6: IpAddr = "2001:db8:1::5".parse().expect("ip");
    let (d, errors) = on_node_at(&y, &[NODE_IP.into(), node6], false);
    assert_eq!(errors, []);
    assert_eq!(
        ranges_of(&d, LB6),
        Some(vec!["2001:db8:1::/48".into(), "2001:db8:100::9/128".into()])
    );
    // NODE_IP is outside 10.0.0.0/8: the IPv4 LoadBalancer IP is not added.
    assert_eq!(ranges_of(&d, LB4), Some(vec!["10.0.0.0/8".into()]));
}

#[test]
fn ipv4_ranges_alone_leave_the_ipv6_load_balancer_ip_open_as_kube_proxy() {
    let (d, errors) = on_node(&dual_stack_lb(r#"["10.0.0.0/8"]"#), false);
    assert_eq!(errors, []);
    assert_eq!(ranges_of(&d, LB4), Some(vec!["10.0.0.0/8".into()]));
    assert_eq!(ranges_of(&d, LB6), None, "no IPv6 firewall: every client");
}

#[test]
fn a_full_ipv6_range_trie_refuses_the_frontend_and_keeps_the_ipv4_one() {
    let loaded = file::parse(
        "t.yaml",
        &dual_stack_lb(r#"["2001:db8:1::/48", "2001:db8:2::/48", "10.0.0.0/8"]"#),
    )
    .expect("yaml");
    let limits = Limits {
        src_ranges: 2,
        src_ranges6: 1,
        ..Limits::default()
    };
    let node = NodeContext::new(NODE, &[NODE_IP.into()], false);
    let (d, errors) = compute_on(&loaded.model, &node, &mut Ids::default(), limits);
    assert_eq!(
        errors,
        [DesiredError::MapFull {
            object: "ns/web:p (LoadBalancer 2001:db8:100::9)".into(),
            map: lb_common::MAP_SRC_RANGE6,
            capacity: 1,
            needed: 2,
        }]
    );
    assert!(
        !d.services
            .contains_key(&frontend_key(LB6, 80, Protocol::Tcp))
    );
    assert_eq!(ranges_of(&d, LB4), Some(vec!["10.0.0.0/8".into()]));
    assert!(d.src_ranges.iter().all(|r| r.addr.is_ipv4()));
}

#[test]
fn a_node_with_ipv6_turned_off_programs_the_ipv4_side_and_names_each_ipv6_port() {
    let loaded = crate::source::file::parse("t.yaml", &dual_stack_lb("[]")).expect("yaml");
    let mut node = NodeContext::new(NODE, &[NODE_IP.into()], false);
    node.ipv6_off = Some("net.ipv6.conf.all.disable_ipv6 = 1");
    let (d, errors) = compute_on(&loaded.model, &node, &mut Ids::default(), Limits::default());
    assert_eq!(
        errors,
        [DesiredError::NoIpv6 {
            object: "ns/web:p".into(),
            why: "net.ipv6.conf.all.disable_ipv6 = 1",
        }]
    );
    assert_eq!(
        errors[0].to_string(),
        "Service ns/web:p: the node has IPv6 turned off (net.ipv6.conf.all.disable_ipv6 = 1); its IPv6 frontends are skipped"
    );
    assert!(
        d.services.keys().all(|k| k.family != FAMILY_V6),
        "{}",
        d.dump()
    );
    assert!(
        d.services
            .contains_key(&frontend_key(LB4, 80, Protocol::Tcp))
    );
    assert!(d.services.contains_key(&frontend_key(
        Ipv4Addr::new(10, 96, 0, 1),
        80,
        Protocol::Tcp
    )));
}

/// A ClusterIP Service (10.96.0.10:80/TCP) with three endpoints on this node, parsed, and
/// the node.
fn three_endpoints_on_this_node() -> (crate::source::Snapshot, NodeContext) {
    let loaded = file::parse(
        "t.yaml",
        &yaml(
            "  clusterIP: 10.96.0.10\n  ports: [{name: p, port: 80, protocol: TCP}]",
            Some(&[("10.1.0.1", NODE), ("10.1.0.2", NODE), ("10.1.0.3", NODE)]),
        ),
    )
    .expect("yaml");
    (loaded, NodeContext::new(NODE, &[NODE_IP.into()], false))
}

/// A Service whose backends outgrow a full slot array (a scale-up) keeps serving with the
/// first ones that fit, named in a MapFull problem; with no room for its entry in the
/// service map, or for a single slot, it is left out, as before.
#[test]
fn a_frontend_whose_backends_outgrow_the_slot_array_keeps_the_first_that_fit() {
    let (loaded, node) = three_endpoints_on_this_node();
    let at = |svc_entries, slots| {
        let limits = Limits {
            svc_entries,
            slots,
            ..Limits::default()
        };
        compute_on(&loaded.model, &node, &mut Ids::default(), limits)
    };
    let (d, errors) = at(1, 2);
    assert_eq!(
        errors,
        [DesiredError::MapFullPartly {
            object: "ns/web:p".into(),
            map: lb_common::MAP_SLOT,
            capacity: 2,
            needed: 3,
            count: 3,
            kept: 2,
        }]
    );
    assert_eq!(entry(&d, Ipv4Addr::new(10, 96, 0, 10), 80).count, 2);
    let addrs: Vec<String> = d
        .backends
        .values()
        .map(|b| words_addr(b.addr_be, b.family).to_string())
        .collect();
    assert_eq!(
        addrs,
        ["10.1.0.1", "10.1.0.2"],
        "the first two, in the slice's order"
    );
    assert_eq!(d.services.len(), 1);

    for (svc_entries, slots, map) in [(0, 8, lb_common::MAP_SVC), (1, 0, lb_common::MAP_SLOT)] {
        let (d, errors) = at(svc_entries, slots);
        assert!(d.services.is_empty(), "{:?}", d.services);
        assert!(
            matches!(&errors[..], [DesiredError::MapFull { map: m, .. }] if *m == map),
            "{errors:?}"
        );
    }
}

/// A frontend whose backends get indices only in part (the backend array has no index left
/// for the rest) serves with the first that got one, named in a MapFullPartly problem,
/// rather than being left out whole.
#[test]
fn a_frontend_short_of_backend_indices_keeps_the_first_that_got_one() {
    let (loaded, node) = three_endpoints_on_this_node();
    // Backend indices 1..3: two of them.
    let limits = Limits {
        backends: 3,
        ..Limits::default()
    };
    let (d, errors) = compute_on(&loaded.model, &node, &mut Ids::default(), limits);
    assert_eq!(
        errors,
        [DesiredError::MapFullPartly {
            object: "ns/web:p".into(),
            map: lb_common::MAP_BACKEND,
            capacity: 3,
            needed: 1,
            count: 3,
            kept: 2,
        }]
    );
    let key = frontend_key(Ipv4Addr::new(10, 96, 0, 10), 80, Protocol::Tcp);
    assert_eq!(slot_ips(&d, key), ["10.1.0.1", "10.1.0.2"]);
}

#[test]
fn a_frontend_name_splits_into_service_and_port_whatever_its_address() {
    assert_eq!(service_port_of("ns/web:http"), ("ns/web", "http"));
    assert_eq!(
        service_port_of("ns/web:80 (nodePort 10.0.0.1)"),
        ("ns/web", "80")
    );
    // An IPv6 frontend's suffix holds colons; the port is still the name's.
    assert_eq!(
        service_port_of("ns/web:http (nodePort fd00::1)"),
        ("ns/web", "http")
    );
    assert_eq!(
        service_port_of("ns/web:dns (LoadBalancer 2001:db8::53)"),
        ("ns/web", "dns")
    );
    assert_eq!(
        service_port_name("ns/web:http (externalIP fd00::7)"),
        "ns/web:http"
    );
    assert_eq!(service_port_of("ns/web"), ("ns/web", ""));
}
