//! HTTP/1.1 with hyper on small tokio runtimes, one per [`Pool`] (a single thread each,
//! shared by the pool's listeners): per listener an accept loop, per connection a task; no
//! thread per connection, a bounded request head, timeouts on reading heads, idle and busy
//! connections.

use std::{
    convert::Infallible,
    io,
    net::SocketAddr,
    panic::AssertUnwindSafe,
    pin::{Pin, pin},
    sync::{Arc, Mutex},
    task::{Context, Poll},
    thread,
    time::Duration,
};

use http_body_util::Full;
use hyper::{
    StatusCode,
    body::{Body, Bytes, Frame, Incoming, SizeHint},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    net::{TcpListener, TcpSocket},
    runtime::Handle,
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::{
    Limits, Pool, Response,
    conns::{Admission, Conns, Phase, Slot},
};

/// A handler that answers every path (unknown ones with a 404).
pub(super) type Handler = Arc<dyn Fn(&str) -> Response + Send + Sync>;

/// The smallest read buffer hyper takes (it panics below).
const MIN_BUF: usize = 8192;

/// Connections the kernel queues for an accept loop (as tokio's and Go's listeners; the
/// kernel caps it at net.core.somaxconn).
const BACKLOG: u32 = 1024;

/// The runtime of `pool`, started on first use: a thread of its own, so that what one pool
/// serves (a scrape) never waits for, or delays, another's (a health probe).
fn runtime(pool: Pool) -> io::Result<Handle> {
    static HANDLES: Mutex<[Option<Handle>; 2]> = Mutex::new([None, None]);
    let mut handles = HANDLES.lock().unwrap_or_else(|p| p.into_inner());
    let (slot, name) = match pool {
        Pool::Health => (0, "xlb-http-health"),
        Pool::Metrics => (1, "xlb-http-metrics"),
    };
    if let Some(h) = handles[slot].as_ref() {
        return Ok(h.clone());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    let h = rt.handle().clone();
    thread::Builder::new()
        .name(name.into())
        .spawn(move || rt.block_on(std::future::pending::<()>()))?;
    handles[slot] = Some(h.clone());
    Ok(h)
}

/// Serves `handler` on `addr` until `stop` is cancelled (for ever without one); the address
/// bound. Nothing wakes while no one connects: the accept loop waits on the listener and
/// the token together, so an idle server costs no timer.
pub(super) fn start(
    addr: SocketAddr,
    pool: Pool,
    handler: Handler,
    stop: Option<CancellationToken>,
    limits: Limits,
) -> io::Result<SocketAddr> {
    let rt = runtime(pool)?;
    let listener = {
        let _in_runtime = rt.enter();
        listen(addr)?
    };
    let bound = listener.local_addr()?;
    rt.spawn(accept_loop(listener, handler, stop, Arc::new(limits)));
    Ok(bound)
}

/// A listener on `addr` (in the runtime's context) with room for a burst of connections:
/// std's backlog of 128 overflows under a flood, and a probe's dropped SYN waits a second.
fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

async fn accept_loop(
    listener: TcpListener,
    handler: Handler,
    stop: Option<CancellationToken>,
    limits: Arc<Limits>,
) {
    let conns = Arc::new(Conns::new(limits.max_connections));
    let stop = stop.unwrap_or_default();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => admit(stream, peer, &conns, &handler, &limits),
                Err(e) => {
                    // Out of file descriptors and the like: let it pass, do not spin.
                    debug!("http accept: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
        }
    }
    drop(listener);
    conns.close_all();
}

fn admit(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    conns: &Arc<Conns>,
    handler: &Handler,
    limits: &Arc<Limits>,
) {
    let (id, slot) = match conns.admit() {
        Admission::Admitted(id, slot) => (id, slot),
        Admission::Evicted(id, slot) => {
            debug!(%peer, "http: at the connection cap, closed the longest idle connection");
            (id, slot)
        }
        Admission::Refused => {
            debug!(%peer, "http: every connection is busy, refused");
            return;
        }
    };
    let leave = Leave(conns.clone(), id);
    let (handler, limits) = (handler.clone(), limits.clone());
    tokio::spawn(async move {
        let _leave = leave;
        connection(stream, &slot, handler, &limits).await;
    });
}

/// Gives a connection's slot back when its task ends, however it ends.
struct Leave(Arc<Conns>, u64);

impl Drop for Leave {
    fn drop(&mut self) {
        self.0.leave(self.1);
    }
}

/// Serves one connection until it ends or its slot tells it to close.
async fn connection(
    stream: tokio::net::TcpStream,
    slot: &Arc<Slot>,
    handler: Handler,
    limits: &Limits,
) {
    let s = slot.clone();
    let service = service_fn(move |req: hyper::Request<Incoming>| {
        s.set(Phase::Busy);
        let r = answer(&handler, req.uri().path());
        let busy = Busy(s.clone());
        std::future::ready(Ok::<_, Infallible>(to_http(r, busy)))
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .max_buf_size(limits.max_head.max(MIN_BUF))
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true)
        .title_case_headers(true)
        .serve_connection(TokioIo::new(stream), service);
    let conn = pin!(conn);
    tokio::select! {
        done = conn => if let Err(e) = done {
            debug!("http connection: {e}");
        },
        () = slot.closed(limits.idle_timeout, limits.response_timeout) => {}
    }
}

/// `handler`'s answer to `path`; a 500 when it panics, so that one bad request never costs
/// its connection, its slot or the server's thread.
fn answer(handler: &Handler, path: &str) -> Response {
    std::panic::catch_unwind(AssertUnwindSafe(|| handler(path))).unwrap_or_else(|_| {
        warn!(path, "http: the handler panicked; answered 500");
        super::text(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n")
    })
}

/// Marks its connection idle again when the response body is dropped (written, or the
/// connection gone).
struct Busy(Arc<Slot>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.set(Phase::Idle);
    }
}

/// A response body that keeps its connection busy while it lives.
struct Tracked {
    body: Full<Bytes>,
    _busy: Busy,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// `r` with its body counted as the connection's (Content-Length comes from the body).
fn to_http(r: Response, busy: Busy) -> hyper::Response<Tracked> {
    r.map(|body| Tracked {
        body: Full::new(Bytes::from(body)),
        _busy: busy,
    })
}
