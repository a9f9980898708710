//! Deferred freeing of inodes: what RCU (`i_callback`/`free_inode`) is to `fs/inode.c`.
//!
//! A lock-free lookup walks a hash chain while an evictor may unlink and destroy the inodes
//! on it; the memory of a destroyed inode is freed only once every walker that could have
//! loaded its pointer has unpinned.
//!
//! * Normal builds: `crossbeam-epoch`; pinning writes only the calling thread's own
//!   epoch record, never a shared cache line. Inodes are retired in per-thread chains
//!   linked through their own link word (`Linked`, `Guard::defer_recycle`), and their
//!   memory is recycled per thread (`alloc_box`, `recycle`): `kmem_cache`'s part.
//! * `--cfg vfscale_loom`/`vfscale_shuttle`: a model the schedulers can see (a reader
//!   count per cache and a garbage list run when a collector observes no reader). It writes
//!   a shared counter on every pin, so it is for the models only.

/// An object retired through a link word of its own, as `call_rcu` links a callback
/// through the object's `rcu_head`: a batch of them is one pointer, so retiring allocates
/// nothing (see `Guard::defer_recycle`).
///
/// # Safety
/// `retire_link` is the same field of `self` every time, and once the object is handed
/// to `Guard::defer_recycle` nobody else reads or writes that field (nor frees the object).
pub(crate) unsafe trait Linked: Send + Sized + 'static {
    /// The link word.
    fn retire_link(&self) -> &crate::sync::AtomicPtr<Self>;
}

#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
mod imp {
    use crate::sync::Ordering;

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
                // SAFETY: `f` is `free_box::<T>` or `recycle_box::<T>` for the `T` that `p`
                // was leaked as, and the grace period has passed (the only caller is the
                // deferred function).
                unsafe { f(p) };
            }
        }
    }

    /// Boxes retired per thread before they are handed to crossbeam as one deferred
    /// function (what RCU's per-CPU callback lists are to `call_rcu`).
    const BATCH: usize = 32;

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

    /// Drops the box's value and keeps its memory for [`alloc_box`] on this thread (as
    /// `kmem_cache_free` keeps an object in its cache), or frees it when this thread's
    /// free list of that layout is full.
    ///
    /// # Safety
    /// As [`free_box`].
    unsafe fn recycle_box<T>(p: *mut ()) {
        let p = p.cast::<T>();
        // SAFETY: by the contract the box is ours; its value is dropped exactly once here,
        // before its memory is kept or freed (the drop may retire or allocate more: no
        // free list is borrowed across it).
        unsafe { std::ptr::drop_in_place(p) };
        let layout = std::alloc::Layout::new::<T>();
        // SAFETY: the block came from the global allocator with `Layout::new::<T>()` (a
        // `Box<T>`), and its value was just dropped.
        unsafe { recycle::put(p.cast::<u8>(), layout) };
    }

    /// A box of `v` (`kmem_cache_alloc`): a block this thread's recycled ([`recycle_box`])
    /// of the same layout if it has one, else a new `Box`. Either way the result may be
    /// freed as a `Box<T>` (the block came from the global allocator with `T`'s layout).
    pub(crate) fn alloc_box<T>(v: T) -> std::ptr::NonNull<T> {
        if let Some(b) = recycle::take(std::alloc::Layout::new::<T>()) {
            let p = b.cast::<T>();
            // SAFETY: the block is ours (taken off the free list), is `T`'s layout, and
            // holds no value.
            unsafe { p.as_ptr().write(v) };
            return p;
        }
        std::ptr::NonNull::from(Box::leak(Box::new(v)))
    }

    /// Free blocks of deferred-freed objects, kept for reuse per layout (the inode of
    /// each filesystem type): `kmem_cache`, in Bonwick's magazine form. A freed inode's
    /// memory goes onto the freeing thread's magazine instead of to malloc, and the
    /// next inode a thread allocates takes one (most recently freed first: still in the
    /// CPU's cache). A thread holds two magazines of up to [`MAG`] blocks per layout; a
    /// full one goes to a depot shared by all threads and an allocating thread with
    /// none takes a full one from it (one depot lock per [`MAG`] blocks), so memory
    /// freed on one thread serves allocations on another (an evicting thread and a
    /// loading one), and a thread's magazines go to the depot when it exits.
    ///
    /// This keeps malloc out of eviction and creation: an inode freed to glibc lands in
    /// a fastbin, and the next large allocation (crossbeam's ~2 KB bag node) makes
    /// glibc consolidate every fastbin chunk inside the eviction that allocates it, and
    /// later small allocations split merged chunks (callgrind, 1 task, 50,000 files:
    /// ~145 instructions of `malloc_consolidate` and ~125 of `free` per unlink).
    ///
    /// Bounded: the depot keeps at most [`MAX_DEPOT_BYTES`] per layout (further full
    /// magazines are freed to the allocator), a thread at most 2 x [`MAG`] blocks per
    /// layout; [`flush`] frees the calling thread's magazines and the whole depot. The
    /// link is kept in a free block's first word (blocks of at least a word,
    /// word-aligned).
    mod recycle {
        use std::alloc::Layout;
        use std::cell::RefCell;
        use std::ptr::NonNull;
        use std::sync::Mutex;

        /// Blocks per magazine.
        pub(super) const MAG: usize = 512;

        /// Most bytes the depot keeps per layout: 64 MiB, ~700,000 inodes of 96 bytes
        /// (Linux keeps a slab cache's free objects until memory pressure shrinks it;
        /// this is the bound instead).
        pub(super) const MAX_DEPOT_BYTES: usize = 64 << 20;

        /// How many layouts a thread keeps magazines for (others are freed as before).
        const LAYOUTS: usize = 4;

        /// Free blocks: a singly linked list through their first word.
        struct Mag {
            head: Option<NonNull<u8>>,
            len: usize,
        }

        // SAFETY: a magazine owns its free blocks (no value in them); whoever holds it
        // may use or free them.
        unsafe impl Send for Mag {}

        const EMPTY: Mag = Mag { head: None, len: 0 };

        impl Mag {
            /// # Safety
            /// `b` is a free block of this magazine's layout that nobody else uses.
            unsafe fn push(&mut self, b: NonNull<u8>) {
                // SAFETY: the block is ours, at least a word and word-aligned
                // (`keepable`): its first word holds the link.
                unsafe { b.cast::<Option<NonNull<u8>>>().as_ptr().write(self.head) };
                self.head = Some(b);
                self.len += 1;
            }

            fn pop(&mut self) -> Option<NonNull<u8>> {
                let b = self.head?;
                // SAFETY: `b` is on the list: its first word is the next link.
                self.head = unsafe { b.cast::<Option<NonNull<u8>>>().as_ptr().read() };
                self.len -= 1;
                Some(b)
            }

            /// Frees every block (of `layout`).
            fn free(&mut self, layout: Layout) {
                while let Some(b) = self.pop() {
                    // SAFETY: the magazine's blocks came from the global allocator with
                    // `layout`; `b` is off the list.
                    unsafe { std::alloc::dealloc(b.as_ptr(), layout) };
                }
            }
        }

        /// One layout's full magazines, shared by all threads.
        struct Depot {
            layout: Layout,
            full: Vec<Mag>,
        }

        static DEPOT: Mutex<Vec<Depot>> = Mutex::new(Vec::new());

        fn depot() -> std::sync::MutexGuard<'static, Vec<Depot>> {
            DEPOT.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// Gives the magazine `m` of `layout` to the depot, or frees its blocks when the
        /// depot is full.
        fn depot_put(layout: Layout, mut m: Mag) {
            if m.len == 0 {
                return;
            }
            {
                let mut d = depot();
                let i = match d.iter().position(|x| x.layout == layout) {
                    Some(i) => i,
                    None => {
                        d.push(Depot {
                            layout,
                            full: Vec::new(),
                        });
                        d.len() - 1
                    }
                };
                let kept: usize = d[i].full.iter().map(|m| m.len).sum();
                if (kept + m.len) * layout.size() <= MAX_DEPOT_BYTES {
                    d[i].full.push(m);
                    return;
                }
            }
            m.free(layout);
        }

        /// A full magazine of `layout` from the depot, if it has one.
        fn depot_take(layout: Layout) -> Option<Mag> {
            depot().iter_mut().find(|x| x.layout == layout)?.full.pop()
        }

        /// A thread's magazines of one layout: `cur` is used first, `prev` is full or empty.
        struct Local {
            /// `None`: the slot is unused.
            layout: Option<Layout>,
            cur: Mag,
            prev: Mag,
        }

        struct Locals([Local; LAYOUTS]);

        impl Drop for Locals {
            fn drop(&mut self) {
                // Thread exit: the magazines serve other threads.
                for l in &mut self.0 {
                    if let Some(layout) = l.layout {
                        depot_put(layout, std::mem::replace(&mut l.cur, EMPTY));
                        depot_put(layout, std::mem::replace(&mut l.prev, EMPTY));
                    }
                }
            }
        }

        thread_local!(static LOCALS: RefCell<Locals> = const {
            RefCell::new(Locals([const { Local { layout: None, cur: EMPTY, prev: EMPTY } }; LAYOUTS]))
        });

        fn keepable(layout: Layout) -> bool {
            layout.size() >= size_of::<usize>() && layout.align() >= align_of::<usize>()
        }

        /// Keeps the free block `b` on this thread's magazine of `layout`, or frees it.
        ///
        /// # Safety
        /// `b` came from the global allocator with `layout`, holds no value, and nobody
        /// else uses or frees it.
        pub(super) unsafe fn put(b: *mut u8, layout: Layout) {
            let Some(nb) = NonNull::new(b).filter(|_| keepable(layout)) else {
                // SAFETY: by the contract.
                unsafe { std::alloc::dealloc(b, layout) };
                return;
            };
            let kept = LOCALS.try_with(|ls| {
                let Ok(mut ls) = ls.try_borrow_mut() else {
                    return false;
                };
                let i = match ls.0.iter().position(|l| l.layout == Some(layout)) {
                    Some(i) => i,
                    None => match ls.0.iter().position(|l| l.layout.is_none()) {
                        Some(i) => {
                            ls.0[i].layout = Some(layout);
                            i
                        }
                        None => return false,
                    },
                };
                let l = &mut ls.0[i];
                if l.cur.len >= MAG {
                    // `cur` is full: it becomes `prev`, and a full `prev` goes to the depot.
                    let full = std::mem::replace(&mut l.prev, std::mem::replace(&mut l.cur, EMPTY));
                    if full.len > 0 {
                        // The depot's lock is not taken under this thread's cell borrow
                        // in a way that could re-enter it: `depot_put` only locks and frees.
                        depot_put(layout, full);
                    }
                }
                // SAFETY: by the contract; `cur` is of `layout`.
                unsafe { l.cur.push(nb) };
                true
            });
            if kept != Ok(true) {
                // SAFETY: by the contract.
                unsafe { std::alloc::dealloc(b, layout) };
            }
        }

        /// A free block of `layout`: off this thread's magazines, or a full magazine from
        /// the depot; `None` when neither has one.
        pub(super) fn take(layout: Layout) -> Option<NonNull<u8>> {
            if !keepable(layout) {
                return None;
            }
            LOCALS
                .try_with(|ls| {
                    let mut ls = ls.try_borrow_mut().ok()?;
                    let i = match ls.0.iter().position(|l| l.layout == Some(layout)) {
                        Some(i) => i,
                        None => {
                            let i = ls.0.iter().position(|l| l.layout.is_none())?;
                            ls.0[i].layout = Some(layout);
                            i
                        }
                    };
                    let l = &mut ls.0[i];
                    if let Some(b) = l.cur.pop() {
                        return Some(b);
                    }
                    if l.prev.len > 0 {
                        std::mem::swap(&mut l.cur, &mut l.prev);
                    } else {
                        l.cur = depot_take(layout)?;
                    }
                    l.cur.pop()
                })
                .ok()
                .flatten()
        }

        /// Frees this thread's magazines and the depot's.
        pub(super) fn release() {
            let _ = LOCALS.try_with(|ls| {
                if let Ok(mut ls) = ls.try_borrow_mut() {
                    for l in &mut ls.0 {
                        if let Some(layout) = l.layout {
                            l.cur.free(layout);
                            l.prev.free(layout);
                        }
                    }
                }
            });
            let all = std::mem::take(&mut *depot());
            for mut d in all {
                for m in &mut d.full {
                    m.free(d.layout);
                }
            }
        }
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
            // SAFETY: by the caller's contract.
            unsafe { self.retire((p.cast::<()>(), free_box::<T>)) };
        }

        /// # Safety
        /// `r.1` frees `r.0` soundly on any thread once every thread pinned now has
        /// unpinned, and nothing else frees it.
        unsafe fn retire(&self, r: Retired) {
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

    /// Objects of one type retired through their link words ([`super::Linked`]) and not
    /// yet handed to crossbeam: a chain, newest first, ended by a null link.
    struct Chain {
        ty: std::any::TypeId,
        /// `free_chain::<T>` of the chain's type.
        free: unsafe fn(*mut ()),
        head: *mut (),
        len: usize,
    }

    /// A chain handed to crossbeam: freed (its memory recycled) after the grace period.
    struct ChainBatch {
        free: unsafe fn(*mut ()),
        head: *mut (),
    }

    // SAFETY: the objects are `Send` (`Linked`'s bound); the batch only carries them to
    // the thread that frees them.
    unsafe impl Send for ChainBatch {}

    /// Objects retired per chain before it is handed to crossbeam as one deferred
    /// function. Each deferred function takes a slot of crossbeam's thread-local bag, and
    /// every 64 of them the bag goes onto crossbeam's global queue in a newly allocated
    /// ~2 KB node: a request that large makes glibc consolidate every fastbin chunk of
    /// the process, inside the eviction that hands the batch over. At 256 per chain that
    /// is once per 16,384 evictions (it was once per 2,048 with [`BATCH`]), and a chain
    /// is linked through its objects, so no buffer is allocated per batch either.
    const CHAIN_BATCH: usize = 256;

    /// Types a thread keeps chains for (a fifth type's objects are handed over alone).
    const CHAIN_TYPES: usize = 4;

    /// This thread's chains; handed to crossbeam at thread exit and by [`flush`].
    struct Chains(std::cell::RefCell<[Option<Chain>; CHAIN_TYPES]>);

    impl Drop for Chains {
        fn drop(&mut self) {
            for c in self.0.get_mut().iter_mut() {
                if let Some(c) = c.take() {
                    submit_chain(&crossbeam_epoch::pin(), c.free, c.head);
                }
            }
        }
    }

    thread_local!(static CHAINS: Chains = const { Chains(std::cell::RefCell::new([const { None }; CHAIN_TYPES])) });

    /// Hands the chain `head` (freed by `free`) to crossbeam.
    fn submit_chain(g: &crossbeam_epoch::Guard, free: unsafe fn(*mut ()), head: *mut ()) {
        let b = ChainBatch { free, head };
        // SAFETY: every object on the chain was retired (unreachable for new readers)
        // before this call, so a grace period from now is one from each retirement.
        unsafe {
            g.defer_unchecked(move || {
                let b = b;
                // SAFETY: `free` is `free_chain::<T>` of the chain's `T`, and the grace
                // period has passed (this is the deferred function).
                (b.free)(b.head)
            })
        };
    }

    /// Drops every object of the chain `head` and recycles its memory ([`recycle_box`]).
    ///
    /// # Safety
    /// `head` is null or a chain of retired `T`s (boxes nobody else frees) linked through
    /// their `retire_link`, ended by a null link, whose grace period has passed.
    unsafe fn free_chain<T: super::Linked>(head: *mut ()) {
        let mut p = head.cast::<T>();
        while !p.is_null() {
            // SAFETY: `p` is on the chain: alive until freed just below; the link is read
            // before the object is dropped.
            let next = unsafe { (*p).retire_link().load(Ordering::Relaxed) };
            // SAFETY: by the contract.
            unsafe { recycle_box::<T>(p.cast()) };
            p = next;
        }
    }

    impl Guard {
        /// Drops `*p` and recycles its memory for this thread's next [`alloc_box`] of the
        /// same layout (see `recycle`) once every thread pinned now has unpinned. The
        /// object is linked onto this thread's chain of its type through its
        /// [`super::Linked::retire_link`] (no allocation), and the chain goes to
        /// crossbeam as one deferred function every [`CHAIN_BATCH`] objects. Handing a
        /// chain over later than its objects' retirement is always safe.
        ///
        /// # Safety
        /// `p` came from [`alloc_box`] (or `Box::into_raw`), nobody frees it otherwise or
        /// reads it once every walker pinned now has unpinned, and it is sound to drop it
        /// on another thread after this returns.
        pub(crate) unsafe fn defer_recycle<T: super::Linked>(&self, p: *mut T) {
            let ty = std::any::TypeId::of::<T>();
            // The chain is taken out of the cell before crossbeam gets it: a collection
            // run by `defer` may free objects whose `Drop` retires more.
            let full = CHAINS.try_with(|cs| {
                let mut cs = cs.0.try_borrow_mut().ok()?;
                let i = cs
                    .iter()
                    .position(|c| c.as_ref().is_some_and(|c| c.ty == ty))
                    .or_else(|| cs.iter().position(|c| c.is_none()))?;
                let c = cs[i].get_or_insert(Chain {
                    ty,
                    free: free_chain::<T>,
                    head: std::ptr::null_mut(),
                    len: 0,
                });
                // SAFETY: `p` is alive (retired, not freed); its link is ours from here.
                unsafe { (*p).retire_link().store(c.head.cast(), Ordering::Relaxed) };
                c.head = p.cast();
                c.len += 1;
                Some((c.len >= CHAIN_BATCH).then(|| cs[i].take()).flatten())
            });
            match full {
                Ok(Some(Some(c))) => submit_chain(&self.0, c.free, c.head),
                Ok(Some(None)) => {}
                // Chains being destroyed (thread exit), borrowed (a free run by a
                // collection retiring more), or no room for the type: hand it over alone.
                Ok(None) | Err(_) => {
                    // SAFETY: as above: the link is ours; a chain of one.
                    unsafe { (*p).retire_link().store(std::ptr::null_mut(), Ordering::Relaxed) };
                    submit_chain(&self.0, free_chain::<T>, p.cast());
                }
            }
        }
    }

    /// Hands this thread's chains to crossbeam.
    fn submit_chains() {
        let taken = CHAINS.try_with(|cs| {
            let mut cs = cs.0.try_borrow_mut().ok()?;
            Some(std::mem::replace(&mut *cs, [const { None }; CHAIN_TYPES]))
        });
        if let Ok(Some(cs)) = taken {
            for c in cs.into_iter().flatten() {
                submit_chain(&crossbeam_epoch::pin(), c.free, c.head);
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
        submit_chains();
        for _ in 0..256 {
            crossbeam_epoch::pin().flush();
        }
        recycle::release();
    }

    #[cfg(test)]
    mod tests {
        use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
        use std::sync::Arc;

        use super::*;
        use crate::epoch::Linked;
        use crate::sync::AtomicPtr;

        /// A retirable object that counts its drops.
        struct Obj {
            link: AtomicPtr<Obj>,
            drops: Arc<AtomicUsize>,
        }

        impl Drop for Obj {
            fn drop(&mut self) {
                self.drops.fetch_add(1, Relaxed);
            }
        }

        // SAFETY: `link` is used by nothing but the epoch.
        unsafe impl Linked for Obj {
            fn retire_link(&self) -> &AtomicPtr<Self> {
                &self.link
            }
        }

        fn obj(drops: &Arc<AtomicUsize>) -> std::ptr::NonNull<Obj> {
            alloc_box(Obj {
                link: AtomicPtr::new(std::ptr::null_mut()),
                drops: drops.clone(),
            })
        }

        #[test]
        fn every_recycled_object_is_dropped_once_and_its_memory_reused() {
            let drops = Arc::new(AtomicUsize::new(0));
            // More than a chain's worth, from two threads, so both full and partial chains
            // are handed over (by filling, by `flush`, and at thread exit).
            let n = 3 * 256 + 17;
            std::thread::scope(|s| {
                s.spawn(|| {
                    for _ in 0..n {
                        let p = obj(&drops);
                        // SAFETY: `p` is ours, nobody reads it.
                        unsafe { Domain.pin().defer_recycle(p.as_ptr()) };
                    }
                });
            });
            for _ in 0..n {
                let p = obj(&drops);
                // SAFETY: as above.
                unsafe { Domain.pin().defer_recycle(p.as_ptr()) };
            }
            for _ in 0..10_000 {
                if drops.load(Relaxed) == 2 * n {
                    break;
                }
                flush();
                std::thread::yield_now();
            }
            assert_eq!(drops.load(Relaxed), 2 * n);
            // A block this thread recycled is what the next allocation of the layout gets
            // (called directly: which thread runs a deferred free is crossbeam's choice).
            let p = obj(&drops);
            // SAFETY: `p` came from `alloc_box`, nobody else has it.
            unsafe { recycle_box::<Obj>(p.as_ptr().cast()) };
            assert_eq!(drops.load(Relaxed), 2 * n + 1);
            let q = obj(&drops);
            assert_eq!(p, q, "the freed block was not reused");
            // SAFETY: `q` came from `alloc_box`: freeing it as a box is sound.
            drop(unsafe { Box::from_raw(q.as_ptr()) });
            assert_eq!(drops.load(Relaxed), 2 * n + 2);
            flush();
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
            // SAFETY: by the caller's contract.
            unsafe { self.defer_box_then(p, |_| {}) };
        }

        /// # Safety
        /// As [`Guard::defer_free_box`] (the models free the memory: no recycling).
        pub(crate) unsafe fn defer_recycle<T: super::Linked>(&self, p: *mut T) {
            // The link word is the epoch's from here (normal builds chain retired objects
            // through it): a sentinel that must survive until the free shows that
            // nothing else (an LRU operation on an evicted inode) writes it after
            // retirement.
            let sentinel = std::ptr::dangling_mut::<T>();
            // SAFETY: `p` is alive until the deferred free below.
            unsafe { (*p).retire_link().store(sentinel, Ordering::Relaxed) };
            let sentinel = sentinel.addr();
            // SAFETY: by the caller's contract.
            unsafe {
                self.defer_box_then(p, move |b| {
                    assert!(
                        b.retire_link().load(Ordering::Relaxed).addr() == sentinel,
                        "the retire link of a retired object was written"
                    )
                })
            };
        }

        /// Frees the box `p` after the grace period, `check`ing it first.
        ///
        /// # Safety
        /// As [`Guard::defer_free_box`].
        unsafe fn defer_box_then<T: Send>(&self, p: *mut T, check: impl FnOnce(&T) + Send + 'static) {
            struct SendPtr<T>(*mut T);
            // SAFETY: the pointee is `Send`.
            unsafe impl<T: Send> Send for SendPtr<T> {}
            let p = SendPtr(p);
            // SAFETY: by the caller's contract.
            unsafe {
                self.defer(Box::new(move || {
                    let p = p;
                    let b = Box::from_raw(p.0);
                    check(&b);
                    drop(b);
                }))
            };
        }
    }

    /// A new box of `v` (the models do not recycle blocks).
    pub(crate) fn alloc_box<T>(v: T) -> std::ptr::NonNull<T> {
        std::ptr::NonNull::from(Box::leak(Box::new(v)))
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

pub(crate) use imp::{alloc_box, flush, Domain, Guard};
