//! A flow kube-proxy translated, as xlb's datapath would hold it had it begun the flow: the
//! kernel's conntrack entry (client → frontend, answered by a backend, maybe masqueraded)
//! turned into xlb's assured conntrack entries — forward and reply, and for a masqueraded
//! flow the egress pair tc egress restores its source from — with kube-proxy's backend and
//! its masquerade address and port, so the flow's next packet finds its entry and goes on
//! to the same backend.

use std::net::IpAddr;

use lb_common::{
    CT_DIR_FORWARD, CT_DIR_REPLY, CT_DIR_SNAT_OUT, CT_F_ASSURED, CT_F_PORT_IN, CT_F_REPLIED,
    CT_F_SNAT, CtKey, CtValue, SCOPE_EXTERNAL, SvcKey, user::frontend_key,
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
    /// IPv6 flows are not taken over yet.
    Ipv6,
}

/// xlb's conntrack entries (for `XLB_CTA_V1`) for kernel flow `f` to a frontend of `d`,
/// stamped `now_ns` (`CLOCK_MONOTONIC_COARSE`).
pub fn entries(f: &KernelFlow, d: &Desired, now_ns: u64) -> Result<Vec<(CtKey, CtValue)>, Skip> {
    if !f.dnat() {
        return Err(Skip::NotTranslated);
    }
    let (IpAddr::V4(client), IpAddr::V4(frontend), IpAddr::V4(backend), IpAddr::V4(source)) =
        (f.orig.src, f.orig.dst, f.reply.src, f.reply.dst)
    else {
        return Err(Skip::Ipv6);
    };
    let key = SvcKey {
        scope: SCOPE_EXTERNAL,
        ..frontend_key(frontend, f.orig.dport, f.proto)
    };
    let entry = d.services.get(&key).ok_or(Skip::NotAFrontend)?;
    let be_addr = lb_common::user::addr_words(backend.into()).0;
    let (backend_id, generation) = (1..=entry.count)
        .filter_map(|slot| d.services.get(&SvcKey { slot, ..key }))
        .filter_map(|v| d.backends.get(&v.backend_id).map(|b| (v.backend_id, b)))
        .find(|(_, b)| b.addr_be == be_addr && u16::from_be(b.port_be) == f.reply.sport)
        .map(|(id, b)| (id, b.generation))
        .ok_or(Skip::NotABackend)?;
    let be = |ip: std::net::Ipv4Addr| u32::from_ne_bytes(ip.octets());
    let snat = f.snat();
    let mut flags = CT_F_ASSURED;
    if snat {
        flags |= CT_F_SNAT;
        if source == client {
            // Only the port was remapped: netfilter saw the remapped port both ways.
            flags |= CT_F_PORT_IN;
        }
    }
    let fwd = CtValue {
        saddr_be: be(source),
        daddr_be: be(backend),
        sport_be: f.reply.dport.to_be(),
        dport_be: f.reply.sport.to_be(),
        backend_id,
        backend_gen: generation,
        svc_id: entry.svc_id,
        flags,
        created_ns: now_ns,
        last_seen_ns: now_ns,
        ..CtValue::default()
    };
    let reply = CtValue {
        saddr_be: be(frontend),
        daddr_be: be(client),
        sport_be: f.orig.dport.to_be(),
        dport_be: f.orig.sport.to_be(),
        flags: flags | CT_F_REPLIED,
        ..fwd
    };
    let key = |s: u32, d: u32, sp: u16, dp: u16, dir: u8| CtKey {
        saddr_be: s,
        daddr_be: d,
        sport_be: sp,
        dport_be: dp,
        proto: f.proto,
        dir,
        _pad: 0,
    };
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
                be(client),
                be(frontend),
                f.orig.sport.to_be(),
                f.orig.dport.to_be(),
                CT_DIR_FORWARD,
            ),
            fwd,
        ),
    ];
    if snat && source != client {
        // What netfilter sees between tc ingress and tc egress: client → backend, and its
        // reply backend → client.
        let port = f.orig.sport.to_be();
        out.push((
            key(be(client), be(backend), port, fwd.dport_be, CT_DIR_SNAT_OUT),
            fwd,
        ));
        out.push((
            key(be(backend), be(client), fwd.dport_be, port, CT_DIR_REPLY),
            reply,
        ));
    }
    Ok(out)
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

    fn desired() -> Desired {
        let model = file::parse("t.yaml", YAML).expect("yaml").model;
        compute(&model, &mut Ids::default(), Limits::default()).0
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
        let e = entries(&dnat, &d, 7).expect("taken over");
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
        let e = entries(&masq, &d, 7).expect("taken over");
        assert_eq!(e.len(), 4, "forward, reply and the egress pair");
        assert_eq!(e[1].1.saddr_be, u32::from_ne_bytes([192, 168, 1, 10]));
        assert_eq!(u16::from_be(e[1].1.sport_be), 61000);
        assert_eq!(e[2].0.dir, CT_DIR_SNAT_OUT);

        let elsewhere = KernelFlow {
            reply: ends("10.244.0.9", "10.244.0.5", 8080, 40000),
            ..dnat
        };
        assert_eq!(entries(&elsewhere, &d, 7), Err(Skip::NotABackend));
        let direct = KernelFlow {
            orig: ends("10.244.0.5", "10.244.0.8", 40000, 8080),
            reply: ends("10.244.0.8", "10.244.0.5", 8080, 40000),
            ..dnat
        };
        assert_eq!(entries(&direct, &d, 7), Err(Skip::NotTranslated));
    }
}
