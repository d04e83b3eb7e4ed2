//! A flood of new flows against a small conntrack: flows that were answered and went on
//! (assured) are out of the LRU table's reach, as the kernel's conntrack never early-drops
//! an assured flow; what the flood could not keep is counted, and the agent collects the
//! flood's closed flows afterwards.

use std::{
    collections::BTreeSet,
    net::{Ipv4Addr, SocketAddr, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use xlb_tests::{
    client::{ask_tcp as ask, tcp_request},
    datapath::reason_counts,
    require_root,
    scenario::{Scenario, TCP_PORT, sock},
    services::service_yaml,
    topology::pod_ip,
};

const WEB: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const TIMEOUT: Duration = Duration::from_secs(2);
/// Conntrack flows (`--conntrack-min`, with `--conntrack-max-per-core 0`): 256 entries in
/// each table.
const CAPACITY_FLOWS: usize = 128;
const LONG_FLOWS: usize = 20;
/// New connections in the flood: 10× the table's entries (20× its flows).
const FLOOD: usize = 10 * 2 * CAPACITY_FLOWS;
const FLOOD_THREADS: usize = 4;

/// The long-lived connections and the backend each first got.
struct Long {
    conns: Vec<TcpStream>,
    first: Vec<String>,
}

impl Long {
    /// `LONG_FLOWS` connections from the client pod, each asked once: answered and
    /// continued, so assured.
    fn open(s: &Scenario) -> Self {
        let (conns, first) = s
            .topo
            .client
            .ns
            .run(|| -> Result<_, String> {
                let (mut conns, mut first) = (Vec::new(), Vec::new());
                for _ in 0..LONG_FLOWS {
                    let mut c = TcpStream::connect_timeout(&sock(WEB, 80), TIMEOUT)
                        .map_err(|e| format!("connect: {e}"))?;
                    c.set_read_timeout(Some(TIMEOUT))
                        .map_err(|e| e.to_string())?;
                    first.push(ask(&mut c)?);
                    conns.push(c);
                }
                Ok((conns, first))
            })
            .expect("client thread")
            .expect("long-lived connections");
        assert!(
            first.iter().collect::<BTreeSet<_>>().len() > 1,
            "the long flows should spread over the backends (else a lost entry would not show): {first:?}"
        );
        Self { conns, first }
    }

    /// Every long connection answers, from the backend it first got.
    fn all_answer(&mut self, when: &str) {
        for (i, c) in self.conns.iter_mut().enumerate() {
            let got = ask(c).unwrap_or_else(|e| panic!("long flow {i} broke {when}: {e}"));
            assert_eq!(
                got, self.first[i],
                "long flow {i} moved to another backend {when}"
            );
        }
    }

    /// How many of them have assured entries.
    fn assured(&self, s: &Scenario) -> usize {
        let locals: BTreeSet<String> = self
            .conns
            .iter()
            .map(|c| c.local_addr().expect("local address").to_string())
            .collect();
        lb_userspace::list::conntrack(&xlb_tests::pins(&s.agent.pins))
            .expect("list conntrack")
            .into_iter()
            .filter(|r| r.assured && locals.contains(&r.client))
            .count()
    }
}

/// The flood: `FLOOD` short connections from the client pod on `FLOOD_THREADS` threads,
/// as fast as they go, while `during` runs (until it sees the flood done). Returns
/// (answered, failed).
fn flood(s: &Scenario, mut during: impl FnMut(&AtomicBool)) -> (usize, usize) {
    let done = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let flood = {
        let (done, answered, failed) = (done.clone(), answered.clone(), failed.clone());
        s.topo.client.ns.spawn(move || {
            let workers: Vec<_> = (0..FLOOD_THREADS)
                .map(|_| {
                    let (answered, failed) = (answered.clone(), failed.clone());
                    // Threads started here inherit this thread's network namespace.
                    std::thread::spawn(move || {
                        for _ in 0..FLOOD / FLOOD_THREADS {
                            match tcp_request(sock(WEB, 80), Duration::from_millis(500)) {
                                Ok(_) => answered.fetch_add(1, Ordering::Relaxed),
                                Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                            };
                        }
                    })
                })
                .collect();
            for w in workers {
                let _ = w.join();
            }
            done.store(true, Ordering::Relaxed);
        })
    };
    during(&done);
    flood
        .join()
        .expect("flood thread")
        .expect("flood namespace");
    (
        answered.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
    )
}

#[test]
fn a_flood_of_new_flows_at_ten_times_conntrack_leaves_long_lived_flows_alone() {
    if !require_root() {
        return;
    }
    let backends: Vec<Ipv4Addr> = (2..6).map(pod_ip).collect();
    let yaml = service_yaml("web", WEB, 80, "TCP", TCP_PORT, &backends);
    let min = CAPACITY_FLOWS.to_string();
    let mut s = Scenario::start_with(
        "xcf",
        backends.len(),
        &yaml,
        &["--conntrack-min", &min, "--conntrack-max-per-core", "0"],
    )
    .expect("scenario");
    s.wait_backends("10.96.0.10:80/TCP", backends.len(), Duration::from_secs(30))
        .expect("initial sync");
    let mut long = Long::open(&s);
    assert_eq!(long.assured(&s), LONG_FLOWS, "every long flow is assured");
    let before = reason_counts(&s.agent.pins);

    let deadline = Instant::now() + Duration::from_secs(120);
    let mut rounds = 0;
    let (answered, failed) = flood(&s, |done| {
        while !done.load(Ordering::Relaxed) {
            assert!(Instant::now() < deadline, "the flood did not finish");
            long.all_answer(&format!("during the flood (round {rounds})"));
            rounds += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    assert_eq!(answered + failed, FLOOD);
    assert!(
        answered > 2 * CAPACITY_FLOWS,
        "the flood ran: {answered} answered"
    );
    long.all_answer("after the flood");
    assert_eq!(
        long.assured(&s),
        LONG_FLOWS,
        "every long flow still has its assured entries"
    );
    let after = reason_counts(&s.agent.pins);
    let delta = |r: &str| after[r] - before[r];
    assert!(
        delta("ct_assured_full") > 0,
        "the flood filled the assured table, and that was counted: {after:?}"
    );
    assert!(
        delta("new_flow") >= answered as u64,
        "each answered flood connection was a new flow"
    );
    eprintln!(
        "{}: {rounds} rounds of the long flows during the flood; flood {answered} answered, \
         {failed} failed; ct_assured_full +{}, ct_miss +{}",
        xlb_tests::test_name(),
        delta("ct_assured_full"),
        delta("ct_miss")
    );
    // The agent deletes the flood's closed flows (idle 10 s, looked at every 5 s) and keeps
    // the long ones: the assured table does not fill for good.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows =
            lb_userspace::list::conntrack(&xlb_tests::pins(&s.agent.pins)).expect("list conntrack");
        let assured_rows = rows.iter().filter(|r| r.assured).count();
        if assured_rows == LONG_FLOWS {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{assured_rows} assured flows 30 s after the flood (only the {LONG_FLOWS} long ones should remain)"
        );
        long.all_answer("while the collector runs");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(long.assured(&s), LONG_FLOWS);
    // New connections still work once the flood is over.
    let later = s
        .topo
        .client
        .ns
        .run(|| tcp_request(SocketAddr::from((WEB, 80)), TIMEOUT))
        .expect("client thread");
    later.expect("a new connection after the flood");
}
