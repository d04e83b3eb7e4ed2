//! The datapath bench's IPv6 rows: as many IPv6 services as IPv4 ones, in the same maps, and
//! the same distinct flows over IPv6 (frames built with etherparse), through tc and XDP in
//! the same trials as the IPv4 ones so that their ratio is side by side.

use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};

use anyhow::{Result, anyhow, bail};
use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};

use xlb_tests::services::service6_yaml;

use super::{FLOWS, Flows};
use crate::bench::fixture::{SVC_PORT, TARGET_PORT};

/// The first IPv6 ClusterIP of the synthetic services (service `i` has `VIP6_BASE + i`).
const VIP6_BASE: u128 = 0xfd00_0096_0000_0000_0000_0000_0000_0000;
/// The first IPv6 backend (service `i`'s backend `k` is `BACKEND6_BASE + 16 i + k`).
const BACKEND6_BASE: u128 = 0xfd00_0128_0000_0000_0000_0000_0000_0000;
/// The first IPv6 client.
const CLIENT6_BASE: u128 = 0xfd00_0244_0000_0000_0000_0000_0000_0000;
/// The first IPv6 address that is no service.
const OTHER6_BASE: u128 = 0xfd00_0200_0000_0000_0000_0000_0000_0000;

/// The routes the bench namespace needs for the IPv6 rows (via the permanent neighbour
/// `fe80::2` on `dum0`): backends, clients and the non-service addresses.
pub(super) const ROUTES6: [&str; 3] = ["fd00:128::/32", "fd00:244::/32", "fd00:200::/32"];

fn add(base: u128, n: usize) -> Ipv6Addr {
    Ipv6Addr::from(base + n as u128)
}

/// IPv6 ClusterIP of synthetic service `i`.
pub(super) fn vip6(i: usize) -> Ipv6Addr {
    add(VIP6_BASE, i)
}

/// YAML (an IPv6 single-stack Service and its IPv6 EndpointSlice) of synthetic IPv6
/// services `range`: service `i` with `backends(i)` ready endpoints on [`TARGET_PORT`].
pub(super) fn services_yaml6(
    range: std::ops::Range<usize>,
    backends: impl Fn(usize) -> usize,
) -> String {
    let mut y = String::new();
    for i in range {
        let bes: Vec<Ipv6Addr> = (0..backends(i))
            .map(|k| add(BACKEND6_BASE, i * 16 + k))
            .collect();
        y.push_str(&service6_yaml(
            &format!("v6-{i}"),
            vip6(i),
            SVC_PORT,
            "TCP",
            TARGET_PORT,
            &bes,
        ));
    }
    y
}

/// The one's-complement sum of big-endian 16-bit words.
fn sum16(data: &[u8], sum: u32) -> u32 {
    data.chunks(2)
        .map(|c| (u32::from(c[0]) << 8) | u32::from(*c.get(1).unwrap_or(&0)))
        .fold(sum, |a, w| a + w)
}

/// Whether XDP would leave IPv6 TCP frame `p` to tc: its checksum happens to equal the
/// folded pseudo-header sum, which is what a `CHECKSUM_PARTIAL` packet carries (as IPv4's
/// [`super::unambiguous`] avoids).
fn looks_partial6(p: &[u8]) -> bool {
    let l4_len = u32::from(u16::from_be_bytes([p[18], p[19]]));
    let mut sum = sum16(&p[22..54], l4_len + 6);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    u32::from(u16::from_be_bytes([p[70], p[71]])) == sum
}

/// An Ethernet/IPv6/TCP frame from `src` to `dst`: a SYN, or with `ack` an ACK; a
/// payload byte is added until XDP would not mistake its checksum for a partial one.
pub(super) fn tcp6(src: SocketAddrV6, dst: SocketAddrV6, ack: bool) -> Vec<u8> {
    let build = |payload: &[u8]| {
        let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv6(src.ip().octets(), dst.ip().octets(), 64)
            .tcp(src.port(), dst.port(), 1, 0xffff);
        let b = if ack { b.ack(1) } else { b.syn() };
        let mut out = Vec::with_capacity(b.size(payload.len()));
        // Writing into a Vec cannot fail but for a payload too big; these are a byte.
        let _ = b.write(&mut out, payload);
        out
    };
    let mut p = build(&[]);
    let mut pad = 0u8;
    while looks_partial6(&p) {
        pad += 1;
        p = build(&[pad]);
    }
    p
}

/// The TCP destination of an IPv6 frame (read with etherparse).
fn destination6(frame: &[u8]) -> Result<SocketAddrV6> {
    let p = SlicedPacket::from_ethernet(frame).map_err(|e| anyhow!("IPv6 frame: {e}"))?;
    let (Some(NetSlice::Ipv6(ip)), Some(TransportSlice::Tcp(tcp))) = (p.net, p.transport) else {
        bail!("not an IPv6 TCP frame");
    };
    Ok(SocketAddrV6::new(
        ip.header().destination_addr(),
        tcp.destination_port(),
        0,
        0,
    ))
}

/// The backend's answer to a DNATed IPv6 frame `out` of a flow from `client`.
fn reply6(out: &[u8], client: SocketAddr) -> Result<Vec<u8>> {
    let SocketAddr::V6(client) = client else {
        bail!("an IPv4 client in the IPv6 flows");
    };
    let to = destination6(out)?;
    if to.port() != TARGET_PORT {
        bail!("new IPv6 flow DNATed to {to} (expected port {TARGET_PORT})");
    }
    Ok(tcp6(to, client, true))
}

/// The IPv6 flows of one scale, spread over `services` IPv6 services as the IPv4 ones are.
pub(super) fn flows6(services: usize) -> Flows {
    let mut f = Flows::empty(reply6);
    for j in 0..FLOWS {
        let client = SocketAddrV6::new(add(CLIENT6_BASE, j), 20_000 + (j % 40_000) as u16, 0, 0);
        let svc = (j * 7_919) % services;
        let frontend = SocketAddrV6::new(vip6(svc), SVC_PORT, 0, 0);
        f.to_service.push(tcp6(client, frontend, false));
        f.later.push(tcp6(client, frontend, true));
        let other = SocketAddrV6::new(add(OTHER6_BASE, j), SVC_PORT, 0, 0);
        f.non_service.push(tcp6(client, other, false));
        f.clients.push(SocketAddr::V6(client));
    }
    f
}
