//! kube-proxy's first mode, for comparison (not production): iptables steers each service
//! port's traffic to a proxy port on the node (see `emit::userspace`), and this process
//! accepts it there and splices it to a backend, round-robin, trying the next backend when a
//! connect fails. UDP gets one session per client address, idle-timed. With sessionAffinity
//! ClientIP a client IP keeps the backend it last used until the affinity timeout passes
//! without a new connection (or the backend goes away), as kube-proxy's userspace
//! load balancer did.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
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

/// Backends of one proxy port, the round-robin cursor and, with ClientIP affinity, each
/// client IP's backend and when it last connected.
#[derive(Default)]
struct Pool {
    backends: Mutex<Vec<SocketAddr>>,
    next: AtomicUsize,
    /// The affinity timeout; `None` without sessionAffinity ClientIP.
    affinity: Mutex<Option<Duration>>,
    sticky: Mutex<BTreeMap<IpAddr, (SocketAddr, Instant)>>,
}

impl Pool {
    fn new(backends: Vec<SocketAddr>, affinity: Option<Duration>) -> Self {
        Pool {
            backends: Mutex::new(backends),
            affinity: Mutex::new(affinity),
            ..Pool::default()
        }
    }

    /// Replaces the backends and the affinity timeout (a resync).
    fn update(&self, backends: Vec<SocketAddr>, affinity: Option<Duration>) {
        if let Ok(mut b) = self.backends.lock() {
            *b = backends;
        }
        if let Ok(mut a) = self.affinity.lock() {
            *a = affinity;
        }
    }

    /// The backends in the order a connection from `client` at `now` should try them: its
    /// sticky backend first while affinity holds, else round-robin.
    fn order(&self, client: IpAddr, now: Instant) -> Vec<SocketAddr> {
        let list = self.backends.lock().map(|b| b.clone()).unwrap_or_default();
        if list.is_empty() {
            return list;
        }
        if let Some(b) = self.sticky_backend(client, now, &list) {
            let mut out = vec![b];
            out.extend(list.iter().filter(|x| **x != b));
            return out;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed) % list.len();
        list.iter()
            .cycle()
            .skip(start)
            .take(list.len())
            .copied()
            .collect()
    }

    /// `client`'s backend when affinity is on, it connected within the timeout and the
    /// backend is still in `list`.
    fn sticky_backend(
        &self,
        client: IpAddr,
        now: Instant,
        list: &[SocketAddr],
    ) -> Option<SocketAddr> {
        let timeout = (*self.affinity.lock().ok()?)?;
        let sticky = self.sticky.lock().ok()?;
        let (b, last) = sticky.get(&client)?;
        (now.saturating_duration_since(*last) < timeout && list.contains(b)).then_some(*b)
    }

    /// Records that `client` connected to `backend` at `now` (with affinity on).
    fn used(&self, client: IpAddr, backend: SocketAddr, now: Instant) {
        let Some(timeout) = self.affinity.lock().ok().and_then(|a| *a) else {
            return;
        };
        if let Ok(mut sticky) = self.sticky.lock() {
            sticky.retain(|_, (_, last)| now.saturating_duration_since(*last) < timeout);
            sticky.insert(client, (backend, now));
        }
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
        let affinity = p
            .affinity_timeout
            .map(|s| Duration::from_secs(u64::from(s)));
        if let Some(l) = listeners.get(&key) {
            l.pool.update(backends, affinity);
            continue;
        }
        let pool = Arc::new(Pool::new(backends, affinity));
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
        let Ok((mut client, peer)) = listener.accept().await else {
            continue;
        };
        let pool = pool.clone();
        tokio::spawn(async move {
            let now = Instant::now();
            for backend in pool.order(peer.ip(), now) {
                match timeout(CONNECT_TIMEOUT, TcpStream::connect(backend)).await {
                    Ok(Ok(mut upstream)) => {
                        pool.used(peer.ip(), backend, now);
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
                let now = Instant::now();
                let Some(backend) = pool.order(client.ip(), now).into_iter().next() else {
                    continue;
                };
                pool.used(client.ip(), backend, now);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(n: u8) -> Vec<SocketAddr> {
        (2..2 + n)
            .map(|k| SocketAddr::from(([10, 244, k, 2], 8080)))
            .collect()
    }

    /// The backend a connection from `client` at `now` goes to, recorded as used.
    fn connect(pool: &Pool, client: IpAddr, now: Instant) -> SocketAddr {
        let b = pool.order(client, now)[0];
        pool.used(client, b, now);
        b
    }

    #[test]
    fn without_affinity_connections_go_round_robin() {
        let pool = Pool::new(addrs(3), None);
        let c = IpAddr::from([10, 255, 255, 1]);
        let t = Instant::now();
        let got: Vec<SocketAddr> = (0..3).map(|_| connect(&pool, c, t)).collect();
        assert_eq!(got, addrs(3));
    }

    #[test]
    fn a_client_ip_keeps_its_backend_until_the_affinity_timeout_passes_idle() {
        let pool = Pool::new(addrs(3), Some(Duration::from_secs(10)));
        let (a, b) = (
            IpAddr::from([10, 255, 255, 1]),
            IpAddr::from([10, 255, 255, 2]),
        );
        let t0 = Instant::now();
        let first = connect(&pool, a, t0);
        // Every new connection within the timeout renews it: 9 s apart, 5 times.
        for k in 1..=5 {
            assert_eq!(connect(&pool, a, t0 + Duration::from_secs(9 * k)), first);
        }
        // Another client is not bound by a's choice (round-robin moved on).
        assert_ne!(connect(&pool, b, t0), first);
        // Idle past the timeout: the next connection is round-robin again.
        let late = t0 + Duration::from_secs(45 + 10);
        assert_ne!(connect(&pool, a, late), first);
    }

    #[test]
    fn a_sticky_backend_that_went_away_is_replaced_and_tried_first_otherwise() {
        let pool = Pool::new(addrs(3), Some(Duration::from_secs(10)));
        let a = IpAddr::from([10, 255, 255, 1]);
        let t = Instant::now();
        let first = connect(&pool, a, t);
        let order = pool.order(a, t);
        assert_eq!(order[0], first);
        assert_eq!(order.len(), 3, "the others stay as fallbacks");
        let rest: Vec<SocketAddr> = addrs(3).into_iter().filter(|b| *b != first).collect();
        pool.update(rest.clone(), Some(Duration::from_secs(10)));
        assert!(rest.contains(&connect(&pool, a, t)));
    }
}
