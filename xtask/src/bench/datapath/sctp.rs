//! The datapath bench's SCTP rows: as many SCTP services as TCP ones (the same ClusterIPs
//! and backends, port 80 → 8080, so every translated packet's CRC32c is updated for the
//! rewritten port), the same distinct flows as SCTP packets through tc (XDP passes SCTP to
//! tc), in the same trials as the TCP rows so that their ratio is side by side. A flow is
//! an INIT (new flow), then the backend's DATA (reply), then the client's DATA
//! (established).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use anyhow::{Result, anyhow, bail};
use etherparse::{EtherType, Ethernet2Header, IpNumber, Ipv4Header};
use lb_userspace::trace::frame::seen;

use super::{FLOWS, Flows};
use crate::bench::fixture::{SVC_PORT, TARGET_PORT, addr_add, vip};

/// Chunk types the rows send.
const DATA: u8 = 0;
const INIT: u8 = 1;

/// An SCTP packet with one chunk of `kind` (INIT: the fixed part; DATA: 8 payload bytes)
/// from `src` to `dst` in Ethernet and IPv4, its CRC32c computed.
fn sctp(src: SocketAddrV4, dst: SocketAddrV4, kind: u8) -> Vec<u8> {
    let vtag: u32 = if kind == INIT { 0 } else { 0x7872_6c62 };
    let mut p = Vec::with_capacity(40);
    p.extend(src.port().to_be_bytes());
    p.extend(dst.port().to_be_bytes());
    p.extend(vtag.to_be_bytes());
    p.extend([0u8; 4]);
    let value: &[u8] = if kind == INIT {
        &[0x78, 0x72, 0x6c, 0x62, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1]
    } else {
        // TSN 1, stream 0, sequence 0, payload protocol 0, eight bytes.
        &[
            0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, b'x', b'l', b'b', b' ', b'b', b'e', b'n', b'c',
        ]
    };
    let flags = if kind == DATA { 3 } else { 0 };
    p.extend([kind, flags]);
    p.extend(((4 + value.len()) as u16).to_be_bytes());
    p.extend(value);
    let crc = lb_common::crc32c::checksum(&p);
    p[8..12].copy_from_slice(&crc.to_le_bytes());
    let mut out = Vec::with_capacity(34 + p.len());
    let eth = Ethernet2Header {
        source: [2, 0, 0, 0, 0, 2],
        destination: [2, 0, 0, 0, 0, 1],
        ether_type: EtherType::IPV4,
    };
    // Writing to a Vec cannot fail, and the lengths are fixed and small.
    let _ = eth.write(&mut out);
    if let Ok(mut ip) = Ipv4Header::new(
        p.len() as u16,
        64,
        IpNumber::SCTP,
        src.ip().octets(),
        dst.ip().octets(),
    ) {
        ip.header_checksum = ip.calc_header_checksum();
        let _ = ip.write(&mut out);
    }
    out.extend(p);
    out
}

/// The backend's DATA answering a DNATed INIT `out` of a flow from `client`, after checking
/// the DNAT and the INIT's rewritten checksum.
fn reply_sctp(out: &[u8], client: SocketAddr) -> Result<Vec<u8>> {
    let SocketAddr::V4(client) = client else {
        bail!("an IPv6 client in the SCTP flows");
    };
    let s = seen(out).ok_or_else(|| anyhow!("a DNATed SCTP packet does not parse"))?;
    let SocketAddr::V4(to) = s.dst else {
        bail!("an SCTP flow DNATed to IPv6");
    };
    if to.port() != TARGET_PORT {
        bail!("new SCTP flow DNATed to {to} (expected port {TARGET_PORT})");
    }
    let body = out
        .get(34..)
        .ok_or_else(|| anyhow!("short DNATed SCTP packet"))?;
    let mut zeroed = body.to_vec();
    zeroed[8..12].fill(0);
    let want = lb_common::crc32c::checksum(&zeroed);
    if body[8..12] != want.to_le_bytes() {
        bail!("the DNATed INIT to {to} carries a wrong CRC32c");
    }
    Ok(sctp(to, client, DATA))
}

/// The SCTP flows of one scale, spread over `services` services as the TCP ones are.
pub(super) fn flows_sctp(services: usize) -> Flows {
    let mut f = Flows::empty(reply_sctp);
    for j in 0..FLOWS {
        let client = SocketAddrV4::new(
            addr_add(Ipv4Addr::new(10, 250, 0, 0), j as u32),
            20_000 + (j % 40_000) as u16,
        );
        let svc = (j * 7_919) % services;
        let frontend = SocketAddrV4::new(vip(svc), SVC_PORT);
        f.to_service.push(sctp(client, frontend, INIT));
        f.later.push(sctp(client, frontend, DATA));
        let other = addr_add(Ipv4Addr::new(10, 200, 0, 0), j as u32);
        f.non_service
            .push(sctp(client, SocketAddrV4::new(other, SVC_PORT), INIT));
        f.clients.push(SocketAddr::V4(client));
    }
    f
}
