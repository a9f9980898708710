//! Deferred reclamation: what RCU is to `fs/file.c`.
//!
//! Two things are freed while lock-free readers may still hold a pointer to them: a table
//! replaced by a resize (`free_fdtable_rcu` in Linux) and the allocation of a file that
//! was closed (Linux frees `struct file` `SLAB_TYPESAFE_BY_RCU` and readers use
//! `atomic_long_inc_not_zero`; here the slot's weak reference keeps the `Arc`'s allocation,
//! readers upgrade it, an increment-if-not-zero of the strong count, and the weak
//! reference is dropped only after every reader that could have seen the pointer is done).
//!
//! * Normal builds use `crossbeam-epoch`: [`Domain::pin`] is `crossbeam_epoch::pin()`,
//!   which writes only the calling thread's own epoch slot (plus a `SeqCst` fence), never a
//!   shared cache line; retired tables go through `Guard::defer_destroy` and closed files' weak
//!   references through `Guard::defer`. No reclamation scheme of our own.
//! * Under `--cfg vfscale_loom`/`vfscale_shuttle`, crossbeam-epoch (whose released form
//!   has no loom support and whose atomics the schedulers cannot see) is replaced by a
//!   deliberately simple *model*: a per-table reader count and a garbage list that is run
//!   when a collector, after the garbage was unlinked, observes zero readers with an RMW.
//!   It writes a shared counter on every pin, so it is for the models only.

#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
mod imp {
    use std::marker::PhantomData;
    use std::sync::atomic::Ordering;

    use crossbeam_epoch::{Atomic, Owned};

    /// The reclamation domain (crossbeam's global collector: nothing per table).
    #[derive(Debug, Default)]
    pub(crate) struct Domain;

    /// A pinned critical section (`rcu_read_lock`).
    pub(crate) struct Guard<'d> {
        g: crossbeam_epoch::Guard,
        _d: PhantomData<&'d Domain>,
    }

    impl Domain {
        pub(crate) fn new() -> Self {
            Domain
        }

        /// Enters a read-side critical section.
        pub(crate) fn pin(&self) -> Guard<'_> {
            Guard {
                g: crossbeam_epoch::pin(),
                _d: PhantomData,
            }
        }
    }

    impl Guard<'_> {
        /// Drops `v` once every reader pinned now has unpinned.
        pub(crate) fn defer_drop<T: Send + 'static>(&self, v: T) {
            self.g.defer(move || drop(v));
        }
    }

    /// The published table pointer (`files->fdt`).
    pub(crate) struct TablePtr<T> {
        p: Atomic<T>,
    }

    impl<T> TablePtr<T> {
        pub(crate) fn new(t: T) -> Self {
            TablePtr { p: Atomic::new(t) }
        }

        /// `rcu_dereference(files->fdt)`. Acquire pairs with the Release of `replace`, so
        /// the slots the resizer copied in are visible.
        pub(crate) fn load<'g>(&self, g: &'g Guard<'_>) -> &'g T {
            let s = self.p.load(Ordering::Acquire, &g.g);
            // SAFETY: the pointer is never null (set in `new`, replaced only by `replace`
            // with a fresh table), and a table unlinked by `replace` is destroyed only after
            // every guard pinned before the unlink, including `g`, is dropped.
            unsafe { s.deref() }
        }

        /// `rcu_assign_pointer(files->fdt, new)` + `call_rcu(free_fdtable_rcu)`.
        ///
        /// # Safety
        /// The caller holds the table lock (one replacer at a time), and nothing in the old
        /// table may be used after the grace period except through pinned readers.
        pub(crate) unsafe fn replace(&self, t: T, g: &Guard<'_>) {
            // Release: pairs with the Acquire in `load`, publishing the copied slots.
            let old = self.p.swap(Owned::new(t), Ordering::AcqRel, &g.g);
            // SAFETY: `old` is unlinked now; readers that still hold it are pinned, and
            // defer_destroy waits for them. Nobody else retires it (single replacer).
            unsafe { g.g.defer_destroy(old) };
        }

        /// The table, through exclusive access.
        pub(crate) fn get_mut(&mut self) -> &mut T {
            // SAFETY: `&mut self` excludes every reader and replacer; the pointer is
            // non-null and owned by `self`.
            unsafe {
                self.p
                    .load(Ordering::Relaxed, crossbeam_epoch::unprotected())
                    .deref_mut()
            }
        }
    }

    impl<T> Drop for TablePtr<T> {
        fn drop(&mut self) {
            // SAFETY: exclusive access; the current table is owned by `self` and was never
            // retired (only replaced ones are).
            unsafe {
                drop(
                    self.p
                        .load(Ordering::Relaxed, crossbeam_epoch::unprotected())
                        .into_owned(),
                );
            }
        }
    }

    /// Hurries crossbeam-epoch's deferred work (best effort).
    pub(crate) fn flush() {
        for _ in 0..256 {
            crossbeam_epoch::pin().flush();
        }
    }
}

#[cfg(any(vfscale_loom, vfscale_shuttle))]
mod imp {
    use crate::sync::{AtomicPtr, AtomicUsize, Mutex, Ordering};

    type Garbage = Box<dyn FnOnce() + Send>;

    /// The model reclamation domain: a reader count and a garbage list.
    pub(crate) struct Domain {
        readers: AtomicUsize,
        garbage: Mutex<Vec<Garbage>>,
    }

    /// A pinned critical section of the model.
    pub(crate) struct Guard<'d> {
        d: &'d Domain,
    }

    impl Domain {
        pub(crate) fn new() -> Self {
            Domain {
                readers: AtomicUsize::new(0),
                garbage: Mutex::new(Vec::new()),
            }
        }

        pub(crate) fn pin(&self) -> Guard<'_> {
            // SeqCst RMW: a collector's later RMW on `readers` reads this increment
            // (release sequence), so collectors see us; if the collector's RMW came first,
            // it synchronizes with this one, so our loads see its unlinks.
            self.readers.fetch_add(1, Ordering::SeqCst);
            Guard { d: self }
        }

        fn defer(&self, f: Garbage) {
            self.garbage.lock().push(f);
        }

        fn collect(&self) {
            let ready = {
                let mut g = self.garbage.lock();
                // An RMW, not a load: it is ordered in `readers`' modification order with
                // every pin, so a reader that pins later synchronizes with it and cannot see
                // what was unlinked before the garbage was pushed.
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

    impl Drop for Domain {
        fn drop(&mut self) {
            for f in std::mem::take(self.garbage.get_mut()) {
                f();
            }
        }
    }

    impl Drop for Guard<'_> {
        fn drop(&mut self) {
            if self.d.readers.fetch_sub(1, Ordering::SeqCst) == 1 {
                self.d.collect();
            }
        }
    }

    impl Guard<'_> {
        pub(crate) fn defer_drop<T: Send + 'static>(&self, v: T) {
            self.d.defer(Box::new(move || drop(v)));
        }
    }

    struct SendPtr<T>(*mut T);
    // SAFETY: the pointer is only turned back into a Box by the garbage run, which happens
    // once, after every reader is gone; `T: Send` so freeing it on another thread is fine.
    unsafe impl<T: Send> Send for SendPtr<T> {}

    /// The model's published table pointer.
    pub(crate) struct TablePtr<T> {
        p: AtomicPtr<T>,
    }

    impl<T: Send + 'static> TablePtr<T> {
        pub(crate) fn new(t: T) -> Self {
            TablePtr {
                p: AtomicPtr::new(Box::into_raw(Box::new(t))),
            }
        }

        pub(crate) fn load<'g>(&self, _g: &'g Guard<'_>) -> &'g T {
            let p = self.p.load(Ordering::Acquire);
            // SAFETY: non-null (see `new`/`replace`); freed only by the model collector once
            // no reader pinned before its unlink remains, and `_g` is such a reader.
            unsafe { &*p }
        }

        /// # Safety
        /// The caller holds the table lock (one replacer at a time).
        pub(crate) unsafe fn replace(&self, t: T, g: &Guard<'_>) {
            let old = SendPtr(self.p.swap(Box::into_raw(Box::new(t)), Ordering::AcqRel));
            g.d.defer(Box::new(move || {
                let old = old;
                // SAFETY: unlinked above, run once after all readers that could see it.
                drop(unsafe { Box::from_raw(old.0) });
            }));
        }

        pub(crate) fn get_mut(&mut self) -> &mut T {
            // SAFETY: exclusive access; non-null and owned by `self`.
            unsafe { &mut *self.p.load(Ordering::Relaxed) }
        }
    }

    impl<T> Drop for TablePtr<T> {
        fn drop(&mut self) {
            let p = self.p.load(Ordering::Relaxed);
            // SAFETY: exclusive access; the current table is owned by `self`.
            drop(unsafe { Box::from_raw(p) });
        }
    }

    pub(crate) fn flush() {}
}

pub(crate) use imp::{flush, Domain, Guard, TablePtr};
