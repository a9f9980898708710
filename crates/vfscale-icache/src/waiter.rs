//! One waiting task and how its wait ends: the [`Waiter`] a lookup blocks on (a thread on a
//! condition variable, or a future's waker), the [`WaitOutcome`] it reports, and the
//! public [`Interrupter`] that ends it from anywhere. Nothing else lives here: the rest
//! of the crate uses the three through this module only.

use std::sync::Arc;
use std::task::Waker;
use std::time::Instant;

use crate::sync::{Condvar, Mutex};

/// How a wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitOutcome {
    /// The state it waited for changed ([`Waiter::wake`]).
    Woken,
    /// An [`Interrupter`] ended it.
    Interrupted,
    /// Its deadline passed.
    TimedOut,
}

#[derive(Debug, Default)]
struct WaiterState {
    woken: bool,
    interrupted: bool,
    waker: Option<Waker>,
}

/// One waiting task: a thread blocked on the condition variable, or a future's waker.
#[derive(Debug, Default)]
pub(crate) struct Waiter {
    st: Mutex<WaiterState>,
    cv: Condvar,
    /// A mirror of `woken || interrupted`, set before the condition variable is
    /// notified: a blocking waiter spins on it briefly before it sleeps.
    #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
    ready: std::sync::atomic::AtomicBool,
}

/// How long a blocking waiter spins before it sleeps: a load (`I_NEW`) in a cache-hot
/// filesystem lasts well under a microsecond, far less than a sleep and a wake-up.
#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
const SPINS: u32 = 4096;

impl Waiter {
    pub(crate) fn new() -> Arc<Waiter> {
        Arc::new(Waiter::default())
    }

    /// Arms the waiter before it registers again.
    pub(crate) fn rearm(&self) {
        let s = &mut *self.st.lock();
        s.woken = false;
        #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
        self.ready
            .store(s.interrupted, std::sync::atomic::Ordering::Relaxed);
    }

    fn set_ready(&self) {
        #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
        self.ready.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Ends the wait: the state it waited for changed.
    pub(crate) fn wake(&self) {
        self.notify(false);
    }

    /// Ends the wait with [`WaitOutcome::Interrupted`].
    pub(crate) fn interrupt(&self) {
        self.notify(true);
    }

    fn notify(&self, interrupt: bool) {
        let w = {
            let mut s = self.st.lock();
            if interrupt {
                s.interrupted = true;
            } else {
                s.woken = true;
            }
            self.set_ready();
            s.waker.take()
        };
        self.cv.notify_all();
        if let Some(w) = w {
            w.wake();
        }
    }

    /// Blocks until woken, interrupted or past `deadline`.
    pub(crate) fn wait(&self, deadline: Option<Instant>) -> WaitOutcome {
        #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
        for i in 0..SPINS {
            if self.ready.load(std::sync::atomic::Ordering::Acquire) {
                break;
            }
            if i % 64 == 63 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        let mut s = self.st.lock();
        loop {
            if s.interrupted {
                return WaitOutcome::Interrupted;
            }
            if s.woken {
                return WaitOutcome::Woken;
            }
            if !self.cv.wait_until(&mut s, deadline) {
                return if s.woken {
                    WaitOutcome::Woken
                } else {
                    WaitOutcome::TimedOut
                };
            }
        }
    }

    /// Without blocking; registers `waker` (if any) when still waiting.
    pub(crate) fn poll(&self, waker: Option<&Waker>) -> Option<WaitOutcome> {
        let mut s = self.st.lock();
        if s.interrupted {
            return Some(WaitOutcome::Interrupted);
        }
        if s.woken {
            return Some(WaitOutcome::Woken);
        }
        if let Some(w) = waker {
            s.waker = Some(w.clone());
        }
        None
    }
}

/// Ends an [`InodeWait`](crate::InodeWait) with
/// [`WaitError::Interrupted`](crate::WaitError::Interrupted) from anywhere (the role of a
/// fatal signal).
#[derive(Clone, Debug)]
pub struct Interrupter {
    waiter: Arc<Waiter>,
}

impl Interrupter {
    /// A handle that interrupts `waiter`'s wait.
    pub(crate) fn new(waiter: &Arc<Waiter>) -> Self {
        Interrupter {
            waiter: waiter.clone(),
        }
    }

    /// Interrupts the wait (no effect once it finished).
    pub fn interrupt(&self) {
        self.waiter.interrupt();
    }
}
