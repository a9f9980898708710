//! The request queue's freeze (`blk_mq_freeze_queue`): I/O enters and leaves through a
//! sharded in-flight count without taking any lock; a configuration change sets
//! `frozen`, waits for the count to drain, changes the I/O configuration and unfreezes.
//!
//! The Dekker pair: `enter` increments its shard and then reads `frozen`; `freeze`
//! sets `frozen` and then reads the shards, both `SeqCst`. So either the I/O sees
//! `frozen` (and backs out to wait), or the freezer sees its count (and waits for its
//! `exit`). `exit` decrements and, when `frozen` is set, wakes the freezer under `wait`
//! (the freezer checks the count under `wait` too, so the wake-up cannot be lost).
//!
//! The configuration (`IoConfig`) is reached through an `AtomicPtr` that is replaced
//! only while the queue is frozen and drained; the old value is freed then, when no
//! I/O can hold it.

use crate::sync::{current_cpu, AtomicPtr, AtomicU32, AtomicUsize, Condvar, Mutex, Ordering};

const SHARDS: usize = if cfg!(any(vfscale_loom, vfscale_shuttle)) {
    2
} else {
    8
};

#[repr(align(128))]
#[derive(Default)]
struct Count(AtomicUsize);

/// A queue carrying a configuration `T` that only changes while frozen.
pub(crate) struct Queue<T> {
    frozen: AtomicU32,
    inflight: Box<[Count]>,
    wait: Mutex<()>,
    cv: Condvar,
    cfg: AtomicPtr<T>,
    _own: std::marker::PhantomData<Box<T>>,
}

/// An I/O inside the queue: the configuration stays put until it drops.
pub(crate) struct Entered<'a, T> {
    q: &'a Queue<T>,
    shard: usize,
}

impl<T> Queue<T> {
    pub(crate) fn new(cfg: Option<Box<T>>) -> Queue<T> {
        Queue {
            frozen: AtomicU32::new(0),
            inflight: (0..SHARDS).map(|_| Count::default()).collect(),
            wait: Mutex::new(()),
            cv: Condvar::new(),
            cfg: AtomicPtr::new(cfg.map_or(std::ptr::null_mut(), Box::into_raw)),
            _own: std::marker::PhantomData,
        }
    }

    /// Enters the queue, waiting while it is frozen.
    pub(crate) fn enter(&self) -> Entered<'_, T> {
        let shard = current_cpu() % SHARDS;
        loop {
            self.inflight[shard].0.fetch_add(1, Ordering::SeqCst);
            if self.frozen.load(Ordering::SeqCst) == 0 {
                return Entered { q: self, shard };
            }
            self.leave(shard);
            let mut g = self.wait.lock();
            while self.frozen.load(Ordering::SeqCst) != 0 {
                self.cv.wait_until(&mut g, None);
            }
        }
    }

    fn leave(&self, shard: usize) {
        self.inflight[shard].0.fetch_sub(1, Ordering::SeqCst);
        if self.frozen.load(Ordering::SeqCst) != 0 {
            let _g = self.wait.lock();
            self.cv.notify_all();
        }
    }

    fn drained(&self) -> bool {
        self.inflight.iter().all(|c| c.0.load(Ordering::SeqCst) == 0)
    }

    /// Holds new I/O back and waits for I/O in flight to finish. Callers serialize
    /// freezes of one queue (the device lock, or the rundown state).
    pub(crate) fn freeze(&self) {
        self.frozen.fetch_add(1, Ordering::SeqCst);
        let mut g = self.wait.lock();
        while !self.drained() {
            self.cv.wait_until(&mut g, None);
        }
    }

    /// Lets I/O in again.
    pub(crate) fn unfreeze(&self) {
        self.frozen.fetch_sub(1, Ordering::SeqCst);
        let _g = self.wait.lock();
        self.cv.notify_all();
    }

    /// Replaces the configuration; returns the old one. Only while frozen.
    pub(crate) fn replace(&self, cfg: Option<Box<T>>) -> Option<Box<T>> {
        debug_assert!(self.frozen.load(Ordering::SeqCst) != 0 && self.drained());
        let old = self
            .cfg
            .swap(cfg.map_or(std::ptr::null_mut(), Box::into_raw), Ordering::AcqRel);
        if old.is_null() {
            None
        } else {
            // SAFETY: every non-null pointer stored here came from Box::into_raw, and the
            // queue is frozen and drained, so no Entered guard can be reading it.
            Some(unsafe { Box::from_raw(old) })
        }
    }
}

impl<T> Entered<'_, T> {
    /// The configuration this I/O runs with.
    pub(crate) fn cfg(&self) -> Option<&T> {
        let p = self.q.cfg.load(Ordering::Acquire);
        // SAFETY: replace() runs only once every Entered guard has dropped, so the
        // pointer is null or a live Box for the life of self.
        unsafe { p.as_ref() }
    }
}

impl<T> Drop for Entered<'_, T> {
    fn drop(&mut self) {
        self.q.leave(self.shard);
    }
}

impl<T> Drop for Queue<T> {
    fn drop(&mut self) {
        let p = self.cfg.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: the queue is being dropped, so nobody can enter it; the pointer
            // came from Box::into_raw.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}
