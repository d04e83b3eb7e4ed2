//! Clients: one request over TCP or UDP, and what the reply says.

use std::{
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpStream, UdpSocket},
    time::Duration,
};

/// One answered request: what the backend said. (Not the socket's peer: for a connected
/// socket that is always the address it connected to, whatever answered. Tests that need
/// the source a reply carried capture it: `xlb_tests::capture`.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The backend that answered (its echo name).
    pub backend: String,
    /// The client address the backend saw.
    pub seen_client: String,
}

/// An echo server's reply line (`name peer`) to a request to `to`.
pub(crate) fn parse(line: &str, to: SocketAddr) -> Result<Answer, String> {
    let mut parts = line.split_whitespace();
    match (parts.next(), parts.next()) {
        (Some(b), Some(c)) => Ok(Answer {
            backend: b.to_string(),
            seen_client: c.to_string(),
        }),
        _ => Err(format!("unexpected reply {line:?} to a request to {to}")),
    }
}

/// Connects, sends one line, reads the answer, closes. Must run inside the client namespace.
pub fn tcp_request(to: SocketAddr, timeout: Duration) -> Result<Answer, String> {
    let mut s =
        TcpStream::connect_timeout(&to, timeout).map_err(|e| format!("connect {to}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.write_all(b"hello\n")
        .map_err(|e| format!("send to {to}: {e}"))?;
    let mut line = String::new();
    BufReader::new(&s)
        .read_line(&mut line)
        .map_err(|e| format!("read from {to}: {e}"))?;
    parse(&line, to)
}

/// Sends one datagram from a fresh socket and waits for the answer. The socket is connected
/// to `to`, so the kernel only delivers an answer whose source is exactly `to`.
pub fn udp_request(to: SocketAddr, timeout: Duration) -> Result<Answer, String> {
    let any: SocketAddr = if to.is_ipv6() {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    };
    let s = UdpSocket::bind(any).map_err(|e| e.to_string())?;
    s.connect(to).map_err(|e| format!("connect {to}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.send(b"hello\n")
        .map_err(|e| format!("send to {to}: {e}"))?;
    let mut buf = [0u8; 512];
    let n = s
        .recv(&mut buf)
        .map_err(|e| format!("recv from {to}: {e}"))?;
    parse(&String::from_utf8_lossy(&buf[..n]), to)
}

/// A bulk upload's outcome: who took it, and whether the SHA-256 it computed matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upload {
    pub answer: Answer,
    pub sha256_matches: bool,
}

/// Uploads `len` pseudo-random bytes over TCP and checks the SHA-256 the backend computed
/// over what it received. Must run inside the client namespace.
pub fn tcp_upload(to: SocketAddr, len: usize, timeout: Duration) -> Result<Upload, String> {
    use sha2::Digest as _;
    let data = pattern(len);
    let want = hex(&sha2::Sha256::digest(&data));
    let mut s =
        TcpStream::connect_timeout(&to, timeout).map_err(|e| format!("connect {to}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.write_all(format!("SHA256 {len}\n").as_bytes())
        .and_then(|()| s.write_all(&data))
        .map_err(|e| format!("upload to {to}: {e}"))?;
    let mut line = String::new();
    BufReader::new(&s)
        .read_line(&mut line)
        .map_err(|e| format!("read from {to}: {e}"))?;
    let got = line
        .split_whitespace()
        .nth(2)
        .unwrap_or_default()
        .to_string();
    Ok(Upload {
        answer: parse(&line, to)?,
        sha256_matches: got == want,
    })
}

/// `len` pseudo-random bytes, the same every run (xorshift: incompressible enough).
pub fn pattern(len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    let mut x: u32 = 0x9e37_79b9;
    for b in &mut data {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
    data
}

/// The bytes a download (`SOURCE <len>`, `crate::echo`) repeats: a prime number of them, so
/// no segment size lines up with it.
pub const SOURCE_CHUNK: usize = 65_521;

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A bulk download's outcome: the bytes received, and whether their SHA-256 is that of
/// what the server sent ([`SOURCE_CHUNK`] bytes of [`pattern`], repeated, cut at `len`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Download {
    pub bytes: usize,
    pub sha256_matches: bool,
}

/// Downloads `len` bytes over TCP (`SOURCE <len>`: the server writes them and closes) and
/// checks their SHA-256. Must run inside the client namespace.
pub fn tcp_download(to: SocketAddr, len: usize, timeout: Duration) -> Result<Download, String> {
    use sha2::Digest as _;
    use std::io::Read as _;
    let chunk = pattern(SOURCE_CHUNK);
    let mut want = sha2::Sha256::new();
    let mut left = len;
    while left > 0 {
        let n = left.min(chunk.len());
        want.update(&chunk[..n]);
        left -= n;
    }
    let mut s =
        TcpStream::connect_timeout(&to, timeout).map_err(|e| format!("connect {to}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.write_all(format!("SOURCE {len}\n").as_bytes())
        .map_err(|e| format!("ask {to}: {e}"))?;
    let mut got = sha2::Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut bytes = 0;
    loop {
        let n = s
            .read(&mut buf)
            .map_err(|e| format!("download from {to} after {bytes} bytes: {e}"))?;
        if n == 0 {
            break;
        }
        got.update(&buf[..n]);
        bytes += n;
    }
    Ok(Download {
        bytes,
        sha256_matches: bytes == len && got.finalize() == want.finalize(),
    })
}

/// Sends a line on a long-lived TCP connection; the backend that answered.
pub fn ask_tcp(c: &mut TcpStream) -> Result<String, String> {
    c.write_all(b"hello\n").map_err(|e| format!("send: {e}"))?;
    let mut line = String::new();
    BufReader::new(&*c)
        .read_line(&mut line)
        .map_err(|e| format!("read: {e}"))?;
    line.split_whitespace()
        .next()
        .map(str::to_string)
        .ok_or_else(|| format!("no answer on {:?}: {line:?}", c.peer_addr()))
}

/// Sends a datagram on a long-lived connected UDP socket; the backend that answered.
pub fn ask_udp(u: &UdpSocket) -> Result<String, String> {
    u.send(b"hello\n").map_err(|e| format!("send: {e}"))?;
    let mut buf = [0u8; 512];
    let n = u.recv(&mut buf).map_err(|e| format!("recv: {e}"))?;
    String::from_utf8_lossy(&buf[..n])
        .split_whitespace()
        .next()
        .map(str::to_string)
        .ok_or_else(|| "empty UDP answer".to_string())
}
