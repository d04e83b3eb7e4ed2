//! The agent's loop as a small state machine: where it is, and what moves it.
//!
//! ```text
//!  Starting ──Loaded──► Listing ──Synced(ok)──► Synced ◄──Synced(ok)──┐
//!                          │                      │                   │
//!                          └──Synced(failing)──► Degraded ────────────┘
//!                                                 ▲  └─Synced(failing)─┘ (stays)
//!  any ──Stop──► Stopping (final)
//! ```
//!
//! `Starting`: the datapath loads and adopts its pins. `Listing`: the source has not sent
//! its whole state yet, nothing is written (as kube-proxy waits for its informers).
//! `Synced`: the last sync programmed everything it was asked to. `Degraded`: frontends
//! fail to program (a full map, a conflict, refused writes: retried, and told as Events);
//! the datapath keeps forwarding what is programmed. `Stopping`: the stop flag; the pins
//! stay. Each change of phase is logged once (`agent phase from=… to=…`).

use tracing::info;

/// Where the loop is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    Starting,
    Listing,
    Synced,
    Degraded,
    Stopping,
}

/// What moves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Input {
    /// The datapath is loaded; the source starts.
    Loaded,
    /// A sync ran: `failing` frontends are not (fully) programmed, `errors` counted.
    Synced { failing: usize, errors: u64 },
    /// The stop flag is set.
    Stop,
}

impl Phase {
    /// The phase after `input` (an input a phase does not expect leaves it as it is).
    pub(super) fn next(self, input: Input) -> Phase {
        match (self, input) {
            (Phase::Stopping, _) | (_, Input::Stop) => Phase::Stopping,
            (Phase::Starting, Input::Loaded) => Phase::Listing,
            (
                Phase::Listing | Phase::Synced | Phase::Degraded,
                Input::Synced { failing, errors },
            ) => match failing == 0 && errors == 0 {
                true => Phase::Synced,
                false => Phase::Degraded,
            },
            (phase, _) => phase,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Listing => "listing",
            Phase::Synced => "synced",
            Phase::Degraded => "degraded",
            Phase::Stopping => "stopping",
        }
    }
}

/// The loop's phase, each change logged.
#[derive(Debug)]
pub(super) struct Machine(Phase);

impl Default for Machine {
    fn default() -> Self {
        Machine(Phase::Starting)
    }
}

impl Machine {
    #[cfg(test)]
    fn phase(&self) -> Phase {
        self.0
    }

    /// Takes `input`; the phase it leads to.
    pub(super) fn take(&mut self, input: Input) -> Phase {
        let next = self.0.next(input);
        if next != self.0 {
            info!(from = self.0.name(), to = next.name(), "agent phase");
            self.0 = next;
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: Input = Input::Synced {
        failing: 0,
        errors: 0,
    };
    const FAILING: Input = Input::Synced {
        failing: 2,
        errors: 0,
    };
    const ERRORS: Input = Input::Synced {
        failing: 0,
        errors: 1,
    };

    #[test]
    fn the_loop_starts_lists_and_syncs() {
        let mut m = Machine::default();
        assert_eq!(m.phase(), Phase::Starting);
        assert_eq!(m.take(Input::Loaded), Phase::Listing);
        assert_eq!(m.take(OK), Phase::Synced);
        assert_eq!(m.phase(), Phase::Synced);
    }

    #[test]
    fn failing_frontends_or_errors_degrade_and_a_clean_sync_recovers() {
        for bad in [FAILING, ERRORS] {
            let mut m = Machine::default();
            m.take(Input::Loaded);
            assert_eq!(m.take(bad), Phase::Degraded, "{bad:?}");
            assert_eq!(m.take(bad), Phase::Degraded, "stays while it fails");
            assert_eq!(m.take(OK), Phase::Synced);
            assert_eq!(m.take(bad), Phase::Degraded);
        }
    }

    #[test]
    fn stop_is_final_from_any_phase() {
        let (loaded, stop) = (Input::Loaded, Input::Stop);
        for inputs in [
            &[][..],
            &[loaded][..],
            &[loaded, OK][..],
            &[loaded, FAILING][..],
        ] {
            let mut m = Machine::default();
            for i in inputs {
                m.take(*i);
            }
            assert_eq!(m.take(stop), Phase::Stopping);
            for i in [loaded, OK, FAILING, stop] {
                assert_eq!(m.take(i), Phase::Stopping, "{i:?} after Stop");
            }
        }
    }

    #[test]
    fn inputs_a_phase_does_not_expect_leave_it() {
        assert_eq!(
            Phase::Starting.next(OK),
            Phase::Starting,
            "no sync before the datapath loads"
        );
        assert_eq!(Phase::Listing.next(Input::Loaded), Phase::Listing);
        assert_eq!(Phase::Synced.next(Input::Loaded), Phase::Synced);
        assert_eq!(Phase::Degraded.next(Input::Loaded), Phase::Degraded);
    }
}
