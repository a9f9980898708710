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
//! become a task (`locks/driver.rs`), polled when the lock manager wakes it and answered
//! when it is granted or fails: by the thread whose request woke it (an unlock, a close,
//! an interrupt), once that request is done, else by the driver thread. No dispatch
//! thread ever sleeps on a lock.
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

mod driver;
mod task_slot;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fuser::{Errno as FErrno, ReplyEmpty, ReplyLock};
use parking_lot::Mutex;
use vfscale_locks::{
    ContextStats, Errno, FcntlCmd, FileId, FileLockContext, Flock, FlockOp, Interrupter, LockManager,
    LockType, OpenFile, OwnerId, PendingLock, Pid, Process, OFFSET_MAX,
};

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

use self::driver::{Driver, InlineScope, Task, TaskDone};
use crate::cluster::{Cluster, ClusterWait};
use crate::handles::Handle;
use crate::inodes::{Inode, InodeTable, Kind, Node};
use crate::mirror::{
    mirror_flock_op, mirror_getlk, mirror_ofd, FlockTake, GrantCheck, GrantKind, HostWait, Mirror,
    MirrorAttempt, MirrorBudget, MirrorFd, MirrorLocks, MirrorOpen, MirrorSaved, SourceLocks,
};

/// How long an interrupt that found no parked request is remembered.
pub const EARLY_TTL: Duration = Duration::from_secs(30);
/// At most this many early interrupts are remembered per connection.
const EARLY_MAX: usize = 4096;

/// The FUSE errno of a lock call's error.
pub(crate) fn ferr(e: Errno) -> FErrno {
    FErrno::from_i32(e.raw())
}

/// Answers `GETLK` with the conflicting lock `fl` (a negative pid as 0: FUSE carries an
/// unsigned one).
pub(crate) fn reply_holder(reply: ReplyLock, fl: &Flock) {
    let start = fl.l_start as u64;
    let end = if fl.l_len == 0 {
        OFFSET_MAX as u64
    } else {
        (fl.l_start + fl.l_len - 1) as u64
    };
    reply.locked(start, end, fl.l_type.raw() as i32, fl.l_pid.max(0) as u32)
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

/// What an interrupt ends: a request parked in `vfscale-locks`, one waiting for a
/// holder on the source in a thread of its own, or a cluster call (`cluster.rs`).
pub(crate) enum Parked {
    Lock(Interrupter),
    Host(Arc<HostWait>),
    Cluster(Arc<ClusterWait>),
}

/// What an interrupt does once the connection's table is unlocked.
enum Kick {
    Host(Arc<HostWait>),
    Cluster(Arc<ClusterWait>),
}

impl Kick {
    fn run(self) {
        match self {
            Kick::Host(w) => w.kick(),
            Kick::Cluster(w) => w.interrupt(),
        }
    }
}

#[derive(Default)]
struct IntrInner {
    parked: HashMap<u64, Parked>,
    early: HashMap<u64, Instant>,
}

impl Interrupts {
    /// `INTERRUPT` for request `unique`.
    pub fn interrupt(&self, unique: u64) {
        let _inline = InlineScope::enter();
        let kick = {
            let mut g = self.inner.lock();
            match g.parked.get(&unique) {
                Some(Parked::Lock(i)) => {
                    i.interrupt();
                    return;
                }
                Some(Parked::Host(w)) => {
                    // Marked under the table: a wait handed on to the driver sees it.
                    w.mark_interrupted();
                    Kick::Host(w.clone())
                }
                Some(Parked::Cluster(w)) => Kick::Cluster(w.clone()),
                None => {
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
                    return;
                }
            }
        };
        kick.run();
    }

    /// Registers a request about to park; false if it was interrupted already.
    pub(crate) fn park(&self, unique: u64, p: Parked) -> bool {
        let mut g = self.inner.lock();
        if let Some(t) = g.early.remove(&unique) {
            if t.elapsed() < EARLY_TTL {
                return false;
            }
        }
        g.parked.insert(unique, p);
        true
    }

    /// A request that waited for the source parks in `vfscale-locks` now; false if it
    /// was interrupted meanwhile.
    fn repark(&self, unique: u64, host: &HostWait, intr: Interrupter) -> bool {
        let mut g = self.inner.lock();
        if host.is_interrupted() {
            return false;
        }
        g.parked.insert(unique, Parked::Lock(intr));
        true
    }

    pub(crate) fn unpark(&self, unique: u64) {
        self.inner.lock().parked.remove(&unique);
    }

    /// Interrupts every parked request (the connection is ending).
    pub fn interrupt_all(&self) {
        let _inline = InlineScope::enter();
        let kicks: Vec<Kick> = {
            let g = self.inner.lock();
            g.parked
                .values()
                .filter_map(|p| match p {
                    Parked::Lock(i) => {
                        i.interrupt();
                        None
                    }
                    Parked::Host(w) => {
                        w.mark_interrupted();
                        Some(Kick::Host(w.clone()))
                    }
                    Parked::Cluster(w) => Some(Kick::Cluster(w.clone())),
                })
                .collect()
        };
        for k in kicks {
            k.run();
        }
    }

    /// Requests parked now (tests and statistics).
    pub fn parked(&self) -> usize {
        self.inner.lock().parked.len()
    }
}

/// A mirror's state, locked. The parked requests that `vfscale-locks` wakes meanwhile are
/// sent on (`driver.rs`) once it is unlocked: what a woken request does first is take
/// this mutex, so a wake-up sent under it would make its poller wait for it (and spin),
/// at every hand-off.
pub(crate) struct MirrorGuard<'a> {
    guard: Option<parking_lot::MutexGuard<'a, MirrorLocks>>,
    /// Whether this guard holds the wake-ups back (not one taken inside another).
    outer: bool,
}

impl<'a> MirrorGuard<'a> {
    pub(crate) fn lock(m: &'a Mirror) -> MirrorGuard<'a> {
        MirrorGuard {
            outer: driver::hold_wakes(),
            guard: Some(m.state.lock()),
        }
    }
}

impl std::ops::Deref for MirrorGuard<'_> {
    type Target = MirrorLocks;
    fn deref(&self) -> &MirrorLocks {
        self.guard.as_ref().expect("locked until dropped")
    }
}

impl std::ops::DerefMut for MirrorGuard<'_> {
    fn deref_mut(&mut self) -> &mut MirrorLocks {
        self.guard.as_mut().expect("locked until dropped")
    }
}

impl Drop for MirrorGuard<'_> {
    fn drop(&mut self) {
        self.guard.take();
        if self.outer {
            driver::send_held_wakes();
        }
    }
}

/// A direct hand-off: the parked requests that this critical section woke so far (held
/// back by the [`MirrorGuard`]) try again in it, so that one granted holds its lock among
/// clients before the section lowers the source, which then stays held for it with no
/// call (see `mirror.rs`). A granted request is answered once the mutex is unlocked,
/// after it takes its lock on the source. Returns whether an exclusive flock request
/// was granted (the flock lock let go in this section stays held for it).
fn hand_off(m: &Mirror, st: &mut MirrorLocks) -> bool {
    if !driver::wakes_held() || !m.may_hand_off(st) {
        return false;
    }
    let got = driver::poll_woken();
    if got.granted {
        m.handed_off(st);
    }
    got.flock_ex
}

/// Invalidates what a client's kernel caches of an inode (connection, node id), then
/// runs the last argument, which answers the lock granted to it. It must not wait for
/// the invalidation in the calling thread: the invalidation may wait for a page that a
/// read holds while it waits for that thread.
pub type GrantHook = Box<dyn Fn(usize, u64, GrantAnswer) + Send + Sync>;

/// What answers a grant once its invalidation is done (see [`GrantHook`]).
pub type GrantAnswer = Box<dyn FnOnce() + Send>;

/// Opens an inode's source file with the given flags (for the mirrors' descriptions).
pub type SourceOpen = Box<dyn Fn(&Inode, i32) -> std::io::Result<OwnedFd> + Send + Sync>;

/// What the server sets once (see `Server::new` and `serve`), shared with the requests
/// that finish later: what a grant does first, and how a mirror opens its source file.
#[derive(Default)]
pub struct Hooks {
    grant: OnceLock<GrantHook>,
    open: OnceLock<SourceOpen>,
}

impl Hooks {
    /// Answers a request that is done; a lock granted (with its coherence `check`, not
    /// an unlock) invalidates the client's caches first where needed.
    fn answer(
        &self,
        conn: usize,
        inode: &Node,
        check: Option<GrantCheck>,
        whole: bool,
        res: Result<(), Errno>,
        reply: ReplyEmpty,
    ) {
        match res {
            Ok(()) => {
                if let Some(reply) = self.granted(inode, conn, check, whole, reply) {
                    reply.ok()
                }
            }
            Err(e) => reply.error(ferr(e)),
        }
    }

    /// A grant to connection `conn` (`whole`: of the whole file), to be answered: ends its
    /// coherence check. Where the source may have changed, the client's caches go first
    /// and the grant hook answers `reply` once they have (`None`); else the caller answers
    /// it (`Some`).
    fn granted(
        &self,
        inode: &Node,
        conn: usize,
        check: Option<GrantCheck>,
        whole: bool,
        reply: ReplyEmpty,
    ) -> Option<ReplyEmpty> {
        let (Some(m), Some(check)) = (inode.source_mirror_if_any(), check) else {
            return Some(reply);
        };
        if !m.grant_end(check, conn, whole) {
            return Some(reply);
        }
        let Some(f) = self.grant.get() else {
            m.views().invalidation_done(conn);
            return Some(reply);
        };
        let node = inode.clone();
        f(
            conn,
            inode.id,
            Box::new(move || {
                if let Some(m) = node.source_mirror_if_any() {
                    m.views().invalidation_done(conn);
                }
                reply.ok()
            }),
        );
        None
    }

    /// `inode`'s source file opened with `flags`.
    fn open(&self, inode: &Inode, flags: i32) -> std::io::Result<OwnedFd> {
        match self.open.get() {
            Some(open) => open(inode, flags),
            None => Err(std::io::Error::from_raw_os_error(libc::EBADF)),
        }
    }
}

/// The lock side of the server: the manager and the driver.
pub struct Locks {
    /// The one lock manager of all connections.
    pub mgr: Arc<LockManager>,
    driver: Driver,
    /// Every lock context made, for [`Locks::stats`]: see [`Contexts`].
    contexts: Mutex<Contexts>,
    /// Whether the clients' locks are held on the source too (`mirror.rs`).
    source: SourceLocks,
    /// What a grant does first, and how mirrors open files.
    hooks: Arc<Hooks>,
    /// The descriptors the mirrors may hold.
    budget: Arc<MirrorBudget>,
    /// Under `--cluster`, where every lock call goes instead (`cluster.rs`).
    cluster: Option<Arc<Cluster>>,
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
    /// A lock manager and its driver thread; `source` says whether locks are mirrored on
    /// the source; under `--cluster`, every lock call goes to `cluster` instead.
    pub fn new(source: SourceLocks, cluster: Option<Arc<Cluster>>) -> Locks {
        Locks {
            mgr: LockManager::new(),
            driver: Driver::start(),
            contexts: Mutex::new(Contexts {
                live: Vec::new(),
                prune_at: 64,
                retired: ContextStats::default(),
            }),
            source,
            hooks: Arc::new(Hooks::default()),
            budget: Arc::new(MirrorBudget::default()),
            cluster,
        }
    }

    /// The cluster every lock call goes to, under `--cluster`.
    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.as_ref()
    }

    /// Whether reads and writes the server serves through handle `fh` answer `EIO`: its
    /// locks were lost with the cluster lease (never without `--cluster`).
    pub fn lost(&self, h: &Handle, fh: u64) -> bool {
        self.cluster.as_ref().is_some_and(|c| c.lost(h, fh))
    }

    /// Whether the clients' locks are held on the source too.
    pub fn source_locks(&self) -> SourceLocks {
        self.source
    }

    /// How many descriptions of the source the mirrors may hold.
    pub fn set_mirror_budget(&self, n: u64) {
        self.budget.set(n);
    }

    /// Sets what a grant does before it is answered (once).
    pub fn set_grant_hook(&self, hook: GrantHook) {
        let _ = self.hooks.grant.set(hook);
    }

    /// Sets how mirrors open their inodes' source files (once).
    pub fn set_source_open(&self, open: SourceOpen) {
        let _ = self.hooks.open.set(open);
    }

    /// Parked requests answered by the driver thread, all connections: those whose
    /// wake-up came from no lock request of this server (a host wait's thread, say), or
    /// past the inline bound. The rest were answered by the thread whose request woke
    /// them (see `locks/driver.rs`).
    pub fn driver_answers(&self) -> u64 {
        self.driver.answered()
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

    /// The inode's mirror on the source, made at its first lock; `None` when source
    /// locks are off, and for other files than regular files and directories.
    fn mirror<'a>(&self, inode: &'a Inode) -> Option<&'a Mirror> {
        if self.source == SourceLocks::Off || !matches!(inode.kind, Kind::File | Kind::Dir) {
            return None;
        }
        Some(inode.source_mirror(|| Mirror::new(&self.budget)))
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
    pub(crate) fn record_owner(h: &Handle, owner: OwnerId) {
        let mut mine = h.owners.lock();
        if mine.contains(&owner) {
            return;
        }
        mine.push(owner);
        *h.inode.lock_owners().lock().entry(owner).or_insert(0) += 1;
    }

    /// At the `RELEASE` of `h`: `remove` drops the locks of each owner that set locks
    /// through `h` and through no other handle of the inode still open.
    pub(crate) fn release_owners(h: &Handle, mut remove: impl FnMut(OwnerId)) {
        let owners = std::mem::take(&mut *h.owners.lock());
        if owners.is_empty() {
            return;
        }
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
                // Under the counts lock: an owner that starts using another handle now
                // records itself after this removal, so it keeps its new locks.
                remove(o);
            }
        }
    }

    /// `GETLK`: a client holder first; else, with source locks, a holder on the source
    /// (`F_OFD_GETLK` on the mirror, whose own locks it leaves out: a POSIX holder's pid,
    /// 0 for an OFD holder, whose pid -1 FUSE cannot carry).
    pub fn getlk(&self, inodes: &InodeTable, h: &Handle, r: &LockReq, reply: ReplyLock) {
        let mut fl = match r.flock() {
            Ok(fl) => fl,
            Err(e) => return reply.error(ferr(e)),
        };
        if let Some(c) = &self.cluster {
            return c.getlk(h, r, fl, reply);
        }
        let file = OpenFile {
            id: FileId(r.fh),
            mode: h.mode,
        };
        match self
            .ctx(&h.inode)
            .fcntl_lock(r.who(), file, FcntlCmd::GetLk, &mut fl)
        {
            Err(e) => reply.error(ferr(e)),
            Ok(_) if fl.l_type == LockType::Unlock => {
                let (s, e) = (r.start as i64, r.end as i64);
                let open = |flags| inodes.open(&h.inode, flags);
                let host = self
                    .mirror(&h.inode)
                    .and_then(|m| LockType::from_raw(r.typ as i16).ok().map(|ty| (m, ty)))
                    .and_then(|(m, ty)| m.getlk(&open, ty, s, e));
                match host {
                    Some((ty, s, e, pid)) => {
                        reply.locked(s as u64, e as u64, ty.raw() as i32, pid.max(0) as u32)
                    }
                    None => reply.locked(0, 0, libc::F_UNLCK, 0),
                }
            }
            Ok(_) => reply_holder(reply, &fl),
        }
    }

    /// `SETLK` / `SETLKW` (POSIX and OFD locks).
    pub fn setlk(
        &self,
        inodes: &InodeTable,
        h: &Arc<Handle>,
        r: &LockReq,
        sleep: bool,
        intr: &Arc<Interrupts>,
        reply: ReplyEmpty,
    ) {
        let _inline = InlineScope::enter();
        let fl = match r.flock() {
            Ok(fl) => fl,
            Err(e) => return reply.error(ferr(e)),
        };
        if let Some(c) = &self.cluster {
            return c.setlk(h, r, fl, sleep, intr, reply);
        }
        let who = r.who();
        if fl.l_type != LockType::Unlock {
            Self::record_owner(h, who.owner);
        }
        let file = OpenFile {
            id: FileId(r.fh),
            mode: h.mode,
        };
        let cmd = if sleep { FcntlCmd::SetLkW } else { FcntlCmd::SetLk };
        let ctx = self.ctx(&h.inode);
        let Some(m) = self.mirror(&h.inode) else {
            let res = ctx.fcntl_lock(who, file, cmd, &mut fl.clone());
            return self.finish(res, r.unique, intr, reply, None, false);
        };
        let req = PosixReq {
            conn: r.conn,
            who,
            file,
            cmd,
            fl,
            s: r.start as i64,
            e: r.end as i64,
        };
        let open = |flags| inodes.open(&h.inode, flags);
        match req.attempt(m, ctx, Some(&open)) {
            MirrorAttempt::Done(res, check) => {
                self.hooks
                    .answer(r.conn, &h.inode, check, req.whole(), res, reply)
            }
            MirrorAttempt::Parked(p, saved) => {
                let done = Self::posix_take_when_granted(
                    h.clone(),
                    req,
                    saved,
                    self.driver.clone(),
                    self.hooks.clone(),
                    intr.clone(),
                    r.unique,
                );
                self.finish(Ok(Some(p)), r.unique, intr, reply, Some(done), false);
            }
            MirrorAttempt::Host if !sleep => reply.error(FErrno::EAGAIN),
            MirrorAttempt::Host => {
                Self::wait_host_posix(&self.driver, &self.hooks, h.clone(), req, r.unique, intr, reply)
            }
        }
    }

    /// A parked POSIX request, once granted among clients, raises the mirror over its
    /// range before it is answered (it held nothing there while parked; after a direct
    /// hand-off the source is held already, and this makes no call). If a host process
    /// took part of the range meanwhile, the grant goes back (the owner's locks over the
    /// range are put back as they were when it parked) and the request waits for the host.
    #[allow(clippy::too_many_arguments)]
    fn posix_take_when_granted(
        h: Arc<Handle>,
        req: PosixReq,
        saved: MirrorSaved,
        driver: Driver,
        hooks: Arc<Hooks>,
        intr: Arc<Interrupts>,
        unique: u64,
    ) -> TaskDone {
        Box::new(move |granted, reply| {
            let (Some(m), Some(ctx)) = (h.inode.source_mirror_if_any(), h.inode.lock_context_if_any()) else {
                return Some(reply);
            };
            if !granted {
                // Parked, it held nothing on the source.
                return Some(reply);
            }
            let taken = {
                let mut st = MirrorGuard::lock(m);
                let open = |flags| hooks.open(&h.inode, flags);
                req.take_on_source(m, &mut st, ctx, Some(&open), &saved)
            };
            match taken {
                MirrorAttempt::Done(Ok(()), check) => {
                    hooks.granted(&h.inode, req.conn, check, req.whole(), reply)
                }
                MirrorAttempt::Host => {
                    Self::wait_host_posix(&driver, &hooks, h.clone(), req, unique, &intr, reply);
                    None
                }
                MirrorAttempt::Done(Err(e), _) => {
                    reply.error(ferr(e));
                    None
                }
                MirrorAttempt::Parked(..) => unreachable!("taking a lock on the source parks nothing"),
            }
        })
    }

    /// An `F_SETLKW` that waits for a holder on the source: in a thread of its own, until
    /// the source lets it raise the mirror, then on as any request (see `mirror.rs`).
    fn wait_host_posix(
        driver: &Driver,
        hooks: &Arc<Hooks>,
        h: Arc<Handle>,
        req: PosixReq,
        unique: u64,
        intr: &Arc<Interrupts>,
        reply: ReplyEmpty,
    ) {
        let Some(m) = h.inode.source_mirror_if_any() else {
            return reply.error(FErrno::EIO);
        };
        let open = |flags| hooks.open(&h.inode, flags);
        // A read waits on a probe description of its own (see `mirror.rs`).
        let probe = match req.fl.l_type {
            LockType::Read => match m.probe(&open) {
                Ok(fd) => Some(fd),
                Err(e) => return reply.error(errno_of(&e)),
            },
            _ => None,
        };
        // The mirror description stays open for the wait.
        let desc = {
            let mut st = MirrorGuard::lock(m);
            match m.desc(&mut st, Some(&open)) {
                Ok(_) => m.wait_started(&mut st),
                Err(e) => return reply.error(errno_of(&e)),
            }
        };
        let Some(desc) = desc else {
            return reply.error(FErrno::EIO);
        };
        let conn = req.conn;
        let ended = |h: &Handle| {
            if let Some(m) = h.inode.source_mirror_if_any() {
                m.wait_ended(&mut MirrorGuard::lock(m));
            }
        };
        let hw = Arc::new(HostWait::default());
        if !intr.park(unique, Parked::Host(hw.clone())) {
            ended(&h);
            return reply.error(FErrno::EINTR);
        }
        let intr_unpark = intr.clone();
        let h_unspawned = h.clone();
        let (intr, driver, hooks) = (intr.clone(), driver.clone(), hooks.clone());
        let spawned = hw.spawn(move |hw| {
            let (Some(m), Some(ctx)) = (h.inode.source_mirror_if_any(), h.inode.lock_context_if_any()) else {
                intr.unpark(unique);
                return reply.error(FErrno::EIO);
            };
            // The mirror description is kept open for this wait until the thread ends.
            struct Ended<'a>(&'a Mirror);
            impl Drop for Ended<'_> {
                fn drop(&mut self) {
                    self.0.wait_ended(&mut MirrorGuard::lock(self.0));
                }
            }
            let _ended = Ended(m);
            let ty = req.fl.l_type;
            loop {
                let waited = match &probe {
                    None => hw.block(|| mirror_ofd_wait(desc.as_raw_fd(), ty, req.s, req.e)),
                    Some(p) => match mirror_getlk(desc.as_raw_fd(), ty, req.s, req.e) {
                        Ok(Some((_, a, b, _))) => {
                            hw.block(|| mirror_ofd_wait(p.as_raw_fd(), ty, a.max(req.s), b.min(req.e)))
                        }
                        Ok(None) => Ok(()),
                        Err(e) => Err(e),
                    },
                };
                if let Err(e) = waited {
                    intr.unpark(unique);
                    return reply.error(errno_of(&e));
                }
                let res = {
                    if probe.is_none() {
                        // The wait changed the mirror behind its record.
                        m.reload(&mut MirrorGuard::lock(m));
                    }
                    req.attempt(m, ctx, None)
                };
                if let Some(p) = &probe {
                    let _ = mirror_ofd_set(p.as_raw_fd(), None, 0, OFFSET_MAX);
                }
                match res {
                    MirrorAttempt::Done(res, check) => {
                        intr.unpark(unique);
                        return hooks.answer(conn, &h.inode, check, req.whole(), res, reply);
                    }
                    MirrorAttempt::Parked(p, saved) => {
                        // What the wait took on the source and no client holds goes.
                        m.lower(&mut MirrorGuard::lock(m), ctx, req.s, req.e);
                        let done = Self::posix_take_when_granted(
                            h.clone(),
                            req,
                            saved,
                            driver.clone(),
                            hooks.clone(),
                            intr.clone(),
                            unique,
                        );
                        return driver.after_host_wait(&intr, hw, unique, p, reply, done, false);
                    }
                    MirrorAttempt::Host => {
                        // What the wait took and no client holds goes before waiting again.
                        let mut st = MirrorGuard::lock(m);
                        m.lower(&mut st, ctx, req.s, req.e);
                    }
                }
            }
        });
        if spawned.is_err() {
            // The closure went with its reply, which answers EIO as it is dropped.
            intr_unpark.unpark(unique);
            ended(&h_unspawned);
        }
    }

    /// A flock request (`SETLK`/`SETLKW` with `FUSE_LK_FLOCK`); `op` as `flock(2)`'s.
    pub fn flock(
        &self,
        inodes: &InodeTable,
        h: &Arc<Handle>,
        r: &LockReq,
        op: i32,
        intr: &Arc<Interrupts>,
        reply: ReplyEmpty,
    ) {
        let _inline = InlineScope::enter();
        let nb = op & libc::LOCK_NB != 0;
        let fop = match op & !libc::LOCK_NB {
            libc::LOCK_SH => FlockOp::Shared,
            libc::LOCK_EX => FlockOp::Exclusive,
            libc::LOCK_UN => FlockOp::Unlock,
            _ => return reply.error(FErrno::EINVAL),
        };
        if let Some(c) = &self.cluster {
            return c.flock(h, r, fop, nb, intr, reply);
        }
        let who = r.who();
        let file = OpenFile {
            id: FileId(r.fh),
            mode: h.mode,
        };
        let ctx = self.ctx(&h.inode);
        let Some(m) = self.mirror(&h.inode) else {
            let res = ctx.flock_lock(who, file, fop, nb || fop == FlockOp::Unlock);
            return self.finish(res, r.unique, intr, reply, None, false);
        };
        let req = FlockReq {
            who,
            file,
            fop,
            nb,
            key: (r.conn, r.fh),
        };
        if fop == FlockOp::Unlock {
            let res = req.unlock(m, ctx);
            return self.finish(res.map(|_| None), r.unique, intr, reply, None, false);
        }
        let open = |flags| inodes.open(&h.inode, flags);
        match req.attempt(m, ctx, Some(&open), None) {
            MirrorAttempt::Done(res, check) => self.hooks.answer(r.conn, &h.inode, check, true, res, reply),
            MirrorAttempt::Parked(p, _) => {
                let done = Self::flock_take_when_granted(
                    h.clone(),
                    req,
                    self.driver.clone(),
                    self.hooks.clone(),
                    intr.clone(),
                    r.unique,
                );
                self.finish(Ok(Some(p)), r.unique, intr, reply, Some(done), req.exclusive());
            }
            MirrorAttempt::Host if nb => reply.error(FErrno::EAGAIN),
            MirrorAttempt::Host => {
                Self::wait_host_flock(&self.driver, &self.hooks, h.clone(), req, r.unique, intr, reply)
            }
        }
    }

    /// A parked flock request, once granted among clients, takes its lock on the source
    /// before it is answered (it held none there while parked); if a host process took
    /// it meanwhile, the grant goes back and the request waits for the host.
    fn flock_take_when_granted(
        h: Arc<Handle>,
        req: FlockReq,
        driver: Driver,
        hooks: Arc<Hooks>,
        intr: Arc<Interrupts>,
        unique: u64,
    ) -> TaskDone {
        Box::new(move |granted, reply| {
            let (Some(m), Some(ctx)) = (h.inode.source_mirror_if_any(), h.inode.lock_context_if_any()) else {
                return Some(reply);
            };
            let taken = granted.then(|| {
                let mut st = MirrorGuard::lock(m);
                let open = |flags| hooks.open(&h.inode, flags);
                req.take_on_source(m, &mut st, ctx, Some(&open))
            });
            match taken {
                // Not granted: parked, it held nothing on the source.
                None => Some(reply),
                Some(MirrorAttempt::Done(Ok(()), check)) => {
                    hooks.granted(&h.inode, req.key.0, check, true, reply)
                }
                Some(MirrorAttempt::Host) => {
                    Self::wait_host_flock(&driver, &hooks, h.clone(), req, unique, &intr, reply);
                    None
                }
                Some(MirrorAttempt::Done(Err(e), _)) => {
                    reply.error(ferr(e));
                    None
                }
                Some(MirrorAttempt::Parked(..)) => unreachable!("taking a lock on the source parks nothing"),
            }
        })
    }

    /// A flock request that waits for the source: a thread blocked in `flock(2)` on a
    /// description of its own, then on as any request.
    fn wait_host_flock(
        driver: &Driver,
        hooks: &Arc<Hooks>,
        h: Arc<Handle>,
        req: FlockReq,
        unique: u64,
        intr: &Arc<Interrupts>,
        reply: ReplyEmpty,
    ) {
        let Some(m) = h.inode.source_mirror_if_any() else {
            return reply.error(FErrno::EIO);
        };
        let fd = {
            let open = |flags| hooks.open(&h.inode, flags);
            match m.flock_wait_started(&mut MirrorGuard::lock(m), Some(&open)) {
                Ok(fd) => fd,
                Err(e) => return reply.error(errno_of(&e)),
            }
        };
        let hw = Arc::new(HostWait::default());
        if !intr.park(unique, Parked::Host(hw.clone())) {
            m.flock_wait_ended(&mut MirrorGuard::lock(m), Some(fd));
            return reply.error(FErrno::EINTR);
        }
        let h_unspawned = h.clone();
        let intr_unpark = intr.clone();
        let (intr, driver, hooks) = (intr.clone(), driver.clone(), hooks.clone());
        let op = match req.fop {
            FlockOp::Exclusive => libc::LOCK_EX,
            _ => libc::LOCK_SH,
        };
        let fd_unspawned = fd.clone();
        let spawned = hw.spawn(move |hw| {
            let (Some(m), Some(ctx)) = (h.inode.source_mirror_if_any(), h.inode.lock_context_if_any()) else {
                intr.unpark(unique);
                return reply.error(FErrno::EIO);
            };
            if let Err(e) = hw.block(|| mirror_flock_op(&*fd, op)) {
                m.flock_wait_ended(&mut MirrorGuard::lock(m), Some(fd));
                intr.unpark(unique);
                return reply.error(errno_of(&e));
            }
            m.flock_wait_ended(&mut MirrorGuard::lock(m), None);
            match req.attempt(m, ctx, None, Some(fd)) {
                MirrorAttempt::Done(res, check) => {
                    intr.unpark(unique);
                    hooks.answer(req.key.0, &h.inode, check, true, res, reply)
                }
                MirrorAttempt::Parked(p, _) => {
                    let done = Self::flock_take_when_granted(
                        h.clone(),
                        req,
                        driver.clone(),
                        hooks.clone(),
                        intr.clone(),
                        unique,
                    );
                    driver.after_host_wait(&intr, hw, unique, p, reply, done, req.exclusive());
                }
                MirrorAttempt::Host => {
                    intr.unpark(unique);
                    reply.error(FErrno::EAGAIN)
                }
            }
        });
        if spawned.is_err() {
            // The closure went with its reply, which answers EIO as it is dropped.
            intr_unpark.unpark(unique);
            if let Some(m) = h_unspawned.inode.source_mirror_if_any() {
                m.flock_wait_ended(&mut MirrorGuard::lock(m), Some(fd_unspawned));
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        res: Result<Option<PendingLock>, Errno>,
        unique: u64,
        intr: &Arc<Interrupts>,
        reply: ReplyEmpty,
        done: Option<TaskDone>,
        flock_ex: bool,
    ) {
        match res {
            Ok(None) => reply.ok(),
            Err(e) => reply.error(ferr(e)),
            Ok(Some(pending)) => {
                if !intr.park(unique, Parked::Lock(pending.interrupter())) {
                    drop(pending); // abandons the request
                    let reply = match done {
                        Some(done) => done(false, reply),
                        None => Some(reply),
                    };
                    if let Some(reply) = reply {
                        reply.error(FErrno::EINTR);
                    }
                    return;
                }
                self.driver
                    .submit(Task::new(pending, reply, intr, unique, done, flock_ex));
            }
        }
    }

    /// `FLUSH`: the flushing process closed a descriptor; its POSIX locks on the inode go
    /// (on the source too).
    pub fn flush(&self, inode: &Inode, conn: usize, lock_owner: u64) {
        let _inline = InlineScope::enter();
        if let Some(c) = &self.cluster {
            return c.flush(inode, conn, lock_owner);
        }
        if let Some(ctx) = inode.lock_context_if_any() {
            let who = Process {
                owner: owner_id(conn, lock_owner),
                pid: Pid(0),
            };
            match inode.source_mirror_if_any() {
                Some(m) => {
                    // Under the mirror's mutex, as an unlock: a direct hand-off.
                    let mut st = MirrorGuard::lock(m);
                    ctx.posix_remove_owner(who);
                    hand_off(m, &mut st);
                    m.lower(&mut st, ctx, 0, OFFSET_MAX);
                }
                None => ctx.posix_remove_owner(who),
            }
        }
    }

    /// `RELEASE` of handle `fh`: its flock lock goes, and the locks of owners that used
    /// only released handles of the inode (see the module docs); on the source too.
    pub fn release(&self, h: &Handle, fh: u64) {
        let _inline = InlineScope::enter();
        if let Some(c) = &self.cluster {
            return c.release(h, fh);
        }
        let Some(ctx) = h.inode.lock_context_if_any() else {
            return;
        };
        // Under the mirror's mutex, as an unlock (a direct hand-off; lock order: the
        // mirror's, then the inode's lock owners).
        let mirror = h.inode.source_mirror_if_any();
        let mut st = mirror.map(MirrorGuard::lock);
        Self::release_owners(h, |o| {
            ctx.posix_remove_owner(Process {
                owner: o,
                pid: Pid(0),
            })
        });
        // The open file's flock lock. The kernel says FUSE_RELEASE_FLOCK_UNLOCK when it
        // sent a flock request through this file; without one there is nothing to drop,
        // so dropping unconditionally is the same and also covers RELEASEDIR.
        let (Some(m), Some(st)) = (mirror, st.as_mut()) else {
            ctx.file_remove(FileId(fh));
            return;
        };
        // A client handed the flock lock takes it on the source only once the released
        // file's lock there is gone (or kept for it).
        ctx.file_remove(FileId(fh));
        let ex = hand_off(m, st);
        m.lower(st, ctx, 0, OFFSET_MAX);
        m.flock_closed(st, (h.conn, fh), ex);
        m.close_if_idle(st);
    }
}

/// A POSIX or OFD request on a mirrored inode.
#[derive(Clone, Copy)]
struct PosixReq {
    /// The connection it came on.
    conn: usize,
    who: Process,
    file: OpenFile,
    cmd: FcntlCmd,
    fl: Flock,
    s: i64,
    e: i64,
}

impl PosixReq {
    /// Whether it is of the whole file.
    fn whole(&self) -> bool {
        self.s == 0 && self.e == OFFSET_MAX
    }

    /// `vfscale-locks`, then raise, then lower, under the mirror's mutex (see
    /// `mirror.rs`); `open` opens the mirror description if it is not open.
    fn attempt(&self, m: &Mirror, ctx: &Arc<FileLockContext>, open: Option<MirrorOpen<'_>>) -> MirrorAttempt {
        let mut st = MirrorGuard::lock(m);
        let ty = self.fl.l_type;
        // What a grant replaces, to put back if the source refuses it.
        let saved = match ty {
            LockType::Unlock => Vec::new(),
            _ => ctx.posix_owner_locks(self.who, self.s, self.e),
        };
        match ctx.fcntl_lock(self.who, self.file, self.cmd, &mut self.fl.clone()) {
            // Parked among clients, holding nothing on the source; nothing changed.
            Ok(Some(p)) => MirrorAttempt::Parked(p, saved),
            Ok(None) if ty != LockType::Unlock => self.take_on_source(m, &mut st, ctx, open, &saved),
            res => {
                hand_off(m, &mut st);
                m.lower(&mut st, ctx, self.s, self.e);
                MirrorAttempt::Done(res.map(|_| ()), None)
            }
        }
    }

    /// Granted among clients: the mirror raised over the range (`F_OFD_SETLK`), then
    /// lowered to the clients' union (a downgrade or a replaced write lock lets go);
    /// `Host` where a holder on the source conflicts: the grant goes back among clients,
    /// the owner's locks over the range put back as `saved`.
    fn take_on_source(
        &self,
        m: &Mirror,
        st: &mut MirrorLocks,
        ctx: &Arc<FileLockContext>,
        open: Option<MirrorOpen<'_>>,
        saved: &MirrorSaved,
    ) -> MirrorAttempt {
        let raised = m.raise(st, open, self.fl.l_type, self.s, self.e);
        if !raised {
            self.give_back(ctx, saved);
        }
        hand_off(m, st);
        m.lower(st, ctx, self.s, self.e);
        if !raised {
            return MirrorAttempt::Host;
        }
        MirrorAttempt::Done(Ok(()), Some(m.grant_begin(st, self.conn, GrantKind::Record)))
    }

    /// Puts back what the owner held over the range (`saved`), which the grant replaced:
    /// the pieces it held, each with its type, and nothing between them. Going back down
    /// never fails; an upgrade put back (a read request granted over the owner's write
    /// lock) may, where another client was granted a read lock meanwhile: the owner then
    /// keeps the read lock there.
    fn give_back(&self, ctx: &Arc<FileLockContext>, saved: &MirrorSaved) {
        let set = |ty: LockType, a: i64, b: i64| {
            let len = if b == OFFSET_MAX { 0 } else { b - a + 1 };
            let _ = ctx.fcntl_lock(self.who, self.file, FcntlCmd::SetLk, &mut Flock::new(ty, a, len));
        };
        let mut at = Some(self.s);
        for &(a, b, ty) in saved {
            if let Some(x) = at.filter(|&x| x < a) {
                set(LockType::Unlock, x, a - 1);
            }
            set(ty, a, b);
            at = b.checked_add(1).filter(|_| b < OFFSET_MAX);
        }
        if let Some(x) = at.filter(|&x| x <= self.e) {
            set(LockType::Unlock, x, self.e);
        }
    }
}

/// A flock request on a mirrored inode.
#[derive(Clone, Copy)]
struct FlockReq {
    who: Process,
    file: OpenFile,
    fop: FlockOp,
    nb: bool,
    /// The client file: connection, `fh`.
    key: (usize, u64),
}

impl FlockReq {
    /// `LOCK_UN`: among the clients, then on the source (handed on to a parked request).
    fn unlock(&self, m: &Mirror, ctx: &Arc<FileLockContext>) -> Result<(), Errno> {
        let mut st = MirrorGuard::lock(m);
        let res = ctx.flock_lock(self.who, self.file, FlockOp::Unlock, true);
        let ex = hand_off(m, &mut st);
        m.flock_let_go(&mut st, self.key, ex);
        res.map(|_| ())
    }

    /// Whether it asks for an exclusive lock.
    fn exclusive(&self) -> bool {
        self.fop == FlockOp::Exclusive
    }

    fn lock_type(&self) -> LockType {
        match self.fop {
            FlockOp::Exclusive => LockType::Write,
            _ => LockType::Read,
        }
    }

    /// `vfscale-locks` first, then the source once granted there, under the mirror's
    /// mutex: a request that must wait for another client parks with no call on the
    /// source. `held`: a wait for the source took the lock there already, on this
    /// description.
    fn attempt(
        &self,
        m: &Mirror,
        ctx: &Arc<FileLockContext>,
        open: Option<MirrorOpen<'_>>,
        held: Option<Arc<MirrorFd>>,
    ) -> MirrorAttempt {
        let mut st = MirrorGuard::lock(m);
        m.flock_file(&mut st, self.key);
        if let Some(fd) = held {
            m.flock_hold(&mut st, self.key, fd, self.lock_type());
        }
        match ctx.flock_lock(self.who, self.file, self.fop, self.nb) {
            Ok(Some(p)) => {
                // Parked requests hold nothing on the source (a conversion has dropped
                // the old lock among clients; on the source too, or handed on).
                let ex = hand_off(m, &mut st);
                m.flock_let_go(&mut st, self.key, ex);
                MirrorAttempt::Parked(p, Vec::new())
            }
            Ok(None) => {
                let r = self.take_on_source(m, &mut st, ctx, open);
                // A conversion to shared may have let others in.
                hand_off(m, &mut st);
                r
            }
            Err(e) => {
                // EAGAIN: a conversion dropped the old lock first, as flock(2) does.
                if e == Errno::EAGAIN {
                    let ex = hand_off(m, &mut st);
                    m.flock_let_go(&mut st, self.key, ex);
                }
                MirrorAttempt::Done(Err(e), None)
            }
        }
    }

    /// Granted among clients: the lock on the source too; `Host` (the grant given back
    /// among clients) where a host process holds it.
    fn take_on_source(
        &self,
        m: &Mirror,
        st: &mut MirrorLocks,
        ctx: &Arc<FileLockContext>,
        open: Option<MirrorOpen<'_>>,
    ) -> MirrorAttempt {
        match m.flock_take(st, self.key, self.lock_type(), open) {
            // Out of descriptions for the source: the clients' lock alone.
            FlockTake::Held | FlockTake::NoDesc => {
                MirrorAttempt::Done(Ok(()), Some(m.grant_begin(st, self.key.0, GrantKind::Flock)))
            }
            FlockTake::Conflict => {
                let _ = ctx.flock_lock(self.who, self.file, FlockOp::Unlock, true);
                hand_off(m, st);
                MirrorAttempt::Host
            }
            FlockTake::Failed(e) => {
                let _ = ctx.flock_lock(self.who, self.file, FlockOp::Unlock, true);
                hand_off(m, st);
                MirrorAttempt::Done(Err(Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))), None)
            }
        }
    }
}

/// A blocking `F_OFD_SETLKW` of `ty` over `[s, e]` on `fd`.
fn mirror_ofd_wait(fd: RawFd, ty: LockType, s: i64, e: i64) -> std::io::Result<()> {
    mirror_ofd(fd, libc::F_OFD_SETLKW, Some(ty), s, e)
}

/// `F_OFD_SETLK` of `ty` (`None`: unlock) over `[s, e]` on `fd`.
fn mirror_ofd_set(fd: RawFd, ty: Option<LockType>, s: i64, e: i64) -> std::io::Result<()> {
    mirror_ofd(fd, libc::F_OFD_SETLK, ty, s, e)
}

/// The errno a client gets for a server-side error.
fn errno_of(e: &std::io::Error) -> FErrno {
    match e.raw_os_error() {
        Some(libc::EMFILE) => FErrno::ENFILE,
        Some(n) => FErrno::from_i32(n),
        None => FErrno::EIO,
    }
}
