//! Deferred freeing of inodes: what RCU (`i_callback`/`free_inode`) is to `fs/inode.c`.
//!
//! A lock-free lookup walks a hash chain while an evictor may unlink and destroy the inodes
//! on it; the memory of a destroyed inode is freed only once every walker that could have
//! loaded its pointer has unpinned.
//!
//! * Normal builds: `crossbeam-epoch`; pinning writes only the calling thread's own
//!   epoch record, never a shared cache line.
//! * `--cfg vfscale_loom`/`vfscale_shuttle`: a model the schedulers can see (a reader
//!   count per cache and a garbage list run when a collector observes no reader). It writes
//!   a shared counter on every pin, so it is for the models only.

#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
mod imp {
    /// The reclamation domain (crossbeam's global collector: nothing per cache).
    #[derive(Debug, Default)]
    pub(crate) struct Domain;

    /// A pinned section (`rcu_read_lock`).
    pub(crate) struct Guard(crossbeam_epoch::Guard);

    impl Domain {
        pub(crate) fn new() -> Self {
            Domain
        }
        pub(crate) fn pin(&self) -> Guard {
            Guard(crossbeam_epoch::pin())
        }
    }

    /// A box to free: its address and the function that frees it as its type.
    type Retired = (*mut (), unsafe fn(*mut ()));

    /// Retired boxes, freed together once every thread pinned when they were handed to
    /// crossbeam has unpinned.
    struct Batch(Vec<Retired>);

    // SAFETY: each pointee is `Send` (`defer_free_box`'s bound); the batch only carries the
    // boxes to the thread that frees them.
    unsafe impl Send for Batch {}

    impl Batch {
        fn free(self) {
            for (p, f) in self.0 {
                // SAFETY: `f` is `free_box::<T>` for the `T` that `p` was leaked as, and the
                // grace period has passed (the only caller is the deferred function).
                unsafe { f(p) };
            }
        }
    }

    /// Boxes retired per thread before they are handed to crossbeam as one deferred
    /// function (what RCU's per-CPU callback lists are to `call_rcu`). Every 64 deferred
    /// functions crossbeam allocates a ~2 KB bag node, and a request that large (1 KB or
    /// more: glibc's large bins) makes glibc consolidate every fastbin chunk of the
    /// process inside the eviction that allocates it; at 60 a batch's own buffer (960
    /// bytes) is still a small-bin request, which never consolidates, and the bag node
    /// comes once per 3,840 evictions instead of 2,048 at 32.
    const BATCH: usize = 60;

    /// This thread's retired boxes not yet handed to crossbeam. On thread exit they are
    /// handed over (crossbeam registers a temporary participant if its own thread-local
    /// handle is already gone).
    struct Pending(std::cell::RefCell<Vec<Retired>>);

    impl Drop for Pending {
        fn drop(&mut self) {
            let v = std::mem::take(self.0.get_mut());
            submit(&crossbeam_epoch::pin(), v);
        }
    }

    thread_local!(static PENDING: Pending = const { Pending(std::cell::RefCell::new(Vec::new())) });

    /// Hands `v` to crossbeam: freed once every thread pinned now has unpinned.
    fn submit(g: &crossbeam_epoch::Guard, v: Vec<Retired>) {
        if v.is_empty() {
            return;
        }
        let b = Batch(v);
        // SAFETY: every box in `b` was retired (unreachable for new readers) before this
        // call, so a grace period from now is a grace period from each retirement.
        unsafe { g.defer_unchecked(move || b.free()) };
    }

    /// # Safety
    /// `p` came from `Box::<T>::into_raw`/`Box::leak` and nobody else frees it.
    unsafe fn free_box<T>(p: *mut ()) {
        // SAFETY: by the contract.
        drop(unsafe { Box::from_raw(p.cast::<T>()) });
    }

    impl Guard {
        /// Frees the box `p` once every thread pinned now has unpinned. Boxes are
        /// batched per thread ([`BATCH`] at a time, one crossbeam deferred function per
        /// batch): an eviction costs neither an allocation nor a crossbeam `defer` of its
        /// own (a deferred function per inode cost ~170 instructions, and every 64 of them
        /// a bag allocated and pushed onto crossbeam's global queue). Freeing a box later
        /// than its grace period is always safe: it was unreachable for new readers when
        /// retired, and a batch is handed over after its last box was retired.
        ///
        /// # Safety
        /// `p` came from `Box::into_raw`/`Box::leak`, nobody frees it otherwise, and it is
        /// sound to drop the box on another thread after this returns.
        pub(crate) unsafe fn defer_free_box<T: Send>(&self, p: *mut T) {
            let r: Retired = (p.cast::<()>(), free_box::<T>);
            // The batch is taken out of the cell before crossbeam gets it: a collection
            // run by `defer` may free inodes whose data's `Drop` retires more.
            let full = PENDING.try_with(|q| {
                let mut q = q.0.borrow_mut();
                if q.capacity() == 0 {
                    q.reserve_exact(BATCH);
                }
                q.push(r);
                (q.len() >= BATCH).then(|| std::mem::replace(&mut *q, Vec::with_capacity(BATCH)))
            });
            match full {
                Ok(Some(v)) => submit(&self.0, v),
                Ok(None) => {}
                // This thread's batch is being destroyed (thread exit): defer alone.
                Err(_) => submit(&self.0, vec![r]),
            }
        }
    }

    /// Hands this thread's pending batch to crossbeam.
    fn submit_pending() {
        if let Ok(Some(v)) = PENDING.try_with(|q| {
            let mut q = q.0.borrow_mut();
            (!q.is_empty()).then(|| std::mem::take(&mut *q))
        }) {
            submit(&crossbeam_epoch::pin(), v);
        }
    }

    /// Hurries deferred frees (best effort, for tests that count drops).
    pub(crate) fn flush() {
        submit_pending();
        for _ in 0..256 {
            crossbeam_epoch::pin().flush();
        }
    }
}

#[cfg(any(vfscale_loom, vfscale_shuttle))]
mod imp {
    use std::sync::Arc;

    use crate::sync::{AtomicUsize, Mutex, Ordering};

    type Garbage = Box<dyn FnOnce() + Send>;

    struct Inner {
        readers: AtomicUsize,
        garbage: Mutex<Vec<Garbage>>,
    }

    /// The model domain: a reader count and a garbage list (shared with every guard, so
    /// a deferred free that drops the cache cannot free the domain under a collector).
    pub(crate) struct Domain(Arc<Inner>);

    impl std::fmt::Debug for Domain {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Domain")
        }
    }

    /// A pinned section of the model.
    pub(crate) struct Guard(Arc<Inner>);

    impl Domain {
        pub(crate) fn new() -> Self {
            Domain(Arc::new(Inner {
                readers: AtomicUsize::new(0),
                garbage: Mutex::new(Vec::new()),
            }))
        }

        pub(crate) fn pin(&self) -> Guard {
            // SeqCst RMW: a collector's later RMW reads it and keeps the garbage.
            self.0.readers.fetch_add(1, Ordering::SeqCst);
            Guard(self.0.clone())
        }
    }

    impl Inner {
        fn collect(&self) {
            let ready = {
                let mut g = self.garbage.lock();
                if self.readers.fetch_add(0, Ordering::SeqCst) == 0 {
                    std::mem::take(&mut *g)
                } else {
                    Vec::new()
                }
            };
            for f in ready {
                f();
            }
        }
    }

    impl Drop for Inner {
        fn drop(&mut self) {
            for f in std::mem::take(self.garbage.get_mut()) {
                f();
            }
        }
    }

    impl Guard {
        /// # Safety
        /// As the crossbeam version: `f` must stay sound to run after every reader left.
        pub(crate) unsafe fn defer(&self, f: Box<dyn FnOnce() + Send + '_>) {
            // SAFETY: see the caller's contract.
            let f: Garbage = unsafe { std::mem::transmute(f) };
            self.0.garbage.lock().push(f);
        }
    }

    impl Guard {
        /// # Safety
        /// As the crossbeam version: `p` is a leaked box nobody else frees.
        pub(crate) unsafe fn defer_free_box<T: Send>(&self, p: *mut T) {
            struct SendPtr<T>(*mut T);
            // SAFETY: the pointee is `Send`.
            unsafe impl<T: Send> Send for SendPtr<T> {}
            let p = SendPtr(p);
            // SAFETY: by the caller's contract.
            unsafe {
                self.defer(Box::new(move || {
                    let p = p;
                    drop(Box::from_raw(p.0));
                }))
            };
        }
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            if self.0.readers.fetch_sub(1, Ordering::SeqCst) == 1 {
                self.0.collect();
            }
        }
    }

    pub(crate) fn flush() {}
}

pub(crate) use imp::{flush, Domain, Guard};
