//! kube-proxy's chain and set names (hashes of the service port and endpoint) and number
//! formatting.

use sha2::{Digest, Sha256};

use crate::model::{Protocol, select::EndpointView};

const B32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// RFC 4648 base32 (standard alphabet, `=` padding) of `bytes`.
pub fn base32(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(5) * 8);
    for chunk in bytes.chunks(5) {
        let mut buf = [0u8; 5];
        buf[..chunk.len()].copy_from_slice(chunk);
        let v = buf.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
        let chars = (chunk.len() * 8).div_ceil(5);
        for i in 0..8 {
            if i < chars {
                let idx = ((v >> (35 - 5 * i)) & 31) as usize;
                out.push(char::from(B32[idx]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The first `len` characters of base32(sha256(`s`)).
pub fn hash(s: &str, len: usize) -> String {
    let mut h = base32(&Sha256::digest(s.as_bytes()));
    h.truncate(len);
    h
}

/// The 16-character hash kube-proxy's iptables mode appends to a service port's chains
/// (`KUBE-SVC-`, `KUBE-SVL-`, `KUBE-EXT-`, `KUBE-FW-`): of `ns/name:port` + `tcp`.
pub fn service_port_hash(port_name: &str, protocol: Protocol) -> String {
    hash(&format!("{port_name}{}", protocol.lower()), 16)
}

/// `KUBE-SEP-…` of an endpoint of a service port: the hash of `ns/name:port` + `tcp` +
/// `ip:port`.
pub fn endpoint_chain(port_name: &str, protocol: Protocol, ep: &EndpointView) -> String {
    format!(
        "KUBE-SEP-{}",
        hash(&format!("{port_name}{}{ep}", protocol.lower()), 16)
    )
}

/// nftables' `hashAndTruncate`: 8 hash characters, `-`, then the hashed text itself.
pub fn nft_name(prefix: &str, base: &str) -> String {
    format!("{prefix}-{}-{base}", hash(base, 8))
}

/// `1/n` with ten decimals, as kube-proxy writes `--probability`.
pub fn probability(n: usize) -> String {
    format!("{:.10}", 1.0 / n as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base32_matches_rfc4648_vectors() {
        assert_eq!(base32(b""), "");
        assert_eq!(base32(b"f"), "MY======");
        assert_eq!(base32(b"fo"), "MZXQ====");
        assert_eq!(base32(b"foob"), "MZXW6YQ=");
        assert_eq!(base32(b"fooba"), "MZXW6YTB");
        assert_eq!(base32(b"foobar"), "MZXW6YTBOI======");
    }

    #[test]
    fn chain_hashes_match_kube_proxy() {
        assert_eq!(
            service_port_hash("ns1/svc1:p80", Protocol::Tcp),
            "XPGD46QRK7WJZT7O"
        );
        let ep = EndpointView {
            ip: "10.180.0.1".parse().expect("ip"),
            port: 80,
            ready: true,
            serving: true,
            terminating: false,
            local: false,
            zone_hints: vec![],
            node_hints: vec![],
        };
        assert_eq!(
            endpoint_chain("ns1/svc1:p80", Protocol::Tcp, &ep),
            "KUBE-SEP-SXIVWICOYRO3J4NJ"
        );
        assert_eq!(hash("ns1/svc1/tcp/p80", 8), "ULMVA6XW");
    }

    #[test]
    fn probabilities_have_ten_decimals() {
        assert_eq!(probability(2), "0.5000000000");
        assert_eq!(probability(3), "0.3333333333");
        assert_eq!(probability(10), "0.1000000000");
        assert_eq!(probability(100001), "0.0000099999");
    }
}
