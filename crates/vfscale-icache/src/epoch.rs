//! Grace periods without allocation: the epoch scheme behind the cache's deferred frees
//! (what RCU is to `fs/inode.c`'s `i_callback`).
//!
//! A reader ([`read_lock`]) publishes, in its own [`Record`], the global epoch it saw,
//! then a full fence; it reads shared pointers; [`read_unlock`] clears the record
//! (Release). A writer unlinks an object, then reads a [`stamp`] (a full fence, then the
//! global epoch). The epoch moves from `e` to `e + 1` only when every record that is
//! inside a read-side section shows `e` ([`try_advance`]). So once the epoch is two past
//! an object's stamp, every reader that could have reached the object has left, and the
//! writer may free it ([`expired`]).
//!
//! Why two: a reader inside a section shows `e` or `e - 1` (it may have published a stale
//! epoch it read just before an advance), so the epoch is never more than one past any
//! reader's; a reader that reached an object before its unlink is ordered before the
//! stamp's fence, shows an epoch `<=` the stamp, and holds the epoch below `stamp + 2`
//! until it leaves. The advancer reads each record after a SeqCst fence and before an
//! Acquire fence, and the new epoch is stored with Release: a free after reading that
//! epoch happens after every such reader's `read_unlock`.
//!
//! This is the protocol of crossbeam-epoch (Fraser's epoch-based reclamation), without
//! its garbage queue: crossbeam allocates a ~2 KB node for every 64 deferred functions,
//! and in a process that frees many small objects (an unlink storm) an allocation that
//! large makes glibc consolidate every fastbin chunk. The cache keeps its garbage itself,
//! per thread (`deferred_free.rs`).
//!
//! Records are never freed (a thread's record is reused by later threads), so the list of
//! records is append-only and walked without a lock.
//!
//! Loom models: `loom_epoch` below (a reader against a writer that frees once the epoch is
//! two past its stamp; a reader that pins twice across advances; a stamp newer than a
//! reclaimer's epoch; a second advancer and a record reused while the writer walks).

// Under the models only the loom tests below use it (the cache's epoch is a model there).
#![cfg_attr(any(vfscale_loom, vfscale_shuttle), allow(dead_code))]

use crossbeam_utils::CachePadded;

use crate::sync::{fence, AtomicBool, AtomicPtr, AtomicUsize, Ordering};

/// A participant's published state: 0 outside a read-side section, `(epoch << 1) | 1`
/// inside one.
pub(crate) struct Record {
    state: AtomicUsize,
    /// Claimed by a thread (records outlive their threads and are reused).
    in_use: AtomicBool,
    /// Sections still open when the owning thread's bookkeeping went (thread exit with a
    /// guard alive): the last of them to end leaves the section and releases the record.
    pub(crate) orphaned_depth: AtomicUsize,
    /// The next record; written once, before the record is published.
    next: *const CachePadded<Record>,
}

/// The global epoch and the list of records.
pub(crate) struct Global {
    epoch: CachePadded<AtomicUsize>,
    records: AtomicPtr<CachePadded<Record>>,
}

// SAFETY: the records are shared through atomics and `next` is immutable once published.
unsafe impl Send for Global {}
// SAFETY: as above.
unsafe impl Sync for Global {}
// SAFETY: a record is only accessed through its atomics.
unsafe impl Send for Record {}
// SAFETY: as above.
unsafe impl Sync for Record {}

impl Global {
    /// An empty domain (epoch 0, no record).
    #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
    pub(crate) const fn new() -> Self {
        Global {
            epoch: CachePadded::new(AtomicUsize::new(0)),
            records: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// An empty domain (epoch 0, no record).
    #[cfg(any(vfscale_loom, vfscale_shuttle))]
    pub(crate) fn new() -> Self {
        Global {
            epoch: CachePadded::new(AtomicUsize::new(0)),
            records: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// Claims a record for the calling thread: a released one if there is one, else a
    /// new one, published at the head of the list. Give it back with [`release`].
    pub(crate) fn register(&self) -> &Record {
        let mut p = self.records.load(Ordering::Acquire);
        while !p.is_null() {
            // SAFETY: published records are never freed while the domain lives.
            let r = unsafe { &*p };
            if !r.in_use.load(Ordering::Relaxed)
                && r.in_use
                    .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return r;
            }
            p = r.next.cast_mut();
        }
        let r = Box::into_raw(Box::new(CachePadded::new(Record {
            state: AtomicUsize::new(0),
            in_use: AtomicBool::new(true),
            orphaned_depth: AtomicUsize::new(0),
            next: std::ptr::null(),
        })));
        let mut head = self.records.load(Ordering::Relaxed);
        loop {
            // SAFETY: `r` is ours until the exchange below publishes it.
            let mine: &mut CachePadded<Record> = unsafe { &mut *r };
            mine.next = head;
            // Release: a walker that loads `r` sees its fields initialized.
            match self
                .records
                .compare_exchange_weak(head, r, Ordering::Release, Ordering::Relaxed)
            {
                // SAFETY: published, and never freed while the domain lives.
                Ok(_) => return unsafe { &*r },
                Err(h) => head = h,
            }
        }
    }
}

impl Drop for Global {
    fn drop(&mut self) {
        let mut p = self.records.load(Ordering::Acquire);
        while !p.is_null() {
            // SAFETY: the domain is going, so nobody holds its records; each came from
            // `Box::into_raw` in `register`.
            let r = unsafe { Box::from_raw(p) };
            p = r.next.cast_mut();
        }
    }
}

/// Gives a record back (its thread exits). The caller is outside any read-side section.
pub(crate) fn release(r: &Record) {
    debug_assert_eq!(
        r.state.load(Ordering::Relaxed),
        0,
        "a record released inside a section"
    );
    r.in_use.store(false, Ordering::Release);
}

/// Enters a read-side section on record `r` (not nested: the caller counts nesting).
#[inline]
pub(crate) fn read_lock(g: &Global, r: &Record) {
    let e = g.epoch.load(Ordering::Relaxed);
    let s = (e << 1) | 1;
    #[cfg(all(target_arch = "x86_64", not(any(vfscale_loom, vfscale_shuttle))))]
    {
        // A locked RMW is a full barrier on x86 and cheaper than `mfence`: this swap is
        // the (Release, see below) store and the SeqCst fence at once (as crossbeam-epoch
        // pins on x86). The compiler fence keeps later loads after it in the compiler's
        // view too.
        r.state.swap(s, Ordering::SeqCst);
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
    }
    #[cfg(not(all(target_arch = "x86_64", not(any(vfscale_loom, vfscale_shuttle)))))]
    {
        // Release, not Relaxed: an advancer that reads this state (this section's epoch,
        // equal to the current one) must also see the previous section of this record end
        // (its reads happen before the free that follows the advance); since C++20 a
        // relaxed store no longer carries an earlier release along (loom checks it).
        r.state.store(s, Ordering::Release);
        fence(Ordering::SeqCst);
    }
}

/// Leaves the read-side section on record `r`.
#[inline]
pub(crate) fn read_unlock(r: &Record) {
    // Release: everything read inside the section happens before an advancer that sees
    // the record clear (and so before a free after that advance).
    r.state.store(0, Ordering::Release);
}

/// The stamp of objects unlinked before this call: free them once [`expired`].
pub(crate) fn stamp(g: &Global) -> usize {
    fence(Ordering::SeqCst);
    g.epoch.load(Ordering::Relaxed)
}

/// Moves the epoch on if every record inside a section shows the current one; returns the
/// epoch after the attempt, read so that a free of what it shows [`expired`] happens after
/// the sections that held it back.
pub(crate) fn try_advance(g: &Global) -> usize {
    let e = g.epoch.load(Ordering::Relaxed);
    fence(Ordering::SeqCst);
    let mut p = g.records.load(Ordering::Acquire);
    while !p.is_null() {
        // SAFETY: published records are never freed while the domain lives.
        let r = unsafe { &*p };
        let s = r.state.load(Ordering::Relaxed);
        if s & 1 == 1 && s >> 1 != e {
            // Someone is still in a section of the previous epoch. The SeqCst fence
            // above orders this `e` before frees of what it shows expired.
            return e;
        }
        p = r.next.cast_mut();
    }
    // Acquire: every section seen ended (Release in `read_unlock`) before what follows.
    fence(Ordering::Acquire);
    // A compare-exchange, not a store: two advancers of `e` store `e + 1` once.
    match g
        .epoch
        .compare_exchange(e, e.wrapping_add(1), Ordering::AcqRel, Ordering::Acquire)
    {
        Ok(_) => e.wrapping_add(1),
        Err(now) => now,
    }
}

/// Whether objects stamped `stamp` may be freed, the epoch being `now` (from
/// [`try_advance`]). `now` may be older than `stamp` (a reclaim reads the epoch once, then
/// frees batches stamped since, by other threads or by `Drop`s it ran): the difference is
/// signed, as crossbeam's `Epoch::wrapping_sub` (unsigned, `now - stamp` wrapped to a huge
/// value and freed a batch stamped `now + 1`, test
/// `a_reclaim_with_an_older_epoch_frees_no_newer_orphan`).
#[inline]
pub(crate) fn expired(stamp: usize, now: usize) -> bool {
    now.wrapping_sub(stamp) as isize >= 2
}

#[cfg(all(test, vfscale_loom))]
mod loom_epoch {
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;

    /// An object readers reach through `shared`; "freed" is a write to its cell, which
    /// loom reports as a race with any read not ordered before it.
    struct Obj(UnsafeCell<usize>);

    struct World {
        g: Global,
        shared: AtomicPtr<Obj>,
    }

    fn world() -> (Arc<World>, *mut Obj, *mut Obj) {
        let a = Box::into_raw(Box::new(Obj(UnsafeCell::new(1))));
        let b = Box::into_raw(Box::new(Obj(UnsafeCell::new(2))));
        let w = Arc::new(World {
            g: Global::new(),
            shared: AtomicPtr::new(a),
        });
        (w, a, b)
    }

    /// Reads the object `shared` points at inside one section, and checks it was not
    /// freed.
    fn read_once(w: &World, r: &Record) {
        read_lock(&w.g, r);
        let p = w.shared.load(Ordering::Acquire);
        // SAFETY: inside the section the object is not freed (what the model checks).
        let v = unsafe { (*p).0.with(|v| *v) };
        read_unlock(r);
        assert!(v == 1 || v == 2, "read a freed object ({v})");
    }

    /// Unlinks `a` (publishing `b`), then tries to advance `tries` times; "frees" `a` (a
    /// write to its cell) if its stamp expired.
    fn write(w: &World, a: *mut Obj, b: *mut Obj, tries: usize) {
        w.shared.store(b, Ordering::Release);
        let s = stamp(&w.g);
        for _ in 0..tries {
            if expired(s, try_advance(&w.g)) {
                // SAFETY: expired: no reader can reach `a` any more (checked by loom).
                unsafe { (*a).0.with_mut(|v| *v = 0) };
                return;
            }
        }
    }

    /// Runs `reader` on a spawned thread (on a record of its own) against `writer` on
    /// this one, then `after` once both are done.
    fn model(reader: fn(&World, &Record), writer: fn(&World, *mut Obj, *mut Obj), after: fn(&World)) {
        loom::model(move || {
            let (w, a, b) = world();
            let w2 = w.clone();
            let t = loom::thread::spawn(move || {
                let r = w2.g.register();
                reader(&w2, r);
                release(r);
            });
            writer(&w, a, b);
            t.join().unwrap();
            after(&w);
            // SAFETY: both threads are done.
            unsafe {
                drop(Box::from_raw(a));
                drop(Box::from_raw(b));
            }
        });
    }

    /// A reader against a writer that frees as soon as the epoch allows (and is a
    /// participant itself, as a pinned evictor in the cache): no read of a freed object.
    #[test]
    fn a_reader_never_sees_a_freed_object() {
        model(
            read_once,
            |w, a, b| {
                let r = w.g.register();
                read_lock(&w.g, r);
                read_unlock(r);
                write(w, a, b, 3);
                release(r);
            },
            |_| {},
        );
    }

    /// A reader that enters twice (the second time possibly with a stale epoch, read just
    /// before an advance) against a writer advancing as often as it can: still no read of
    /// a freed object. Also: with no reader in a section, two advances expire a stamp.
    #[test]
    fn a_reader_entering_twice_across_advances() {
        model(
            |w, r| {
                read_once(w, r);
                read_once(w, r);
            },
            |w, a, b| write(w, a, b, 4),
            |w| {
                let s = stamp(&w.g);
                try_advance(&w.g);
                assert!(expired(s, try_advance(&w.g)));
            },
        );
    }

    /// The epoch moved on by a thread the writer never synchronized with: a reader that
    /// advanced it itself, then entered (at the new epoch) and read the old object. The
    /// writer's stamp must still not be older than that epoch (the fence in [`stamp`]),
    /// or one more advance would free the object under the reader.
    #[test]
    fn a_stamp_is_not_older_than_a_reader_that_saw_the_object() {
        model(
            |w, r| {
                try_advance(&w.g);
                read_once(w, r);
            },
            |w, a, b| write(w, a, b, 2),
            |_| {},
        );
    }

    /// A reclaimer reads the epoch (`now`), then a batch is stamped after the epoch moved
    /// on (here the reclaimer's own unlink, after the reader advanced and entered): the
    /// stamp is `now + 1`, and the batch is not expired (`now - stamp` wrapped to a huge
    /// unsigned value, and the object was freed under the reader).
    #[test]
    fn a_stamp_newer_than_a_reclaimers_epoch_is_not_expired() {
        model(
            |w, r| {
                try_advance(&w.g);
                read_once(w, r);
            },
            |w, a, b| {
                let now = try_advance(&w.g);
                w.shared.store(b, Ordering::Release);
                let s = stamp(&w.g);
                if expired(s, now) {
                    // SAFETY: expired: no reader can reach `a` any more (checked by loom).
                    unsafe { (*a).0.with_mut(|v| *v = 0) };
                }
            },
            |_| {},
        );
    }

    /// Three participants: a thread that pins once, releases its record and advances
    /// twice (a second advancer, racing the writer's compare-exchange); a reader that
    /// registers meanwhile (possibly reusing that released record while the writer's
    /// advance walks the list); the writer, freeing as soon as the epoch allows.
    #[test]
    fn a_reused_record_and_two_advancers() {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(|| {
            let (w, a, bb) = world();
            let (w1, w2) = (w.clone(), w.clone());
            let t1 = loom::thread::spawn(move || {
                let r = w1.g.register();
                read_lock(&w1.g, r);
                read_unlock(r);
                release(r);
                try_advance(&w1.g);
                try_advance(&w1.g);
            });
            let t2 = loom::thread::spawn(move || {
                let r = w2.g.register();
                read_once(&w2, r);
                release(r);
            });
            write(&w, a, bb, 3);
            t1.join().unwrap();
            t2.join().unwrap();
            // SAFETY: every thread is done.
            unsafe {
                drop(Box::from_raw(a));
                drop(Box::from_raw(bb));
            }
        });
    }

    /// Two threads register at once: each gets its own record; a released record is
    /// handed out again.
    #[test]
    fn registration_races() {
        loom::model(|| {
            let g = Arc::new(Global::new());
            let g2 = g.clone();
            let t = loom::thread::spawn(move || g2.register() as *const Record as usize);
            let mine = g.register() as *const Record as usize;
            let theirs = t.join().unwrap();
            assert_ne!(mine, theirs, "one record handed to two threads");
            // SAFETY: the record lives as long as `g`.
            release(unsafe { &*(theirs as *const Record) });
            let again = g.register() as *const Record as usize;
            assert_eq!(again, theirs, "a released record is not reused");
        });
    }
}
