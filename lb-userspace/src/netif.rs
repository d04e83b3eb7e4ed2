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

/// Wakes `tx` on every link change in this namespace (an interface added, removed or
/// changed: rtnetlink's link group), from one thread for the life of the process. `Err`
/// when the netlink socket cannot be opened (the caller then polls).
pub fn watch_links(tx: std::sync::mpsc::Sender<()>) -> std::io::Result<()> {
    use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
    const RTMGRP_LINK: u32 = 1;
    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind(&SocketAddr::new(0, RTMGRP_LINK))?;
    std::thread::Builder::new()
        .name("xlb-links".into())
        .spawn(move || {
            let mut buf = Vec::with_capacity(64 * 1024);
            loop {
                buf.clear();
                // ENOBUFS (an overrun) is a change too: the caller lists everything anyway.
                let _ = sock.recv(&mut buf, 0);
                if tx.send(()).is_err() {
                    return;
                }
            }
        })?;
    Ok(())
}

/// The IPv4 addresses of interface `name` in this process's network namespace.
pub fn ipv4_addresses(name: &str) -> Vec<std::net::Ipv4Addr> {
    let mut out = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list`, freed with freeifaddrs; every pointer is checked.
    unsafe {
        if libc::getifaddrs(&mut list) != 0 {
            return out;
        }
        let mut p = list;
        while !p.is_null() {
            let a = &*p;
            if !a.ifa_addr.is_null()
                && i32::from((*a.ifa_addr).sa_family) == libc::AF_INET
                && !a.ifa_name.is_null()
                && std::ffi::CStr::from_ptr(a.ifa_name).to_string_lossy() == name
            {
                let sin = &*(a.ifa_addr as *const libc::sockaddr_in);
                out.push(std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
            }
            p = a.ifa_next;
        }
        libc::freeifaddrs(list);
    }
    out
}

/// The index of interface `name`, if it exists.
pub fn ifindex(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: a valid NUL-terminated name.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}
