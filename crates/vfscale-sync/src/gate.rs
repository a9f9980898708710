//! The dispatch gate: which threads of a pool read one shared request queue.
//!
//! A pool of threads serves one queue that only a blocking read can take from (a FUSE
//! connection's `/dev/fuse`). Left alone, every idle thread blocks in the read and the
//! kernel wakes them in FIFO order, so a client that sends one request at a time has
//! each served by the thread that has been idle longest: a wake-up and a cold cache per
//! request, on whichever CPU that thread last ran. The gate lets one thread serve such a
//! stream by itself and parks the spares in userspace, last in first out, until there
//! is work for them.
//!
//! # Rules
//!
//! * `readers` counts the threads that are reading or about to (a thread counts itself,
//!   or is counted by the thread that wakes it).
//! * A thread that is done with a request reads again if no thread reads, or if its
//!   own last read found a request already queued (the queue is busy); otherwise it
//!   parks. It parks only under the `spares` lock and only when it sees a reader there.
//! * A thread that takes a request and leaves no reader behind wakes a spare when the
//!   request may block or its read found the queue busy, checked again under the
//!   `spares` lock. A request that is neither is served by the thread that read it, and
//!   the requests behind it wait at most as long as it takes.
//! * [`DispatchGate::blocking`]: a thread about to wait on something that may take long
//!   wakes a spare if no thread reads.
//! * [`DispatchGate::leave`]: a reader whose thread fails leaves, and a spare takes its
//!   place if it was the last; [`DispatchGate::close`] ends the pool (the queue is gone).
//!
//! So whenever no thread reads, some thread is serving a request that does not block,
//! and it reads again when done: no request waits for a thread that will not come.
//!
//! # Lock order
//!
//! `spares` → a spare's `state`. `readers` is an atomic, read again under `spares`
//! where a decision to park or wake depends on it.
//!
//! ```
//! use vfscale_sync::DispatchGate;
//!
//! let gate = DispatchGate::new(2);
//! assert!(gate.before_read(0, false)); // nobody reads: thread 0 reads
//! gate.after_read(false, false); // a request that cannot block: thread 0 serves it
//! assert!(gate.before_read(0, false)); // and reads again
//! gate.close();
//! assert!(!gate.before_read(1, false));
//! ```

use crate::{AtomicBool, AtomicUsize, Condvar, Mutex, Ordering};

/// What a parked thread was woken for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Spare {
    /// Parked, not woken yet.
    Parked,
    /// Woken to read, already counted in `readers`.
    Read,
    /// Woken because the pool is closing.
    Closed,
}

/// One thread's parking place.
#[derive(Debug)]
struct Slot {
    state: Mutex<Spare>,
    wake: Condvar,
}

/// The parked threads, most recently parked last.
#[derive(Debug, Default)]
struct Spares {
    parked: Vec<usize>,
    /// Times a thread parked, and times one was woken to read.
    parks: u64,
    wakes: u64,
}

/// Decides which of a pool of threads read a shared queue (see the module's rules).
#[derive(Debug)]
pub struct DispatchGate {
    readers: AtomicUsize,
    /// Set under the `spares` lock, so a thread deciding there to park sees it; read
    /// without the lock elsewhere.
    closed: AtomicBool,
    spares: Mutex<Spares>,
    slots: Vec<Slot>,
}

impl DispatchGate {
    /// A gate for `threads` threads, numbered from 0.
    pub fn new(threads: usize) -> Self {
        DispatchGate {
            readers: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            spares: Mutex::new(Spares::default()),
            slots: (0..threads)
                .map(|_| Slot {
                    state: Mutex::new(Spare::Parked),
                    wake: Condvar::new(),
                })
                .collect(),
        }
    }

    /// Before thread `thread` reads: returns true when it should read (it is counted as a
    /// reader), after parking if other threads read; false once the gate is closed.
    /// `busy`: the thread's last read found a request already queued.
    pub fn before_read(&self, thread: usize, busy: bool) -> bool {
        if busy || self.readers.load(Ordering::Acquire) == 0 {
            self.readers.fetch_add(1, Ordering::AcqRel);
            return true;
        }
        let slot = &self.slots[thread];
        {
            let mut spares = self.spares.lock();
            if self.closed.load(Ordering::Acquire) {
                return false;
            }
            if self.readers.load(Ordering::Acquire) == 0 {
                self.readers.fetch_add(1, Ordering::AcqRel);
                return true;
            }
            *slot.state.lock() = Spare::Parked;
            spares.parked.push(thread);
            spares.parks += 1;
        }
        let mut state = slot.state.lock();
        while *state == Spare::Parked {
            slot.wake.wait_until(&mut state, None);
        }
        *state == Spare::Read
    }

    /// After a reader took a request: `may_block`, the request may wait for long;
    /// `busy`, the read found it already queued. Wakes a spare to read when this leaves
    /// no reader and either holds.
    pub fn after_read(&self, may_block: bool, busy: bool) {
        let left = self.readers.fetch_sub(1, Ordering::AcqRel) - 1;
        if left == 0 && (may_block || busy) {
            let _ = self.wake_spare();
        }
    }

    /// The calling thread, serving a request, is about to wait on something that may take
    /// long: a spare reads meanwhile if no thread does. Returns whether one was woken.
    pub fn blocking(&self) -> bool {
        self.readers.load(Ordering::Acquire) == 0 && self.wake_spare()
    }

    /// Ends the pool: every parked thread and every later [`before_read`] that would park
    /// returns false.
    ///
    /// [`before_read`]: Self::before_read
    pub fn close(&self) {
        let parked = {
            let mut spares = self.spares.lock();
            self.closed.store(true, Ordering::Release);
            std::mem::take(&mut spares.parked)
        };
        for t in parked {
            self.wake(t, Spare::Closed);
        }
    }

    /// A reader leaves the pool for good while the queue goes on (its thread failed): a
    /// spare reads in its place if no thread reads.
    pub fn leave(&self) {
        if self.readers.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _ = self.wake_spare();
        }
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The threads reading or about to (for tests and counters).
    pub fn readers(&self) -> usize {
        self.readers.load(Ordering::Acquire)
    }

    /// How many times a thread parked, and how many times one was woken to read.
    pub fn parks_and_wakes(&self) -> (u64, u64) {
        let s = self.spares.lock();
        (s.parks, s.wakes)
    }

    /// Wakes the most recently parked spare to read, if no thread reads. Returns whether
    /// one was woken.
    fn wake_spare(&self) -> bool {
        let t = {
            let mut spares = self.spares.lock();
            if self.readers.load(Ordering::Acquire) > 0 {
                return false;
            }
            let Some(t) = spares.parked.pop() else {
                return false;
            };
            spares.wakes += 1;
            self.readers.fetch_add(1, Ordering::AcqRel);
            t
        };
        self.wake(t, Spare::Read);
        true
    }

    fn wake(&self, thread: usize, why: Spare) {
        let slot = &self.slots[thread];
        *slot.state.lock() = why;
        slot.wake.notify_all();
    }
}

#[cfg(all(test, not(any(vfscale_loom, vfscale_shuttle))))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn one_reader_serves_a_serial_stream() {
        let g = DispatchGate::new(4);
        for _ in 0..10 {
            assert!(g.before_read(0, false));
            assert_eq!(g.readers(), 1);
            g.after_read(false, false);
            assert_eq!(g.readers(), 0);
        }
    }

    /// A gate whose thread 0 reads and whose thread 1 has parked behind it.
    fn reader_and_parked_spare() -> (Arc<DispatchGate>, std::thread::JoinHandle<bool>) {
        let g = Arc::new(DispatchGate::new(2));
        assert!(g.before_read(0, false));
        let g2 = g.clone();
        let h = std::thread::spawn(move || g2.before_read(1, false));
        while g.spares.lock().parked.is_empty() {
            std::thread::yield_now();
        }
        (g, h)
    }

    #[test]
    fn a_blocking_request_wakes_a_parked_spare() {
        let (g, spare) = reader_and_parked_spare();
        g.after_read(true, false);
        assert!(spare.join().unwrap(), "the spare was woken to read");
        assert_eq!(g.readers(), 1);
    }

    #[test]
    fn close_releases_parked_threads() {
        let (g, spare) = reader_and_parked_spare();
        g.close();
        assert!(!spare.join().unwrap());
    }

    #[test]
    fn a_leaving_reader_hands_its_place_to_a_spare() {
        let (g, spare) = reader_and_parked_spare();
        g.leave();
        assert!(
            spare.join().unwrap(),
            "the spare reads in the failed thread's place"
        );
        assert_eq!(g.readers(), 1);
    }
}
