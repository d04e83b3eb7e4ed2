//! The agent's HTTP endpoints: health (kube-proxy's `/healthz` and `/livez` semantics) and
//! Prometheus metrics. A tiny HTTP/1.1 server on std threads: one request per connection.

pub mod health;
pub mod metrics;

use std::{
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::Arc,
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

/// An HTTP response: status line text, content type, body.
pub struct Response {
    pub status: &'static str,
    pub content_type: &'static str,
    pub body: String,
}

impl Response {
    pub fn text(status: &'static str, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
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
    let handler: Arc<dyn Fn(&str) -> Response + Send + Sync> = Arc::new(move |path: &str| {
        handler(path).unwrap_or_else(|| Response::text("404 Not Found", "not found\n"))
    });
    let listener = TcpListener::bind(addr).map_err(|source| ServeError { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| ServeError { addr, source })?;
    thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let handler = handler.clone();
            thread::spawn(move || {
                if let Err(e) = answer(conn, handler.as_ref()) {
                    warn!("http: {e}");
                }
            });
        }
    });
    Ok(bound)
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
    write!(
        conn,
        "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
        r.status,
        r.content_type,
        r.body.len(),
        r.body
    )?;
    conn.flush()
}
