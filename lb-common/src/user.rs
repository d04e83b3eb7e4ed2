//! The map codec, for userspace only (feature `user`): addresses to and from the maps' words,
//! frontend keys, backend values and service names built from plain values, and their text
//! (`a.b.c.d:port/PROTO`). The agent's desired state, `xlb list`, `xlb trace` and the tests
//! all encode and decode map entries here, next to the types.

extern crate std;

use std::{
    format,
    net::{IpAddr, SocketAddr},
    string::{String, ToString},
};

use crate::{
    BE_F_REMOTE, Backend, FAMILY_V4, FAMILY_V6, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP,
    SCOPE_EXTERNAL, SCOPE_INTERNAL, SVC_NAME_LEN, SvcKey, SvcName,
};

/// An address as the maps hold it: network order, IPv4 in word 0; and its family.
pub fn addr_words(ip: IpAddr) -> ([u32; 4], u8) {
    match ip {
        IpAddr::V4(v4) => ([u32::from_ne_bytes(v4.octets()), 0, 0, 0], FAMILY_V4),
        IpAddr::V6(v6) => {
            let o = v6.octets();
            let w = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
            ([w(0), w(4), w(8), w(12)], FAMILY_V6)
        }
    }
}

/// The address of map words `addr_be` of `family` (the inverse of [`addr_words`]).
pub fn words_addr(addr_be: [u32; 4], family: u8) -> IpAddr {
    if family == FAMILY_V6 {
        let mut o = [0u8; 16];
        for (i, w) in addr_be.iter().enumerate() {
            o[4 * i..4 * i + 4].copy_from_slice(&w.to_ne_bytes());
        }
        IpAddr::from(o)
    } else {
        IpAddr::from(addr_be[0].to_ne_bytes())
    }
}

/// The affinity key of client `client` of service port `svc_id`, folded as the datapath
/// folds it (`lb-ebpf/src/affinity.rs`: an IPv4 address in word 0; an IPv6 one in two
/// words, `w0 ^ w2` and `w1 ^ w3`).
pub fn affinity_key(svc_id: u32, client: IpAddr) -> crate::AffinityKey {
    let (w, family) = addr_words(client);
    let words = if family == FAMILY_V6 {
        [w[0] ^ w[2], w[1] ^ w[3], 0, 0]
    } else {
        [w[0], 0, 0, 0]
    };
    crate::AffinityKey {
        svc_id,
        client_be: words,
        family,
        _pad0: 0,
        _pad1: 0,
    }
}

/// The key of a frontend's service entry (external scope) for IP protocol `proto`.
pub fn frontend_key(ip: impl Into<IpAddr>, port: u16, proto: impl Into<u8>) -> SvcKey {
    let (addr_be, family) = addr_words(ip.into());
    SvcKey {
        addr_be,
        port_be: port.to_be(),
        proto: proto.into(),
        family,
        scope: SCOPE_EXTERNAL,
        _pad0: 0,
        _pad1: 0,
    }
}

/// The backend map value for a backend on this node (generation 0: the agent hands out the
/// generation with the index).
pub fn backend_value(ip: impl Into<IpAddr>, port: u16, proto: impl Into<u8>) -> Backend {
    let (addr_be, family) = addr_words(ip.into());
    Backend {
        addr_be,
        port_be: port.to_be(),
        proto: proto.into(),
        family,
        flags: 0,
        _pad0: 0,
        _pad1: 0,
        generation: 0,
        _pad2: 0,
    }
}

/// The backend map value for a backend on another node (or on no known node).
pub fn remote_backend_value(ip: impl Into<IpAddr>, port: u16, proto: impl Into<u8>) -> Backend {
    Backend {
        flags: BE_F_REMOTE,
        ..backend_value(ip, port, proto)
    }
}

/// Encodes a service name for the names map (truncated on a character boundary to fit,
/// NUL-padded).
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

/// `a.b.c.d:port`, or `[v6]:port`.
fn sock(addr_be: [u32; 4], family: u8, port_be: u16) -> String {
    SocketAddr::new(words_addr(addr_be, family), u16::from_be(port_be)).to_string()
}

/// `TCP`, `UDP`, `SCTP`, else `proto<n>`.
pub fn proto_name(p: u8) -> String {
    match p {
        IPPROTO_TCP => "TCP".into(),
        IPPROTO_UDP => "UDP".into(),
        IPPROTO_SCTP => "SCTP".into(),
        _ => format!("proto{p}"),
    }
}

/// `a.b.c.d:port/PROTO` of a service key (` internal` added for an internal scope).
pub fn show_frontend(k: &SvcKey) -> String {
    format!(
        "{}/{}{}",
        sock(k.addr_be, k.family, k.port_be),
        proto_name(k.proto),
        if k.scope == SCOPE_INTERNAL {
            " internal"
        } else {
            ""
        }
    )
}

/// `a.b.c.d:port/PROTO` of a backend.
pub fn show_backend(b: &Backend) -> String {
    format!(
        "{}/{}",
        sock(b.addr_be, b.family, b.port_be),
        proto_name(b.proto)
    )
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    #[test]
    fn names_are_truncated_on_a_character_boundary_and_read_back() {
        let long = "é".repeat(SVC_NAME_LEN);
        let back = svc_name_str(&svc_name(&long));
        assert!(
            back.len() <= SVC_NAME_LEN && back.chars().all(|c| c == 'é'),
            "{back}"
        );
        assert_eq!(svc_name_str(&svc_name("ns/web:http")), "ns/web:http");
    }

    #[test]
    fn keys_and_backends_hold_network_order() {
        let k = frontend_key(Ipv4Addr::new(10, 96, 0, 10), 80, IPPROTO_TCP);
        assert_eq!(k.addr_be[0].to_ne_bytes(), [10, 96, 0, 10]);
        assert_eq!(k.port_be.to_ne_bytes(), [0, 80]);
        assert_eq!(k.scope, SCOPE_EXTERNAL);
        let b = remote_backend_value(Ipv4Addr::new(10, 244, 1, 2), 8080, IPPROTO_UDP);
        assert_eq!(b.flags, BE_F_REMOTE);
        assert_eq!(u16::from_be(b.port_be), 8080);
        assert_eq!(show_backend(&b), "10.244.1.2:8080/UDP");
    }

    #[test]
    fn addresses_of_both_families_round_trip_through_map_words() {
        let v4 = IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10));
        let v6 = IpAddr::V6("fd00:10:96::a".parse::<Ipv6Addr>().expect("v6"));
        for ip in [v4, v6] {
            let (w, f) = addr_words(ip);
            assert_eq!(words_addr(w, f), ip);
        }
        // Network order in memory, as the kernel's user_ip6 words are.
        let (w, f) = addr_words(v6);
        assert_eq!(f, FAMILY_V6);
        assert_eq!(w[0].to_ne_bytes(), [0xfd, 0x00, 0x00, 0x10]);
        let k = frontend_key(v6, 80, IPPROTO_TCP);
        assert_eq!(show_frontend(&k), "[fd00:10:96::a]:80/TCP");
    }
}
