//! `xlb-probe`: the labs' one client process (the socket-hook tests, the demo, `xlb-compare`
//! and the traffic bench). The hooks act on the processes of a cgroup, so a client must be
//! a process of its own (a thread cannot leave its process's cgroup). It talks to the lab's
//! echo servers.
//!
//! Per request, one line `ok <ms> <backend> <client the backend saw> <peer the socket saw>`
//! or `err <ms> <errno> <message>`:
//!
//! ```text
//! xlb-probe tcp IP:PORT COUNT              new connection per request
//! xlb-probe udp IP:PORT COUNT              new connected UDP socket per request
//! xlb-probe udp-unconnected IP:PORT COUNT  one unconnected socket: sendto + recvfrom
//! xlb-probe tcp-hold IP:PORT SECS MS       one connection, a request every MS ms
//! xlb-probe udp-stay IP:PORT SECS MS       one connected UDP socket, a request every MS
//!                                          ms; after an error other than a timeout it
//!                                          connects again
//! ```
//!
//! Summaries:
//!
//! ```text
//! xlb-probe flows [--requests N] TARGET…   N requests per `tcp/IP:PORT` or `udp/IP:PORT`,
//!                                          one line per target: the backends that
//!                                          answered, REFUSED, DROPPED or FAILED (…)
//! xlb-probe load [--phase-ms MS] IP:PORT   waits until it accepts, then new connections
//!                                          per second and requests per second on a kept
//!                                          connection, each for MS; one key=value line
//! ```

use std::{
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpStream, UdpSocket},
    process::ExitCode,
    time::{Duration, Instant},
};

use clap::Parser;
use xlb_lab::{load, probe};

const TIMEOUT: Duration = Duration::from_secs(2);

fn report(start: Instant, r: Result<(String, SocketAddr), std::io::Error>) {
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    match r {
        Ok((line, peer)) => {
            let mut words = line.split_whitespace();
            let backend = words.next().unwrap_or("?");
            let seen = words.next().unwrap_or("?");
            println!("ok {ms:.3} {backend} {seen} {peer}");
        }
        Err(e) => println!(
            "err {ms:.3} {} {}",
            e.raw_os_error().unwrap_or(0),
            e.to_string().replace('\n', " ")
        ),
    }
}

fn tcp_once(s: &mut TcpStream) -> std::io::Result<(String, SocketAddr)> {
    s.write_all(b"hello\n")?;
    let mut line = String::new();
    BufReader::new(&*s).read_line(&mut line)?;
    if line.is_empty() {
        return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
    }
    Ok((line, s.peer_addr()?))
}

fn tcp(to: SocketAddr) -> std::io::Result<(String, SocketAddr)> {
    let mut s = TcpStream::connect_timeout(&to, TIMEOUT)?;
    s.set_read_timeout(Some(TIMEOUT))?;
    tcp_once(&mut s)
}

/// A UDP socket of `to`'s family, on any address and port.
fn udp_for(to: SocketAddr) -> std::io::Result<UdpSocket> {
    if to.is_ipv6() {
        UdpSocket::bind("[::]:0")
    } else {
        UdpSocket::bind("0.0.0.0:0")
    }
}

fn udp_connected(to: SocketAddr) -> std::io::Result<UdpSocket> {
    let s = udp_for(to)?;
    s.set_read_timeout(Some(TIMEOUT))?;
    s.connect(to)?;
    Ok(s)
}

fn udp_once(s: &UdpSocket) -> std::io::Result<(String, SocketAddr)> {
    s.send(b"hello\n")?;
    let mut buf = [0u8; 512];
    let n = s.recv(&mut buf)?;
    Ok((
        String::from_utf8_lossy(&buf[..n]).into_owned(),
        s.peer_addr()?,
    ))
}

fn udp_unconnected(s: &UdpSocket, to: SocketAddr) -> std::io::Result<(String, SocketAddr)> {
    s.send_to(b"hello\n", to)?;
    let mut buf = [0u8; 512];
    let (n, from) = s.recv_from(&mut buf)?;
    Ok((String::from_utf8_lossy(&buf[..n]).into_owned(), from))
}

/// The labs' client process (see the module docs).
#[derive(Parser)]
#[command(name = "xlb-probe")]
enum Probe {
    /// A new connection per request.
    Tcp { to: SocketAddr, count: u64 },
    /// A new connected UDP socket per request.
    Udp { to: SocketAddr, count: u64 },
    /// One unconnected UDP socket: sendto + recvfrom.
    UdpUnconnected { to: SocketAddr, count: u64 },
    /// One connection for SECS, a request every MS ms.
    TcpHold { to: SocketAddr, secs: u64, ms: u64 },
    /// One connected UDP socket for SECS, a request every MS ms (connects again after an
    /// error other than a timeout).
    UdpStay { to: SocketAddr, secs: u64, ms: u64 },
    /// REQUESTS requests to each target (`tcp/IP:PORT`, `udp/IP:PORT`), a fresh socket each;
    /// one line per target: the backends that answered, REFUSED, DROPPED or FAILED (…).
    Flows {
        #[arg(long, default_value_t = 40)]
        requests: usize,
        targets: Vec<String>,
    },
    /// Waits until TARGET accepts, then new connections per second and requests per second
    /// on a kept connection, each for PHASE_MS; one line of `key=value`.
    Load {
        #[arg(long, default_value_t = 1500)]
        phase_ms: u64,
        target: SocketAddr,
    },
}

fn each(count: u64, mut once: impl FnMut() -> std::io::Result<(String, SocketAddr)>) {
    for _ in 0..count {
        let t = Instant::now();
        report(t, once());
    }
}

fn tcp_hold(to: SocketAddr, secs: u64, ms: u64) -> Result<(), String> {
    let start = Instant::now();
    let t = Instant::now();
    let mut s = match TcpStream::connect_timeout(&to, TIMEOUT) {
        Ok(s) => s,
        Err(e) => {
            report(t, Err(e));
            return Ok(());
        }
    };
    s.set_read_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    while start.elapsed() < Duration::from_secs(secs) {
        let t = Instant::now();
        let r = tcp_once(&mut s);
        let failed = r.is_err();
        report(t, r);
        if failed {
            break;
        }
        std::thread::sleep(Duration::from_millis(ms));
    }
    Ok(())
}

fn udp_stay(to: SocketAddr, secs: u64, ms: u64) -> Result<(), String> {
    let start = Instant::now();
    let mut sock = None;
    while start.elapsed() < Duration::from_secs(secs) {
        let t = Instant::now();
        let s = match sock.take() {
            Some(s) => Ok(s),
            None => udp_connected(to),
        };
        match s {
            Ok(s) => {
                let r = udp_once(&s);
                // A timeout keeps the socket (a stuck socket stays stuck); any other
                // error (ECONNABORTED once destroyed) makes the client connect again.
                let keep = match &r {
                    Ok(_) => true,
                    Err(e) => matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ),
                };
                report(t, r);
                if keep {
                    sock = Some(s);
                }
            }
            Err(e) => report(t, Err(e)),
        }
        std::io::stdout().flush().map_err(|e| e.to_string())?;
        std::thread::sleep(Duration::from_millis(ms));
    }
    Ok(())
}

fn run(probe: Probe) -> Result<(), String> {
    match probe {
        Probe::Tcp { to, count } => each(count, || tcp(to)),
        Probe::Udp { to, count } => each(count, || udp_connected(to).and_then(|s| udp_once(&s))),
        Probe::UdpUnconnected { to, count } => {
            let s = udp_for(to).map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(TIMEOUT))
                .map_err(|e| e.to_string())?;
            each(count, || udp_unconnected(&s, to));
        }
        Probe::TcpHold { to, secs, ms } => tcp_hold(to, secs, ms)?,
        Probe::UdpStay { to, secs, ms } => udp_stay(to, secs, ms)?,
        Probe::Flows { requests, targets } => print!("{}", probe::flows(requests, &targets)?),
        Probe::Load { phase_ms, target } => {
            if !load::wait_ready(target, Duration::from_secs(10)) {
                return Err(format!("{target} never accepted a connection within 10 s"));
            }
            println!(
                "{}",
                load::measure(target, Duration::from_millis(phase_ms)).line()
            );
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Probe::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xlb-probe: {e}");
            ExitCode::from(2)
        }
    }
}
