//! From xlb back to kube-proxy with nothing lost (`xlb cleanup --hand-back`): each flow xlb
//! translated is written into the kernel's conntrack table with its NAT — kube-proxy's
//! rules translate a flow from its kernel entry after its first packet, so an entry with
//! xlb's backend and masquerade source makes the kernel carry on where xlb was — before
//! xlb's programs detach.
//!
//! While xlb served a flow, netfilter saw it already translated (client → backend, between
//! tc ingress and tc egress) and may hold an entry of that tuple: its reply tuple is the
//! one the new entry needs, so it is deleted first.
//!
//! Flows of the node's own sockets need nothing: the socket hooks connected them straight
//! to their backend. IPv6 flows are counted, not handed back yet.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddrV4},
    path::Path,
};

use aya::maps::{HashMap, MapData};
use lb_common::{
    CT_DIR_FORWARD, CT_F_PORT_IN, CT_F_SNAT, CtKey, CtKey6, CtValue, CtValue6, MAP_CT,
    MAP_CT_ASSURED, MAP_CT6, MAP_CT6_ASSURED,
};

use crate::datapath::{
    DatapathError,
    kernel::open_pinned,
    kernel_ct::{self, Ends, KernelCtError, KernelFlow, NatFlow},
    netfilter::{NetfilterError, SeenTuple, Untracked},
};

fn ip(addr_be: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(addr_be.to_ne_bytes()))
}

/// The kernel entry to create for xlb's forward entry `k` → `v`, and the tuple netfilter
/// saw the flow by while xlb translated it (client → backend). None for a reply or egress
/// entry.
pub fn nat_flow(k: &CtKey, v: &CtValue) -> Option<(NatFlow, Ends)> {
    if k.dir != CT_DIR_FORWARD {
        return None;
    }
    let orig = Ends {
        src: ip(k.saddr_be),
        dst: ip(k.daddr_be),
        sport: u16::from_be(k.sport_be),
        dport: u16::from_be(k.dport_be),
    };
    let backend = (ip(v.daddr_be), u16::from_be(v.dport_be));
    let masquerade = (v.flags & CT_F_SNAT != 0).then(|| (ip(v.saddr_be), u16::from_be(v.sport_be)));
    // tc ingress rewrote the destination; the source too when only the port is remapped.
    let seen_sport = if v.flags & CT_F_PORT_IN != 0 {
        u16::from_be(v.sport_be)
    } else {
        orig.sport
    };
    let seen = Ends {
        src: orig.src,
        dst: backend.0,
        sport: seen_sport,
        dport: backend.1,
    };
    Some((
        NatFlow {
            proto: k.proto,
            orig,
            backend,
            masquerade,
        },
        seen,
    ))
}

/// How netfilter sees the flow's packets while xlb translates them: the request after tc
/// ingress (client → backend) and the reply after tc ingress (from the frontend, or from
/// the backend for a masqueraded flow, whose source tc egress restores).
fn seen_while_translated(k: &CtKey, v: &CtValue, seen: &Ends) -> Vec<SeenTuple> {
    let v4 = |ip: IpAddr, port: u16| match ip {
        IpAddr::V4(a) => Some(SocketAddrV4::new(a, port)),
        IpAddr::V6(_) => None,
    };
    let client = v4(ip(k.saddr_be), u16::from_be(k.sport_be));
    let request = v4(seen.src, seen.sport).zip(v4(seen.dst, seen.dport));
    let answering = if v.flags & CT_F_SNAT != 0 {
        v4(ip(v.daddr_be), u16::from_be(v.dport_be))
    } else {
        v4(ip(k.daddr_be), u16::from_be(k.dport_be))
    };
    [request, answering.zip(client)]
        .into_iter()
        .flatten()
        .map(|(s, d)| (k.proto, s, d))
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum HandBackError {
    #[error("reading xlb's flows: {0}")]
    Datapath(#[from] DatapathError),
    #[error("keeping xlb's translated packets out of conntrack: {0}")]
    Netfilter(#[from] NetfilterError),
}

/// What a hand-back did.
#[derive(Default)]
pub struct HandedBack {
    /// Keeps xlb's translated packets out of conntrack until dropped (after the detach).
    pub untracked: Option<Untracked>,
    /// Flows written into the kernel's table, by protocol number.
    pub flows: BTreeMap<u8, usize>,
    /// Flows whose kernel entry was already there (an earlier hand-back).
    pub already: usize,
    /// Flows the kernel refused, with its first answer.
    pub failed: usize,
    pub first_error: Option<String>,
    /// IPv6 flows, not handed back.
    pub ipv6: usize,
}

/// Every forward entry of the IPv4 conntrack tables under `dir` (assured first), without
/// duplicates.
fn forward_entries(dir: &Path) -> Result<Vec<(CtKey, CtValue)>, DatapathError> {
    let mut out = BTreeMap::new();
    for name in [MAP_CT_ASSURED, MAP_CT] {
        let ct: HashMap<MapData, CtKey, CtValue> = HashMap::try_from(open_pinned(dir, name)?)
            .map_err(|source| DatapathError::Map { name, source })?;
        for kv in ct.iter() {
            let (k, v) = kv.map_err(|source| DatapathError::Map { name, source })?;
            if k.dir == CT_DIR_FORWARD {
                out.entry(bytemuck::bytes_of(&k).to_vec()).or_insert((k, v));
            }
        }
    }
    Ok(out.into_values().collect())
}

/// IPv6 forward entries under `dir` (their tables may be missing under older pins).
fn ipv6_flows(dir: &Path) -> Result<usize, DatapathError> {
    let mut n = 0;
    for name in [MAP_CT6_ASSURED, MAP_CT6] {
        if !dir.join(name).exists() {
            continue;
        }
        let ct: HashMap<MapData, CtKey6, CtValue6> = HashMap::try_from(open_pinned(dir, name)?)
            .map_err(|source| DatapathError::Map { name, source })?;
        n += ct
            .keys()
            .filter(|k| k.as_ref().is_ok_and(|k| k.dir == CT_DIR_FORWARD))
            .count();
    }
    Ok(n)
}

/// Writes every flow of xlb's conntrack under `dir` into the kernel's table with its NAT
/// (see the module doc). xlb's programs stay attached: detaching is the caller's next step.
pub fn hand_back(dir: &Path) -> Result<HandedBack, HandBackError> {
    let mut done = HandedBack {
        ipv6: ipv6_flows(dir)?,
        ..HandedBack::default()
    };
    let flows: Vec<(NatFlow, Ends, Vec<SeenTuple>)> = forward_entries(dir)?
        .iter()
        .filter_map(|(k, v)| {
            let (flow, seen) = nat_flow(k, v)?;
            let tuples = seen_while_translated(k, v, &seen);
            Some((flow, seen, tuples))
        })
        .collect();
    if flows.is_empty() {
        return Ok(done);
    }
    let all: Vec<SeenTuple> = flows.iter().flat_map(|f| f.2.iter().copied()).collect();
    // Until xlb is detached (the caller's next step; the table goes when `done` is
    // dropped), the packets it still translates stay out of conntrack.
    done.untracked = Some(Untracked::new(&all)?);
    for (flow, seen, _) in flows {
        // Best effort: the entry netfilter made of the translated flow, if there is one.
        let _ = kernel_ct::delete(&KernelFlow {
            proto: flow.proto,
            orig: seen,
            reply: seen,
            assured: false,
            tcp_state: None,
        });
        match kernel_ct::create(&flow) {
            Ok(()) => *done.flows.entry(flow.proto).or_default() += 1,
            Err(KernelCtError::Kernel(e)) if e.raw_os_error() == Some(libc::EEXIST) => {
                done.already += 1;
            }
            Err(e) => {
                done.failed += 1;
                done.first_error
                    .get_or_insert_with(|| format!("{:?}: {e}", flow.orig));
            }
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use lb_common::{CT_DIR_REPLY, CT_F_ASSURED};

    use super::*;

    fn be(ip: [u8; 4]) -> u32 {
        u32::from_ne_bytes(ip)
    }

    #[test]
    fn a_forward_entry_is_a_kernel_flow_with_its_backend_and_masquerade() {
        let k = CtKey {
            saddr_be: be([10, 255, 255, 1]),
            daddr_be: be([192, 0, 2, 10]),
            sport_be: 40000u16.to_be(),
            dport_be: 30080u16.to_be(),
            proto: 6,
            dir: CT_DIR_FORWARD,
            _pad: 0,
        };
        let v = CtValue {
            saddr_be: be([192, 0, 2, 10]),
            daddr_be: be([10, 244, 0, 7]),
            sport_be: 61000u16.to_be(),
            dport_be: 8080u16.to_be(),
            flags: CT_F_ASSURED | CT_F_SNAT,
            ..CtValue::default()
        };
        let (f, seen) = nat_flow(&k, &v).expect("a forward entry");
        assert_eq!(f.backend, ("10.244.0.7".parse().expect("ip"), 8080));
        assert_eq!(
            f.masquerade,
            Some(("192.0.2.10".parse().expect("ip"), 61000))
        );
        assert_eq!((f.orig.sport, f.orig.dport), (40000, 30080));
        assert_eq!(
            (seen.dst, seen.sport, seen.dport),
            (f.backend.0, 40000, 8080)
        );

        let plain = CtValue {
            flags: CT_F_ASSURED,
            ..v
        };
        assert_eq!(nat_flow(&k, &plain).expect("forward").0.masquerade, None);
        let port_in = CtValue {
            flags: CT_F_ASSURED | CT_F_SNAT | CT_F_PORT_IN,
            ..v
        };
        assert_eq!(nat_flow(&k, &port_in).expect("forward").1.sport, 61000);
        let reply = CtKey {
            dir: CT_DIR_REPLY,
            ..k
        };
        assert!(nat_flow(&reply, &v).is_none());
    }
}
