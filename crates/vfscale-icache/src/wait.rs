//! Waiting on an inode: the `__I_NEW` bit waitqueue of `fs/inode.c`.
//!
//! Linux sleeps on a hashed table of wait queues keyed by the inode's address
//! (`inode_bit_waitqueue`), so an inode carries no wait queue of its own. So does this:
//! a waiter registers `(inode address, waiter)` in one of [`WAIT_BUCKETS`] buckets while it
//! holds the inode's `i_lock` and sets the inode's `WAITERS` bit; whoever changes the state
//! (clears `I_NEW`, or unhashes an inode being freed) clears that bit under `i_lock` and,
//! after dropping it, wakes every waiter registered for the address. A waiter that waits
//! for an eviction holds no reference and never touches the inode again: it only rescans.

use std::sync::Arc;
use std::task::Waker;
use std::time::Instant;

use crate::sync::{Condvar, Mutex};

/// Buckets of the wait table (a power of two).
pub(crate) const WAIT_BUCKETS: usize = 64;

/// How a wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitOutcome {
    Woken,
    Interrupted,
    TimedOut,
}

#[derive(Debug, Default)]
struct WState {
    woken: bool,
    interrupted: bool,
    waker: Option<Waker>,
}

/// One waiting task: a thread blocked on the condition variable, or a future's waker.
#[derive(Debug, Default)]
pub(crate) struct Waiter {
    st: Mutex<WState>,
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

    pub(crate) fn wake(&self) {
        let w = {
            let mut s = self.st.lock();
            s.woken = true;
            self.set_ready();
            s.waker.take()
        };
        self.cv.notify_all();
        if let Some(w) = w {
            w.wake();
        }
    }

    pub(crate) fn interrupt(&self) {
        let w = {
            let mut s = self.st.lock();
            s.interrupted = true;
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

type Entry = (usize, Arc<Waiter>);

/// The hashed wait queues (`bit_wait_table`).
pub(crate) struct WaitTable {
    buckets: Box<[Mutex<Vec<Entry>>]>,
}

impl std::fmt::Debug for WaitTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WaitTable")
    }
}

impl WaitTable {
    pub(crate) fn new() -> Self {
        WaitTable {
            buckets: (0..WAIT_BUCKETS).map(|_| Mutex::new(Vec::new())).collect(),
        }
    }

    fn bucket(&self, addr: usize) -> &Mutex<Vec<Entry>> {
        let h = (addr >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58;
        &self.buckets[h & (WAIT_BUCKETS - 1)]
    }

    /// Registers `w` for the inode at `addr`. The caller holds that inode's `i_lock` and
    /// sets its `WAITERS` bit, so the waker (which reads the bit under `i_lock`) cannot
    /// miss this entry.
    pub(crate) fn register(&self, addr: usize, w: &Arc<Waiter>) {
        self.bucket(addr).lock().push((addr, w.clone()));
    }

    /// Removes `w`'s entry for `addr`, if it is still there (an abandoned wait).
    pub(crate) fn cancel(&self, addr: usize, w: &Arc<Waiter>) {
        self.bucket(addr)
            .lock()
            .retain(|(a, x)| !(*a == addr && Arc::ptr_eq(x, w)));
    }

    /// Wakes every waiter registered for `addr`, after dropping the bucket lock.
    pub(crate) fn wake_all(&self, addr: usize) {
        let mut woken = Vec::new();
        {
            let mut b = self.bucket(addr).lock();
            let mut i = 0;
            while i < b.len() {
                if b[i].0 == addr {
                    woken.push(b.swap_remove(i).1);
                } else {
                    i += 1;
                }
            }
        }
        for w in woken {
            w.wake();
        }
    }
}
