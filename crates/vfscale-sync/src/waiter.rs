//! One waiting task: a thread blocked on a condition variable, or a future's waker.
//!
//! A [`Waiter`] is the sleeping side of a wait that someone else ends: a wake-up (the
//! thing waited for happened, look again), an interrupt (the role of a signal), or the
//! waiter's own deadline. The same cell serves a thread that blocks ([`Waiter::wait`]),
//! a future that registers its waker ([`Waiter::poll`]), and a driver that only asks.
//! Its user may keep state of its own under the waiter's lock (`T`), so that deciding
//! to sleep and being told why the sleep ended happen under one lock.
//!
//! # Rules
//!
//! * `woken`, `interrupted`, the waker and the user's `T` are protected by the waiter's
//!   state lock, a leaf lock: nothing is taken while it is held, and the waker is
//!   called, and the condition variable notified, after it is dropped.
//! * A wake-up stays until [`Waiter::rearm`] clears it (before the waiter registers
//!   again); an interrupt stays for good.
//! * When both arrived before the waiter looked, its [`Precedence`] says which ends the
//!   wait.

use std::fmt;
use std::task::Waker;
use std::time::Instant;

use crate::{Arc, Condvar, Mutex, MutexGuard};

/// What ended a wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitOutcome {
    /// Woken: what it waited for may have happened, so look again.
    Woken,
    /// Interrupted: give up.
    Interrupted,
    /// The deadline passed first.
    TimedOut,
}

/// Which ends a wait when a wake-up and an interrupt both arrived before the waiter
/// looked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precedence {
    /// The wake-up: the waiter looks again first, as `wait_event_interruptible` tests
    /// its condition before it checks for a signal.
    WakeUp,
    /// The interrupt: the waiter gives up at once.
    Interrupt,
}

/// The state behind a waiter's lock: how the wait ended so far, and the user's `T`.
#[derive(Debug, Default)]
struct WaitState<T> {
    woken: bool,
    interrupted: bool,
    /// The task to wake, for a waiter that is a future.
    waker: Option<Waker>,
    data: T,
}

/// One waiting task (see the module's rules), with state `T` of its user's under the
/// same lock.
pub struct Waiter<T = ()> {
    state: Mutex<WaitState<T>>,
    cv: Condvar,
    precedence: Precedence,
    /// A mirror of `woken || interrupted`, set before the condition variable is
    /// notified: a thread may spin on it briefly before it sleeps.
    #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
    ready: std::sync::atomic::AtomicBool,
}

impl<T: fmt::Debug> fmt::Debug for Waiter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waiter")
            .field("state", &self.state)
            .field("precedence", &self.precedence)
            .finish()
    }
}

impl<T> Waiter<T> {
    /// A waiter not yet woken, with the user's state `data`.
    pub fn new(precedence: Precedence, data: T) -> Self {
        Waiter {
            state: Mutex::new(WaitState {
                woken: false,
                interrupted: false,
                waker: None,
                data,
            }),
            cv: Condvar::new(),
            precedence,
            #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
            ready: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Locks the waiter's state: the user's `T`, and a sleep that decides under the
    /// same lock ([`WaitGuard::wait`]).
    pub fn lock(&self) -> WaitGuard<'_, T> {
        WaitGuard {
            waiter: self,
            state: self.state.lock(),
        }
    }

    /// Marks the wait woken and wakes the waiter.
    pub fn wake(&self) {
        self.end(false);
    }

    /// Marks the wait interrupted and wakes the waiter.
    pub fn interrupt(&self) {
        self.end(true);
    }

    fn end(&self, interrupt: bool) {
        let waker = {
            let mut st = self.state.lock();
            if interrupt {
                st.interrupted = true;
            } else {
                st.woken = true;
            }
            self.set_ready(true);
            st.waker.take()
        };
        self.cv.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }

    fn set_ready(&self, ready: bool) {
        #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
        self.ready.store(ready, std::sync::atomic::Ordering::Release);
        #[cfg(any(vfscale_loom, vfscale_shuttle))]
        let _ = ready;
    }

    /// Clears a wake-up before the waiter registers again (an interrupt stays).
    pub fn rearm(&self) {
        self.lock().rearm();
    }

    /// Whether a wake-up arrived (and was not cleared since).
    pub fn is_woken(&self) -> bool {
        self.state.lock().woken
    }

    /// Blocks until woken, interrupted or past `deadline`.
    pub fn wait(&self, deadline: Option<Instant>) -> WaitOutcome {
        self.lock().wait(deadline)
    }

    /// As [`Waiter::wait`], first spinning up to `spins` turns for a wake-up that is
    /// about to come: cheaper than a sleep and a wake-up when the wait is short. Under
    /// loom and shuttle it does not spin.
    pub fn spin_then_wait(&self, spins: u32, deadline: Option<Instant>) -> WaitOutcome {
        #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
        for i in 0..spins {
            if self.ready.load(std::sync::atomic::Ordering::Acquire) {
                break;
            }
            if i % 64 == 63 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        #[cfg(any(vfscale_loom, vfscale_shuttle))]
        let _ = spins;
        self.wait(deadline)
    }

    /// Without blocking: how the wait ended, or `None` while it goes on, registering
    /// `waker` (if any) to be woken when it ends.
    pub fn poll(&self, waker: Option<&Waker>) -> Option<WaitOutcome> {
        let mut g = self.lock();
        if let Some(out) = g.ended() {
            return Some(out);
        }
        if let Some(w) = waker {
            match &g.state.waker {
                Some(old) if old.will_wake(w) => {}
                _ => g.state.waker = Some(w.clone()),
            }
        }
        None
    }
}

/// The locked state of a [`Waiter`]: the user's `T` (through `Deref`), and a sleep that
/// releases the lock while it sleeps.
pub struct WaitGuard<'a, T> {
    waiter: &'a Waiter<T>,
    state: MutexGuard<'a, WaitState<T>>,
}

impl<T> WaitGuard<'_, T> {
    /// Whether a wake-up arrived (and was not cleared since).
    pub fn woken(&self) -> bool {
        self.state.woken
    }

    /// Whether the wait was interrupted.
    pub fn interrupted(&self) -> bool {
        self.state.interrupted
    }

    /// Clears a wake-up (an interrupt stays).
    pub fn rearm(&mut self) {
        self.state.woken = false;
        self.waiter.set_ready(self.state.interrupted);
    }

    /// How the wait ended, by the waiter's precedence, or `None` while it goes on.
    fn ended(&self) -> Option<WaitOutcome> {
        let (woken, interrupted) = (self.state.woken, self.state.interrupted);
        match self.waiter.precedence {
            Precedence::WakeUp if woken => Some(WaitOutcome::Woken),
            _ if interrupted => Some(WaitOutcome::Interrupted),
            _ if woken => Some(WaitOutcome::Woken),
            _ => None,
        }
    }

    /// Sleeps, with the lock released, until woken, interrupted or past `deadline`.
    /// A wake-up seen as the deadline passes still counts.
    pub fn wait(&mut self, deadline: Option<Instant>) -> WaitOutcome {
        loop {
            if let Some(out) = self.ended() {
                return out;
            }
            if !self.sleep(deadline) {
                return if self.state.woken {
                    WaitOutcome::Woken
                } else {
                    WaitOutcome::TimedOut
                };
            }
        }
    }

    /// Sleeps once, with the lock released, until a wake-up, an interrupt or `deadline`
    /// (or spuriously); returns false when the deadline passed. For a wait on the user's
    /// `T`, which its writer follows with a wake-up.
    pub fn sleep(&mut self, deadline: Option<Instant>) -> bool {
        self.waiter.cv.wait_until(&mut self.state, deadline)
    }
}

impl<T> std::ops::Deref for WaitGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.state.data
    }
}

impl<T> std::ops::DerefMut for WaitGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.state.data
    }
}

/// Something an [`Interrupter`] can interrupt: a [`Waiter`], or a user's cell that holds
/// one.
pub trait Interrupt: Send + Sync + 'static {
    /// Ends the wait as interrupted.
    fn interrupt(&self);
}

impl<T: Send + 'static> Interrupt for Waiter<T> {
    fn interrupt(&self) {
        Waiter::interrupt(self);
    }
}

/// Ends a wait from anywhere, as a signal does; it has no effect once the wait ended.
#[derive(Clone)]
pub struct Interrupter {
    target: std::sync::Arc<dyn Interrupt>,
}

impl fmt::Debug for Interrupter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Interrupter")
    }
}

/// Under loom, `Arc` is loom's, which cannot become an `Arc<dyn Interrupt>`: the
/// interrupter holds it behind one more pointer.
#[cfg(vfscale_loom)]
struct Shared<I>(Arc<I>);

#[cfg(vfscale_loom)]
impl<I: Interrupt> Interrupt for Shared<I> {
    fn interrupt(&self) {
        self.0.interrupt();
    }
}

impl Interrupter {
    /// An interrupter of `target`'s wait.
    pub fn new<I: Interrupt>(target: &Arc<I>) -> Interrupter {
        #[cfg(vfscale_loom)]
        let target: std::sync::Arc<dyn Interrupt> = std::sync::Arc::new(Shared(target.clone()));
        #[cfg(not(vfscale_loom))]
        let target: std::sync::Arc<dyn Interrupt> = target.clone();
        Interrupter { target }
    }

    /// Interrupts the wait: it ends with [`WaitOutcome::Interrupted`] unless it already
    /// ended.
    pub fn interrupt(&self) {
        self.target.interrupt();
    }
}
