//! The one place that knows which synchronization primitives the crate runs on.
//!
//! * normal builds: `parking_lot` mutexes, `std` atomics, and `crossbeam-epoch` for
//!   deferred reclamation (see [`crate::epoch`]);
//! * `--cfg vfscale_loom`: loom's atomics and mutex, so the loom models explore every
//!   interleaving of the table's own atomics;
//! * `--cfg vfscale_shuttle`: shuttle's, for randomized whole-scenario schedules.
//!
//! Every other module imports from here and does not know which one it got.

#![allow(dead_code, unused_imports)]

use std::ops::{Deref, DerefMut};

#[cfg(vfscale_loom)]
mod imp {
    pub use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub type RawMutex<T> = loom::sync::Mutex<T>;
    pub type RawGuard<'a, T> = loom::sync::MutexGuard<'a, T>;
}

#[cfg(all(vfscale_shuttle, not(vfscale_loom)))]
mod imp {
    pub use shuttle::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub type RawMutex<T> = shuttle::sync::Mutex<T>;
    pub type RawGuard<'a, T> = shuttle::sync::MutexGuard<'a, T>;
}

#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
mod imp {
    pub use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
}

pub use imp::*;

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
    inner: RawGuard<'a, T>,
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
            inner: self.inner.lock().unwrap_or_else(|e| e.into_inner()),
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
}

impl<T> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}
