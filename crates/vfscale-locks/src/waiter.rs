//! The sleeping side of a blocked request (`flc_wait`), and [`WakeList`], which wakes
//! waiters after the inode lock is dropped.

use std::task::Waker;
use std::time::Instant;

use crate::fair::Stamp;
use crate::lock::OwnerKey;
use crate::sync::{Arc, Interrupt, Mutex, Precedence, WaitOutcome, Waiter as SharedWaiter};

/// Where a blocked request hangs in its wait tree, as the deadlock detector sees it.
///
/// A mirror of the request's `blocker` link in the inode's tree, kept so the detector can
/// follow a chain on another inode without that inode's lock (see `manager.rs`).
#[derive(Clone, Debug)]
pub(crate) enum Link {
    /// Not in a tree: just woken, or finished (`flc_blocker == NULL`).
    Detached,
    /// Directly under a granted lock of this owner.
    Granted(OwnerKey),
    /// Under another blocked request.
    Waiter(Arc<Waiter>),
}

/// What a blocked request keeps under its waiter's lock, beside the wake-up and the
/// interrupt: the fair hand-off's state.
#[derive(Debug, Default)]
pub(crate) struct HandOff {
    /// The request was finished on its owner's behalf (a fair hand-off): the owner
    /// returns this without trying again. Set under the inode lock.
    pub done: Option<Result<(), crate::Errno>>,
    /// The owner is inside `PendingLock::wait` (sleeping, or trying again after a
    /// wake-up), so a hand-off cannot be lost to a dropped request: every way out of
    /// that call looks at `done` first, under the inode lock or after the hand-off's
    /// wake-up.
    pub blocking: bool,
    /// A blocking owner woken by the unlock of an owner whose fairness turn runs until
    /// then tries again no earlier (unless the request is finished or interrupted
    /// first); see `Inner::turn_end_for`.
    pub hold: Option<Instant>,
}

/// One blocked request's wait cell.
#[derive(Debug)]
pub(crate) struct Waiter {
    /// The owner of the request, the key of the blocked hash.
    pub owner: OwnerKey,
    /// The sleeping side: woken when the request is taken out of its tree
    /// (`list_empty(&flc_blocked_member)`), interrupted for `EINTR`. A leaf lock.
    wait: SharedWaiter<HandOff>,
    /// Protects the detector's mirror of the tree link; a leaf lock. Written with the
    /// inode lock held, read by the detector with the blocked-hash lock held.
    pub link: Mutex<Link>,
    /// When the request first went to sleep, on the inode's fairness clock.
    pub since: Stamp,
    /// When the request first went to sleep, in real time (for callers that report
    /// how long a call waited).
    pub blocked_at: Instant,
}

impl Interrupt for Waiter {
    fn interrupt(&self) {
        self.wait.interrupt();
    }
}

impl Waiter {
    pub fn new(owner: OwnerKey, since: Stamp) -> Arc<Waiter> {
        Arc::new(Waiter {
            owner,
            // As `wait_event_interruptible`: a request woken and interrupted at once
            // tries the lock again first.
            wait: SharedWaiter::new(Precedence::WakeUp, HandOff::default()),
            link: Mutex::new(Link::Detached),
            since,
            blocked_at: Instant::now(),
        })
    }

    pub fn set_link(&self, link: Link) {
        *self.link.lock() = link;
    }

    /// Marks the request woken and wakes its owner. Pairs with the check of `woken` in
    /// [`Waiter::wait`] and in the future's `poll`.
    fn wake(&self) {
        self.wait.wake();
    }

    /// Sleeps until woken or interrupted, or until `deadline`. Returns the state seen.
    /// While it sleeps, the request may be finished on its behalf ([`HandOff::done`]).
    pub fn wait(&self, deadline: Option<Instant>) -> WaitOutcome {
        let mut st = self.wait.lock();
        loop {
            let out = st.wait(deadline);
            if out != WaitOutcome::Woken || st.done.is_some() {
                return out;
            }
            // Woken during another owner's turn: sleep on until it ends (a hand-off
            // or an interrupt still ends the wait).
            let Some(h) = st.hold else { return out };
            if Instant::now() >= h {
                st.hold = None;
                return out;
            }
            let until = deadline.map_or(h, |d| d.min(h));
            while st.done.is_none() && !st.interrupted() {
                if !st.sleep(Some(until)) {
                    break;
                }
            }
            st.hold = None;
            if deadline.is_some_and(|d| Instant::now() >= d) && st.done.is_none() {
                return if st.interrupted() {
                    WaitOutcome::Interrupted
                } else {
                    WaitOutcome::TimedOut
                };
            }
        }
    }

    /// Asks the owner, just woken, not to try again before `t` (see
    /// [`HandOff::hold`]). Inode lock held.
    pub fn hold_until(&self, t: Instant) {
        self.wait.lock().hold = Some(t);
    }

    /// The owner enters (`true`) or leaves `PendingLock::wait` (see
    /// [`HandOff::blocking`]).
    pub fn set_blocking(&self, b: bool) {
        self.wait.lock().blocking = b;
    }

    /// Non-blocking check, registering `waker` when still waiting.
    pub fn poll_state(&self, waker: Option<&Waker>) -> Option<WaitOutcome> {
        self.wait.poll(waker)
    }

    /// Clears `woken` before the request goes back into a tree. Inode lock held.
    pub fn rearm(&self) {
        let mut st = self.wait.lock();
        st.rearm();
        st.hold = None;
    }

    /// Whether the owner is inside `PendingLock::wait` (so the request may be finished
    /// on its behalf).
    pub fn blocking(&self) -> bool {
        self.wait.lock().blocking
    }

    /// Records the result of a hand-off. Inode lock held; the waiter is woken later.
    pub fn finish(&self, r: Result<(), crate::Errno>) {
        self.wait.lock().done = Some(r);
    }

    /// The result of a hand-off, if there was one. Inode lock held, or after a wake-up.
    pub fn take_done(&self) -> Option<Result<(), crate::Errno>> {
        self.wait.lock().done.take()
    }

    pub fn is_woken(&self) -> bool {
        self.wait.is_woken()
    }
}

/// Waiters detached from a tree under the inode lock, to be woken once it is dropped,
/// like tokio's `WakeList`: nobody wakes up only to block on the lock we still hold.
/// The tree rules keep a batch small: an unlock detaches only the direct children of
/// what changed, and siblings never conflict.
#[derive(Default)]
pub(crate) struct WakeList {
    waiters: Vec<Arc<Waiter>>,
}

impl WakeList {
    pub fn new() -> Self {
        WakeList { waiters: Vec::new() }
    }

    pub fn push(&mut self, w: Arc<Waiter>) {
        self.waiters.push(w);
    }

    /// Wakes everyone collected, in the order they were detached. Call with no lock held.
    pub fn wake_all(&mut self) {
        if self.waiters.is_empty() {
            return;
        }
        for w in self.waiters.drain(..) {
            w.wake();
        }
    }
}

impl Drop for WakeList {
    fn drop(&mut self) {
        // A list dropped on an early return still wakes what it holds: a detached waiter
        // that is never notified would sleep forever.
        self.wake_all();
    }
}
