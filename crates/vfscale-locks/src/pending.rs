//! A request that is waiting: block on it, give it a deadline, interrupt it, or await it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use crate::context::{Attempt, FileLockContext, Slot};
use crate::lock::{FileLock, LockKind};
use crate::sync::{Interrupter, WaitOutcome};
use crate::wait_cell::WaitCell;
use crate::Errno;

/// A lock request that had to wait (`FILE_LOCK_DEFERRED`).
///
/// Finish it with [`PendingLock::wait`] (a thread blocks), [`PendingLock::wait_until`]
/// (with a deadline), by `.await`ing it (any runtime), or by calling
/// [`PendingLock::poll_complete`] from a driver of your own. Dropping it abandons the
/// request and leaves no trace, as an interrupted `F_SETLKW` does.
///
/// ```
/// use vfscale_locks::*;
/// let mgr = LockManager::new();
/// let inode = FileLockContext::new(&mgr, InodeKey::default());
/// let (a, b) = (Process::new(1), Process::new(2));
/// let (fa, fb) = (OpenFile::new(1, AccessMode::ReadWrite), OpenFile::new(2, AccessMode::ReadWrite));
/// let mut wr = Flock::new(LockType::Write, 0, 0);
/// inode.fcntl_lock(a, fa, FcntlCmd::SetLk, &mut wr).unwrap();
/// let mut pending = inode.fcntl_lock(b, fb, FcntlCmd::SetLkW, &mut wr).unwrap().expect("waits");
/// assert_eq!(pending.poll_complete(), None);
/// inode.posix_remove_owner(a); // a closes a descriptor: its locks go
/// assert_eq!(pending.poll_complete(), Some(Ok(())));
/// ```
#[must_use = "dropping a pending lock abandons the request"]
#[derive(Debug)]
pub struct PendingLock {
    ctx: Arc<FileLockContext>,
    req: FileLock,
    slot: Slot,
    waiter: crate::sync::Arc<WaitCell>,
}

impl PendingLock {
    /// The request `req`, blocked with record `slot` and wait cell `waiter` (taken in
    /// the critical section that blocked it: once the inode lock is dropped the record
    /// may already have been granted by a hand-off, which leaves its result in
    /// `waiter`).
    pub(crate) fn new(
        ctx: Arc<FileLockContext>,
        req: FileLock,
        slot: Slot,
        waiter: crate::sync::Arc<WaitCell>,
    ) -> PendingLock {
        debug_assert!(slot.is_some(), "a pending lock has a record");
        PendingLock {
            ctx,
            req,
            slot,
            waiter,
        }
    }

    /// When the request first went to sleep.
    pub fn blocked_at(&self) -> Instant {
        self.waiter.blocked_at
    }

    /// Which wait this is, as [`PosixWaitEdge::wait`](crate::PosixWaitEdge::wait) names
    /// it while it lasts.
    pub fn wait_id(&self) -> crate::PosixWaitId {
        crate::PosixWaitId::of(&self.waiter)
    }

    /// A handle that ends this wait with `EINTR` from anywhere (the role of a signal),
    /// unless it was already granted.
    pub fn interrupter(&self) -> Interrupter {
        Interrupter::new(&self.waiter)
    }

    /// Blocks the thread until the lock is granted or refused (`EDEADLK` on a retry,
    /// `EINTR` if interrupted).
    pub fn wait(mut self) -> Result<(), Errno> {
        self.wait_deadline(None)
    }

    /// As [`PendingLock::wait`], giving up with `ETIMEDOUT` at `deadline`.
    pub fn wait_until(mut self, deadline: Instant) -> Result<(), Errno> {
        self.wait_deadline(Some(deadline))
    }

    fn wait_deadline(&mut self, deadline: Option<Instant>) -> Result<(), Errno> {
        // From here until it returns, this call looks at `done` before anything else it
        // does with the request: a hand-off may finish it on our behalf.
        self.waiter.set_blocking(true);
        let r = self.wait_loop(deadline);
        self.waiter.set_blocking(false);
        r
    }

    fn wait_loop(&mut self, deadline: Option<Instant>) -> Result<(), Errno> {
        loop {
            match self.waiter.wait(deadline) {
                WaitOutcome::Woken => {
                    if let Some(r) = self.waiter.take_done() {
                        // Finished on our behalf; the record is no longer ours.
                        self.slot = None;
                        return r;
                    }
                    if let Some(r) = self.retry() {
                        return r;
                    }
                }
                WaitOutcome::Interrupted => return self.abandon(Errno::EINTR),
                WaitOutcome::TimedOut => return self.abandon(Errno::ETIMEDOUT),
            }
        }
    }

    /// Without blocking: if the request was woken, tries it again; if it was
    /// interrupted, abandons it. `None` while it still waits.
    pub fn poll_complete(&mut self) -> Option<Result<(), Errno>> {
        self.step(None)
    }

    fn step(&mut self, waker: Option<&std::task::Waker>) -> Option<Result<(), Errno>> {
        self.slot?;
        loop {
            match self.waiter.poll_state(waker)? {
                WaitOutcome::Woken => {
                    if let Some(r) = self.retry() {
                        return Some(r);
                    }
                }
                WaitOutcome::Interrupted | WaitOutcome::TimedOut => return Some(self.abandon(Errno::EINTR)),
            }
        }
    }

    /// Whether the request was woken and must be tried again (a driver's hint).
    pub fn is_woken(&self) -> bool {
        self.waiter.is_woken()
    }

    /// Tries the request again after a wake-up; `None` if it sleeps again.
    fn retry(&mut self) -> Option<Result<(), Errno>> {
        let req = self.req;
        let slot = &mut self.slot;
        let waiter = &self.waiter;
        self.ctx.with_locked(|inner, mgr, wl, bg| {
            // A hand-off sets its result under this lock: seen here, the record is gone.
            if let Some(r) = waiter.take_done() {
                *slot = None;
                return Some(r);
            }
            let a = if req.kind == LockKind::Flock {
                inner.flock_lock_inode(mgr, req, slot, true, wl, bg)
            } else {
                inner.posix_lock_inode(mgr, req, slot, true, wl, bg, None)
            };
            match a {
                Attempt::Blocked => None,
                Attempt::Done(r) => {
                    if let Some(id) = slot.take() {
                        inner.delete_block(id, wl, bg);
                    }
                    Some(r)
                }
            }
        })
    }

    /// `locks_delete_block` for a request that gives up. If it was finished on its
    /// behalf first (a hand-off), that result stands.
    fn abandon(&mut self, e: Errno) -> Result<(), Errno> {
        let slot = &mut self.slot;
        let waiter = &self.waiter;
        self.ctx.with_locked(|inner, _, wl, bg| {
            if let Some(r) = waiter.take_done() {
                *slot = None;
                return r;
            }
            if let Some(id) = slot.take() {
                inner.delete_block(id, wl, bg);
            }
            Err(e)
        })
    }
}

impl Future for PendingLock {
    type Output = Result<(), Errno>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match this.step(Some(cx.waker())) {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }
}

impl Drop for PendingLock {
    fn drop(&mut self) {
        if self.slot.is_some() {
            let _ = self.abandon(Errno::EINTR);
        }
    }
}
