//! Time for the fair hand-off: how long a request has waited and when an inode may hand
//! off again.
//!
//! Normally this is real time ([`Instant`], read once per critical section) and
//! [`QUANTUM`] is half a millisecond, as in `parking_lot`'s eventual fairness. Under the model checkers (loom, shuttle) time is
//! not modelled: a stamp is the count of critical sections the inode has run, and the
//! quantum is two of them, so every schedule is reproducible and the checkers reach
//! both a wake-up without a hand-off and a later hand-off to the request it woke.

#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
mod imp {
    use std::time::{Duration, Instant};

    /// A point in time.
    pub(crate) type Stamp = Instant;

    /// How long a request must have waited before the lock is handed to it, and how long
    /// an inode waits between two hand-offs.
    pub(crate) const QUANTUM: Duration = Duration::from_micros(500);

    /// One inode's clock: the time read once per critical section (its first [`now`]),
    /// not at every use. A section runs for nanoseconds, and a read of the monotonic
    /// clock costs ~24 ns here (vDSO, TSC clocksource, a 2-vCPU KVM guest): the herd's
    /// lock+unlock pair read it twice (the hand-off's turn check and the wake-up's
    /// turn end), 27-30% of its time in `perf`.
    ///
    /// [`now`]: Clock::now
    #[derive(Debug, Default)]
    pub(crate) struct Clock {
        /// This section's time, once read; cleared by [`Clock::tick`].
        now: std::cell::Cell<Option<Instant>>,
    }

    impl Clock {
        /// Marks the start of a critical section: the next [`Clock::now`] reads the
        /// clock.
        pub fn tick(&mut self) {
            *self.now.get_mut() = None;
        }

        /// Now: the section's time (read at the first call after [`Clock::tick`]).
        pub fn now(&self) -> Stamp {
            match self.now.get() {
                Some(t) => t,
                None => {
                    let t = Instant::now();
                    self.now.set(Some(t));
                    t
                }
            }
        }
    }

    /// Whether a request waiting since `since` has waited a quantum at `now`.
    pub(crate) fn waited_a_quantum(now: Stamp, since: Stamp) -> bool {
        now.saturating_duration_since(since) >= QUANTUM
    }

    /// A quantum after `now`.
    pub(crate) fn a_quantum_after(now: Stamp) -> Stamp {
        now + QUANTUM
    }

    /// `s` in real time.
    pub(crate) fn real_time(s: Stamp) -> Option<Instant> {
        Some(s)
    }

    /// A stamp for a wait cell made outside an inode (unit tests).
    #[cfg(test)]
    pub(crate) fn stamp_for_tests() -> Stamp {
        Instant::now()
    }
}

#[cfg(any(vfscale_loom, vfscale_shuttle))]
mod imp {
    /// A count of the inode's critical sections.
    pub(crate) type Stamp = u64;

    /// The quantum, in critical sections.
    pub(crate) const QUANTUM: u64 = 2;

    /// One inode's clock: its critical sections so far.
    #[derive(Debug, Default)]
    pub(crate) struct Clock {
        ticks: u64,
    }

    impl Clock {
        /// Marks the start of a critical section.
        pub fn tick(&mut self) {
            self.ticks += 1;
        }

        /// Now.
        pub fn now(&self) -> Stamp {
            self.ticks
        }
    }

    /// Whether a request waiting since `since` has waited a quantum at `now`.
    pub(crate) fn waited_a_quantum(now: Stamp, since: Stamp) -> bool {
        now.saturating_sub(since) >= QUANTUM
    }

    /// A quantum after `now`.
    pub(crate) fn a_quantum_after(now: Stamp) -> Stamp {
        now + QUANTUM
    }

    /// `s` in real time: none, time is not modelled (a timed wait would be an untimed
    /// one).
    pub(crate) fn real_time(_s: Stamp) -> Option<std::time::Instant> {
        None
    }

    /// A stamp for a wait cell made outside an inode (unit tests).
    #[cfg(test)]
    pub(crate) fn stamp_for_tests() -> Stamp {
        0
    }
}

pub(crate) use imp::*;
