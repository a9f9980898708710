//! The POSIX/OFD lock update over the index ([`LockIndex::Tree`](crate::LockIndex::Tree)).

use crate::context::{Arena, Inner, NodeId, Slot};
use crate::index::PosixTree;
use crate::lock::{lock_is_unlock, posix_same_owner, FileLock};
use crate::manager::BlockedGuard;
use crate::wait_cell::WakeList;

impl Inner {
    /// `locks_delete_lock_ctx` for a POSIX or OFD lock with [`LockIndex::Tree`](crate::LockIndex::Tree).
    fn tree_delete_lock(&mut self, id: NodeId, wl: &mut WakeList, bg: &mut BlockedGuard<'_>) {
        self.tree.remove(&mut self.arena, id, &mut self.cost);
        self.wake_up_blocks(id, wl, bg);
        self.release(id);
    }

    /// The second half of `posix_lock_inode` with [`LockIndex::Tree`](crate::LockIndex::Tree): the same walk
    /// and the same changes in the same order as [`Inner::posix_update_list`], over the
    /// owner's run in the index. It starts at the first of the owner's locks the list
    /// walk would not skip (the walk skips every lock ending before `start - 1`), and a
    /// record whose range changes leaves the index before the change and comes back
    /// after it, with its run's list-order key.
    pub(super) fn posix_update_tree(
        &mut self,
        mut req: FileLock,
        slot: &mut Slot,
        wl: &mut WakeList,
        bg: &mut BlockedGuard<'_>,
    ) -> Option<()> {
        // The owner's first lock the list walk would not skip, and the run's place in
        // the list, taken before anything changes (a lock that replaces the owner's
        // last one keeps it).
        let (first, run) = {
            let (t, ar, w) = (&self.tree, &self.arena, &mut self.cost);
            // One descent finds both the owner's lock at or before `start - 1` and the
            // one after it.
            match t.owner_around(ar, req.owner, req.start - 1, w) {
                (Some(f), _) if ar.node(f).fl.end >= req.start - 1 => (Some(f), Some(ar.node(f).ix.seq)),
                (Some(f), after) => (after, Some(ar.node(f).ix.seq)),
                (None, after) => (after, after.map(|c| ar.node(c).ix.seq)),
            }
        };
        let mut cur = first;
        let mut became: Option<NodeId> = None;
        let mut added = false;
        let mut left: Option<NodeId> = None;
        let mut right: Option<NodeId> = None;
        while let Some(id) = cur {
            let fl = self.node(id).fl;
            self.cost.checks += 1;
            debug_assert!(posix_same_owner(&req, &fl));
            // The owner's next lock, looked up only when the walk goes on and before
            // `id` can leave the index.
            let next = |me: &mut Self| me.tree.owner_next(&me.arena, id, &mut me.cost);
            if req.ty == fl.ty {
                if fl.end < req.start - 1 {
                    cur = next(self);
                    continue;
                }
                if fl.start - 1 > req.end {
                    break;
                }
                cur = next(self);
                req.start = req.start.min(fl.start);
                req.end = req.end.max(fl.end);
                if added {
                    self.tree_delete_lock(id, wl, bg);
                    continue;
                }
                became = Some(id);
                added = true;
            } else {
                if fl.end < req.start {
                    cur = next(self);
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
                // An unlock ending where this lock ends stops at the owner's next lock
                // (it starts after `req.end` and is never of the unlock's type): no need
                // to look it up.
                cur = if lock_is_unlock(&req) && fl.end >= req.end {
                    None
                } else {
                    next(self)
                };
                if fl.start >= req.start {
                    if added {
                        self.tree_delete_lock(id, wl, bg);
                        continue;
                    }
                    // The new record takes this one's place (it is indexed at the end,
                    // under the run's key).
                    let new = self.grant_record(req, slot, bg);
                    self.tree.remove(&mut self.arena, id, &mut self.cost);
                    self.wake_up_blocks(id, wl, bg);
                    self.release(id);
                    became = Some(new);
                    added = true;
                }
            }
        }

        let mut seq = run;
        let mut run_key = |t: &mut PosixTree, ar: &mut Arena| *seq.get_or_insert_with(|| t.new_seq(ar));
        if !added {
            if lock_is_unlock(&req) {
                return None;
            }
            let new = self.grant_record(req, slot, bg);
            let k = run_key(&mut self.tree, &mut self.arena);
            self.tree.insert(&mut self.arena, new, k, &mut self.cost);
        } else if let Some(b) = became {
            if self.node(b).ix.indexed {
                self.tree.remove(&mut self.arena, b, &mut self.cost);
            }
            let n = self.node_mut(b);
            n.fl.start = req.start;
            n.fl.end = req.end;
            let k = run_key(&mut self.tree, &mut self.arena);
            self.tree.insert(&mut self.arena, b, k, &mut self.cost);
        }
        if let Some(r) = right {
            let k = run_key(&mut self.tree, &mut self.arena);
            self.tree.remove(&mut self.arena, r, &mut self.cost);
            if left == Some(r) {
                // The request splits one lock in two: the left part is a new record.
                let mut copy = self.node(r).fl;
                copy.end = req.start - 1;
                let l = self.alloc(copy);
                self.tree.insert(&mut self.arena, l, k, &mut self.cost);
                left = None;
            }
            self.node_mut(r).fl.start = req.end + 1;
            self.tree.insert(&mut self.arena, r, k, &mut self.cost);
            self.wake_up_blocks(r, wl, bg);
        }
        if let Some(l) = left {
            let k = run_key(&mut self.tree, &mut self.arena);
            self.tree.remove(&mut self.arena, l, &mut self.cost);
            self.node_mut(l).fl.end = req.start - 1;
            self.tree.insert(&mut self.arena, l, k, &mut self.cost);
            self.wake_up_blocks(l, wl, bg);
        }
        Some(())
    }
}
