//! The connections of one listener: a fixed number of slots, each idle (waiting for a request
//! head: a new connection, or keep-alive between two requests) or busy (a request was read
//! and its response is not written yet), and the watchdog that closes a connection idle or
//! busy for too long. At the cap a new connection takes the slot of the connection idle the
//! longest, so idle connections held open by a client cannot lock out a probe; when every
//! slot is busy the new connection is refused.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use tokio::{
    sync::Notify,
    time::{Instant, sleep_until},
};

/// Where a connection is in its request/response cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    Idle,
    Busy,
}

#[derive(Debug)]
struct SlotState {
    phase: Phase,
    since: Instant,
    closed: bool,
}

/// One connection's slot.
#[derive(Debug)]
pub(super) struct Slot {
    state: Mutex<SlotState>,
    wake: Notify,
}

impl Slot {
    fn new() -> Self {
        Self {
            state: Mutex::new(SlotState {
                phase: Phase::Idle,
                since: Instant::now(),
                closed: false,
            }),
            wake: Notify::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The connection entered `phase` now.
    pub(super) fn set(&self, phase: Phase) {
        {
            let mut s = self.state();
            s.phase = phase;
            s.since = Instant::now();
        }
        self.wake.notify_one();
    }

    /// Asks the connection to close (evicted, or its listener stopped).
    pub(super) fn close(&self) {
        self.state().closed = true;
        self.wake.notify_one();
    }

    /// Idle since, if idle and still open.
    fn idle_since(&self) -> Option<Instant> {
        let s = self.state();
        (s.phase == Phase::Idle && !s.closed).then_some(s.since)
    }

    /// Resolves when the connection must close: asked to, or idle longer than `idle`, or
    /// busy longer than `busy`.
    pub(super) async fn closed(&self, idle: Duration, busy: Duration) {
        loop {
            let deadline = {
                let s = self.state();
                if s.closed {
                    return;
                }
                s.since
                    + match s.phase {
                        Phase::Idle => idle,
                        Phase::Busy => busy,
                    }
            };
            if Instant::now() >= deadline {
                return;
            }
            tokio::select! {
                () = self.wake.notified() => {}
                () = sleep_until(deadline) => {}
            }
        }
    }
}

/// The open connections of one listener, at most `max`.
#[derive(Debug)]
pub(super) struct Conns {
    max: usize,
    inner: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    next: u64,
    slots: HashMap<u64, Arc<Slot>>,
}

/// What happened to a connection asking for a slot.
pub(super) enum Admission {
    /// A free slot.
    Admitted(u64, Arc<Slot>),
    /// The slot of the connection idle the longest, which is told to close.
    Evicted(u64, Arc<Slot>),
    /// Every slot is busy.
    Refused,
}

impl Conns {
    pub(super) fn new(max: usize) -> Self {
        Self {
            max,
            inner: Mutex::new(Table::default()),
        }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for a new connection (see [`Admission`]).
    pub(super) fn admit(&self) -> Admission {
        let mut t = self.table();
        let evicted = t.slots.len() >= self.max;
        if evicted {
            let Some(oldest) = oldest_idle(&t.slots) else {
                return Admission::Refused;
            };
            if let Some(slot) = t.slots.remove(&oldest) {
                slot.close();
            }
        }
        let id = t.next;
        t.next += 1;
        let slot = Arc::new(Slot::new());
        t.slots.insert(id, slot.clone());
        if evicted {
            Admission::Evicted(id, slot)
        } else {
            Admission::Admitted(id, slot)
        }
    }

    /// Connection `id` ended (a no-op when it was evicted).
    pub(super) fn leave(&self, id: u64) {
        self.table().slots.remove(&id);
    }

    /// Closes every connection (the listener stopped).
    pub(super) fn close_all(&self) {
        for (_, slot) in self.table().slots.drain() {
            slot.close();
        }
    }

    /// Open connections.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.table().slots.len()
    }
}

fn oldest_idle(slots: &HashMap<u64, Arc<Slot>>) -> Option<u64> {
    slots
        .iter()
        .filter_map(|(id, s)| s.idle_since().map(|t| (t, *id)))
        .min()
        .map(|(_, id)| id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_the_longest_idle_connection_gives_way_and_busy_ones_do_not() {
        let c = Conns::new(2);
        let Admission::Admitted(first, a) = c.admit() else {
            panic!("a free slot")
        };
        std::thread::sleep(Duration::from_millis(2));
        let Admission::Admitted(_, b) = c.admit() else {
            panic!("a free slot")
        };
        // Both idle: the older one goes.
        let Admission::Evicted(_, third) = c.admit() else {
            panic!("evicts")
        };
        assert!(a.state().closed && !b.state().closed);
        assert_eq!(c.len(), 2);
        c.leave(first);
        assert_eq!(c.len(), 2, "leaving after eviction changes nothing");
        // Both busy: refused.
        b.set(Phase::Busy);
        third.set(Phase::Busy);
        assert!(matches!(c.admit(), Admission::Refused));
        third.set(Phase::Idle);
        assert!(matches!(c.admit(), Admission::Evicted(..)));
        assert!(third.state().closed && !b.state().closed);
        c.close_all();
        assert!(b.state().closed);
        assert_eq!(c.len(), 0);
    }
}
