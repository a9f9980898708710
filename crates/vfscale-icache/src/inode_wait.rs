//! A lookup that has to wait ([`Started`], [`InodeWait`]): blocking, with a deadline,
//! polled, or as a `Future`; [`WaitError`] says why a wait ended without a result.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use crate::inode::*;
use crate::lookup::{run, settle_found, Attempt, FoundAs, LookupOp, Outcome};
use crate::superblock::{InsertBusy, SbHandle};
use crate::waiter::{self, Interrupter, WaitOutcome, WaiterRef};
use crate::SuperOperations;

/// Why a wait ended without a result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitError {
    /// An [`Interrupter`] interrupted it.
    Interrupted,
    /// The deadline passed.
    TimedOut,
}

impl fmt::Display for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WaitError::Interrupted => "interrupted",
            WaitError::TimedOut => "timed out",
        })
    }
}

impl std::error::Error for WaitError {}

/// An operation that either finished or has to wait.
pub enum Started<T, F: SuperOperations> {
    /// Finished.
    Done(T),
    /// Waiting on an `I_NEW` inode or on an eviction.
    Wait(InodeWait<F, T>),
}

impl<T: fmt::Debug, F: SuperOperations> fmt::Debug for Started<T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Started::Done(t) => f.debug_tuple("Done").field(t).finish(),
            Started::Wait(w) => f.debug_tuple("Wait").field(w).finish(),
        }
    }
}

impl<T: FromOutcome<F>, F: SuperOperations> Started<T, F> {
    /// The result, blocking until it is there.
    pub fn wait(self) -> T {
        match self {
            Started::Done(t) => t,
            Started::Wait(w) => match w.wait() {
                Ok(t) => t,
                Err(e) => unreachable!("an uninterruptible wait without deadline ended: {e}"),
            },
        }
    }

    /// Whether it has to wait.
    pub fn is_waiting(&self) -> bool {
        matches!(self, Started::Wait(_))
    }
}

/// The results a waiting operation can give (sealed).
pub trait FromOutcome<F: SuperOperations>: Sized + private::Sealed {
    #[doc(hidden)]
    fn from_outcome(o: Outcome<F>) -> Self;
}

mod private {
    pub trait Sealed {}
    impl<F: crate::SuperOperations> Sealed for Option<crate::Iget<F>> {}
    impl<F: crate::SuperOperations> Sealed for Option<crate::InodeRef<F>> {}
    impl<F: crate::SuperOperations> Sealed for Result<crate::NewInode<F>, crate::InsertBusy<F>> {}
}

impl<F: SuperOperations> FromOutcome<F> for Option<Iget<F>> {
    fn from_outcome(o: Outcome<F>) -> Self {
        match o {
            Outcome::Iget(x) => x,
            _ => unreachable!("an iget gives an iget outcome"),
        }
    }
}

impl<F: SuperOperations> FromOutcome<F> for Option<InodeRef<F>> {
    fn from_outcome(o: Outcome<F>) -> Self {
        match o {
            Outcome::Lookup(x) => x,
            _ => unreachable!("a lookup gives a lookup outcome"),
        }
    }
}

impl<F: SuperOperations> FromOutcome<F> for Result<NewInode<F>, InsertBusy<F>> {
    fn from_outcome(o: Outcome<F>) -> Self {
        match o {
            Outcome::Insert(x) => x,
            _ => unreachable!("an insert gives an insert outcome"),
        }
    }
}

/// What an [`InodeWait`] is waiting for.
enum WaitingFor<F: SuperOperations> {
    /// The eviction of the inode at this address (it holds no reference).
    Eviction(usize),
    /// The end of the load of this `I_NEW` inode (it holds a reference).
    Load(InodeRef<F>),
    /// Nothing: the wait ended.
    Nothing,
}

/// A lookup waiting for an `I_NEW` inode's load to end or for an eviction to finish
/// (`wait_on_inode`, `__wait_on_freeing_inode`). Finish it with [`InodeWait::wait`] (the
/// thread blocks), [`InodeWait::wait_until`] (with a deadline), by `.await`ing it, or by
/// calling [`InodeWait::poll_complete`] from a driver of your own. An [`Interrupter`]
/// ends it from anywhere. Dropping it abandons the lookup (any reference it holds is
/// put).
#[must_use = "dropping a wait abandons the lookup"]
pub struct InodeWait<F: SuperOperations, T> {
    sb: Arc<SbHandle<F>>,
    op: LookupOp<F>,
    stage: WaitingFor<F>,
    waiter: WaiterRef,
    _t: PhantomData<fn() -> T>,
}

impl<F: SuperOperations, T> fmt::Debug for InodeWait<F, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on = match &self.stage {
            WaitingFor::Eviction(_) => "an eviction",
            WaitingFor::Load(_) => "I_NEW",
            WaitingFor::Nothing => "nothing",
        };
        write!(f, "InodeWait(on {on})")
    }
}

impl<F: SuperOperations, T: FromOutcome<F>> InodeWait<F, T> {
    pub(crate) fn from_attempt(
        sb: &Arc<SbHandle<F>>,
        op: LookupOp<F>,
        waiter: Option<WaiterRef>,
        a: Attempt<F>,
    ) -> Started<T, F> {
        let stage = match a {
            Attempt::Done(o) => return Started::Done(T::from_outcome(o)),
            Attempt::WaitEviction(addr) => WaitingFor::Eviction(addr),
            Attempt::WaitLoad(r) => WaitingFor::Load(r),
        };
        Started::Wait(InodeWait {
            sb: sb.clone(),
            op,
            stage,
            waiter: waiter.expect("a waiting attempt registered a waiter"),
            _t: PhantomData,
        })
    }

    /// The `I_NEW` inode this wait holds a reference to, while it waits for its load
    /// (`None` while it waits for an eviction).
    pub fn waiting_on(&self) -> Option<&InodeRef<F>> {
        match &self.stage {
            WaitingFor::Load(r) => Some(r),
            _ => None,
        }
    }

    /// A handle that interrupts this wait.
    pub fn interrupter(&self) -> Interrupter {
        Interrupter::new(&self.waiter)
    }

    /// Blocks until the result is there.
    pub fn wait(mut self) -> Result<T, WaitError> {
        self.wait_deadline(None)
    }

    /// Blocks until the result is there or `deadline` passes.
    pub fn wait_until(mut self, deadline: Instant) -> Result<T, WaitError> {
        self.wait_deadline(Some(deadline))
    }

    fn wait_deadline(&mut self, deadline: Option<Instant>) -> Result<T, WaitError> {
        loop {
            match waiter::wait(&self.waiter, deadline) {
                WaitOutcome::Woken => {
                    if let Some(t) = self.advance() {
                        return Ok(t);
                    }
                }
                WaitOutcome::Interrupted => return Err(self.abandon(WaitError::Interrupted)),
                WaitOutcome::TimedOut => return Err(self.abandon(WaitError::TimedOut)),
            }
        }
    }

    /// Without blocking: if the wait was woken, tries again; `None` while it still waits.
    pub fn poll_complete(&mut self) -> Option<Result<T, WaitError>> {
        self.step(None)
    }

    /// Whether it was woken (a driver's hint that `poll_complete` will make progress).
    pub fn is_woken(&self) -> bool {
        self.waiter.poll(None).is_some()
    }

    fn step(&mut self, waker: Option<&std::task::Waker>) -> Option<Result<T, WaitError>> {
        if matches!(self.stage, WaitingFor::Nothing) {
            return Some(Err(WaitError::Interrupted));
        }
        loop {
            match self.waiter.poll(waker)? {
                WaitOutcome::Woken => {
                    if let Some(t) = self.advance() {
                        return Some(Ok(t));
                    }
                }
                WaitOutcome::Interrupted => return Some(Err(self.abandon(WaitError::Interrupted))),
                WaitOutcome::TimedOut => return Some(Err(self.abandon(WaitError::TimedOut))),
            }
        }
    }

    /// After a wake-up: tries again; `None` if it waits again.
    fn advance(&mut self) -> Option<T> {
        let mut w = Some(self.waiter.clone());
        let a = match std::mem::replace(&mut self.stage, WaitingFor::Nothing) {
            WaitingFor::Eviction(_) => run(&self.sb, &mut self.op, &mut w),
            WaitingFor::Load(r) => settle_found(&self.sb, &mut self.op, r, FoundAs::Woken, &mut w),
            WaitingFor::Nothing => unreachable!("advanced after the end"),
        };
        match a {
            Attempt::Done(o) => Some(T::from_outcome(o)),
            Attempt::WaitEviction(addr) => {
                self.stage = WaitingFor::Eviction(addr);
                None
            }
            Attempt::WaitLoad(r) => {
                self.stage = WaitingFor::Load(r);
                None
            }
        }
    }

    fn abandon(&mut self, e: WaitError) -> WaitError {
        self.cancel();
        e
    }
}

impl<F: SuperOperations, T> InodeWait<F, T> {
    /// Ends the wait: takes its entry out of the wait table and puts the reference it
    /// holds, if any.
    fn cancel(&mut self) {
        match std::mem::replace(&mut self.stage, WaitingFor::Nothing) {
            WaitingFor::Eviction(addr) => self.sb.cache.waits.cancel(addr, &self.waiter),
            WaitingFor::Load(r) => {
                self.sb.cache.waits.cancel(r.addr(), &self.waiter);
                drop(r);
            }
            WaitingFor::Nothing => {}
        }
    }
}

impl<F: SuperOperations, T> Drop for InodeWait<F, T> {
    fn drop(&mut self) {
        self.cancel();
    }
}

impl<F: SuperOperations, T: FromOutcome<F>> Future for InodeWait<F, T> {
    type Output = Result<T, WaitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // `InodeWait` is `Unpin` (no self-references).
        let this = self.get_mut();
        match this.step(Some(cx.waker())) {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }
}

impl<F: SuperOperations, T> Unpin for InodeWait<F, T> {}
