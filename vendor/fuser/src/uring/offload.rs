//! Requests that may wait long, served off the queue threads.
//!
//! A queue's thread serves its CPU's requests one at a time: one that waits on a slow
//! source (a `READ` without kernel passthrough, an `FSYNC` on a busy disk) would hold
//! every later request of that CPU behind it, where the `/dev/fuse` threads go on
//! serving. So a request whose opcode the filesystem names as one that may block
//! ([`IoUringConfig::offload`](super::IoUringConfig::offload)) is handed, in its entry,
//! to a pool of worker threads while the source is slow: one such request ran longer
//! than [`SLOW`] within the last [`HOLD`], or one is still with a worker. On a fast source the hop (the
//! hand-over, then the commit list and a wake-up of the queue thread) costs more than
//! the request itself, so until a request finds the source slow they are served by the
//! queue thread, and that first one holds the queue. For its queue an offloaded entry is parked (another is
//! registered in its place); the worker dispatches it as the queue thread would, and
//! hands the reply back through the queue's commit list, as a reply to a parked request.
//!
//! Entry phases on a worker: `Queued` (handed over, not taken yet) → `Dispatching` (the
//! worker has the entry; a reply made now is kept in the slot) → `Replied`, written by
//! the worker and queued for commit, or `Parked` when the filesystem answers later.
//! Each queue hands at most as many requests to workers as there are workers, and
//! serves the others itself: a slow source then holds that queue as it did before, not
//! an entry per request (the pool is shared, so one queue's jobs may wait behind
//! another's). A worker that panics answers its request `EIO` (the reply's drop) and
//! goes on. A request a worker leaves unanswered is not seen by the sweep of lost
//! interrupts unless another request is parked (vfscalefs parks none of these).

use std::io;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;
use std::time::Instant;

use log::error;

use crate::Filesystem;
use crate::session::SessionEventLoop;
use crate::uring::entry::RingEntry;
use crate::uring::queue::dispatch_in_entry;
use crate::uring::reply::Phase;
use crate::uring::reply::QueueShared;
use crate::uring::reply::RingReply;

/// A request that may block and runs longer than this finds its source slow (well above
/// what a preempted queue thread adds to a fast one).
pub(crate) const SLOW: Duration = Duration::from_millis(10);
/// Offloading lasts this long after the last slow request: a source slow now and then
/// (a database's fsync every few seconds) stays "slow" between two.
pub(crate) const HOLD: Duration = Duration::from_secs(10);

/// When a connection's requests that may block last found the source slow (one for all
/// its queues: they serve one source).
#[derive(Debug, Default)]
pub(crate) struct SlowSource {
    /// Milliseconds since [`since_epoch_ms`]'s epoch, plus one; 0: never.
    at: AtomicU64,
}

impl SlowSource {
    /// A request that may block took `took`.
    pub(crate) fn note(&self, took: Duration) {
        if took > SLOW {
            self.at.store(since_epoch_ms() + 1, Ordering::Relaxed);
        }
    }

    /// Whether one was slow within [`HOLD`].
    pub(crate) fn recently(&self) -> bool {
        let at = self.at.load(Ordering::Relaxed);
        at != 0 && (since_epoch_ms() + 1).saturating_sub(at) < HOLD.as_millis() as u64
    }
}

/// Milliseconds since the first call.
fn since_epoch_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Which requests may wait long, by opcode (`true`: served by a worker). Compared by
/// the function's address.
#[derive(Debug, Clone, Copy)]
pub struct MayBlock(pub fn(u32) -> bool);

impl PartialEq for MayBlock {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::fn_addr_eq(self.0, other.0)
    }
}

impl Eq for MayBlock {}

impl std::hash::Hash for MayBlock {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (self.0 as usize).hash(state);
    }
}

/// A request handed to a worker: the entry it came in, `Queued`.
pub(crate) struct Job {
    pub(crate) entry: Arc<RingEntry>,
    pub(crate) queue: Arc<QueueShared>,
    pub(crate) unique: u64,
}

/// The queue threads' side of the pool.
#[derive(Debug, Clone)]
pub(crate) struct Offload {
    wants: fn(u32) -> bool,
    workers: usize,
    jobs: mpsc::Sender<Job>,
}

impl Offload {
    /// Whether a request with `opcode` may block (goes to a worker while the source is
    /// slow).
    pub(crate) fn wants(&self, opcode: u32) -> bool {
        (self.wants)(opcode)
    }

    /// Workers in the pool.
    pub(crate) fn workers(&self) -> usize {
        self.workers
    }

    /// Hands `job` to a worker; gives it back if the pool is gone.
    pub(crate) fn send(&self, job: Job) -> Result<(), Job> {
        self.jobs.send(job).map_err(|e| e.0)
    }
}

/// Starts `workers` threads, named `fuser-uring-w<i>`, each dispatching through an event
/// loop from `event_loop`; they end once every [`Offload`] made from the answer is gone.
pub(crate) fn spawn<FS: Filesystem>(
    wants: fn(u32) -> bool,
    workers: usize,
    event_loop: impl Fn(usize) -> SessionEventLoop<FS>,
) -> io::Result<(Offload, Vec<JoinHandle<()>>)> {
    let (jobs, queued) = mpsc::channel::<Job>();
    let queued = Arc::new(Mutex::new(queued));
    let workers = workers.max(1);
    let mut threads = Vec::with_capacity(workers);
    for i in 0..workers {
        let se = event_loop(i);
        let queued = queued.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("fuser-uring-w{i}"))
                .spawn(move || {
                    loop {
                        let next = queued.lock().map(|rx| rx.recv());
                        match next {
                            Ok(Ok(job)) => serve(job, &se),
                            _ => return,
                        }
                    }
                })?,
        );
    }
    Ok((
        Offload {
            wants,
            workers,
            jobs,
        },
        threads,
    ))
}

/// Dispatches a job's request, then queues its reply for commit if it was made meanwhile.
fn serve<FS: Filesystem>(job: Job, se: &SessionEventLoop<FS>) {
    let Job {
        entry,
        queue,
        unique,
    } = job;
    {
        let mut slot = entry.slot.lock();
        debug_assert!(
            entry.unique.load(Ordering::Acquire) == unique && slot.phase == Phase::Queued,
            "a queued entry changed before its worker took it"
        );
        if queue.closed.load(Ordering::Acquire) {
            // The session ends: no commit would carry the answer.
            return;
        }
        slot.phase = Phase::Dispatching;
    }
    let reply = RingReply {
        entry: entry.clone(),
        queue: queue.clone(),
        unique,
    };
    let started = Instant::now();
    let dispatched = std::panic::catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the entry is this worker's: its queue handed it here, and it is
        // `Dispatching` until this returns (or unwinds).
        unsafe { dispatch_in_entry(&reply, se) }
    }));
    if dispatched.is_err() {
        error!("io_uring worker: request {unique} panicked; answered EIO");
    }
    queue.slow.note(started.elapsed());
    let mut slot = entry.slot.lock();
    match slot.phase {
        Phase::Replied => {
            // SAFETY: the reply was made during this dispatch, which has ended: no
            // request slice is alive and no other party may write the entry.
            unsafe { entry.write_pending(&mut slot) };
            drop(slot);
            queue.commits.lock().push(entry.clone());
            queue.wake();
        }
        Phase::Dispatching => slot.phase = Phase::Parked,
        Phase::Fetching | Phase::Queued | Phase::Parked => {}
    }
}
