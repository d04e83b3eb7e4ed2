//! The current network namespace's interfaces and their addresses (through nix), and a
//! watch of their changes over rtnetlink (netlink-sys, parsed with netlink-packet-route).

/// Every interface in this process's network namespace, by name, with its index (a
/// re-created interface has the same name and a new index).
pub fn interfaces() -> std::collections::BTreeMap<String, u32> {
    match nix::net::if_::if_nameindex() {
        Ok(list) => list
            .iter()
            .map(|i| (i.name().to_string_lossy().into_owned(), i.index()))
            .collect(),
        Err(e) => {
            tracing::warn!("cannot list the interfaces: {e}");
            Default::default()
        }
    }
}

/// What changed in this namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkChange {
    /// An interface was added, removed or changed (rtnetlink's link group).
    Links,
    /// An address of either family was added or removed.
    Addresses,
    /// A rule selecting by source, or an IPv6 route with a source prefix, was added or
    /// removed (whether XDP may keep the way out per backend, `routing`).
    Routing,
}

/// The rtnetlink groups watched: links, the addresses of both families (an IPv6 address
/// added after start is a NodePort address as an IPv4 one is), the rules of both families
/// and the IPv6 routes (`routing`).
const GROUPS: u32 = (libc::RTMGRP_LINK
    | libc::RTMGRP_IPV4_IFADDR
    | libc::RTMGRP_IPV6_IFADDR
    | libc::RTMGRP_IPV4_RULE
    | libc::RTMGRP_IPV6_ROUTE) as u32
    | 1 << (libc::RTNLGRP_IPV6_RULE - 1);

/// Calls `notify` on every link and address change (both families) in this namespace, from
/// one thread for the life of the process (until `notify` returns false). `Err` when the
/// netlink socket cannot be opened (the caller then polls).
pub fn watch_links(
    mut notify: impl FnMut(LinkChange) -> bool + Send + 'static,
) -> std::io::Result<()> {
    use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind(&SocketAddr::new(0, GROUPS))?;
    std::thread::Builder::new()
        .name("xlb-links".into())
        .spawn(move || {
            let mut buf = Vec::with_capacity(64 * 1024);
            loop {
                buf.clear();
                // ENOBUFS (an overrun) is a change of every kind: the caller looks again.
                let (links, addrs, routing) = match sock.recv(&mut buf, 0) {
                    Ok(_) => changes(&buf),
                    Err(_) => (true, true, true),
                };
                let sent = (!links || notify(LinkChange::Links))
                    && (!addrs || notify(LinkChange::Addresses))
                    && (!routing || notify(LinkChange::Routing));
                if !sent {
                    return;
                }
            }
        })?;
    Ok(())
}

/// Whether the rtnetlink messages in `buf` changed links, addresses (of either family),
/// routing by source (`routing::BySource`): parsed with netlink-packet-route; a message it
/// cannot parse counts as all three (the caller looks again).
fn changes(buf: &[u8]) -> (bool, bool, bool) {
    use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
    use netlink_packet_route::{RouteNetlinkMessage as Rt, address::AddressAttribute};
    let (mut links, mut addrs) = (false, false);
    let mut by_source = super::routing::BySource::default();
    let mut off = 0;
    while off < buf.len() {
        let msg = match NetlinkMessage::<Rt>::deserialize(&buf[off..]) {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!("rtnetlink message not understood ({e}); looking again");
                return (true, true, true);
            }
        };
        match &msg.payload {
            NetlinkPayload::InnerMessage(m @ (Rt::NewAddress(a) | Rt::DelAddress(a))) => {
                addrs = true;
                let added = matches!(m, Rt::NewAddress(_));
                for attr in &a.attributes {
                    if let AddressAttribute::Address(ip) = attr {
                        tracing::debug!(%ip, index = a.header.index, added, "interface address changed");
                    }
                }
            }
            NetlinkPayload::InnerMessage(Rt::NewLink(_) | Rt::DelLink(_)) => links = true,
            NetlinkPayload::InnerMessage(m) => by_source.see(m),
            _ => {}
        }
        let len = msg.header.length as usize;
        if len == 0 {
            break;
        }
        // Messages are aligned to 4 bytes.
        off += (len + 3) & !3;
    }
    let routing = by_source != super::routing::BySource::default();
    (links, addrs, routing)
}

/// Every (interface, address) pair of this process's network namespace, both families.
fn all_addresses() -> Vec<(String, std::net::IpAddr)> {
    let list = match nix::ifaddrs::getifaddrs() {
        Ok(list) => list,
        Err(e) => {
            tracing::warn!("cannot read the interfaces' addresses: {e}");
            return Vec::new();
        }
    };
    list.filter_map(|a| {
        let sa = a.address?;
        let ip = match (sa.as_sockaddr_in(), sa.as_sockaddr_in6()) {
            (Some(v4), _) => v4.ip().into(),
            (_, Some(v6)) => v6.ip().into(),
            _ => return None,
        };
        Some((a.interface_name, ip))
    })
    .collect()
}

/// The addresses of interface `name` in this process's network namespace, both families.
pub fn addresses(name: &str) -> Vec<std::net::IpAddr> {
    all_addresses()
        .into_iter()
        .filter(|(i, _)| i == name)
        .map(|(_, ip)| ip)
        .collect()
}

/// Every address of every interface in this process's network namespace.
pub fn local_addresses() -> std::collections::BTreeSet<std::net::IpAddr> {
    all_addresses().into_iter().map(|(_, ip)| ip).collect()
}

/// The addresses NodePorts are served on by default on interface `name`: its IPv4 ones and
/// its global IPv6 ones (not link-local: kube-proxy serves no NodePort there).
pub fn node_port_addresses(name: &str) -> Vec<std::net::IpAddr> {
    addresses(name)
        .into_iter()
        .filter(|ip| match ip {
            std::net::IpAddr::V4(_) => true,
            std::net::IpAddr::V6(v6) => !v6.is_loopback() && !v6.is_unicast_link_local(),
        })
        .collect()
}

/// The index of interface `name`, if it exists.
pub fn ifindex(name: &str) -> Option<u32> {
    nix::net::if_::if_nametoindex(name).ok()
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};
    use netlink_packet_route::{
        AddressFamily, RouteNetlinkMessage as Rt,
        address::{AddressAttribute, AddressMessage},
        link::LinkMessage,
    };

    use super::changes;

    fn bytes(m: Rt) -> Vec<u8> {
        let mut msg = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::from(m));
        msg.finalize();
        let mut buf = vec![0; msg.buffer_len()];
        msg.serialize(&mut buf);
        buf
    }

    fn address6(new: bool) -> Rt {
        let mut a = AddressMessage::default();
        a.header.family = AddressFamily::Inet6;
        a.header.prefix_len = 64;
        a.header.index = 7;
        a.attributes
            .push(AddressAttribute::Address("fd00::5".parse().expect("ip")));
        if new {
            Rt::NewAddress(a)
        } else {
            Rt::DelAddress(a)
        }
    }

    #[test]
    fn ipv6_address_and_link_events_are_told_apart() {
        assert_eq!(changes(&bytes(address6(true))), (false, true, false));
        assert_eq!(changes(&bytes(address6(false))), (false, true, false));
        assert_eq!(
            changes(&bytes(Rt::NewLink(LinkMessage::default()))),
            (true, false, false)
        );
        let both = [
            bytes(address6(true)),
            bytes(Rt::DelLink(LinkMessage::default())),
        ]
        .concat();
        assert_eq!(changes(&both), (true, true, false));
        // Something that is not a netlink message: look at everything again.
        assert_eq!(changes(&[1, 2, 3]), (true, true, true));
    }

    #[test]
    fn a_rule_by_source_is_a_routing_change_and_a_plain_one_is_not() {
        use netlink_packet_route::{AddressFamily, rule::RuleMessage};
        let rule = |src_len| {
            let mut r = RuleMessage::default();
            r.header.family = AddressFamily::Inet;
            r.header.src_len = src_len;
            Rt::NewRule(r)
        };
        assert_eq!(changes(&bytes(rule(24))), (false, false, true));
        assert_eq!(changes(&bytes(rule(0))), (false, false, false));
        assert_ne!(super::GROUPS & libc::RTMGRP_IPV4_RULE as u32, 0);
        assert_ne!(super::GROUPS & 1 << (libc::RTNLGRP_IPV6_RULE - 1), 0);
    }

    #[test]
    fn the_watch_subscribes_to_both_address_families() {
        assert_ne!(super::GROUPS & libc::RTMGRP_IPV6_IFADDR as u32, 0);
        assert_ne!(super::GROUPS & libc::RTMGRP_IPV4_IFADDR as u32, 0);
    }
}
