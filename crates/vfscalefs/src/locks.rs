//! Server-side file locks: what the kernel forwards (`GETLK`, `SETLK`, `SETLKW`,
//! `FLUSH`, `RELEASE`, `INTERRUPT`), served by `vfscale-locks`.
//!
//! # Owners
//!
//! * A POSIX request's owner is the request's `lock_owner` (the kernel's scrambled
//!   `current->files`), made distinct per connection: one process seen through two
//!   mountpoints is two POSIX owners (its locks through one mountpoint conflict with its
//!   locks through the other, unlike on a local filesystem).
//! * An OFD lock arrives as a POSIX request whose `lock_owner` is the open file
//!   (protocol 7.45 has no flag for it), so it is served as a POSIX lock of that owner.
//!   What follows: a blocked OFD request takes part in deadlock detection and can fail
//!   with `EDEADLK`; `l_pid` is the pid the client kernel sent (the caller's), so
//!   `F_GETLK` on an OFD holder reports that pid where Linux reports -1, and
//!   `F_OFD_GETLK` reports -1 for every holder (the client kernel fills it in).
//! * A flock request (`FUSE_LK_FLOCK`) is owned by the open file: [`FileId`] = the FUSE
//!   file handle, the same for every descriptor that shares the open file.
//!
//! # Waiting without a thread
//!
//! A `SETLKW` that has to wait is parked: its [`PendingLock`] (a `Future`) and its reply
//! go to the [`Driver`], one thread that polls parked requests when the lock manager
//! wakes them and answers each when it is granted or fails. No dispatch thread ever
//! sleeps on a lock.
//!
//! `INTERRUPT` names a request by its `unique`: a parked one is interrupted (it answers
//! `EINTR`; the kernel turns that into a restart or `EINTR` for the caller). With several
//! dispatch threads an interrupt can be read before its own request has parked: it is
//! remembered (for [`EARLY_TTL`]) and the request answers `EINTR` when it would park.
//!
//! # Close
//!
//! * `FLUSH` (every `close(2)`): drops the flushing owner's POSIX locks on the inode,
//!   through whichever handle they were taken, as `close(2)` does.
//! * `RELEASE` (after the last close of an open file; sent in the background): drops the
//!   file's flock lock, and the locks of every POSIX owner that set locks only through
//!   handles now all released. Such an owner is the open file itself (an OFD lock);
//!   a process owner had its locks dropped by the `FLUSH` of its `close(2)` already,
//!   and one still using another open handle of the inode keeps what it took there.
//!   Each handle remembers the owners that set locks through it and each inode counts,
//!   per owner, the open handles used; an owner's locks go when its count reaches zero.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use fuser::{Errno as FErrno, ReplyEmpty, ReplyLock};
use parking_lot::{Condvar, Mutex};
use vfscale_locks::{
    ContextStats, Errno, FcntlCmd, FileId, FileLockContext, Flock, FlockOp, Interrupter, LockManager,
    LockType, OpenFile, OwnerId, PendingLock, Pid, Process, OFFSET_MAX,
};

use crate::handles::Handle;
use crate::inodes::Inode;

/// How long an interrupt that found no parked request is remembered.
pub const EARLY_TTL: Duration = Duration::from_secs(30);
/// At most this many early interrupts are remembered per connection.
const EARLY_MAX: usize = 4096;

fn ferr(e: Errno) -> FErrno {
    FErrno::from_i32(e.raw())
}

/// A connection's lock owner key for the kernel's `lock_owner`.
pub fn owner_id(conn: usize, lock_owner: u64) -> OwnerId {
    // Distinct per connection; the kernel's values are already scrambled.
    OwnerId(lock_owner ^ (conn as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// The parked requests and early interrupts of one connection.
#[derive(Default)]
pub struct Interrupts {
    inner: Mutex<IntrInner>,
}

#[derive(Default)]
struct IntrInner {
    parked: HashMap<u64, Interrupter>,
    early: HashMap<u64, Instant>,
}

impl Interrupts {
    /// `INTERRUPT` for request `unique`.
    pub fn interrupt(&self, unique: u64) {
        let mut g = self.inner.lock();
        if let Some(i) = g.parked.get(&unique) {
            i.interrupt();
            return;
        }
        let now = Instant::now();
        if g.early.len() >= EARLY_MAX {
            g.early.retain(|_, t| now.duration_since(*t) < EARLY_TTL);
            if g.early.len() >= EARLY_MAX {
                // Only requests that never park can leave so many: forget the oldest half.
                let mut v: Vec<(u64, Instant)> = g.early.drain().collect();
                v.sort_by_key(|&(_, t)| t);
                g.early.extend(v.into_iter().skip(EARLY_MAX / 2));
            }
        }
        g.early.insert(unique, now);
    }

    /// Registers a request about to park; false if it was interrupted already.
    fn park(&self, unique: u64, intr: Interrupter) -> bool {
        let mut g = self.inner.lock();
        if let Some(t) = g.early.remove(&unique) {
            if t.elapsed() < EARLY_TTL {
                return false;
            }
        }
        g.parked.insert(unique, intr);
        true
    }

    fn unpark(&self, unique: u64) {
        self.inner.lock().parked.remove(&unique);
    }

    /// Interrupts every parked request (the connection is ending).
    pub fn interrupt_all(&self) {
        let g = self.inner.lock();
        for i in g.parked.values() {
            i.interrupt();
        }
    }

    /// Requests parked now (tests and statistics).
    pub fn parked(&self) -> usize {
        self.inner.lock().parked.len()
    }
}

struct Task {
    pending: PendingLock,
    reply: ReplyEmpty,
    intr: Arc<Interrupts>,
    unique: u64,
}

struct DriverShared {
    queue: Mutex<VecDeque<u64>>,
    cv: Condvar,
    tasks: Mutex<HashMap<u64, Task>>,
    next: AtomicU64,
}

struct TaskWaker {
    id: u64,
    shared: Arc<DriverShared>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.shared.queue.lock().push_back(self.id);
        self.shared.cv.notify_one();
    }
}

/// The thread that finishes parked lock requests.
pub struct Driver {
    shared: Arc<DriverShared>,
}

impl Driver {
    /// Starts the driver thread. It runs for the life of the process.
    pub fn start() -> Driver {
        let shared = Arc::new(DriverShared {
            queue: Mutex::new(VecDeque::new()),
            cv: Condvar::new(),
            tasks: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name("vfscalefs-locks".into())
            .spawn(move || Driver::run(&s))
            .expect("spawn the lock driver thread");
        Driver { shared }
    }

    fn submit(&self, task: Task) {
        let id = self.shared.next.fetch_add(1, Ordering::Relaxed);
        self.shared.tasks.lock().insert(id, task);
        self.shared.queue.lock().push_back(id);
        self.shared.cv.notify_one();
    }

    fn run(shared: &Arc<DriverShared>) {
        loop {
            let id = {
                let mut q = shared.queue.lock();
                loop {
                    if let Some(id) = q.pop_front() {
                        break id;
                    }
                    shared.cv.wait(&mut q);
                }
            };
            let Some(mut task) = shared.tasks.lock().remove(&id) else {
                continue; // finished already; a late wake-up
            };
            let waker = Waker::from(Arc::new(TaskWaker {
                id,
                shared: shared.clone(),
            }));
            let mut cx = Context::from_waker(&waker);
            match Pin::new(&mut task.pending).poll(&mut cx) {
                Poll::Ready(r) => {
                    task.intr.unpark(task.unique);
                    match r {
                        Ok(()) => task.reply.ok(),
                        Err(e) => task.reply.error(ferr(e)),
                    }
                }
                Poll::Pending => {
                    shared.tasks.lock().insert(id, task);
                }
            }
        }
    }

    /// Requests parked now, all connections.
    pub fn parked(&self) -> usize {
        self.shared.tasks.lock().len()
    }
}

/// The lock side of the server: the manager and the driver.
pub struct Locks {
    /// The one lock manager of all connections.
    pub mgr: Arc<LockManager>,
    driver: Driver,
    /// Every lock context made, for [`Locks::stats`]: see [`Contexts`].
    contexts: Mutex<Contexts>,
}

/// The lock contexts made, each held until it is the last holder (its inode has left the
/// table), then its counters are added to `retired` and it goes: pruned when the list
/// has doubled since the last pruning, and on [`Locks::stats`].
struct Contexts {
    live: Vec<Arc<FileLockContext>>,
    prune_at: usize,
    retired: ContextStats,
}

impl Contexts {
    fn prune(&mut self) {
        let retired = &mut self.retired;
        self.live.retain(|c| {
            if Arc::strong_count(c) > 1 {
                return true;
            }
            add_stats(retired, &c.stats());
            false
        });
        self.prune_at = (2 * self.live.len()).max(64);
    }
}

fn add_stats(t: &mut ContextStats, s: &ContextStats) {
    t.grants += s.grants;
    t.wakeups += s.wakeups;
    t.blocks += s.blocks;
    t.handoffs += s.handoffs;
    t.held += s.held;
    t.lock_checks += s.lock_checks;
    t.index_nodes += s.index_nodes;
    t.wait_nodes += s.wait_nodes;
}

/// A lock request as the kernel sends it.
pub struct LockReq {
    /// The connection it came on.
    pub conn: usize,
    /// Its `unique`.
    pub unique: u64,
    /// `fh`.
    pub fh: u64,
    /// `lock_owner`.
    pub lock_owner: u64,
    /// `lk.start`.
    pub start: u64,
    /// `lk.end` (inclusive; `OFFSET_MAX` for "to end of file").
    pub end: u64,
    /// `lk.type`.
    pub typ: i32,
    /// `lk.pid` (the caller's tgid in the connection's pid namespace; 0 for unlock).
    pub pid: u32,
}

impl LockReq {
    fn flock(&self) -> Result<Flock, Errno> {
        let ty = LockType::from_raw(self.typ as i16)?;
        if self.start > OFFSET_MAX as u64 || self.end > OFFSET_MAX as u64 || self.end < self.start {
            return Err(Errno::EINVAL);
        }
        let start = self.start as i64;
        let len = if self.end == OFFSET_MAX as u64 {
            0
        } else {
            self.end as i64 - start + 1
        };
        let mut fl = Flock::new(ty, start, len);
        fl.l_pid = 0;
        Ok(fl)
    }

    fn who(&self) -> Process {
        Process {
            owner: owner_id(self.conn, self.lock_owner),
            pid: Pid(self.pid as i32),
        }
    }
}

impl Locks {
    /// A lock manager and its driver thread.
    pub fn new() -> Locks {
        Locks {
            mgr: LockManager::new(),
            driver: Driver::start(),
            contexts: Mutex::new(Contexts {
                live: Vec::new(),
                prune_at: 64,
                retired: ContextStats::default(),
            }),
        }
    }

    /// Requests parked now, all connections.
    pub fn parked(&self) -> usize {
        self.driver.parked()
    }

    fn ctx<'a>(&self, inode: &'a Inode) -> &'a Arc<FileLockContext> {
        if let Some(c) = inode.lock_context_if_any() {
            return c;
        }
        // Racing first uses get the same context: register it once.
        let mut g = self.contexts.lock();
        if let Some(c) = inode.lock_context_if_any() {
            return c;
        }
        let c = inode.lock_context(&self.mgr);
        g.live.push(c.clone());
        if g.live.len() >= g.prune_at {
            g.prune();
        }
        c
    }

    /// The counters of every lock context this server made, summed (monotone: a
    /// context's counts stay in the sum after its inode has gone).
    pub fn stats(&self) -> ContextStats {
        let (live, mut t) = {
            let mut g = self.contexts.lock();
            g.prune();
            (g.live.clone(), g.retired)
        };
        for c in live {
            add_stats(&mut t, &c.stats());
        }
        t
    }

    /// Remembers that `owner` sets locks through `h` (before it tries, so that a
    /// concurrent release of another handle cannot drop what it is about to take).
    fn record_owner(h: &Handle, owner: OwnerId) {
        let mut mine = h.owners.lock();
        if mine.contains(&owner) {
            return;
        }
        mine.push(owner);
        *h.inode.lock_owners().lock().entry(owner).or_insert(0) += 1;
    }

    /// `GETLK`.
    pub fn getlk(&self, h: &Handle, r: &LockReq, reply: ReplyLock) {
        let mut fl = match r.flock() {
            Ok(fl) => fl,
            Err(e) => return reply.error(ferr(e)),
        };
        let file = OpenFile {
            id: FileId(r.fh),
            mode: h.mode,
        };
        match self
            .ctx(&h.inode)
            .fcntl_lock(r.who(), file, FcntlCmd::GetLk, &mut fl)
        {
            Err(e) => reply.error(ferr(e)),
            Ok(_) if fl.l_type == LockType::Unlock => reply.locked(0, 0, libc::F_UNLCK, 0),
            Ok(_) => {
                let start = fl.l_start as u64;
                let end = if fl.l_len == 0 {
                    OFFSET_MAX as u64
                } else {
                    (fl.l_start + fl.l_len - 1) as u64
                };
                reply.locked(start, end, fl.l_type.raw() as i32, fl.l_pid.max(0) as u32)
            }
        }
    }

    /// `SETLK` / `SETLKW` (POSIX and OFD locks).
    pub fn setlk(&self, h: &Handle, r: &LockReq, sleep: bool, intr: &Arc<Interrupts>, reply: ReplyEmpty) {
        let mut fl = match r.flock() {
            Ok(fl) => fl,
            Err(e) => return reply.error(ferr(e)),
        };
        let who = r.who();
        if fl.l_type != LockType::Unlock {
            Self::record_owner(h, who.owner);
        }
        let file = OpenFile {
            id: FileId(r.fh),
            mode: h.mode,
        };
        let cmd = if sleep { FcntlCmd::SetLkW } else { FcntlCmd::SetLk };
        let res = self.ctx(&h.inode).fcntl_lock(who, file, cmd, &mut fl);
        self.finish(res, r.unique, intr, reply);
    }

    /// A flock request (`SETLK`/`SETLKW` with `FUSE_LK_FLOCK`); `op` as `flock(2)`'s.
    pub fn flock(&self, h: &Handle, r: &LockReq, op: i32, intr: &Arc<Interrupts>, reply: ReplyEmpty) {
        let nb = op & libc::LOCK_NB != 0;
        let fop = match op & !libc::LOCK_NB {
            libc::LOCK_SH => FlockOp::Shared,
            libc::LOCK_EX => FlockOp::Exclusive,
            libc::LOCK_UN => FlockOp::Unlock,
            _ => return reply.error(FErrno::EINVAL),
        };
        let who = r.who();
        let file = OpenFile {
            id: FileId(r.fh),
            mode: h.mode,
        };
        let res = self
            .ctx(&h.inode)
            .flock_lock(who, file, fop, nb || fop == FlockOp::Unlock);
        self.finish(res, r.unique, intr, reply);
    }

    fn finish(
        &self,
        res: Result<Option<PendingLock>, Errno>,
        unique: u64,
        intr: &Arc<Interrupts>,
        reply: ReplyEmpty,
    ) {
        match res {
            Ok(None) => reply.ok(),
            Err(e) => reply.error(ferr(e)),
            Ok(Some(pending)) => {
                if !intr.park(unique, pending.interrupter()) {
                    drop(pending); // abandons the request
                    return reply.error(FErrno::EINTR);
                }
                self.driver.submit(Task {
                    pending,
                    reply,
                    intr: intr.clone(),
                    unique,
                });
            }
        }
    }

    /// `FLUSH`: the flushing process closed a descriptor; its POSIX locks on the inode go.
    pub fn flush(&self, inode: &Inode, conn: usize, lock_owner: u64) {
        if let Some(ctx) = inode.lock_context_if_any() {
            ctx.posix_remove_owner(Process {
                owner: owner_id(conn, lock_owner),
                pid: Pid(0),
            });
        }
    }

    /// `RELEASE` of handle `fh`: its flock lock goes, and the locks of owners that used
    /// only released handles of the inode (see the module docs).
    pub fn release(&self, h: &Handle, fh: u64) {
        let owners = std::mem::take(&mut *h.owners.lock());
        let Some(ctx) = h.inode.lock_context_if_any() else {
            return;
        };
        if !owners.is_empty() {
            let mut counts = h.inode.lock_owners().lock();
            for o in owners {
                let last = match counts.get_mut(&o) {
                    Some(c) => {
                        *c -= 1;
                        *c == 0
                    }
                    None => true,
                };
                if last {
                    counts.remove(&o);
                    // Under the counts lock: an owner that starts using another handle
                    // now records itself after this removal, so it keeps its new locks.
                    ctx.posix_remove_owner(Process {
                        owner: o,
                        pid: Pid(0),
                    });
                }
            }
        }
        // The open file's flock lock. The kernel says FUSE_RELEASE_FLOCK_UNLOCK when it
        // sent a flock request through this file; without one there is nothing to drop,
        // so dropping unconditionally is the same and also covers RELEASEDIR.
        ctx.file_remove(FileId(fh));
    }
}

impl Default for Locks {
    fn default() -> Self {
        Locks::new()
    }
}
