//! A thread's list of finished batches of retired memory: pushed by whichever thread ran
//! the batch's deferred function (crossbeam runs a thread's deferred functions on any
//! thread that collects), taken by the thread that retired them, which frees them itself.
//! Linux does the same with RCU callbacks: `rcu_do_batch` invokes them on the CPU that
//! queued them, so an inode's memory goes back to that CPU's slab.
//!
//! Here that CPU is a thread and the slab is its glibc arena: a thread that frees memory of
//! another thread's arena takes that arena's lock (for chunks beyond the fastbins) and
//! meets its owner, who holds it through every consolidation. Profiled in the lab's unlink
//! at 2 tasks, that wait was most of the context switches (`__lll_lock_wait_private` in
//! `_int_free` under crossbeam's `Global::collect`).
//!
//! A Treiber stack with a `CLOSED` state for the owner's exit, and a bound: a push to a
//! closed list, or to one holding `max` batches the owner has not taken (it stopped
//! retiring, so it does not look), fails and the pusher frees the batch itself.

// Under the models only the loom test uses it (the epoch there is a model of its own).
#![cfg_attr(any(vfscale_loom, vfscale_shuttle), allow(dead_code))]

use crate::sync::{AtomicPtr, AtomicUsize, Ordering};

/// One entry of a [`Ready`] list.
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

/// The closed list's head (never a real pointer: `Link` is at least word-aligned).
const CLOSED: usize = 1;

/// A thread's finished batches (see the module docs).
pub(crate) struct Ready<T> {
    head: AtomicPtr<Link<T>>,
    /// Batches on the list, or about to be (a pusher counts before it links): never below
    /// the true count.
    len: AtomicUsize,
}

// SAFETY: the list owns its links (boxes of `T`) and hands each to exactly one taker:
// sending it between threads sends the `T`s.
unsafe impl<T: Send> Send for Ready<T> {}
// SAFETY: as above; every access to the head is atomic.
unsafe impl<T: Send> Sync for Ready<T> {}

impl<T> Ready<T> {
    pub(crate) fn new() -> Self {
        Ready {
            head: AtomicPtr::new(std::ptr::null_mut()),
            len: AtomicUsize::new(0),
        }
    }

    /// Adds `l`, or gives it back when the owner has closed the list (it exited) or
    /// `max` batches wait on it already.
    pub(crate) fn push(&self, mut l: Box<Link<T>>, max: usize) -> Result<(), Box<Link<T>>> {
        if self.len.fetch_add(1, Ordering::Relaxed) >= max {
            self.len.fetch_sub(1, Ordering::Relaxed);
            return Err(l);
        }
        let mut h = self.head.load(Ordering::Relaxed);
        loop {
            if h as usize == CLOSED {
                self.len.fetch_sub(1, Ordering::Relaxed);
                return Err(l);
            }
            l.next = h;
            let p = Box::into_raw(l);
            // Release: the taker's Acquire swap sees the link (and its batch) complete.
            match self
                .head
                .compare_exchange_weak(h, p, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(x) => {
                    h = x;
                    // SAFETY: `p` came from `Box::into_raw` just above and was not published.
                    l = unsafe { Box::from_raw(p) };
                }
            }
        }
    }

    /// Whether a [`take`](Self::take) would find nothing (a racy look, for the owner's
    /// cheap check before it swaps).
    pub(crate) fn is_empty(&self) -> bool {
        let h = self.head.load(Ordering::Relaxed);
        h.is_null() || h as usize == CLOSED
    }

    /// Takes every batch pushed so far (the owner), most recent first.
    pub(crate) fn take(&self) -> Taken<T> {
        self.take_leaving(std::ptr::null_mut())
    }

    /// Takes every batch and closes the list: later pushes fail (the owner, at exit).
    pub(crate) fn close(&self) -> Taken<T> {
        self.take_leaving(CLOSED as *mut Link<T>)
    }

    fn take_leaving(&self, rest: *mut Link<T>) -> Taken<T> {
        let h = if self.head.load(Ordering::Relaxed).is_null() && rest.is_null() {
            std::ptr::null_mut()
        } else {
            // Acquire: pairs with each push's Release.
            self.head.swap(rest, Ordering::Acquire)
        };
        let h = if h as usize == CLOSED {
            std::ptr::null_mut()
        } else {
            h
        };
        let mut n = 0;
        let mut p = h;
        while !p.is_null() {
            n += 1;
            // SAFETY: the swap made the chain ours; its links are live boxes.
            p = unsafe { (*p).next };
        }
        if n > 0 {
            self.len.fetch_sub(n, Ordering::Relaxed);
        }
        Taken(h)
    }
}

impl<T> Drop for Ready<T> {
    fn drop(&mut self) {
        drop(self.close());
    }
}

/// Batches taken from a [`Ready`] list; each is dropped unless consumed.
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
mod loom_ready {
    use super::*;
    use loom::sync::Arc;

    /// Counts its drops: each batch must end exactly once, taken by the owner or given
    /// back to its pusher after the owner closed the list.
    struct Batch(Arc<AtomicUsize>);
    impl Drop for Batch {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Two threads push (as deferred functions run on other threads do) while the owner
    /// takes and then closes (its exit): every batch is taken, or refused and dropped by
    /// its pusher, exactly once, and a taken batch's contents are seen complete.
    #[test]
    fn pushes_race_take_and_close() {
        loom::model(|| {
            let ready = Arc::new(Ready::<(Batch, usize)>::new());
            let dropped = Arc::new(AtomicUsize::new(0));
            let pushers: Vec<_> = (0..2)
                .map(|i| {
                    let (r, d) = (ready.clone(), dropped.clone());
                    loom::thread::spawn(move || {
                        if let Err(l) = r.push(Link::new((Batch(d), 10 + i)), 2) {
                            drop(l);
                        }
                    })
                })
                .collect();
            let mut seen = 0;
            for l in ready.take() {
                assert!(l.val.1 == 10 || l.val.1 == 11);
                seen += 1;
            }
            for l in ready.close() {
                assert!(l.val.1 == 10 || l.val.1 == 11);
                seen += 1;
            }
            for p in pushers {
                p.join().unwrap();
            }
            assert!(seen <= 2);
            assert_eq!(dropped.load(Ordering::Relaxed), 2);
            assert!(ready.is_empty());
            assert_eq!(ready.len.load(Ordering::Relaxed), 0);
        });
    }

    /// The bound: with `max` 1 and nobody taking, one of two pushes is refused; the
    /// owner then takes the other, and the count is back to 0.
    #[test]
    fn a_full_list_refuses() {
        loom::model(|| {
            let ready = Arc::new(Ready::<usize>::new());
            let refused = Arc::new(AtomicUsize::new(0));
            let pushers: Vec<_> = (0..2)
                .map(|i| {
                    let (r, f) = (ready.clone(), refused.clone());
                    loom::thread::spawn(move || {
                        if r.push(Link::new(i), 1).is_err() {
                            f.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                })
                .collect();
            for p in pushers {
                p.join().unwrap();
            }
            assert_eq!(refused.load(Ordering::Relaxed), 1);
            assert_eq!(ready.take().count(), 1);
            assert_eq!(ready.len.load(Ordering::Relaxed), 0);
        });
    }
}
