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
