//! A bounded TCP load generator for the benches: new connections per second, requests per
//! second on one kept connection, how long `connect()` takes, and the throughput of one bulk
//! TCP stream. It runs on a thread inside
//! a namespace, or as the `xlb client load` process (in a cgroup, for the socket hooks),
//! which prints one [`Measured::line`].

use std::{
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

/// What one measurement of a path gives.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Measured {
    pub conns_per_s: f64,
    pub reqs_per_s: f64,
    pub connect_p50_us: f64,
    pub connect_p99_us: f64,
    /// One TCP stream's upload to the echo server's sink, MB/s (10^6 bytes).
    pub bulk_mb_per_s: f64,
    pub failures: usize,
}

impl Measured {
    /// One line: `conns_per_s=… reqs_per_s=… connect_p50_us=… connect_p99_us=…
    /// bulk_mb_per_s=… failures=…`.
    pub fn line(&self) -> String {
        format!(
            "conns_per_s={:.1} reqs_per_s={:.1} connect_p50_us={:.1} connect_p99_us={:.1} bulk_mb_per_s={:.1} failures={}",
            self.conns_per_s,
            self.reqs_per_s,
            self.connect_p50_us,
            self.connect_p99_us,
            self.bulk_mb_per_s,
            self.failures
        )
    }

    /// Parses [`Measured::line`].
    pub fn parse(line: &str) -> Result<Self, String> {
        let mut m = Measured::default();
        for word in line.split_whitespace() {
            let (key, value) = word
                .split_once('=')
                .ok_or_else(|| format!("{line:?}: {word:?} is not key=value"))?;
            let num = || value.parse::<f64>().map_err(|e| format!("{word:?}: {e}"));
            match key {
                "conns_per_s" => m.conns_per_s = num()?,
                "reqs_per_s" => m.reqs_per_s = num()?,
                "connect_p50_us" => m.connect_p50_us = num()?,
                "connect_p99_us" => m.connect_p99_us = num()?,
                "bulk_mb_per_s" => m.bulk_mb_per_s = num()?,
                "failures" => m.failures = value.parse().map_err(|e| format!("{word:?}: {e}"))?,
                _ => return Err(format!("{line:?}: unknown key {key:?}")),
            }
        }
        Ok(m)
    }
}

/// The `p`th percentile (nearest rank) of `xs`.
fn percentile(xs: &mut [f64], p: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * xs.len() as f64).ceil() as usize;
    xs[rank.clamp(1, xs.len()) - 1]
}

/// Connects until a connection succeeds (ARP, a proxy binding its ports), at most `within`.
pub fn wait_ready(target: SocketAddr, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&target, Duration::from_millis(200)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Connect, one request, its response, close; returns how long `connect()` took in µs.
fn one_connection(target: SocketAddr) -> std::io::Result<f64> {
    let t = Instant::now();
    let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(1))?;
    let connect_us = t.elapsed().as_secs_f64() * 1e6;
    s.set_read_timeout(Some(Duration::from_secs(1)))?;
    s.write_all(b"x\n")?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line)?;
    Ok(connect_us)
}

/// Requests on one kept connection for `phase`: (requests answered, failures).
fn kept_connection(target: SocketAddr, phase: Duration) -> (usize, usize) {
    let Ok(s) = TcpStream::connect_timeout(&target, Duration::from_secs(1)) else {
        return (0, 1);
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let mut w = s.try_clone().ok();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    let mut reqs = 0;
    let start = Instant::now();
    while start.elapsed() < phase {
        line.clear();
        let ok = w.as_mut().is_some_and(|w| w.write_all(b"x\n").is_ok())
            && r.read_line(&mut line).is_ok_and(|n| n > 0);
        if !ok {
            return (reqs, 1);
        }
        reqs += 1;
    }
    (reqs, 0)
}

/// One TCP stream writing as fast as it can for `phase` into the echo server's sink; MB/s
/// as the server counted the bytes (None: the stream failed).
fn bulk(target: SocketAddr, phase: Duration) -> Option<f64> {
    let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(1)).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"SINK\n").ok()?;
    let chunk = vec![0x5au8; 256 * 1024];
    let start = Instant::now();
    while start.elapsed() < phase {
        s.write_all(&chunk).ok()?;
    }
    s.shutdown(std::net::Shutdown::Write).ok()?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).ok()?;
    let secs = start.elapsed().as_secs_f64();
    let bytes: f64 = line.split_whitespace().nth(2)?.parse().ok()?;
    Some(bytes / secs / 1e6)
}

/// New connections, then requests on a kept connection, then one bulk stream, to `target`,
/// each for `phase`. Must run in the client's namespace.
pub fn measure(target: SocketAddr, phase: Duration) -> Measured {
    let mut connect_us = Vec::new();
    let mut failures = 0usize;
    let start = Instant::now();
    while start.elapsed() < phase {
        match one_connection(target) {
            Ok(us) => connect_us.push(us),
            Err(_) => failures += 1,
        }
    }
    let conns_per_s = connect_us.len() as f64 / start.elapsed().as_secs_f64();
    let start = Instant::now();
    let (reqs, kept_failures) = kept_connection(target, phase);
    let reqs_per_s = reqs as f64 / start.elapsed().as_secs_f64();
    let bulk_mb_per_s = bulk(target, phase);
    Measured {
        conns_per_s,
        reqs_per_s,
        connect_p50_us: percentile(&mut connect_us, 50.0),
        connect_p99_us: percentile(&mut connect_us, 99.0),
        bulk_mb_per_s: bulk_mb_per_s.unwrap_or(0.0),
        failures: failures + kept_failures + usize::from(bulk_mb_per_s.is_none()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_measurement_survives_its_line() {
        let m = Measured {
            conns_per_s: 6012.5,
            reqs_per_s: 17000.0,
            connect_p50_us: 31.2,
            connect_p99_us: 80.0,
            bulk_mb_per_s: 1234.5,
            failures: 2,
        };
        assert_eq!(Measured::parse(&m.line()), Ok(m));
    }
}
