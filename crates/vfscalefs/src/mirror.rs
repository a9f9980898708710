//! Source locks: what the mount's clients hold through `vfscale-locks`, held again on the
//! source file so that processes using the source directly see it, and their locks are
//! seen through the mount (`-o source_locks=mirror`).
//!
//! # Record locks (POSIX and OFD)
//!
//! Each locked inode opens its source file once more, `O_RDWR` (`O_RDONLY` where that is
//! all it may) `| O_CLOEXEC`, for this alone: the *mirror description*, never a
//! passthrough backing file (the kernel's reference would keep its locks after the
//! server died). On it the server holds, as OFD locks, the union of the locks clients
//! hold: write where any client holds a write lock, read where clients hold only reads.
//! A request waiting among clients holds nothing there, as a waiter holds nothing in
//! Linux. [`MirrorLocks`] keeps a copy of what the description holds (only this module
//! changes it).
//!
//! The order, per request, under the inode's mirror mutex:
//!
//! 1. **`vfscale-locks` first**, unchanged: the lock space among clients. A request that
//!    must wait for another client parks there, with no call on the source; what its
//!    owner held over the range is kept (a POSIX request replaces the owner's locks in
//!    its range when granted).
//! 2. **Raise once granted.** A grant (at once, or to a parked request, by the driver)
//!    raises the mirror on its range with `F_OFD_SETLK` (write: the whole range in one
//!    call, atomic; read: the ranges the mirror does not hold yet, undone on failure)
//!    before it is answered. `EAGAIN` there is a holder on the source: the grant goes
//!    back among clients (the owner's locks over the range put back as they were) and
//!    `F_SETLK` fails with `EAGAIN`, `F_SETLKW` waits for the host (below), then tries
//!    again.
//! 3. **Lower last.** The mirror is brought down to the clients' union on the range:
//!    it is computed from `vfscale-locks` itself (`F_GETLK` probes of an owner that holds
//!    nothing), so a downgrade, an unlock, `FLUSH` or `RELEASE` all lower it the same
//!    way. Lowering never fails.
//!
//! So a client's granted lock is covered on the source before it is answered, and the
//! mirror is lowered only after `vfscale-locks` let the lock go.
//!
//! **Direct hand-off.** A critical section that lets a lock go (an unlock, a downgrade,
//! `FLUSH`, `RELEASE`, a conversion, a grant given back) first lets the parked requests
//! it woke try again inside it (`locks.rs`), before it lowers: one granted then holds its
//! lock among clients, so the lowering keeps the source lock held for it, and its raise
//! finds it held (no call). The mirror then holds exactly the clients' union, and this is
//! one of the orders Linux allows (it wakes every waiter and the first to run wins). A
//! host process waiting for that lock in the kernel keeps waiting, so once such
//! hand-offs have kept it held for [`MIRROR_HANDOFF_BOUND`], the next section lets its
//! woken requests try again later instead: the source lock goes, and a host waiter races
//! for it as in Linux. What the server cannot see is the kernel's queue of the host's
//! waiters: Linux queues a request behind a waiting request it conflicts with and wakes
//! only a lock's direct waiters, so it may grant host waiters where the server hands the
//! range on to a client.
//!
//! # Waiting for the host
//!
//! An `F_SETLKW` whose raise failed waits in a thread of its own (parked requests hold no
//! dispatch thread), which blocks in the kernel and is interrupted by a signal
//! (`SIGUSR2`, a handler that does nothing) on `FUSE_INTERRUPT`:
//!
//! * **write**: `F_OFD_SETLKW` on the mirror description itself, which conflicts only
//!   with other owners (an upgrade of the mirror's own read lock waits only for the
//!   host's). Once it returns the server reads back what the description holds
//!   (`/proc/self/fdinfo`), since other requests changed it meanwhile, and tries again.
//! * **read**: a read lock over the holder's range (`F_OFD_GETLK`) on a fresh *probe*
//!   description, held until the mirror's own raise is done (a read wait on the mirror
//!   itself would, once granted, turn another client's write lock there into a read).
//!
//! The kernel orders the host's waiters and the server's, as it orders any two owners. A
//! cycle of waits through a host process is not detected (Linux detects none through OFD
//! locks); such a waiter can still be interrupted.
//!
//! # flock
//!
//! A client open file's flock lock is held on the source as a flock lock of a
//! description of the inode's own, opened for this alone (`O_RDONLY`): flock's owners are
//! open files, so the kernel sees the clients' locks as it sees its own processes' (and
//! a conversion drops the old lock first on both sides). The descriptions are a pool per
//! inode: one that holds nothing goes back to it, and it keeps no more than the client
//! files that asked for flock locks and still are open may use.
//!
//! Per request, under the mirror mutex, `vfscale-locks` first: a request that must wait
//! for another client parks there and holds nothing on the source (a conversion has
//! dropped its old lock on both sides), so asking costs no call on the source. Once
//! granted among clients (at once, or by the driver) it takes the lock on the source with
//! `LOCK_NB` before it is answered; if a host process holds it, the grant goes back and
//! the request fails (`LOCK_NB`) or waits for the host, in a thread blocked in `flock(2)`
//! on a description from the pool: the kernel orders it among the host's waiters. An
//! unlock lets `vfscale-locks` go first, then the source.
//!
//! A direct hand-off (above) of an exclusive lock makes no call on the source: the
//! exclusive lock let go in the section that granted it to another client stays held, as
//! the *spare*, and that client takes the description over. No lock is kept for a client
//! that was not granted it, and the bound on hand-offs without a break holds here too.
//!
//! # Coherence at a grant
//!
//! Before a grant is answered, the client's caches of the file go if the source file may
//! have changed since this connection's last grant ([`Mirror::grant_begin`]): its times
//! and size differ from those then seen, or were seen too soon after the change time to
//! tell (a coarse clock's tick; at once where the filesystem gives every change after a
//! `stat` a new change time, `mirror/ctime.rs`). The check costs no `stat` while the
//! server held the lock that excludes every host lock of the kind without a break since
//! that grant (what a hand-off among clients keeps), and no other connection was granted
//! one.
//!
//! A change the client made itself through the server (`SETATTR`: a truncate, a `chmod`,
//! new times) is no host's: the reply carried the file's new attributes, and its data
//! cache holds what it held before. So where the connection's remembered view vouched
//! for the file just before that change, the view after it is remembered instead
//! ([`Mirror::own_change`]), and the next grant finds nothing new. A host change in the
//! microseconds between the server's `stat` and its own change would be taken for part
//! of it (NFS's pre- and post-operation attributes, without the server's atomicity).

mod ctime;
mod views;

pub use views::{SourceViews, MIRROR_TICK_NS};

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::os::fd::{AsFd as _, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use vfscale_locks::{
    AccessMode, FcntlCmd, FileId, FileLockContext, Flock, LockType, OpenFile, OwnerId, Pid, Process,
    OFFSET_MAX,
};

/// `-o source_locks=`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SourceLocks {
    /// Hold the clients' locks on the source too (see the module docs).
    #[default]
    Mirror,
    /// The clients' locks live in the server only: processes on the source see none.
    Off,
}

/// The owner `vfscale-locks` is probed as: it never holds a lock, so a probe sees every
/// client's.
const MIRROR_PROBE_OWNER: OwnerId = OwnerId(0x6d69_7272_6f72_0001);
const MIRROR_PROBE_FILE: FileId = FileId(u64::MAX - 1);

/// A byte range, both ends inclusive (`OFFSET_MAX`: to the end of the file).
pub type MirrorRange = (i64, i64);

/// What one description holds: non-overlapping ranges, each read or write.
#[derive(Default, Debug)]
pub struct MirrorRanges(BTreeMap<i64, (i64, LockType)>);

impl MirrorRanges {
    /// `[s, e]` cut into pieces, each held with one type or not held (`None`).
    pub fn pieces(&self, s: i64, e: i64) -> Vec<(i64, i64, Option<LockType>)> {
        let mut out = Vec::new();
        let mut at = s;
        let first = self.0.range(..=s).next_back().map(|(&k, _)| k).unwrap_or(s);
        for (&a, &(b, ty)) in self.0.range(first..) {
            if a > e {
                break;
            }
            if b < at {
                continue;
            }
            if a > at {
                out.push((at, a - 1, None));
            }
            let end = b.min(e);
            out.push((at.max(a), end, Some(ty)));
            if end >= e {
                return out;
            }
            at = end + 1;
        }
        if at <= e {
            out.push((at, e, None));
        }
        out
    }

    /// Sets `[s, e]` to `ty` (`None`: not held), merging with equal neighbours.
    pub fn set(&mut self, s: i64, e: i64, ty: Option<LockType>) {
        let (mut s, mut e) = (s, e);
        let overl: Vec<(i64, i64, LockType)> = {
            let first = self.0.range(..=s).next_back().map(|(&k, _)| k).unwrap_or(s);
            self.0
                .range(first..)
                .take_while(|(&a, _)| a <= e.saturating_add(1))
                .filter(|(_, &(b, _))| b >= s.saturating_sub(1))
                .map(|(&a, &(b, t))| (a, b, t))
                .collect()
        };
        for (a, b, t) in overl {
            let touches = b >= s && a <= e;
            if !touches {
                // Adjacent: merged when of the same type.
                if Some(t) == ty {
                    self.0.remove(&a);
                    s = s.min(a);
                    e = e.max(b);
                }
                continue;
            }
            self.0.remove(&a);
            if Some(t) == ty {
                s = s.min(a);
                e = e.max(b);
                continue;
            }
            if a < s {
                self.0.insert(a, (s - 1, t));
            }
            if b > e {
                self.0.insert(e + 1, (b, t));
            }
        }
        if let Some(t) = ty {
            self.0.insert(s, (e, t));
        }
    }

    /// Whether all of `[s, e]` is held with a write lock (one piece, as `set` merges).
    pub fn holds_write(&self, s: i64, e: i64) -> bool {
        self.0
            .range(..=s)
            .next_back()
            .is_some_and(|(_, &(b, ty))| b >= e && ty == LockType::Write)
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn mirror_len(s: i64, e: i64) -> i64 {
    if e == OFFSET_MAX {
        0
    } else {
        e - s + 1
    }
}

fn mirror_flock(ty: i32, s: i64, e: i64) -> libc::flock {
    // SAFETY: a zeroed `flock` is valid; the fields are set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ty as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = s;
    fl.l_len = mirror_len(s, e);
    fl
}

fn raw_type(ty: Option<LockType>) -> i32 {
    match ty {
        Some(LockType::Write) => libc::F_WRLCK,
        Some(LockType::Read) => libc::F_RDLCK,
        _ => libc::F_UNLCK,
    }
}

/// `fcntl(fd, cmd, ty over [s, e])` for the OFD set commands.
pub fn mirror_ofd(fd: RawFd, cmd: i32, ty: Option<LockType>, s: i64, e: i64) -> io::Result<()> {
    let mut fl = mirror_flock(raw_type(ty), s, e);
    // SAFETY: fcntl with a valid `flock` pointer on a descriptor the caller holds.
    crate::sys::cvt(unsafe { libc::fcntl(fd, cmd, &mut fl) }).map(|_| ())
}

/// A lock on the source that conflicts with `ty` over `[s, e]`, as `F_OFD_GETLK` on `fd`
/// reports it (the description's own locks left out): type, range, pid (-1 for OFD).
pub fn mirror_getlk(
    fd: RawFd,
    ty: LockType,
    s: i64,
    e: i64,
) -> io::Result<Option<(LockType, i64, i64, i32)>> {
    let mut fl = mirror_flock(raw_type(Some(ty)), s, e);
    // SAFETY: fcntl with a valid `flock` pointer on a descriptor the caller holds.
    crate::sys::cvt(unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut fl) })?;
    let ty = match fl.l_type as i32 {
        libc::F_WRLCK => LockType::Write,
        libc::F_RDLCK => LockType::Read,
        _ => return Ok(None),
    };
    let end = if fl.l_len == 0 {
        OFFSET_MAX
    } else {
        fl.l_start + fl.l_len - 1
    };
    Ok(Some((ty, fl.l_start, end, fl.l_pid)))
}

/// Whether the source filesystem takes OFD locks: `F_OFD_GETLK` on the root.
pub fn mirror_supported(root: RawFd) -> io::Result<()> {
    mirror_getlk(root, LockType::Read, 0, 0).map(|_| ())
}

/// How many more descriptions the mirrors may open: a share of the server's descriptors
/// (see `Server::size_fd_cache`), so that locks do not take the server past its limit.
/// Past it a lock is still granted among clients, but not held on the source (said once
/// on stderr).
pub struct MirrorBudget {
    left: AtomicI64,
    warned: AtomicBool,
}

impl Default for MirrorBudget {
    fn default() -> Self {
        MirrorBudget {
            left: AtomicI64::new(i64::MAX / 2),
            warned: AtomicBool::new(false),
        }
    }
}

impl MirrorBudget {
    /// Sets the budget (before any lock is taken).
    pub fn set(&self, n: u64) {
        self.left
            .store(n.min(i64::MAX as u64 / 2) as i64, Ordering::SeqCst);
    }

    /// One more description, if the budget allows.
    pub fn take(self: &Arc<Self>) -> io::Result<MirrorToken> {
        if self.left.fetch_sub(1, Ordering::SeqCst) > 0 {
            return Ok(MirrorToken(self.clone()));
        }
        self.left.fetch_add(1, Ordering::SeqCst);
        if !self.warned.swap(true, Ordering::Relaxed) {
            eprintln!("vfscalefs: the source-lock mirrors have used their share of descriptors: further locks are the server's alone until some go");
        }
        Err(io::Error::from_raw_os_error(libc::ENFILE))
    }
}

/// A description counted in the [`MirrorBudget`].
pub struct MirrorToken(Arc<MirrorBudget>);

impl Drop for MirrorToken {
    fn drop(&mut self) {
        self.0.left.fetch_add(1, Ordering::SeqCst);
    }
}

/// A description of the source file opened for source locks, counted in the budget.
pub struct MirrorFd {
    fd: OwnedFd,
    _token: MirrorToken,
}

impl AsRawFd for MirrorFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// How long the source lock may stay held through direct hand-offs among clients
/// before one hand-off goes through the source (see [`Mirror::may_hand_off`]).
pub const MIRROR_HANDOFF_BOUND: Duration = Duration::from_millis(5);

/// What a POSIX owner held over a request's range before it was granted, as
/// (start, end, type): put back if the grant must be given back.
pub type MirrorSaved = Vec<(i64, i64, LockType)>;

/// The mirror state of one inode (under [`Mirror::state`]).
#[derive(Default)]
pub struct MirrorLocks {
    /// The mirror description while it holds something, or a wait uses it; whether it
    /// was opened for writing.
    fd: Option<(Arc<MirrorFd>, bool)>,
    /// What the mirror description holds.
    held: MirrorRanges,
    /// Since when the source locks have been kept through direct hand-offs without a
    /// break (see [`Mirror::may_hand_off`]).
    handoff_since: Option<Instant>,
    /// Host waits in flight on the mirror description: it stays open for them.
    waits: u32,
    /// flock: the description that holds each client open file's (connection, `fh`)
    /// flock lock on the source, and its type.
    flock_held: HashMap<(usize, u64), (Arc<MirrorFd>, LockType)>,
    /// flock descriptions that hold nothing, for the next lock.
    flock_free: Vec<Arc<MirrorFd>>,
    /// A description that still holds the exclusive lock a client let go in the same
    /// critical section as another client was granted it: that client takes it over.
    flock_spare: Option<Arc<MirrorFd>>,
    /// Client open files that asked for a flock lock, until their `RELEASE`.
    flock_files: HashSet<(usize, u64)>,
    /// Descriptions that hold an exclusive flock lock (held or spare): 0 or 1, as the
    /// source lets no two hold one.
    flock_ex: u32,
    /// Per [`GrantKind`], the changes of whether the server holds on the source a lock
    /// that excludes every host lock of the kind, counted: odd while it does (record
    /// locks: the mirror description's write lock over the whole file; flock: an
    /// exclusive lock).
    cover: [u64; 2],
    /// Per [`GrantKind`], the mark of [`Mirror::grant_begin`]: a connection whose next
    /// grant's check needs no `stat`, and the `cover` count it holds for.
    clean: [Option<(usize, u64)>; 2],
}

/// A grant's coherence check, begun under the mirror's mutex ([`Mirror::grant_begin`])
/// and ended after it ([`Mirror::grant_end`]).
pub enum GrantCheck {
    /// Nothing can have changed since the connection's last check.
    Unchanged,
    /// The source file's times and size decide.
    Stat {
        /// What the grant is of.
        kind: GrantKind,
        /// The `cover` count when the check began.
        cover: u64,
        /// A description of the source file to ask.
        desc: Option<Arc<MirrorFd>>,
    },
}

/// What [`Mirror::flock_take`] did.
pub enum FlockTake {
    /// The client file's lock is held on the source.
    Held,
    /// A holder on the source conflicts: nothing is held for the file there (a
    /// conversion lost its old lock).
    Conflict,
    /// No description to hold it (the budget, an open that failed): the lock is the
    /// clients' alone.
    NoDesc,
    /// `flock(2)` failed otherwise.
    Failed(io::Error),
}

/// Which locks a grant is of (see [`Mirror::grant_begin`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrantKind {
    /// POSIX and OFD locks.
    Record = 0,
    /// flock locks.
    Flock = 1,
}

/// How a mirror opens its inode's source file (`InodeTable::open` with these flags).
pub type MirrorOpen<'a> = &'a dyn Fn(i32) -> io::Result<OwnedFd>;

/// One inode's mirror (made at its first lock, dropped at its eviction). Its description
/// is opened at the first lock and closed at a `RELEASE` once it holds nothing: a file
/// locked once keeps no descriptor on the source (and a deleted one its space) for as
/// long as the client caches it. The kernel drops the mirrored locks when the
/// descriptions close.
pub struct Mirror {
    budget: Arc<MirrorBudget>,
    /// Per connection, the source file as its caches hold it (`views.rs`).
    views: SourceViews,
    /// Serializes raise → `vfscale-locks` → lower per inode (lock order: this, then the
    /// inode's lock owners, then `vfscale-locks`'s own).
    pub state: Mutex<MirrorLocks>,
}

/// A request's answer after a raise and `vfscale-locks`.
pub enum MirrorAttempt {
    /// Done: answer this (a grant after its coherence check, begun).
    Done(Result<(), vfscale_locks::Errno>, Option<GrantCheck>),
    /// Parked among clients (holding nothing on the source), with what a POSIX owner
    /// held over the range before (empty for flock).
    Parked(vfscale_locks::PendingLock, MirrorSaved),
    /// A holder on the source conflicts (nothing was changed).
    Host,
}

impl Mirror {
    /// A mirror whose descriptions count against `budget`.
    pub fn new(budget: &Arc<MirrorBudget>) -> Mirror {
        Mirror {
            budget: budget.clone(),
            views: SourceViews::default(),
            state: Mutex::new(MirrorLocks::default()),
        }
    }

    /// The source file as each connection's caches hold it.
    pub fn views(&self) -> &SourceViews {
        &self.views
    }

    /// See [`SourceViews::source_changed`].
    pub fn source_changed(&self, conn: usize, st: &libc::stat64, file: BorrowedFd<'_>) -> bool {
        self.views.source_changed(conn, st, file)
    }

    /// See [`SourceViews::own_change`].
    pub fn own_change(&self, conn: usize, before: &libc::stat64, after: &libc::stat64, file: BorrowedFd<'_>) {
        self.views.own_change(conn, before, after, file)
    }

    /// The coherence check of a grant of `kind` to connection `conn`, begun under the
    /// mutex of the request's last step (its grant), before it is answered: whether the
    /// client's caches must go ([`Mirror::grant_end`] says).
    ///
    /// Coherence is promised for what processes changed under their locks. So the check
    /// needs no `stat` when, since this connection's last check of a whole-file grant, the
    /// server held on the source, without a break, a lock that excludes every host lock
    /// of the kind (record locks: a write lock over the whole file; flock: an exclusive
    /// lock), and no other connection was granted a lock of the kind (its clients share
    /// no cache with this one's). Else the source file's times and size decide (see
    /// [`Mirror::source_changed`]). (Record and flock locks do not exclude each other, on
    /// Linux as here: what a process changes under one kind is not ordered before a
    /// grant of the other.)
    pub fn grant_begin(&self, st: &mut MirrorLocks, conn: usize, kind: GrantKind) -> GrantCheck {
        let k = kind as usize;
        let cover = st.cover[k];
        match st.clean[k] {
            // Not while an invalidation for it is under way: the grant must wait for it.
            Some(mark) if cover & 1 == 1 && mark == (conn, cover) && !self.views.invalidating(conn) => {
                return GrantCheck::Unchanged
            }
            // Another connection's clients may change the file under this grant.
            Some((c, _)) if c != conn => st.clean[k] = None,
            _ => {}
        }
        let desc = st
            .fd
            .as_ref()
            .map(|(d, _)| d.clone())
            .or_else(|| st.flock_spare.clone())
            .or_else(|| st.flock_held.values().next().map(|(d, _)| d.clone()))
            .or_else(|| st.flock_free.last().cloned());
        GrantCheck::Stat { kind, cover, desc }
    }

    /// Ends a grant's check (after the mutex): whether the client's caches of the file
    /// must go before the grant is answered, because the source file may have changed
    /// (or an earlier invalidation is still under way); if so the caller invalidates them
    /// and then calls `views().invalidation_done(conn)`. `whole`: the grant is of the
    /// whole file.
    #[must_use = "a true answer must be followed by an invalidation and invalidation_done"]
    pub fn grant_end(&self, check: GrantCheck, conn: usize, whole: bool) -> bool {
        let GrantCheck::Stat { kind, cover, desc } = check else {
            return false;
        };
        let changed = match &desc {
            Some(d) => match crate::sys::stat_fd(d.fd.as_fd()) {
                Ok(st) => self.source_changed(conn, &st, d.fd.as_fd()),
                Err(_) => {
                    self.views.must_invalidate(conn);
                    true
                }
            },
            None => {
                self.views.must_invalidate(conn);
                true
            }
        };
        // Held since before the stat: what a host changed under a lock is in it.
        if whole && cover & 1 == 1 {
            let mut st = self.state.lock();
            let k = kind as usize;
            if st.cover[k] == cover {
                st.clean[k] = Some((conn, cover));
            }
        }
        changed
    }

    /// Keeps the record locks' `cover` count in step with what the mirror description
    /// holds (after every change of `st.held`).
    fn sync_cover(&self, st: &mut MirrorLocks) {
        let whole = st.held.0.len() == 1 && st.held.0.get(&0) == Some(&(OFFSET_MAX, LockType::Write));
        let c = &mut st.cover[GrantKind::Record as usize];
        if (*c & 1 == 1) != whole {
            *c += 1;
        }
    }

    /// Keeps the flock `cover` count in step with `st.flock_ex`.
    fn sync_flock_cover(&self, st: &mut MirrorLocks) {
        let ex = st.flock_ex > 0;
        let c = &mut st.cover[GrantKind::Flock as usize];
        if (*c & 1 == 1) != ex {
            *c += 1;
        }
    }

    /// The mirror description, opened by `open` (read-write where allowed) if it is not
    /// open; `None` for `open` when only an open one will do.
    pub fn desc(
        &self,
        st: &mut MirrorLocks,
        open: Option<MirrorOpen<'_>>,
    ) -> io::Result<(Arc<MirrorFd>, bool)> {
        if let Some(d) = &st.fd {
            return Ok(d.clone());
        }
        let open = open.ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        let token = self.budget.take()?;
        let (fd, writable) = match open(libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK) {
            Ok(fd) => (fd, true),
            Err(_) => (open(libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK)?, false),
        };
        let d = (Arc::new(MirrorFd { fd, _token: token }), writable);
        st.fd = Some(d.clone());
        Ok(d)
    }

    /// A probe description for a read wait (see the module docs), counted in the budget.
    pub fn probe(&self, open: MirrorOpen<'_>) -> io::Result<MirrorFd> {
        let token = self.budget.take()?;
        Ok(MirrorFd {
            fd: open(libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK)?,
            _token: token,
        })
    }

    /// Closes the mirror description if it holds nothing and no wait uses it: at the `RELEASE` of a handle of the inode (kept open between a client's lock
    /// and unlock cycles, it costs no open and close each time), and after a host wait.
    pub fn close_if_idle(&self, st: &mut MirrorLocks) {
        if st.held.is_empty() && st.waits == 0 {
            st.fd = None;
        }
    }

    /// A host wait starts on the mirror description: its descriptor, kept open until
    /// [`Mirror::wait_ended`].
    pub fn wait_started(&self, st: &mut MirrorLocks) -> Option<Arc<MirrorFd>> {
        let (fd, _) = st.fd.clone()?;
        st.waits += 1;
        Some(fd)
    }

    /// A host wait ended.
    pub fn wait_ended(&self, st: &mut MirrorLocks) {
        st.waits = st.waits.saturating_sub(1);
        self.close_if_idle(st);
    }

    /// A holder on the source conflicting with `ty` over `[s, e]` (see [`mirror_getlk`]).
    pub fn getlk(
        &self,
        open: MirrorOpen<'_>,
        ty: LockType,
        s: i64,
        e: i64,
    ) -> Option<(LockType, i64, i64, i32)> {
        // Asked after the mutex: the description's own locks, which other requests change
        // meanwhile, are left out of the answer anyway.
        let (fd, _) = self.desc(&mut self.state.lock(), Some(open)).ok()?;
        mirror_getlk(fd.as_raw_fd(), ty, s, e).ok().flatten()
    }

    /// Raises the mirror to `ty` over `[s, e]` (step 1 of the module docs); false: a
    /// holder on the source conflicts, and nothing changed. Other errors mean this
    /// description cannot hold it (a read-only file asked for a write lock: the client's
    /// own open could not either), and the raise is skipped.
    /// Without a description to spare (the budget, an open that fails) the raise is
    /// skipped too: the lock is the clients' alone.
    pub fn raise(
        &self,
        st: &mut MirrorLocks,
        open: Option<MirrorOpen<'_>>,
        ty: LockType,
        s: i64,
        e: i64,
    ) -> bool {
        let Ok((desc, writable)) = self.desc(st, open) else {
            return true;
        };
        let fd = desc.as_raw_fd();
        match ty {
            // Held already (a holder's range, or handed off): the call would change nothing.
            LockType::Write if st.held.holds_write(s, e) => true,
            LockType::Write if writable => match mirror_ofd(fd, libc::F_OFD_SETLK, Some(ty), s, e) {
                Ok(()) => {
                    st.held.set(s, e, Some(ty));
                    self.sync_cover(st);
                    true
                }
                Err(err) => !is_conflict(&err),
            },
            LockType::Write | LockType::Unlock => true,
            LockType::Read => self.raise_read(st, fd, s, e),
        }
    }

    /// Raises the ranges of `[s, e]` the mirror does not hold to read (undone if one
    /// conflicts).
    fn raise_read(&self, st: &mut MirrorLocks, fd: RawFd, s: i64, e: i64) -> bool {
        let gaps: Vec<_> = st
            .held
            .pieces(s, e)
            .into_iter()
            .filter(|p| p.2.is_none())
            .collect();
        for (i, &(a, b, _)) in gaps.iter().enumerate() {
            if let Err(err) = mirror_ofd(fd, libc::F_OFD_SETLK, Some(LockType::Read), a, b) {
                for &(a, b, _) in &gaps[..i] {
                    let _ = mirror_ofd(fd, libc::F_OFD_SETLK, None, a, b);
                }
                return !is_conflict(&err);
            }
        }
        for (a, b, _) in gaps {
            st.held.set(a, b, Some(LockType::Read));
        }
        self.sync_cover(st);
        true
    }

    /// Lowers the mirror over `[s, e]` to what the clients hold (`ctx`; step 3). Never
    /// raises: a grant raises what it needs before it is answered.
    pub fn lower(&self, st: &mut MirrorLocks, ctx: &Arc<FileLockContext>, s: i64, e: i64) {
        let Some((desc, _)) = st.fd.clone() else {
            return;
        };
        if st.held.is_empty() {
            return;
        }
        for (a, b, have) in st.held.pieces(s, e) {
            let Some(have) = have else { continue };
            // One probe where a client lock of the held type still covers the piece (a
            // hand-off's grantee): nothing there to lower, and no union to compute.
            let sees_held = match have {
                LockType::Write => LockType::Read,
                _ => LockType::Write,
            };
            if client_probe(ctx, sees_held, a, b).is_some_and(|(x, y)| x <= a && y >= b) {
                continue;
            }
            let want = Self::wanted(ctx, a, b);
            for (x, y, w) in want.pieces(a, b) {
                let lower = matches!((have, w), (_, None) | (LockType::Write, Some(LockType::Read)));
                if lower && mirror_ofd(desc.as_raw_fd(), libc::F_OFD_SETLK, w, x, y).is_ok() {
                    st.held.set(x, y, w);
                }
            }
        }
        self.sync_cover(st);
    }

    /// What the mirror should hold over `[s, e]`: the clients' locks (write over read).
    fn wanted(ctx: &Arc<FileLockContext>, s: i64, e: i64) -> MirrorRanges {
        let mut want = MirrorRanges::default();
        // A write probe conflicts with every lock, a read probe with write locks only.
        for (a, b) in client_cover(ctx, LockType::Write, s, e) {
            want.set(a, b, Some(LockType::Read));
        }
        for (a, b) in client_cover(ctx, LockType::Read, s, e) {
            want.set(a, b, Some(LockType::Write));
        }
        want
    }

    /// Whether a critical section that lets a lock go may grant the clients' requests it
    /// woke in that section (a direct hand-off: the source lock stays held for the
    /// grantee, with no call). Not once such hand-offs have kept it held for
    /// [`MIRROR_HANDOFF_BOUND`]: that section lets the woken requests retry later, as
    /// Linux's woken waiters do, so the source lock goes and a host waiter gets its turn
    /// to race for it.
    pub fn may_hand_off(&self, st: &mut MirrorLocks) -> bool {
        match st.handoff_since {
            Some(t) if t.elapsed() >= MIRROR_HANDOFF_BOUND => {
                st.handoff_since = None;
                false
            }
            _ => true,
        }
    }

    /// A direct hand-off granted a request (see [`Mirror::may_hand_off`]).
    pub fn handed_off(&self, st: &mut MirrorLocks) {
        st.handoff_since.get_or_insert_with(Instant::now);
    }

    /// Reads back what the mirror description holds (after a wait on it, which changed
    /// it behind [`MirrorLocks`]).
    pub fn reload(&self, st: &mut MirrorLocks) {
        let Some((desc, _)) = &st.fd else { return };
        let Ok(info) = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", desc.as_raw_fd())) else {
            return;
        };
        let mut held = MirrorRanges::default();
        for line in info.lines().filter_map(|l| l.strip_prefix("lock:")) {
            let w: Vec<&str> = line.split_whitespace().collect();
            // "1: OFDLCK ADVISORY WRITE -1 00:1b:12 0 EOF"
            if w.len() < 8 || w[1] != "OFDLCK" {
                continue;
            }
            let ty = match w[3] {
                "WRITE" => LockType::Write,
                "READ" => LockType::Read,
                _ => continue,
            };
            let Ok(s) = w[6].parse::<i64>() else { continue };
            let e = if w[7] == "EOF" {
                OFFSET_MAX
            } else {
                match w[7].parse::<i64>() {
                    Ok(e) => e,
                    Err(_) => continue,
                }
            };
            held.set(s, e, Some(ty));
        }
        st.held = held;
        self.sync_cover(st);
    }

    /// Client file `key` asks for flock locks (until [`Mirror::flock_closed`]).
    pub fn flock_file(&self, st: &mut MirrorLocks, key: (usize, u64)) {
        if !st.flock_files.contains(&key) {
            st.flock_files.insert(key);
        }
    }

    /// A flock description that holds nothing: a free one, or one opened by `open`.
    fn flock_desc(&self, st: &mut MirrorLocks, open: Option<MirrorOpen<'_>>) -> io::Result<Arc<MirrorFd>> {
        if let Some(fd) = st.flock_free.pop() {
            return Ok(fd);
        }
        let open = open.ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        let token = self.budget.take()?;
        Ok(Arc::new(MirrorFd {
            fd: open(libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK)?,
            _token: token,
        }))
    }

    /// Client file `key`, granted a flock lock of type `ty` among clients, takes it on
    /// the source (`LOCK_NB`): a conversion on the description that holds its lock; else
    /// the spare's exclusive lock (no call), or a free description. The spare goes first
    /// where it cannot be taken over, so the server never conflicts with itself.
    pub fn flock_take(
        &self,
        st: &mut MirrorLocks,
        key: (usize, u64),
        ty: LockType,
        open: Option<MirrorOpen<'_>>,
    ) -> FlockTake {
        let op = flock_op(ty);
        let r = if let Some((fd, old)) = st.flock_held.get(&key).cloned() {
            if old == ty {
                return FlockTake::Held;
            }
            // flock(2) converts on the same description, dropping the old lock first.
            Self::flock_ex_count(st, Some(old), None);
            match mirror_flock_op(&*fd, op | libc::LOCK_NB) {
                Ok(()) => {
                    st.flock_held.insert(key, (fd, ty));
                    Self::flock_ex_count(st, None, Some(ty));
                    FlockTake::Held
                }
                Err(e) => {
                    st.flock_held.remove(&key);
                    st.flock_free.push(fd);
                    Self::flock_failed(e)
                }
            }
        } else {
            if let Some(spare) = st.flock_spare.take() {
                if ty == LockType::Write {
                    st.flock_held.insert(key, (spare, ty));
                    return FlockTake::Held;
                }
                let _ = mirror_flock_op(&*spare, libc::LOCK_UN);
                st.flock_free.push(spare);
                Self::flock_ex_count(st, Some(LockType::Write), None);
            }
            match self.flock_desc(st, open) {
                Err(_) => FlockTake::NoDesc,
                Ok(fd) => match mirror_flock_op(&*fd, op | libc::LOCK_NB) {
                    Ok(()) => {
                        st.flock_held.insert(key, (fd, ty));
                        Self::flock_ex_count(st, None, Some(ty));
                        FlockTake::Held
                    }
                    Err(e) => {
                        st.flock_free.push(fd);
                        Self::flock_failed(e)
                    }
                },
            }
        };
        self.sync_flock_cover(st);
        r
    }

    fn flock_failed(e: io::Error) -> FlockTake {
        if is_conflict(&e) {
            FlockTake::Conflict
        } else {
            FlockTake::Failed(e)
        }
    }

    fn flock_ex_count(st: &mut MirrorLocks, gone: Option<LockType>, came: Option<LockType>) {
        if gone == Some(LockType::Write) {
            st.flock_ex -= 1;
        }
        if came == Some(LockType::Write) {
            st.flock_ex += 1;
        }
    }

    /// Client file `key` holds `ty` on `fd` now (a wait for the source took it).
    pub fn flock_hold(&self, st: &mut MirrorLocks, key: (usize, u64), fd: Arc<MirrorFd>, ty: LockType) {
        self.flock_let_go(st, key, false);
        st.flock_held.insert(key, (fd, ty));
        Self::flock_ex_count(st, None, Some(ty));
        self.sync_flock_cover(st);
    }

    /// Client file `key` holds no flock lock among clients any more: its lock on the
    /// source goes. With `hand_on` (another client file was granted the exclusive lock in
    /// the same critical section: a direct hand-off), an exclusive lock stays held as the
    /// spare, which that client takes over: the hand-off then makes no call.
    pub fn flock_let_go(&self, st: &mut MirrorLocks, key: (usize, u64), hand_on: bool) {
        let Some((fd, ty)) = st.flock_held.remove(&key) else {
            return;
        };
        if hand_on && ty == LockType::Write && st.flock_spare.is_none() {
            st.flock_spare = Some(fd);
            return;
        }
        let _ = mirror_flock_op(&*fd, libc::LOCK_UN);
        st.flock_free.push(fd);
        Self::flock_ex_count(st, Some(ty), None);
        self.sync_flock_cover(st);
    }

    fn flock_drop_spare(&self, st: &mut MirrorLocks) {
        if let Some(spare) = st.flock_spare.take() {
            let _ = mirror_flock_op(&*spare, libc::LOCK_UN);
            st.flock_free.push(spare);
            Self::flock_ex_count(st, Some(LockType::Write), None);
            self.sync_flock_cover(st);
        }
    }

    /// A description for a request that waits for the source in a thread of its own
    /// (a spare goes first: the server never conflicts with itself).
    pub fn flock_wait_started(
        &self,
        st: &mut MirrorLocks,
        open: Option<MirrorOpen<'_>>,
    ) -> io::Result<Arc<MirrorFd>> {
        self.flock_drop_spare(st);
        self.flock_desc(st, open)
    }

    /// A wait for the source ended; `unused`: its description, which holds nothing.
    pub fn flock_wait_ended(&self, st: &mut MirrorLocks, unused: Option<Arc<MirrorFd>>) {
        st.flock_free.extend(unused);
    }

    /// Client file `key` was released: its lock goes (handed on as by an unlock, with
    /// `hand_on`), and the free descriptions beyond what the files still open may use
    /// close.
    pub fn flock_closed(&self, st: &mut MirrorLocks, key: (usize, u64), hand_on: bool) {
        self.flock_let_go(st, key, hand_on);
        st.flock_files.remove(&key);
        let keep = st.flock_files.len().saturating_sub(st.flock_held.len());
        st.flock_free.truncate(keep);
    }

    /// Whether client file `key` holds a flock lock on the source.
    pub fn flock_holds(&self, st: &MirrorLocks, key: (usize, u64)) -> bool {
        st.flock_held.contains_key(&key)
    }
}

/// `flock(2)`'s operation for a lock of type `ty`.
fn flock_op(ty: LockType) -> i32 {
    match ty {
        LockType::Write => libc::LOCK_EX,
        _ => libc::LOCK_SH,
    }
}

/// `flock(fd, op)`.
pub fn mirror_flock_op(fd: &impl AsRawFd, op: i32) -> io::Result<()> {
    // SAFETY: flock on a descriptor the caller holds.
    crate::sys::cvt(unsafe { libc::flock(fd.as_raw_fd(), op) }).map(|_| ())
}

/// Whether `e` is a conflict with another owner (`F_OFD_SETLK`, `flock(LOCK_NB)`).
pub fn is_conflict(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES))
}

/// One `F_GETLK` probe of the clients' locks over `[s, e]` with a `probe` lock: the
/// range of the lock Linux's rule reports (the first that conflicts), if any.
fn client_probe(ctx: &Arc<FileLockContext>, probe: LockType, s: i64, e: i64) -> Option<MirrorRange> {
    let who = Process {
        owner: MIRROR_PROBE_OWNER,
        pid: Pid(0),
    };
    let file = OpenFile {
        id: MIRROR_PROBE_FILE,
        mode: AccessMode::ReadWrite,
    };
    let mut fl = Flock::new(probe, s, mirror_len(s, e));
    if ctx.fcntl_lock(who, file, FcntlCmd::GetLk, &mut fl).is_err() || fl.l_type == LockType::Unlock {
        return None;
    }
    let end = if fl.l_len == 0 {
        OFFSET_MAX
    } else {
        fl.l_start + fl.l_len - 1
    };
    Some((fl.l_start, end))
}

/// The ranges of `[s, e]` where a client holds a lock that conflicts with a `probe`-type
/// request: with a write probe every lock, with a read probe the write locks.
fn client_cover(ctx: &Arc<FileLockContext>, probe: LockType, s: i64, e: i64) -> Vec<MirrorRange> {
    let mut out = Vec::new();
    let mut todo = vec![(s, e)];
    while let Some((a, b)) = todo.pop() {
        if a > b {
            continue;
        }
        let Some((ls, le)) = client_probe(ctx, probe, a, b) else {
            continue;
        };
        out.push((ls.max(a), le.min(b)));
        if ls > a {
            todo.push((a, ls - 1));
        }
        if le < b {
            todo.push((le + 1, b));
        }
    }
    out
}

/// The signal that ends a host wait's blocking call (its handler does nothing; without
/// `SA_RESTART` the call returns `EINTR`).
/// `serve` blocks it in every other thread.
pub const MIRROR_WAKE_SIGNAL: i32 = libc::SIGUSR2;

extern "C" fn mirror_wake_handler(_: libc::c_int) {}

fn install_wake_handler() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        // SAFETY: a zeroed sigaction is valid; the handler is async-signal-safe (it does
        // nothing), and no SA_RESTART: the blocked call returns EINTR.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = mirror_wake_handler as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = 0;
            libc::sigaction(MIRROR_WAKE_SIGNAL, &sa, std::ptr::null_mut());
        }
    });
}

/// A request waiting for a holder on the source, in a thread of its own.
#[derive(Default)]
pub struct HostWait {
    interrupted: AtomicBool,
    waiting: AtomicBool,
    /// Kept (not detached) so that its `pthread_t` stays valid while it can be signalled.
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl HostWait {
    /// Starts `body` in a wait thread (`body` calls [`HostWait::block`] for its blocking
    /// calls).
    pub fn spawn(self: &Arc<Self>, body: impl FnOnce(&HostWait) + Send + 'static) -> io::Result<()> {
        install_wake_handler();
        let me = self.clone();
        let h = std::thread::Builder::new()
            .name("vfscalefs-hostwait".into())
            .spawn(move || {
                // SAFETY: the sigset calls get valid pointers.
                unsafe {
                    let mut set: libc::sigset_t = std::mem::zeroed();
                    libc::sigemptyset(&mut set);
                    libc::sigaddset(&mut set, MIRROR_WAKE_SIGNAL);
                    libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
                }
                body(&me);
            })?;
        *self.thread.lock() = Some(h);
        Ok(())
    }

    /// Runs the blocking call `f` (a raw syscall result and its errno) until it succeeds,
    /// fails, or the request is interrupted (`EINTR`).
    pub fn block(&self, mut f: impl FnMut() -> io::Result<()>) -> io::Result<()> {
        loop {
            self.waiting.store(true, Ordering::SeqCst);
            if self.interrupted.load(Ordering::SeqCst) {
                self.waiting.store(false, Ordering::SeqCst);
                return Err(io::Error::from_raw_os_error(libc::EINTR));
            }
            let r = f();
            self.waiting.store(false, Ordering::SeqCst);
            match r {
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                r => return r,
            }
        }
    }

    /// Whether the request was interrupted.
    pub fn is_interrupted(&self) -> bool {
        self.interrupted.load(Ordering::SeqCst)
    }

    /// `FUSE_INTERRUPT`, first half: marks the request interrupted (under the
    /// connection's interrupt table, so that a wait handed on to the lock driver sees it).
    pub fn mark_interrupted(&self) {
        self.interrupted.store(true, Ordering::SeqCst);
    }

    /// `FUSE_INTERRUPT`, second half: ends the blocking call with `EINTR`. The signal is
    /// sent again while the thread is still in its call: one sent just before it entered
    /// the call is lost (it checks the mark first, so this ends within a few tries).
    pub fn kick(&self) {
        for _ in 0..2000 {
            if !self.waiting.load(Ordering::SeqCst) {
                return;
            }
            if let Some(h) = self.thread.lock().as_ref() {
                use std::os::unix::thread::JoinHandleExt as _;
                // SAFETY: the handle is neither joined nor detached, so its thread id is
                // valid; the signal's handler does nothing.
                unsafe { libc::pthread_kill(h.as_pthread_t(), MIRROR_WAKE_SIGNAL) };
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `stat` of times `ctime` (change and modification) and size `size`.
    fn stat_of(ctime: (i64, i64), size: i64) -> libc::stat64 {
        // SAFETY: a zeroed `stat64` is valid; the fields used are set below.
        let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
        (st.st_ctime, st.st_ctime_nsec) = ctime;
        (st.st_mtime, st.st_mtime_nsec) = ctime;
        st.st_size = size;
        st
    }

    /// A mirror whose source filesystem is taken to have fine change times or not.
    fn mirror(fine: bool) -> Mirror {
        let m = Mirror::new(&Arc::new(MirrorBudget::default()));
        m.views.assume_fine_ctime(fine);
        m
    }

    /// A grant's check whose invalidation, where one is asked for, is done at once.
    fn changed(m: &Mirror, conn: usize, st: &libc::stat64, fd: BorrowedFd<'_>) -> bool {
        let c = m.source_changed(conn, st, fd);
        if c {
            m.views().invalidation_done(conn);
        }
        c
    }

    #[test]
    fn no_view_vouches_while_an_invalidation_is_under_way() {
        let m = mirror(true);
        let null = std::fs::File::open("/dev/null").unwrap();
        let fd = null.as_fd();
        let a = stat_of((100, 1), 10);
        assert!(m.source_changed(0, &a, fd), "the first grant's check");
        // A second grant, while the first one's invalidation is not done: the client's
        // kernel may still cache what came before `a`.
        assert!(m.source_changed(0, &a, fd), "a grant racing an invalidation");
        m.views().invalidation_done(0);
        assert!(m.source_changed(0, &a, fd), "one invalidation is still under way");
        m.views().invalidation_done(0);
        m.views().invalidation_done(0);
        assert!(!m.source_changed(0, &a, fd), "both done: the view vouches");
        // Connection 1's invalidation does not hold connection 0's grants back.
        assert!(m.source_changed(1, &a, fd));
        assert!(!m.source_changed(0, &a, fd));
    }

    #[test]
    fn an_own_change_vouches_only_where_the_view_before_it_did() {
        let m = mirror(true);
        let null = std::fs::File::open("/dev/null").unwrap();
        let fd = null.as_fd();
        let a = stat_of((100, 1), 10);
        assert!(changed(&m, 0, &a, fd), "the first grant's check");
        assert!(!changed(&m, 0, &a, fd), "unchanged, and fine times vouch at once");
        let b = stat_of((100, 2), 20);
        m.own_change(0, &a, &b, fd);
        assert!(!changed(&m, 0, &b, fd), "the connection's own change");
        assert!(
            changed(&m, 1, &b, fd),
            "another connection's caches did not see it"
        );
        // A host change (c) before the own change (d): the view did not vouch for c.
        let (c, d) = (stat_of((100, 3), 20), stat_of((100, 4), 20));
        m.own_change(0, &c, &d, fd);
        assert!(
            changed(&m, 0, &d, fd),
            "the host's change hidden by the own change"
        );
    }

    #[test]
    fn a_coarse_view_vouches_a_tick_after_the_change_time() {
        let m = mirror(false);
        let null = std::fs::File::open("/dev/null").unwrap();
        let fd = null.as_fd();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        let fresh = stat_of((now.as_secs() as i64, now.subsec_nanos() as i64), 10);
        assert!(changed(&m, 0, &fresh, fd));
        assert!(
            changed(&m, 0, &fresh, fd),
            "a change within the same tick would not show"
        );
        let old = stat_of((now.as_secs() as i64 - 1, 0), 10);
        assert!(changed(&m, 0, &old, fd));
        assert!(!changed(&m, 0, &old, fd));
        // An own change on a coarse filesystem leaves a view that does not vouch yet.
        let after = stat_of((now.as_secs() as i64, now.subsec_nanos() as i64), 10);
        m.own_change(0, &old, &after, fd);
        assert!(changed(&m, 0, &after, fd));
    }

    #[test]
    fn ranges_split_and_merge() {
        let mut r = MirrorRanges::default();
        r.set(0, 9, Some(LockType::Read));
        r.set(10, 19, Some(LockType::Read));
        assert_eq!(r.pieces(0, 19), vec![(0, 19, Some(LockType::Read))]);
        r.set(5, 7, Some(LockType::Write));
        assert_eq!(
            r.pieces(0, 25),
            vec![
                (0, 4, Some(LockType::Read)),
                (5, 7, Some(LockType::Write)),
                (8, 19, Some(LockType::Read)),
                (20, 25, None)
            ]
        );
        r.set(3, 12, None);
        assert_eq!(
            r.pieces(0, OFFSET_MAX),
            vec![
                (0, 2, Some(LockType::Read)),
                (3, 12, None),
                (13, 19, Some(LockType::Read)),
                (20, OFFSET_MAX, None)
            ]
        );
        assert!(!r.holds_write(5, 7) && !r.holds_write(0, 0));
        r.set(0, OFFSET_MAX, Some(LockType::Write));
        assert_eq!(r.pieces(5, 6), vec![(5, 6, Some(LockType::Write))]);
        assert!(r.holds_write(5, 6) && r.holds_write(0, OFFSET_MAX));
        r.set(0, OFFSET_MAX, None);
        assert!(r.is_empty());
    }
}
