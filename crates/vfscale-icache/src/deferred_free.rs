//! Deferred freeing of inodes: what RCU (`i_callback`/`free_inode`) is to `fs/inode.c`.
//!
//! A lock-free lookup walks a hash chain while an evictor may unlink and destroy the inodes
//! on it; the memory of a destroyed inode is freed only once every walker that could have
//! loaded its pointer has left its read-side section.
//!
//! * Normal builds: the epoch scheme of [`crate::epoch`]. A pin writes only the calling
//!   thread's own record (and reads the global epoch). Retired boxes are kept per thread in
//!   batches, as RCU keeps per-CPU callback lists: a full batch is stamped and queued on its
//!   thread, and the thread frees its own expired batches when its next batch fills (and
//!   every 128 pins), then fills the empty batch again. So memory goes back to the glibc
//!   arena of the thread that evicted it, nothing is allocated per eviction, and nothing
//!   of 1 KB or more is allocated at all (such a request makes glibc consolidate every
//!   fastbin chunk of the process).
//! * `--cfg vfscale_loom`/`vfscale_shuttle`: a model the schedulers can see (a reader
//!   count per cache and a garbage list run when a collector observes no reader). It writes
//!   a shared counter on every pin, so it is for the models only. The epoch scheme has
//!   loom models of its own (`epoch.rs`).

#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
mod imp {
    use std::cell::{Cell, RefCell};
    use std::collections::VecDeque;
    use std::marker::PhantomData;
    use std::mem::MaybeUninit;

    use std::sync::atomic::Ordering;

    use crate::epoch::{self, Global, Record};
    use crate::orphan_list::{Link, OrphanList};

    /// The reclamation domain. One per process (as RCU is one per kernel): a pin is a
    /// thread's, whichever cache it reads.
    #[derive(Debug, Default)]
    pub(crate) struct Domain;

    /// The epoch, the threads' records, and the batches of threads that exited (or that
    /// held more than [`MAX_QUEUED`]) before their grace period ended: freed by whichever
    /// thread next reclaims.
    struct Shared {
        global: Global,
        orphans: OrphanList<Batch>,
    }

    static SHARED: Shared = Shared {
        global: Global::new(),
        orphans: OrphanList::new(),
    };

    /// A read-side section (`rcu_read_lock`): not `Send`, ends when dropped.
    pub(crate) struct Guard {
        /// The record the section is on: the thread's (its depth counted on [`Local`]), or
        /// a temporary one (`temp`: the thread's bookkeeping is gone, at thread exit).
        rec: &'static Record,
        temp: bool,
        _not_send: PhantomData<*mut ()>,
    }

    impl Domain {
        pub(crate) fn new() -> Self {
            Domain
        }
        pub(crate) fn pin(&self) -> Guard {
            pin(true)
        }

        /// A pin that never frees anything: for the cache's own bookkeeping (an eviction
        /// half done, a list walk under locks), where a retired box's `Drop` that panics
        /// would unwind through work that must finish. The frees it skips are left to
        /// [`reclaim_due`] and to later pins.
        pub(crate) fn pin_quiet(&self) -> Guard {
            pin(false)
        }
    }

    /// A box to free: its address and the function that frees it as its type.
    type Retired = (*mut (), unsafe fn(*mut ()));

    /// Boxes retired per thread before the batch is stamped and queued (what RCU's per-CPU
    /// callback lists are to `call_rcu`): 60 keep a batch (976 bytes with its link and
    /// stamp) a small-bin request, should one ever be allocated after the first few.
    const BATCH: usize = 60;

    /// Queued batches a thread keeps; older ones go to the shared orphan list, where any
    /// thread frees them. A thread that stops evicting (a pooled thread) then holds at most
    /// this many batches until it pins or evicts again, flushes, or exits.
    const MAX_QUEUED: usize = 64;

    /// Empty batches a thread keeps to fill again.
    const SPARE: usize = 64;

    /// Pins between two reclaims of a thread's queue (when it has one).
    const PINS_BETWEEN_RECLAIM: usize = 128;

    /// Batches one reclaim frees at most: from a pin ([`PIN_RECLAIM`]: one, 60 inodes,
    /// since a pin may be taken under a spinlock such as `i_lock`) or a full batch
    /// ([`QUEUE_RECLAIM`]; more than one, so a thread that evicts steadily keeps up with
    /// its own batches and the orphans).
    const PIN_RECLAIM: usize = 1;
    const QUEUE_RECLAIM: usize = 8;

    /// Retired boxes, freed together once the epoch is two past `stamp`.
    struct Batch {
        stamp: usize,
        len: usize,
        items: [MaybeUninit<Retired>; BATCH],
    }

    // SAFETY: each pointee is `Send` (`defer_free_box`'s bound); the batch only carries the
    // boxes to the thread that frees them.
    unsafe impl Send for Batch {}

    impl Batch {
        fn new() -> Box<Link<Batch>> {
            Link::new(Batch {
                stamp: 0,
                len: 0,
                items: [MaybeUninit::uninit(); BATCH],
            })
        }

        /// Stamps the batch: every box in it was retired before this call.
        fn seal(&mut self) {
            self.stamp = epoch::stamp(&SHARED.global);
        }

        fn push(&mut self, r: Retired) {
            self.items[self.len].write(r);
            self.len += 1;
        }

        /// Frees every box in the batch (it expired: callers `reclaim`, `free_or_orphan`).
        /// If a box's `Drop` panics, the boxes after it are still freed while the panic
        /// unwinds, as a slice's elements are (a second panic then aborts, as there): a
        /// filesystem's panicking inode data leaks nothing else.
        fn free(&mut self) {
            /// The boxes not freed yet; freed on drop.
            struct Rest<'a>(std::slice::Iter<'a, MaybeUninit<Retired>>);
            impl Drop for Rest<'_> {
                fn drop(&mut self) {
                    for r in self.0.by_ref() {
                        // SAFETY: as in `free`: each item once, from an expired batch.
                        unsafe { free_retired(r) };
                    }
                }
            }
            let n = std::mem::take(&mut self.len);
            let mut rest = Rest(self.items[..n].iter());
            for r in rest.0.by_ref() {
                // SAFETY: the first `len` items were written by `push`; `len` is reset
                // before any is freed and the iterator yields each once, so none is freed
                // twice; the batch expired (the callers).
                unsafe { free_retired(r) };
            }
        }
    }

    /// The thread's record, its section depth and pin count, and its batches.
    struct Local {
        rec: &'static Record,
        depth: Cell<usize>,
        pins: Cell<usize>,
        /// A batch was queued by [`Guard::defer_free_box_quiet`] without the reclaim a
        /// full batch runs: [`reclaim_due`] runs it.
        due: Cell<bool>,
        q: RefCell<Queue>,
    }

    /// The batch being filled, the stamped ones oldest first, and empty ones. Boxed: a
    /// batch moves between these and the orphan list as one pointer.
    #[allow(clippy::vec_box)]
    struct Queue {
        cur: Option<Box<Link<Batch>>>,
        queued: VecDeque<Box<Link<Batch>>>,
        spare: Vec<Box<Link<Batch>>>,
    }

    impl Queue {
        /// Stamps the batch being filled, if it holds anything, and queues it.
        fn seal_cur(&mut self) {
            if let Some(mut b) = self.cur.take().filter(|b| b.val.len > 0) {
                b.val.seal();
                self.queued.push_back(b);
            }
        }
    }

    /// Frees `b` if it expired at epoch `now` (and says so), else leaves it to the orphans.
    fn free_or_orphan(mut b: Box<Link<Batch>>, now: usize) -> bool {
        if epoch::expired(b.val.stamp, now) {
            b.val.free();
            true
        } else {
            orphan(b);
            false
        }
    }

    impl Drop for Local {
        fn drop(&mut self) {
            // Thread exit: what is not expired yet goes to the orphans (any thread frees it
            // later); the record is released for a later thread.
            // Sections still open (a thread-local destructor holds a guard) are counted on
            // the record first: a guard that ends inside the frees below (a `Drop` that
            // re-enters) counts down from them (test
            // `a_guard_ending_inside_the_exit_frees_is_counted`).
            let d = self.depth.get();
            self.rec.orphaned_depth.store(d, Ordering::Relaxed);
            let q = self.q.get_mut();
            q.seal_cur();
            let now = epoch::try_advance(&SHARED.global);
            for b in q.queued.drain(..) {
                free_or_orphan(b, now);
            }
            if d > 0 {
                // Guards outlive this (a thread-local destructor holds one): the last of
                // them leaves the section and releases the record (`Guard`'s drop).
                return;
            }
            epoch::release(self.rec);
        }
    }

    thread_local! {
        static LOCAL: Local = Local {
            rec: SHARED.global.register(),
            depth: Cell::new(0),
            pins: Cell::new(0),
            due: Cell::new(false),
            q: RefCell::new(Queue { cur: None, queued: VecDeque::new(), spare: Vec::new() }),
        };
    }

    /// Puts `b` on the shared orphan list.
    fn orphan(b: Box<Link<Batch>>) {
        SHARED.orphans.push(b);
    }

    /// Enters a section; `may_reclaim`: every [`PINS_BETWEEN_RECLAIM`]th outermost pin of
    /// a thread with work queued frees a batch (never for [`Domain::pin_quiet`]).
    fn pin(may_reclaim: bool) -> Guard {
        let on_local = LOCAL.try_with(|l| {
            let d = l.depth.get();
            l.depth.set(d + 1);
            let mut reclaim_now = false;
            if d == 0 {
                epoch::read_lock(&SHARED.global, l.rec);
                let n = l.pins.get().wrapping_add(1);
                l.pins.set(n);
                // A thread with nothing queued leaves the advancing to those that have.
                reclaim_now = may_reclaim
                    && n % PINS_BETWEEN_RECLAIM == 0
                    && (!l.q.borrow().queued.is_empty() || !SHARED.orphans.is_empty());
            }
            (l.rec, reclaim_now)
        });
        match on_local {
            Ok((rec, reclaim_now)) => {
                let g = Guard {
                    rec,
                    temp: false,
                    _not_send: PhantomData,
                };
                if reclaim_now {
                    reclaim(PIN_RECLAIM);
                }
                g
            }
            Err(_) => {
                // The thread's bookkeeping is gone (thread exit): a temporary record.
                let rec = SHARED.global.register();
                epoch::read_lock(&SHARED.global, rec);
                Guard {
                    rec,
                    temp: true,
                    _not_send: PhantomData,
                }
            }
        }
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            if self.temp {
                epoch::read_unlock(self.rec);
                epoch::release(self.rec);
                return;
            }
            let counted = LOCAL.try_with(|l| {
                let d = l.depth.get() - 1;
                l.depth.set(d);
                if d == 0 {
                    epoch::read_unlock(l.rec);
                }
            });
            if counted.is_err() && self.rec.orphaned_depth.fetch_sub(1, Ordering::Relaxed) == 1 {
                // The thread's bookkeeping went while this section was open (see
                // `Local`'s drop): the last section to end leaves and releases the record.
                epoch::read_unlock(self.rec);
                epoch::release(self.rec);
            }
        }
    }

    /// Advances the epoch if it can, and frees up to `limit` expired batches: this
    /// thread's (oldest first), then orphans. Bounded because it may run inside a pin
    /// taken under a spinlock (`i_lock`), as crossbeam's collection does. No borrow of the
    /// queue is held while a box is freed: its `Drop` may retire more.
    #[cold]
    #[inline(never)]
    fn reclaim(limit: usize) {
        let now = epoch::try_advance(&SHARED.global);
        let mut freed = 0;
        while freed < limit {
            let b = LOCAL.try_with(|l| {
                let mut q = l.q.borrow_mut();
                match q.queued.front() {
                    Some(b) if epoch::expired(b.val.stamp, now) => q.queued.pop_front(),
                    _ => None,
                }
            });
            let Ok(Some(mut b)) = b else { break };
            b.val.free();
            freed += 1;
            let _ = LOCAL.try_with(|l| {
                let mut q = l.q.borrow_mut();
                if q.spare.len() < SPARE {
                    q.spare.push(b);
                }
            });
        }
        if freed < limit && !SHARED.orphans.is_empty() {
            /// The orphans taken and not looked at yet: back on the list if a box's
            /// `Drop` panics (dropped with the taken chain, their boxes would leak).
            struct Unseen(crate::orphan_list::Taken<Batch>);
            impl Drop for Unseen {
                fn drop(&mut self) {
                    for b in self.0.by_ref() {
                        orphan(b);
                    }
                }
            }
            let mut taken = Unseen(SHARED.orphans.take());
            for b in taken.0.by_ref() {
                if freed < limit {
                    freed += usize::from(free_or_orphan(b, now));
                } else {
                    orphan(b);
                }
            }
        }
    }

    /// Frees a retired box.
    ///
    /// # Safety
    /// `r` was written by [`Batch::push`] and is read once; its grace period is over.
    unsafe fn free_retired(r: &MaybeUninit<Retired>) {
        // SAFETY: written by `push`, read once (the caller).
        let (p, f) = unsafe { r.assume_init_read() };
        // SAFETY: `f` is `free_box::<T>` for the `T` that `p` was leaked as, and the grace
        // period is over (the caller).
        unsafe { f(p) };
    }

    /// # Safety
    /// `p` came from `Box::into_raw`/`Box::leak` and nobody else frees it.
    unsafe fn free_box<T>(p: *mut ()) {
        // SAFETY: by the contract.
        drop(unsafe { Box::from_raw(p.cast::<T>()) });
    }

    impl Guard {
        /// Frees the box `p` once every thread now inside a read-side section has left it.
        /// Boxes are batched per thread ([`BATCH`] at a time): an eviction costs neither an
        /// allocation nor a synchronization of its own. Freeing a box later than its grace
        /// period is always safe: it was unreachable for new readers when retired, and a
        /// batch is stamped after its last box was retired.
        ///
        /// # Safety
        /// `p` came from `Box::into_raw`/`Box::leak`, nobody frees it otherwise, and it is
        /// sound to drop the box on another thread after this returns.
        pub(crate) unsafe fn defer_free_box<T: Send>(&self, p: *mut T) {
            // SAFETY: the caller's contract.
            if unsafe { self.retire(p) } {
                reclaim(QUEUE_RECLAIM);
            }
        }

        /// [`Guard::defer_free_box`] without its reclaim: a box's `Drop` never runs here
        /// (the cache's bookkeeping calls it half-way through an eviction). When a batch
        /// fills, the reclaim it would have run is left to [`reclaim_due`], which the
        /// caller runs once its work is done.
        ///
        /// # Safety
        /// As [`Guard::defer_free_box`].
        pub(crate) unsafe fn defer_free_box_quiet<T: Send>(&self, p: *mut T) {
            // SAFETY: the caller's contract.
            if unsafe { self.retire(p) } {
                let _ = LOCAL.try_with(|l| l.due.set(true));
            }
        }

        /// Puts `p` on this thread's batch; a full batch is stamped and queued. Returns
        /// whether one was (the caller reclaims, now or later).
        ///
        /// # Safety
        /// As [`Guard::defer_free_box`].
        unsafe fn retire<T: Send>(&self, p: *mut T) -> bool {
            let r: Retired = (p.cast::<()>(), free_box::<T>);
            let full = LOCAL.try_with(|l| {
                let q = &mut *l.q.borrow_mut();
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
                Ok(Some(b)) => {
                    queue(b);
                    true
                }
                Ok(None) => false,
                // The thread's batches are gone (thread exit): an orphan of its own.
                Err(_) => {
                    let mut b = Batch::new();
                    b.val.push(r);
                    b.val.seal();
                    orphan(b);
                    false
                }
            }
        }
    }

    /// Runs the reclaim that [`Guard::defer_free_box_quiet`] left when it queued a full
    /// batch, if it did. Call it once the bookkeeping that retired the boxes is done: a
    /// box's `Drop` that panics unwinds from here.
    pub(crate) fn reclaim_due() {
        if LOCAL.try_with(|l| l.due.replace(false)).unwrap_or(false) {
            reclaim(QUEUE_RECLAIM);
        }
    }

    /// A full batch: stamp it, queue it on this thread (the oldest beyond [`MAX_QUEUED`]
    /// go to the orphans); the caller reclaims. Once per [`BATCH`] evictions, so out of
    /// line.
    #[cold]
    #[inline(never)]
    fn queue(mut b: Box<Link<Batch>>) {
        b.val.seal();
        let extra = LOCAL.try_with(|l| {
            let mut q = l.q.borrow_mut();
            q.queued.push_back(b);
            if q.queued.len() > MAX_QUEUED {
                q.queued.pop_front()
            } else {
                None
            }
        });
        if let Ok(Some(old)) = extra {
            orphan(old);
        }
    }

    /// Hurries deferred frees (best effort, for tests that count drops): stamps this
    /// thread's partial batch and reclaims until nothing of this thread's is left or other
    /// threads' sections hold the epoch back.
    pub(crate) fn flush() {
        let _ = LOCAL.try_with(|l| l.q.borrow_mut().seal_cur());
        for _ in 0..4 {
            reclaim(usize::MAX);
            let left = LOCAL.try_with(|l| l.q.borrow().queued.len()).unwrap_or(0);
            if left == 0 && SHARED.orphans.is_empty() {
                break;
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use std::cell::RefCell;
        use std::sync::atomic::{AtomicBool, AtomicUsize};
        use std::sync::{mpsc, Arc, Mutex};

        /// Held by each test: a section open in one holds back the other's epochs.
        static SERIAL: Mutex<()> = Mutex::new(());

        /// A retired box that runs a function when it is freed.
        struct OnFree(Option<Box<dyn FnOnce() + Send>>);

        impl Drop for OnFree {
            fn drop(&mut self) {
                if let Some(f) = self.0.take() {
                    f();
                }
            }
        }

        /// Retires a box (on this thread's batch) that runs `f` when freed.
        fn retire(f: impl FnOnce() + Send + 'static) {
            let g = pin(true);
            let p = Box::into_raw(Box::new(OnFree(Some(Box::new(f)))));
            // SAFETY: a fresh leaked box, freed only by the batch.
            unsafe { g.defer_free_box(p) };
        }

        /// Guards of a thread that exits, held by a thread-local destructor that runs after
        /// the cache's own (`Local`'s): with its channels to the test.
        type Held = (Vec<Guard>, mpsc::Sender<bool>, mpsc::Receiver<()>);

        struct Holder(RefCell<Option<Held>>);

        impl Drop for Holder {
            fn drop(&mut self) {
                if let Some((mut guards, tx, rx)) = self.0.borrow_mut().take() {
                    // `Local` is gone: the sections are the record's orphaned depth.
                    // No panic here (a thread-local destructor): a failed test has
                    // dropped its ends of the channels, and the guards just end.
                    let gone = LOCAL.try_with(|_| ()).is_err();
                    let _ = tx.send(gone);
                    while let Some(g) = guards.pop() {
                        let _ = rx.recv();
                        drop(g);
                        let _ = tx.send(true);
                    }
                }
            }
        }

        thread_local! {
            static HOLDER: Holder = const { Holder(RefCell::new(None)) };
        }

        /// Flushes until `freed` is set (a grace period that never ends fails the test
        /// instead of hanging it).
        fn flush_until(freed: &AtomicBool) {
            for _ in 0..100_000 {
                if freed.load(Ordering::SeqCst) {
                    return;
                }
                flush();
                std::thread::yield_now();
            }
            panic!("never freed: a grace period never ended");
        }

        thread_local! {
            static TAKEN: RefCell<Vec<Guard>> = const { RefCell::new(Vec::new()) };
        }

        /// A box whose `Drop` panics (a filesystem's inode data) while its batch is freed:
        /// the panic reaches the caller, and every other box of the batch is still freed.
        #[test]
        fn a_panicking_drop_frees_the_rest_of_its_batch() {
            let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
            std::thread::spawn(|| {
                let dropped = Arc::new(AtomicUsize::new(0));
                // One full batch: the fourth box panics when freed.
                for i in 0..BATCH {
                    let d = dropped.clone();
                    retire(move || {
                        assert!(i != 3, "inode data 3 panics in its drop");
                        d.fetch_add(1, Ordering::SeqCst);
                    });
                }
                let caught = std::panic::catch_unwind(|| {
                    for _ in 0..100_000 {
                        flush();
                        if dropped.load(Ordering::SeqCst) == BATCH - 1 {
                            return;
                        }
                        std::thread::yield_now();
                    }
                });
                let msg = caught.expect_err("the drop's panic reaches the reclaim's caller");
                let msg = msg
                    .downcast_ref::<&str>()
                    .map(|m| m.to_string())
                    .or_else(|| msg.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                assert!(msg.contains("inode data 3 panics"), "{msg}");
                assert_eq!(dropped.load(Ordering::SeqCst), BATCH - 1, "boxes after it leaked");
                // And the thread goes on: later batches are freed as before.
                let later = Arc::new(AtomicBool::new(false));
                let l = later.clone();
                retire(move || l.store(true, Ordering::SeqCst));
                flush_until(&later);
            })
            .join()
            .unwrap();
        }

        /// The same among orphans: a thread exits with three batches its grace periods
        /// have not freed yet (a section open here holds the epoch), and a box of the
        /// middle one panics when a reclaim frees it; the batch taken with it but not
        /// looked at yet (whichever order the list gives them in) goes back to the
        /// orphans and is freed by a later reclaim.
        #[test]
        fn a_panicking_drop_puts_the_orphans_it_did_not_reach_back() {
            let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
            let dropped = Arc::new(AtomicUsize::new(0));
            let held = pin(true);
            let d = dropped.clone();
            std::thread::spawn(move || {
                for i in 0..3 * BATCH {
                    let d = d.clone();
                    retire(move || {
                        assert!(i != BATCH + 3, "inode data {i} panics in its drop");
                        d.fetch_add(1, Ordering::SeqCst);
                    });
                }
            })
            .join()
            .unwrap();
            assert_eq!(dropped.load(Ordering::SeqCst), 0, "freed under an open section");
            drop(held);
            let caught = std::panic::catch_unwind(|| {
                for _ in 0..100_000 {
                    flush();
                    std::thread::yield_now();
                }
            });
            assert!(caught.is_err(), "the drop's panic reaches the reclaim's caller");
            for _ in 0..100_000 {
                if dropped.load(Ordering::SeqCst) == 3 * BATCH - 1 {
                    return;
                }
                flush();
                std::thread::yield_now();
            }
            panic!(
                "{} of {} boxes freed: an orphan was lost",
                dropped.load(Ordering::SeqCst),
                3 * BATCH - 1
            );
        }

        /// A thread exits with a section open (its guard in a thread-local registered
        /// before `Local`), and a box its exit frees ends that section from its `Drop` (a
        /// `Drop` that re-enters). The guard's end must count against the sections
        /// `Local`'s drop leaves open: if it was counted down from 0 (wrapping) before
        /// `Local`'s drop stored the depth, the record stayed in its section for good and
        /// no grace period ever ended again.
        #[test]
        fn a_guard_ending_inside_the_exit_frees_is_counted() {
            let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
            let (to_test, from_thread) = mpsc::channel();
            let (to_thread, from_test) = mpsc::channel::<()>();
            // Held while the thread stamps its batch: it cannot expire then.
            let hold = pin(true);
            let t = std::thread::spawn(move || {
                TAKEN.with(|_| ());
                retire(|| {
                    let _ = TAKEN.try_with(|t| t.borrow_mut().clear());
                });
                flush();
                to_test.send(()).unwrap();
                from_test.recv().unwrap();
                TAKEN.with(|t| t.borrow_mut().push(pin(true)));
            });
            from_thread.recv().unwrap();
            drop(hold);
            // The thread's batch expires (its thread frees it at exit).
            reclaimed_elsewhere(&AtomicBool::new(false));
            to_thread.send(()).unwrap();
            t.join().unwrap();
            let freed = orphan_probe();
            flush_until(&freed);
        }

        /// Reclaims from another thread as hard as it can; whether `freed` is set.
        fn reclaimed_elsewhere(freed: &AtomicBool) -> bool {
            std::thread::spawn(|| {
                for _ in 0..8 {
                    flush();
                }
            })
            .join()
            .unwrap();
            freed.load(Ordering::SeqCst)
        }

        /// Retires a box on a thread that exits (an orphan): the flag its free sets.
        fn orphan_probe() -> Arc<AtomicBool> {
            let freed = Arc::new(AtomicBool::new(false));
            let fr = freed.clone();
            std::thread::spawn(move || retire(move || fr.store(true, Ordering::SeqCst)))
                .join()
                .unwrap();
            freed
        }

        /// A thread exits with two nested sections open (guards a later thread-local
        /// destructor holds): its bookkeeping goes, and the record stays in its section
        /// until the last of the two guards ends; only then is a box retired meanwhile
        /// freed (and the record released, for a later thread).
        #[test]
        fn sections_open_at_thread_exit_hold_until_their_last_guard() {
            let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
            let (to_test, from_thread) = mpsc::channel();
            let (to_thread, from_test) = mpsc::channel();
            let t = std::thread::spawn(move || {
                // First: registered before `Local`, so destroyed after it.
                HOLDER.with(|h| *h.0.borrow_mut() = Some((Vec::new(), to_test, from_test)));
                let outer = pin(true);
                let inner = pin(true);
                HOLDER.with(|h| {
                    let mut h = h.0.borrow_mut();
                    let guards = &mut h.as_mut().unwrap().0;
                    guards.push(outer);
                    guards.push(inner);
                });
            });
            assert!(
                from_thread.recv().unwrap(),
                "the holder ran before `Local`'s drop"
            );
            let freed = orphan_probe();
            assert!(!reclaimed_elsewhere(&freed), "freed with two sections open");
            to_thread.send(()).unwrap();
            from_thread.recv().unwrap();
            assert!(!reclaimed_elsewhere(&freed), "freed with one section open");
            to_thread.send(()).unwrap();
            t.join().unwrap();
            flush_until(&freed);
        }

        /// A guard taken inside another (a lookup inside a section) ends only its own
        /// depth: the outer section still holds back a box retired after it began, while
        /// other threads reclaim.
        #[test]
        fn an_inner_guard_does_not_end_the_outer_section() {
            let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
            let outer = pin(true);
            // Retired after the outer section began.
            let freed = orphan_probe();
            drop(pin(true));
            let inner = pin(true);
            drop(inner);
            assert!(
                !reclaimed_elsewhere(&freed),
                "freed while the outer section was open"
            );
            drop(outer);
            flush_until(&freed);
        }

        /// A reclaim reads the epoch once (`now`), then frees its own batches, then the
        /// orphans. Meanwhile (here: inside the `Drop` of a box it frees; in the cache:
        /// any other thread) the epoch moves on and an exiting thread orphans a batch
        /// stamped one past `now`, retired while a reader is in a section. That batch is
        /// not expired (its stamp is newer than `now`), and it must not be freed while
        /// the reader stays in its section: `expired` compares the epochs as a signed
        /// difference (with `now - stamp` wrapping to `usize::MAX` it was "expired").
        #[test]
        fn a_reclaim_with_an_older_epoch_frees_no_newer_orphan() {
            let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
            let reader_in = Arc::new(AtomicBool::new(false));
            let early = Arc::new(AtomicBool::new(false));
            let freed = Arc::new(AtomicBool::new(false));
            let (ri, ea, fr) = (reader_in.clone(), early.clone(), freed.clone());
            let (go_tx, go_rx) = mpsc::channel::<()>();
            let (reader_tx, reader_rx) = mpsc::channel();
            retire(move || {
                // Inside this thread's reclaim, `now` read: a reader enters at the epoch.
                let (in_tx, in_rx) = mpsc::channel();
                let ri2 = ri.clone();
                let reader = std::thread::spawn(move || {
                    let g = pin(true);
                    ri2.store(true, Ordering::SeqCst);
                    in_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                    ri2.store(false, Ordering::SeqCst);
                    drop(g);
                });
                in_rx.recv().unwrap();
                // Another thread advances once (the reader shows the current epoch),
                // retires a box the reader could still reach, and exits: its batch is
                // stamped one past `now` and orphaned.
                std::thread::spawn(move || {
                    epoch::try_advance(&SHARED.global);
                    retire(move || {
                        if ri.load(Ordering::SeqCst) {
                            ea.store(true, Ordering::SeqCst);
                        }
                        fr.store(true, Ordering::SeqCst);
                    });
                })
                .join()
                .unwrap();
                reader_tx.send(reader).unwrap();
            });
            // Two advances expire the first batch: its free runs the set-up above.
            let reader = (0..100_000)
                .find_map(|_| {
                    flush();
                    reader_rx.try_recv().ok()
                })
                .expect("the first batch never expired");
            go_tx.send(()).unwrap();
            reader.join().unwrap();
            flush_until(&freed);
            assert!(
                !early.load(Ordering::SeqCst),
                "an orphan freed while a reader that could reach it was in its section"
            );
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

        /// The model frees only when its last section ends: as [`Domain::pin`].
        pub(crate) fn pin_quiet(&self) -> Guard {
            self.pin()
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

    impl Guard {
        /// # Safety
        /// As [`Guard::defer_free_box`].
        pub(crate) unsafe fn defer_free_box_quiet<T: Send>(&self, p: *mut T) {
            // SAFETY: the caller's contract.
            unsafe { self.defer_free_box(p) }
        }
    }

    /// Nothing is left due in the model (its frees run when the last section ends).
    pub(crate) fn reclaim_due() {}

    pub(crate) fn flush() {}
}

pub(crate) use imp::{flush, reclaim_due, Domain, Guard};
