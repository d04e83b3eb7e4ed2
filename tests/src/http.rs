//! The HTTP requests tests make of the agent's endpoints (what a cloud load balancer's probe
//! or a scraper sends): a GET with `Connection: close`, the whole response as text.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

/// One GET of `/` at `to`; the whole response (status line, headers, body) as text.
pub fn get(to: SocketAddr, timeout: Duration) -> Result<String, String> {
    get_path(to, "/", timeout)
}

/// One GET of `path` at `to`; the whole response as text.
pub fn get_path(to: SocketAddr, path: &str, timeout: Duration) -> Result<String, String> {
    let mut s =
        TcpStream::connect_timeout(&to, timeout).map_err(|e| format!("connect {to}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

/// The body of a whole response, when its status is 200.
pub fn ok_body(response: &str) -> Result<&str, String> {
    match response.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200 ") => Ok(body),
        _ => Err(format!("not a 200: {:.300}", response)),
    }
}
