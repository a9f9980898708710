//! The wait trees (`flc_blocked_requests`): how a blocked request hangs under what it
//! waits on, how an unlock wakes only what it freed, and how a woken request's own
//! waiters are re-examined.

use crate::context::{Attempt, Inner, NodeId, Slot};
use crate::lock::{family_conflict, FileLock};
use crate::manager::{BlockedGuard, LockManager, WakeMode};
use crate::wait_cell::{Link, WaitCell, WakeList};

impl Inner {
    /// The link the detector sees for a request whose blocker is `b`.
    fn link_to(&self, b: NodeId) -> Link {
        match self.waiter(b) {
            Some(w) => Link::Request(w.clone()),
            None => Link::Granted(self.node(b).fl.owner),
        }
    }

    /// `__locks_wake_up_blocks`: takes every direct waiter of `id` out of the tree and
    /// queues it on `wl`. Their own waiters stay attached to them.
    pub fn wake_up_blocks(&mut self, id: NodeId, wl: &mut WakeList, bg: &mut BlockedGuard<'_>) {
        self.freed = true;
        let children = self.detach_children(id, bg);
        if children.is_empty() {
            // Nothing to hold back: the turn's end (a clock read) is not needed. Most
            // unlocks in a herd wake nobody.
            return;
        }
        let hold = self.turn_end_for(self.node(id).fl.owner);
        for c in children {
            self.wake_detached(c, wl);
            if let Some(t) = hold {
                self.waiter(c).expect("a request").hold_until(t);
                self.stats.held += 1;
            }
        }
    }

    /// Takes every direct waiter of `id` out of the tree (and the blocked hash) without
    /// waking it yet; returns them, oldest first.
    fn detach_children(&mut self, id: NodeId, bg: &mut BlockedGuard<'_>) -> Vec<NodeId> {
        self.chain
            .on_take_children(id, self.arena.children(id), &self.arena);
        let children = self.arena.take_children(id);
        self.arena.shrink(id);
        for &c in &children {
            self.detach(c, bg);
        }
        children
    }

    /// Clears request `c`'s side of its tree link (its blocker's list is the caller's
    /// business), its detector mirror and its place in the blocked hash.
    fn detach(&mut self, c: NodeId, bg: &mut BlockedGuard<'_>) {
        self.chain.on_detach(c);
        let n = self.wait_mut(c);
        n.blocker = None;
        let hashed = std::mem::replace(&mut n.hashed, false);
        let w = n.waiter.clone().expect("a child is a request");
        w.set_link(Link::Detached);
        if hashed {
            bg.get().remove(&w);
        }
    }

    /// Queues a detached request for waking: its owner will try again.
    pub(super) fn wake_detached(&mut self, id: NodeId, wl: &mut WakeList) {
        debug_assert!(self.blocker(id).is_none());
        self.stats.wakeups += 1;
        if self.ready.len() >= self.ready_prune_at {
            self.prune_ready();
        }
        self.ready.push(id);
        let fl = &self.node(id).fl;
        tracing::trace!(target: "vfscale_locks::filelock", event = "wake", kind = ?fl.kind, owner = ?fl.owner, start = fl.start, end = fl.end);
        wl.push(self.waiter(id).expect("a request").clone());
    }

    /// Hangs request `wid` directly under `b`, in the tree, the detector's mirror and,
    /// if `b` is a process-owned POSIX record, the blocked hash.
    fn link_under(&mut self, b: NodeId, wid: NodeId, bg: &mut BlockedGuard<'_>) {
        let link = self.link_to(b);
        let hashed = self.node(b).fl.is_process_posix();
        let busy = !self.children(b).is_empty();
        self.chain.on_link(b, busy, wid, &self.arena.node(wid).fl);
        self.wait_mut(b).children.push(wid);
        let n = self.wait_mut(wid);
        n.blocker = Some(b);
        n.hashed = hashed;
        let w = n.waiter.clone().expect("a blocked record is a request");
        w.set_link(link);
        if hashed {
            bg.get().insert(&w);
        }
    }

    /// The records `id` waits on, nearest first, up to the granted lock at the root.
    fn ancestors(&self, id: NodeId) -> Vec<NodeId> {
        let mut path = Vec::new();
        let mut cur = self.blocker(id);
        while let Some(b) = cur {
            path.push(b);
            cur = self.blocker(b);
        }
        path
    }

    /// Whether request `d`, if it tried again now, would only go back to sleep: it
    /// conflicts with every record of `path` (which ends at a granted lock), and, for a
    /// process-owned POSIX request, the deadlock check its retry would run finds none.
    fn retry_would_sleep(&mut self, d: NodeId, path: &[NodeId], bg: &mut BlockedGuard<'_>) -> bool {
        self.stats.wait_nodes += 1;
        let fl = self.node(d).fl;
        if !path.iter().all(|&a| family_conflict(&fl, &self.node(a).fl)) {
            return false;
        }
        if !fl.is_process_posix() {
            return true;
        }
        match self.posix_first_conflict(&fl) {
            Some(first) => !bg.get().posix_locks_deadlock(fl.owner, self.node(first).fl.owner),
            None => false,
        }
    }

    /// After request `wid` went back to sleep under a new blocker, decides for each of
    /// its former waiters (`orphans`, already detached) and their waiters: one whose
    /// retry would only sleep again stays where it was; any other is woken to retry, as
    /// Linux wakes them all. The results are Linux's; the cascade of wake-ups, one per
    /// waiter, is not (the herd would otherwise wake every waiter in turn).
    fn readopt(&mut self, wid: NodeId, orphans: Vec<NodeId>, wl: &mut WakeList, bg: &mut BlockedGuard<'_>) {
        if orphans.is_empty() {
            return;
        }
        let path: Vec<NodeId> = std::iter::once(wid).chain(self.ancestors(wid)).collect();
        self.stats.wait_nodes += path.len() as u64;
        let mut keep = Vec::new();
        for c in orphans {
            if self.retry_would_sleep(c, &path, bg) {
                self.link_under(wid, c, bg);
                keep.push(c);
            } else {
                self.wake_detached(c, wl);
            }
        }
        // Deeper waiters conflict with the records between them and `wid`; check them
        // against the new records above `wid`. The walk allocates nothing: in the
        // herd the subtree is a chain of every waiter, checked on each re-queue.
        let above = &path[1..];
        while let Some(mut n) = keep.pop() {
            // A run of like waiters below `n` that all stay: go on from its tail (see
            // `chain.rs`); the walk would keep each member, unchanged, and wake none.
            if let Some(tail) = self.chain.skip_recheck(n, above, &self.arena) {
                self.stats.wait_nodes += 1;
                if !self.chain.posix_run() || self.posix_run_would_sleep(n, bg) {
                    #[cfg(any(debug_assertions, test))]
                    self.check_skip(n, tail, above, bg);
                    n = tail;
                }
            }
            self.chain
                .on_take_children(n, self.arena.children(n), &self.arena);
            let mut kids = self.arena.take_children(n);
            let mut i = 0;
            while i < kids.len() {
                let d = kids[i];
                if self.retry_would_sleep(d, above, bg) {
                    keep.push(d);
                    i += 1;
                } else {
                    kids.remove(i);
                    self.detach(d, bg);
                    self.wake_detached(d, wl);
                }
            }
            self.wait_mut(n).children = kids;
        }
    }

    /// For a run of process-owned POSIX waiters whose top `n` stays (it conflicts with
    /// every record above it, and so does every member: `Chain::skip_recheck`): whether
    /// every member below `n` would stay too, i.e. its retry finds a first conflict and
    /// the deadlock check from that conflict's owner does not reach the member's owner.
    /// O(log n) index queries and at most `MAX_DEADLK_ITERATIONS + 1` detector hops,
    /// whatever the run's length. Exact:
    /// - First conflict. `posix_first_conflict` skips only the requester's own locks, so
    ///   for a member it is `g`, the first lock that clashes with the template whoever
    ///   owns it, unless `g` is that member's. `f` (first for `n`'s owner) is `g` unless
    ///   `g` is `n`'s; `h` (first for `f`'s owner) is `g` if `g` is `n`'s (`n`'s owner
    ///   is not `f`'s). So with `f`'s owner and `h`'s (if any) not run members, `g = f`
    ///   and no member owns it: every member's first conflict is `f`.
    /// - Deadlock. The detector's walk from `f`'s owner is the same for every caller (it
    ///   stops early only on reaching the caller), so a member is refused iff its owner
    ///   is on that walk: one walk, asking the run's owner counts at each hop. The walk
    ///   reads the blocked hash and the links, which the re-check does not change while
    ///   every request it looks at stays.
    pub(super) fn posix_run_would_sleep(&mut self, n: NodeId, bg: &mut BlockedGuard<'_>) -> bool {
        let fl = self.node(n).fl;
        let Some(f) = self.posix_first_conflict(&fl) else {
            return false;
        };
        let f_owner = self.node(f).fl.owner;
        if self.chain.has_ident(f_owner) {
            return false;
        }
        let mut q = fl;
        q.owner = f_owner;
        if let Some(h) = self.posix_first_conflict(&q) {
            if self.chain.has_ident(self.node(h).fl.owner) {
                return false;
            }
        }
        let chain = &self.chain;
        let (deadlock, hops) = bg.get().posix_locks_deadlock_any(f_owner, |o| chain.has_ident(o));
        self.stats.wait_nodes += hops;
        !deadlock
    }

    /// Checks a skip of `readopt`'s re-check from `n` to `tail` against the walk: each
    /// request below `n`, down to `tail`, is the only child of the one before and would
    /// stay (`retry_would_sleep`, its counters put back).
    #[cfg(any(debug_assertions, test))]
    fn check_skip(&mut self, n: NodeId, tail: NodeId, above: &[NodeId], bg: &mut BlockedGuard<'_>) {
        let (stats, cost) = (self.stats, self.cost);
        let mut cur = n;
        while cur != tail {
            let kids = self.children(cur);
            assert_eq!(kids.len(), 1, "a skipped request has one child");
            cur = kids[0];
            assert!(
                self.retry_would_sleep(cur, above, bg),
                "a skipped request would stay"
            );
        }
        (self.stats, self.cost) = (stats, cost);
    }

    /// `__locks_insert_block`: hangs request `wid` under `blocker`, descending to the
    /// deepest request it conflicts with, so that siblings never conflict.
    fn insert_block(&mut self, mode: WakeMode, blocker: NodeId, wid: NodeId, bg: &mut BlockedGuard<'_>) {
        debug_assert!(
            self.children(wid).is_empty(),
            "waiters of a request are detached first"
        );
        let fl = self.node(wid).fl;
        let mut b = blocker;
        if mode == WakeMode::Tree {
            let mut path = Vec::new();
            let mut jumped = false;
            'descend: loop {
                for &c in self.arena.children(b) {
                    self.stats.wait_nodes += 1;
                    if family_conflict(&self.arena.node(c).fl, &fl) {
                        // A run of like waiters below `c`: the walk would go down
                        // through all of them (see `chain.rs`).
                        b = match self.chain.jump(c, &fl) {
                            Some(tail) => {
                                jumped = true;
                                tail
                            }
                            None => c,
                        };
                        if !jumped {
                            path.push(b);
                        }
                        continue 'descend;
                    }
                }
                break;
            }
            #[cfg(any(debug_assertions, test))]
            {
                self.chain.check(&self.arena);
                assert_eq!(
                    b,
                    self.plain_descent(blocker, &fl),
                    "the jump lands where the walk does"
                );
            }
            if !jumped {
                self.chain.build(&path, &self.arena);
            }
        }
        self.link_under(b, wid, bg);
        self.stats.blocks += 1;
    }

    /// Checks the tracked run of like waiters against the tree.
    #[cfg(test)]
    pub(crate) fn chain_check(&self) {
        self.chain.check(&self.arena);
    }

    /// `__locks_insert_block`'s descent as Linux walks it, to check the jump against.
    #[cfg(any(debug_assertions, test))]
    fn plain_descent(&self, blocker: NodeId, fl: &FileLock) -> NodeId {
        let mut b = blocker;
        'descend: loop {
            for &c in self.children(b) {
                if family_conflict(&self.node(c).fl, fl) {
                    b = c;
                    continue 'descend;
                }
            }
            return b;
        }
    }

    /// Puts a request to sleep under `blocker`, or back to sleep after a retry. Its own
    /// waiters conflict with it but perhaps not with its new blocker ("conflicts with"
    /// is not transitive): they were detached before the deadlock check (so the check
    /// cannot find a chain through them) and are now re-examined.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn block(
        &mut self,
        mgr: &LockManager,
        blocker: NodeId,
        req: FileLock,
        slot: &mut Slot,
        orphans: Vec<NodeId>,
        wl: &mut WakeList,
        bg: &mut BlockedGuard<'_>,
    ) -> Attempt {
        let wid = self.blocked_record(req, slot);
        self.insert_block(mgr.settings().wake, blocker, wid, bg);
        self.readopt(wid, orphans, wl, bg);
        tracing::trace!(target: "vfscale_locks::filelock", event = "block", kind = ?req.kind, owner = ?req.owner, start = req.start, end = req.end);
        Attempt::Blocked
    }

    /// The retrying request's own waiters, detached (see [`Inner::block`]).
    pub(super) fn orphans_of(&mut self, slot: &Slot, bg: &mut BlockedGuard<'_>) -> Vec<NodeId> {
        match *slot {
            Some(id) => self.detach_children(id, bg),
            None => Vec::new(),
        }
    }

    /// `__locks_delete_block` and freeing: request `wid` leaves for good. Its waiters are
    /// woken first.
    pub fn delete_block(&mut self, wid: NodeId, wl: &mut WakeList, bg: &mut BlockedGuard<'_>) {
        self.wake_up_blocks(wid, wl, bg);
        self.unlink_from_blocker(wid, bg);
        self.release(wid);
    }

    fn unlink_from_blocker(&mut self, wid: NodeId, bg: &mut BlockedGuard<'_>) {
        self.chain.on_unlink(wid);
        let Some(n) = self.arena.wait_links(wid) else {
            return;
        };
        let b = n.blocker.take();
        let hashed = std::mem::replace(&mut n.hashed, false);
        let w = n.waiter.clone();
        if let Some(b) = b {
            self.wait_mut(b).children.retain(|&c| c != wid);
            self.arena.shrink(b);
        }
        if let Some(w) = w {
            w.set_link(Link::Detached);
            if hashed {
                bg.get().remove(&w);
            }
        }
    }

    /// Makes the request's record, or a new one, the granted lock `fl`
    /// (`locks_copy_lock` + `locks_move_blocks`): its waiters now wait on the lock.
    pub(super) fn grant_record(
        &mut self,
        fl: FileLock,
        slot: &mut Slot,
        bg: &mut BlockedGuard<'_>,
    ) -> NodeId {
        self.stats.grants += 1;
        match slot.take() {
            None => self.alloc(fl),
            Some(id) => {
                self.chain.on_grant(id, &self.arena);
                self.unlink_from_blocker(id, bg);
                self.node_mut(id).fl = fl;
                self.wait_mut(id).waiter = None;
                self.arena.shrink(id);
                let children = self.children(id).to_vec();
                for c in children {
                    if let Some(w) = self.waiter(c) {
                        w.set_link(Link::Granted(fl.owner));
                    }
                }
                id
            }
        }
    }

    /// The request's record, made on its first block, re-armed on every later one.
    fn blocked_record(&mut self, fl: FileLock, slot: &mut Slot) -> NodeId {
        let id = match *slot {
            Some(id) => id,
            None => *slot.insert(self.alloc(fl)),
        };
        let now = self.clock.now();
        let n = self.wait_mut(id);
        let w = n
            .waiter
            .get_or_insert_with(|| WaitCell::new(fl.owner, now))
            .clone();
        w.rearm();
        id
    }
}
