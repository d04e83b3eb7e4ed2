//! The one HTTP request tests make of the agent's health-check node ports (what a cloud load
//! balancer's probe sends): a GET with `Connection: close`, the whole response as text.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

/// One GET of `/` at `to`; the whole response (status line, headers, body) as text.
pub fn get(to: SocketAddr, timeout: Duration) -> Result<String, String> {
    let mut s =
        TcpStream::connect_timeout(&to, timeout).map_err(|e| format!("connect {to}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    Ok(out)
}
