//! Fairness: the fair hand-off, the owners' turns, and the clock that times them (how
//! long a request has waited and when an inode may hand off again).
//!
//! Normally this is real time ([`Instant`](std::time::Instant), read once per critical section) and
//! [`QUANTUM`] is half a millisecond, as in `parking_lot`'s eventual fairness. Under the
//! model checkers (loom, shuttle) time is not modelled: a stamp is the count of critical
//! sections the inode has run, and the quantum is two of them, so every schedule is
//! reproducible and the checkers reach both a wake-up without a hand-off and a later
//! hand-off to the request it woke.

use crate::context::{Attempt, Inner, NodeId};
use crate::lock::{family_conflict, FileLock, LockKind, OwnerKey};
use crate::manager::{BlockedGuard, LockManager};
use crate::wait_cell::WakeList;

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
    /// clock costs tens of them: the herd's lock+unlock pair would read it twice (the
    /// hand-off's turn check and the wake-up's turn end).
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

/// Where an inode is in its fairness quantum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Turn {
    /// No hand-off yet: one may happen at any time.
    #[default]
    Open,
    /// This owner was just handed the lock: its turn starts when a lock next changes
    /// (typically its own first unlock, once it has woken up), so that its wake-up
    /// latency does not eat its quantum.
    Starting(OwnerKey),
    /// This owner's turn: no hand-off before the stamp.
    Until(Stamp, OwnerKey),
}

impl Inner {
    /// When the turn of `owner` ends, if it has the current turn: a waiter it wakes by
    /// unlocking (it is about to lock again, in a herd) waits for the turn to end before
    /// it tries again, when the lock is handed to the oldest waiter, rather than
    /// catching the lock between the owner's unlock and its next lock and cutting its
    /// turn to one acquisition. Real time only: the model checkers do not model time.
    pub(super) fn turn_end_for(&self, owner: OwnerKey) -> Option<std::time::Instant> {
        let end = match self.turn {
            Turn::Starting(o) if o == owner => a_quantum_after(self.clock.now()),
            Turn::Until(t, o) if o == owner && self.clock.now() < t => t,
            _ => return None,
        };
        crate::context::fairness::real_time(end)
    }

    /// Whether `id` is a request that was woken and has not tried again: a live record
    /// with a wait cell and no blocker. (Outside a critical section no request is
    /// detached without having been woken.)
    pub(super) fn is_ready(&self, id: NodeId) -> bool {
        self.arena
            .slots
            .get(id as usize)
            .and_then(|n| n.as_ref())
            .is_some_and(|_| self.waiter(id).is_some() && self.blocker(id).is_none())
    }

    /// Drops stale and repeated entries from `ready`.
    pub(super) fn prune_ready(&mut self) {
        let mut ready = std::mem::take(&mut self.ready);
        ready.sort_unstable();
        ready.dedup();
        ready.retain(|&id| self.is_ready(id));
        self.ready_prune_at = (2 * ready.len()).max(64);
        self.ready = ready;
    }

    /// Whether request `req` would be granted if it tried now (it conflicts with no
    /// granted lock), so that trying it cannot put it back to sleep.
    fn grantable_now(&mut self, req: &FileLock) -> bool {
        if req.kind == LockKind::Flock {
            !self
                .flock
                .iter()
                .any(|&id| family_conflict(req, &self.arena.node(id).fl))
        } else {
            self.posix_first_conflict(req).is_none()
        }
    }

    /// The fair hand-off, run last in every critical section that changed a lock.
    ///
    /// Barging keeps the lock busy: a woken request must run and retry, and the owner
    /// that just unlocked usually takes the lock again first (Linux lets it, and so does
    /// this library: it is where the throughput comes from). So that no waiter loses
    /// for ever, the inode works in turns of a [`QUANTUM`](crate::context::fairness):
    ///
    /// * at most once per turn, at the first change after it ends, it hands the lock to
    ///   the request that has waited longest among those woken and not yet retried, if
    ///   it has waited a quantum, its owner waits in [`PendingLock::wait`] (a future or
    ///   a polled request is never finished behind its owner's back) and it can be
    ///   granted now: it is tried here, on its owner's behalf, exactly as its own retry
    ///   would be (one of the schedules Linux allows: the woken task runs first), and
    ///   its owner finds the result when it wakes;
    /// * that owner's turn starts at the next change (its first unlock, once it runs),
    ///   and a waiter its unlocks wake waits for the turn's end before it retries (see
    ///   `turn_end_for`), so the turn is not cut to one acquisition by the next waiter
    ///   catching the lock between its unlock and its next lock;
    /// * owners that barge in queue behind in the wait tree, which hands the lock on in
    ///   order: every waiter gets a turn within (waiters × quantum).
    ///
    /// The wait tree's rule stands: only requests that were woken (a set that can be
    /// granted together) are candidates, and only one is chosen. Replays drive their
    /// requests with `poll_complete`, so they never see a hand-off or a turn: their
    /// results do not depend on timing. `flc_lock` held.
    ///
    /// [`PendingLock::wait`]: crate::PendingLock::wait
    pub(crate) fn run_handoff(&mut self, mgr: &LockManager, wl: &mut WakeList, bg: &mut BlockedGuard<'_>) {
        if !std::mem::take(&mut self.freed) {
            return;
        }
        if let Turn::Starting(o) = self.turn {
            self.turn = Turn::Until(a_quantum_after(self.clock.now()), o);
            return;
        }
        if self.ready.is_empty() {
            return;
        }
        let now = self.clock.now();
        if matches!(self.turn, Turn::Until(t, _) if now < t) {
            return;
        }
        self.prune_ready();
        let mut oldest: Option<(Stamp, NodeId)> = None;
        for &id in &self.ready {
            let w = self.waiter(id).expect("a ready request");
            if waited_a_quantum(now, w.since) && oldest.is_none_or(|(t, _)| w.since < t) && w.blocking() {
                oldest = Some((w.since, id));
            }
        }
        let Some((_, id)) = oldest else { return };
        let req = self.node(id).fl;
        if !self.grantable_now(&req) {
            return;
        }
        let w = self.waiter(id).expect("a ready request").clone();
        let mut slot = Some(id);
        // Without sleeping: it cannot conflict, so this grants it.
        let a = if req.kind == LockKind::Flock {
            self.flock_lock_inode(mgr, req, &mut slot, false, wl, bg)
        } else {
            self.posix_lock_inode(mgr, req, &mut slot, false, wl, bg, None)
        };
        debug_assert_eq!(a, Attempt::Done(Ok(())), "a grantable request is granted");
        if a == Attempt::Done(Ok(())) {
            // A flock request whose open file already held that lock is done without
            // becoming a record: its record goes.
            if let Some(id) = slot.take() {
                self.delete_block(id, wl, bg);
            }
            w.finish(Ok(()));
            wl.push(w);
            self.stats.handoffs += 1;
            self.turn = Turn::Starting(req.owner);
            // What the grant itself changed (merging, say) is part of this section.
            self.freed = false;
        }
    }
}
