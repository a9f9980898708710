//! Per-queue counters of the io_uring transport, readable while the session runs.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use crate::uring::reply::QueueShared;

/// Counters one queue thread keeps (relaxed: figures, not synchronisation).
#[derive(Debug, Default)]
pub(crate) struct QueueCounters {
    pub(crate) registered: AtomicU64,
    pub(crate) parked: AtomicU64,
    pub(crate) max_parked: AtomicU64,
    pub(crate) requests: AtomicU64,
    pub(crate) late_replies: AtomicU64,
    pub(crate) late_wakes: AtomicU64,
    pub(crate) lost_interrupts: AtomicU64,
    pub(crate) offloaded: AtomicU64,
}

impl QueueCounters {
    pub(crate) fn set_parked(&self, now: u64) {
        self.parked.store(now, Relaxed);
        self.max_parked.fetch_max(now, Relaxed);
    }
}

/// A snapshot of one queue (one possible CPU).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Queue index: the CPU whose requests it carries.
    pub qid: u16,
    /// Ring entries registered so far (`depth` at start, more as requests park).
    pub registered: u64,
    /// Requests dispatched and not answered yet (each holds an entry).
    pub parked_now: u64,
    /// The most requests parked at once.
    pub max_parked: u64,
    /// Requests that came over this queue.
    pub requests: u64,
    /// Replies to parked requests (made after their dispatch returned).
    pub late_replies: u64,
    /// Those of them made on another thread than the queue's, which had to wake it.
    pub late_wakes: u64,
    /// Parked requests whose caller was interrupted with no `INTERRUPT` sent, which the
    /// sweep interrupted (see the transport's module documentation).
    pub lost_interrupts: u64,
    /// Requests served by a worker thread, as ones that may block.
    pub offloaded: u64,
}

/// A handle on a session's io_uring queues, for their [`QueueStats`].
#[derive(Debug, Clone)]
pub struct IoUringStats {
    pub(crate) queues: Vec<Arc<QueueShared>>,
}

impl IoUringStats {
    /// One snapshot per queue, by queue index.
    pub fn queues(&self) -> Vec<QueueStats> {
        self.queues
            .iter()
            .map(|q| QueueStats {
                qid: q.qid,
                registered: q.counters.registered.load(Relaxed),
                parked_now: q.counters.parked.load(Relaxed),
                max_parked: q.counters.max_parked.load(Relaxed),
                requests: q.counters.requests.load(Relaxed),
                late_replies: q.counters.late_replies.load(Relaxed),
                late_wakes: q.counters.late_wakes.load(Relaxed),
                lost_interrupts: q.counters.lost_interrupts.load(Relaxed),
                offloaded: q.counters.offloaded.load(Relaxed),
            })
            .collect()
    }
}
