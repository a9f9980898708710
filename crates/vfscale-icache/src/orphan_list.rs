//! A lock-free list of batches of retired memory (a Treiber stack that is only ever
//! emptied whole, so it has no ABA problem): the orphan list of `deferred_free.rs`,
//! holding the stamped batches of threads that exited (or that queued more than they
//! keep) before their grace period ended, for whichever thread reclaims next. The loom
//! model below checks it.

// Under the models only the loom test uses it (the epoch there is a model of its own).
#![cfg_attr(any(vfscale_loom, vfscale_shuttle), allow(dead_code))]

use crate::sync::{AtomicPtr, Ordering};

/// One entry of an [`OrphanList`].
pub(crate) struct Link<T> {
    next: *mut Link<T>,
    /// The batch.
    pub(crate) val: T,
}

impl<T> Link<T> {
    pub(crate) fn new(val: T) -> Box<Link<T>> {
        Box::new(Link {
            next: std::ptr::null_mut(),
            val,
        })
    }
}

/// A list of batches (see the module docs).
pub(crate) struct OrphanList<T> {
    head: AtomicPtr<Link<T>>,
}

// SAFETY: the list owns its links (boxes of `T`) and hands each to exactly one taker:
// sending it between threads sends the `T`s.
unsafe impl<T: Send> Send for OrphanList<T> {}
// SAFETY: as above; every access to the head is atomic.
unsafe impl<T: Send> Sync for OrphanList<T> {}

impl<T> OrphanList<T> {
    /// An empty list (`const`: the orphan list is a `static`).
    #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
    pub(crate) const fn new() -> Self {
        OrphanList {
            head: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// An empty list.
    #[cfg(any(vfscale_loom, vfscale_shuttle))]
    pub(crate) fn new() -> Self {
        OrphanList {
            head: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// Adds `l`.
    pub(crate) fn push(&self, mut l: Box<Link<T>>) {
        let mut h = self.head.load(Ordering::Relaxed);
        loop {
            l.next = h;
            let p = Box::into_raw(l);
            // Release: the taker's Acquire swap sees the link (and its batch) complete.
            match self
                .head
                .compare_exchange_weak(h, p, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(x) => {
                    h = x;
                    // SAFETY: `p` came from `Box::into_raw` just above and was not published.
                    l = unsafe { Box::from_raw(p) };
                }
            }
        }
    }

    /// Whether a [`take`](Self::take) would find nothing (a racy look, for a cheap check
    /// before the swap).
    pub(crate) fn is_empty(&self) -> bool {
        self.head.load(Ordering::Relaxed).is_null()
    }

    /// Takes every batch pushed so far, most recent first; a racy look first spares an
    /// empty list the swap.
    pub(crate) fn take(&self) -> Taken<T> {
        if self.is_empty() {
            return Taken(std::ptr::null_mut());
        }
        self.swap_all()
    }

    /// [`take`](Self::take) without the look.
    fn swap_all(&self) -> Taken<T> {
        // Acquire: pairs with each push's Release.
        Taken(self.head.swap(std::ptr::null_mut(), Ordering::Acquire))
    }
}

impl<T> Drop for OrphanList<T> {
    fn drop(&mut self) {
        drop(self.swap_all());
    }
}

/// Batches taken from a [`OrphanList`] list; each is dropped unless consumed.
pub(crate) struct Taken<T>(*mut Link<T>);

impl<T> Iterator for Taken<T> {
    type Item = Box<Link<T>>;
    fn next(&mut self) -> Option<Box<Link<T>>> {
        if self.0.is_null() {
            return None;
        }
        // SAFETY: every link on a taken chain came from `Box::into_raw` in `push`, and the
        // swap that took the chain made this iterator its only owner.
        let l = unsafe { Box::from_raw(self.0) };
        self.0 = l.next;
        Some(l)
    }
}

impl<T> Drop for Taken<T> {
    fn drop(&mut self) {
        for _ in self.by_ref() {}
    }
}

#[cfg(all(test, vfscale_loom))]
mod loom_orphan_list {
    use super::*;
    use crate::sync::AtomicUsize;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;

    /// Counts its drops: each batch must end exactly once, taken or dropped with the list.
    struct Batch(Arc<AtomicUsize>);
    impl Drop for Batch {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A batch's contents: a plain field the pusher writes just before its push and the
    /// taker reads, as the retired pointers of a real batch. loom reports a causality
    /// violation unless the push's Release and the take's Acquire order the two (a plain
    /// `usize` in the link is not tracked: weakening either ordering to Relaxed passed
    /// the model before this cell was added).
    struct Contents(Batch, UnsafeCell<usize>);

    fn contents(d: Arc<AtomicUsize>, v: usize) -> Box<Link<Contents>> {
        let l = Link::new(Contents(Batch(d), UnsafeCell::new(0)));
        // SAFETY: the link is ours until pushed.
        l.val.1.with_mut(|p| unsafe { *p = v });
        l
    }

    fn read(l: &Link<Contents>) -> usize {
        // SAFETY: a taken link is the taker's alone (its pusher's write is ordered before
        // by the Release/Acquire pair the model checks).
        l.val.1.with(|p| unsafe { *p })
    }

    /// Two threads push (exiting threads orphaning batches) while another takes (a
    /// reclaim), then the list is dropped with what is left: every batch ends exactly
    /// once, and a taken batch's contents are seen complete. The racing take is the swap
    /// itself: loom lets `take`'s relaxed look read the empty head in every execution, so
    /// through `take` the model would never race a push.
    #[test]
    fn pushes_race_take_and_the_last_drop() {
        loom::model(|| {
            let ready = Arc::new(OrphanList::<Contents>::new());
            let dropped = Arc::new(AtomicUsize::new(0));
            let pushers: Vec<_> = (0..2)
                .map(|i| {
                    let (r, d) = (ready.clone(), dropped.clone());
                    loom::thread::spawn(move || r.push(contents(d, 10 + i)))
                })
                .collect();
            let mut seen = 0;
            for l in ready.swap_all() {
                assert!(read(&l) == 10 || read(&l) == 11);
                seen += 1;
            }
            assert_eq!(dropped.load(Ordering::Relaxed), seen);
            for p in pushers {
                p.join().unwrap();
            }
            drop(ready);
            assert_eq!(dropped.load(Ordering::Relaxed), 2);
        });
    }
}
