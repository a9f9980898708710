//! The system-call layer: `fcntl(2)` record locks, `flock(2)`, and what `close(2)` does
//! to locks. Turns a `struct flock` into a record the way `fs/locks.c` does, with the
//! same checks in the same order, so the errno is the one Linux gives.

use std::sync::Arc;
use std::time::Instant;

use crate::context::{posix_unlock_all, Attempt, FileLockContext};
use crate::lock::{FileLock, LockKind, OwnerKey, Reported};
use crate::pending::PendingLock;
use crate::{
    AccessMode, Errno, FcntlCmd, FileId, Flock, FlockOp, LockType, OwnerId, Pid, Whence, OFFSET_MAX,
};

/// The process making a call: the owner of its POSIX locks, and its pid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Process {
    /// The POSIX lock owner (shared by the threads of one process).
    pub owner: OwnerId,
    /// The pid `F_GETLK` reports for its locks.
    pub pid: Pid,
}

impl Process {
    /// Process `n`: owner `n`, pid `n`.
    pub fn new(n: u32) -> Process {
        Process {
            owner: OwnerId(n as u64),
            pid: Pid(n as i32),
        }
    }
}

/// The open file description a call goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpenFile {
    /// Its identity: the owner of its OFD and flock locks.
    pub id: FileId,
    /// How it was opened.
    pub mode: AccessMode,
}

impl OpenFile {
    /// Open file description `n`, opened with `mode`.
    pub fn new(n: u64, mode: AccessMode) -> OpenFile {
        OpenFile { id: FileId(n), mode }
    }
}

/// `flock64_to_posix_lock`: the inclusive byte range of a `struct flock`.
///
/// ```
/// use vfscale_locks::{flock_to_posix_range, Errno, Flock, LockType, OFFSET_MAX};
/// assert_eq!(flock_to_posix_range(&Flock::new(LockType::Read, 10, 0)), Ok((10, OFFSET_MAX)));
/// assert_eq!(flock_to_posix_range(&Flock::new(LockType::Read, 10, -5)), Ok((5, 9)));
/// assert_eq!(flock_to_posix_range(&Flock::new(LockType::Read, -1, 1)), Err(Errno::EINVAL));
/// assert_eq!(flock_to_posix_range(&Flock::new(LockType::Read, OFFSET_MAX, 2)), Err(Errno::EOVERFLOW));
/// ```
pub fn flock_to_posix_range(l: &Flock) -> Result<(i64, i64), Errno> {
    let base = match l.l_whence {
        Whence::Set => 0,
        Whence::Cur(pos) => pos,
        Whence::End(size) => size,
    };
    if l.l_start > OFFSET_MAX - base {
        return Err(Errno::EOVERFLOW);
    }
    let start = base + l.l_start;
    if start < 0 {
        return Err(Errno::EINVAL);
    }
    if l.l_len > 0 {
        if l.l_len - 1 > OFFSET_MAX - start {
            return Err(Errno::EOVERFLOW);
        }
        Ok((start, start + (l.l_len - 1)))
    } else if l.l_len < 0 {
        if start + l.l_len < 0 {
            return Err(Errno::EINVAL);
        }
        Ok((start + l.l_len, start - 1))
    } else {
        Ok((start, OFFSET_MAX))
    }
}

/// `check_fmode_for_setlk`: a read lock needs a readable file, a write lock a writable one.
fn check_fmode_for_setlk(ty: LockType, mode: AccessMode) -> Result<(), Errno> {
    match ty {
        LockType::Read if !mode.can_read() => Err(Errno::EBADF),
        LockType::Write if !mode.can_write() => Err(Errno::EBADF),
        _ => Ok(()),
    }
}

/// `posix_lock_to_flock`: fills in what `F_GETLK` returns.
fn posix_lock_to_flock(fl: &Reported, out: &mut Flock) {
    out.l_type = fl.ty;
    out.l_whence = Whence::Set;
    out.l_start = fl.start;
    out.l_len = if fl.end == OFFSET_MAX {
        0
    } else {
        fl.end - fl.start + 1
    };
    out.l_pid = fl.pid;
}

/// Waits in this thread for a request started with `wait_here` (the `*_waited` calls
/// of fcntl and flock alike): `Some` with when it first slept, `None` if it was done at once.
#[inline]
fn wait_here(started: Option<PendingLock>) -> Result<Option<Instant>, Errno> {
    match started {
        Some(p) => {
            let since = p.blocked_at();
            p.wait().map(|()| Some(since))
        }
        None => Ok(None),
    }
}

impl FileLockContext {
    /// `fcntl(fd, cmd, &flock)` for the six record-lock commands.
    ///
    /// * `F_GETLK`/`F_OFD_GETLK` fill in `fl` and return `Ok(None)`;
    /// * `F_SETLK`/`F_OFD_SETLK` return `Ok(None)` or fail (`EAGAIN`, ...);
    /// * `F_SETLKW`/`F_OFD_SETLKW` return `Ok(None)` when granted at once, or a
    ///   [`PendingLock`] to wait on.
    ///
    /// Errors come in Linux's order: range (`EINVAL`, `EOVERFLOW`), open mode
    /// (`EBADF`), then `l_pid` for OFD commands (`EINVAL`).
    pub fn fcntl_lock(
        self: &Arc<Self>,
        who: Process,
        file: OpenFile,
        cmd: FcntlCmd,
        fl: &mut Flock,
    ) -> Result<Option<PendingLock>, Errno> {
        self.fcntl_request(who, file, cmd, fl, false)
    }

    /// [`FileLockContext::fcntl_lock`]; `wait_here` when the caller goes on to
    /// [`PendingLock::wait`] at once.
    fn fcntl_request(
        self: &Arc<Self>,
        who: Process,
        file: OpenFile,
        cmd: FcntlCmd,
        fl: &mut Flock,
        wait_here: bool,
    ) -> Result<Option<PendingLock>, Errno> {
        if cmd.is_get() {
            self.fcntl_getlk(who, file, cmd, fl)?;
            return Ok(None);
        }
        let (start, end) = flock_to_posix_range(fl)?;
        check_fmode_for_setlk(fl.l_type, file.mode)?;
        let (kind, owner) = if cmd.is_ofd() {
            if fl.l_pid != 0 {
                return Err(Errno::EINVAL);
            }
            (LockKind::Ofd, OwnerKey::File(file.id))
        } else {
            (LockKind::Posix, OwnerKey::Process(who.owner))
        };
        let req = FileLock {
            kind,
            ty: fl.l_type,
            start,
            end,
            owner,
            file: file.id,
            pid: who.pid,
        };
        self.lock_start(req, cmd.waits(), wait_here)
    }

    /// As [`FileLockContext::fcntl_lock`], waiting in this thread when the command waits.
    ///
    /// ```
    /// use vfscale_locks::*;
    /// let mgr = LockManager::new();
    /// let inode = FileLockContext::new(&mgr, InodeKey::default());
    /// let (a, b) = (Process::new(1), Process::new(2));
    /// let f = OpenFile::new(1, AccessMode::ReadWrite);
    /// let g = OpenFile::new(2, AccessMode::ReadWrite);
    /// inode.fcntl(a, f, FcntlCmd::SetLk, &mut Flock::new(LockType::Write, 0, 10)).unwrap();
    /// let mut probe = Flock::new(LockType::Read, 5, 1);
    /// inode.fcntl(b, g, FcntlCmd::GetLk, &mut probe).unwrap();
    /// assert_eq!((probe.l_type, probe.l_start, probe.l_len, probe.l_pid), (LockType::Write, 0, 10, 1));
    /// assert_eq!(inode.fcntl(b, g, FcntlCmd::SetLk, &mut Flock::new(LockType::Read, 5, 1)), Err(Errno::EAGAIN));
    /// ```
    pub fn fcntl(
        self: &Arc<Self>,
        who: Process,
        file: OpenFile,
        cmd: FcntlCmd,
        fl: &mut Flock,
    ) -> Result<(), Errno> {
        self.fcntl_waited(who, file, cmd, fl).map(|_| ())
    }

    /// As [`FileLockContext::fcntl`], and says whether the call had to wait: `Some`
    /// with the time its request first went to sleep, `None` if it was done at once.
    ///
    /// ```
    /// use vfscale_locks::*;
    /// let mgr = LockManager::new();
    /// let inode = FileLockContext::new(&mgr, InodeKey::default());
    /// let f = OpenFile::new(1, AccessMode::ReadWrite);
    /// let mut fl = Flock::new(LockType::Write, 0, 0);
    /// assert_eq!(inode.fcntl_waited(Process::new(1), f, FcntlCmd::SetLkW, &mut fl), Ok(None));
    /// ```
    pub fn fcntl_waited(
        self: &Arc<Self>,
        who: Process,
        file: OpenFile,
        cmd: FcntlCmd,
        fl: &mut Flock,
    ) -> Result<Option<Instant>, Errno> {
        wait_here(self.fcntl_request(who, file, cmd, fl, true)?)
    }

    /// `fcntl_getlk`.
    fn fcntl_getlk(&self, who: Process, file: OpenFile, cmd: FcntlCmd, fl: &mut Flock) -> Result<(), Errno> {
        if cmd != FcntlCmd::OfdGetLk && fl.l_type == LockType::Unlock {
            return Err(Errno::EINVAL);
        }
        let (start, end) = flock_to_posix_range(fl)?;
        let (kind, owner) = if cmd == FcntlCmd::OfdGetLk {
            if fl.l_pid != 0 {
                return Err(Errno::EINVAL);
            }
            (LockKind::Ofd, OwnerKey::File(file.id))
        } else {
            (LockKind::Posix, OwnerKey::Process(who.owner))
        };
        let req = FileLock {
            kind,
            ty: fl.l_type,
            start,
            end,
            owner,
            file: file.id,
            pid: who.pid,
        };
        let found = {
            let _big = self.mgr.big_lock();
            self.inner.lock().posix_test_lock(&req)
        };
        match found {
            Some(c) => posix_lock_to_flock(&c, fl),
            None => fl.l_type = LockType::Unlock,
        }
        Ok(())
    }

    /// The POSIX locks `who` holds over `[start, end]` (inclusive; `OFFSET_MAX`: to the
    /// end of the file), in start order, each as (start, end, type) cut to the range:
    /// what a request of `who` over that range replaces, for a caller that may have to
    /// put it back.
    ///
    /// ```
    /// use vfscale_locks::*;
    /// let mgr = LockManager::new();
    /// let inode = FileLockContext::new(&mgr, InodeKey::default());
    /// let (p, f) = (Process::new(1), OpenFile::new(1, AccessMode::ReadWrite));
    /// inode.fcntl(p, f, FcntlCmd::SetLk, &mut Flock::new(LockType::Read, 0, 10)).unwrap();
    /// inode.fcntl(p, f, FcntlCmd::SetLk, &mut Flock::new(LockType::Write, 20, 0)).unwrap();
    /// assert_eq!(
    ///     inode.posix_owner_locks(p, 5, 29),
    ///     vec![(5, 9, LockType::Read), (20, 29, LockType::Write)]
    /// );
    /// assert_eq!(inode.posix_owner_locks(Process::new(2), 0, OFFSET_MAX), vec![]);
    /// ```
    pub fn posix_owner_locks(&self, who: Process, start: i64, end: i64) -> Vec<(i64, i64, LockType)> {
        let _big = self.mgr.big_lock();
        self.inner
            .lock()
            .posix_owner_locks(OwnerKey::Process(who.owner), start, end)
    }

    /// `flock(fd, op | (nb ? LOCK_NB : 0))`: `Ok(None)` when done, a [`PendingLock`] when
    /// it must wait (only without `nb`).
    ///
    /// ```
    /// use vfscale_locks::*;
    /// let mgr = LockManager::new();
    /// let inode = FileLockContext::new(&mgr, InodeKey::default());
    /// let p = Process::new(1);
    /// let (f, g) = (OpenFile::new(1, AccessMode::Read), OpenFile::new(2, AccessMode::Read));
    /// inode.flock(p, f, FlockOp::Shared, true).unwrap();
    /// inode.flock(p, g, FlockOp::Shared, true).unwrap();
    /// // Converting to exclusive drops the shared lock first: it is lost on failure.
    /// assert_eq!(inode.flock(p, f, FlockOp::Exclusive, true).unwrap_err(), Errno::EAGAIN);
    /// inode.flock(p, g, FlockOp::Exclusive, true).unwrap();
    /// ```
    pub fn flock_lock(
        self: &Arc<Self>,
        who: Process,
        file: OpenFile,
        op: FlockOp,
        nb: bool,
    ) -> Result<Option<PendingLock>, Errno> {
        self.lock_start(FileLock::flock(file.id, who.pid, op.lock_type()), !nb, false)
    }

    /// As [`FileLockContext::flock_lock`], waiting in this thread.
    pub fn flock(self: &Arc<Self>, who: Process, file: OpenFile, op: FlockOp, nb: bool) -> Result<(), Errno> {
        self.flock_waited(who, file, op, nb).map(|_| ())
    }

    /// As [`FileLockContext::flock`], and says whether the call had to wait (see
    /// [`FileLockContext::fcntl_waited`]).
    pub fn flock_waited(
        self: &Arc<Self>,
        who: Process,
        file: OpenFile,
        op: FlockOp,
        nb: bool,
    ) -> Result<Option<Instant>, Errno> {
        wait_here(self.lock_start(FileLock::flock(file.id, who.pid, op.lock_type()), !nb, true)?)
    }

    /// The first attempt of a lock request. With `wait_here` the caller waits in
    /// [`PendingLock::wait`] as soon as this returns, so a request that blocks may be
    /// handed the lock from the moment it is in the wait tree.
    fn lock_start(
        self: &Arc<Self>,
        req: FileLock,
        sleep: bool,
        wait_here: bool,
    ) -> Result<Option<PendingLock>, Errno> {
        let mut slot = None;
        let (a, waiter) = self.with_locked(|inner, mgr, wl, bg| {
            let a = if req.kind == LockKind::Flock {
                inner.flock_lock_inode(mgr, req, &mut slot, sleep, wl, bg)
            } else {
                inner.posix_lock_inode(mgr, req, &mut slot, sleep, wl, bg, None)
            };
            let waiter = match (&a, slot) {
                (Attempt::Blocked, Some(id)) => {
                    let w = inner.waiter(id).expect("a blocked request").clone();
                    if wait_here {
                        w.set_blocking(true);
                    }
                    Some(w)
                }
                _ => None,
            };
            (a, waiter)
        });
        match (a, waiter) {
            (Attempt::Blocked, Some(w)) => Ok(Some(PendingLock::new(self.clone(), req, slot, w))),
            (Attempt::Done(r), _) => r.map(|()| None),
            (Attempt::Blocked, None) => unreachable!("a blocked request has a record"),
        }
    }

    /// `locks_remove_posix`: what closing any descriptor does. Drops every POSIX lock
    /// `who` holds on this inode, whichever descriptor took it.
    pub fn posix_remove_owner(&self, who: Process) {
        let req = posix_unlock_all(
            LockKind::Posix,
            OwnerKey::Process(who.owner),
            FileId(u64::MAX),
            who.pid,
        );
        self.unlock_record(req);
    }

    /// `locks_remove_file`: what the last close of an open file description does. Drops
    /// its OFD locks and its flock lock.
    pub fn file_remove(&self, file: FileId) {
        self.unlock_record(posix_unlock_all(
            LockKind::Ofd,
            OwnerKey::File(file),
            file,
            Pid(0),
        ));
        self.unlock_record(FileLock::flock(file, Pid(0), LockType::Unlock));
    }

    fn unlock_record(&self, req: FileLock) {
        let mut slot = None;
        self.with_locked(|inner, mgr, wl, bg| {
            let empty = if req.kind == LockKind::Flock {
                inner.flock.is_empty()
            } else {
                inner.posix_is_empty()
            };
            if empty {
                return;
            }
            if req.kind == LockKind::Flock {
                inner.flock_lock_inode(mgr, req, &mut slot, false, wl, bg);
            } else {
                inner.posix_lock_inode(mgr, req, &mut slot, false, wl, bg, None);
            }
        });
    }
}
