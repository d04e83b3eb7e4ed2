//! The connected UDP sockets of removed backends destroyed off the sync loop. A sync hands
//! the frontend–backend pairs it took out to one worker thread of the agent's, which reads
//! the socket map, walks the hooks' cgroup tree for its processes' network namespaces and
//! enters each to destroy the sockets (`datapath::stale`). With many pods a pass takes a
//! while; the loop never waits for it.
//!
//! * **One OS thread**, spawned at the first hand-over: a namespace belongs to a thread, so
//!   it is entered from this one (never an async runtime's worker), which comes back to
//!   its own after each. Should it fail to come back, the thread ends (it would hold a
//!   pod's namespace alive) and the next hand-over starts another.
//! * **Coalesced**: pairs handed over while a pass runs wait in one set, merged (a pair
//!   twice is one); the next pass takes all of them. Handing over takes a lock the worker
//!   holds only to take the set: it never blocks the loop on a pass.
//! * **Bounded**: the set holds at most [`MAX_PENDING`] pairs. Beyond, the excess is
//!   dropped (those sockets stay connected until their application reconnects), counted
//!   (`xlb_stale_udp_dropped_pairs_total`) and logged once.
//! * **Stops with the agent**: a pass in progress ends at its next namespace, and the
//!   agent waits for the thread at most [`STOP_WAIT`] (then leaves it behind, logged).

use std::{
    collections::BTreeSet,
    path::PathBuf,
    sync::{
        Arc, Condvar, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use tracing::{debug, error, info, warn};

use crate::datapath::{
    pins::Pins,
    stale::{self, DestroyError, Home, Pair},
};

/// The most pairs waiting for a pass (40 B each: 2.6 MB at most).
pub(super) const MAX_PENDING: usize = 65_536;

/// How long the agent waits for the worker when it stops.
pub(super) const STOP_WAIT: Duration = Duration::from_secs(1);

/// What a pass is handed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Job {
    /// The UDP frontend–backend pairs that went.
    pub gone: BTreeSet<Pair>,
    /// With `--socket-lb all`, the hooks' cgroup: the namespaces of the processes in it are
    /// searched besides the agent's.
    pub scope: Option<PathBuf>,
}

/// What the worker does after a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum After {
    /// Waits for the next pairs.
    Go,
    /// Ends (it could not come back to its namespace); the next hand-over starts another.
    Exit,
}

/// A pass: the job, and the stop flag it looks at between namespaces.
type Pass = dyn Fn(Job, &AtomicBool) -> After + Send + Sync;

/// What the loop and the worker share.
#[derive(Debug, Default)]
struct Pending {
    /// The pairs the next pass takes.
    gone: BTreeSet<Pair>,
    scope: Option<PathBuf>,
    /// A pass is running.
    busy: bool,
    /// The thread ended.
    exited: bool,
}

#[derive(Default)]
struct Shared {
    pending: Mutex<Pending>,
    /// Pairs came, a pass ended, the thread ended, or it is to stop.
    changed: Condvar,
    stop: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The worker that destroys stale UDP sockets, owned by the running agent.
pub(super) struct StaleUdp {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    pass: Arc<Pass>,
    /// The set's bound ([`MAX_PENDING`]; a test's is smaller).
    cap: usize,
    /// How long a stop waits for the thread ([`STOP_WAIT`]).
    stop_wait: Duration,
    /// The bound was hit and said so (once).
    warned: bool,
}

impl StaleUdp {
    /// The worker of the agent with pins `pins` (no thread until the first pairs).
    pub(super) fn new(pins: Pins) -> Self {
        Self::with_pass(
            Arc::new(move |job, stop: &AtomicBool| destroy(&pins, job, stop)),
            MAX_PENDING,
            STOP_WAIT,
        )
    }

    fn with_pass(pass: Arc<Pass>, cap: usize, stop_wait: Duration) -> Self {
        Self {
            shared: Arc::default(),
            thread: None,
            pass,
            cap,
            stop_wait,
            warned: false,
        }
    }

    /// Hands `job` to the worker (started if it is not running): its pairs merged into those
    /// waiting, up to the bound; returns how many were dropped for it. Never waits for a
    /// pass.
    pub(super) fn submit(&mut self, job: Job) -> usize {
        if job.gone.is_empty() {
            return 0;
        }
        let dropped = {
            let mut p = self.shared.lock();
            p.scope = job.scope;
            merge(&mut p.gone, job.gone, self.cap)
        };
        self.shared.changed.notify_all();
        if dropped > 0 && !std::mem::replace(&mut self.warned, true) {
            warn!(
                dropped,
                limit = self.cap,
                "more connected UDP pairs of removed backends wait for their sockets to be destroyed than the limit: the excess is dropped (their sockets stay until their applications reconnect; xlb_stale_udp_dropped_pairs_total counts them)"
            );
        }
        self.ensure_thread();
        dropped
    }

    /// The thread, started when there is none (or the last one ended).
    fn ensure_thread(&mut self) {
        let exited = std::mem::take(&mut self.shared.lock().exited);
        if exited && let Some(t) = self.thread.take() {
            // It ended: joining does not wait.
            let _ = t.join();
        }
        if self.thread.is_some() {
            return;
        }
        let (shared, pass) = (self.shared.clone(), self.pass.clone());
        match std::thread::Builder::new()
            .name("xlb-stale-udp".into())
            .spawn(move || work(&shared, &*pass))
        {
            Ok(t) => self.thread = Some(t),
            // The pairs wait: the next hand-over tries again.
            Err(e) => warn!("cannot start the stale UDP socket worker: {e}"),
        }
    }

    /// Waits until no pair waits and no pass runs, at most `timeout`; whether it is so.
    #[cfg(test)]
    fn idle(&self, timeout: Duration) -> bool {
        let p = self.shared.lock();
        let (_p, t) = self
            .shared
            .changed
            .wait_timeout_while(p, timeout, |p| !p.exited && (p.busy || !p.gone.is_empty()))
            .unwrap_or_else(|p| p.into_inner());
        !t.timed_out()
    }
}

/// Stops the thread: a pass ends at its next namespace; waited for at most the stop wait.
impl Drop for StaleUdp {
    fn drop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        {
            let _p = self.shared.lock();
            self.shared.stop.store(true, Ordering::Relaxed);
        }
        self.shared.changed.notify_all();
        let p = self.shared.lock();
        let (p, wait) = self
            .shared
            .changed
            .wait_timeout_while(p, self.stop_wait, |p| !p.exited)
            .unwrap_or_else(|p| p.into_inner());
        if !p.gone.is_empty() {
            info!(
                backends = p.gone.len(),
                "stopping: connected UDP sockets of removed backends left to their applications"
            );
        }
        drop(p);
        match wait.timed_out() {
            // Left behind: the process ends.
            true => warn!(
                "the stale UDP socket worker did not stop within {:?}",
                self.stop_wait
            ),
            false => {
                let _ = thread.join();
            }
        }
    }
}

/// `more` merged into `into`, which holds at most `cap` pairs; how many of `more` did not
/// fit (a pair already waiting fits).
fn merge(into: &mut BTreeSet<Pair>, more: BTreeSet<Pair>, cap: usize) -> usize {
    if into.is_empty() && more.len() <= cap {
        *into = more;
        return 0;
    }
    let mut dropped = 0;
    for p in more {
        if into.len() < cap || into.contains(&p) {
            into.insert(p);
        } else {
            dropped += 1;
        }
    }
    dropped
}

/// The worker's loop: a pass of all the pairs waiting, until it is stopped.
fn work(shared: &Shared, pass: &Pass) {
    /// Says the thread ended, however it does.
    struct Ended<'a>(&'a Shared);
    impl Drop for Ended<'_> {
        fn drop(&mut self) {
            let mut p = self.0.lock();
            (p.busy, p.exited) = (false, true);
            drop(p);
            self.0.changed.notify_all();
        }
    }
    let _ended = Ended(shared);
    loop {
        let job = {
            let p = shared.lock();
            let idle = |p: &mut Pending| p.gone.is_empty() && !shared.stop.load(Ordering::Relaxed);
            let mut p = shared
                .changed
                .wait_while(p, idle)
                .unwrap_or_else(|p| p.into_inner());
            if shared.stop.load(Ordering::Relaxed) {
                return;
            }
            p.busy = true;
            Job {
                gone: std::mem::take(&mut p.gone),
                scope: p.scope.clone(),
            }
        };
        let after = pass(job, &shared.stop);
        // Said with the pass's end (one lock): a hand-over sees a thread that is ending as
        // ended and starts another. (Pairs handed over in between wait for the next one.)
        let mut p = shared.lock();
        (p.busy, p.exited) = (false, after == After::Exit);
        drop(p);
        shared.changed.notify_all();
        if after == After::Exit {
            return;
        }
    }
}

/// One pass: the cookies of the sockets sent through a pair that went (their entries
/// removed from the socket map), destroyed in every namespace searched.
fn destroy(pins: &Pins, job: Job, stop: &AtomicBool) -> After {
    let started = Instant::now();
    let cookies = match stale::cookies(pins, &job.gone) {
        Ok(c) if c.is_empty() => return After::Go,
        Ok(c) => c,
        Err(e) => {
            warn!("cannot read the socket map: {e}; UDP sockets of removed backends stay");
            return After::Go;
        }
    };
    let home = match Home::here() {
        Ok(h) => h,
        Err(e) => {
            warn!(
                "cannot open this thread's network namespace: {e}; UDP sockets of removed backends stay"
            );
            return After::Go;
        }
    };
    let (mut destroyed, mut searched) = (0, 0);
    for ns in stale::namespaces(job.scope.as_deref()) {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        searched += 1;
        match stale::destroy_in(&ns, &cookies, &home) {
            Ok(n) => destroyed += n,
            Err(DestroyError::There(e)) => {
                debug!(ns = %ns.display(), "cannot destroy UDP sockets there: {e}")
            }
            Err(e @ DestroyError::Stranded(_)) => {
                error!("{e}; the stale UDP socket worker ends (the next removal starts another)");
                return After::Exit;
            }
        }
    }
    info!(
        sockets = destroyed,
        backends = job.gone.len(),
        namespaces = searched,
        took_ms = started.elapsed().as_millis() as u64,
        "destroyed connected UDP sockets of removed backends"
    );
    After::Go
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// Pair `i` (its frontend port).
    fn pair(i: u16) -> Pair {
        (([1, 0, 0, 0], i), ([2, 0, 0, 0], 53))
    }

    fn pairs(r: std::ops::Range<u16>) -> BTreeSet<Pair> {
        r.map(pair).collect()
    }

    fn job(r: std::ops::Range<u16>) -> Job {
        Job {
            gone: pairs(r),
            scope: None,
        }
    }

    /// A worker whose passes send their jobs to the returned receiver, each pass waiting
    /// for a token on `gate` first (or for the stop).
    fn gated(cap: usize, stop_wait: Duration) -> (StaleUdp, mpsc::Receiver<Job>, mpsc::Sender<()>) {
        let (jobs, got) = mpsc::channel();
        let (open, gate) = mpsc::channel::<()>();
        let (jobs, gate) = (Mutex::new(jobs), Mutex::new(gate));
        let pass = move |job: Job, stop: &AtomicBool| {
            let gate = gate.lock().expect("gate");
            while gate.recv_timeout(Duration::from_millis(5)).is_err() {
                if stop.load(Ordering::Relaxed) {
                    return After::Go;
                }
            }
            let _ = jobs.lock().expect("jobs").send(job);
            After::Go
        };
        (
            StaleUdp::with_pass(Arc::new(pass), cap, stop_wait),
            got,
            open,
        )
    }

    #[test]
    fn a_merge_keeps_at_most_the_cap_and_counts_what_it_dropped() {
        let mut set = BTreeSet::new();
        assert_eq!(merge(&mut set, pairs(0..3), 5), 0);
        // Pairs already waiting fit; of the new ones, two fit.
        assert_eq!(merge(&mut set, pairs(1..8), 5), 3);
        assert_eq!(set, pairs(0..5));
        assert_eq!(merge(&mut set, pairs(0..5), 5), 0, "all there already");
        let mut empty = BTreeSet::new();
        assert_eq!(merge(&mut empty, pairs(0..9), 4), 5);
        assert_eq!(empty.len(), 4);
    }

    #[test]
    fn pairs_handed_over_during_a_pass_wait_merged_for_the_next_one_and_never_block() {
        let (mut w, got, open) = gated(100, Duration::from_secs(5));
        assert_eq!(w.submit(job(0..2)), 0);
        // The first pass has started (it waits at its gate): the next hand-overs return at
        // once, merged.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !w.shared.lock().busy {
            assert!(Instant::now() < deadline, "the first pass did not start");
            std::thread::sleep(Duration::from_millis(1));
        }
        let t = Instant::now();
        assert_eq!(w.submit(job(1..4)), 0);
        assert_eq!(w.submit(job(3..6)), 0);
        assert!(t.elapsed() < Duration::from_secs(1), "a hand-over waited");
        open.send(()).expect("gate");
        open.send(()).expect("gate");
        let first = got.recv_timeout(Duration::from_secs(5)).expect("a pass");
        assert_eq!(first.gone, pairs(0..2));
        let second = got.recv_timeout(Duration::from_secs(5)).expect("a pass");
        assert_eq!(
            second.gone,
            pairs(1..6),
            "one pass of everything that waited"
        );
        assert!(w.idle(Duration::from_secs(5)));
        assert!(got.try_recv().is_err(), "no third pass");
    }

    #[test]
    fn pairs_beyond_the_cap_are_dropped_and_said_so() {
        let (mut w, got, open) = gated(4, Duration::from_secs(5));
        assert_eq!(w.submit(job(0..1)), 0);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !w.shared.lock().busy {
            assert!(Instant::now() < deadline, "the first pass did not start");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(w.submit(job(10..13)), 0);
        assert_eq!(w.submit(job(20..23)), 2);
        assert!(w.warned);
        open.send(()).expect("gate");
        open.send(()).expect("gate");
        let _ = got.recv_timeout(Duration::from_secs(5)).expect("a pass");
        let second = got.recv_timeout(Duration::from_secs(5)).expect("a pass");
        assert_eq!(second.gone.len(), 4);
    }

    #[test]
    fn the_worker_stops_with_its_owner_within_the_bound_even_mid_pass() {
        // A pass that never gets through its gate: it looks at the stop flag.
        let (mut w, _got, _open) = gated(100, Duration::from_secs(5));
        w.submit(job(0..3));
        let shared = w.shared.clone();
        let t = Instant::now();
        drop(w);
        assert!(t.elapsed() < Duration::from_secs(2));
        assert!(shared.lock().exited, "joined");
        // A pass that ignores the stop flag is left behind after the bound.
        let (release, stuck) = mpsc::channel::<()>();
        let stuck = Mutex::new(stuck);
        let pass = move |_: Job, _: &AtomicBool| {
            let _ = stuck.lock().expect("stuck").recv();
            After::Go
        };
        let mut w = StaleUdp::with_pass(Arc::new(pass), 100, Duration::from_millis(50));
        w.submit(job(0..1));
        while !w.shared.lock().busy {
            std::thread::sleep(Duration::from_millis(1));
        }
        let t = Instant::now();
        drop(w);
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        drop(release);
    }

    #[test]
    fn a_worker_that_ended_is_started_again_by_the_next_hand_over() {
        let (passes, got) = mpsc::channel();
        let passes = Mutex::new(passes);
        let pass = move |job: Job, _: &AtomicBool| {
            let _ = passes.lock().expect("passes").send(job);
            After::Exit
        };
        let mut w = StaleUdp::with_pass(Arc::new(pass), 100, Duration::from_secs(5));
        w.submit(job(0..1));
        assert_eq!(
            got.recv_timeout(Duration::from_secs(5)).expect("pass").gone,
            pairs(0..1)
        );
        assert!(w.idle(Duration::from_secs(5)));
        w.submit(job(1..2));
        assert_eq!(
            got.recv_timeout(Duration::from_secs(5)).expect("pass").gone,
            pairs(1..2)
        );
    }
}
