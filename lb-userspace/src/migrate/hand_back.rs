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
//! to their backend. Both families are handed back.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
};

use aya::maps::{HashMap, MapData};
use lb_common::{
    CT_DIR_FORWARD, CT_F_PORT_IN, CT_F_SNAT, CtKey, CtKey6, CtValue, CtValue6, FAMILY_V4,
    FAMILY_V6, MAP_CT, MAP_CT_ASSURED, MAP_CT6, MAP_CT6_ASSURED, user::words_addr,
};

use crate::datapath::{
    DatapathError,
    kernel_ct::{self, Ends, KernelCtError, KernelFlow, NatFlow},
    netfilter::{NetfilterError, SeenTuple, Untracked},
    pins::Pins,
};

/// One of xlb's forward conntrack entries, either family: the client's tuple and the one
/// xlb rewrites it to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Forward {
    pub proto: u8,
    /// Client → frontend, as the client sends it.
    pub orig: Ends,
    /// The rewritten source (the masquerade address and port for a masqueraded flow).
    pub to_src: (IpAddr, u16),
    /// The backend.
    pub to_dst: (IpAddr, u16),
    /// `CT_F_*`.
    pub flags: u16,
}

impl Forward {
    fn new(family: u8, proto: u8, key: ([u32; 4], [u32; 4], u16, u16), v: Rewrite) -> Self {
        let ip = |w: [u32; 4]| words_addr(w, family);
        Self {
            proto,
            orig: Ends {
                src: ip(key.0),
                dst: ip(key.1),
                sport: u16::from_be(key.2),
                dport: u16::from_be(key.3),
            },
            to_src: (ip(v.0), u16::from_be(v.2)),
            to_dst: (ip(v.1), u16::from_be(v.3)),
            flags: v.4,
        }
    }

    /// An IPv4 entry; none for a reply or egress entry.
    pub fn of_v4(k: &CtKey, v: &CtValue) -> Option<Self> {
        let w = |a: u32| [a, 0, 0, 0];
        (k.dir == CT_DIR_FORWARD).then(|| {
            let key = (w(k.saddr_be), w(k.daddr_be), k.sport_be, k.dport_be);
            let to = (
                w(v.saddr_be),
                w(v.daddr_be),
                v.sport_be,
                v.dport_be,
                v.flags,
            );
            Self::new(FAMILY_V4, k.proto, key, to)
        })
    }

    /// An IPv6 entry; none for a reply or egress entry.
    pub fn of_v6(k: &CtKey6, v: &CtValue6) -> Option<Self> {
        (k.dir == CT_DIR_FORWARD).then(|| {
            let key = (k.saddr_be, k.daddr_be, k.sport_be, k.dport_be);
            let to = (v.saddr_be, v.daddr_be, v.sport_be, v.dport_be, v.flags);
            Self::new(FAMILY_V6, k.proto, key, to)
        })
    }
}

/// A rewrite's source and destination words, ports (network order) and flags.
type Rewrite = ([u32; 4], [u32; 4], u16, u16, u16);

/// The kernel entry to create for xlb's forward entry `f`, and the tuple netfilter saw the
/// flow by while xlb translated it (client → backend).
pub fn nat_flow(f: &Forward) -> (NatFlow, Ends) {
    let masquerade = (f.flags & CT_F_SNAT != 0).then_some(f.to_src);
    // tc ingress rewrote the destination; the source too when only the port is remapped.
    let seen_sport = if f.flags & CT_F_PORT_IN != 0 {
        f.to_src.1
    } else {
        f.orig.sport
    };
    let seen = Ends {
        src: f.orig.src,
        dst: f.to_dst.0,
        sport: seen_sport,
        dport: f.to_dst.1,
    };
    let flow = NatFlow {
        proto: f.proto,
        orig: f.orig,
        backend: f.to_dst,
        masquerade,
    };
    (flow, seen)
}

/// How netfilter sees the flow's packets while xlb translates them: the request after tc
/// ingress (client → backend) and the reply after tc ingress (from the frontend, or from
/// the backend for a masqueraded flow, whose source tc egress restores).
fn seen_while_translated(f: &Forward, seen: &Ends) -> Vec<SeenTuple> {
    let client = SocketAddr::new(f.orig.src, f.orig.sport);
    let request = (
        SocketAddr::new(seen.src, seen.sport),
        SocketAddr::new(seen.dst, seen.dport),
    );
    let answering = if f.flags & CT_F_SNAT != 0 {
        SocketAddr::from(f.to_dst)
    } else {
        SocketAddr::new(f.orig.dst, f.orig.dport)
    };
    [request, (answering, client)]
        .into_iter()
        .map(|(s, d)| (f.proto, s, d))
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
    /// Flows written into the kernel's table, by family (4 or 6) and protocol number.
    pub flows: BTreeMap<(u8, u8), usize>,
    /// Flows whose kernel entry was already there (an earlier hand-back).
    pub already: usize,
    /// Flows the kernel refused, with its first answer.
    pub failed: usize,
    pub first_error: Option<String>,
}

/// The forward entries of the pinned conntrack tables `names` (assured first) of `pins`,
/// without duplicates; tables missing under older pins are skipped.
fn forward_entries<K: aya::Pod + bytemuck::Pod, V: aya::Pod>(
    pins: &Pins,
    names: [&'static str; 2],
    forward: impl Fn(&K, &V) -> Option<Forward>,
) -> Result<Vec<Forward>, DatapathError> {
    let mut out = BTreeMap::new();
    for name in names {
        if !pins.has(name) {
            continue;
        }
        let ct: HashMap<MapData, K, V> = HashMap::try_from(pins.map(name)?)
            .map_err(|source| DatapathError::Map { name, source })?;
        for kv in ct.iter() {
            let (k, v) = kv.map_err(|source| DatapathError::Map { name, source })?;
            if let Some(f) = forward(&k, &v) {
                out.entry(bytemuck::bytes_of(&k).to_vec()).or_insert(f);
            }
        }
    }
    Ok(out.into_values().collect())
}

/// Writes every flow of xlb's conntrack in `pins` into the kernel's table with its NAT
/// (see the module doc). xlb's programs stay attached: detaching is the caller's next step.
pub fn hand_back(pins: &Pins) -> Result<HandedBack, HandBackError> {
    let mut done = HandedBack::default();
    let mut forward = forward_entries(pins, [MAP_CT_ASSURED, MAP_CT], Forward::of_v4)?;
    forward.extend(forward_entries(
        pins,
        [MAP_CT6_ASSURED, MAP_CT6],
        Forward::of_v6,
    )?);
    let flows: Vec<(NatFlow, Ends, Vec<SeenTuple>)> = forward
        .iter()
        .map(|f| {
            let (flow, seen) = nat_flow(f);
            (flow, seen, seen_while_translated(f, &seen))
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
        let family = if flow.orig.src.is_ipv6() { 6 } else { 4 };
        match kernel_ct::create(&flow) {
            Ok(()) => *done.flows.entry((family, flow.proto)).or_default() += 1,
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
        let of = |v: &CtValue| nat_flow(&Forward::of_v4(&k, v).expect("a forward entry"));
        let (f, seen) = of(&v);
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
        assert_eq!(of(&plain).0.masquerade, None);
        let port_in = CtValue {
            flags: CT_F_ASSURED | CT_F_SNAT | CT_F_PORT_IN,
            ..v
        };
        assert_eq!(of(&port_in).1.sport, 61000);
        let reply = CtKey {
            dir: CT_DIR_REPLY,
            ..k
        };
        assert!(Forward::of_v4(&reply, &v).is_none());
    }

    #[test]
    fn an_ipv6_forward_entry_keeps_its_addresses() {
        let w = |s: &str| lb_common::user::addr_words(s.parse().expect("ip")).0;
        let k = CtKey6 {
            saddr_be: w("fd00:10:255:255::1"),
            daddr_be: w("fd00:96::10"),
            sport_be: 40000u16.to_be(),
            dport_be: 80u16.to_be(),
            proto: 6,
            dir: CT_DIR_FORWARD,
            _pad: 0,
        };
        let v = CtValue6 {
            saddr_be: k.saddr_be,
            daddr_be: w("fd00:244::7"),
            sport_be: 40000u16.to_be(),
            dport_be: 8080u16.to_be(),
            flags: CT_F_ASSURED,
            ..CtValue6::default()
        };
        let f = Forward::of_v6(&k, &v).expect("a forward entry");
        let (flow, seen) = nat_flow(&f);
        assert_eq!(flow.orig.dst, "fd00:96::10".parse::<IpAddr>().expect("ip"));
        assert_eq!(flow.backend, ("fd00:244::7".parse().expect("ip"), 8080));
        assert_eq!(flow.masquerade, None);
        assert_eq!(seen.dst, flow.backend.0);
        let tuples = seen_while_translated(&f, &seen);
        assert_eq!(tuples[1].1, "[fd00:96::10]:80".parse().expect("addr"));
    }
}
