//! `flock(2)` requests (`flock_lock_inode`): at most one lock per open file.

use crate::context::{Attempt, Inner, Slot};
use crate::lock::{family_conflict, lock_is_unlock, FileLock, LockKind};
use crate::manager::{BlockedGuard, LockManager};
use crate::wait_cell::WakeList;
use crate::Errno;

impl Inner {
    /// `locks_delete_lock_ctx` for a flock lock: removes `flock[idx]`, waking its waiters.
    fn flock_delete_lock(&mut self, idx: usize, wl: &mut WakeList, bg: &mut BlockedGuard<'_>) {
        let id = self.flock.remove(idx);
        self.wake_up_blocks(id, wl, bg);
        self.release(id);
    }

    /// `flock_lock_inode`: applies a flock request. A conversion drops the old lock
    /// first, so a conversion that fails has lost it. `flc_lock` held.
    pub fn flock_lock_inode(
        &mut self,
        mgr: &LockManager,
        req: FileLock,
        slot: &mut Slot,
        sleep: bool,
        wl: &mut WakeList,
        bg: &mut BlockedGuard<'_>,
    ) -> Attempt {
        debug_assert_eq!(req.kind, LockKind::Flock);
        if let Some(idx) = self
            .flock
            .iter()
            .position(|&id| self.node(id).fl.file == req.file)
        {
            if self.node(self.flock[idx]).fl.ty == req.ty {
                return Attempt::Done(Ok(()));
            }
            self.flock_delete_lock(idx, wl, bg);
        }
        if lock_is_unlock(&req) {
            tracing::trace!(target: "vfscale_locks::filelock", event = "unlock", kind = "flock", file = req.file.0);
            return Attempt::Done(Ok(()));
        }
        let conflict = self
            .flock
            .iter()
            .copied()
            .find(|&id| family_conflict(&req, &self.node(id).fl));
        if let Some(fl_id) = conflict {
            if !sleep {
                return Attempt::Done(Err(Errno::EAGAIN));
            }
            let orphans = self.orphans_of(slot, bg);
            return self.block(mgr, fl_id, req, slot, orphans, wl, bg);
        }
        let new = self.grant_record(req, slot, bg);
        self.flock.push(new);
        tracing::trace!(target: "vfscale_locks::filelock", event = "lock", kind = "flock", file = req.file.0);
        Attempt::Done(Ok(()))
    }
}
