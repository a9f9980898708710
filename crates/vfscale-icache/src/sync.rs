//! The synchronization primitives this crate runs on: `vfscale-sync`'s (parking_lot and
//! std normally, loom under `--cfg vfscale_loom`, shuttle under `--cfg vfscale_shuttle`),
//! plus the wait step of a spin loop (the hash chains' bit locks).

pub use vfscale_sync::*;

/// `atomic::fence` of the backend: loom models `fence(SeqCst)` exactly but treats `SeqCst`
/// loads, stores and read-modify-writes as `AcqRel` (its README), so a store-buffering
/// (Dekker) hand-off that loom must check is written with fences.
#[cfg(vfscale_loom)]
pub(crate) use loom::sync::atomic::fence;
#[cfg(all(vfscale_shuttle, not(vfscale_loom)))]
pub(crate) use shuttle::sync::atomic::fence;
#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
pub(crate) use std::sync::atomic::fence;

/// One step of waiting for a bit spinlock to be released: a short exponential spin with
/// `spin_loop`, then yielding the CPU (a userspace lock holder can be preempted, unlike
/// Linux's, which disables preemption). Under loom and shuttle: the scheduler's yield, so
/// the models see the spinning thread give way.
pub(crate) struct SpinWait {
    #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
    backoff: crossbeam_utils::Backoff,
}

impl SpinWait {
    pub(crate) fn new() -> Self {
        SpinWait {
            #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
            backoff: crossbeam_utils::Backoff::new(),
        }
    }

    pub(crate) fn wait(&self) {
        #[cfg(vfscale_loom)]
        loom::thread::yield_now();
        #[cfg(all(vfscale_shuttle, not(vfscale_loom)))]
        shuttle::thread::yield_now();
        #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
        self.backoff.snooze();
    }
}

/// The lock type of `i_lock`: a [`SpinLock`] in normal builds. Under loom and shuttle it
/// is the shim's mutex: a spin loop at every `i_lock` use multiplies the branches the
/// models explore past loom's limit (`iget_hit_races_last_iput_and_prune` hit it); the
/// spinlock itself has its own loom model (`loom_spinlock` below), and the models check
/// the cache's use of `i_lock` with a lock of the same contract (exclusion, Acquire on
/// taking, Release on dropping).
#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
pub(crate) type ILock = SpinLock;
/// A held [`ILock`].
#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
pub(crate) type ILockGuard<'a> = SpinGuard<'a>;

/// `i_lock` under the models: the shim's mutex.
#[cfg(any(vfscale_loom, vfscale_shuttle))]
#[derive(Debug, Default)]
pub(crate) struct ILock(Mutex<()>);
/// A held [`ILock`].
#[cfg(any(vfscale_loom, vfscale_shuttle))]
pub(crate) type ILockGuard<'a> = MutexGuard<'a, ()>;

#[cfg(any(vfscale_loom, vfscale_shuttle))]
impl ILock {
    pub(crate) fn new() -> Self {
        ILock(Mutex::new(()))
    }
    pub(crate) fn lock(&self) -> ILockGuard<'_> {
        self.0.lock()
    }
    pub(crate) fn is_locked(&self) -> bool {
        self.0.is_locked()
    }
}

/// A one-byte spinlock: what Linux's `spinlock_t` is to `i_lock`. Taking it is one
/// compare-exchange (Acquire); releasing it is a plain Release store, not a second locked
/// read-modify-write as a parking mutex's unlock is (a mutex must look for parked
/// waiters). Every hold of `i_lock` is a few loads and stores (and at most a wait-table
/// bucket lock), so a waiter spins read-only with [`SpinWait`] (backoff, then yielding:
/// a userspace holder can be preempted) instead of parking. Under loom and shuttle the
/// atomics are theirs and the wait yields (its model: `loom_spinlock`).
#[derive(Debug, Default)]
#[cfg_attr(any(vfscale_loom, vfscale_shuttle), allow(dead_code))]
pub(crate) struct SpinLock {
    locked: AtomicBool,
}

/// A held [`SpinLock`]; dropping it releases the lock.
#[must_use = "dropping the guard releases the lock at once"]
#[cfg_attr(any(vfscale_loom, vfscale_shuttle), allow(dead_code))]
pub(crate) struct SpinGuard<'a> {
    lock: &'a SpinLock,
}

#[cfg_attr(any(vfscale_loom, vfscale_shuttle), allow(dead_code))]
impl SpinLock {
    pub(crate) fn new() -> Self {
        SpinLock {
            locked: AtomicBool::new(false),
        }
    }

    #[inline]
    pub(crate) fn lock(&self) -> SpinGuard<'_> {
        if self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_slow();
        }
        SpinGuard { lock: self }
    }

    #[cold]
    fn lock_slow(&self) {
        let w = SpinWait::new();
        loop {
            // Wait reading (no writes to the holder's line), then try again.
            while self.locked.load(Ordering::Relaxed) {
                w.wait();
            }
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }

    /// Whether someone holds it (for `debug_assert!`s).
    pub(crate) fn is_locked(&self) -> bool {
        self.locked.load(Ordering::Relaxed)
    }
}

impl Drop for SpinGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        debug_assert!(self.lock.is_locked(), "a spinlock released twice");
        self.lock.locked.store(false, Ordering::Release);
    }
}

/// The lock type of the superblock list shards (`s_inode_list_lock`) and the LRU shards
/// (`list_lru_one`'s lock): a [`SpinMutex`] in normal builds, as both are `spinlock_t` in
/// Linux. A parking mutex's unlock is a second locked read-modify-write (it must look for
/// parked waiters); these locks are taken once or twice per create, load and eviction
/// and held for a few stores each (a list walk of `evict_inodes`, `for_each_inode` or a
/// prune at most, where a waiter backs off and yields). Under loom and shuttle: the
/// shim's mutex, as for `i_lock` (see [`ILock`]).
#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
pub(crate) type ShardMutex<T> = SpinMutex<T>;
/// A held [`ShardMutex`].
#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
pub(crate) type ShardGuard<'a, T> = SpinMutexGuard<'a, T>;
/// The shard locks under the models: the shim's mutex.
#[cfg(any(vfscale_loom, vfscale_shuttle))]
pub(crate) type ShardMutex<T> = Mutex<T>;
/// A held [`ShardMutex`].
#[cfg(any(vfscale_loom, vfscale_shuttle))]
pub(crate) type ShardGuard<'a, T> = MutexGuard<'a, T>;

/// A [`SpinLock`] with the data it protects. Its ordering is the spinlock's (Acquire on
/// taking, Release on dropping; `loom_spinlock` models it); the data is reached only
/// through the guard.
#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
pub(crate) struct SpinMutex<T> {
    lock: SpinLock,
    data: std::cell::UnsafeCell<T>,
}

// SAFETY: the data moves with the mutex (`T: Send`).
#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
unsafe impl<T: Send> Send for SpinMutex<T> {}
// SAFETY: `&SpinMutex` gives `&mut T` only to the one holder of the lock, so sharing it
// across threads only moves access to `T` between threads (`T: Send`), as `Mutex` does.
#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
unsafe impl<T: Send> Sync for SpinMutex<T> {}

/// A held [`SpinMutex`]: access to its data until dropped.
#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
#[must_use = "dropping the guard releases the lock at once"]
pub(crate) struct SpinMutexGuard<'a, T> {
    m: &'a SpinMutex<T>,
    _g: SpinGuard<'a>,
}

#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
impl<T> SpinMutex<T> {
    pub(crate) fn new(v: T) -> Self {
        SpinMutex {
            lock: SpinLock::new(),
            data: std::cell::UnsafeCell::new(v),
        }
    }

    #[inline]
    pub(crate) fn lock(&self) -> SpinMutexGuard<'_, T> {
        let g = self.lock.lock();
        SpinMutexGuard { m: self, _g: g }
    }
}

#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
impl<T> std::ops::Deref for SpinMutexGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock: no `&mut T` exists elsewhere.
        unsafe { &*self.m.data.get() }
    }
}

#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
impl<T> std::ops::DerefMut for SpinMutexGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock, and `&mut self` makes this the only access.
        unsafe { &mut *self.m.data.get() }
    }
}

#[cfg(all(test, vfscale_loom))]
mod loom_spinlock {
    use super::*;

    /// Two lockers of one `SpinLock` exclude each other: their plain (cell) accesses under
    /// it are ordered (loom reports a race otherwise) and both increments land.
    #[test]
    fn two_lockers_exclude_each_other() {
        loom::model(|| {
            let l = loom::sync::Arc::new(SpinLock::new());
            // loom runs its threads on one OS thread (its spawn needs no `Send`).
            #[allow(clippy::arc_with_non_send_sync)]
            let c = loom::sync::Arc::new(loom::cell::UnsafeCell::new(0u32));
            let (l2, c2) = (l.clone(), c.clone());
            let t = loom::thread::spawn(move || {
                let _g = l2.lock();
                // SAFETY: under the lock (what the model checks).
                c2.with_mut(|p| unsafe { *p += 1 });
            });
            {
                let _g = l.lock();
                // SAFETY: as above.
                c.with_mut(|p| unsafe { *p += 1 });
            }
            t.join().unwrap();
            assert!(!l.is_locked());
            // SAFETY: both threads are done.
            assert_eq!(c.with(|p| unsafe { *p }), 2);
        });
    }
}
