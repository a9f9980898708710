//! Replies over a ring: what a [`ReplySender::Ring`](crate::reply::ReplySender) does.
//!
//! A reply may come while its request is still being dispatched on the queue thread
//! (the common case), or later from any thread (a parked request). The entry's memory
//! holds the request until its dispatch returns, so a reply during dispatch is kept in
//! the entry's slot and written by the queue thread afterwards; a reply to a parked
//! entry is written at once and handed to the queue thread, which commits it.

use std::io;
use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;

use crate::uring::entry::RingEntry;
use crate::uring::offload::SlowSource;
use crate::uring::stats::QueueCounters;

/// Where an entry is in its cycle; changed only under [`Slot`]'s lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// The kernel has the entry (registered, or committed and fetching).
    Fetching,
    /// Handed to a worker, which has not taken it yet (see [`offload`](super::offload)).
    Queued,
    /// The queue thread (or a worker) dispatches the request in it.
    Dispatching,
    /// Dispatched, not answered yet.
    Parked,
    /// Answered; the queue thread commits it next.
    Replied,
}

/// An entry's phase and, for a reply made during dispatch, the reply's bytes.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) phase: Phase,
    /// `fuse_out_header` and payload of a reply made while dispatching; its capacity is
    /// kept from one request to the next.
    pub(crate) pending: Vec<u8>,
    /// The request went to a worker: its commit ends an offload, not a park.
    pub(crate) offloaded: bool,
}

/// What a queue's thread shares with the replies to its entries.
#[derive(Debug)]
pub(crate) struct QueueShared {
    pub(crate) qid: u16,
    /// Replied parked entries, to commit.
    pub(crate) commits: Mutex<Vec<Arc<RingEntry>>>,
    /// Every entry registered on the queue (pushed by its thread, read by the sweep).
    pub(crate) entries: Mutex<Vec<Arc<RingEntry>>>,
    /// An eventfd the queue thread keeps a read posted on: written to wake it.
    pub(crate) wake: OwnedFd,
    /// Set when the session ends: the thread stops.
    pub(crate) closed: AtomicBool,
    pub(crate) counters: QueueCounters,
    /// When a request that may block last ran long, on any queue of the connection
    /// (see [`offload`](super::offload)).
    pub(crate) slow: Arc<SlowSource>,
}

impl QueueShared {
    pub(crate) fn new(qid: u16, slow: Arc<SlowSource>) -> io::Result<QueueShared> {
        // SAFETY: eventfd(2) takes no pointers; a descriptor it returns is ours to own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let wake = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Ok(QueueShared {
            qid,
            commits: Mutex::new(Vec::new()),
            entries: Mutex::new(Vec::new()),
            wake,
            closed: AtomicBool::new(false),
            counters: QueueCounters::default(),
            slow,
        })
    }

    /// Wakes the queue thread out of its wait.
    pub(crate) fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live array to our own eventfd.
        let _ = unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// Tells the queue thread to stop.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake();
    }
}

thread_local! {
    /// The queue this thread serves, if it is a queue thread: a reply it makes to a
    /// parked entry of that queue needs no wake-up, as the thread drains the commits
    /// before it next waits.
    static SERVING: std::cell::Cell<*const QueueShared> = const { std::cell::Cell::new(std::ptr::null()) };
}

/// Marks the calling thread as `queue`'s queue thread (see [`SERVING`]).
pub(crate) fn serve_queue(queue: &Arc<QueueShared>) {
    SERVING.with(|s| s.set(Arc::as_ptr(queue)));
}

/// The reply side of one request that came over a ring.
#[derive(Debug, Clone)]
pub(crate) struct RingReply {
    pub(crate) entry: Arc<RingEntry>,
    pub(crate) queue: Arc<QueueShared>,
    /// The request's `unique`, to tell a late reply to an entry reused since.
    pub(crate) unique: u64,
}

impl RingReply {
    /// Sends the reply: kept for the queue thread during dispatch, written and queued
    /// for commit when parked. A second reply, or one after the connection ended, is
    /// dropped quietly.
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let mut slot = self.entry.slot.lock();
        if self.entry.unique.load(Ordering::Acquire) != self.unique {
            return Ok(());
        }
        match slot.phase {
            Phase::Dispatching => {
                slot.pending.clear();
                for d in data {
                    slot.pending.extend_from_slice(d);
                }
                slot.phase = Phase::Replied;
            }
            Phase::Parked => {
                slot.phase = Phase::Replied;
                drop(slot);
                // SAFETY: the phase moved from Parked to Replied here, under the slot's
                // lock: no dispatch holds the request and no other reply may write.
                unsafe { self.entry.write_reply(data) };
                self.queue.commits.lock().push(self.entry.clone());
                let c = &self.queue.counters;
                c.late_replies.fetch_add(1, Ordering::Relaxed);
                if !SERVING.with(|s| std::ptr::eq(s.get(), Arc::as_ptr(&self.queue))) {
                    c.late_wakes.fetch_add(1, Ordering::Relaxed);
                    self.queue.wake();
                }
            }
            Phase::Fetching | Phase::Queued | Phase::Replied => {}
        }
        Ok(())
    }
}
