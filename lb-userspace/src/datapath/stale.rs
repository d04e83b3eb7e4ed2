//! Connected UDP sockets of a removed backend are destroyed, so the application's next call
//! fails and it connects again, through the socket hooks, to a live backend. This is what
//! kube-proxy's conntrack flush does for UDP flows, and what keeps a DNS client from staying
//! on a deleted CoreDNS pod under socket-level load balancing.
//!
//! The sockets are found by their cookie in the socket map (the hooks record which frontend
//! each socket was sent through) and destroyed with `SOCK_DESTROY` over sock_diag netlink,
//! in the agent's namespace and, with `--socket-lb all`, in the namespaces of the processes
//! under the hooks' cgroup: entered one after the other by the thread that destroys them
//! (the agent's worker, `agent::stale_udp`, off the sync loop), which comes back to its own
//! after each.

use std::{
    collections::BTreeSet,
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
};

use aya::maps::HashMap;
use lb_common::{Backend, IPPROTO_UDP, MAP_SOCK, SOCK_DIR_REVERSE, SockKey, SockValue, SvcKey};
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_sock_diag::{
    SockDiagDestroy, SockDiagMessage,
    constants::{AF_INET, AF_INET6, IPPROTO_UDP as NL_UDP},
    inet::{ExtensionFlags, InetRequest, SocketId, StateFlags},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_SOCK_DIAG};

use super::{DatapathError, counts, netlink, pins::Pins};
use crate::desired::Desired;

/// Most network namespaces searched for one removal (a node runs a few hundred pods).
pub const MAX_NAMESPACES: usize = 4096;

/// A UDP frontend and one of its backends, both `(address, port)` in network order (all
/// four words: IPv4 in word 0, as every map holds it).
pub type Pair = (([u32; 4], u16), ([u32; 4], u16));

/// The pair of frontend `k` and backend `be`.
fn pair(k: &SvcKey, be: &Backend) -> Pair {
    ((k.addr_be, k.port_be), (be.addr_be, be.port_be))
}

/// The UDP (frontend, backend) pairs of `(key, entry)` in `d`.
fn pairs_of<'a>(
    d: &'a Desired,
    frontends: impl Iterator<Item = (&'a SvcKey, &'a crate::desired::SvcEntry)> + 'a,
) -> impl Iterator<Item = Pair> + 'a {
    frontends
        .filter(|(k, _)| k.proto == IPPROTO_UDP)
        .flat_map(move |(k, v)| {
            v.slots
                .iter()
                .filter_map(move |id| d.backends.get(id).map(|be| pair(k, be)))
        })
}

/// The (frontend, backend) pairs of the UDP slots of `frontends` (entry keys) in `d`: what
/// an incremental sync compares before and after.
pub fn udp_pairs(d: &Desired, frontends: &BTreeSet<SvcKey>) -> BTreeSet<Pair> {
    let entries = frontends
        .iter()
        .filter_map(|k| d.services.get(k).map(|v| (k, v)));
    pairs_of(d, entries).collect()
}

/// The UDP (frontend, backend) pairs `before` programs and `after` no longer does.
pub fn removed_udp(before: &Desired, after: &Desired) -> BTreeSet<Pair> {
    let now: BTreeSet<Pair> = pairs_of(after, after.services.iter()).collect();
    pairs_of(before, before.services.iter())
        .filter(|p| !now.contains(p))
        .collect()
}

/// The cookies of UDP sockets the hooks sent through one of `gone`, from the pinned socket
/// map of `pins` (read in batches: a few syscalls for the whole map, which the kernel's
/// LRU may be evicting from meanwhile); their entries are removed.
pub fn cookies(pins: &Pins, gone: &BTreeSet<Pair>) -> Result<BTreeSet<u64>, DatapathError> {
    let map = pins.map(MAP_SOCK)?;
    let stale = counts::entries_where(&map, MAP_SOCK, |k: &SockKey, v: &SockValue| {
        k.dir == SOCK_DIR_REVERSE
            && k.proto == IPPROTO_UDP
            && gone.contains(&((v.addr_be, v.port_be), (k.addr_be, k.port_be)))
    })?;
    let mut map: HashMap<_, SockKey, SockValue> =
        HashMap::try_from(map).map_err(|source| DatapathError::Map {
            name: MAP_SOCK,
            source,
        })?;
    for (k, _) in &stale {
        let _ = map.remove(k);
    }
    Ok(stale.iter().map(|(k, _)| k.cookie).collect())
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

/// The calling thread's network namespace, to come back to after [`destroy_in`] entered
/// another.
#[derive(Debug)]
pub struct Home(std::fs::File);

impl Home {
    /// The calling thread's namespace.
    pub fn here() -> std::io::Result<Self> {
        std::fs::File::open("/proc/thread-self/ns/net").map(Home)
    }
}

/// Moves the calling thread into the network namespace `ns` (a descriptor of it).
fn enter(ns: &std::fs::File) -> std::io::Result<()> {
    // SAFETY: a valid descriptor; only the calling thread changes namespace.
    match unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Why [`destroy_in`] destroyed nothing.
#[derive(Debug, thiserror::Error)]
pub enum DestroyError {
    /// The namespace could not be entered or searched (the calling thread is home).
    #[error("{0}")]
    There(std::io::Error),
    /// The calling thread could not come back to its namespace: it stays in another
    /// one (and holds it alive) until it ends.
    #[error("cannot come back to the agent's network namespace: {0}")]
    Stranded(std::io::Error),
}

/// Destroys the UDP sockets of namespace `ns` whose cookie is in `cookies`: the calling
/// thread enters it and comes back to `home` (a namespace belongs to a thread, so the
/// caller is a thread of its own, never an async runtime's worker); returns how many went.
pub fn destroy_in(ns: &Path, cookies: &BTreeSet<u64>, home: &Home) -> Result<usize, DestroyError> {
    let file = std::fs::File::open(ns).map_err(DestroyError::There)?;
    enter(&file).map_err(DestroyError::There)?;
    let destroyed = destroy_here(cookies);
    enter(&home.0).map_err(DestroyError::Stranded)?;
    destroyed.map_err(DestroyError::There)
}

fn request(family: u8, socket_id: SocketId) -> InetRequest {
    InetRequest {
        family,
        protocol: NL_UDP,
        extensions: ExtensionFlags::empty(),
        states: StateFlags::all(),
        socket_id,
    }
}

/// Every UDP socket of `family` in the calling thread's namespace whose cookie is in
/// `cookies` (an IPv6 socket may talk to an IPv4 backend through a mapped address: its
/// cookie is in the map as an IPv4 one, so both families are searched for every cookie).
fn matching(sock: &Socket, family: u8, cookies: &BTreeSet<u64>) -> std::io::Result<Vec<SocketId>> {
    let any = match family {
        AF_INET6 => SocketId::new_v6(),
        _ => SocketId::new_v4(),
    };
    let req = SockDiagMessage::InetRequest(request(family, any));
    let mut found = Vec::new();
    netlink::exchange(sock, NLM_F_REQUEST | NLM_F_DUMP, req, |m| {
        if let SockDiagMessage::InetResponse(r) = m
            && cookies.contains(&u64::from_ne_bytes(r.header.socket_id.cookie))
        {
            found.push(r.header.socket_id);
        }
    })?;
    Ok(found)
}

fn destroy_here(cookies: &BTreeSet<u64>) -> std::io::Result<usize> {
    let mut sock = Socket::new(NETLINK_SOCK_DIAG)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    let mut destroyed = 0;
    let mut found = Vec::new();
    for family in [AF_INET, AF_INET6] {
        found.extend(
            matching(&sock, family, cookies)?
                .into_iter()
                .map(|id| (family, id)),
        );
    }
    for (family, id) in found {
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK;
        let req = SockDiagDestroy::new(SockDiagMessage::InetRequest(request(family, id)));
        netlink::send(
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
        let be = |b: u8| {
            (
                [u32::from_ne_bytes([10, 244, 0, b]), 0, 0, 0],
                5353u16.to_be(),
            )
        };
        let fe = ([u32::from_ne_bytes([10, 96, 0, 1]), 0, 0, 0], 53u16.to_be());
        assert_eq!(gone.into_iter().collect::<Vec<_>>(), vec![(fe, be(1))]);
        assert!(removed_udp(&after, &after).is_empty());
    }
}
