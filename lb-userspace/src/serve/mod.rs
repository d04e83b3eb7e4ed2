//! The agent's HTTP endpoints: health (kube-proxy's `/healthz` and `/livez` semantics),
//! Prometheus metrics with kube-proxy's `/proxyMode` and `/configz` beside them, and the
//! per-service health-check node ports. HTTP/1.1 with keep-alive,
//! served by hyper on two single-threaded tokio runtimes ([`Pool`]): one for health
//! (`/healthz`, `/livez`, the health-check node ports), one for `/metrics`, so a scrape, a
//! slow scraper or a busy sync never delays a probe, and threads do not grow with
//! connections. What one client can hold ([`Limits`]):
//! a request head of at most 16 KiB (a longer one closes the connection), 5 s to send it,
//! 5 s idle between requests, 10 s from a request to the end of its response, and 256
//! connections per listener; at the cap a new connection takes the slot of the connection
//! idle the longest (one that has sent no request, or is between two), and is refused at
//! once only when all 256 are mid-request. Handlers run on their pool's thread: they must be
//! quick (a mutex; for `/metrics` a few batched reads of the pinned maps).

pub mod health;
pub mod metrics;
pub mod service_health;
pub mod status;

mod conns;
mod server;

use std::{net::SocketAddr, sync::Arc, time::Duration};

use thiserror::Error;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Error)]
#[error("cannot listen on {addr}: {source}")]
pub struct ServeError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// A handler's answer: the `http` crate's response (as hyper re-exports it) with its body
/// as text; the server adds Content-Length.
pub type Response = hyper::Response<String>;

pub use hyper::StatusCode;

/// A response of `status` with `body` of `content_type`.
pub fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<String>,
) -> Response {
    let mut r = hyper::Response::new(body.into());
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    r
}

/// A plain-text response.
pub fn text(status: StatusCode, body: impl Into<String>) -> Response {
    respond(status, "text/plain; charset=utf-8", body)
}

/// A JSON response.
pub fn json(status: StatusCode, body: impl Into<String>) -> Response {
    respond(status, "application/json", body)
}

/// What one listener allows its clients.
#[derive(Clone, Debug)]
pub struct Limits {
    /// hyper's read buffer: the most a request head (request line and headers) may take
    /// (at least 8 KiB, hyper's minimum).
    pub max_head: usize,
    /// From the connection opening, or the previous response, to the end of the head.
    pub header_read_timeout: Duration,
    /// Between the end of a response and the next request head.
    pub idle_timeout: Duration,
    /// From a request head read to the end of its response (a client that does not read).
    pub response_timeout: Duration,
    /// Open connections of one listener.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_head: 16 * 1024,
            header_read_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(10),
            max_connections: 256,
        }
    }
}

/// Which runtime (thread) serves a listener: health answers never queue behind metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pool {
    /// `/healthz`, `/livez`, the health-check node ports.
    Health,
    /// `/metrics`.
    Metrics,
}

/// Serves `handler(path)` on `addr` in `pool` for the life of the process; a path the
/// handler does not know is a 404.
pub fn spawn(
    addr: SocketAddr,
    pool: Pool,
    handler: impl Fn(&str) -> Option<Response> + Send + Sync + 'static,
) -> Result<SocketAddr, ServeError> {
    start(addr, pool, handler, None, Limits::default())
}

/// [`spawn`] in the health pool until `stop` is cancelled: the listener closes at once and
/// its connections with it (one mid-response too).
pub fn spawn_until(
    addr: SocketAddr,
    handler: impl Fn(&str) -> Option<Response> + Send + Sync + 'static,
    stop: CancellationToken,
) -> Result<SocketAddr, ServeError> {
    spawn_with(addr, handler, stop, Limits::default())
}

/// [`spawn_until`] with `limits`.
pub fn spawn_with(
    addr: SocketAddr,
    handler: impl Fn(&str) -> Option<Response> + Send + Sync + 'static,
    stop: CancellationToken,
    limits: Limits,
) -> Result<SocketAddr, ServeError> {
    start(addr, Pool::Health, handler, Some(stop), limits)
}

fn start(
    addr: SocketAddr,
    pool: Pool,
    handler: impl Fn(&str) -> Option<Response> + Send + Sync + 'static,
    stop: Option<CancellationToken>,
    limits: Limits,
) -> Result<SocketAddr, ServeError> {
    let handler: server::Handler = Arc::new(move |path: &str| {
        handler(path).unwrap_or_else(|| text(StatusCode::NOT_FOUND, "not found\n"))
    });
    server::start(addr, pool, handler, stop, limits).map_err(|source| ServeError { addr, source })
}

#[cfg(test)]
mod tests {
    use std::{
        io::{Read, Write},
        net::{Ipv4Addr, TcpStream},
        time::Instant,
    };

    use super::*;

    fn handler(path: &str) -> Option<Response> {
        assert_ne!(path, "/panic", "a handler that panics");
        (path == "/x").then(|| {
            let mut r = json(StatusCode::OK, "{}\n");
            r.headers_mut().insert(
                "x-load-balancing-endpoint-weight",
                hyper::header::HeaderValue::from_static("2"),
            );
            r
        })
    }

    fn serve(limits: Limits) -> (SocketAddr, CancellationToken) {
        let stop = CancellationToken::new();
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let bound = spawn_with(addr, handler, stop.clone(), limits).expect("listen");
        (bound, stop)
    }

    fn connect(addr: SocketAddr) -> TcpStream {
        let c = TcpStream::connect(addr).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        c
    }

    /// Reads one response (head and Content-Length body) from `c`.
    fn response(c: &mut TcpStream) -> String {
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") {
            let n = c.read(&mut byte).expect("read head");
            assert_eq!(n, 1, "closed mid-head: {:?}", String::from_utf8_lossy(&buf));
            buf.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&buf).to_string();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .and_then(|v| v.trim().parse().ok())
            .expect("Content-Length");
        let mut body = vec![0u8; len];
        c.read_exact(&mut body).expect("body");
        head + &String::from_utf8_lossy(&body)
    }

    /// True when the server closes `c` within `within`.
    fn closed_within(c: &mut TcpStream, within: Duration) -> bool {
        c.set_read_timeout(Some(within)).expect("timeout");
        let mut sink = [0u8; 4096];
        loop {
            match c.read(&mut sink) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    #[test]
    fn answers_keep_alive_requests_with_the_handlers_headers() {
        let (addr, _stop) = serve(Limits::default());
        let mut c = connect(addr);
        c.write_all(b"GET /x?probe=1 HTTP/1.1\r\nHost: n\r\n\r\n")
            .expect("write");
        let first = response(&mut c);
        assert!(first.starts_with("HTTP/1.1 200 OK\r\n"), "{first}");
        for h in [
            "Content-Type: application/json\r\n",
            "X-Load-Balancing-Endpoint-Weight: 2\r\n",
            "Content-Length: 3\r\n",
        ] {
            assert!(first.contains(h), "{h:?} missing: {first}");
        }
        assert!(first.ends_with("\r\n\r\n{}\n"), "{first}");
        // The same connection: the next request, an unknown path.
        c.write_all(b"GET /nope HTTP/1.1\r\nHost: n\r\n\r\n")
            .expect("write");
        let second = response(&mut c);
        assert!(second.starts_with("HTTP/1.1 404 Not Found\r\n"), "{second}");
        assert!(second.ends_with("not found\n"), "{second}");
        // Asked to close: answered, then closed.
        c.write_all(b"GET /x HTTP/1.1\r\nHost: n\r\nConnection: close\r\n\r\n")
            .expect("write");
        assert!(response(&mut c).starts_with("HTTP/1.1 200"));
        assert!(closed_within(&mut c, Duration::from_secs(1)));
    }

    #[test]
    fn a_head_over_the_limit_closes_the_connection() {
        let (addr, _stop) = serve(Limits::default());
        let mut c = connect(addr);
        c.set_write_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let chunk = vec![b'a'; 64 * 1024];
        let mut sent = 0usize;
        let _ = c.write_all(b"GET /");
        while sent < 64 << 20 && c.write_all(&chunk).is_ok() {
            sent += chunk.len();
        }
        assert!(
            sent < 64 << 20,
            "the server read {sent} bytes of one request line"
        );
        // The connection still works for others.
        let mut d = connect(addr);
        d.write_all(b"GET /x HTTP/1.1\r\nHost: n\r\n\r\n")
            .expect("write");
        assert!(response(&mut d).starts_with("HTTP/1.1 200"));
    }

    #[test]
    fn idle_and_slow_connections_are_closed() {
        let limits = Limits {
            header_read_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let (addr, _stop) = serve(limits);
        // Kept alive after a response, then idle.
        let mut idle = connect(addr);
        idle.write_all(b"GET /x HTTP/1.1\r\nHost: n\r\n\r\n")
            .expect("write");
        assert!(response(&mut idle).starts_with("HTTP/1.1 200"));
        let started = Instant::now();
        assert!(closed_within(&mut idle, Duration::from_secs(3)));
        assert!(started.elapsed() >= Duration::from_millis(250));
        // A head dripping in.
        let mut slow = connect(addr);
        let started = Instant::now();
        for b in b"GET /x HTTP/1.1\r\nX-Drip: " {
            if slow.write_all(&[*b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(closed_within(&mut slow, Duration::from_secs(3)));
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn at_the_cap_a_new_connection_is_served_and_the_oldest_idle_one_closed() {
        let limits = Limits {
            max_connections: 2,
            ..Limits::default()
        };
        let (addr, _stop) = serve(limits);
        let mut held: Vec<TcpStream> = (0..2).map(|_| connect(addr)).collect();
        std::thread::sleep(Duration::from_millis(50));
        let mut probe = connect(addr);
        probe
            .write_all(b"GET /x HTTP/1.1\r\nHost: n\r\n\r\n")
            .expect("write");
        assert!(response(&mut probe).starts_with("HTTP/1.1 200"));
        assert!(closed_within(&mut held[0], Duration::from_secs(1)));
    }

    #[test]
    fn a_handler_that_panics_answers_500_and_keeps_its_connection_and_slot() {
        let limits = Limits {
            max_connections: 1,
            ..Limits::default()
        };
        let (addr, _stop) = serve(limits);
        let mut c = connect(addr);
        c.write_all(b"GET /panic HTTP/1.1\r\nHost: n\r\n\r\n")
            .expect("write");
        assert!(response(&mut c).starts_with("HTTP/1.1 500"));
        // The same connection goes on, and its slot is idle again: a new one is served.
        c.write_all(b"GET /x HTTP/1.1\r\nHost: n\r\n\r\n")
            .expect("write");
        assert!(response(&mut c).starts_with("HTTP/1.1 200"));
        let mut d = connect(addr);
        d.write_all(b"GET /x HTTP/1.1\r\nHost: n\r\n\r\n")
            .expect("write");
        assert!(response(&mut d).starts_with("HTTP/1.1 200"));
    }

    #[test]
    fn a_slow_metrics_handler_never_delays_a_health_answer() {
        let any = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let slow = spawn(any, Pool::Metrics, |_| {
            std::thread::sleep(Duration::from_millis(800));
            Some(text(StatusCode::OK, "slow\n"))
        })
        .expect("listen");
        let health = spawn(any, Pool::Health, handler).expect("listen");
        let mut scrape = connect(slow);
        scrape
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: n\r\n\r\n")
            .expect("write");
        std::thread::sleep(Duration::from_millis(100));
        // The metrics thread is busy for 700 ms more: a probe does not wait for it.
        for _ in 0..5 {
            let started = Instant::now();
            let mut c = connect(health);
            c.write_all(b"GET /x HTTP/1.1\r\nHost: n\r\n\r\n")
                .expect("write");
            assert!(response(&mut c).starts_with("HTTP/1.1 200"));
            assert!(
                started.elapsed() < Duration::from_millis(100),
                "a probe took {:?} during a slow scrape",
                started.elapsed()
            );
        }
        assert!(response(&mut scrape).ends_with("slow\n"));
    }

    #[test]
    fn stop_closes_the_listener_and_its_connections_and_frees_the_port() {
        let (addr, stop) = serve(Limits::default());
        let mut c = connect(addr);
        c.write_all(b"GET /x HTTP/1.1\r\nHost: n\r\n\r\n")
            .expect("write");
        assert!(response(&mut c).starts_with("HTTP/1.1 200"));
        stop.cancel();
        std::thread::sleep(Duration::from_millis(50));
        assert!(TcpStream::connect(addr).is_err(), "still listening");
        assert!(closed_within(&mut c, Duration::from_millis(200)));
        // The port is free at once: a new server on it answers.
        let again = spawn_until(addr, handler, CancellationToken::new())
            .expect("bind again right after the stop");
        let mut d = connect(again);
        d.write_all(b"GET /x HTTP/1.1\r\nHost: n\r\n\r\n")
            .expect("write");
        assert!(response(&mut d).starts_with("HTTP/1.1 200"));
    }
}
