//! kube-proxy's first mode, for comparison (not production): iptables steers each service
//! port's traffic to a proxy port on the node (see `emit::userspace`), and this process
//! accepts it there and splices it to a backend, round-robin, trying the next backend when a
//! connect fails. UDP gets one session per client address, idle-timed.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use thiserror::Error;
use tokio::{
    net::{TcpListener, TcpStream, UdpSocket},
    task::JoinHandle,
    time::timeout,
};
use tracing::{info, warn};

use crate::{
    emit::userspace::{self as rules, PortRange},
    model::{NodeSettings, Protocol},
    source::file::{self, FileWatch},
};

/// How long a connect to one backend may take before the next is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// A UDP session without traffic for this long is closed.
const UDP_IDLE: Duration = Duration::from_secs(10);

#[derive(Debug, Error)]
pub enum ProxyError {
    #[error("cannot start the proxy's runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

/// Backends of one proxy port and the round-robin cursor.
#[derive(Default)]
struct Pool {
    backends: Mutex<Vec<SocketAddr>>,
    next: AtomicUsize,
}

impl Pool {
    /// The backends in the order this connection should try them.
    fn order(&self) -> Vec<SocketAddr> {
        let list = self.backends.lock().map(|b| b.clone()).unwrap_or_default();
        if list.is_empty() {
            return list;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed) % list.len();
        list.iter()
            .cycle()
            .skip(start)
            .take(list.len())
            .copied()
            .collect()
    }
}

struct Listener {
    pool: Arc<Pool>,
    task: JoinHandle<()>,
}

/// Runs the proxy for the services in `source` until `stop` is set, re-reading the file when
/// it changes.
pub fn run(
    source: PathBuf,
    node: NodeSettings,
    range: PortRange,
    stop: &AtomicBool,
) -> Result<(), ProxyError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let mut watch = FileWatch::new(source);
        let mut listeners: BTreeMap<(u16, Protocol), Listener> = BTreeMap::new();
        while !stop.load(Ordering::Relaxed) {
            if watch.changed() {
                match file::load(watch.path()) {
                    Ok(loaded) => {
                        // A conformance file's TestConfig header names the node, as for `xlb emit`.
                        let node = loaded
                            .test_config
                            .map_or_else(|| node.clone(), |t| t.settings);
                        let state = rules::emit(&loaded.model, &node, range);
                        reconcile(&mut listeners, &state.ports).await;
                    }
                    Err(e) => warn!("{e}; keeping the current proxy ports"),
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        for (_, l) in listeners {
            l.task.abort();
        }
    });
    Ok(())
}

async fn reconcile(
    listeners: &mut BTreeMap<(u16, Protocol), Listener>,
    ports: &[rules::ProxyPort],
) {
    let wanted: BTreeMap<(u16, Protocol), &rules::ProxyPort> = ports
        .iter()
        .map(|p| ((p.proxy_port, p.protocol), p))
        .collect();
    listeners.retain(|k, l| {
        let keep = wanted.contains_key(k);
        if !keep {
            l.task.abort();
        }
        keep
    });
    for (key, p) in wanted {
        let backends: Vec<SocketAddr> = p.backends.iter().filter_map(|b| b.parse().ok()).collect();
        if let Some(l) = listeners.get(&key) {
            if let Ok(mut b) = l.pool.backends.lock() {
                *b = backends;
            }
            continue;
        }
        let pool = Arc::new(Pool {
            backends: Mutex::new(backends),
            next: AtomicUsize::new(0),
        });
        let addr = SocketAddr::from(([0, 0, 0, 0], p.proxy_port));
        let task = match p.protocol {
            Protocol::Udp => match UdpSocket::bind(addr).await {
                Ok(sock) => tokio::spawn(serve_udp(Arc::new(sock), pool.clone())),
                Err(e) => {
                    warn!(service = %p.service_port, %addr, "cannot listen: {e}");
                    continue;
                }
            },
            _ => match TcpListener::bind(addr).await {
                Ok(l) => tokio::spawn(serve_tcp(l, pool.clone())),
                Err(e) => {
                    warn!(service = %p.service_port, %addr, "cannot listen: {e}");
                    continue;
                }
            },
        };
        info!(service = %p.service_port, proto = %p.protocol, proxy_port = p.proxy_port, "proxying");
        listeners.insert(key, Listener { pool, task });
    }
}

async fn serve_tcp(listener: TcpListener, pool: Arc<Pool>) {
    loop {
        let Ok((mut client, _)) = listener.accept().await else {
            continue;
        };
        let pool = pool.clone();
        tokio::spawn(async move {
            for backend in pool.order() {
                match timeout(CONNECT_TIMEOUT, TcpStream::connect(backend)).await {
                    Ok(Ok(mut upstream)) => {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                        return;
                    }
                    _ => warn!(%backend, "connect failed; trying the next backend"),
                }
            }
        });
    }
}

async fn serve_udp(sock: Arc<UdpSocket>, pool: Arc<Pool>) {
    let sessions: Arc<Mutex<BTreeMap<SocketAddr, Arc<UdpSocket>>>> = Arc::default();
    let mut buf = vec![0u8; 65536];
    loop {
        let Ok((n, client)) = sock.recv_from(&mut buf).await else {
            continue;
        };
        let existing = sessions.lock().ok().and_then(|s| s.get(&client).cloned());
        let upstream = match existing {
            Some(u) => u,
            None => {
                let Some(backend) = pool.order().into_iter().next() else {
                    continue;
                };
                let Ok(u) = UdpSocket::bind("0.0.0.0:0").await else {
                    continue;
                };
                if u.connect(backend).await.is_err() {
                    continue;
                }
                let u = Arc::new(u);
                if let Ok(mut s) = sessions.lock() {
                    s.insert(client, u.clone());
                }
                tokio::spawn(relay_replies(
                    sock.clone(),
                    u.clone(),
                    client,
                    sessions.clone(),
                ));
                u
            }
        };
        let _ = upstream.send(&buf[..n]).await;
    }
}

/// Backend → client for one UDP session, until it idles out.
async fn relay_replies(
    sock: Arc<UdpSocket>,
    upstream: Arc<UdpSocket>,
    client: SocketAddr,
    sessions: Arc<Mutex<BTreeMap<SocketAddr, Arc<UdpSocket>>>>,
) {
    let mut buf = vec![0u8; 65536];
    while let Ok(Ok(n)) = timeout(UDP_IDLE, upstream.recv(&mut buf)).await {
        let _ = sock.send_to(&buf[..n], client).await;
    }
    if let Ok(mut s) = sessions.lock() {
        s.remove(&client);
    }
}
