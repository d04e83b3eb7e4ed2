//! The kernel's own conntrack table, through ctnetlink (netlink-sys for the socket,
//! netlink-packet-netfilter for the messages): dumped to find the flows kube-proxy's rules
//! translated (their NAT lives in these entries, not in the rules), entries deleted by
//! their original tuple once xlb serves the flow, and entries created with their NAT when
//! xlb hands its flows back (`create`: the crate has no NAT attributes; they are built
//! from its generic netlink attributes).

use std::net::IpAddr;

use netlink_packet_core::{
    DefaultNla, Emitable, NLA_F_NESTED, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL,
    NLM_F_REQUEST,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
    conntrack::{
        ConntrackAttribute, ConntrackMessage, IPTuple, ProtoInfo, ProtoInfoTCP, ProtoTuple, Status,
        TCPFlags, Tuple,
    },
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};
use thiserror::Error;

use super::netlink::{Failed, exchange};
use crate::model::IpFamily;

#[derive(Debug, Error)]
pub enum KernelCtError {
    #[error("ctnetlink: {0}")]
    Io(#[from] std::io::Error),
    #[error("ctnetlink: the kernel answered: {0}")]
    Kernel(std::io::Error),
    #[error("ctnetlink: a message not understood: {0}")]
    Decode(String),
}

/// One direction of a flow as the kernel tracks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ends {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
}

/// A flow in the kernel's conntrack table: its original direction (as the client sent it)
/// and its reply direction (as the other end answers: from the backend, to the client or
/// to the address it was masqueraded to).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelFlow {
    pub proto: u8,
    pub orig: Ends,
    pub reply: Ends,
    /// The kernel saw both directions and calls the flow assured.
    pub assured: bool,
    /// TCP's state (`TCP_CONNTRACK_*`: 3 established, 4 fin-wait, …), none for UDP.
    pub tcp_state: Option<u8>,
}

/// `TCP_CONNTRACK_ESTABLISHED`.
pub const TCP_ESTABLISHED: u8 = 3;
/// `TCP_CONNTRACK_LAST_ACK`, `TIME_WAIT` and `CLOSE`: both ends have closed (or one reset).
const TCP_CLOSED_BOTH: [u8; 3] = [6, 7, 8];

impl KernelFlow {
    /// Its destination was translated (to a backend: the reply comes from elsewhere).
    pub fn dnat(&self) -> bool {
        self.reply.src != self.orig.dst || self.reply.sport != self.orig.dport
    }

    /// Its source was translated (masqueraded: the reply goes elsewhere).
    pub fn snat(&self) -> bool {
        self.reply.dst != self.orig.src || self.reply.dport != self.orig.sport
    }

    /// A TCP connection both of whose ends closed (last ACK, TIME_WAIT, or CLOSE after a
    /// reset): over, whatever packet of it may still come.
    pub fn closed(&self) -> bool {
        self.tcp_state.is_some_and(|s| TCP_CLOSED_BOTH.contains(&s))
    }
}

fn proto_family(family: IpFamily) -> NetfilterProtoFamily {
    match family {
        IpFamily::V4 => NetfilterProtoFamily::IPv4,
        IpFamily::V6 => NetfilterProtoFamily::IPv6,
    }
}

/// One request on a fresh socket; every answer message's conntrack payload until the
/// dump's end or the kernel's acknowledgement.
fn request(
    flags: u16,
    family: IpFamily,
    message: ConntrackMessage,
) -> Result<Vec<ConntrackMessage>, KernelCtError> {
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let req = NetfilterMessage::new(NetfilterHeader::new(proto_family(family), 0, 0), message);
    let mut out = Vec::new();
    let each = |m: NetfilterMessage| {
        if let NetfilterMessageInner::Conntrack(c) = m.inner {
            out.push(c);
        }
    };
    exchange(&socket, flags, req, each).map_err(|f| match f {
        Failed::Io(e) => KernelCtError::Io(e),
        Failed::Kernel(e) => KernelCtError::Kernel(e),
        Failed::Decode(e) => KernelCtError::Decode(e),
    })?;
    Ok(out)
}

/// Every TCP and UDP flow of `family` in this namespace's conntrack table.
pub fn dump(family: IpFamily) -> Result<Vec<KernelFlow>, KernelCtError> {
    let answers = request(
        NLM_F_REQUEST | NLM_F_DUMP,
        family,
        ConntrackMessage::Get(Vec::new()),
    )?;
    Ok(answers.iter().filter_map(flow_of).collect())
}

/// Deletes the kernel's entry of `flow` (found by its original tuple). An entry already
/// gone is not an error.
pub fn delete(flow: &KernelFlow) -> Result<(), KernelCtError> {
    let message = ConntrackMessage::Delete(vec![ConntrackAttribute::CtaTupleOrig(tuple(
        flow.proto, &flow.orig,
    ))]);
    match request(
        NLM_F_REQUEST | NLM_F_ACK,
        IpFamily::of(flow.orig.src),
        message,
    ) {
        Ok(_) => Ok(()),
        Err(KernelCtError::Kernel(e)) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        Err(e) => Err(e),
    }
}

/// A flow to write into the kernel's table with its NAT: the client's tuple, the backend
/// it goes to, and the source it was masqueraded to (if it was).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NatFlow {
    pub proto: u8,
    /// Client → frontend, as the client sends it.
    pub orig: Ends,
    /// The backend (destination NAT).
    pub backend: (IpAddr, u16),
    /// The masquerade source (source NAT), if any.
    pub masquerade: Option<(IpAddr, u16)>,
}

/// `CTA_NAT_SRC`, `CTA_NAT_DST` and their nested attributes (`linux/netfilter/
/// nfnetlink_conntrack.h`).
const CTA_NAT_SRC: u16 = 6;
const CTA_NAT_DST: u16 = 13;
const CTA_NAT_V4_MINIP: u16 = 1;
const CTA_NAT_V4_MAXIP: u16 = 2;
const CTA_NAT_PROTO: u16 = 3;
const CTA_NAT_V6_MINIP: u16 = 4;
const CTA_NAT_V6_MAXIP: u16 = 5;
const CTA_PROTONAT_PORT_MIN: u16 = 1;
const CTA_PROTONAT_PORT_MAX: u16 = 2;
/// `IP_CT_TCP_FLAG_BE_LIBERAL`: no window checks (the entry's windows start unknown).
const TCP_FLAG_BE_LIBERAL: u8 = 0x08;
/// The kernel's default timeouts of an established TCP flow and an assured UDP one.
const TCP_ESTABLISHED_TIMEOUT_S: u32 = 432_000;
const UDP_ASSURED_TIMEOUT_S: u32 = 120;

/// The nested attributes of a NAT binding to exactly `(ip, port)`.
fn nat_binding(kind: u16, (ip, port): (IpAddr, u16)) -> ConntrackAttribute {
    let emit = |nlas: &[DefaultNla]| {
        let mut buf = vec![0; nlas.buffer_len()];
        nlas.emit(&mut buf);
        buf
    };
    let (min, max, octets) = match ip {
        IpAddr::V4(a) => (CTA_NAT_V4_MINIP, CTA_NAT_V4_MAXIP, a.octets().to_vec()),
        IpAddr::V6(a) => (CTA_NAT_V6_MINIP, CTA_NAT_V6_MAXIP, a.octets().to_vec()),
    };
    let ports = emit(&[
        DefaultNla::new(CTA_PROTONAT_PORT_MIN, port.to_be_bytes().to_vec()),
        DefaultNla::new(CTA_PROTONAT_PORT_MAX, port.to_be_bytes().to_vec()),
    ]);
    let inner = emit(&[
        DefaultNla::new(min, octets.clone()),
        DefaultNla::new(max, octets),
        DefaultNla::new(CTA_NAT_PROTO | NLA_F_NESTED, ports),
    ]);
    ConntrackAttribute::Other(DefaultNla::new(kind | NLA_F_NESTED, inner))
}

/// Creates the kernel's entry of `flow`, assured (TCP established, windows unchecked) with
/// its NAT bound as kube-proxy's rules would have bound it, so the kernel translates its
/// next packets. The reply tuple is the un-NATed one: the kernel derives the NATed reply
/// from the bindings.
pub fn create(flow: &NatFlow) -> Result<(), KernelCtError> {
    let o = &flow.orig;
    let unnated = Ends {
        src: o.dst,
        dst: o.src,
        sport: o.dport,
        dport: o.sport,
    };
    let mut attrs = vec![
        ConntrackAttribute::CtaTupleOrig(tuple(flow.proto, o)),
        ConntrackAttribute::CtaTupleReply(tuple(flow.proto, &unnated)),
        nat_binding(CTA_NAT_DST, flow.backend),
    ];
    if let Some(masq) = flow.masquerade {
        attrs.push(nat_binding(CTA_NAT_SRC, masq));
    }
    // A created entry is confirmed from the start: a status without the bit is refused
    // (EBUSY) as a try to change it.
    attrs.push(ConntrackAttribute::CtaStatus(
        Status::Assured | Status::SeenReply | Status::Confirmed,
    ));
    if flow.proto == lb_common::IPPROTO_TCP {
        let liberal = || {
            TCPFlags::parse(&[TCP_FLAG_BE_LIBERAL, TCP_FLAG_BE_LIBERAL])
                .map_err(|e| KernelCtError::Decode(e.to_string()))
        };
        attrs.push(ConntrackAttribute::CtaTimeout(TCP_ESTABLISHED_TIMEOUT_S));
        attrs.push(ConntrackAttribute::CtaProtoInfo(vec![ProtoInfo::TCP(
            vec![
                ProtoInfoTCP::State(TCP_ESTABLISHED),
                ProtoInfoTCP::OriginalFlags(liberal()?),
                ProtoInfoTCP::ReplyFlags(liberal()?),
            ],
        )]));
    } else {
        attrs.push(ConntrackAttribute::CtaTimeout(UDP_ASSURED_TIMEOUT_S));
    }
    request(
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        IpFamily::of(o.src),
        ConntrackMessage::New(attrs),
    )
    .map(|_| ())
}

fn tuple(proto: u8, e: &Ends) -> Vec<Tuple> {
    vec![
        Tuple::Ip(vec![
            IPTuple::SourceAddress(e.src),
            IPTuple::DestinationAddress(e.dst),
        ]),
        Tuple::Proto(vec![
            ProtoTuple::Protocol(proto.into()),
            ProtoTuple::SourcePort(e.sport),
            ProtoTuple::DestinationPort(e.dport),
        ]),
    ]
}

/// The ends and protocol of a tuple attribute; none when a part is missing.
fn ends_of(t: &[Tuple]) -> Option<(u8, Ends)> {
    let (mut src, mut dst, mut sport, mut dport, mut proto) = (None, None, None, None, None);
    for part in t {
        match part {
            Tuple::Ip(ips) => {
                for ip in ips {
                    match ip {
                        IPTuple::SourceAddress(a) => src = Some(*a),
                        IPTuple::DestinationAddress(a) => dst = Some(*a),
                        _ => {}
                    }
                }
            }
            Tuple::Proto(ps) => {
                for p in ps {
                    match p {
                        ProtoTuple::Protocol(p) => proto = Some(u8::from(*p)),
                        ProtoTuple::SourcePort(s) => sport = Some(*s),
                        ProtoTuple::DestinationPort(d) => dport = Some(*d),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some((
        proto?,
        Ends {
            src: src?,
            dst: dst?,
            sport: sport?,
            dport: dport?,
        },
    ))
}

/// A TCP or UDP flow from a conntrack message; none for anything else.
pub fn flow_of(m: &ConntrackMessage) -> Option<KernelFlow> {
    let ConntrackMessage::New(attrs) = m else {
        return None;
    };
    let (mut orig, mut reply, mut assured, mut tcp_state) = (None, None, false, None);
    for a in attrs {
        match a {
            ConntrackAttribute::CtaTupleOrig(t) => orig = ends_of(t),
            ConntrackAttribute::CtaTupleReply(t) => reply = ends_of(t),
            ConntrackAttribute::CtaStatus(s) => assured = s.contains(Status::Assured),
            ConntrackAttribute::CtaProtoInfo(infos) => {
                for i in infos {
                    if let ProtoInfo::TCP(tcp) = i {
                        for t in tcp {
                            if let ProtoInfoTCP::State(s) = t {
                                tcp_state = Some(*s);
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    let ((proto, orig), (_, reply)) = (orig?, reply?);
    if proto != lb_common::IPPROTO_TCP && proto != lb_common::IPPROTO_UDP {
        return None;
    }
    Some(KernelFlow {
        proto,
        orig,
        reply,
        assured,
        tcp_state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dumped_message_is_a_flow_with_its_nat_told_apart() {
        let m = ConntrackMessage::New(vec![
            ConntrackAttribute::CtaTupleOrig(tuple(
                6,
                &Ends {
                    src: "10.244.0.5".parse().expect("ip"),
                    dst: "10.96.0.10".parse().expect("ip"),
                    sport: 40000,
                    dport: 80,
                },
            )),
            ConntrackAttribute::CtaTupleReply(tuple(
                6,
                &Ends {
                    src: "10.244.0.7".parse().expect("ip"),
                    dst: "10.244.0.5".parse().expect("ip"),
                    sport: 8080,
                    dport: 40000,
                },
            )),
            ConntrackAttribute::CtaStatus(Status::Assured | Status::DstNat),
        ]);
        let f = flow_of(&m).expect("a flow");
        assert!(f.assured && f.dnat() && !f.snat(), "{f:?}");
        assert_eq!(f.proto, 6);
        assert_eq!(f.reply.sport, 8080);
    }
}
