//! `xlb-probe`: a client process for the socket-hook tests and the demo. The hooks act on
//! the processes of a cgroup, so a client must be a process of its own (a thread cannot
//! leave its process's cgroup). It talks to the lab's echo servers and prints one line per
//! request: `ok <ms> <backend> <client the backend saw> <peer the socket saw>` or
//! `err <ms> <errno> <message>`.
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

use std::{
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpStream, UdpSocket},
    process::ExitCode,
    time::{Duration, Instant},
};

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

fn udp_connected(to: SocketAddr) -> std::io::Result<UdpSocket> {
    let s = UdpSocket::bind("0.0.0.0:0")?;
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

fn run(args: &[String]) -> Result<(), String> {
    let usage = "usage: xlb-probe tcp|udp|udp-unconnected IP:PORT COUNT | tcp-hold|udp-stay IP:PORT SECS MS";
    let (mode, to) = match args {
        [mode, to, ..] => (
            mode.as_str(),
            to.parse::<SocketAddr>().map_err(|e| e.to_string())?,
        ),
        _ => return Err(usage.into()),
    };
    let num = |i: usize| -> Result<u64, String> {
        args.get(i)
            .ok_or(usage)?
            .parse()
            .map_err(|e| format!("{}: {e}", args[i]))
    };
    match mode {
        "tcp" => (0..num(2)?).for_each(|_| {
            let t = Instant::now();
            report(t, tcp(to));
        }),
        "udp" => (0..num(2)?).for_each(|_| {
            let t = Instant::now();
            report(t, udp_connected(to).and_then(|s| udp_once(&s)));
        }),
        "udp-unconnected" => {
            let s = UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(TIMEOUT))
                .map_err(|e| e.to_string())?;
            for _ in 0..num(2)? {
                let t = Instant::now();
                report(t, udp_unconnected(&s, to));
            }
        }
        "tcp-hold" => {
            let (secs, ms) = (num(2)?, num(3)?);
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
        }
        "udp-stay" => {
            let (secs, ms) = (num(2)?, num(3)?);
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
        }
        _ => return Err(usage.into()),
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xlb-probe: {e}");
            ExitCode::from(2)
        }
    }
}
