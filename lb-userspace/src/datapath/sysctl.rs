//! The few sysctls the agent reads or sets.

/// `net.ipv4.ip_local_port_range`: the node's ephemeral ports.
pub fn ephemeral_ports() -> Option<std::ops::RangeInclusive<u16>> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut it = text
        .split_whitespace()
        .filter_map(|p| p.parse::<u16>().ok());
    Some(it.next()?..=it.next()?)
}
