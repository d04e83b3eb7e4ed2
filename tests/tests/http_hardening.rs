//! The agent's HTTP endpoints under the attacks a pod can mount against a node's `:10256`: one
//! endless request line, thousands of idle connections, heads dripping in a byte at a time.
//! The real agent runs in its own network namespace with `/healthz` on that namespace's
//! loopback; the attacker and a prober run in the same namespace. While and after each attack
//! the agent's VmRSS and Threads (from `/proc/PID/status`) must stay within baseline + 10 MB
//! and baseline + 2, and `/healthz` must keep answering on fresh connections: every probe a
//! full 200, the median under 10 ms.

use std::{
    io::{ErrorKind, Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use xlb_tests::{
    agent::Agent,
    netns::Netns,
    require_root,
    services::{service_yaml, write_atomic},
    unique_tag,
};

/// `/healthz` inside the agent's namespace.
const HEALTHZ: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 10256);
const RSS_SLACK_KB: u64 = 10 * 1024;
const THREAD_SLACK: u64 = 2;
const P50_LIMIT: Duration = Duration::from_millis(10);
const IDLE_CONNECTIONS: usize = 3000;
const DRIP_CONNECTIONS: usize = 8;

/// The agent in its namespace. Field order is drop order: the agent (and its pins) first.
struct Lab {
    agent: Agent,
    ns: Netns,
    workdir: PathBuf,
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.workdir);
    }
}

impl Lab {
    fn start(tag: &str) -> Result<Self, String> {
        let ns = Netns::new(tag)?;
        let workdir = std::env::temp_dir().join(tag);
        std::fs::create_dir_all(&workdir).map_err(|e| e.to_string())?;
        let yaml = workdir.join("services.yaml");
        let web = service_yaml(
            "web",
            Ipv4Addr::new(10, 96, 0, 10),
            80,
            "TCP",
            8080,
            &[Ipv4Addr::new(10, 0, 0, 2)],
        );
        write_atomic(&yaml, &web)?;
        let args = [
            "--source".to_string(),
            format!("file:{}", yaml.display()),
            "--healthz-bind-address".into(),
            HEALTHZ.to_string(),
            "--metrics-bind-address".into(),
            "127.0.0.1:10249".into(),
        ];
        let pins = PathBuf::from(format!("/sys/fs/bpf/{tag}"));
        let agent =
            Agent::start_with(&ns, &args, pins, workdir.join("agent.log")).inspect_err(|_| {
                let _ = std::fs::remove_dir_all(&workdir);
            })?;
        Ok(Lab { agent, ns, workdir })
    }

    fn pid(&self) -> u32 {
        self.agent.pid().expect("agent running")
    }

    /// Waits for the Service to be programmed and `/healthz` to answer 200.
    fn wait_ready(&mut self) {
        self.agent
            .wait_for(Duration::from_secs(10), |rows| !rows.is_empty())
            .expect("agent synced");
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.ns.run(|| probe(HEALTHZ)).expect("thread").is_err() {
            assert!(
                Instant::now() < deadline,
                "/healthz never answered 200:\n{}",
                self.agent.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // nsenter execs the agent: the child's pid is the agent's.
        let exe = std::fs::read_link(format!("/proc/{}/exe", self.pid())).ok();
        assert_eq!(exe, std::fs::canonicalize(xlb_tests::xlb_bin()).ok());
    }
}

/// VmRSS (KiB) and Threads of a process.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    rss_kb: u64,
    threads: u64,
}

fn usage(pid: u32) -> Usage {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("agent status");
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} not in /proc/{pid}/status"))
    };
    Usage {
        rss_kb: field("VmRSS:"),
        threads: field("Threads:"),
    }
}

/// One `/healthz` on a fresh connection, read to its end: how long it took.
fn probe(addr: SocketAddr) -> Result<Duration, String> {
    let started = Instant::now();
    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("connect: {e}"))?;
    c.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut text = String::new();
    c.read_to_string(&mut text)
        .map_err(|e| format!("read: {e}"))?;
    let took = started.elapsed();
    complete_200(&text).map(|()| took)
}

/// A 200 whose body has exactly its Content-Length.
fn complete_200(text: &str) -> Result<(), String> {
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no end of head: {text:?}"))?;
    if !head.starts_with("HTTP/1.1 200 OK\r\n") || !head.contains("Content-Type: application/json")
    {
        return Err(format!("not a 200: {text:?}"));
    }
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|v| v.parse::<usize>().ok());
    if len != Some(body.len()) || !body.contains("\"healthy\": true") {
        return Err(format!("incomplete body: {text:?}"));
    }
    Ok(())
}

/// What one attack did to the agent.
#[derive(Debug)]
struct Report {
    name: &'static str,
    /// What the attacker saw.
    attack: Result<String, String>,
    peak: Usage,
    after: Usage,
    probes: Vec<Result<Duration, String>>,
}

impl Report {
    fn latencies(&self) -> Vec<Duration> {
        let mut l: Vec<Duration> = self.probes.iter().filter_map(|p| p.clone().ok()).collect();
        l.sort();
        l
    }

    fn print(&self, base: Usage) {
        let l = self.latencies();
        let at = |q: usize| l.get(l.len() * q / 100).copied().unwrap_or_default();
        eprintln!(
            "{}: {:?}\n  RSS baseline {} KiB, peak {} KiB (+{}), after {} KiB; threads baseline {}, peak {}, after {}\n  /healthz: {} probes, {} ok, p50 {:?}, p90 {:?}, max {:?}",
            self.name,
            self.attack,
            base.rss_kb,
            self.peak.rss_kb,
            self.peak.rss_kb.saturating_sub(base.rss_kb),
            self.after.rss_kb,
            base.threads,
            self.peak.threads,
            self.after.threads,
            self.probes.len(),
            l.len(),
            at(50),
            at(90),
            l.last().copied().unwrap_or_default(),
        );
    }

    fn check(&self, base: Usage) {
        let attack = self.attack.as_ref();
        assert!(attack.is_ok(), "{}: {}", self.name, attack.unwrap_err());
        for (what, u) in [("peak", self.peak), ("after", self.after)] {
            assert!(
                u.rss_kb <= base.rss_kb + RSS_SLACK_KB,
                "{}: {what} RSS {} KiB > baseline {} KiB + 10 MB",
                self.name,
                u.rss_kb,
                base.rss_kb
            );
            assert!(
                u.threads <= base.threads + THREAD_SLACK,
                "{}: {what} {} threads, baseline {}",
                self.name,
                u.threads,
                base.threads
            );
        }
        let failed: Vec<&String> = self
            .probes
            .iter()
            .filter_map(|p| p.as_ref().err())
            .collect();
        assert!(
            failed.is_empty(),
            "{}: {} of {} /healthz probes failed, first: {:?}",
            self.name,
            failed.len(),
            self.probes.len(),
            failed.first()
        );
        let l = self.latencies();
        assert!(l.len() >= 5, "{}: only {} probes", self.name, l.len());
        let p50 = l[l.len() / 2];
        assert!(
            p50 < P50_LIMIT,
            "{}: /healthz p50 {p50:?} >= {P50_LIMIT:?}",
            self.name
        );
    }
}

/// Peak usage of `pid` until `stop`, sampled every 5 ms.
fn sample(pid: u32, stop: Arc<AtomicBool>) -> JoinHandle<Usage> {
    std::thread::spawn(move || {
        let mut peak = Usage::default();
        while !stop.load(Ordering::Relaxed) {
            let u = usage(pid);
            peak.rss_kb = peak.rss_kb.max(u.rss_kb);
            peak.threads = peak.threads.max(u.threads);
            std::thread::sleep(Duration::from_millis(5));
        }
        peak
    })
}

/// `/healthz` from `ns` every 50 ms until `stop`.
fn prober(
    ns: &Netns,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Result<Vec<Result<Duration, String>>, String>> {
    ns.spawn(move || {
        let mut out = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            out.push(probe(HEALTHZ));
            std::thread::sleep(Duration::from_millis(50));
        }
        out
    })
}

/// Runs `attack` in the lab's namespace while sampling the agent and probing `/healthz`,
/// then keeps both going for half a second after it.
fn under_attack(
    lab: &Lab,
    name: &'static str,
    attack: impl FnOnce() -> Result<String, String> + Send + 'static,
) -> Report {
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample(lab.pid(), stop.clone());
    let probes = prober(&lab.ns, stop.clone());
    let attack = lab.ns.run(attack).and_then(|r| r);
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let peak = sampler.join().expect("sampler");
    let probes = probes.join().expect("prober").expect("prober in netns");
    Report {
        name,
        attack,
        peak,
        after: usage(lab.pid()),
        probes,
    }
}

/// (1) One 400 MB request line without a newline, streamed; the server must close first.
fn endless_request_line() -> Result<String, String> {
    const TOTAL: usize = 400 << 20;
    let started = Instant::now();
    let mut c = TcpStream::connect_timeout(&HEALTHZ, Duration::from_secs(2))
        .map_err(|e| format!("connect: {e}"))?;
    c.set_write_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let chunk = vec![b'a'; 64 * 1024];
    let mut sent = 0usize;
    let mut closed = c.write_all(b"GET /").err();
    while closed.is_none() && sent < TOTAL && started.elapsed() < Duration::from_secs(20) {
        match c.write_all(&chunk) {
            Ok(()) => sent += chunk.len(),
            Err(e) => closed = Some(e),
        }
    }
    match closed {
        Some(e) if e.kind() != ErrorKind::WouldBlock && e.kind() != ErrorKind::TimedOut => {
            Ok(format!(
                "closed by the server after {sent} bytes, {:?}: {e}",
                started.elapsed()
            ))
        }
        other => Err(format!(
            "the server took {sent} bytes of one request line in {:?} without closing ({other:?})",
            started.elapsed()
        )),
    }
}

/// (2) 3,000 idle connections, held open for 3 s; then the server must have closed all of
/// them (idle timeout) within 10 s.
fn idle_connections() -> Result<String, String> {
    let started = Instant::now();
    let mut held = Vec::with_capacity(IDLE_CONNECTIONS);
    for i in 0..IDLE_CONNECTIONS {
        let c = TcpStream::connect_timeout(&HEALTHZ, Duration::from_secs(3))
            .and_then(|c| c.set_nonblocking(true).map(|()| c))
            .map_err(|e| format!("connection {i}: {e}"))?;
        held.push(c);
    }
    let opened = started.elapsed();
    std::thread::sleep(Duration::from_secs(3));
    let open_after_hold = still_open(&mut held);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !held.is_empty() && Instant::now() < deadline {
        still_open(&mut held);
        std::thread::sleep(Duration::from_millis(100));
    }
    if !held.is_empty() {
        return Err(format!(
            "{} of {IDLE_CONNECTIONS} idle connections still open after {:?}",
            held.len(),
            started.elapsed()
        ));
    }
    Ok(format!(
        "{IDLE_CONNECTIONS} opened in {opened:?}; {open_after_hold} still open after 3 s held; all closed by the server after {:?}",
        started.elapsed()
    ))
}

/// Drops the connections (non-blocking) the server has closed from `conns`; how many remain.
fn still_open(conns: &mut Vec<TcpStream>) -> usize {
    let mut buf = [0u8; 512];
    conns.retain_mut(|c| is_open(c.read(&mut buf)));
    conns.len()
}

/// What a non-blocking read says about the connection.
fn is_open(read: std::io::Result<usize>) -> bool {
    match read {
        Ok(0) => false,
        Ok(_) => true,
        Err(e) => e.kind() == ErrorKind::WouldBlock,
    }
}

/// (3) Request heads dripping in, one byte every 100 ms on each of several connections; the
/// server must close every one within 10 s (its header-read timeout).
fn dripping_heads() -> Result<String, String> {
    let started = Instant::now();
    let mut conns = Vec::new();
    for i in 0..DRIP_CONNECTIONS {
        let mut c = TcpStream::connect_timeout(&HEALTHZ, Duration::from_secs(2))
            .map_err(|e| format!("connection {i}: {e}"))?;
        c.write_all(b"GET /healthz HTTP/1.1\r\nX-Drip: ")
            .map_err(|e| e.to_string())?;
        c.set_nonblocking(true).map_err(|e| e.to_string())?;
        conns.push(c);
    }
    let mut bytes = 0usize;
    let mut buf = [0u8; 512];
    while !conns.is_empty() && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
        conns.retain_mut(|c| is_open(c.read(&mut buf)) && c.write(b"a").is_ok());
        bytes += conns.len();
    }
    if !conns.is_empty() {
        return Err(format!(
            "{} of {DRIP_CONNECTIONS} dripping connections still open after {:?}",
            conns.len(),
            started.elapsed()
        ));
    }
    Ok(format!(
        "{DRIP_CONNECTIONS} connections, {bytes} bytes dripped; all closed by the server after {:?}",
        started.elapsed()
    ))
}

/// Room for the attacker's sockets (the agent, started before, keeps its own limit).
fn raise_nofile(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit to fill.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    lim.rlim_max = lim.rlim_max.max(want);
    lim.rlim_cur = lim.rlim_cur.max(want);
    // SAFETY: a valid rlimit; root may raise the hard limit.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    assert_eq!(rc, 0, "setrlimit: {}", std::io::Error::last_os_error());
}

#[test]
fn health_endpoint_survives_long_lines_idle_floods_and_dripping_heads() {
    if !require_root() {
        return;
    }
    let mut lab = Lab::start(&unique_tag("xh")).expect("lab");
    lab.wait_ready();
    raise_nofile(IDLE_CONNECTIONS as u64 + 1024);
    for _ in 0..20 {
        lab.ns
            .run(|| probe(HEALTHZ))
            .expect("thread")
            .expect("warm-up probe");
    }
    std::thread::sleep(Duration::from_millis(300));
    let base = usage(lab.pid());
    let reports = [
        under_attack(&lab, "endless request line", endless_request_line),
        under_attack(&lab, "3000 idle connections", idle_connections),
        under_attack(&lab, "dripping heads", dripping_heads),
    ];
    for r in &reports {
        r.print(base);
    }
    for r in &reports {
        r.check(base);
    }
    assert!(
        lab.agent
            .log_text()
            .lines()
            .all(|l| !l.contains("panicked")),
        "{}",
        lab.agent.log_text()
    );
}
