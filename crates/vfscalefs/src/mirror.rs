//! Source locks: what the mount's clients hold through `vfscale-locks`, held again on the
//! source file so that processes using the source directly see it, and their locks are
//! seen through the mount (`-o source_locks=mirror`).
//!
//! # Record locks (POSIX and OFD)
//!
//! Each locked inode opens its source file once more, `O_RDWR` (`O_RDONLY` where that is
//! all it may) `| O_CLOEXEC`, for this alone: the *mirror description*, never a
//! passthrough backing file (the kernel's reference would keep its locks after the
//! server died). On it the server holds, as OFD locks, the union of the clients' locks:
//! write where any client holds a write lock, read where clients hold only reads, plus
//! the ranges of requests parked among clients (*reservations*, below). [`MirrorLocks`]
//! keeps a copy of what the description holds (only this module changes it).
//!
//! The order, per request, under the inode's mirror mutex:
//!
//! 1. **Raise first.** A lock request first raises the mirror on its range with
//!    `F_OFD_SETLK` (write: the whole range in one call, atomic; read: the ranges the
//!    mirror does not hold yet, undone on failure). `EAGAIN` there is a holder on the
//!    source: `F_SETLK` fails with `EAGAIN`, `F_SETLKW` waits for the host (below).
//!    Nothing was asked of `vfscale-locks` yet, so there is nothing to roll back.
//! 2. **Then `vfscale-locks`**, unchanged: the lock space among clients.
//! 3. **Lower last.** The mirror is brought down to the clients' union on the range:
//!    it is computed from `vfscale-locks` itself (`F_GETLK` probes of an owner that holds
//!    nothing), so a failed request, a downgrade, an unlock, `FLUSH` or `RELEASE` all
//!    lower it the same way. Lowering never fails.
//!
//! So a client's granted lock is always covered on the source before it is answered, and
//! the mirror is lowered only after `vfscale-locks` let the lock go. A request that must
//! wait for another client is parked in `vfscale-locks` with its range raised on the
//! mirror as a reservation: when it is handed the lock, the source is held already (a
//! host process asking for that range meanwhile waits, as it would behind the client
//! once granted). A failed or interrupted request drops its reservation.
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
//! Each client open file that holds a flock lock has a description of its own on the
//! source, holding the same flock lock: flock's owners are open files, so the kernel
//! sees the clients' as it sees its own processes' (and a conversion drops the old lock
//! first on both sides). The description is closed when the lock goes. The description
//! is locked first, then `vfscale-locks`, under the mirror mutex, and unlocked after
//! `vfscale-locks` under it too. A request that must wait for another client is parked
//! in `vfscale-locks` holding nothing on the source (a conversion has dropped its old
//! lock on both sides); once granted there it takes the source's lock (`LOCK_NB`) before
//! it is answered, or, if a host process took it meanwhile, gives the grant back and
//! waits for the host. A request that waits for the host waits in a thread blocked in
//! `flock(2)` on its own description: the kernel orders it among the host's waiters.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

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

/// How far after a file's change time a remembered stat must be taken for equal times
/// to mean "unchanged" (see [`Mirror::source_changed`]).
pub const MIRROR_TICK_NS: i128 = 50_000_000;

/// The source file as a grant's invalidation saw it: change and modification times,
/// size, and when (nanoseconds since the epoch).
#[derive(Clone, Copy, Debug)]
struct MirrorSeen {
    ctime: (i64, i64),
    mtime: (i64, i64),
    size: i64,
    at: i128,
}

/// A reservation: the range and type of requests parked among clients, and how many
/// (one entry per range and type: a herd of waiters costs one, not one each).
#[derive(Clone, Copy, Debug)]
struct Reservation {
    id: u64,
    s: i64,
    e: i64,
    ty: LockType,
    count: u32,
}

/// The mirror state of one inode (under [`Mirror::state`]).
#[derive(Default)]
pub struct MirrorLocks {
    /// The mirror description while it holds or reserves something, or a wait uses it;
    /// whether it was opened for writing.
    fd: Option<(Arc<MirrorFd>, bool)>,
    /// What the mirror description holds.
    held: MirrorRanges,
    reserved: Vec<Reservation>,
    next_id: u64,
    /// Host waits in flight on the mirror description: it stays open for them.
    waits: u32,
    /// The flock description of each client open file (connection, `fh`) that asked for
    /// a flock lock, with the type it holds; closed at the file's `RELEASE`.
    flocks: HashMap<(usize, u64), (Arc<MirrorFd>, Option<LockType>)>,
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
    /// Per connection, the source file as its last grant's invalidation saw it.
    seen: Mutex<Vec<Option<MirrorSeen>>>,
    /// Serializes raise → `vfscale-locks` → lower per inode (lock order: this, then the
    /// inode's lock owners, then `vfscale-locks`'s own).
    pub state: Mutex<MirrorLocks>,
}

/// A request's answer after a raise and `vfscale-locks`.
pub enum MirrorAttempt {
    /// Done: answer this.
    Done(Result<(), vfscale_locks::Errno>),
    /// Parked among clients, reservation `id` held until it completes.
    Parked(vfscale_locks::PendingLock, u64),
    /// A holder on the source conflicts (nothing was changed).
    Host,
}

impl Mirror {
    /// A mirror whose descriptions count against `budget`.
    pub fn new(budget: &Arc<MirrorBudget>) -> Mirror {
        Mirror {
            budget: budget.clone(),
            seen: Mutex::new(Vec::new()),
            state: Mutex::new(MirrorLocks::default()),
        }
    }

    /// Whether the source file (`st` now) may have changed since connection `conn`'s
    /// last grant invalidated its caches; if so, `st` is remembered for the next grant.
    /// Unchanged means the same change and modification times and size, remembered at
    /// least [`MIRROR_TICK_NS`] after the change time: timestamps come from a coarse
    /// clock, so a change within the same tick as the remembered one would not show.
    /// (Writes through a shared mapping update the times late: such a change may be
    /// missed.)
    pub fn source_changed(&self, conn: usize, st: &libc::stat64) -> bool {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i128)
            .unwrap_or(0);
        let cur = MirrorSeen {
            ctime: (st.st_ctime, st.st_ctime_nsec),
            mtime: (st.st_mtime, st.st_mtime_nsec),
            size: st.st_size,
            at: now,
        };
        let mut seen = self.seen.lock();
        if seen.len() <= conn {
            seen.resize(conn + 1, None);
        }
        let same = seen[conn].is_some_and(|p| {
            let changed_at = p.ctime.0 as i128 * 1_000_000_000 + p.ctime.1 as i128;
            (p.ctime, p.mtime, p.size) == (cur.ctime, cur.mtime, cur.size)
                && p.at - changed_at >= MIRROR_TICK_NS
        });
        if !same {
            seen[conn] = Some(cur);
        }
        !same
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

    /// Closes the mirror description if it holds and reserves nothing and no wait uses
    /// it: at the `RELEASE` of a handle of the inode (kept open between a client's lock
    /// and unlock cycles, it costs no open and close each time), and after a host wait.
    pub fn close_if_idle(&self, st: &mut MirrorLocks) {
        if st.held.is_empty() && st.reserved.is_empty() && st.waits == 0 {
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
        let mut st = self.state.lock();
        self.desc(&mut st, Some(open))
            .ok()
            .and_then(|(fd, _)| mirror_getlk(fd.as_raw_fd(), ty, s, e).ok().flatten())
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
            // Held already (the holder's or a reservation's range): the call would change nothing.
            LockType::Write if st.held.pieces(s, e) == [(s, e, Some(LockType::Write))] => true,
            LockType::Write if writable => match mirror_ofd(fd, libc::F_OFD_SETLK, Some(ty), s, e) {
                Ok(()) => {
                    st.held.set(s, e, Some(ty));
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
        true
    }

    /// Lowers the mirror over `[s, e]` to what the clients hold (`ctx`) and the
    /// reservations (step 3). Never raises: what needs raising was raised before its
    /// grant.
    pub fn lower(&self, st: &mut MirrorLocks, ctx: &Arc<FileLockContext>, s: i64, e: i64) {
        let Some((desc, _)) = st.fd.clone() else {
            return;
        };
        // A write reservation over all of `[s, e]` wants it all write: nothing to lower
        // (the common case of an unlock or a grant with waiters behind it).
        if st
            .reserved
            .iter()
            .any(|r| r.ty == LockType::Write && r.s <= s && r.e >= e)
        {
            return;
        }
        for (a, b, have) in st.held.pieces(s, e) {
            let Some(have) = have else { continue };
            let want = Self::wanted(st, ctx, a, b);
            for (x, y, w) in want.pieces(a, b) {
                let lower = matches!((have, w), (_, None) | (LockType::Write, Some(LockType::Read)));
                if lower && mirror_ofd(desc.as_raw_fd(), libc::F_OFD_SETLK, w, x, y).is_ok() {
                    st.held.set(x, y, w);
                }
            }
        }
    }

    /// What the mirror should hold over `[s, e]`: the clients' locks (write over read)
    /// and the reservations.
    fn wanted(st: &MirrorLocks, ctx: &Arc<FileLockContext>, s: i64, e: i64) -> MirrorRanges {
        let mut want = MirrorRanges::default();
        // A write probe conflicts with every lock, a read probe with write locks only.
        for (a, b) in client_cover(ctx, LockType::Write, s, e) {
            want.set(a, b, Some(LockType::Read));
        }
        for (a, b) in client_cover(ctx, LockType::Read, s, e) {
            want.set(a, b, Some(LockType::Write));
        }
        for r in &st.reserved {
            let (a, b) = (r.s.max(s), r.e.min(e));
            if a > b {
                continue;
            }
            if r.ty == LockType::Write {
                want.set(a, b, Some(LockType::Write));
            } else {
                for (x, y, t) in want.pieces(a, b) {
                    if t.is_none() {
                        want.set(x, y, Some(LockType::Read));
                    }
                }
            }
        }
        want
    }

    /// Keeps `[s, e]` raised for a parked request; its id for [`Mirror::unreserve`].
    /// Requests parked with the same range and type share one reservation.
    pub fn reserve(&self, st: &mut MirrorLocks, ty: LockType, s: i64, e: i64) -> u64 {
        if let Some(r) = st.reserved.iter_mut().find(|r| (r.s, r.e, r.ty) == (s, e, ty)) {
            r.count += 1;
            return r.id;
        }
        st.next_id += 1;
        let id = st.next_id;
        st.reserved.push(Reservation {
            id,
            s,
            e,
            ty,
            count: 1,
        });
        id
    }

    /// Drops one request's share of reservation `id` and lowers its range.
    pub fn unreserve(&self, st: &mut MirrorLocks, ctx: &Arc<FileLockContext>, id: u64) {
        if let Some(i) = st.reserved.iter().position(|r| r.id == id) {
            let r = &mut st.reserved[i];
            r.count -= 1;
            let (s, e) = (r.s, r.e);
            if r.count == 0 {
                st.reserved.swap_remove(i);
            }
            self.lower(st, ctx, s, e);
        }
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
    }

    /// The flock description of client file `key`, opened by `open` if it has none.
    pub fn flock_fd(
        &self,
        st: &mut MirrorLocks,
        key: (usize, u64),
        open: impl FnOnce() -> io::Result<OwnedFd>,
    ) -> io::Result<Arc<MirrorFd>> {
        if let Some((fd, _)) = st.flocks.get(&key) {
            return Ok(fd.clone());
        }
        let token = self.budget.take()?;
        let fd = Arc::new(MirrorFd {
            fd: open()?,
            _token: token,
        });
        st.flocks.insert(key, (fd.clone(), None));
        Ok(fd)
    }

    /// Client file `key` holds a flock lock of type `ty` on `fd` now.
    pub fn flock_held(&self, st: &mut MirrorLocks, key: (usize, u64), fd: Arc<MirrorFd>, ty: LockType) {
        st.flocks.insert(key, (fd, Some(ty)));
    }

    /// Client file `key` holds no flock lock any more: its lock on the source goes.
    pub fn flock_gone(&self, st: &mut MirrorLocks, key: (usize, u64)) {
        if let Some((fd, held)) = st.flocks.get_mut(&key) {
            if held.take().is_some() {
                let _ = mirror_flock_op(&**fd, libc::LOCK_UN);
            }
        }
    }

    /// Client file `key` was released: its flock description closes (once no wait uses
    /// it), and with it any lock it still held.
    pub fn flock_closed(&self, st: &mut MirrorLocks, key: (usize, u64)) {
        self.flock_gone(st, key);
        st.flocks.remove(&key);
    }

    /// Whether client file `key` holds a flock lock on the source.
    pub fn flock_holds(&self, st: &MirrorLocks, key: (usize, u64)) -> bool {
        st.flocks.get(&key).is_some_and(|(_, held)| held.is_some())
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

/// The ranges of `[s, e]` where a client holds a lock that conflicts with a `probe`-type
/// request: with a write probe every lock, with a read probe the write locks.
fn client_cover(ctx: &Arc<FileLockContext>, probe: LockType, s: i64, e: i64) -> Vec<MirrorRange> {
    let who = Process {
        owner: MIRROR_PROBE_OWNER,
        pid: Pid(0),
    };
    let file = OpenFile {
        id: MIRROR_PROBE_FILE,
        mode: AccessMode::ReadWrite,
    };
    let mut out = Vec::new();
    let mut todo = vec![(s, e)];
    while let Some((a, b)) = todo.pop() {
        if a > b {
            continue;
        }
        let mut fl = Flock::new(probe, a, mirror_len(a, b));
        if ctx.fcntl_lock(who, file, FcntlCmd::GetLk, &mut fl).is_err() || fl.l_type == LockType::Unlock {
            continue;
        }
        let ls = fl.l_start;
        let le = if fl.l_len == 0 {
            OFFSET_MAX
        } else {
            fl.l_start + fl.l_len - 1
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
        r.set(0, OFFSET_MAX, Some(LockType::Write));
        assert_eq!(r.pieces(5, 6), vec![(5, 6, Some(LockType::Write))]);
        r.set(0, OFFSET_MAX, None);
        assert!(r.is_empty());
    }
}
