//! Direct server return (`--lb-mode dsr|hybrid`, as Cilium's `loadBalancer.mode`), one
//! code for both families: a new flow of an external frontend (externalTrafficPolicy
//! Cluster) to a backend on another node keeps the client as its source instead of being
//! SNATed, and tells the backend's node the frontend in an option right after the header
//! (IPv4: an IP option, [`lb_common::DSR_OPT_TYPE`], 8 bytes; IPv6: a destination-options
//! header, `v6/dsr.rs`, 24 bytes: the MTU cost). The backend's node records the flow from
//! that option, so the backend's replies leave it with the frontend as source, straight
//! to the client: they never come back through the node that chose the backend. Each
//! family's leaf gives the option's bytes and the header word that announces it
//! ([`Family::dsr_build`], [`Family::dsr_parse`]); where it goes, the room made for it, its
//! checksum (IPv4's header's) and the learning are here.
//!
//! The option rides on the packets the backend's node learns the flow from: a TCP SYN (and
//! its retransmits) and every UDP datagram (a UDP flow has no first packet the other node
//! could be sure to see). Other packets are DNATed only; the backend's node already has the
//! flow. Linux ignores an IP option it does not know on a packet it receives (and skips an
//! IPv6 option whose type says so), so the option reaches the backend as it was sent.

use aya_ebpf::programs::TcContext;
use lb_common::{
    BE_F_REMOTE, Backend, CFG_F_DSR_TCP, CFG_F_DSR_UDP, CT_DIR_FORWARD, CT_DIR_REPLY, CT_F_DSR,
    IPPROTO_TCP, IPPROTO_UDP, R_REWRITE_FAILED, SCOPE_EXTERNAL, SVC_F_SNAT_REMOTE, SvcValue,
};

use crate::{
    clock,
    conntrack::{self, Ct},
    family::{Addr, Ends, EndsMut, Entry, Family, View},
    filter,
    maps::{self},
    packet::Packet,
    reason::Reason,
    select::{self},
};

/// TCP's SYN and ACK flags.
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
/// `BPF_ADJ_ROOM_NET`: room after the IP header (IPv4's 20 fixed bytes, IPv6's 40).
const ADJ_ROOM_NET: u32 = 0;

/// A new flow of `t` to backend `be` of frontend `svc` goes by DSR: [`wanted`], and a
/// header without IP options or IPv6 extension headers (the option goes first).
#[inline(always)]
pub fn applies<F: Family>(t: &F, svc: &SvcValue, be: &Backend) -> bool {
    t.plain() && wanted(t.proto(), svc, be)
}

/// Whether a new flow of `proto` to backend `be` of frontend `svc` goes by DSR, whatever
/// the family: an external frontend that SNATs to remote backends, a remote backend, the
/// protocol's DSR flag set (`--lb-mode`).
#[inline(always)]
pub fn wanted(proto: u8, svc: &SvcValue, be: &Backend) -> bool {
    if svc.flags & SVC_F_SNAT_REMOTE == 0 || be.flags & BE_F_REMOTE == 0 {
        return false;
    }
    let flags = maps::config().flags;
    match proto {
        IPPROTO_TCP => flags & CFG_F_DSR_TCP != 0,
        IPPROTO_UDP => flags & CFG_F_DSR_UDP != 0,
        _ => false,
    }
}

/// A packet of a DSR flow carries the option: a TCP SYN (not a SYN-ACK), a UDP datagram.
#[inline(always)]
pub fn carries<F: Family>(t: &F) -> bool {
    carries_by(t.proto(), t.tcp_flags())
}

/// The bytes a packet of the flow whose forward entry has `flags` gains at tc egress: the
/// option, on a DSR flow's packets that carry it (the MTU check counts them).
#[inline(always)]
pub fn extra<F: Family>(flags: u16, t: &F) -> u16 {
    if flags & CT_F_DSR != 0 && carries(t) {
        F::DSR_LEN
    } else {
        0
    }
}

/// [`extra`] for the first packet of a new flow of `t` to backend `be` of `svc`.
#[inline(always)]
pub fn extra_new<F: Family>(t: &F, svc: &SvcValue, be: &Backend) -> u16 {
    if applies(t, svc, be) && carries(t) {
        F::DSR_LEN
    } else {
        0
    }
}

/// The reply entry of the DSR flow a packet leaving for its backend (client → backend,
/// translated at ingress) belongs to: its source is the frontend.
#[inline(always)]
pub fn frontend_entry<F: Family>(t: &F) -> Option<Ct<F>> {
    let k = conntrack::reversed_key(t, CT_DIR_REPLY);
    conntrack::entry::<F>(&k).filter(|ct| ct.flags() & CT_F_DSR != 0)
}

/// [`carries`], by the packet's protocol and TCP flags (both families).
#[inline(always)]
pub fn carries_by(proto: u8, tcp_flags: u8) -> bool {
    match proto {
        IPPROTO_TCP => tcp_flags & (SYN | ACK) == SYN,
        IPPROTO_UDP => true,
        _ => false,
    }
}

/// Adds the option naming the frontend `addr`:`port_be` after the header (without options
/// or extension headers) of a packet leaving for its backend's node (tc egress): `DSR_LEN`
/// bytes of room after the header, the option written there, the header's lengths (and
/// IPv4's checksum) made to match. (The L4 checksum does not change: its pseudo-header
/// holds the L4 length and the addresses, neither touched.)
#[inline(never)]
pub fn push<F: Family>(ctx: &TcContext, addr: &F::Addr, port_be: u16) -> Result<(), Reason> {
    let failed = |()| Reason(R_REWRITE_FAILED);
    let old: u32 = Packet::load(ctx, F::DSR_WORD_OFF).map_err(failed)?;
    ctx.adjust_room(F::DSR_LEN as i32, ADJ_ROOM_NET, 0)
        .map_err(|_| Reason(R_REWRITE_FAILED))?;
    let (new, opt) = F::dsr_build(old, addr, port_be);
    Packet::store(ctx, F::DSR_WORD_OFF, &new).map_err(failed)?;
    Packet::store(ctx, F::L4_OFF, &opt).map_err(failed)?;
    if let Some(csum) = F::HDR_CSUM_OFF {
        Packet::l3_csum_replace(ctx, csum, old, new).map_err(failed)?;
        for w in opt.as_ref() {
            Packet::l3_csum_replace(ctx, csum, 0, *w).map_err(failed)?;
        }
    }
    Ok(())
}

/// On the backend's node, a packet `t` whose header is followed by an option or extension
/// header: whether that is the DSR option alone; if so the frontend it names is read into
/// the scratch's reply entry (its source address and port), where [`learn`] takes it.
#[inline(always)]
pub fn read<F: Family>(ctx: &TcContext, t: &F, s: &mut F::Scratch) -> bool {
    if t.l4_off() != F::L4_OFF + F::DSR_LEN as usize {
        return false;
    }
    let (Ok(w), Ok(opt)) = (
        Packet::load::<u32>(ctx, F::DSR_WORD_OFF),
        Packet::load::<F::DsrOpt>(ctx, F::L4_OFF),
    ) else {
        return false;
    };
    let Some((addr, port_be)) = F::dsr_parse(w, &opt) else {
        return false;
    };
    let (saddr, _, sport, _) = F::parts(s).reply.ends_mut();
    saddr.set(&addr);
    *sport = port_be;
    true
}

/// On the backend's node: records the flow of `t` (client → backend) whose frontend the
/// family's leaf read from its DSR option into the scratch's reply entry (its source
/// address and port), unless it is recorded already, so its replies (backend → client) get
/// the frontend as source at egress: its forward entry (client → frontend, never matched
/// here: the packets arrive translated; it keeps the flow whole for the agent's conntrack
/// GC) and its reply entry, written as they are (no clash check: the client's port to this
/// backend is the client's own; no SNAT). Only for a packet to a backend address this node
/// programs (the address filter); the frontend may be another node's (a NodePort on the
/// address of the node that chose the backend), counted under the service it is here when
/// it is one. Both families.
#[inline(never)]
pub fn learn<F: Family>(t: &F, s: &mut F::Scratch) -> Result<bool, Reason> {
    if !filter::maybe_backend(F::filter_word(t.daddr())) {
        return Ok(false);
    }
    let p = F::parts(s);
    *p.fwd_key = F::key(
        t.saddr(),
        p.reply.saddr(),
        t.sport(),
        p.reply.sport(),
        t.proto(),
        CT_DIR_FORWARD,
    );
    if conntrack::entry::<F>(p.fwd_key).is_some() {
        return Ok(true);
    }
    let front = F::front(p.reply.saddr(), p.reply.sport(), t.proto(), SCOPE_EXTERNAL);
    let svc_id = select::lookup(&front).map_or(0, |svc| svc.svc_id);
    let now = clock::now();
    let (saddr, daddr, sport, dport) = p.fwd.ends_mut();
    saddr.set(t.saddr());
    daddr.set(t.daddr());
    *sport = t.sport();
    *dport = t.dport();
    learnt::<F>(p.fwd, svc_id, now);
    let (_, daddr, _, dport) = p.reply.ends_mut();
    daddr.set(t.saddr());
    *dport = t.sport();
    learnt::<F>(p.reply, svc_id, now);
    *p.reply_key = conntrack::reversed_key(t, CT_DIR_REPLY);
    conntrack::insert_dsr::<F>(s)?;
    Ok(true)
}

/// The fields of a learnt DSR flow's entry besides its tuple: no backend index (the flow is
/// another node's choice), the service index `svc_id` (0: none here), created `now`.
#[inline(always)]
fn learnt<F: Family>(v: &mut F::Value, svc_id: u32, now: u64) {
    v.start(0, 0, svc_id);
    *v.flags_mut() = CT_F_DSR;
    *v.created_mut() = now;
    *v.last_seen_mut() = now;
}
