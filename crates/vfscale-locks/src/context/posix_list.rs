//! The POSIX/OFD lock update over Linux's list ([`LockIndex::List`](crate::LockIndex::List)).

use crate::context::{Inner, NodeId, Slot};
use crate::lock::{lock_is_unlock, posix_same_owner, FileLock};
use crate::manager::BlockedGuard;
use crate::wait_cell::WakeList;

impl Inner {
    /// `locks_delete_lock_ctx` for a POSIX or OFD lock with
    /// [`LockIndex::List`](crate::LockIndex::List): removes `posix[idx]`, waking its
    /// waiters.
    fn list_delete_lock(&mut self, idx: usize, wl: &mut WakeList, bg: &mut BlockedGuard<'_>) {
        let id = self.posix.remove(idx);
        self.wake_up_blocks(id, wl, bg);
        self.release(id);
    }

    /// The second half of `posix_lock_inode` over Linux's list ([`LockIndex::List`](crate::LockIndex::List)):
    /// walks the owner's locks, merging, splitting and trimming. `None` when the request
    /// was an unlock that changed nothing.
    pub(super) fn posix_update_list(
        &mut self,
        mut req: FileLock,
        slot: &mut Slot,
        wl: &mut WakeList,
        bg: &mut BlockedGuard<'_>,
    ) -> Option<()> {
        // The owner's locks are adjacent: find the first.
        let mut i = 0;
        while i < self.posix.len() {
            self.cost.checks += 1;
            if posix_same_owner(&req, &self.node(self.posix[i]).fl) {
                break;
            }
            i += 1;
        }
        // The record the request has become (`request = fl` in the kernel): its range
        // is written back from `req` at the end.
        let mut became: Option<NodeId> = None;
        let mut added = false;
        let mut left: Option<NodeId> = None;
        let mut right: Option<NodeId> = None;
        while i < self.posix.len() {
            let id = self.posix[i];
            let fl = self.node(id).fl;
            self.cost.checks += 1;
            if !posix_same_owner(&req, &fl) {
                break;
            }
            if req.ty == fl.ty {
                // Same type: merge when adjacent or overlapping. Compare with
                // `start - 1`, never `end + 1`, which overflows at OFFSET_MAX.
                if fl.end < req.start - 1 {
                    i += 1;
                    continue;
                }
                if fl.start - 1 > req.end {
                    break;
                }
                req.start = req.start.min(fl.start);
                req.end = req.end.max(fl.end);
                if added {
                    self.list_delete_lock(i, wl, bg);
                    continue;
                }
                became = Some(id);
                added = true;
                i += 1;
            } else {
                if fl.end < req.start {
                    i += 1;
                    continue;
                }
                if fl.start > req.end {
                    break;
                }
                if lock_is_unlock(&req) {
                    added = true;
                }
                if fl.start < req.start {
                    left = Some(id);
                }
                if fl.end > req.end {
                    right = Some(id);
                    break;
                }
                if fl.start >= req.start {
                    // The request covers this lock entirely.
                    if added {
                        self.list_delete_lock(i, wl, bg);
                        continue;
                    }
                    let new = self.grant_record(req, slot, bg);
                    self.posix[i] = new;
                    self.wake_up_blocks(id, wl, bg);
                    self.release(id);
                    became = Some(new);
                    added = true;
                }
                i += 1;
            }
        }

        if !added {
            if lock_is_unlock(&req) {
                return None;
            }
            let new = self.grant_record(req, slot, bg);
            self.posix.insert(i, new);
        } else if let Some(b) = became {
            let n = self.node_mut(b);
            n.fl.start = req.start;
            n.fl.end = req.end;
        }
        if let Some(r) = right {
            if left == Some(r) {
                // The request splits one lock in two: the left part is a new record.
                let mut copy = self.node(r).fl;
                copy.end = req.start - 1;
                let l = self.alloc(copy);
                self.posix.insert(i, l);
                left = None;
            }
            self.node_mut(r).fl.start = req.end + 1;
            self.wake_up_blocks(r, wl, bg);
        }
        if let Some(l) = left {
            self.node_mut(l).fl.end = req.start - 1;
            self.wake_up_blocks(l, wl, bg);
        }
        Some(())
    }
}
