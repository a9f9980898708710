//! Draining requests the kernel queued while a queue had no entry available.
//!
//! A request that arrives when every entry of its queue is taken waits in the kernel's
//! list for that queue, and only a `COMMIT_AND_FETCH` takes a request off that list: a
//! newly registered entry serves only requests that arrive after it. When every entry
//! holds a parked request, nothing commits and the list would wait for ever (a lock
//! herd whose unlock is in the list). So, when a queue ran out of entries, its kicker
//! (a thread pinned to the queue's CPU) makes a `statfs(2)` of the mount: a request
//! that lands on a free entry and whose commit fetches one queued request; the queue
//! thread asks for kicks (a few at once, [`KICKERS`] threads) until a kick's commit
//! finds the list empty.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::sync::mpsc;

use crate::uring::reply::QueueShared;

/// Kicks in flight at once per queue (each a thread blocked in `statfs`).
pub(crate) const KICKERS: usize = 4;

/// The queue thread's side of a queue's kickers.
#[derive(Debug)]
pub(crate) struct Kicker {
    ask: mpsc::Sender<()>,
    /// The kicker threads' ids: the `pid` of their requests (0 until one runs pinned).
    tids: Arc<[AtomicU32; KICKERS]>,
    /// Kicks asked for whose `statfs` has not returned.
    in_flight: Arc<AtomicUsize>,
}

impl Kicker {
    /// Starts the kicker of queue `shared` for the mount at `mountpoint`, pinned with
    /// `pin` (false: it cannot run on the queue's CPU, so its requests would go to
    /// another queue, and it does not kick).
    pub(crate) fn spawn(
        shared: Arc<QueueShared>,
        mountpoint: PathBuf,
        pin: fn(usize) -> bool,
    ) -> std::io::Result<Kicker> {
        let (ask, asked) = mpsc::channel::<()>();
        let asked = Arc::new(Mutex::new(asked));
        let tids: Arc<[AtomicU32; KICKERS]> = Arc::new(Default::default());
        let in_flight = Arc::new(AtomicUsize::new(0));
        let qid = usize::from(shared.qid);
        for i in 0..KICKERS {
            let (tids, in_flight, asked) = (tids.clone(), in_flight.clone(), asked.clone());
            let (shared, mountpoint) = (shared.clone(), mountpoint.clone());
            std::thread::Builder::new()
                .name(format!("fuser-kick-{qid}"))
                .spawn(move || {
                    if !pin(qid) {
                        return;
                    }
                    // SAFETY: gettid has no preconditions.
                    tids[i].store(unsafe { libc::gettid() } as u32, Ordering::Release);
                    loop {
                        let next = asked.lock().map(|rx| rx.recv());
                        if !matches!(next, Ok(Ok(()))) {
                            return;
                        }
                        let _ = nix::sys::statfs::statfs(&mountpoint);
                        in_flight.fetch_sub(1, Ordering::AcqRel);
                        shared.wake();
                    }
                })?;
        }
        Ok(Kicker {
            ask,
            tids,
            in_flight,
        })
    }

    /// Whether a request with `pid` in its header is a kick.
    pub(crate) fn is_kick(&self, pid: u32) -> bool {
        pid != 0 && self.tids.iter().any(|t| t.load(Ordering::Acquire) == pid)
    }

    /// Whether every kicker runs (pinned): else kicks could reach another queue.
    pub(crate) fn ready(&self) -> bool {
        self.tids.iter().all(|t| t.load(Ordering::Acquire) != 0)
    }

    /// Kicks asked for and not answered yet.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Asks for one kick.
    pub(crate) fn kick(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        if self.ask.send(()).is_err() {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
