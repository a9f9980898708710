//! A lock-free list of batches of retired memory (a Treiber stack that is only ever
//! emptied whole, so it has no ABA problem): the orphan list of `epoch.rs`, holding the
//! stamped batches of threads that exited (or that queued more than they keep) before
//! their grace period ended, for whichever thread reclaims next.
//!
//! It can also be closed (later pushes fail) and bounded (a push to a list holding `max`
//! batches fails): the hand-back of finished batches to the thread that retired them used
//! both while the cache's deferred frees went through crossbeam-epoch (crossbeam runs
//! deferred functions on any thread that collects). The loom models below check all three.

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
    /// An empty list (`const`: the orphan list is a `static`).
    #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
    pub(crate) const fn new() -> Self {
        Ready {
            head: AtomicPtr::new(std::ptr::null_mut()),
            len: AtomicUsize::new(0),
        }
    }

    /// An empty list.
    #[cfg(any(vfscale_loom, vfscale_shuttle))]
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
    #[cfg_attr(not(vfscale_loom), allow(dead_code))]
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
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;

    /// Counts its drops: each batch must end exactly once, taken by the owner or given
    /// back to its pusher after the owner closed the list.
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
    /// `pushes_race_take_and_close` before this cell was added).
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

    /// Two threads push (as deferred functions run on other threads do) while the owner
    /// takes and then closes (its exit): every batch is taken, or refused and dropped by
    /// its pusher, exactly once, and a taken batch's contents are seen complete.
    #[test]
    fn pushes_race_take_and_close() {
        loom::model(|| {
            let ready = Arc::new(Ready::<Contents>::new());
            let dropped = Arc::new(AtomicUsize::new(0));
            let pushers: Vec<_> = (0..2)
                .map(|i| {
                    let (r, d) = (ready.clone(), dropped.clone());
                    loom::thread::spawn(move || {
                        if let Err(l) = r.push(contents(d, 10 + i), 2) {
                            drop(l);
                        }
                    })
                })
                .collect();
            let mut seen = 0;
            for l in ready.take() {
                assert!(read(&l) == 10 || read(&l) == 11);
                seen += 1;
            }
            for l in ready.close() {
                assert!(read(&l) == 10 || read(&l) == 11);
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

    /// A thread exits (closes its list) while another pushes to it and the list is then
    /// dropped by whoever holds it last (the pusher's `Arc`, as a deferred function's
    /// `home`): the batch is dropped exactly once, by the closer or by its pusher, and a
    /// push after the close is refused (the list stays closed and empty).
    #[test]
    fn close_races_a_push_and_the_last_drop() {
        loom::model(|| {
            let ready = Arc::new(Ready::<Contents>::new());
            let dropped = Arc::new(AtomicUsize::new(0));
            let (r, d, d2) = (ready.clone(), dropped.clone(), dropped.clone());
            let pusher = loom::thread::spawn(move || {
                let ok = r.push(contents(d, 7), 64).is_ok();
                // After the owner closed, nothing can be added any more.
                let late = r.push(contents(d2, 8), 64);
                (ok, late.is_ok(), r)
            });
            let mut closed = 0;
            for l in ready.close() {
                assert!(read(&l) == 7 || read(&l) == 8);
                closed += 1;
            }
            drop(ready);
            let (ok, late, r) = pusher.join().unwrap();
            assert_eq!(closed, usize::from(ok) + usize::from(late));
            // The second push follows the first in program order: it cannot be taken
            // unless the first was.
            assert!(ok || !late);
            assert!(r.is_empty());
            drop(r);
            assert_eq!(dropped.load(Ordering::Relaxed), 2);
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
