//! Connect-time load balancing in cgroup sock_addr hooks: a socket's `connect()` (TCP and
//! UDP) or unconnected UDP `sendmsg()` to a frontend goes to a backend chosen by the same
//! rules as packets ([`select::choose`]); `recvmsg()` and `getpeername()` show the frontend
//! again. Such a socket's packets need no NAT at all: tc sees the backend as destination.
//!
//! The node's own processes (and hostNetwork pods) are only reachable this way: their
//! packets never cross a tc hook before they are routed.
//!
//! IPv4 (`*4` hooks) and IPv6 (`*6` hooks) run the same code, generic over [`Family`]; their
//! frontends share the service map (keys carry the family).

use aya_ebpf::{
    EbpfContext,
    bindings::bpf_sock_addr,
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_set_retval},
    programs::SockAddrContext,
};
use lb_common::{
    Backend, CFG_F_SOCK_HOST_ONLY, FAMILY_V4, FAMILY_V6, IPPROTO_TCP, IPPROTO_UDP, R_SOCK_PASS,
    R_SOCK_REJECT, R_SOCK_REVNAT, R_SOCK_UNREACH, R_SOCK_XLATE, R_SRC_DENIED, SCOPE_EXTERNAL,
    SCOPE_INTERNAL, SOCK_DIR_FORWARD, SOCK_DIR_REVERSE, SVC_F_DROP_EMPTY, SVC_F_SRC_RANGES,
    SVC_F_TWO_SCOPES, SockKey, SockValue, SvcValue,
};

use crate::{
    affinity::{self, Client},
    maps::{XLB_CFG_V3, XLB_SOCK_V1},
    reason::{self, Reason},
    select::{self, Frontend, Frontend6, Keyed},
    srcrange,
};

/// The hook's verdict: the call goes on (possibly to a backend).
pub const ALLOW: i32 = 1;
/// The hook's verdict: the call fails with the errno set by `bpf_set_retval`.
pub const REFUSE: i32 = 0;

const ECONNREFUSED: i32 = 111;
const EHOSTUNREACH: i32 = 113;

/// What the hooks need of an address family: where the call's address is, what a frontend
/// of the family is, who the client is.
pub trait Family {
    type Front: Keyed + Copy;
    const FAMILY: u8;
    /// The frontend the call names (external scope).
    fn frontend(sa: &bpf_sock_addr, proto: u8) -> Self::Front;
    fn scoped(f: &Self::Front, scope: u8) -> Self::Front;
    fn port_be(f: &Self::Front) -> u16;
    fn words(f: &Self::Front) -> [u32; 4];
    /// A loopback frontend (the host's alone).
    fn loopback(f: &Self::Front) -> bool;
    /// The socket's bound source address as the affinity client, if it has one.
    fn bound(sa: &bpf_sock_addr) -> Option<Client>;
    /// loadBalancerSourceRanges for the call (an unbound socket's source will be a node
    /// address, which kube-proxy allows when a range holds one: the agent then allows the
    /// frontend itself).
    fn allowed(sa: &bpf_sock_addr, f: &Self::Front, svc_id: u32) -> bool;
    /// The call's address as the socket map keys it.
    fn user(sa: &bpf_sock_addr) -> [u32; 4];
    /// Points the call at `addr_be`:`port_be`.
    fn set_user(sa: &mut bpf_sock_addr, addr_be: &[u32; 4], port_be: u16);
}

/// The `*4` hooks.
pub struct V4;

impl Family for V4 {
    type Front = Frontend;
    const FAMILY: u8 = FAMILY_V4;
    #[inline(always)]
    fn frontend(sa: &bpf_sock_addr, proto: u8) -> Frontend {
        Frontend {
            addr_be: sa.user_ip4,
            port_be: sa.user_port as u16,
            proto,
            scope: SCOPE_EXTERNAL,
        }
    }
    #[inline(always)]
    fn scoped(f: &Frontend, scope: u8) -> Frontend {
        Frontend { scope, ..*f }
    }
    #[inline(always)]
    fn port_be(f: &Frontend) -> u16 {
        f.port_be
    }
    #[inline(always)]
    fn words(f: &Frontend) -> [u32; 4] {
        [f.addr_be, 0, 0, 0]
    }
    #[inline(always)]
    fn loopback(f: &Frontend) -> bool {
        select::is_loopback(f.addr_be)
    }
    #[inline(always)]
    fn bound(sa: &bpf_sock_addr) -> Option<Client> {
        // SAFETY: `sk` is the socket the call is made on, valid for the program run.
        let src = unsafe { (*sa.__bindgen_anon_1.sk).src_ip4 };
        (src != 0).then(|| Client::addr(src))
    }
    #[inline(always)]
    fn allowed(sa: &bpf_sock_addr, f: &Frontend, svc_id: u32) -> bool {
        // SAFETY: as in `bound`.
        let src = unsafe { (*sa.__bindgen_anon_1.sk).src_ip4 };
        srcrange::allowed(svc_id, if src != 0 { src } else { f.addr_be })
    }
    #[inline(always)]
    fn user(sa: &bpf_sock_addr) -> [u32; 4] {
        [sa.user_ip4, 0, 0, 0]
    }
    #[inline(always)]
    fn set_user(sa: &mut bpf_sock_addr, addr_be: &[u32; 4], port_be: u16) {
        sa.user_ip4 = addr_be[0];
        sa.user_port = port_be as u32;
    }
}

/// The `*6` hooks.
pub struct V6;

impl Family for V6 {
    type Front = Frontend6;
    const FAMILY: u8 = FAMILY_V6;
    #[inline(always)]
    fn frontend(sa: &bpf_sock_addr, proto: u8) -> Frontend6 {
        Frontend6 {
            addr_be: Self::user(sa),
            port_be: sa.user_port as u16,
            proto,
            scope: SCOPE_EXTERNAL,
        }
    }
    #[inline(always)]
    fn scoped(f: &Frontend6, scope: u8) -> Frontend6 {
        Frontend6 { scope, ..*f }
    }
    #[inline(always)]
    fn port_be(f: &Frontend6) -> u16 {
        f.port_be
    }
    #[inline(always)]
    fn words(f: &Frontend6) -> [u32; 4] {
        f.addr_be
    }
    #[inline(always)]
    fn loopback(f: &Frontend6) -> bool {
        f.addr_be == [0, 0, 0, 1u32.to_be()]
    }
    #[inline(always)]
    fn bound(sa: &bpf_sock_addr) -> Option<Client> {
        // SAFETY: as for IPv4.
        let src = unsafe { (*sa.__bindgen_anon_1.sk).src_ip6 };
        (src != [0; 4]).then(|| Client::addr6(src))
    }
    #[inline(always)]
    fn allowed(sa: &bpf_sock_addr, f: &Frontend6, svc_id: u32) -> bool {
        // SAFETY: as in `bound`.
        let src = unsafe { (*sa.__bindgen_anon_1.sk).src_ip6 };
        if src != [0; 4] {
            srcrange::allowed6(svc_id, &src)
        } else {
            srcrange::allowed6(svc_id, &f.addr_be)
        }
    }
    #[inline(always)]
    fn user(sa: &bpf_sock_addr) -> [u32; 4] {
        // Word by word: the context allows 4-byte accesses to user_ip6.
        [
            sa.user_ip6[0],
            sa.user_ip6[1],
            sa.user_ip6[2],
            sa.user_ip6[3],
        ]
    }
    #[inline(always)]
    fn set_user(sa: &mut bpf_sock_addr, addr_be: &[u32; 4], port_be: u16) {
        sa.user_ip6[0] = addr_be[0];
        sa.user_ip6[1] = addr_be[1];
        sa.user_ip6[2] = addr_be[2];
        sa.user_ip6[3] = addr_be[3];
        sa.user_port = port_be as u32;
    }
}

/// `connect` / `sendmsg`: counts the reason; a refusal fails the call at once with
/// ECONNREFUSED (no endpoints) or EHOSTUNREACH (dropped by policy: a socket cannot wait).
#[inline(always)]
pub fn forward<F: Family>(ctx: &SockAddrContext, sendmsg: bool) -> i32 {
    match try_forward::<F>(ctx, sendmsg) {
        Ok(reason) => {
            reason.count(0);
            ALLOW
        }
        Err(reason) => {
            reason.count(0);
            let errno = if reason.0 == R_SOCK_REJECT {
                ECONNREFUSED
            } else {
                EHOSTUNREACH
            };
            // SAFETY: helper with no memory arguments.
            unsafe { bpf_set_retval(-errno) };
            REFUSE
        }
    }
}

/// `recvmsg` / `getpeername`: counts the reason; these hooks cannot refuse.
#[inline(always)]
pub fn reverse<F: Family>(ctx: &SockAddrContext) -> i32 {
    try_reverse::<F>(ctx).count(0);
    ALLOW
}

/// The run's `bpf_sock_addr`: the kernel's context, valid and this run's alone for the whole
/// run (not a map value another CPU writes). Taken once per run, so the one `&mut` is the only
/// reference to it; its lifetime is the run's, not the borrow of `ctx`.
#[inline(always)]
fn addr<'run>(ctx: &SockAddrContext) -> &'run mut bpf_sock_addr {
    // SAFETY: the kernel passes a valid context for the program run, read and written by
    // this run only.
    unsafe { &mut *ctx.sock_addr }
}

#[inline(always)]
fn proto(sa: &bpf_sock_addr) -> Option<u8> {
    match sa.protocol {
        6 => Some(IPPROTO_TCP),
        17 => Some(IPPROTO_UDP),
        _ => None,
    }
}

/// The frontend's entry the socket hooks use: its internal scope when it has one.
#[inline(always)]
fn service<F: Family>(f: F::Front) -> Option<(F::Front, &'static SvcValue)> {
    let svc = select::lookup(&f)?;
    if svc.flags & SVC_F_TWO_SCOPES != 0 {
        let inner = F::scoped(&f, SCOPE_INTERNAL);
        if let Some(s) = select::lookup(&inner) {
            return Some((inner, s));
        }
    }
    Some((f, svc))
}

/// With `--socket-lb host`, only the host namespace's sockets are translated; loopback
/// frontends (NodePorts on 127.0.0.1) are the host's alone in any mode (a pod's 127.0.0.1 is
/// its own).
#[inline(always)]
fn in_scope(ctx: &SockAddrContext, loopback: bool) -> bool {
    let Some(c) = XLB_CFG_V3.get(0) else {
        return !loopback;
    };
    if c.flags & CFG_F_SOCK_HOST_ONLY == 0 && !loopback {
        return true;
    }
    // SAFETY: helper reading the context's namespace.
    unsafe { bpf_get_netns_cookie(ctx.as_ptr()) == c.host_netns_cookie }
}

#[inline(always)]
fn key<F: Family>(cookie: u64, addr_be: [u32; 4], port_be: u16, proto: u8, dir: u8) -> SockKey {
    SockKey {
        cookie,
        addr_be,
        port_be,
        family: F::FAMILY,
        dir,
        proto,
        _pad0: 0,
        _pad1: 0,
    }
}

#[inline(always)]
fn try_forward<F: Family>(ctx: &SockAddrContext, sendmsg: bool) -> Result<Reason, Reason> {
    let sa = addr(ctx);
    let Some(proto) = proto(sa) else {
        return Ok(Reason(R_SOCK_PASS));
    };
    let Some((f, svc)) = service::<F>(F::frontend(sa, proto)) else {
        return Ok(Reason(R_SOCK_PASS));
    };
    if !in_scope(ctx, F::loopback(&f)) {
        return Ok(Reason(R_SOCK_PASS));
    }
    let client = F::bound(sa).unwrap_or_else(|| {
        // SAFETY: helper reading the context's namespace.
        Client::netns(unsafe { bpf_get_netns_cookie(ctx.as_ptr()) })
    });
    if svc.flags & SVC_F_SRC_RANGES != 0 && !F::allowed(sa, &f, svc.svc_id) {
        return Err(Reason(R_SRC_DENIED));
    }
    if svc.count == 0 {
        return Err(Reason(if svc.flags & SVC_F_DROP_EMPTY != 0 {
            R_SOCK_UNREACH
        } else {
            R_SOCK_REJECT
        }));
    }
    // SAFETY: helper reading the context's socket.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let (backend_id, be) = if sendmsg {
        sticky::<F>(&f, &client, svc, cookie, proto)?
    } else {
        let crate::maps::Chosen {
            id,
            slot,
            backend: be,
            ..
        } = select::choose(&client, svc, None)?;
        affinity::remember(&client, svc, id, slot, be.generation);
        (id, be)
    };
    let back = SockValue {
        addr_be: F::words(&f),
        port_be: F::port_be(&f),
        slot: 0,
        id: svc.svc_id,
    };
    // An LRU insert only fails under memory pressure; the socket then sees the backend's
    // address in recvmsg()/getpeername().
    let _ = XLB_SOCK_V1.insert(
        key::<F>(cookie, be.addr_be, be.port_be, proto, SOCK_DIR_REVERSE),
        back,
        0,
    );
    F::set_user(sa, &be.addr_be, be.port_be);
    reason::count_service(svc.svc_id, backend_id, 0);
    Ok(Reason(R_SOCK_XLATE))
}

/// An unconnected UDP socket's datagrams to a frontend keep going to the backend its first
/// one went to while that backend stays in its slot (kube-proxy's conntrack keeps such a
/// flow on one backend too).
#[inline(always)]
fn sticky<F: Family>(
    f: &F::Front,
    client: &Client,
    svc: &SvcValue,
    cookie: u64,
    proto: u8,
) -> Result<(u32, Backend), Reason> {
    let k = key::<F>(cookie, F::words(f), F::port_be(f), proto, SOCK_DIR_FORWARD);
    // Still in its slot, and still the same backend there (an index handed to another
    // backend holds another address).
    // SAFETY: the value is copied out at once; entries are replaced whole.
    if let Some(v) = unsafe { XLB_SOCK_V1.get(k) }
        && select::slot(svc, v.slot) == Some(v.id)
        && let Some(be) = select::backend(v.id)
        && be.addr_be == v.addr_be
        && be.port_be == v.port_be
    {
        return Ok((v.id, *be));
    }
    let crate::maps::Chosen {
        id,
        slot,
        backend: be,
        ..
    } = select::choose(client, svc, None)?;
    affinity::remember(client, svc, id, slot, be.generation);
    let v = SockValue {
        addr_be: be.addr_be,
        port_be: be.port_be,
        slot,
        id,
    };
    let _ = XLB_SOCK_V1.insert(k, v, 0);
    Ok((id, be))
}

#[inline(always)]
fn try_reverse<F: Family>(ctx: &SockAddrContext) -> Reason {
    let sa = addr(ctx);
    let Some(proto) = proto(sa) else {
        return Reason(R_SOCK_PASS);
    };
    // SAFETY: helper reading the context's socket.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let k = key::<F>(
        cookie,
        F::user(sa),
        sa.user_port as u16,
        proto,
        SOCK_DIR_REVERSE,
    );
    // SAFETY: as in `sticky`.
    match unsafe { XLB_SOCK_V1.get(k) } {
        Some(v) => {
            F::set_user(sa, &v.addr_be, v.port_be);
            Reason(R_SOCK_REVNAT)
        }
        None => Reason(R_SOCK_PASS),
    }
}
