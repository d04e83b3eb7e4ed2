//! Echo servers for backend pods: every request line (TCP) or datagram (UDP) is answered with
//! `"<name> <peer-ip>:<peer-port>\n"`, the server's name and the peer address it saw.
//!
//! A TCP line `SHA256 <len>` starts a bulk transfer: the server reads exactly `len` bytes and
//! answers `"<name> <peer> <sha256 hex>\n"` (for transfers through MTU and offload changes).
//! A line `SINK` makes it read and drop everything until the client shuts its side, then
//! answer `"<name> <peer> <bytes>\n"` (a throughput test that costs the server nothing).
//! A line `SOURCE <len>` is a download: the server writes `len` bytes and closes (the
//! bulk direction whose packets are replies: what direct server return changes); they are
//! `client::pattern`'s [`crate::client::SOURCE_CHUNK`] bytes, repeated, so the client can
//! check their SHA-256 (`client::tcp_download`).

use std::{
    io::{BufRead, BufReader, ErrorKind, Write},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
    time::Duration,
};

use crate::netns::Netns;

/// TCP and UDP echo servers running inside a namespace until dropped.
pub struct EchoServer {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Result<(), String>>>,
}

impl EchoServer {
    /// Starts servers named `name` on `tcp_port` and `udp_port` (0 = none) inside `ns`, on
    /// every IPv4 address.
    pub fn start(ns: &Netns, name: &str, tcp_port: u16, udp_port: u16) -> Result<Self, String> {
        Self::start_at(
            ns,
            name,
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            tcp_port,
            udp_port,
        )
    }

    /// As [`EchoServer::start`], on address `ip` only (an IPv6 address of a dual-stack pod:
    /// its IPv4 servers keep the IPv4 wildcard).
    pub fn start_at(
        ns: &Netns,
        name: &str,
        ip: IpAddr,
        tcp_port: u16,
        udp_port: u16,
    ) -> Result<Self, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        if tcp_port != 0 {
            let (stop, name, ready) = (stop.clone(), name.to_string(), ready_tx.clone());
            threads.push(
                ns.spawn(move || serve_tcp(SocketAddr::new(ip, tcp_port), &name, &stop, ready)),
            );
        }
        if udp_port != 0 {
            let (stop, name, ready) = (stop.clone(), name.to_string(), ready_tx.clone());
            threads.push(
                ns.spawn(move || serve_udp(SocketAddr::new(ip, udp_port), &name, &stop, ready)),
            );
        }
        drop(ready_tx);
        for _ in 0..threads.len() {
            ready_rx
                .recv()
                .map_err(|_| format!("{name}: server thread died"))??;
        }
        Ok(EchoServer { stop, threads })
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The reply a server named `name` gives a peer.
pub fn reply(name: &str, peer: SocketAddr) -> String {
    format!("{name} {peer}\n")
}

fn serve_tcp(
    at: SocketAddr,
    name: &str,
    stop: &AtomicBool,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
) {
    let listener = match TcpListener::bind(at).and_then(|l| {
        l.set_nonblocking(true)?;
        Ok(l)
    }) {
        Ok(l) => l,
        Err(e) => {
            let _ = ready.send(Err(format!("{name}: tcp bind {at}: {e}")));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((conn, peer)) => {
                let name = name.to_string();
                thread::spawn(move || handle_tcp(conn, peer, &name));
            }
            // Wait for the next connection without spinning, waking up to see `stop`.
            Err(e) if e.kind() == ErrorKind::WouldBlock => wait_readable(&listener, 20),
            Err(_) => thread::sleep(Duration::from_millis(1)),
        }
    }
}

fn handle_tcp(conn: TcpStream, peer: SocketAddr, name: &str) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(mut writer) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    while matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
        if line.trim() == "SINK" {
            let n = std::io::copy(&mut reader, &mut std::io::sink()).unwrap_or(0);
            let _ = writer.write_all(format!("{name} {peer} {n}\n").as_bytes());
            return;
        }
        if let Some(len) = line.trim().strip_prefix("SOURCE ") {
            // A download: `len` bytes to the client, then the connection closes.
            if let Ok(mut left) = len.parse::<u64>() {
                let chunk = crate::client::pattern(crate::client::SOURCE_CHUNK);
                while left > 0 {
                    let n = chunk.len().min(left as usize);
                    if writer.write_all(&chunk[..n]).is_err() {
                        return;
                    }
                    left -= n as u64;
                }
            }
            return;
        }
        let answer = match line.trim().strip_prefix("SHA256 ") {
            Some(len) => match len.parse::<u64>().ok().and_then(|n| digest(&mut reader, n)) {
                Some(hex) => format!("{name} {peer} {hex}\n"),
                None => return,
            },
            None => reply(name, peer),
        };
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
        line.clear();
    }
}

/// The SHA-256 (hex) of the next `len` bytes of `r`; `None` if the stream ends first.
fn digest(r: &mut impl std::io::Read, len: u64) -> Option<String> {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    let mut left = len;
    let mut buf = vec![0u8; 64 * 1024];
    while left > 0 {
        let want = buf.len().min(left as usize);
        let n = r.read(&mut buf[..want]).ok()?;
        if n == 0 {
            return None;
        }
        h.update(&buf[..n]);
        left -= n as u64;
    }
    Some(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn serve_udp(
    at: SocketAddr,
    name: &str,
    stop: &AtomicBool,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
) {
    let sock = match UdpSocket::bind(at).and_then(|s| {
        s.set_read_timeout(Some(Duration::from_millis(20)))?;
        Ok(s)
    }) {
        Ok(s) => s,
        Err(e) => {
            let _ = ready.send(Err(format!("{name}: udp bind {at}: {e}")));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        if let Ok((_, peer)) = sock.recv_from(&mut buf) {
            let _ = sock.send_to(reply(name, peer).as_bytes(), peer);
        }
    }
}

/// Blocks until `listener` has a connection to accept or `ms` milliseconds pass.
fn wait_readable(listener: &TcpListener, ms: i32) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let timeout = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
    let _ = poll(
        &mut [PollFd::new(listener.as_fd(), PollFlags::POLLIN)],
        timeout,
    );
}
