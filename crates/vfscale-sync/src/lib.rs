//! The one place that knows which synchronization primitives vfscale runs on; each crate
//! imports from here (through its own `sync` module) and does not know which it got.
//!
//! * normal builds: `parking_lot` mutexes and condition variables, `std` atomics;
//! * `--cfg vfscale_loom`: loom's, so the loom models explore every interleaving;
//! * `--cfg vfscale_shuttle`: shuttle's, for randomized whole-scenario schedules.
//!
//! Built on them, the pieces more than one crate needs: [`Waiter`] (one waiting task,
//! thread or future, that a wake-up, an [`Interrupter`] or a deadline ends; `waiter.rs`)
//! and [`DispatchGate`] (which threads of a pool read one shared queue; `gate.rs`).
//!
//! Deadlines are real time and cannot be modelled: under loom and shuttle a timed wait
//! is an untimed one.

#![warn(missing_docs)]

use std::ops::{Deref, DerefMut};
use std::time::Instant;

#[cfg(vfscale_loom)]
mod imp {
    pub use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub use loom::sync::Arc;
    pub(crate) type RawMutex<T> = loom::sync::Mutex<T>;
    pub(crate) type RawGuard<'a, T> = loom::sync::MutexGuard<'a, T>;
    pub(crate) type RawCondvar = loom::sync::Condvar;
}

#[cfg(all(vfscale_shuttle, not(vfscale_loom)))]
mod imp {
    pub use shuttle::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub use shuttle::sync::Arc;
    pub(crate) type RawMutex<T> = shuttle::sync::Mutex<T>;
    pub(crate) type RawGuard<'a, T> = shuttle::sync::MutexGuard<'a, T>;
    pub(crate) type RawCondvar = shuttle::sync::Condvar;
}

#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
mod imp {
    pub use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub use std::sync::Arc;
}

pub use imp::*;

mod gate;
pub use gate::DispatchGate;

mod waiter;
pub use waiter::{Interrupt, Interrupter, Precedence, WaitGuard, WaitOutcome, Waiter};

/// A mutex whose `lock` returns the guard directly on every backend.
#[derive(Debug, Default)]
pub struct Mutex<T> {
    #[cfg(any(vfscale_loom, vfscale_shuttle))]
    inner: RawMutex<T>,
    #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
    inner: parking_lot::Mutex<T>,
}

/// The guard of [`Mutex`].
pub struct MutexGuard<'a, T> {
    #[cfg(any(vfscale_loom, vfscale_shuttle))]
    inner: Option<RawGuard<'a, T>>,
    #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
    inner: parking_lot::MutexGuard<'a, T>,
}

impl<T> Mutex<T> {
    /// A new mutex around `v`.
    pub fn new(v: T) -> Self {
        Mutex {
            #[cfg(any(vfscale_loom, vfscale_shuttle))]
            inner: RawMutex::new(v),
            #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
            inner: parking_lot::Mutex::new(v),
        }
    }

    /// Locks the mutex; released when the guard drops.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        MutexGuard {
            #[cfg(any(vfscale_loom, vfscale_shuttle))]
            inner: Some(self.inner.lock().unwrap_or_else(|e| e.into_inner())),
            #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
            inner: self.inner.lock(),
        }
    }

    /// The value, through exclusive access (no locking needed).
    pub fn get_mut(&mut self) -> &mut T {
        #[cfg(any(vfscale_loom, vfscale_shuttle))]
        {
            self.inner.get_mut().unwrap_or_else(|e| e.into_inner())
        }
        #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
        {
            self.inner.get_mut()
        }
    }

    /// Whether some thread holds the mutex (for `debug_assert!`s of lock rules; always
    /// true under loom and shuttle, which cannot ask).
    pub fn is_locked(&self) -> bool {
        #[cfg(any(vfscale_loom, vfscale_shuttle))]
        {
            true
        }
        #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
        {
            self.inner.is_locked()
        }
    }
}

impl<T> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        #[cfg(any(vfscale_loom, vfscale_shuttle))]
        {
            self.inner.as_ref().expect("guard present outside a wait")
        }
        #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
        {
            &self.inner
        }
    }
}

impl<T> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        #[cfg(any(vfscale_loom, vfscale_shuttle))]
        {
            self.inner.as_mut().expect("guard present outside a wait")
        }
        #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
        {
            &mut self.inner
        }
    }
}

/// A condition variable that pairs with [`Mutex`].
#[derive(Debug, Default)]
pub struct Condvar {
    #[cfg(any(vfscale_loom, vfscale_shuttle))]
    inner: RawCondvar,
    #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
    inner: parking_lot::Condvar,
}

impl Condvar {
    /// A new condition variable.
    pub fn new() -> Self {
        Condvar {
            #[cfg(any(vfscale_loom, vfscale_shuttle))]
            inner: RawCondvar::new(),
            #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
            inner: parking_lot::Condvar::new(),
        }
    }

    /// Releases the guard's mutex, waits for a notification (or `deadline`), and takes
    /// the mutex again. Returns false when the deadline passed.
    pub fn wait_until<T>(&self, guard: &mut MutexGuard<'_, T>, deadline: Option<Instant>) -> bool {
        #[cfg(any(vfscale_loom, vfscale_shuttle))]
        {
            let _ = deadline;
            let g = guard.inner.take().expect("guard present");
            guard.inner = Some(self.inner.wait(g).unwrap_or_else(|e| e.into_inner()));
            true
        }
        #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
        {
            match deadline {
                Some(d) => !self.inner.wait_until(&mut guard.inner, d).timed_out(),
                None => {
                    self.inner.wait(&mut guard.inner);
                    true
                }
            }
        }
    }

    /// Wakes every waiter.
    pub fn notify_all(&self) {
        self.inner.notify_all();
    }
}

/// One turn of a retry loop that waits for another thread's write: a spin hint normally;
/// under loom and shuttle a yield, so that the scheduler lets the writer run (without it
/// a model may re-read a stale value for ever and abort the execution).
#[inline]
pub fn spin_hint() {
    #[cfg(vfscale_loom)]
    loom::thread::yield_now();
    #[cfg(all(vfscale_shuttle, not(vfscale_loom)))]
    shuttle::thread::yield_now();
    #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
    std::hint::spin_loop();
}

/// The CPU this thread runs on, to pick a listing shard (0 under the models).
pub fn current_cpu() -> usize {
    #[cfg(any(vfscale_loom, vfscale_shuttle))]
    {
        0
    }
    #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
    {
        // SAFETY: sched_getcpu takes no arguments and only reads the CPU number.
        let c = unsafe { libc::sched_getcpu() };
        if c < 0 {
            0
        } else {
            c as usize
        }
    }
}
