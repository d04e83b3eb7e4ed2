//! The few sysctls the agent reads or sets.

/// `net.ipv4.ip_local_port_range`: the node's ephemeral ports.
pub fn ephemeral_ports() -> Option<std::ops::RangeInclusive<u16>> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut it = text
        .split_whitespace()
        .filter_map(|p| p.parse::<u16>().ok());
    Some(it.next()?..=it.next()?)
}

/// Sets `net.ipv4.conf.IFACE.accept_local=1`: a reverse-NATed NodePort reply carries the
/// node's own address as source, which the kernel would otherwise drop as a martian.
pub fn accept_local(iface: &str) -> std::io::Result<()> {
    std::fs::write(format!("/proc/sys/net/ipv4/conf/{iface}/accept_local"), "1")
}
