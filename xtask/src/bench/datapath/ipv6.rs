//! The datapath bench's IPv6 rows: as many IPv6 services as IPv4 ones, in the same maps, and
//! the same distinct flows over IPv6 (frames built with etherparse), run in the same trials
//! as the IPv4 ones so that their ratio is side by side.

use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};

use anyhow::{Result, anyhow, bail};
use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};

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
        y.push_str(&format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: bench6, name: s{i}}}\nspec:\n  ipFamilies: [IPv6]\n  clusterIP: \"{}\"\n  ports:\n  - {{name: p, port: {SVC_PORT}, protocol: TCP, targetPort: {TARGET_PORT}}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: bench6\n  name: s{i}-1\n  labels: {{kubernetes.io/service-name: s{i}}}\naddressType: IPv6\nports:\n- {{name: p, port: {TARGET_PORT}, protocol: TCP}}\nendpoints:\n",
            vip6(i)
        ));
        for k in 0..backends(i) {
            y.push_str(&format!(
                "- addresses: [\"{}\"]\n  conditions: {{ready: true}}\n",
                add(BACKEND6_BASE, i * 16 + k)
            ));
        }
    }
    y
}

/// An Ethernet/IPv6/TCP frame from `src` to `dst`: a SYN, or with `ack` an ACK.
pub(super) fn tcp6(src: SocketAddrV6, dst: SocketAddrV6, ack: bool) -> Vec<u8> {
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv6(src.ip().octets(), dst.ip().octets(), 64)
        .tcp(src.port(), dst.port(), 1, 0xffff);
    let b = if ack { b.ack(1) } else { b.syn() };
    let mut out = Vec::with_capacity(b.size(0));
    // Writing into a Vec cannot fail but for a payload too big, and there is none.
    let _ = b.write(&mut out, &[]);
    out
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
