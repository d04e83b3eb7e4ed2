//! The current network namespace's interfaces (if_nameindex asks the kernel over netlink).

/// Every interface in this process's network namespace, by name, with its index (a
/// re-created interface has the same name and a new index).
pub fn interfaces() -> std::collections::BTreeMap<String, u32> {
    let mut names = std::collections::BTreeMap::new();
    // SAFETY: if_nameindex returns a NULL-terminated array freed with if_freenameindex.
    unsafe {
        let list = libc::if_nameindex();
        if list.is_null() {
            return names;
        }
        let mut p = list;
        while (*p).if_index != 0 && !(*p).if_name.is_null() {
            names.insert(
                std::ffi::CStr::from_ptr((*p).if_name)
                    .to_string_lossy()
                    .into_owned(),
                (*p).if_index,
            );
            p = p.add(1);
        }
        libc::if_freenameindex(list);
    }
    names
}

/// What changed in this namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkChange {
    /// An interface was added, removed or changed (rtnetlink's link group).
    Links,
    /// An IPv4 address was added or removed.
    Addresses,
}

/// Calls `notify` on every link and IPv4 address change in this namespace, from one thread
/// for the life of the process (until `notify` returns false). `Err` when the netlink socket
/// cannot be opened (the caller then polls).
pub fn watch_links(
    mut notify: impl FnMut(LinkChange) -> bool + Send + 'static,
) -> std::io::Result<()> {
    use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
    const RTMGRP_LINK: u32 = 1;
    const RTMGRP_IPV4_IFADDR: u32 = 0x10;
    const RTM_NEWADDR: u16 = 20;
    const RTM_DELADDR: u16 = 21;
    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind(&SocketAddr::new(0, RTMGRP_LINK | RTMGRP_IPV4_IFADDR))?;
    std::thread::Builder::new()
        .name("xlb-links".into())
        .spawn(move || {
            let mut buf = Vec::with_capacity(64 * 1024);
            loop {
                buf.clear();
                // ENOBUFS (an overrun) is a change of both kinds: the caller looks again.
                let (mut links, mut addrs) = (false, false);
                match sock.recv(&mut buf, 0) {
                    Ok(_) => {
                        // Netlink messages: a 16-byte header (length, type, ...) each.
                        let mut off = 0;
                        while off + 16 <= buf.len() {
                            let len = u32::from_ne_bytes([
                                buf[off],
                                buf[off + 1],
                                buf[off + 2],
                                buf[off + 3],
                            ]) as usize;
                            let kind = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
                            if kind == RTM_NEWADDR || kind == RTM_DELADDR {
                                addrs = true;
                            } else {
                                links = true;
                            }
                            if len < 16 {
                                break;
                            }
                            off += (len + 3) & !3;
                        }
                    }
                    Err(_) => (links, addrs) = (true, true),
                }
                let sent = (!links || notify(LinkChange::Links))
                    && (!addrs || notify(LinkChange::Addresses));
                if !sent {
                    return;
                }
            }
        })?;
    Ok(())
}

/// The addresses of interface `name` in this process's network namespace, both families.
pub fn addresses(name: &str) -> Vec<std::net::IpAddr> {
    let mut out = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list`, freed with freeifaddrs; every pointer is checked, and
    // an address is read as the sockaddr its family says it is.
    unsafe {
        if libc::getifaddrs(&mut list) != 0 {
            return out;
        }
        let mut p = list;
        while !p.is_null() {
            let a = &*p;
            if !a.ifa_addr.is_null()
                && !a.ifa_name.is_null()
                && std::ffi::CStr::from_ptr(a.ifa_name).to_string_lossy() == name
            {
                match i32::from((*a.ifa_addr).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(a.ifa_addr as *const libc::sockaddr_in);
                        let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                        out.push(ip.into());
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(a.ifa_addr as *const libc::sockaddr_in6);
                        out.push(std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr).into());
                    }
                    _ => {}
                }
            }
            p = a.ifa_next;
        }
        libc::freeifaddrs(list);
    }
    out
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
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: a valid NUL-terminated name.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}
