//! IP addresses and prefixes (`10.0.0.0/8`), parsed the way Kubernetes does and printed
//! canonically.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr},
    str::FromStr,
};

use thiserror::Error;

/// Parses an IP as Kubernetes does: IPv4 octets may carry leading zeros and are decimal
/// ("010.0.0.1" is 10.0.0.1), which `std`'s parser rejects.
pub fn parse_ip(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    if let Ok(ip) = s.parse() {
        return Some(ip);
    }
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        if part.is_empty() || part.len() > 3 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *octet = part.parse().ok()?;
    }
    parts
        .next()
        .is_none()
        .then_some(IpAddr::V4(Ipv4Addr::from(octets)))
}

/// A CIDR prefix with its host bits cleared (`203.0.113.7/25` reads as `203.0.113.0/25`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

/// Why a CIDR string was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CidrError {
    #[error("{0:?} is not a CIDR (ADDRESS/PREFIX)")]
    Malformed(String),
    #[error("{value:?}: prefix /{prefix} is longer than an {family} address ({max} bits)")]
    TooLong {
        value: String,
        prefix: u16,
        family: &'static str,
        max: u8,
    },
}

impl Cidr {
    /// Builds a prefix, clearing host bits; `None` when `prefix` is too long for the family.
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Self> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (prefix <= max).then(|| Self {
            addr: mask(addr, prefix),
            prefix,
        })
    }

    /// A single-address prefix (`/32` or `/128`).
    pub fn host(addr: IpAddr) -> Self {
        Self {
            addr,
            prefix: if addr.is_ipv4() { 32 } else { 128 },
        }
    }

    /// The network address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// True for an IPv4 prefix.
    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }

    /// Whether `ip` lies inside the prefix (never across families).
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.addr.is_ipv4() && mask(ip, self.prefix) == self.addr
    }

    /// Parses `ADDR/PREFIX` leniently, as Kubernetes' sloppy parser does: surrounding
    /// whitespace is trimmed and IPv4 octets may carry leading zeros (decimal).
    pub fn parse_sloppy(s: &str) -> Result<Self, CidrError> {
        let err = || CidrError::Malformed(s.to_string());
        let (addr, prefix) = s.trim().split_once('/').ok_or_else(err)?;
        let addr = parse_ip(addr).ok_or_else(err)?;
        if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        let prefix: u16 = prefix.parse().map_err(|_| err())?;
        let (family, max) = if addr.is_ipv4() {
            ("IPv4", 32)
        } else {
            ("IPv6", 128)
        };
        u8::try_from(prefix)
            .ok()
            .and_then(|p| Self::new(addr, p))
            .ok_or_else(|| CidrError::TooLong {
                value: s.to_string(),
                prefix,
                family,
                max,
            })
    }
}

fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let m = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(prefix.min(32)))
            };
            IpAddr::V4((bits & m).into())
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let m = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(prefix.min(128)))
            };
            IpAddr::V6((bits & m).into())
        }
    }
}

impl FromStr for Cidr {
    type Err = CidrError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse_sloppy(s)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_with_leading_zeros_reads_as_decimal() {
        assert_eq!(
            parse_ip("010.000.001.009"),
            Some("10.0.1.9".parse().expect("ip"))
        );
        assert_eq!(parse_ip(" 10.0.0.1"), Some("10.0.0.1".parse().expect("ip")));
        assert_eq!(
            parse_ip("2001:db8::1"),
            Some("2001:db8::1".parse().expect("ip"))
        );
        assert_eq!(parse_ip("10.0.0.256"), None);
        assert_eq!(parse_ip("10.0.0"), None);
        assert_eq!(parse_ip("10.0.0.1.2"), None);
        assert_eq!(parse_ip("ten.0.0.1"), None);
    }

    #[test]
    fn parses_sloppily_and_prints_canonically() {
        let c = Cidr::parse_sloppy(" 203.0.113.000/025").expect("cidr");
        assert_eq!(c.to_string(), "203.0.113.0/25");
        assert!(c.contains("203.0.113.2".parse().expect("ip")));
        assert!(!c.contains("203.0.113.130".parse().expect("ip")));
        let c = Cidr::parse_sloppy("2001:db8::1/64").expect("cidr");
        assert_eq!(c.to_string(), "2001:db8::/64");
        assert!(Cidr::parse_sloppy("10.0.0.0/33").is_err());
        assert!(Cidr::parse_sloppy("10.0.0.0").is_err());
        assert_eq!(
            Cidr::parse_sloppy("2001:db8::/128").map(|c| c.prefix()),
            Ok(128)
        );
    }

    #[test]
    fn a_prefix_longer_than_its_family_is_named_with_the_limit() {
        for (raw, want) in [
            (
                "2001:db8::/129",
                "\"2001:db8::/129\": prefix /129 is longer than an IPv6 address (128 bits)",
            ),
            (
                "10.0.0.0/300",
                "\"10.0.0.0/300\": prefix /300 is longer than an IPv4 address (32 bits)",
            ),
            (
                "2001:db8::g/64",
                "\"2001:db8::g/64\" is not a CIDR (ADDRESS/PREFIX)",
            ),
            (
                "2001:db8::/",
                "\"2001:db8::/\" is not a CIDR (ADDRESS/PREFIX)",
            ),
            (
                "2001:db8::/1000",
                "\"2001:db8::/1000\" is not a CIDR (ADDRESS/PREFIX)",
            ),
        ] {
            let e = Cidr::parse_sloppy(raw).expect_err(raw);
            assert_eq!(e.to_string(), want);
        }
    }
}
