//! SCTP peers for the labs, over raw IP sockets: this machine's kernel has no SCTP
//! (`CONFIG_IP_SCTP` off), and the datapath under test never needs one. A peer speaks the
//! single-homed subset of RFC 9260 a Service proxy sees: the four-way handshake (INIT,
//! INIT ACK, COOKIE ECHO, COOKIE ACK), one DATA each way with its SACK, and the three-way
//! shutdown; every packet it takes is checked against an independent CRC32c (the
//! `crc32c` crate), so a checksum the datapath got wrong fails the exchange.
//!
//! [`SctpServer`] answers DATA with the echo servers' reply line (its name and the client
//! address it saw); [`sctp_request`] runs one association to a frontend and returns that
//! line as an [`Answer`]. A raw socket sees every SCTP packet of its namespace, so each
//! side filters by ports and verification tag.

use std::{
    collections::HashMap,
    io,
    mem::MaybeUninit,
    net::{IpAddr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::{
    client::{self, Answer},
    echo::reply,
    netns::Netns,
};

/// IP protocol number of SCTP.
pub const IPPROTO_SCTP: i32 = 132;

/// Chunk types (RFC 9260 §3.2).
pub mod chunk {
    pub const DATA: u8 = 0;
    pub const INIT: u8 = 1;
    pub const INIT_ACK: u8 = 2;
    pub const SACK: u8 = 3;
    pub const ABORT: u8 = 6;
    pub const SHUTDOWN: u8 = 7;
    pub const SHUTDOWN_ACK: u8 = 8;
    pub const COOKIE_ECHO: u8 = 10;
    pub const COOKIE_ACK: u8 = 11;
    pub const SHUTDOWN_COMPLETE: u8 = 14;
}

/// One chunk: its type, flags and value (without header or padding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub kind: u8,
    pub flags: u8,
    pub value: Vec<u8>,
}

impl Chunk {
    pub fn new(kind: u8, value: Vec<u8>) -> Self {
        Chunk {
            kind,
            flags: 0,
            value,
        }
    }
}

/// An SCTP packet: common header fields and chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    pub sport: u16,
    pub dport: u16,
    pub vtag: u32,
    pub chunks: Vec<Chunk>,
}

impl Packet {
    /// The packet on the wire, its CRC32c computed.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend(self.sport.to_be_bytes());
        out.extend(self.dport.to_be_bytes());
        out.extend(self.vtag.to_be_bytes());
        out.extend([0u8; 4]);
        for c in &self.chunks {
            out.extend([c.kind, c.flags]);
            out.extend(((4 + c.value.len()) as u16).to_be_bytes());
            out.extend(&c.value);
            out.resize(out.len().next_multiple_of(4), 0);
        }
        let crc = crc32c::crc32c(&out);
        out[8..12].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Parses an SCTP packet; an error for a short packet, a malformed chunk or a wrong
    /// checksum (checked by the `crc32c` crate, independent of xlb's own).
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() < 12 {
            return Err(format!("SCTP packet of {} bytes", bytes.len()));
        }
        let mut zeroed = bytes.to_vec();
        zeroed[8..12].fill(0);
        let want = crc32c::crc32c(&zeroed);
        let got = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if want != got {
            return Err(format!(
                "SCTP checksum {got:#010x}, the packet's CRC32c is {want:#010x}"
            ));
        }
        let mut chunks = Vec::new();
        let mut at = 12;
        while at + 4 <= bytes.len() {
            let len = u16::from_be_bytes([bytes[at + 2], bytes[at + 3]]) as usize;
            if len < 4 || at + len > bytes.len() {
                return Err(format!("SCTP chunk of length {len} at {at}"));
            }
            chunks.push(Chunk {
                kind: bytes[at],
                flags: bytes[at + 1],
                value: bytes[at + 4..at + len].to_vec(),
            });
            at += len.next_multiple_of(4);
        }
        Ok(Packet {
            sport: u16::from_be_bytes([bytes[0], bytes[1]]),
            dport: u16::from_be_bytes([bytes[2], bytes[3]]),
            vtag: u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
            chunks,
        })
    }

    fn first(&self) -> Option<u8> {
        self.chunks.first().map(|c| c.kind)
    }
}

/// INIT or INIT ACK's fixed part: initiate tag, a_rwnd, streams, initial TSN.
fn init_value(tag: u32, tsn: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(16);
    v.extend(tag.to_be_bytes());
    v.extend(65535u32.to_be_bytes());
    v.extend(1u16.to_be_bytes());
    v.extend(1u16.to_be_bytes());
    v.extend(tsn.to_be_bytes());
    v
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// A DATA chunk (one unfragmented message on stream 0).
fn data(tsn: u32, payload: &[u8]) -> Chunk {
    let mut v = Vec::with_capacity(12 + payload.len());
    v.extend(tsn.to_be_bytes());
    v.extend([0u8; 4]); // stream 0, sequence 0
    v.extend([0u8; 4]); // payload protocol 0
    v.extend(payload);
    Chunk {
        kind: chunk::DATA,
        flags: 0x03,
        value: v,
    }
}

/// A SACK for everything up to `tsn`.
fn sack(tsn: u32) -> Chunk {
    let mut v = Vec::with_capacity(12);
    v.extend(tsn.to_be_bytes());
    v.extend(65535u32.to_be_bytes());
    v.extend([0u8; 4]);
    Chunk::new(chunk::SACK, v)
}

/// A raw SCTP socket of `addr`'s family.
fn raw_socket(addr: &SocketAddr, timeout: Duration) -> io::Result<Socket> {
    let domain = if addr.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let s = Socket::new(domain, Type::RAW, Some(Protocol::from(IPPROTO_SCTP)))?;
    s.set_read_timeout(Some(timeout))?;
    Ok(s)
}

/// Receives one packet: its source address and its bytes (an IPv4 raw socket hands over
/// the IP header too; it is stripped). `None` when the read timeout passed first.
fn recv(s: &Socket, buf: &mut [u8]) -> io::Result<Option<(IpAddr, Vec<u8>)>> {
    match recv_one(s, buf) {
        Ok(r) => Ok(Some(r)),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn recv_one(s: &Socket, buf: &mut [u8]) -> io::Result<(IpAddr, Vec<u8>)> {
    // SAFETY: `[u8]` and `[MaybeUninit<u8>]` have one layout, and the kernel only writes
    // initialized bytes into it.
    let uninit = unsafe { &mut *(buf as *mut [u8] as *mut [MaybeUninit<u8>]) };
    let (n, from) = s.recv_from(uninit)?;
    let from = from
        .as_socket()
        .map(|a| a.ip())
        .ok_or_else(|| io::Error::other("raw socket: no source address"))?;
    let body = if from.is_ipv4() {
        let ihl = buf.first().map(|b| ((b & 0x0f) as usize) * 4).unwrap_or(0);
        buf.get(ihl..n).unwrap_or_default()
    } else {
        &buf[..n]
    };
    Ok((from, body.to_vec()))
}

fn send(s: &Socket, to: IpAddr, p: &Packet) -> io::Result<()> {
    s.send_to(&p.encode(), &SockAddr::from(SocketAddr::new(to, 0)))
        .map(|_| ())
}

/// An association the server knows: the peer's tag and its next TSN.
struct Assoc {
    peer_tag: u32,
}

/// How many associations a server keeps at once (the oldest go first beyond it).
const MAX_ASSOCS: usize = 4096;

/// An SCTP server on `port` of every address of a namespace's `family`, answering until
/// dropped. [`SctpServer::bad_checksums`] counts packets refused for their checksum;
/// [`SctpServer::failure`] says what its socket refused. A receive or send the socket
/// refuses loses that packet, as a drop on the wire would, and the server goes on: a
/// server that stopped would answer every later packet of its pod with the kernel's ICMP
/// protocol unreachable (this kernel has no SCTP), hiding the cause.
pub struct SctpServer {
    stop: Arc<AtomicBool>,
    bad: Arc<AtomicU64>,
    errors: Arc<Errors>,
    thread: Option<JoinHandle<Result<Result<(), String>, String>>>,
}

/// What a server's socket refused: how many times, and the first refusal.
#[derive(Default)]
struct Errors {
    count: AtomicU64,
    first: Mutex<Option<String>>,
}

impl Errors {
    fn note(&self, what: String) {
        if self.count.fetch_add(1, Ordering::Relaxed) == 0
            && let Ok(mut first) = self.first.lock()
        {
            *first = Some(what);
        }
    }
}

impl SctpServer {
    /// Starts a server named `name` on SCTP `port` inside `ns`, for `family`'s packets
    /// (an address of the family; only its kind matters).
    pub fn start(ns: &Netns, name: &str, family: IpAddr, port: u16) -> Result<Self, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let bad = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(Errors::default());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let (stop2, bad2, errors2, name2) =
            (stop.clone(), bad.clone(), errors.clone(), name.to_string());
        let thread = ns.spawn(move || {
            let sock = match raw_socket(&SocketAddr::new(family, 0), Duration::from_millis(50)) {
                Ok(s) => s,
                Err(e) => {
                    let e = format!("{name2}: raw SCTP socket: {e}");
                    let _ = ready_tx.send(Err(e.clone()));
                    return Err(e);
                }
            };
            let _ = ready_tx.send(Ok(()));
            serve(&sock, &name2, port, &stop2, &bad2, &errors2);
            Ok(())
        });
        ready_rx
            .recv()
            .map_err(|_| format!("{name}: SCTP server thread died"))??;
        Ok(SctpServer {
            stop,
            bad,
            errors,
            thread: Some(thread),
        })
    }

    /// Packets this server dropped for a wrong checksum.
    pub fn bad_checksums(&self) -> u64 {
        self.bad.load(Ordering::Relaxed)
    }

    /// What the server's socket refused so far (how many times, and the first refusal),
    /// or `None`; a thread that ended early (a panic) says so.
    pub fn failure(&self) -> Option<String> {
        if self.thread.as_ref().is_some_and(|t| t.is_finished()) {
            return Some("the server's thread ended".into());
        }
        let count = self.errors.count.load(Ordering::Relaxed);
        (count > 0).then(|| {
            let first = self.errors.first.lock().ok().and_then(|f| f.clone());
            format!("{count} refused, the first: {}", first.unwrap_or_default())
        })
    }
}

impl Drop for SctpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(
    sock: &Socket,
    name: &str,
    port: u16,
    stop: &AtomicBool,
    bad: &AtomicU64,
    errors: &Errors,
) {
    let mut assocs: HashMap<(IpAddr, u16), Assoc> = HashMap::new();
    let mut buf = vec![0u8; 65536];
    let mut next_tag: u32 = 0x5c70_0001;
    while !stop.load(Ordering::Relaxed) {
        let (from, bytes) = match recv(sock, &mut buf) {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            // A signal, not the socket: receive again.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                errors.note(format!("{name}: receive: {e}"));
                // Not a busy loop on an error that repeats.
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
        };
        if bytes.len() >= 4 && u16::from_be_bytes([bytes[2], bytes[3]]) != port {
            continue;
        }
        let p = match Packet::decode(&bytes) {
            Ok(p) => p,
            Err(_) => {
                bad.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        let key = (from, p.sport);
        let peer = SocketAddr::new(from, p.sport);
        let answer = |vtag: u32, chunks: Vec<Chunk>| Packet {
            sport: port,
            dport: p.sport,
            vtag,
            chunks,
        };
        let Some(first) = p.chunks.first() else {
            continue;
        };
        let out = match first.kind {
            chunk::INIT => {
                let (Some(peer_tag), Some(peer_tsn)) =
                    (be32(&first.value, 0), be32(&first.value, 12))
                else {
                    continue;
                };
                next_tag = next_tag.wrapping_mul(2_654_435_761).wrapping_add(1) | 1;
                let mut cookie = Vec::with_capacity(12);
                cookie.extend(next_tag.to_be_bytes());
                cookie.extend(peer_tag.to_be_bytes());
                cookie.extend(peer_tsn.to_be_bytes());
                let mut v = init_value(next_tag, next_tag);
                v.extend(7u16.to_be_bytes()); // State Cookie
                v.extend(((4 + cookie.len()) as u16).to_be_bytes());
                v.extend(cookie);
                answer(peer_tag, vec![Chunk::new(chunk::INIT_ACK, v)])
            }
            chunk::COOKIE_ECHO => {
                let (Some(my_tag), Some(peer_tag)) = (be32(&first.value, 0), be32(&first.value, 4))
                else {
                    continue;
                };
                if p.vtag != my_tag {
                    continue;
                }
                if assocs.len() >= MAX_ASSOCS {
                    assocs.clear();
                }
                assocs.insert(key, Assoc { peer_tag });
                answer(peer_tag, vec![Chunk::new(chunk::COOKIE_ACK, Vec::new())])
            }
            chunk::DATA => {
                let Some(a) = assocs.get(&key) else { continue };
                let Some(tsn) = be32(&first.value, 0) else {
                    continue;
                };
                let line = reply(name, peer);
                // Our first TSN is our tag (the INIT ACK said so).
                answer(a.peer_tag, vec![sack(tsn), data(p.vtag, line.as_bytes())])
            }
            chunk::SHUTDOWN => {
                let Some(a) = assocs.get(&key) else { continue };
                answer(
                    a.peer_tag,
                    vec![Chunk::new(chunk::SHUTDOWN_ACK, Vec::new())],
                )
            }
            chunk::SHUTDOWN_COMPLETE | chunk::ABORT => {
                assocs.remove(&key);
                continue;
            }
            _ => continue,
        };
        if let Err(e) = send(sock, from, &out) {
            errors.note(format!("{name}: send to {peer}: {e}"));
        }
    }
}

/// One association from this thread's namespace to a frontend or a backend, set up by
/// [`SctpClient::connect`]. Every step's error names the step (no answer within the
/// timeout, an ABORT, a wrong checksum or verification tag).
pub struct SctpClient {
    sock: Socket,
    /// A raw ICMP (ICMPv6) socket: a refusal of the INIT comes back on it.
    icmp: Socket,
    to: SocketAddr,
    sport: u16,
    my_tag: u32,
    peer_tag: u32,
    tsn: u32,
    timeout: Duration,
    buf: Vec<u8>,
}

impl SctpClient {
    /// The handshake: INIT, INIT ACK, COOKIE ECHO, COOKIE ACK, each awaited within
    /// `timeout`.
    pub fn connect(to: SocketAddr, timeout: Duration) -> Result<Self, String> {
        let sock = raw_socket(&to, Duration::from_millis(20)).map_err(|e| format!("{to}: {e}"))?;
        let icmp = icmp_socket(&to).map_err(|e| format!("{to}: raw ICMP socket: {e}"))?;
        let my_tag = rand::random::<u32>() | 1;
        let mut c = SctpClient {
            sock,
            icmp,
            to,
            sport: rand::random_range(20000..60000u16),
            my_tag,
            peer_tag: 0,
            tsn: my_tag,
            timeout,
            buf: vec![0u8; 65536],
        };
        c.send(vec![Chunk::new(chunk::INIT, init_value(my_tag, my_tag))])?;
        let ack = c.expect(chunk::INIT_ACK, "INIT ACK")?;
        let v = &ack.chunks[0].value;
        c.peer_tag = be32(v, 0).ok_or_else(|| format!("{to}: short INIT ACK"))?;
        let cookie = cookie_of(v).ok_or_else(|| format!("{to}: INIT ACK without a cookie"))?;
        c.send(vec![Chunk::new(chunk::COOKIE_ECHO, cookie)])?;
        c.expect(chunk::COOKIE_ACK, "COOKIE ACK")?;
        Ok(c)
    }

    /// One DATA each way: the server's reply line.
    pub fn request(&mut self) -> Result<Answer, String> {
        let to = self.to;
        self.tsn = self.tsn.wrapping_add(1);
        self.send(vec![data(self.tsn, b"hello\n")])?;
        let reply = self.expect(chunk::SACK, "SACK and DATA")?;
        let (their_tsn, line) = reply
            .chunks
            .iter()
            .find(|c| c.kind == chunk::DATA)
            .and_then(|c| Some((be32(&c.value, 0)?, c.value.get(12..)?)))
            .ok_or_else(|| format!("{to}: SACK without DATA"))?;
        let line = String::from_utf8_lossy(line).to_string();
        self.send(vec![sack(their_tsn)])?;
        client::parse(&line, to)
    }

    /// The shutdown: SHUTDOWN, SHUTDOWN ACK, SHUTDOWN COMPLETE.
    pub fn close(mut self) -> Result<(), String> {
        self.send(vec![Chunk::new(
            chunk::SHUTDOWN,
            self.tsn.to_be_bytes().to_vec(),
        )])?;
        self.expect(chunk::SHUTDOWN_ACK, "SHUTDOWN ACK")?;
        self.send(vec![Chunk::new(chunk::SHUTDOWN_COMPLETE, Vec::new())])
    }

    fn send(&self, chunks: Vec<Chunk>) -> Result<(), String> {
        let vtag = if chunks.first().map(|c| c.kind) == Some(chunk::INIT) {
            0
        } else {
            self.peer_tag
        };
        let p = Packet {
            sport: self.sport,
            dport: self.to.port(),
            vtag,
            chunks,
        };
        send(&self.sock, self.to.ip(), &p).map_err(|e| format!("{}: send: {e}", self.to))
    }

    /// The next packet of this association whose first chunk is `want`.
    fn expect(&mut self, want: u8, step: &str) -> Result<Packet, String> {
        let to = self.to;
        let deadline = Instant::now() + self.timeout;
        loop {
            if Instant::now() > deadline {
                return Err(format!("{to}: no {step} within {:?}", self.timeout));
            }
            if want == chunk::INIT_ACK
                && let Ok(Some((_, msg))) = recv(&self.icmp, &mut self.buf)
                && let Some(err) = refusal(&msg, to, self.sport)
            {
                return Err(err);
            }
            let (from, bytes) = match recv(&self.sock, &mut self.buf) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) => return Err(format!("{to}: receive: {e}")),
            };
            if from != to.ip() || bytes.len() < 12 {
                continue;
            }
            let ports = (
                u16::from_be_bytes([bytes[0], bytes[1]]),
                u16::from_be_bytes([bytes[2], bytes[3]]),
            );
            if ports != (to.port(), self.sport) {
                continue;
            }
            let p = Packet::decode(&bytes).map_err(|e| format!("{to}: {step}: {e}"))?;
            if p.vtag != self.my_tag {
                return Err(format!("{to}: {step}: verification tag {:#x}", p.vtag));
            }
            match p.first() {
                Some(k) if k == want => return Ok(p),
                Some(chunk::ABORT) => return Err(format!("{to}: ABORT instead of {step}")),
                _ => continue,
            }
        }
    }
}

/// One whole association to `to`: handshake, one request, shutdown.
pub fn sctp_request(to: SocketAddr, timeout: Duration) -> Result<Answer, String> {
    let mut c = SctpClient::connect(to, timeout)?;
    let answer = c.request()?;
    c.close()?;
    Ok(answer)
}

/// Sends an INIT to `to` and expects the ICMP (ICMPv6) port unreachable that refuses it, as
/// kube-proxy's REJECT sends for a Service without endpoints. An error if an INIT ACK, some
/// other ICMP error or nothing comes within `timeout`.
pub fn sctp_refused(to: SocketAddr, timeout: Duration) -> Result<(), String> {
    match SctpClient::connect(to, timeout) {
        Ok(_) => Err(format!("{to}: answered, not refused")),
        Err(e) if e.ends_with(REFUSED) => Ok(()),
        Err(e) => Err(e),
    }
}

/// How [`SctpClient::connect`]'s error ends when the INIT was refused.
pub const REFUSED: &str = "refused (ICMP port unreachable)";

/// A raw ICMP socket of `to`'s family, with a short read timeout (polled between reads of
/// the SCTP socket).
fn icmp_socket(to: &SocketAddr) -> io::Result<Socket> {
    let s = if to.is_ipv4() {
        Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))?
    } else {
        Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?
    };
    s.set_read_timeout(Some(Duration::from_millis(2)))?;
    Ok(s)
}

/// The error an ICMP (ICMPv6) message `msg` makes of the INIT from port `sport` to `to`,
/// if it is a destination unreachable quoting it: [`REFUSED`] for port unreachable.
fn refusal(msg: &[u8], to: SocketAddr, sport: u16) -> Option<String> {
    let quoted = msg.get(8..)?;
    let ports = [sport.to_be_bytes(), to.port().to_be_bytes()].concat();
    let (ours, port_unreach) = match to.ip() {
        IpAddr::V4(dst) => {
            let ihl = ((quoted.first()? & 0x0f) as usize) * 4;
            let ours = msg[0] == 3
                && quoted.get(9) == Some(&(IPPROTO_SCTP as u8))
                && quoted.get(16..20) == Some(&dst.octets()[..])
                && quoted.get(ihl..ihl + 4) == Some(&ports[..]);
            (ours, msg[1] == 3)
        }
        IpAddr::V6(dst) => {
            let ours = msg[0] == 1
                && quoted.get(6) == Some(&(IPPROTO_SCTP as u8))
                && quoted.get(24..40) == Some(&dst.octets()[..])
                && quoted.get(40..44) == Some(&ports[..]);
            (ours, msg[1] == 4)
        }
    };
    match (ours, port_unreach) {
        (false, _) => None,
        (true, true) => Some(format!("{to}: {REFUSED}")),
        (true, false) => Some(format!(
            "{to}: unreachable (ICMP type {} code {}), not port unreachable",
            msg[0], msg[1]
        )),
    }
}

/// The State Cookie parameter (type 7) of an INIT ACK's value.
fn cookie_of(v: &[u8]) -> Option<Vec<u8>> {
    let mut at = 16;
    while at + 4 <= v.len() {
        let kind = u16::from_be_bytes([v[at], v[at + 1]]);
        let len = u16::from_be_bytes([v[at + 2], v[at + 3]]) as usize;
        if len < 4 || at + len > v.len() {
            return None;
        }
        if kind == 7 {
            return Some(v[at + 4..at + len].to_vec());
        }
        at += len.next_multiple_of(4);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packet_survives_encoding_and_a_flipped_bit_fails_its_checksum() {
        let p = Packet {
            sport: 40000,
            dport: 80,
            vtag: 0xdead_beef,
            chunks: vec![data(7, b"abc"), sack(3)],
        };
        let mut wire = p.encode();
        assert_eq!(wire.len() % 4, 0);
        assert_eq!(Packet::decode(&wire), Ok(p));
        wire[20] ^= 1;
        assert!(Packet::decode(&wire).unwrap_err().contains("checksum"));
    }
}
