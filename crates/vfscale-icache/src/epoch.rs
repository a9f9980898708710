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

    struct SendPtr<T>(*mut T);
    // SAFETY: the pointee is `Send`; the pointer only carries it to the thread that frees it.
    unsafe impl<T: Send> Send for SendPtr<T> {}

    impl Guard {
        /// Frees the box `p` once every thread pinned now has unpinned: a deferred free
        /// without boxing a closure (crossbeam stores the one-word closure inline), so an
        /// eviction costs no allocation of its own.
        ///
        /// # Safety
        /// `p` came from `Box::into_raw`/`Box::leak`, nobody frees it otherwise, and it is
        /// sound to drop the box on another thread after this returns.
        pub(crate) unsafe fn defer_free_box<T: Send>(&self, p: *mut T) {
            let p = SendPtr(p);
            // SAFETY: run once, after every current pin ended; by the caller's contract the
            // box is ours to drop then.
            unsafe {
                self.0.defer_unchecked(move || {
                    let p = p;
                    drop(Box::from_raw(p.0));
                })
            };
        }
    }

    /// Hurries deferred frees (best effort, for tests that count drops).
    pub(crate) fn flush() {
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
