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

    struct SendBox(*mut (dyn FnOnce() + Send));
    // SAFETY: the closure inside is `Send`; the raw pointer only hides its lifetime.
    unsafe impl Send for SendBox {}

    impl Domain {
        pub(crate) fn new() -> Self {
            Domain
        }
        pub(crate) fn pin(&self) -> Guard {
            Guard(crossbeam_epoch::pin())
        }
    }

    impl Guard {
        /// Runs `f` once every thread pinned now has unpinned.
        ///
        /// # Safety
        /// `f` may run on another thread, after this function returns, and must stay
        /// sound to run then (it typically frees memory that readers may still hold).
        pub(crate) unsafe fn defer(&self, f: Box<dyn FnOnce() + Send + '_>) {
            // SAFETY: the caller vouches that running `f` later is sound; the lifetime is
            // erased only to satisfy crossbeam's `'static` bound on stored closures.
            let f: Box<dyn FnOnce() + Send + 'static> = unsafe { std::mem::transmute(f) };
            let b = SendBox(Box::into_raw(f));
            // SAFETY: `defer_unchecked` runs the closure once; the box is rebuilt from the
            // pointer `into_raw` gave.
            unsafe {
                self.0.defer_unchecked(move || {
                    let b = b;
                    let f = Box::from_raw(b.0);
                    f()
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

    impl Drop for Guard {
        fn drop(&mut self) {
            if self.0.readers.fetch_sub(1, Ordering::SeqCst) == 1 {
                self.0.collect();
            }
        }
    }

    pub(crate) fn flush() {}
}

pub(crate) use imp::{flush, Domain};
