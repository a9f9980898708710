//! The source file as each connection's kernel caches it, remembered at its last lock
//! grant: a grant whose file is unchanged since needs no invalidation. Used by the
//! source-lock mirrors (`Mirror::grant_begin`) and by `--cluster` (`cluster.rs`), where
//! the other servers' clients change the file under their locks.

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use parking_lot::Mutex;

/// How far after a file's change time a remembered stat must be taken for equal times
/// to mean "unchanged" (see [`SourceViews::source_changed`]).
pub const MIRROR_TICK_NS: i128 = 50_000_000;

/// The source file as a connection's caches hold it: change and modification times,
/// size, when that was seen (nanoseconds since the epoch), and whether its filesystem
/// shows every later change in the change time (`ctime.rs`).
#[derive(Clone, Copy, Debug)]
struct MirrorSeen {
    ctime: (i64, i64),
    mtime: (i64, i64),
    size: i64,
    at: i128,
    fine: bool,
}

impl MirrorSeen {
    fn of(st: &libc::stat64, fine: bool) -> MirrorSeen {
        MirrorSeen {
            ctime: (st.st_ctime, st.st_ctime_nsec),
            mtime: (st.st_mtime, st.st_mtime_nsec),
            size: st.st_size,
            at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as i128)
                .unwrap_or(0),
            fine,
        }
    }

    /// Whether the file, `st` now, is unchanged since this view: the same times and
    /// size, and no change since can hide behind equal times (a fine change time, or
    /// the view taken [`MIRROR_TICK_NS`] after the change time: timestamps from a coarse
    /// clock do not show a change within the same tick).
    fn vouches_for(&self, st: &libc::stat64) -> bool {
        let changed_at = self.ctime.0 as i128 * 1_000_000_000 + self.ctime.1 as i128;
        (self.ctime, self.mtime, self.size)
            == (
                (st.st_ctime, st.st_ctime_nsec),
                (st.st_mtime, st.st_mtime_nsec),
                st.st_size,
            )
            && (self.fine || self.at - changed_at >= MIRROR_TICK_NS)
    }
}

/// One connection's view: the source file as its caches hold it once the invalidations
/// sent for it are done, and how many are not done yet.
#[derive(Clone, Copy, Default)]
struct ConnView {
    seen: Option<MirrorSeen>,
    /// Invalidations decided on and not yet done: while any is, no view vouches for the
    /// file (the caches may still hold what came before it).
    inflight: u32,
}

/// Per connection, the source file as its caches hold it.
#[derive(Default)]
pub struct SourceViews {
    /// Per connection, the source file as its last grant's invalidation saw it.
    seen: Mutex<Vec<ConnView>>,
    /// The sum of `seen`'s `inflight` (changed under its mutex): with none under way,
    /// [`SourceViews::invalidating`] needs no lock (it runs at every hand-off's grant).
    inflight_any: AtomicU32,
    /// Whether the source file's change time shows every change made after a `stat`
    /// (`ctime.rs`), once asked.
    fine_ctime: OnceLock<bool>,
}

impl SourceViews {
    /// Whether the source file (`st` now, through `file`) may have changed since
    /// connection `conn`'s caches were last known to hold it (its last grant's check, or
    /// its own change since); if so, `st` is remembered for the next grant, and the caller
    /// must invalidate the connection's caches and then call
    /// [`SourceViews::invalidation_done`]. Unchanged means that the remembered view
    /// vouches for `st` (`MirrorSeen::vouches_for`) and no invalidation is still under
    /// way: a grant answered before an earlier one's invalidation is done would find the
    /// old attributes and pages still cached. (Writes through a shared mapping update the
    /// times late: such a change may be missed.)
    pub fn source_changed(&self, conn: usize, st: &libc::stat64, file: BorrowedFd<'_>) -> bool {
        let cur = MirrorSeen::of(st, self.fine_ctime(st, file));
        let mut seen = self.seen.lock();
        let v = Self::of(&mut seen, conn);
        let same = v.inflight == 0 && v.seen.is_some_and(|p| p.vouches_for(st));
        if !same {
            v.seen = Some(cur);
            self.begin(v);
        }
        !same
    }

    /// Connection `conn`'s caches must go, whatever the file (its `stat` failed): as
    /// [`SourceViews::source_changed`] returning true, with no view remembered.
    pub fn must_invalidate(&self, conn: usize) {
        let mut seen = self.seen.lock();
        let v = Self::of(&mut seen, conn);
        v.seen = None;
        self.begin(v);
    }

    /// Counts an invalidation under way for `v` (under the views' mutex).
    fn begin(&self, v: &mut ConnView) {
        v.inflight += 1;
        self.inflight_any.fetch_add(1, Ordering::Release);
    }

    /// An invalidation of connection `conn`'s caches that [`SourceViews::source_changed`]
    /// or [`SourceViews::must_invalidate`] asked for is done (or was given up).
    pub fn invalidation_done(&self, conn: usize) {
        let mut seen = self.seen.lock();
        let v = Self::of(&mut seen, conn);
        debug_assert!(v.inflight > 0, "an invalidation done that was never begun");
        if v.inflight > 0 {
            v.inflight -= 1;
            self.inflight_any.fetch_sub(1, Ordering::Release);
        }
    }

    /// Whether an invalidation of connection `conn`'s caches is under way.
    pub fn invalidating(&self, conn: usize) -> bool {
        self.inflight_any.load(Ordering::Acquire) != 0
            && self.seen.lock().get(conn).is_some_and(|v| v.inflight > 0)
    }

    fn of(seen: &mut Vec<ConnView>, conn: usize) -> &mut ConnView {
        if seen.len() <= conn {
            seen.resize(conn + 1, ConnView::default());
        }
        &mut seen[conn]
    }

    /// Connection `conn` changed the source file itself (`file`; a `SETATTR` through the
    /// server), which was `before` just before and is `after` now: if the connection's
    /// remembered view vouched for `before`, its caches hold `after` (the reply carries
    /// it), which is remembered instead. Else the view stays, and the next grant's check
    /// finds the file changed, as a host's change must be found.
    pub fn own_change(&self, conn: usize, before: &libc::stat64, after: &libc::stat64, file: BorrowedFd<'_>) {
        let cur = MirrorSeen::of(after, self.fine_ctime(after, file));
        let mut seen = self.seen.lock();
        if let Some(v) = seen.get_mut(conn) {
            if v.seen.is_some_and(|p| p.vouches_for(before)) {
                v.seen = Some(cur);
            }
        }
    }

    /// Whether the source file's change time shows every change made after a `stat`.
    fn fine_ctime(&self, st: &libc::stat64, file: BorrowedFd<'_>) -> bool {
        *self
            .fine_ctime
            .get_or_init(|| super::ctime::fine_ctime(file, st.st_dev))
    }

    /// Takes the source filesystem's change times to be fine or not (tests).
    #[cfg(test)]
    pub fn assume_fine_ctime(&self, fine: bool) {
        let _ = self.fine_ctime.set(fine);
    }
}
