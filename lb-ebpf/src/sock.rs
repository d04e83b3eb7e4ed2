//! Connect-time load balancing in cgroup sock_addr hooks: a socket's `connect()` (TCP and
//! UDP) or unconnected UDP `sendmsg()` to a frontend goes to a backend chosen by the same
//! rules as packets ([`select::choose`]); `recvmsg()` and `getpeername()` show the frontend
//! again. Such a socket's packets need no NAT at all: tc sees the backend as destination.
//!
//! The node's own processes (and hostNetwork pods) are only reachable this way: their
//! packets never cross a tc hook before they are routed.

use aya_ebpf::{
    EbpfContext,
    bindings::bpf_sock_addr,
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_set_retval},
    programs::SockAddrContext,
};
use lb_common::{
    Backend, CFG_F_SOCK_HOST_ONLY, FAMILY_V4, IPPROTO_TCP, IPPROTO_UDP, R_SOCK_PASS, R_SOCK_REJECT,
    R_SOCK_REVNAT, R_SOCK_UNREACH, R_SOCK_XLATE, R_SRC_DENIED, SCOPE_EXTERNAL, SCOPE_INTERNAL,
    SOCK_DIR_FORWARD, SOCK_DIR_REVERSE, SVC_F_DROP_EMPTY, SVC_F_SRC_RANGES, SVC_F_TWO_SCOPES,
    SockKey, SockValue, SvcValue,
};

use crate::{
    affinity::{self, Client},
    maps::{XLB_CFG_V2, XLB_SOCK_V1},
    reason::{self, Reason},
    select::{self, Frontend},
    srcrange,
};

/// The hook's verdict: the call goes on (possibly to a backend).
pub const ALLOW: i32 = 1;
/// The hook's verdict: the call fails with the errno set by `bpf_set_retval`.
pub const REFUSE: i32 = 0;

const ECONNREFUSED: i32 = 111;
const EHOSTUNREACH: i32 = 113;

/// `connect4` / `sendmsg4`: counts the reason; a refusal fails the call at once with
/// ECONNREFUSED (no endpoints) or EHOSTUNREACH (dropped by policy: a socket cannot wait).
#[inline(always)]
pub fn forward(ctx: &SockAddrContext, sendmsg: bool) -> i32 {
    match try_forward(ctx, sendmsg) {
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

/// `recvmsg4` / `getpeername4`: counts the reason; these hooks cannot refuse.
#[inline(always)]
pub fn reverse(ctx: &SockAddrContext) -> i32 {
    try_reverse(ctx).count(0);
    ALLOW
}

#[inline(always)]
fn addr(ctx: &SockAddrContext) -> &mut bpf_sock_addr {
    // SAFETY: the kernel passes a valid context for the program run.
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
fn service(f: Frontend) -> Option<(Frontend, &'static SvcValue)> {
    let svc = select::lookup(&f)?;
    if svc.flags & SVC_F_TWO_SCOPES != 0 {
        let inner = Frontend {
            scope: SCOPE_INTERNAL,
            ..f
        };
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
    let Some(c) = XLB_CFG_V2.get(0) else {
        return !loopback;
    };
    if c.flags & CFG_F_SOCK_HOST_ONLY == 0 && !loopback {
        return true;
    }
    // SAFETY: helper reading the context's namespace.
    unsafe { bpf_get_netns_cookie(ctx.as_ptr()) == c.host_netns_cookie }
}

#[inline(always)]
fn key(cookie: u64, addr_be: u32, port_be: u16, proto: u8, dir: u8) -> SockKey {
    SockKey {
        cookie,
        addr_be: [addr_be, 0, 0, 0],
        port_be,
        family: FAMILY_V4,
        dir,
        proto,
        _pad0: 0,
        _pad1: 0,
    }
}

#[inline(always)]
fn try_forward(ctx: &SockAddrContext, sendmsg: bool) -> Result<Reason, Reason> {
    let sa = addr(ctx);
    let Some(proto) = proto(sa) else {
        return Ok(Reason(R_SOCK_PASS));
    };
    let f = Frontend {
        addr_be: sa.user_ip4,
        port_be: sa.user_port as u16,
        proto,
        scope: SCOPE_EXTERNAL,
    };
    let Some((f, svc)) = service(f) else {
        return Ok(Reason(R_SOCK_PASS));
    };
    if !in_scope(ctx, select::is_loopback(f.addr_be)) {
        return Ok(Reason(R_SOCK_PASS));
    }
    // SAFETY: `sk` is the socket the call is made on, valid for the program run.
    let src = unsafe { (*sa.__bindgen_anon_1.sk).src_ip4 };
    let client = if src != 0 {
        Client::addr(src)
    } else {
        // SAFETY: helper reading the context's namespace.
        Client::netns(unsafe { bpf_get_netns_cookie(ctx.as_ptr()) })
    };
    // loadBalancerSourceRanges: an unbound socket's source will be a node address, which
    // kube-proxy allows when a range holds one (the agent then allows the frontend itself).
    if svc.flags & SVC_F_SRC_RANGES != 0
        && !srcrange::allowed(svc.svc_id, if src != 0 { src } else { f.addr_be })
    {
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
        sticky(&f, &client, svc, cookie)?
    } else {
        let (id, slot, be) = select::choose(&f, &client, svc)?;
        affinity::remember(&client, svc, id, slot, be.generation);
        (id, be)
    };
    let back = SockValue {
        addr_be: [f.addr_be, 0, 0, 0],
        port_be: f.port_be,
        slot: 0,
        id: svc.svc_id,
    };
    // An LRU insert only fails under memory pressure; the socket then sees the backend's
    // address in recvmsg()/getpeername().
    let _ = XLB_SOCK_V1.insert(
        &key(cookie, be.addr_be[0], be.port_be, proto, SOCK_DIR_REVERSE),
        &back,
        0,
    );
    sa.user_ip4 = be.addr_be[0];
    sa.user_port = be.port_be as u32;
    reason::count_service(svc.svc_id, backend_id, 0);
    Ok(Reason(R_SOCK_XLATE))
}

/// An unconnected UDP socket's datagrams to a frontend keep going to the backend its first
/// one went to while that backend stays in its slot (kube-proxy's conntrack keeps such a
/// flow on one backend too).
#[inline(always)]
fn sticky(
    f: &Frontend,
    client: &Client,
    svc: &SvcValue,
    cookie: u64,
) -> Result<(u32, Backend), Reason> {
    let k = key(cookie, f.addr_be, f.port_be, f.proto, SOCK_DIR_FORWARD);
    // Still in its slot, and still the same backend there (an index handed to another
    // backend holds another address).
    // SAFETY: the value is copied out at once; entries are replaced whole.
    if let Some(v) = unsafe { XLB_SOCK_V1.get(&k) }
        && select::slot(f, v.slot).is_some_and(|s| s.backend_id == v.id)
        && let Some(be) = select::backend(v.id)
        && be.addr_be[0] == v.addr_be[0]
        && be.port_be == v.port_be
    {
        return Ok((v.id, *be));
    }
    let (id, slot, be) = select::choose(f, client, svc)?;
    affinity::remember(client, svc, id, slot, be.generation);
    let v = SockValue {
        addr_be: be.addr_be,
        port_be: be.port_be,
        slot,
        id,
    };
    let _ = XLB_SOCK_V1.insert(&k, &v, 0);
    Ok((id, be))
}

#[inline(always)]
fn try_reverse(ctx: &SockAddrContext) -> Reason {
    let sa = addr(ctx);
    let Some(proto) = proto(sa) else {
        return Reason(R_SOCK_PASS);
    };
    // SAFETY: helper reading the context's socket.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let k = key(
        cookie,
        sa.user_ip4,
        sa.user_port as u16,
        proto,
        SOCK_DIR_REVERSE,
    );
    // SAFETY: as in `sticky`.
    match unsafe { XLB_SOCK_V1.get(&k) } {
        Some(v) => {
            sa.user_ip4 = v.addr_be[0];
            sa.user_port = v.port_be as u32;
            Reason(R_SOCK_REVNAT)
        }
        None => Reason(R_SOCK_PASS),
    }
}
