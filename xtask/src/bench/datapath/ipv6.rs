//! The datapath bench's IPv6 rows: the same distinct method over IPv6 flows to IPv6
//! ClusterIPs that sit in the same maps as the scale's IPv4 services (so the lookups see the
//! same table sizes), each case beside the IPv4 figure of the same hook, scale and trial.

use std::net::{Ipv6Addr, SocketAddrV6};

use anyhow::{Result, bail};
use lb_common::{R_ESTABLISHED, R_NEW_FLOW, R_PASS, R_REVERSE_NAT};
use xlb_tests::services::service6_yaml;

use super::{FLOWS, Hook, each};
use crate::bench::fixture::{Datapath, SVC_PORT, TARGET_PORT};

/// IPv6 services beside the scale's IPv4 ones (3 backends each).
pub const SERVICES6: usize = 256;
/// The IPv6 cases, in table order; each is compared with the IPv4 case of the same name.
pub const CASES6: [&str; 4] = [
    "non-service",
    "new flow",
    "established",
    "reply (reverse NAT)",
];
/// The index in `CASES` of each IPv6 case's IPv4 counterpart.
pub const IPV4_CASE: [usize; 4] = [1, 2, 3, 4];

fn vip6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, (i >> 16) as u16, i as u16)
}

fn backend6(i: usize, k: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x244, 0, 0, 0, 0, i as u16, k as u16 + 1)
}

/// The IPv6 services' YAML.
pub fn yaml() -> String {
    (0..SERVICES6)
        .map(|i| {
            let b: Vec<Ipv6Addr> = (0..3).map(|k| backend6(i, k)).collect();
            service6_yaml(
                &format!("v6-{i}"),
                vip6(i),
                SVC_PORT,
                "TCP",
                TARGET_PORT,
                &b,
            )
        })
        .collect()
}

/// The checksum of a TCP header (checksum field zero) over the IPv6 pseudo-header.
fn tcp_sum(src: &Ipv6Addr, dst: &Ipv6Addr, tcp: &[u8]) -> u16 {
    let mut s: u32 = 0;
    for c in src
        .octets()
        .chunks(2)
        .chain(dst.octets().chunks(2))
        .chain(tcp.chunks(2))
    {
        s += (u32::from(c[0]) << 8) | u32::from(*c.get(1).unwrap_or(&0));
    }
    s += tcp.len() as u32 + 6;
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// An Ethernet + IPv6 + TCP frame (`pad` payload bytes), never one XDP would mistake for a
/// checksum still partial (a payload byte is added until it is not).
pub fn tcp6(src: SocketAddrV6, dst: SocketAddrV6, flags: u8) -> Vec<u8> {
    let mut pad = 0u8;
    loop {
        let mut tcp = Vec::with_capacity(21);
        tcp.extend(src.port().to_be_bytes());
        tcp.extend(dst.port().to_be_bytes());
        tcp.extend([0, 0, 0, 1, 0, 0, 0, 0, 0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
        if pad > 0 {
            tcp.push(pad);
        }
        let c = tcp_sum(src.ip(), dst.ip(), &tcp);
        tcp[16..18].copy_from_slice(&c.to_be_bytes());
        // The folded pseudo-header sum a partial checksum would carry.
        let mut p: u32 = 0;
        for c in src
            .ip()
            .octets()
            .chunks(2)
            .chain(dst.ip().octets().chunks(2))
        {
            p += (u32::from(c[0]) << 8) | u32::from(c[1]);
        }
        p += tcp.len() as u32 + 6;
        while p > 0xffff {
            p = (p & 0xffff) + (p >> 16);
        }
        if c != p as u16 {
            let mut f = vec![
                2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x86, 0xdd, 0x60, 0, 0, 0,
            ];
            f.extend((tcp.len() as u16).to_be_bytes());
            f.extend([6, 64]);
            f.extend(src.ip().octets());
            f.extend(dst.ip().octets());
            f.extend(tcp);
            return f;
        }
        pad += 1;
    }
}

/// Pre-built IPv6 packets.
pub struct Flows6 {
    clients: Vec<SocketAddrV6>,
    to_service: Vec<Vec<u8>>,
    later: Vec<Vec<u8>>,
    non_service: Vec<Vec<u8>>,
}

impl Flows6 {
    pub fn new() -> Self {
        let mut f = Flows6 {
            clients: Vec::with_capacity(FLOWS),
            to_service: Vec::with_capacity(FLOWS),
            later: Vec::with_capacity(FLOWS),
            non_service: Vec::with_capacity(FLOWS),
        };
        for j in 0..FLOWS {
            let client = SocketAddrV6::new(
                Ipv6Addr::new(0xfd00, 0x250, 0, 0, 0, 0, (j >> 16) as u16, j as u16),
                20_000 + (j % 40_000) as u16,
                0,
                0,
            );
            let frontend = SocketAddrV6::new(vip6((j * 7_919) % SERVICES6), SVC_PORT, 0, 0);
            f.to_service.push(tcp6(client, frontend, 0x02));
            f.later.push(tcp6(client, frontend, 0x10));
            let other = Ipv6Addr::new(0xfd00, 0x200, 0, 0, 0, 0, (j >> 16) as u16, j as u16);
            f.non_service
                .push(tcp6(client, SocketAddrV6::new(other, SVC_PORT, 0, 0), 0x02));
            f.clients.push(client);
        }
        f
    }
}

/// The destination of an IPv6 frame.
fn dst6(p: &[u8]) -> Option<SocketAddrV6> {
    if p.len() < 58 || p[12..14] != [0x86, 0xdd] {
        return None;
    }
    let a: [u8; 16] = p[38..54].try_into().ok()?;
    Some(SocketAddrV6::new(
        a.into(),
        u16::from_be_bytes([p[56], p[57]]),
        0,
        0,
    ))
}

/// One trial of the IPv6 distinct method on `hook`: ns per packet per case of [`CASES6`].
pub fn trial(dp: &mut Datapath, hook: Hook, f: &Flows6, ifindex: u32) -> Result<Vec<f64>> {
    dp.clear_ct()?;
    let (non_service, _) = each(dp, hook, hook.prog, &f.non_service, Some(R_PASS), ifindex)?;
    let (new_flow, outs) = each(
        dp,
        hook,
        hook.prog,
        &f.to_service,
        Some(R_NEW_FLOW),
        ifindex,
    )?;
    let mut replies = Vec::with_capacity(outs.len());
    for (out, client) in outs.iter().zip(&f.clients) {
        let Some(d) = dst6(out) else {
            bail!("a DNATed IPv6 packet does not parse");
        };
        if d.port() != TARGET_PORT {
            bail!("IPv6 new flow DNATed to {d} (expected port {TARGET_PORT})");
        }
        replies.push(tcp6(d, *client, 0x10));
    }
    each(dp, hook, hook.prog, &replies, Some(R_REVERSE_NAT), ifindex)?;
    each(dp, hook, hook.prog, &f.later, Some(R_ESTABLISHED), ifindex)?;
    let (established, _) = each(dp, hook, hook.prog, &f.later, Some(R_ESTABLISHED), ifindex)?;
    let (reply, _) = each(dp, hook, hook.prog, &replies, Some(R_REVERSE_NAT), ifindex)?;
    Ok(vec![non_service, new_flow, established, reply])
}
