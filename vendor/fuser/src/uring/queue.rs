//! One queue's thread: keeps entries fetching, dispatches what they bring, commits the
//! replies.
//!
//! The thread owns its ring: it alone pushes SQEs and reaps CQEs, so the kernel's fetch
//! completions (which copy requests into the entries) run as task work on it, on the CPU
//! it is pinned to. Other threads reach it through the commit list and the eventfd.

use std::io;
use std::os::fd::AsRawFd;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

use io_uring::IoUring;
use io_uring::opcode;
use io_uring::squeue::Entry128;
use io_uring::types;
use log::error;
use log::warn;

use crate::Filesystem;
use crate::channel::ChannelSender;
use crate::ll;
use crate::ll::ResponseErrno;
use crate::reply::Reply;
use crate::reply::ReplyRaw;
use crate::reply::ReplySender;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;
use crate::uring::abi;
use crate::uring::entry::RingEntry;
use crate::uring::kick::KICKERS;
use crate::uring::kick::Kicker;
use crate::uring::offload::Job;
use crate::uring::offload::Offload;
use crate::uring::reply::Phase;
use crate::uring::reply::QueueShared;
use crate::uring::reply::RingReply;

/// `user_data` of the eventfd read.
const WAKE: u64 = u64::MAX;
/// Past this many entries on one queue, say so once: parked requests are piling up.
const MANY_ENTRIES: usize = 65_536;
/// The most entries a queue keeps fetching.
const MAX_RESERVE: usize = 1024;
/// How long a closed queue waits for its fetches to be cancelled before it leaves
/// their buffers to the kernel for good.
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// While requests are parked and nothing comes, the queue kicks after this long, then
/// after twice as long each time up to [`PROBE_MAX`] (back to this once a kick finds
/// requests queued, or nothing is parked): a request left in the kernel's list after a
/// kick round ended is drained within [`PROBE_MAX`] at worst, and a long wait costs a
/// kick a second.
const PROBE_MIN: Duration = Duration::from_millis(1);
/// See [`PROBE_MIN`].
const PROBE_MAX: Duration = Duration::from_secs(1);

/// One queue's thread state.
pub(crate) struct QueueThread<FS: Filesystem> {
    pub(crate) ring: IoUring<Entry128>,
    pub(crate) shared: Arc<QueueShared>,
    /// The `/dev/fuse` descriptor the commands go to (kept open by `se.ch`).
    pub(crate) dev: RawFd,
    pub(crate) depth: usize,
    pub(crate) payload_size: usize,
    /// Dispatches as the `/dev/fuse` threads do.
    pub(crate) se: SessionEventLoop<FS>,
    pub(crate) entries: Vec<Arc<RingEntry>>,
    /// Entries the kernel has (registered or committed, no completion yet).
    pub(crate) fetching: usize,
    pub(crate) parked: usize,
    /// The connection ended (a fetch failed with `ENOTCONN` and the like).
    pub(crate) ended: bool,
    /// The eventfd read's buffer: leaked, as the kernel may fill it after the thread ends.
    pub(crate) wake_buf: &'static mut [u8; 8],
    pub(crate) said_many: bool,
    /// Entries kept fetching: `depth`, multiplied by 4 (up to [`MAX_RESERVE`]) each time the
    /// queue ran out and by 2 each time a kick found requests queued in the kernel, so
    /// that a burst of that size finds entries next time.
    pub(crate) reserve: usize,
    /// Drains the kernel's list after the queue ran out (see [`kick`](super::kick)).
    pub(crate) kicker: Option<Kicker>,
    /// The kernel may hold requests in its list: ask for kicks.
    pub(crate) kick_mode: bool,
    /// Kicks asked for in this kick mode...
    pub(crate) kicks_issued: usize,
    /// ...and those whose request reached this queue.
    pub(crate) kicks_seen: usize,
    /// Every fetching entry got a request in the last batch.
    pub(crate) exhausted: bool,
    /// Completions reaped early (right after a kick's commit), handled next.
    pub(crate) deferred: Vec<(u64, i32)>,
    /// How long to wait, with requests parked, before a probing kick (see [`PROBE_MIN`]).
    pub(crate) probe: Duration,
    /// The kick round in progress is a probe (one kick), not a drain.
    pub(crate) probing_round: bool,
    /// Where requests that may block go (see [`offload`](super::offload)).
    pub(crate) offload: Option<Offload>,
    /// Requests of this queue handed to a worker and not committed yet.
    pub(crate) in_workers: usize,
}

impl<FS: Filesystem> QueueThread<FS> {
    /// Runs the queue until the connection ends or the session closes it.
    pub(crate) fn run(mut self) {
        crate::uring::reply::serve_queue(&self.shared);
        self.arm_wake();
        if let Err(e) = self.top_up() {
            error!(
                "io_uring queue {}: cannot register entries: {e}; its requests stay on /dev/fuse",
                self.shared.qid
            );
        }
        let mut cqes: Vec<(u64, i32)> = Vec::new();
        let mut closing: Option<Instant> = None;
        loop {
            self.drain_commits();
            if self.shared.closed.load(Ordering::Acquire) && closing.is_none() {
                closing = Some(Instant::now());
            }
            if self.fetching == 0 && (self.ended || closing.is_some()) {
                break;
            }
            let probing = closing.is_none()
                && self.deferred.is_empty()
                && self.parked > 0
                && !self.kick_mode
                && self
                    .kicker
                    .as_ref()
                    .is_some_and(|k| k.ready() && k.in_flight() == 0);
            let waited = match closing {
                None if !self.deferred.is_empty() => self.ring.submit(),
                None if probing => {
                    let ts = types::Timespec::from(self.probe);
                    let args = types::SubmitArgs::new().timespec(&ts);
                    self.ring.submitter().submit_with_args(1, &args)
                }
                None => self.ring.submit_and_wait(1),
                Some(t) if t.elapsed() < CLOSE_GRACE => {
                    let ts = types::Timespec::new().nsec(100_000_000);
                    let args = types::SubmitArgs::new().timespec(&ts);
                    self.ring.submitter().submit_with_args(1, &args)
                }
                Some(_) => {
                    // The kernel still holds fetches: their buffers must outlive us.
                    for e in &self.entries {
                        if e.slot.lock().phase == Phase::Fetching {
                            std::mem::forget(e.clone());
                        }
                    }
                    break;
                }
            };
            match waited {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::ETIME | libc::EBUSY)
                    ) => {}
                Err(e) => {
                    error!("io_uring queue {}: wait failed: {e}", self.shared.qid);
                    self.shared.closed.store(true, Ordering::Release);
                    continue;
                }
            }
            cqes.clear();
            cqes.append(&mut self.deferred);
            cqes.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
            if cqes.is_empty() && probing {
                // Nothing came while requests are parked: requests may wait in the
                // kernel's list with no commit to pull them out. One kick round finds out.
                self.kick_mode = true;
                self.probing_round = true;
                self.probe = (self.probe * 2).min(PROBE_MAX);
            }
            for &(ud, res) in &cqes {
                if ud == WAKE {
                    if !self.shared.closed.load(Ordering::Acquire) {
                        self.arm_wake();
                    }
                } else {
                    self.complete(ud as usize, res);
                }
            }
            if !self.ended && closing.is_none() {
                if std::mem::take(&mut self.exhausted) {
                    self.reserve = (self.reserve * 4).min(MAX_RESERVE).max(self.depth);
                    self.kick_mode = true;
                } else if self.fetching * 2 < self.reserve {
                    // Entries whose requests are not reaped yet may have left the kernel
                    // none to give while we counted more: probe with a kick.
                    self.kick_mode = true;
                }
                if let Err(e) = self.top_up() {
                    error!(
                        "io_uring queue {}: cannot register an entry: {e}",
                        self.shared.qid
                    );
                }
                self.maybe_kick();
            }
        }
    }

    /// A registration or commit of entry `i` completed with `res`.
    fn complete(&mut self, i: usize, res: i32) {
        let Some(entry) = self.entries.get(i).cloned() else {
            return;
        };
        self.fetching -= 1;
        if self.fetching == 0 && res >= 0 {
            self.exhausted = true;
        }
        if res < 0 {
            entry.slot.lock().phase = Phase::Replied;
            match -res {
                libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV => {
                    self.ended = true;
                }
                e => {
                    error!(
                        "io_uring queue {}: fetch failed: {}",
                        self.shared.qid,
                        io::Error::from_raw_os_error(e)
                    );
                    if self.shared.counters.requests.load(Ordering::Relaxed) == 0 {
                        // A registration refused: the kernel turned io_uring off for the
                        // connection and serves it over /dev/fuse.
                        self.ended = true;
                    }
                }
            }
            return;
        }
        self.shared
            .counters
            .requests
            .fetch_add(1, Ordering::Relaxed);
        self.dispatch(&entry);
    }

    /// Dispatches the request in `entry`, then commits its reply or counts it parked.
    fn dispatch(&mut self, entry: &Arc<RingEntry>) {
        // SAFETY: the fetch completed: the queue thread has the entry until dispatch ends.
        let unique = unsafe { entry.header_unique() };
        // SAFETY: as above.
        let pid = unsafe { entry.header_pid() };
        let kick = self.kicker.as_ref().is_some_and(|k| k.is_kick(pid));
        // SAFETY: as above.
        let opcode = unsafe { entry.header_opcode() };
        let offload = self.offload.as_ref().filter(|o| !kick && o.wants(opcode));
        let may_block = offload.is_some();
        // Only while the source is slow (a worker still busy counts), and up to `workers`
        // at once per queue; past that the queue serves them itself, which holds its
        // other requests back, as before, but no more entries.
        let to_worker = offload.is_some_and(|o| {
            self.in_workers < o.workers() && (self.in_workers > 0 || self.shared.slow.recently())
        });
        {
            let mut slot = entry.slot.lock();
            slot.phase = if to_worker {
                Phase::Queued
            } else {
                Phase::Dispatching
            };
            slot.offloaded = to_worker;
            entry.unique.store(unique, Ordering::Release);
            entry.pid.store(pid, Ordering::Release);
        }
        if to_worker {
            let job = Job {
                entry: entry.clone(),
                queue: self.shared.clone(),
                unique,
            };
            match self.offload.as_ref().map(|o| o.send(job)) {
                Some(Ok(())) => {
                    self.in_workers += 1;
                    self.shared
                        .counters
                        .offloaded
                        .fetch_add(1, Ordering::Relaxed);
                    return;
                }
                // The pool is gone (the session ends): served here.
                _ => {
                    let mut slot = entry.slot.lock();
                    slot.phase = Phase::Dispatching;
                    slot.offloaded = false;
                    self.offload = None;
                }
            }
        }
        let reply = RingReply {
            entry: entry.clone(),
            queue: self.shared.clone(),
            unique,
        };
        let started = may_block.then(Instant::now);
        // SAFETY: the queue thread has the entry, `Dispatching`, until dispatch ends.
        unsafe { dispatch_in_entry(&reply, &self.se) };
        if let Some(t) = started {
            self.shared.slow.note(t.elapsed());
        }
        let mut slot = entry.slot.lock();
        match slot.phase {
            Phase::Replied => {
                // SAFETY: the reply was made during dispatch, which has ended: the queue
                // thread has the entry and no request slice is alive.
                unsafe { entry.write_pending(&mut slot) };
                slot.phase = Phase::Fetching;
                drop(slot);
                self.commit(entry);
                if kick {
                    self.kicks_seen += 1;
                    self.kick_mode = self.fetched_inline(entry.index);
                    self.probing_round = false;
                    if self.kick_mode {
                        self.reserve = (self.reserve * 2).min(MAX_RESERVE);
                        self.probe = PROBE_MIN;
                    }
                }
            }
            Phase::Dispatching => {
                slot.phase = Phase::Parked;
                drop(slot);
                self.parked += 1;
                self.shared.counters.set_parked(self.parked as u64);
            }
            Phase::Fetching | Phase::Queued | Phase::Parked => {}
        }
    }

    /// Commits the replies made to parked entries.
    fn drain_commits(&mut self) {
        let ready = std::mem::take(&mut *self.shared.commits.lock());
        for entry in ready {
            let offloaded = {
                let mut slot = entry.slot.lock();
                slot.phase = Phase::Fetching;
                std::mem::take(&mut slot.offloaded)
            };
            if offloaded {
                // A worker's commit pulls queued requests as any does: no probing for it.
                self.in_workers -= 1;
            } else {
                self.parked -= 1;
                if self.parked == 0 {
                    self.probe = PROBE_MIN;
                }
                self.shared.counters.set_parked(self.parked as u64);
            }
            self.commit(&entry);
        }
    }

    /// Submits now, and tells whether entry `index` (just committed) was given a request
    /// at once: one the kernel had queued. Reaped completions are kept for the loop.
    fn fetched_inline(&mut self, index: u32) -> bool {
        if let Err(e) = self.ring.submit() {
            error!("io_uring queue {}: submit failed: {e}", self.shared.qid);
            return false;
        }
        let before = self.deferred.len();
        self.deferred
            .extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        let fetched = self.deferred[before..]
            .iter()
            .any(|&(ud, res)| ud == u64::from(index) && res >= 0);
        // Another kick in flight taking the entry at once says nothing of the list.
        fetched
            && self.entries.get(index as usize).is_some_and(|e| {
                // SAFETY: the entry's fetch completed (its completion is reaped above and
                // not yet handled): the kernel is done with it and only this thread has it.
                let pid = unsafe { e.header_pid() };
                !self.kicker.as_ref().is_some_and(|k| k.is_kick(pid))
            })
    }

    /// In kick mode, keeps [`KICKERS`] kicks in flight; leaves kick mode when kicks
    /// could not reach this queue.
    fn maybe_kick(&mut self) {
        let Some(k) = &self.kicker else {
            self.kick_mode = false;
            return;
        };
        if !self.kick_mode || !k.ready() {
            self.kick_mode = false;
            if k.in_flight() == 0 {
                (self.kicks_issued, self.kicks_seen) = (0, 0);
            }
            return;
        }
        // Every kick answered, yet some never reached this queue.
        if k.in_flight() == 0 && self.kicks_issued > self.kicks_seen {
            self.kick_mode = false;
            (self.kicks_issued, self.kicks_seen) = (0, 0);
            return;
        }
        // A probe asks one kick; a round that found requests queued keeps several going.
        let want = if self.probing_round { 1 } else { KICKERS };
        while k.in_flight() < want {
            self.kicks_issued += 1;
            k.kick();
        }
    }

    /// Queues `COMMIT_AND_FETCH` for `entry`, whose reply is written.
    fn commit(&mut self, entry: &Arc<RingEntry>) {
        let commit_id = entry.unique.load(Ordering::Acquire);
        let sqe = abi::uring_cmd(
            self.dev,
            abi::CMD_COMMIT_AND_FETCH,
            self.shared.qid,
            commit_id,
            entry.iov(),
            u64::from(entry.index),
        );
        self.push(&sqe);
        self.fetching += 1;
    }

    /// Registers new entries until `reserve` are fetching, and submits them (commits
    /// queued meanwhile wait for the loop's `submit_and_wait`, one syscall for both).
    fn top_up(&mut self) -> io::Result<()> {
        if self.fetching >= self.reserve {
            return Ok(());
        }
        while self.fetching < self.reserve {
            let index = u32::try_from(self.entries.len())
                .map_err(|_| io::Error::other("too many entries"))?;
            let entry = Arc::new(RingEntry::new(index, self.payload_size)?);
            let sqe = abi::uring_cmd(
                self.dev,
                abi::CMD_REGISTER,
                self.shared.qid,
                0,
                entry.iov(),
                u64::from(index),
            );
            self.shared.entries.lock().push(entry.clone());
            self.entries.push(entry);
            self.push(&sqe);
            self.fetching += 1;
            self.shared
                .counters
                .registered
                .fetch_add(1, Ordering::Relaxed);
            if self.entries.len() > MANY_ENTRIES && !self.said_many {
                self.said_many = true;
                warn!(
                    "io_uring queue {}: {} entries registered, {} requests parked",
                    self.shared.qid,
                    self.entries.len(),
                    self.parked
                );
            }
        }
        self.ring.submit()?;
        Ok(())
    }

    /// Keeps a read posted on the wake eventfd.
    fn arm_wake(&mut self) {
        let sqe = opcode::Read::new(
            types::Fd(self.shared.wake.as_raw_fd()),
            self.wake_buf.as_mut_ptr(),
            8,
        )
        .build()
        .user_data(WAKE);
        self.push(&Entry128::from(sqe));
    }

    /// Pushes an SQE, submitting first when the submission queue is full.
    fn push(&mut self, sqe: &Entry128) {
        loop {
            // SAFETY: every buffer an SQE names (an entry's iovecs and memory, the wake
            // buffer) lives as long as the queue thread, or is leaked if the kernel may
            // still hold it when the thread ends.
            if unsafe { self.ring.submission().push(sqe) }.is_ok() {
                return;
            }
            if let Err(e) = self.ring.submit() {
                if e.raw_os_error() != Some(libc::EBUSY) && e.raw_os_error() != Some(libc::EINTR) {
                    error!("io_uring queue {}: submit failed: {e}", self.shared.qid);
                    return;
                }
            }
        }
    }
}

/// Dispatches the request in `reply`'s entry through `se`, answering `EIO` if it
/// cannot be read; a reply made meanwhile is kept in the entry's slot.
///
/// # Safety
/// The caller has the entry, `Dispatching` (the queue thread after the fetch, or the
/// worker it was handed to), until this returns.
pub(crate) unsafe fn dispatch_in_entry<FS: Filesystem>(
    reply: &RingReply,
    se: &SessionEventLoop<FS>,
) {
    let (entry, unique) = (&reply.entry, reply.unique);
    // SAFETY: the caller has the entry; the request slice is dropped at the end of this
    // function, before the reply kept in the slot is written into the entry.
    match unsafe { entry.request() } {
        Ok((data, _)) => match RequestWithSender::new_ring(se.ch.sender(), reply.clone(), data) {
            Some(req) => req.dispatch(se),
            None => answer_eio(reply, se.ch.sender(), unique),
        },
        Err(why) => {
            error!(
                "io_uring queue {}: unreadable request: {why}",
                reply.queue.qid
            );
            answer_eio(reply, se.ch.sender(), unique);
        }
    }
}

/// Answers a request that could not be read with `EIO`.
fn answer_eio(reply: &RingReply, ch: ChannelSender, unique: u64) {
    <ReplyRaw as Reply>::new(ll::RequestId(unique), ReplySender::Ring(reply.clone(), ch))
        .send_ll(&ResponseErrno(ll::Errno::EIO));
}
