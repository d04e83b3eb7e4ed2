//! The HTTP side: hyper (HTTP/1.1, keep-alive, chunked watch streams) on the server's own
//! current-thread tokio runtime; routing of list and watch requests, injected faults, held
//! lists, and the listener going down and up.

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Instant};

use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Frame, Incoming},
    header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::{
    net::{TcpListener, TcpSocket, TcpStream},
    sync::{mpsc, watch as signal},
};

use super::{EVENT_KIND, KINDS, Kind, Mode, Served, Shared, events, list, status::Status, watch};

type Body = BoxBody<Bytes, Infallible>;

/// Events a watch may have queued before it waits for its client to read.
const WATCH_QUEUE: usize = 256;

/// A socket bound to `addr` that does not listen: the address is taken, and a connection to
/// it is refused.
pub(super) fn park(addr: SocketAddr) -> std::io::Result<TcpSocket> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket)
}

/// Serves on `addr` while the mode is `Up`, refuses connections while it is `Down`, returns
/// at `Stop`. `parked` holds the address while down.
pub(super) async fn serve(shared: Arc<Shared>, mut parked: Option<TcpSocket>, addr: SocketAddr) {
    let mut mode = shared.mode.subscribe();
    loop {
        let now = *mode.borrow_and_update();
        match now {
            Mode::Stop => return,
            Mode::Down => {
                if parked.is_none() {
                    parked = park(addr).ok();
                }
                if mode.changed().await.is_err() {
                    return;
                }
            }
            Mode::Up => {
                let socket = match parked.take() {
                    Some(s) => Ok(s),
                    None => park(addr),
                };
                match socket.and_then(|s| s.listen(1024)) {
                    Ok(listener) => {
                        shared.update(|i| i.listening = Ok(true));
                        accept(&shared, &listener, &mut mode).await;
                        drop(listener);
                        shared.update(|i| i.listening = Ok(false));
                    }
                    Err(e) => {
                        shared.update(|i| i.listening = Err(format!("listen on {addr}: {e}")));
                        if mode.changed().await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// Accepts connections until the mode leaves `Up`.
async fn accept(shared: &Arc<Shared>, listener: &TcpListener, mode: &mut signal::Receiver<Mode>) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    shared.lock().connections += 1;
                    tokio::spawn(connection(shared.clone(), stream));
                }
                // Out of file descriptors and the like: let it pass, do not spin.
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            },
            changed = mode.changed() => {
                if changed.is_err() || *mode.borrow() != Mode::Up {
                    return;
                }
            }
        }
    }
}

/// One connection, closed when the server goes down.
async fn connection(shared: Arc<Shared>, stream: TcpStream) {
    let mut mode = shared.mode.subscribe();
    let s = shared.clone();
    let service = service_fn(move |req| handle(s.clone(), req));
    let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        _ = conn => {}
        _ = mode.wait_for(|m| *m != Mode::Up) => {}
    }
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let arrived = Instant::now();
    let target = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let query: list::Query = form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .into_owned()
        .collect();
    let in_flight = InFlight::enter(&shared, &target);
    let method = req.method().to_string();
    let (response, list_rv) = match events::parse_path(req.uri().path()) {
        Some(_) => (event_request(&shared, req).await, None),
        None => route(&shared, req.method(), req.uri().path(), &query).await,
    };
    drop(in_flight);
    shared.record(Served {
        method,
        target,
        status: response.status().as_u16(),
        at: arrived,
        list_rv,
    });
    Ok(response)
}

/// A request being answered (its response head not yet sent), for diagnosis.
struct InFlight<'s>(&'s Shared, u64);

impl<'s> InFlight<'s> {
    fn enter(shared: &'s Shared, target: &str) -> Self {
        let mut inner = shared.lock();
        inner.next_id += 1;
        let id = inner.next_id;
        inner.in_flight.insert(id, target.to_string());
        InFlight(shared, id)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.lock().in_flight.remove(&self.1);
    }
}

/// A create (POST) or merge patch (PATCH) of an Event (see `events.rs`).
async fn event_request(shared: &Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let Some((ns, name)) = events::parse_path(&path) else {
        return status(&Status::not_found(&path));
    };
    let method = req.method().clone();
    let fault = shared.lock().faults.get(EVENT_KIND.kind).cloned();
    if let Some(fault) = fault {
        let verb = if method == Method::POST {
            "create"
        } else {
            "patch"
        };
        return status(&fault.status(&EVENT_KIND, verb));
    }
    let content_type = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .unwrap_or("")
        .trim()
        .to_string();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return status(&Status::bad_request(format!("reading the body: {e}"))),
    };
    let result = shared.update(|i| match (&method, name) {
        (&Method::POST, None) => {
            events::create(&mut i.store, ns, &body).map(|v| (StatusCode::CREATED, v))
        }
        (&Method::PATCH, Some(n)) => {
            events::patch(&mut i.store, ns, n, &content_type, &body).map(|v| (StatusCode::OK, v))
        }
        _ => Err(Status::method_not_allowed(method.as_str())),
    });
    match result {
        Ok((code, v)) => json(code, &v),
        Err(s) => status(&s),
    }
}

/// The response, and the resourceVersion of a list page.
async fn route(
    shared: &Arc<Shared>,
    method: &Method,
    path: &str,
    q: &list::Query,
) -> (Response<Body>, Option<u64>) {
    let Some(kind) = KINDS.iter().find(|k| k.path == path) else {
        return (status(&Status::not_found(path)), None);
    };
    if method != Method::GET {
        return (status(&Status::method_not_allowed(method.as_str())), None);
    }
    let watching = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    let fault = shared.lock().faults.get(kind.kind).cloned();
    if let Some(fault) = fault {
        let verb = if watching { "watch" } else { "list" };
        return (status(&fault.status(kind, verb)), None);
    }
    if watching {
        (watch_stream(shared, kind, q), None)
    } else {
        list_page(shared, kind, q).await
    }
}

async fn list_page(
    shared: &Arc<Shared>,
    kind: &'static Kind,
    q: &list::Query,
) -> (Response<Body>, Option<u64>) {
    let continued = q.get("continue").is_some_and(|c| !c.is_empty());
    wait_gate(shared, kind.kind, continued).await;
    let page = list::page(&shared.lock().store, kind, q);
    match page {
        Ok(v) => {
            let rv = v["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|r| r.parse().ok());
            (json(StatusCode::OK, &v), rv)
        }
        Err(s) => (status(&s), None),
    }
}

/// Counts a list request while a gate holds it.
struct Held<'s>(&'s Shared, &'static str);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.update(|i| {
            if let Some(n) = i.waiting.get_mut(self.1) {
                *n = n.saturating_sub(1);
            }
        });
    }
}

/// Waits while a gate holds `kind`'s lists (or its continued pages).
async fn wait_gate(shared: &Shared, kind: &'static str, continued: bool) {
    let mut changes = shared.changed.subscribe();
    if !shared.lock().held(kind, continued) {
        return;
    }
    shared.update(|i| *i.waiting.entry(kind.to_string()).or_default() += 1);
    let _held = Held(shared, kind);
    while shared.lock().held(kind, continued) {
        if changes.changed().await.is_err() {
            return;
        }
    }
}

fn watch_stream(shared: &Arc<Shared>, kind: &'static Kind, q: &list::Query) -> Response<Body> {
    let w = match watch::parse(q) {
        Ok(w) => w,
        Err(s) => return status(&s),
    };
    let (tx, rx) = mpsc::channel(WATCH_QUEUE);
    tokio::spawn(watch::run(shared.clone(), kind, w, tx));
    let frames = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|line| (Ok::<_, Infallible>(Frame::data(line)), rx))
    });
    let mut r = Response::new(StreamBody::new(frames).boxed());
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn json(code: StatusCode, v: &Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())).boxed());
    *r.status_mut() = code;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn status(s: &Status) -> Response<Body> {
    let code = StatusCode::from_u16(s.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = json(code, &s.body());
    if let Some(secs) = s.retry_after {
        r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    r
}
