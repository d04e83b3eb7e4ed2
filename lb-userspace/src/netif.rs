//! The current network namespace's interfaces (if_nameindex asks the kernel over netlink).

/// Names of every interface in this process's network namespace.
pub fn interfaces() -> Vec<String> {
    let mut names = Vec::new();
    // SAFETY: if_nameindex returns a NULL-terminated array freed with if_freenameindex.
    unsafe {
        let list = libc::if_nameindex();
        if list.is_null() {
            return names;
        }
        let mut p = list;
        while (*p).if_index != 0 && !(*p).if_name.is_null() {
            names.push(
                std::ffi::CStr::from_ptr((*p).if_name)
                    .to_string_lossy()
                    .into_owned(),
            );
            p = p.add(1);
        }
        libc::if_freenameindex(list);
    }
    names.sort();
    names
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
