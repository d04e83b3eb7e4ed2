//! Packet captures for traffic tests: an `AF_PACKET` socket bound to one interface of a
//! namespace records the addresses of every TCP and UDP packet (IPv4 or IPv6, read with
//! etherparse, IPv6 extension headers included) that crosses it, so a test
//! asserts what was on the wire (the source a reply really carried) rather than what a socket
//! call reports (`peer_addr()` of a connected socket is the address it was connected to,
//! whatever came back).

use std::{
    net::{IpAddr, SocketAddr},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
};

use crate::netns::Netns;

/// Every protocol: IPv4 and IPv6 (the rest is not TCP or UDP and is skipped).
const ETH_P_ALL: u16 = 0x0003;
const PACKET_OUTGOING: u8 = 4;

/// One captured TCP or UDP packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    /// Received on the interface (else sent from it).
    pub inbound: bool,
    /// 6 (TCP) or 17 (UDP).
    pub protocol: u8,
    pub src: SocketAddr,
    pub dst: SocketAddr,
}

/// A capture running on one interface until [`Capture::finish`].
pub struct Capture {
    what: String,
    stop: Arc<AtomicBool>,
    fd: Arc<OwnedFd>,
    reader: JoinHandle<Vec<Seen>>,
}

/// What a finished capture holds.
#[derive(Debug)]
pub struct Captured {
    /// `namespace/interface`, for messages.
    pub what: String,
    pub packets: Vec<Seen>,
    /// Packets the kernel dropped because the capture fell behind.
    pub dropped: u32,
}

impl Capture {
    /// Starts capturing on `ifname` inside `ns`. Only that interface's packets are queued
    /// (the socket binds with a protocol only once it is bound to the interface).
    pub fn start(ns: &Netns, ifname: &str) -> Result<Self, String> {
        let what = format!("{}/{ifname}", ns.name);
        let name = ifname.to_string();
        let fd = Arc::new(ns.run(move || open(&name))??);
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (fd, stop) = (fd.clone(), stop.clone());
            std::thread::spawn(move || read_until(&fd, &stop))
        };
        Ok(Self {
            what,
            stop,
            fd,
            reader,
        })
    }

    /// Stops the capture once everything queued has been read.
    pub fn finish(self) -> Result<Captured, String> {
        self.stop.store(true, Ordering::Relaxed);
        let packets = self
            .reader
            .join()
            .map_err(|_| format!("{}: capture thread panicked", self.what))?;
        Ok(Captured {
            dropped: drops(&self.fd),
            what: self.what,
            packets,
        })
    }
}

impl Captured {
    /// The TCP and UDP packets received on the interface.
    pub fn inbound(&self) -> impl Iterator<Item = &Seen> {
        self.packets.iter().filter(|p| p.inbound)
    }

    /// Asserts that at least `at_least` TCP or UDP packets came in, none lost, and every one
    /// from an address in `allowed` (e.g. the frontend a client sent to: the replies were
    /// translated back before they reached it).
    pub fn assert_inbound_only_from(&self, allowed: &[SocketAddr], at_least: usize, what: &str) {
        let allowed: Vec<SocketAddr> = allowed.to_vec();
        assert_eq!(
            self.dropped, 0,
            "{what}: the capture on {} lost packets",
            self.what
        );
        let inbound: Vec<&Seen> = self.inbound().collect();
        assert!(
            inbound.len() >= at_least,
            "{what}: only {} packets came in on {} (expected at least {at_least})",
            inbound.len(),
            self.what
        );
        let stray: Vec<&&Seen> = inbound
            .iter()
            .filter(|p| !allowed.contains(&p.src))
            .collect();
        assert!(
            stray.is_empty(),
            "{what}: {} of {} packets reached {} from outside {allowed:?}, first: {:?}",
            stray.len(),
            inbound.len(),
            self.what,
            stray.first()
        );
    }
}

fn os_err(what: &str) -> String {
    format!("capture: {what}: {}", std::io::Error::last_os_error())
}

/// A packet socket on `ifname` (of the calling thread's namespace), with a large buffer and
/// a short receive timeout.
fn open(ifname: &str) -> Result<OwnedFd, String> {
    let index = lb_userspace::datapath::netif::ifindex(ifname)
        .ok_or(format!("capture: no interface {ifname}"))?;
    // Protocol 0: nothing is queued until bind names the protocol and the interface.
    // SAFETY: plain socket(2).
    let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(os_err("socket"));
    }
    // SAFETY: `raw` is a fresh descriptor owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    set_opt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &(16i32 << 20))?;
    let timeout = libc::timeval {
        tv_sec: 0,
        tv_usec: 20_000,
    };
    set_opt(&fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &timeout)?;
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid start.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = ETH_P_ALL.to_be();
    addr.sll_ifindex = index as i32;
    // SAFETY: a valid sockaddr_ll and its size.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const addr).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    if rc != 0 {
        return Err(os_err(&format!("bind to {ifname}")));
    }
    Ok(fd)
}

fn set_opt<T>(fd: &OwnedFd, level: i32, name: i32, value: &T) -> Result<(), String> {
    // SAFETY: `value` points to a T of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as u32,
        )
    };
    if rc != 0 {
        return Err(os_err(&format!("setsockopt {name}")));
    }
    Ok(())
}

/// Reads packets until `stop` is set and the queue is empty.
fn read_until(fd: &OwnedFd, stop: &AtomicBool) -> Vec<Seen> {
    let mut out = Vec::new();
    // Enough for an IPv6 header, extension headers and a TCP header with options.
    let mut buf = [0u8; 256];
    loop {
        // SAFETY: sockaddr_ll is plain data.
        let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
        // SAFETY: buffers valid for the sizes passed.
        let n = unsafe {
            libc::recvfrom(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                (&raw mut from).cast(),
                &mut len,
            )
        };
        if n < 0 {
            // Timed out: the queue is empty.
            if stop.load(Ordering::Relaxed) {
                return out;
            }
            continue;
        }
        if let Some(seen) = parse(&buf[..n as usize], from.sll_pkttype != PACKET_OUTGOING) {
            out.push(seen);
        }
    }
}

/// The addresses of a TCP or UDP packet (from its IP header on; a capture truncates it).
fn parse(p: &[u8], inbound: bool) -> Option<Seen> {
    use etherparse::{LaxNetSlice, LaxSlicedPacket, TransportSlice};
    let packet = LaxSlicedPacket::from_ip(p).ok()?;
    let (src, dst): (IpAddr, IpAddr) = match packet.net? {
        LaxNetSlice::Ipv4(ip) => (
            ip.header().source_addr().into(),
            ip.header().destination_addr().into(),
        ),
        LaxNetSlice::Ipv6(ip) => (
            ip.header().source_addr().into(),
            ip.header().destination_addr().into(),
        ),
        LaxNetSlice::Arp(_) => return None,
    };
    let (protocol, sport, dport) = match packet.transport? {
        TransportSlice::Tcp(t) => (6, t.source_port(), t.destination_port()),
        TransportSlice::Udp(u) => (17, u.source_port(), u.destination_port()),
        _ => return None,
    };
    Some(Seen {
        inbound,
        protocol,
        src: SocketAddr::new(src, sport),
        dst: SocketAddr::new(dst, dport),
    })
}

/// The capture's drop count (PACKET_STATISTICS).
fn drops(fd: &OwnedFd) -> u32 {
    let mut stats = libc::tpacket_stats {
        tp_packets: 0,
        tp_drops: 0,
    };
    let mut len = std::mem::size_of::<libc::tpacket_stats>() as u32;
    // SAFETY: a tpacket_stats and its size.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_STATISTICS,
            (&raw mut stats).cast(),
            &mut len,
        )
    };
    if rc != 0 { u32::MAX } else { stats.tp_drops }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_addresses_after_the_ip_header_and_its_options() {
        // IPv4 with 4 bytes of options (IHL 6), total length 32, then an 8-byte UDP header.
        let mut p = vec![0x46, 0, 0, 32, 0, 0, 0, 0, 64, 17, 0, 0];
        p.extend_from_slice(&[10, 96, 0, 53, 10, 244, 1, 2]);
        p.extend_from_slice(&[1, 1, 1, 1]);
        p.extend_from_slice(&53u16.to_be_bytes());
        p.extend_from_slice(&40000u16.to_be_bytes());
        p.extend_from_slice(&[0, 8, 0, 0]);
        let seen = parse(&p, true).expect("UDP");
        assert_eq!(seen.src, "10.96.0.53:53".parse().expect("addr"));
        assert_eq!(seen.dst, "10.244.1.2:40000".parse().expect("addr"));
        p[9] = 1;
        assert_eq!(parse(&p, true), None, "ICMP is not recorded");
    }

    #[test]
    fn reads_ipv6_addresses_past_an_extension_header_and_a_truncated_segment() {
        let src: std::net::Ipv6Addr = "fd00:10:96::10".parse().expect("addr");
        let dst: std::net::Ipv6Addr = "fd00:10:244:1::2".parse().expect("addr");
        // Fixed header (payload 8 of hop-by-hop + a 40-byte TCP header with options), then
        // hop-by-hop (next: TCP, 8 bytes), then TCP; the capture cut it after 20 bytes of TCP.
        let mut p = vec![0x60, 0, 0, 0, 0, 48, 0, 64];
        p.extend_from_slice(&src.octets());
        p.extend_from_slice(&dst.octets());
        p.extend_from_slice(&[6, 0, 1, 4, 0, 0, 0, 0]);
        p.extend_from_slice(&80u16.to_be_bytes());
        p.extend_from_slice(&40000u16.to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x12, 0xff, 0xff, 0, 0, 0, 0]);
        let seen = parse(&p, false).expect("TCP");
        assert_eq!((seen.protocol, seen.inbound), (6, false));
        assert_eq!(seen.src, "[fd00:10:96::10]:80".parse().expect("addr"));
        assert_eq!(seen.dst, "[fd00:10:244:1::2]:40000".parse().expect("addr"));
    }
}
