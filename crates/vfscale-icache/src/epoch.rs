//! Deferred freeing of inodes: what RCU (`i_callback`/`free_inode`) is to `fs/inode.c`.
//!
//! A lock-free lookup walks a hash chain while an evictor may unlink and destroy the inodes
//! on it; the memory of a destroyed inode is freed only once every walker that could have
//! loaded its pointer has unpinned.
//!
//! * Normal builds: `crossbeam-epoch`; pinning writes only the calling thread's own
//!   epoch record, never a shared cache line. Retired boxes go to crossbeam in per-thread
//!   batches, and a batch whose grace period is over comes back to the thread that retired
//!   it, which frees it and fills the empty batch again ([`crate::ready`]): crossbeam runs
//!   deferred functions on whichever thread collects, and a free there went into the
//!   retiring thread's glibc arena, under that arena's lock.
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

    use std::mem::MaybeUninit;
    use std::sync::Arc;

    use crate::ready::{Link, Ready};

    /// A box to free: its address and the function that frees it as its type.
    type Retired = (*mut (), unsafe fn(*mut ()));

    /// Boxes retired per thread before they are handed to crossbeam as one deferred
    /// function (what RCU's per-CPU callback lists are to `call_rcu`). Every 64 deferred
    /// functions crossbeam allocates a ~2 KB bag node, and a request that large (1 KB or
    /// more: glibc's large bins) makes glibc consolidate every fastbin chunk of the
    /// process inside the eviction that allocates it; at 60 a batch (976 bytes with its
    /// link) is still a small-bin request, which never consolidates, and the bag node
    /// comes once per 3,840 evictions instead of 2,048 at 32.
    const BATCH: usize = 60;

    /// Retired boxes, freed together once every thread pinned when they were handed to
    /// crossbeam has unpinned, by the thread that retired them (see [`deliver`]).
    struct Batch {
        len: usize,
        items: [MaybeUninit<Retired>; BATCH],
    }

    // SAFETY: each pointee is `Send` (`defer_free_box`'s bound); the batch only carries the
    // boxes to the thread that frees them.
    unsafe impl Send for Batch {}

    impl Batch {
        fn new() -> Box<Link<Batch>> {
            Link::new(Batch {
                len: 0,
                items: [MaybeUninit::uninit(); BATCH],
            })
        }

        fn push(&mut self, r: Retired) {
            self.items[self.len].write(r);
            self.len += 1;
        }

        fn free(&mut self) {
            let n = std::mem::take(&mut self.len);
            for r in &self.items[..n] {
                // SAFETY: the first `len` items were written by `push`, and `len` is reset
                // before any is freed, so none is freed twice.
                let (p, f) = unsafe { r.assume_init_read() };
                // SAFETY: `f` is `free_box::<T>` for the `T` that `p` was leaked as, and
                // the grace period has passed (callers: `deliver` and the ready list's
                // owner).
                unsafe { f(p) };
            }
        }
    }

    /// This thread's finished batches (pushed by whichever thread ran their deferred
    /// function, freed here); closed at thread exit.
    struct Owner(Arc<Ready<Batch>>);

    impl Drop for Owner {
        fn drop(&mut self) {
            for mut b in self.0.close() {
                b.val.free();
            }
        }
    }

    /// This thread's retired boxes not yet handed to crossbeam (`cur`), and empty batches
    /// to fill next (`spare`: batches come back to their thread, so a thread that keeps
    /// evicting allocates none). On thread exit `cur` is handed over (crossbeam registers
    /// a temporary participant if its own thread-local handle is already gone).
    struct Pending {
        cur: Option<Box<Link<Batch>>>,
        // Boxed: a batch moves between this list, crossbeam and the ready list as one
        // pointer, never as a kilobyte copied.
        #[allow(clippy::vec_box)]
        spare: Vec<Box<Link<Batch>>>,
    }

    impl Drop for Pending {
        fn drop(&mut self) {
            if let Some(b) = self.cur.take() {
                submit(&crossbeam_epoch::pin(), b);
            }
        }
    }

    /// Empty batches a thread keeps (under 1 KB each): a crossbeam bag's worth (64
    /// batches) comes back at once when the bag is collected.
    const SPARE: usize = 64;

    /// Batches a thread's ready list holds before deliverers free them themselves: a
    /// thread that stopped retiring (and so does not look) keeps no more than this.
    const MAX_READY: usize = 64;

    thread_local! {
        static PENDING: std::cell::RefCell<Pending> =
            const { std::cell::RefCell::new(Pending { cur: None, spare: Vec::new() }) };
        static READY: Owner = Owner(Arc::new(Ready::new()));
    }

    /// Hands `b` to crossbeam: freed once every thread pinned now has unpinned, by this
    /// thread (or by the thread that runs the deferred function, when this one is gone).
    fn submit(g: &crossbeam_epoch::Guard, b: Box<Link<Batch>>) {
        if b.val.len == 0 {
            return;
        }
        let home = READY.try_with(|o| o.0.clone()).ok();
        // SAFETY: every box in `b` was retired (unreachable for new readers) before this
        // call, so a grace period from now is a grace period from each retirement.
        unsafe { g.defer_unchecked(move || deliver(home, b)) };
    }

    /// A batch's grace period is over: free it if this is the thread that retired it (or
    /// that thread is gone), else put it on that thread's ready list. crossbeam runs
    /// deferred functions on whichever thread collects; freed there, half of a thread's
    /// batches went into the other thread's glibc arena, under its lock.
    fn deliver(home: Option<Arc<Ready<Batch>>>, mut b: Box<Link<Batch>>) {
        if let Some(r) = home {
            if READY.try_with(|o| Arc::ptr_eq(&o.0, &r)).unwrap_or(false) {
                return recycle(b);
            }
            match r.push(b, MAX_READY) {
                Ok(()) => return,
                Err(back) => b = back,
            }
        }
        b.val.free();
    }

    /// Frees this thread's batches that other threads delivered, and keeps them to fill
    /// again. No borrow of `PENDING` is held while freeing: a box's `Drop` may retire more.
    fn free_ready() {
        let _ = READY.try_with(|o| {
            if o.0.is_empty() {
                return;
            }
            for b in o.0.take() {
                recycle(b);
            }
        });
    }

    /// Frees `b`'s boxes and keeps the empty batch to fill again (this thread's).
    fn recycle(mut b: Box<Link<Batch>>) {
        b.val.free();
        let _ = PENDING.try_with(|q| {
            let mut q = q.borrow_mut();
            if q.spare.len() < SPARE {
                q.spare.push(b);
            }
        });
    }

    /// # Safety
    /// `p` came from `Box::into_raw`/`Box::leak` and nobody else frees it.
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
        /// retired, and a batch is handed over after its last box was retired. When a
        /// batch fills, the batches other threads delivered back to this one are freed.
        ///
        /// # Safety
        /// `p` came from `Box::into_raw`/`Box::leak`, nobody frees it otherwise, and it is
        /// sound to drop the box on another thread after this returns.
        pub(crate) unsafe fn defer_free_box<T: Send>(&self, p: *mut T) {
            let r: Retired = (p.cast::<()>(), free_box::<T>);
            // The batch is taken out of the cell before crossbeam gets it, and before the
            // ready batches are freed: a collection run by `defer`, or a free, may drop
            // inodes whose data's `Drop` retires more.
            let full = PENDING.try_with(|q| {
                let q = &mut *q.borrow_mut();
                let b = q
                    .cur
                    .get_or_insert_with(|| q.spare.pop().unwrap_or_else(Batch::new));
                b.val.push(r);
                if b.val.len == BATCH {
                    q.cur.take()
                } else {
                    None
                }
            });
            match full {
                Ok(Some(b)) => hand_over(&self.0, b),
                Ok(None) => {}
                // This thread's batch is being destroyed (thread exit): defer alone.
                Err(_) => {
                    let mut b = Batch::new();
                    b.val.push(r);
                    submit(&self.0, b);
                }
            }
        }
    }

    /// A full batch: free what came back to this thread, then hand `b` to crossbeam. Once
    /// per [`BATCH`] evictions, so out of line (the eviction that inlines
    /// `defer_free_box` stays small).
    #[cold]
    #[inline(never)]
    fn hand_over(g: &crossbeam_epoch::Guard, b: Box<Link<Batch>>) {
        free_ready();
        submit(g, b);
    }

    /// Hands this thread's pending batch to crossbeam.
    fn submit_pending() {
        if let Ok(Some(b)) = PENDING.try_with(|q| q.borrow_mut().cur.take()) {
            submit(&crossbeam_epoch::pin(), b);
        }
    }

    /// Hurries deferred frees (best effort, for tests that count drops).
    pub(crate) fn flush() {
        submit_pending();
        for _ in 0..256 {
            crossbeam_epoch::pin().flush();
        }
        free_ready();
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
