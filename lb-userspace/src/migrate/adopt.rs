//! A flow kube-proxy translated, as xlb's datapath would hold it had it begun the flow: the
//! kernel's conntrack entry (client → frontend, answered by a backend, maybe masqueraded)
//! turned into xlb's assured conntrack entries — forward and reply, and for a masqueraded
//! flow the egress pair tc egress restores its source from — with kube-proxy's backend and
//! its masquerade address and port, so the flow's next packet finds its entry and goes on
//! to the same backend.

use std::net::IpAddr;

use lb_common::{
    AffinityKey, AffinityValue, CT_DIR_FORWARD, CT_DIR_REPLY, CT_DIR_SNAT_OUT, CT_F_ASSURED,
    CT_F_CLOSING, CT_F_PORT_IN, CT_F_REPLIED, CT_F_SNAT, CtKey, CtKey6, CtValue, CtValue6,
    SCOPE_EXTERNAL, SvcKey,
    user::{addr_words, affinity_key, frontend_key},
};

use crate::{datapath::kernel_ct::KernelFlow, desired::Desired};

/// Why a kernel flow is not taken over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Skip {
    /// Nothing translated its destination: not a service's flow.
    NotTranslated,
    /// Its destination is no frontend xlb serves.
    NotAFrontend,
    /// Its backend is not one of the frontend's backends now.
    NotABackend,
    /// Its tuples mix the families (the kernel never reports such a flow).
    MixedFamilies,
}

/// An adopted flow's entries in the layout of its family's conntrack tables
/// (`XLB_CTA_V1` or `XLB_CTA6_V1`).
#[derive(Clone, Debug, PartialEq)]
pub enum Entries {
    V4(Vec<(CtKey, CtValue)>),
    V6(Vec<(CtKey6, CtValue6)>),
}

/// What xlb keeps of a flow kube-proxy translated.
#[derive(Clone, Debug, PartialEq)]
pub struct Adopted {
    pub conntrack: Entries,
    /// For a ClientIP-affinity Service: the client's affinity entry (`XLB_AFF_V2`) with
    /// the flow's backend, so the client's next connections go where kube-proxy's
    /// affinity would have sent them.
    pub affinity: Option<(AffinityKey, AffinityValue)>,
}

/// The IPv4 layout of an entry computed in the IPv6 one (addresses in word 0).
fn narrow((k, v): (CtKey6, CtValue6)) -> (CtKey, CtValue) {
    (
        CtKey {
            saddr_be: k.saddr_be[0],
            daddr_be: k.daddr_be[0],
            sport_be: k.sport_be,
            dport_be: k.dport_be,
            proto: k.proto,
            dir: k.dir,
            _pad: 0,
        },
        CtValue {
            saddr_be: v.saddr_be[0],
            daddr_be: v.daddr_be[0],
            sport_be: v.sport_be,
            dport_be: v.dport_be,
            backend_id: v.backend_id,
            backend_gen: v.backend_gen,
            svc_id: v.svc_id,
            flags: v.flags,
            mtu: v.mtu,
            pending: 0,
            created_ns: v.created_ns,
            last_seen_ns: v.last_seen_ns,
        },
    )
}

/// xlb's conntrack entries for kernel flow `f` to a frontend of `d`, stamped `now_ns`
/// (`CLOCK_MONOTONIC_COARSE`), in the layout of the flow's family.
pub fn adopt(f: &KernelFlow, d: &Desired, now_ns: u64) -> Result<Adopted, Skip> {
    if !f.dnat() {
        return Err(Skip::NotTranslated);
    }
    let v6 = f.orig.src.is_ipv6();
    let ends = [f.orig.src, f.orig.dst, f.reply.src, f.reply.dst];
    if ends.iter().any(|a| a.is_ipv6() != v6) {
        return Err(Skip::MixedFamilies);
    }
    let key = SvcKey {
        scope: SCOPE_EXTERNAL,
        ..frontend_key(f.orig.dst, f.orig.dport, f.proto)
    };
    let entry = d.services.get(&key).ok_or(Skip::NotAFrontend)?;
    let be = addr_words(f.reply.src).0;
    let (slot, backend_id, backend_gen) = (1..=entry.count)
        .filter_map(|slot| entry.slot(slot).map(|id| (slot, id)))
        .filter_map(|(slot, id)| d.backends.get(&id).map(|b| (slot, id, b)))
        .find(|(_, _, b)| b.addr_be == be && u16::from_be(b.port_be) == f.reply.sport)
        .map(|(slot, id, b)| (slot, id, b.generation))
        .ok_or(Skip::NotABackend)?;
    let chosen = Chosen {
        svc_id: entry.svc_id,
        backend_id,
        backend_gen,
    };
    let wide = wide_entries(f, chosen, now_ns);
    let affinity = (entry.affinity_timeout_s != 0).then(|| {
        let value = AffinityValue {
            backend_id,
            slot,
            backend_gen,
            last_seen_ns: now_ns,
            ..AffinityValue::default()
        };
        (affinity_key(entry.svc_id, f.orig.src), value)
    });
    let conntrack = if v6 {
        Entries::V6(wide)
    } else {
        Entries::V4(wide.into_iter().map(narrow).collect())
    };
    Ok(Adopted {
        conntrack,
        affinity,
    })
}

/// The service port and backend a flow is pinned to.
#[derive(Clone, Copy)]
struct Chosen {
    svc_id: u32,
    backend_id: u32,
    backend_gen: u32,
}

/// The conntrack entries of [`adopt`], computed in the IPv6 layout for either family (IPv4
/// uses word 0).
fn wide_entries(f: &KernelFlow, c: Chosen, now_ns: u64) -> Vec<(CtKey6, CtValue6)> {
    let (client, frontend, backend, source) = (f.orig.src, f.orig.dst, f.reply.src, f.reply.dst);
    let w = |ip: IpAddr| addr_words(ip).0;
    let snat = f.snat();
    let mut flags = CT_F_ASSURED;
    if f.closed() {
        // Its client's port may be reused at once (as conntrack reopens TIME_WAIT), and
        // the collector removes it after kube-proxy's closing timeouts.
        flags |= CT_F_CLOSING;
    }
    if snat {
        flags |= CT_F_SNAT;
        if source == client {
            // Only the port was remapped: netfilter saw the remapped port both ways.
            flags |= CT_F_PORT_IN;
        }
    }
    let fwd = CtValue6 {
        saddr_be: w(source),
        daddr_be: w(backend),
        sport_be: f.reply.dport.to_be(),
        dport_be: f.reply.sport.to_be(),
        backend_id: c.backend_id,
        backend_gen: c.backend_gen,
        svc_id: c.svc_id,
        flags,
        created_ns: now_ns,
        last_seen_ns: now_ns,
        ..CtValue6::default()
    };
    let reply = CtValue6 {
        saddr_be: w(frontend),
        daddr_be: w(client),
        sport_be: f.orig.dport.to_be(),
        dport_be: f.orig.sport.to_be(),
        flags: flags | CT_F_REPLIED,
        ..fwd
    };
    let key = |s: [u32; 4], d: [u32; 4], sp: u16, dp: u16, dir: u8| CtKey6 {
        saddr_be: s,
        daddr_be: d,
        sport_be: sp,
        dport_be: dp,
        proto: f.proto,
        dir,
        _pad: 0,
    };
    let (client_port, frontend_port) = (f.orig.sport.to_be(), f.orig.dport.to_be());
    let mut out = vec![
        (
            key(
                fwd.daddr_be,
                fwd.saddr_be,
                fwd.dport_be,
                fwd.sport_be,
                CT_DIR_REPLY,
            ),
            reply,
        ),
        (
            key(
                w(client),
                w(frontend),
                client_port,
                frontend_port,
                CT_DIR_FORWARD,
            ),
            fwd,
        ),
    ];
    if snat && source != client {
        // What netfilter sees between tc ingress and tc egress: client → backend, and its
        // reply backend → client.
        out.push((
            key(
                w(client),
                w(backend),
                client_port,
                fwd.dport_be,
                CT_DIR_SNAT_OUT,
            ),
            fwd,
        ));
        out.push((
            key(
                w(backend),
                w(client),
                fwd.dport_be,
                client_port,
                CT_DIR_REPLY,
            ),
            reply,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        datapath::kernel_ct::Ends,
        desired::{Limits, compute},
        reconcile::Ids,
        source::file,
    };

    const YAML: &str = "apiVersion: v1\nkind: Service\nmetadata: {namespace: ns, name: web}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{name: p, port: 80, protocol: TCP}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {namespace: ns, name: web-1, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: p, port: 8080, protocol: TCP}]\nendpoints:\n- {addresses: [10.244.0.7], conditions: {ready: true}}\n- {addresses: [10.244.0.8], conditions: {ready: true}}\n";

    fn ends(src: &str, dst: &str, sport: u16, dport: u16) -> Ends {
        Ends {
            src: src.parse().expect("ip"),
            dst: dst.parse().expect("ip"),
            sport,
            dport,
        }
    }

    const YAML6: &str = "apiVersion: v1\nkind: Service\nmetadata: {namespace: ns, name: web6}\nspec:\n  clusterIP: fd00:96::10\n  ipFamilies: [IPv6]\n  ports: [{name: p, port: 80, protocol: TCP}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {namespace: ns, name: web6-1, labels: {kubernetes.io/service-name: web6}}\naddressType: IPv6\nports: [{name: p, port: 8080, protocol: TCP}]\nendpoints:\n- {addresses: [\"fd00:244::7\"], conditions: {ready: true}}\n";

    fn desired() -> Desired {
        let yaml = format!("{YAML}---\n{YAML6}");
        let model = file::parse("t.yaml", &yaml).expect("yaml").model;
        compute(&model, &mut Ids::default(), Limits::default()).0
    }

    fn v4(e: Result<Adopted, Skip>) -> Vec<(CtKey, CtValue)> {
        match e.map(|a| a.conntrack) {
            Ok(Entries::V4(e)) => e,
            other => panic!("IPv4 entries expected: {other:?}"),
        }
    }

    #[test]
    fn a_closed_connection_is_adopted_closing_so_its_port_may_start_over() {
        let d = desired();
        let flow = |tcp_state| KernelFlow {
            proto: 6,
            orig: ends("10.244.0.5", "10.96.0.10", 40000, 80),
            reply: ends("10.244.0.8", "10.244.0.5", 8080, 40000),
            assured: true,
            tcp_state: Some(tcp_state),
        };
        for (state, closing) in [
            (3, false),
            (4, false),
            (5, false),
            (6, true),
            (7, true),
            (8, true),
        ] {
            for (_, v) in v4(adopt(&flow(state), &d, 7)) {
                assert_eq!(v.flags & CT_F_CLOSING != 0, closing, "TCP state {state}");
            }
        }
    }

    #[test]
    fn a_pod_flow_keeps_kube_proxys_backend_and_a_masqueraded_one_its_source() {
        let d = desired();
        let dnat = KernelFlow {
            proto: 6,
            orig: ends("10.244.0.5", "10.96.0.10", 40000, 80),
            reply: ends("10.244.0.8", "10.244.0.5", 8080, 40000),
            assured: true,
            tcp_state: Some(3),
        };
        let e = v4(adopt(&dnat, &d, 7));
        assert_eq!(e.len(), 2);
        let (fk, fv) = e[1];
        assert_eq!((fk.dir, fk.dport_be), (CT_DIR_FORWARD, 80u16.to_be()));
        let chosen = d.backends[&fv.backend_id];
        assert_eq!(chosen.addr_be[0], u32::from_ne_bytes([10, 244, 0, 8]));
        assert_eq!(fv.flags, CT_F_ASSURED);
        let (rk, rv) = e[0];
        assert_eq!(rk.saddr_be, u32::from_ne_bytes([10, 244, 0, 8]));
        assert_eq!(rv.saddr_be, u32::from_ne_bytes([10, 96, 0, 10]));
        assert_eq!(rv.flags, CT_F_ASSURED | CT_F_REPLIED);

        let masq = KernelFlow {
            reply: ends("10.244.0.7", "192.168.1.10", 8080, 61000),
            ..dnat
        };
        let e = v4(adopt(&masq, &d, 7));
        assert_eq!(e.len(), 4, "forward, reply and the egress pair");
        assert_eq!(e[1].1.saddr_be, u32::from_ne_bytes([192, 168, 1, 10]));
        assert_eq!(u16::from_be(e[1].1.sport_be), 61000);
        assert_eq!(e[2].0.dir, CT_DIR_SNAT_OUT);

        let elsewhere = KernelFlow {
            reply: ends("10.244.0.9", "10.244.0.5", 8080, 40000),
            ..dnat
        };
        assert_eq!(adopt(&elsewhere, &d, 7), Err(Skip::NotABackend));
        let direct = KernelFlow {
            orig: ends("10.244.0.5", "10.244.0.8", 40000, 8080),
            reply: ends("10.244.0.8", "10.244.0.5", 8080, 40000),
            ..dnat
        };
        assert_eq!(adopt(&direct, &d, 7), Err(Skip::NotTranslated));
    }

    #[test]
    fn an_ipv6_flow_is_adopted_into_the_ipv6_layout() {
        let d = desired();
        let flow = KernelFlow {
            proto: 6,
            orig: ends("fd00:244::5", "fd00:96::10", 40000, 80),
            reply: ends("fd00:244::7", "fd00:244::5", 8080, 40000),
            assured: true,
            tcp_state: Some(3),
        };
        let Ok(Entries::V6(e)) = adopt(&flow, &d, 7).map(|a| a.conntrack) else {
            panic!("IPv6 entries expected");
        };
        assert_eq!(e.len(), 2);
        let (fk, fv) = e[1];
        assert_eq!(fk.dir, CT_DIR_FORWARD);
        assert_eq!(
            fk.daddr_be,
            addr_words("fd00:96::10".parse().expect("ip")).0
        );
        assert_eq!(
            fv.daddr_be,
            addr_words("fd00:244::7".parse().expect("ip")).0
        );
        assert_eq!(d.backends[&fv.backend_id].addr_be, fv.daddr_be);
        let elsewhere = KernelFlow {
            reply: ends("fd00:244::9", "fd00:244::5", 8080, 40000),
            ..flow
        };
        assert_eq!(adopt(&elsewhere, &d, 7), Err(Skip::NotABackend));
    }

    #[test]
    fn a_client_of_an_affinity_service_keeps_kube_proxys_backend_for_its_next_connections() {
        let yaml = YAML.replace(
            "  clusterIP: 10.96.0.10\n",
            "  clusterIP: 10.96.0.10\n  sessionAffinity: ClientIP\n",
        );
        let model = file::parse("t.yaml", &yaml).expect("yaml").model;
        let d = compute(&model, &mut Ids::default(), Limits::default()).0;
        let flow = KernelFlow {
            proto: 6,
            orig: ends("10.244.0.5", "10.96.0.10", 40000, 80),
            reply: ends("10.244.0.8", "10.244.0.5", 8080, 40000),
            assured: true,
            tcp_state: Some(3),
        };
        let a = adopt(&flow, &d, 7).expect("adopted");
        let (k, v) = a.affinity.expect("an affinity entry");
        assert_eq!(k, affinity_key(k.svc_id, "10.244.0.5".parse().expect("ip")));
        assert_eq!(
            d.backends[&v.backend_id].addr_be[0],
            u32::from_ne_bytes([10, 244, 0, 8])
        );
        let key = frontend_key("10.96.0.10".parse::<IpAddr>().expect("ip"), 80, 6u8);
        assert_eq!(
            d.services[&key].slot(v.slot),
            Some(v.backend_id),
            "the slot it is in"
        );
        assert_eq!(adopt(&flow, &desired(), 7).expect("adopted").affinity, None);
    }
}
