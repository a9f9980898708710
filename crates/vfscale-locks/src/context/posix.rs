//! POSIX and OFD requests (`posix_lock_inode`, `posix_test_lock`): the entry points and
//! the conflict search, whichever index holds the locks.

use crate::context::{Attempt, Inner, NodeId, Slot};
use crate::lock::{
    lock_is_unlock, posix_locks_conflict, posix_test_locks_conflict, FileLock, LockKind, OwnerKey, Reported,
};
use crate::manager::{BlockedGuard, LockIndex, LockManager};
use crate::wait_cell::WakeList;
use crate::{Errno, LockType, OFFSET_MAX};

impl Inner {
    /// `posix_test_lock`: the first lock in list order that `req` conflicts with
    /// (`posix_test_locks_conflict`: for an `F_UNLCK` probe, the owner's own).
    pub fn posix_test_lock(&mut self, req: &FileLock) -> Option<Reported> {
        let found = match self.index {
            LockIndex::List => {
                let mut found = None;
                for &id in &self.posix {
                    self.cost.checks += 1;
                    if posix_test_locks_conflict(req, &self.arena.node(id).fl) {
                        found = Some(id);
                        break;
                    }
                }
                found
            }
            LockIndex::Tree if lock_is_unlock(req) => {
                // The owner's first lock overlapping the range: the one starting at or
                // before it if that reaches it, else the next one.
                let w = &mut self.cost;
                let t = &self.tree;
                let ar = &self.arena;
                let first = match t.owner_around(ar, req.owner, req.start, w) {
                    (Some(f), _) if ar.node(f).fl.end >= req.start => Some(f),
                    (_, after) => after,
                };
                first.filter(|&f| {
                    w.checks += 1;
                    posix_test_locks_conflict(req, &ar.node(f).fl)
                })
            }
            LockIndex::Tree => {
                // Reported from the by-start tree's leaf: no record is read.
                let found = self.tree.first_conflict(&self.arena, req, &mut self.cost);
                return found.map(|e| Reported {
                    ty: if e.write() {
                        LockType::Write
                    } else {
                        LockType::Read
                    },
                    start: e.start(),
                    end: e.end(),
                    pid: e.tag().pid,
                });
            }
        };
        found.map(|id| self.node(id).fl.reported())
    }

    /// The POSIX and OFD locks of `owner` that overlap `[start, end]`, in start order,
    /// each as (start, end, type) cut to the range. `flc_lock` held.
    pub fn posix_owner_locks(&mut self, owner: OwnerKey, start: i64, end: i64) -> Vec<(i64, i64, LockType)> {
        let mut out = Vec::new();
        let cut = |fl: &FileLock| (fl.start.max(start), fl.end.min(end), fl.ty);
        match self.index {
            LockIndex::List => {
                for &id in &self.posix {
                    let fl = &self.arena.node(id).fl;
                    if fl.owner == owner && fl.start <= end && fl.end >= start {
                        out.push(cut(fl));
                    }
                }
                out.sort_by_key(|p| p.0);
            }
            LockIndex::Tree => {
                let w = &mut self.cost;
                let (t, ar) = (&self.tree, &self.arena);
                // An owner's locks do not overlap: the one starting at or before
                // `start` if it reaches it, then its successors up to `end`.
                let mut at = match t.owner_around(ar, owner, start, w) {
                    (Some(f), _) if ar.node(f).fl.end >= start => Some(f),
                    (_, after) => after,
                };
                while let Some(id) = at {
                    let fl = &ar.node(id).fl;
                    if fl.start > end {
                        break;
                    }
                    out.push(cut(fl));
                    at = t.owner_next(ar, id, w);
                }
            }
        }
        out
    }

    /// The first lock in list order that request `req` conflicts with
    /// (`posix_locks_conflict`).
    pub(super) fn posix_first_conflict(&mut self, req: &FileLock) -> Option<NodeId> {
        match self.index {
            LockIndex::List => {
                for &id in &self.posix {
                    self.cost.checks += 1;
                    if posix_locks_conflict(req, &self.arena.node(id).fl) {
                        return Some(id);
                    }
                }
                None
            }
            LockIndex::Tree => self
                .tree
                .first_conflict(&self.arena, req, &mut self.cost)
                .map(|e| e.id()),
        }
    }

    /// `posix_lock_inode`: applies a POSIX or OFD request: blocks it, or merges, splits
    /// and trims the owner's locks. `flc_lock` held.
    #[allow(clippy::too_many_arguments)]
    pub fn posix_lock_inode(
        &mut self,
        mgr: &LockManager,
        req: FileLock,
        slot: &mut Slot,
        sleep: bool,
        wl: &mut WakeList,
        bg: &mut BlockedGuard<'_>,
        conflock: Option<&mut FileLock>,
    ) -> Attempt {
        debug_assert!(req.on_posix_list());
        if req.ty != LockType::Unlock {
            if let Some(fl_id) = self.posix_first_conflict(&req) {
                if let Some(c) = conflock {
                    *c = self.node(fl_id).fl;
                }
                if !sleep {
                    return Attempt::Done(Err(Errno::EAGAIN));
                }
                // Requests blocked on this one must not be found by the detector
                // through it (`__locks_wake_up_blocks(request)` in Linux).
                let orphans = self.orphans_of(slot, bg);
                // Detection and insertion happen under the same blocked_lock hold.
                if req.is_process_posix()
                    && bg
                        .get()
                        .posix_locks_deadlock(req.owner, self.node(fl_id).fl.owner)
                {
                    mgr.count_deadlock();
                    tracing::debug!(target: "vfscale_locks::filelock", event = "deadlock", owner = ?req.owner, start = req.start, end = req.end);
                    for c in orphans {
                        self.wake_detached(c, wl);
                    }
                    return Attempt::Done(Err(Errno::EDEADLK));
                }
                return self.block(mgr, fl_id, req, slot, orphans, wl, bg);
            }
        }
        let r = match self.index {
            LockIndex::List => self.posix_update_list(req, slot, wl, bg),
            LockIndex::Tree => self.posix_update_tree(req, slot, wl, bg),
        };
        if r.is_some() {
            tracing::trace!(target: "vfscale_locks::filelock", event = if lock_is_unlock(&req) { "unlock" } else { "lock" }, kind = ?req.kind, owner = ?req.owner, start = req.start, end = req.end);
        }
        Attempt::Done(Ok(()))
    }
}

/// Whole-file unlock for `owner` on the POSIX list (`locks_remove_posix`, and the OFD
/// half of `locks_remove_file`).
pub(crate) fn posix_unlock_all(
    kind: LockKind,
    owner: OwnerKey,
    file: crate::FileId,
    pid: crate::Pid,
) -> FileLock {
    FileLock {
        kind,
        ty: LockType::Unlock,
        start: 0,
        end: OFFSET_MAX,
        owner,
        file,
        pid,
    }
}
