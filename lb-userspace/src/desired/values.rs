//! Map values built from model values: frontend keys, backends, service names.

use std::net::Ipv4Addr;

use lb_common::{BE_F_REMOTE, Backend, FAMILY_V4, SCOPE_EXTERNAL, SVC_NAME_LEN, SvcKey, SvcName};

use crate::model::Protocol;

/// The key of a frontend's service entry (slot 0), for IPv4 TCP/UDP.
pub fn frontend_key(ip: Ipv4Addr, port: u16, protocol: Protocol) -> SvcKey {
    SvcKey {
        addr_be: [u32::from_ne_bytes(ip.octets()), 0, 0, 0],
        port_be: port.to_be(),
        slot: 0,
        proto: protocol.number(),
        family: FAMILY_V4,
        scope: SCOPE_EXTERNAL,
        _pad: 0,
    }
}

/// The backend map value for an IPv4 backend on this node (generation 0: [`super::Ids`]
/// hands out the generation with the index).
pub fn backend_value(ip: Ipv4Addr, port: u16, protocol: Protocol) -> Backend {
    Backend {
        addr_be: [u32::from_ne_bytes(ip.octets()), 0, 0, 0],
        port_be: port.to_be(),
        proto: protocol.number(),
        family: FAMILY_V4,
        flags: 0,
        _pad0: 0,
        _pad1: 0,
        generation: 0,
        _pad2: 0,
    }
}

/// The backend map value for an IPv4 backend on another node (or on no known node).
pub fn remote_backend_value(ip: Ipv4Addr, port: u16, protocol: Protocol) -> Backend {
    Backend {
        flags: BE_F_REMOTE,
        ..backend_value(ip, port, protocol)
    }
}

/// Encodes a service name for the names map (truncated to fit, NUL-padded).
pub fn svc_name(name: &str) -> SvcName {
    let mut out = SvcName {
        name: [0; SVC_NAME_LEN],
    };
    let mut len = name.len().min(SVC_NAME_LEN);
    while !name.is_char_boundary(len) {
        len -= 1;
    }
    out.name[..len].copy_from_slice(&name.as_bytes()[..len]);
    out
}

/// Decodes a name written by [`svc_name`].
pub fn svc_name_str(name: &SvcName) -> String {
    let end = name
        .name
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(SVC_NAME_LEN);
    String::from_utf8_lossy(&name.name[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_truncated_on_a_character_boundary_and_read_back() {
        let long = "é".repeat(SVC_NAME_LEN);
        let n = svc_name(&long);
        let back = svc_name_str(&n);
        assert!(
            back.len() <= SVC_NAME_LEN && back.chars().all(|c| c == 'é'),
            "{back}"
        );
        assert_eq!(svc_name_str(&svc_name("ns/web:http")), "ns/web:http");
    }

    #[test]
    fn keys_and_backends_hold_network_order() {
        let k = frontend_key(Ipv4Addr::new(10, 96, 0, 10), 80, Protocol::Tcp);
        assert_eq!(k.addr_be[0].to_ne_bytes(), [10, 96, 0, 10]);
        assert_eq!(k.port_be.to_ne_bytes(), [0, 80]);
        assert_eq!((k.slot, k.scope), (0, SCOPE_EXTERNAL));
        let b = remote_backend_value(Ipv4Addr::new(10, 244, 1, 2), 8080, Protocol::Udp);
        assert_eq!(b.flags, BE_F_REMOTE);
        assert_eq!(u16::from_be(b.port_be), 8080);
    }
}
