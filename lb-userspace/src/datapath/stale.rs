//! Connected UDP sockets of a removed backend are destroyed, so the application's next call
//! fails and it connects again, through the socket hooks, to a live backend. This is what
//! kube-proxy's conntrack flush does for UDP flows, and what keeps a DNS client from staying
//! on a deleted CoreDNS pod under socket-level load balancing.
//!
//! The sockets are found by their cookie in the socket map (the hooks record which frontend
//! each socket was sent through) and destroyed with `SOCK_DESTROY` over sock_diag netlink,
//! in the agent's namespace and, with `--socket-lb all`, in the namespaces of the processes
//! under the hooks' cgroup.

use std::{
    collections::BTreeSet,
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
};

use aya::maps::HashMap;
use lb_common::{IPPROTO_UDP, MAP_SOCK, SOCK_DIR_REVERSE, SockKey, SockValue};
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_sock_diag::{
    SockDiagDestroy, SockDiagMessage,
    constants::{AF_INET, IPPROTO_UDP as NL_UDP},
    inet::{ExtensionFlags, InetRequest, SocketId, StateFlags},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_SOCK_DIAG};

use super::{DatapathError, pins::Pins};
use crate::desired::Desired;

/// Most network namespaces searched for one removal (a node runs a few hundred pods).
pub const MAX_NAMESPACES: usize = 4096;

/// A UDP frontend and one of its backends, both `(address, port)` in network order.
pub type Pair = ((u32, u16), (u32, u16));

/// The UDP (frontend, backend) pairs `before` programs and `after` no longer does.
/// The (frontend, backend) pairs of the UDP slots of `frontends` (entry keys) in `d`: what
/// an incremental sync compares before and after.
pub fn udp_pairs(d: &Desired, frontends: &BTreeSet<lb_common::SvcKey>) -> BTreeSet<Pair> {
    frontends
        .iter()
        .filter(|k| k.proto == IPPROTO_UDP)
        .filter_map(|k| d.services.get(k).map(|v| (k, v)))
        .flat_map(|(k, v)| {
            v.slots.iter().filter_map(move |id| {
                let be = d.backends.get(id)?;
                Some(((k.addr_be[0], k.port_be), (be.addr_be[0], be.port_be)))
            })
        })
        .collect()
}

pub fn removed_udp(before: &Desired, after: &Desired) -> BTreeSet<Pair> {
    let pairs = |d: &Desired| -> BTreeSet<Pair> {
        d.services
            .iter()
            .filter(|(k, _)| k.proto == IPPROTO_UDP)
            .flat_map(|(k, v)| {
                v.slots.iter().filter_map(move |id| {
                    let be = d.backends.get(id)?;
                    Some(((k.addr_be[0], k.port_be), (be.addr_be[0], be.port_be)))
                })
            })
            .collect()
    };
    let now = pairs(after);
    pairs(before)
        .into_iter()
        .filter(|p| !now.contains(p))
        .collect()
}

/// The cookies of UDP sockets the hooks sent through one of `gone`, from the pinned socket
/// map of `pins`; their entries are removed.
pub fn cookies(pins: &Pins, gone: &BTreeSet<Pair>) -> Result<BTreeSet<u64>, DatapathError> {
    let mut map: HashMap<_, SockKey, SockValue> =
        HashMap::try_from(pins.map(MAP_SOCK)?).map_err(|source| DatapathError::Map {
            name: MAP_SOCK,
            source,
        })?;
    let stale: Vec<SockKey> = map
        .iter()
        .filter_map(Result::ok)
        .filter(|(k, v)| {
            k.dir == SOCK_DIR_REVERSE
                && k.proto == IPPROTO_UDP
                && gone.contains(&((v.addr_be[0], v.port_be), (k.addr_be[0], k.port_be)))
        })
        .map(|(k, _)| k)
        .collect();
    for k in &stale {
        let _ = map.remove(k);
    }
    Ok(stale.iter().map(|k| k.cookie).collect())
}

/// The network namespaces to search: the agent's own, then (when `cgroup` is given) those
/// of the processes in that cgroup's subtree, each once, at most [`MAX_NAMESPACES`].
pub fn namespaces(cgroup: Option<&Path>) -> Vec<PathBuf> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    let mut add = |p: PathBuf| {
        if out.len() < MAX_NAMESPACES
            && let Ok(m) = std::fs::metadata(&p)
            && seen.insert((m.dev(), m.ino()))
        {
            out.push(p);
        }
    };
    add(PathBuf::from("/proc/self/ns/net"));
    let Some(root) = cgroup else {
        return out;
    };
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            for pid in procs.lines().filter(|l| !l.is_empty()) {
                add(PathBuf::from(format!("/proc/{pid}/ns/net")));
            }
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            dirs.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    out
}

/// Destroys the UDP sockets of namespace `ns` whose cookie is in `cookies`, from a thread of
/// its own (a namespace belongs to a thread); returns how many went.
pub fn destroy_in(ns: &Path, cookies: &BTreeSet<u64>) -> std::io::Result<usize> {
    let ns = ns.to_path_buf();
    let cookies = cookies.clone();
    std::thread::spawn(move || {
        let file = std::fs::File::open(&ns)?;
        // SAFETY: a valid descriptor; this thread is ours alone and ends after the call.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        destroy_here(&cookies)
    })
    .join()
    .map_err(|_| std::io::Error::other("socket destroy thread panicked"))?
}

fn request(socket_id: SocketId) -> InetRequest {
    InetRequest {
        family: AF_INET,
        protocol: NL_UDP,
        extensions: ExtensionFlags::empty(),
        states: StateFlags::all(),
        socket_id,
    }
}

fn send<T>(sock: &Socket, mut msg: NetlinkMessage<T>) -> std::io::Result<()>
where
    T: netlink_packet_core::NetlinkSerializable + std::fmt::Debug,
{
    msg.finalize();
    let mut buf = vec![0; msg.buffer_len()];
    msg.serialize(&mut buf);
    sock.send(&buf, 0).map(|_| ())
}

/// Every IPv4 UDP socket of the calling thread's namespace whose cookie is in `cookies`.
fn matching(sock: &Socket, cookies: &BTreeSet<u64>) -> std::io::Result<Vec<SocketId>> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let req = SockDiagMessage::InetRequest(request(SocketId::new_v4()));
    send(sock, NetlinkMessage::new(header, req.into()))?;
    let mut found = Vec::new();
    let mut buf = Vec::with_capacity(64 * 1024);
    loop {
        buf.clear();
        let n = sock.recv(&mut buf, 0)?;
        let mut off = 0;
        while off < n {
            let msg = NetlinkMessage::<SockDiagMessage>::deserialize(&buf[off..n])
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            let len = msg.header.length as usize;
            match msg.payload {
                NetlinkPayload::Done(_) => return Ok(found),
                NetlinkPayload::Error(e) => {
                    return Err(std::io::Error::other(format!("sock_diag dump: {e:?}")));
                }
                NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                    let id = r.header.socket_id;
                    if cookies.contains(&u64::from_ne_bytes(id.cookie)) {
                        found.push(id);
                    }
                }
                _ => {}
            }
            if len == 0 {
                break;
            }
            off += (len + 3) & !3;
        }
    }
}

fn destroy_here(cookies: &BTreeSet<u64>) -> std::io::Result<usize> {
    let mut sock = Socket::new(NETLINK_SOCK_DIAG)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    let mut destroyed = 0;
    for id in matching(&sock, cookies)? {
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK;
        let req = SockDiagDestroy::new(SockDiagMessage::InetRequest(request(id)));
        send(
            &sock,
            NetlinkMessage::new(header, NetlinkPayload::InnerMessage(req)),
        )?;
        let mut buf = Vec::with_capacity(4096);
        sock.recv(&mut buf, 0)?;
        if let Ok(ack) = NetlinkMessage::<SockDiagMessage>::deserialize(&buf)
            && let NetlinkPayload::Error(e) = ack.payload
            && e.code.is_some()
        {
            tracing::debug!("SOCK_DESTROY refused: {e:?}");
            continue;
        }
        destroyed += 1;
    }
    Ok(destroyed)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use lb_common::SvcValue;

    use super::*;
    use crate::desired::SvcEntry;
    use lb_common::user::frontend_key;

    use crate::model::Protocol;

    fn state(frontends: &[(Protocol, &[u8])]) -> Desired {
        let mut d = Desired::default();
        for (i, (proto, backends)) in frontends.iter().enumerate() {
            let key = frontend_key(Ipv4Addr::new(10, 96, 0, i as u8 + 1), 53, *proto);
            for b in backends.iter() {
                d.backends.insert(
                    u32::from(*b),
                    lb_common::user::backend_value(Ipv4Addr::new(10, 244, 0, *b), 5353, *proto),
                );
            }
            let slots: Vec<u32> = backends.iter().map(|b| u32::from(*b)).collect();
            let value = SvcValue {
                count: slots.len() as u16,
                ..SvcValue::default()
            };
            d.services.insert(key, SvcEntry::new(value, slots));
        }
        d
    }

    #[test]
    fn only_udp_backends_that_left_their_frontend_count() {
        let before = state(&[(Protocol::Udp, &[1, 2]), (Protocol::Tcp, &[3])]);
        let after = state(&[(Protocol::Udp, &[2]), (Protocol::Tcp, &[])]);
        let gone = removed_udp(&before, &after);
        let be = |b: u8| (u32::from_ne_bytes([10, 244, 0, b]), 5353u16.to_be());
        let fe = (u32::from_ne_bytes([10, 96, 0, 1]), 53u16.to_be());
        assert_eq!(gone.into_iter().collect::<Vec<_>>(), vec![(fe, be(1))]);
        assert!(removed_udp(&after, &after).is_empty());
    }
}
