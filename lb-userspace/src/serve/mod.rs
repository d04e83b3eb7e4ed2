//! The agent's HTTP endpoints: health (kube-proxy's `/healthz` and `/livez` semantics) and
//! Prometheus metrics. A tiny HTTP/1.1 server on std threads: one request per connection.

pub mod health;
pub mod metrics;
pub mod service_health;

use std::{
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::Duration,
};

use thiserror::Error;
use tracing::warn;

#[derive(Debug, Error)]
#[error("cannot listen on {addr}: {source}")]
pub struct ServeError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// An HTTP response: status line text, content type, extra headers, body.
pub struct Response {
    pub status: &'static str,
    pub content_type: &'static str,
    /// Extra header lines, each without the line end.
    pub headers: Vec<String>,
    pub body: String,
}

impl Response {
    pub fn text(status: &'static str, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            headers: Vec::new(),
            body: body.into(),
        }
    }
}

/// Serves `handler(path)` on `addr` from a background thread for the life of the process;
/// a path the handler does not know is a 404.
pub fn spawn(
    addr: SocketAddr,
    handler: impl Fn(&str) -> Option<Response> + Send + Sync + 'static,
) -> Result<SocketAddr, ServeError> {
    spawn_until(addr, handler, Arc::new(AtomicBool::new(false)))
}

/// [`spawn`] until `stop` is set (the listener closes within 50 ms).
pub fn spawn_until(
    addr: SocketAddr,
    handler: impl Fn(&str) -> Option<Response> + Send + Sync + 'static,
    stop: Arc<AtomicBool>,
) -> Result<SocketAddr, ServeError> {
    let handler: Arc<dyn Fn(&str) -> Response + Send + Sync> = Arc::new(move |path: &str| {
        handler(path).unwrap_or_else(|| Response::text("404 Not Found", "not found\n"))
    });
    let listener = TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|source| ServeError { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| ServeError { addr, source })?;
    thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((conn, _)) => {
                    let handler = handler.clone();
                    thread::spawn(move || {
                        if let Err(e) = conn
                            .set_nonblocking(false)
                            .and_then(|()| answer(conn, handler.as_ref()))
                        {
                            warn!("http: {e}");
                        }
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    wait_readable(&listener, 50)
                }
                Err(_) => thread::sleep(Duration::from_millis(10)),
            }
        }
    });
    Ok(bound)
}

/// Blocks until `listener` has a connection to accept or `ms` milliseconds pass.
fn wait_readable(listener: &TcpListener, ms: i32) {
    use std::os::fd::AsRawFd;
    let mut fds = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut fds, 1, ms) };
}

fn answer(
    conn: TcpStream,
    handler: &(dyn Fn(&str) -> Response + Send + Sync),
) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    let mut line = String::new();
    while reader.read_line(&mut line)? > 2 {
        line.clear();
    }
    let path = request.split_whitespace().nth(1).unwrap_or("/");
    let path = path.split('?').next().unwrap_or("/");
    let r = handler(path);
    let mut conn = conn;
    let extra: String = r.headers.iter().map(|h| format!("{h}\r\n")).collect();
    write!(
        conn,
        "HTTP/1.1 {}\r\nContent-Type: {}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{}",
        r.status,
        r.content_type,
        r.body.len(),
        r.body
    )?;
    conn.flush()
}
