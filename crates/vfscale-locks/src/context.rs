//! `struct file_lock_context`: one inode's locks and wait trees, under that inode's lock.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::lock::{
    family_conflict, lock_is_unlock, posix_locks_conflict, posix_same_owner, posix_test_locks_conflict,
    FileLock, LockKind, OwnerKey,
};
use crate::manager::{BlockedGuard, LockManager, WakeMode};
use crate::sync::{Mutex, MutexGuard};
use crate::waiter::{Link, Waiter, WakeList};
use crate::{Errno, InodeKey, LockType, OFFSET_MAX};

/// Index of a record in a context's arena.
pub(crate) type NodeId = usize;

/// A granted lock or a blocked request, with its place in a wait tree.
#[derive(Debug)]
pub(crate) struct Node {
    pub fl: FileLock,
    /// `flc_blocker`: the record this request waits on; `None` for a granted lock and
    /// for a request that was woken and has not tried again yet.
    pub blocker: Option<NodeId>,
    /// `flc_blocked_requests`, oldest first. Each conflicts with this record and with
    /// every record above it; siblings never conflict with each other.
    pub children: Vec<NodeId>,
    /// The wait cell, for a blocked request; `None` for a granted lock.
    pub waiter: Option<crate::sync::Arc<Waiter>>,
    /// In the blocked hash (its blocker was a process-owned POSIX record when it was
    /// inserted, as `__locks_insert_block` decides).
    pub hashed: bool,
}

/// Counters of one context, kept under its lock so no shared line is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContextStats {
    /// Lock requests granted (not counting unlocks).
    pub grants: u64,
    /// Blocked requests woken.
    pub wakeups: u64,
    /// Requests that went to sleep (first block and every re-block).
    pub blocks: u64,
    /// Requests finished on a starved owner's behalf (fair hand-offs).
    pub handoffs: u64,
}

/// Everything `flc_lock` protects.
#[derive(Debug, Default)]
pub(crate) struct Inner {
    nodes: Vec<Option<Node>>,
    free: Vec<NodeId>,
    /// `flc_flock`: granted flock locks, in the order they were granted.
    pub flock: Vec<NodeId>,
    /// `flc_posix`: granted POSIX and OFD locks; one owner's locks are adjacent and
    /// sorted by start, a new owner's go at the end.
    pub posix: Vec<NodeId>,
    /// This context is on a listing shard.
    listed: bool,
    pub stats: ContextStats,
    /// A woken request to finish on its owner's behalf before the lock is dropped.
    handoff: Option<NodeId>,
    /// When the last hand-off happened.
    last_handoff: Option<Instant>,
}

/// A waiter that has slept this long may be handed the lock ...
#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
const HANDOFF_STARVED: Duration = Duration::from_millis(2);
/// ... but an inode hands off at most once per this interval, so throughput stays with
/// the running owners (barging) and fairness costs one context switch per interval.
#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
const HANDOFF_EVERY: Duration = Duration::from_millis(1);
/// Under the model checkers time is not modelled: every eligible wake-up hands off, so
/// the hand-off path is explored deterministically.
#[cfg(any(vfscale_loom, vfscale_shuttle))]
const HANDOFF_STARVED: Duration = Duration::ZERO;
#[cfg(any(vfscale_loom, vfscale_shuttle))]
const HANDOFF_EVERY: Duration = Duration::ZERO;

/// A request's own record while it waits: `Some` from its first block until it is
/// granted, fails or is cancelled.
pub(crate) type Slot = Option<NodeId>;

/// The outcome of one pass of a lock algorithm.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// Finished: granted or refused.
    Done(Result<(), Errno>),
    /// The request sleeps in a wait tree (`FILE_LOCK_DEFERRED`).
    Blocked,
}

impl Inner {
    /// Empty lists whose buffers each span at least two cache lines. The hot entries sit
    /// at the front of each buffer, so a neighbouring heap block (another inode's) never
    /// shares a line with them: no false sharing between inodes locked by different
    /// threads.
    fn with_line_sized_buffers() -> Inner {
        const IDS: usize = 128 / std::mem::size_of::<NodeId>();
        Inner {
            nodes: Vec::with_capacity(4),
            free: Vec::with_capacity(IDS),
            flock: Vec::with_capacity(IDS),
            posix: Vec::with_capacity(IDS),
            ..Inner::default()
        }
    }

    pub fn node(&self, id: NodeId) -> &Node {
        self.nodes[id].as_ref().expect("live node")
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.nodes[id].as_mut().expect("live node")
    }

    fn alloc(&mut self, fl: FileLock) -> NodeId {
        let n = Node {
            fl,
            blocker: None,
            children: Vec::new(),
            waiter: None,
            hashed: false,
        };
        match self.free.pop() {
            Some(id) => {
                self.nodes[id] = Some(n);
                id
            }
            None => {
                self.nodes.push(Some(n));
                self.nodes.len() - 1
            }
        }
    }

    fn release(&mut self, id: NodeId) {
        debug_assert!(self.node(id).children.is_empty() && self.node(id).blocker.is_none());
        self.nodes[id] = None;
        self.free.push(id);
    }

    /// The link the detector sees for a request whose blocker is `b`.
    fn link_to(&self, b: NodeId) -> Link {
        let n = self.node(b);
        match &n.waiter {
            Some(w) => Link::Waiter(w.clone()),
            None => Link::Granted(n.fl.owner),
        }
    }

    /// `__locks_wake_up_blocks`: takes every direct waiter of `id` out of the tree and
    /// queues it on `wl`. Their own waiters stay attached to them.
    pub fn wake_up_blocks(&mut self, id: NodeId, wl: &mut WakeList, bg: &mut BlockedGuard<'_>) {
        for c in self.detach_children(id, bg) {
            self.wake_detached(c, wl);
        }
    }

    /// Takes every direct waiter of `id` out of the tree (and the blocked hash) without
    /// waking it yet; returns them, oldest first.
    fn detach_children(&mut self, id: NodeId, bg: &mut BlockedGuard<'_>) -> Vec<NodeId> {
        let children = std::mem::take(&mut self.node_mut(id).children);
        for &c in &children {
            self.detach(c, bg);
        }
        children
    }

    /// Clears request `c`'s side of its tree link (its blocker's list is the caller's
    /// business), its detector mirror and its place in the blocked hash.
    fn detach(&mut self, c: NodeId, bg: &mut BlockedGuard<'_>) {
        let n = self.node_mut(c);
        n.blocker = None;
        let hashed = std::mem::replace(&mut n.hashed, false);
        let w = n.waiter.clone().expect("a child is a request");
        w.set_link(Link::Detached);
        if hashed {
            bg.get().remove(&w);
        }
    }

    /// Queues a detached request for waking: its owner will try again.
    fn wake_detached(&mut self, id: NodeId, wl: &mut WakeList) {
        debug_assert!(self.node(id).blocker.is_none());
        self.stats.wakeups += 1;
        self.consider_handoff(id);
        let fl = &self.node(id).fl;
        tracing::trace!(target: "vfscale_locks::filelock", event = "wake", kind = ?fl.kind, owner = ?fl.owner, start = fl.start, end = fl.end);
        wl.push(self.node(id).waiter.clone().expect("a request"));
    }

    /// Hangs request `wid` directly under `b`, in the tree, the detector's mirror and,
    /// if `b` is a process-owned POSIX record, the blocked hash.
    fn link_under(&mut self, b: NodeId, wid: NodeId, bg: &mut BlockedGuard<'_>) {
        let link = self.link_to(b);
        let hashed = self.node(b).fl.is_process_posix();
        self.node_mut(b).children.push(wid);
        let n = self.node_mut(wid);
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
        let mut cur = self.node(id).blocker;
        while let Some(b) = cur {
            path.push(b);
            cur = self.node(b).blocker;
        }
        path
    }

    /// Whether request `d`, if it tried again now, would only go back to sleep: it
    /// conflicts with every record of `path` (which ends at a granted lock), and, for a
    /// process-owned POSIX request, the deadlock check its retry would run finds none.
    fn retry_would_sleep(&self, d: NodeId, path: &[NodeId], bg: &mut BlockedGuard<'_>) -> bool {
        let fl = self.node(d).fl;
        if !path.iter().all(|&a| family_conflict(&fl, &self.node(a).fl)) {
            return false;
        }
        if !fl.is_process_posix() {
            return true;
        }
        match self
            .posix
            .iter()
            .find(|&&id| posix_locks_conflict(&fl, &self.node(id).fl))
        {
            Some(&first) => !bg.get().posix_locks_deadlock(fl.owner, self.node(first).fl.owner),
            None => false,
        }
    }

    /// After request `wid` went back to sleep under a new blocker, decides for each of
    /// its former waiters (`orphans`, already detached) and their waiters: one whose
    /// retry would only sleep again stays where it was; any other is woken to retry, as
    /// Linux wakes them all. The results are Linux's; the cascade of wake-ups, one per
    /// waiter, is not (seed 003's herd would otherwise wake every waiter in turn).
    fn readopt(&mut self, wid: NodeId, orphans: Vec<NodeId>, wl: &mut WakeList, bg: &mut BlockedGuard<'_>) {
        if orphans.is_empty() {
            return;
        }
        let path: Vec<NodeId> = std::iter::once(wid).chain(self.ancestors(wid)).collect();
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
        // against the new records above `wid`. The walk allocates nothing: in seed
        // 003's herd the subtree is a chain of every waiter, checked on each re-queue.
        let above = &path[1..];
        while let Some(n) = keep.pop() {
            let mut kids = std::mem::take(&mut self.node_mut(n).children);
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
            self.node_mut(n).children = kids;
        }
    }

    /// `__locks_insert_block`: hangs request `wid` under `blocker`, descending to the
    /// deepest request it conflicts with, so that siblings never conflict.
    fn insert_block(&mut self, mode: WakeMode, blocker: NodeId, wid: NodeId, bg: &mut BlockedGuard<'_>) {
        debug_assert!(
            self.node(wid).children.is_empty(),
            "waiters of a request are detached first"
        );
        let fl = self.node(wid).fl;
        let mut b = blocker;
        if mode == WakeMode::Tree {
            'descend: loop {
                for &c in &self.node(b).children {
                    if family_conflict(&self.node(c).fl, &fl) {
                        b = c;
                        continue 'descend;
                    }
                }
                break;
            }
        }
        self.link_under(b, wid, bg);
        self.stats.blocks += 1;
    }

    /// Puts a request to sleep under `blocker`, or back to sleep after a retry. Its own
    /// waiters conflict with it but perhaps not with its new blocker ("conflicts with"
    /// is not transitive): they were detached before the deadlock check (so the check
    /// cannot find a chain through them) and are now re-examined.
    fn block(
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
    fn orphans_of(&mut self, slot: &Slot, bg: &mut BlockedGuard<'_>) -> Vec<NodeId> {
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
        let n = self.node_mut(wid);
        let b = n.blocker.take();
        let hashed = std::mem::replace(&mut n.hashed, false);
        let w = n.waiter.clone();
        if let Some(b) = b {
            self.node_mut(b).children.retain(|&c| c != wid);
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
    fn grant_record(&mut self, fl: FileLock, slot: &mut Slot, bg: &mut BlockedGuard<'_>) -> NodeId {
        self.stats.grants += 1;
        match slot.take() {
            None => self.alloc(fl),
            Some(id) => {
                self.unlink_from_blocker(id, bg);
                let n = self.node_mut(id);
                n.fl = fl;
                n.waiter = None;
                let children = n.children.clone();
                for c in children {
                    if let Some(w) = &self.node(c).waiter {
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
        let n = self.node_mut(id);
        let w = n.waiter.get_or_insert_with(|| Waiter::new(fl.owner)).clone();
        w.rearm();
        id
    }

    /// `locks_delete_lock_ctx`: removes the granted lock at `list[idx]`, waking its waiters.
    fn delete_lock(&mut self, posix: bool, idx: usize, wl: &mut WakeList, bg: &mut BlockedGuard<'_>) {
        let id = if posix {
            self.posix.remove(idx)
        } else {
            self.flock.remove(idx)
        };
        self.wake_up_blocks(id, wl, bg);
        self.release(id);
    }

    /// Picks a woken request for a hand-off if its owner has starved and this inode has
    /// not handed off recently.
    fn consider_handoff(&mut self, id: NodeId) {
        if self.handoff.is_some() {
            return;
        }
        let now = Instant::now();
        if self
            .last_handoff
            .is_some_and(|t| now.duration_since(t) < HANDOFF_EVERY)
        {
            return;
        }
        let w = self.node(id).waiter.as_ref().expect("a request");
        if w.wants_handoff(now, HANDOFF_STARVED) {
            self.handoff = Some(id);
            self.last_handoff = Some(now);
        }
    }

    /// Finishes the chosen hand-off: tries the starved request again now, on its
    /// owner's behalf, exactly as the owner's own retry would (one of the schedules
    /// Linux allows, where the woken task runs first). Linux leaves open which of the
    /// waiters and running owners wins; this bounds how long one waiter can lose.
    /// Called last, with `flc_lock` held.
    pub(crate) fn run_handoff(&mut self, mgr: &LockManager, wl: &mut WakeList, bg: &mut BlockedGuard<'_>) {
        let Some(id) = self.handoff.take() else { return };
        let Some(n) = self.nodes.get(id).and_then(|n| n.as_ref()) else {
            return;
        };
        let (Some(w), None) = (n.waiter.clone(), n.blocker) else {
            return;
        };
        let req = n.fl;
        let mut slot = Some(id);
        let a = if req.kind == LockKind::Flock {
            self.flock_lock_inode(mgr, req, &mut slot, true, wl, bg)
        } else {
            self.posix_lock_inode(mgr, req, &mut slot, true, wl, bg, None)
        };
        match a {
            Attempt::Done(r) => {
                if let Some(id) = slot.take() {
                    self.delete_block(id, wl, bg);
                }
                w.finish(r);
                self.stats.handoffs += 1;
            }
            // Asleep again: no need to wake it.
            Attempt::Blocked => wl.remove(&w),
        }
    }

    /// `posix_test_lock`: the first lock in list order that `req` conflicts with.
    pub fn posix_test_lock(&self, req: &FileLock) -> Option<FileLock> {
        self.posix
            .iter()
            .map(|&id| self.node(id).fl)
            .find(|fl| posix_test_locks_conflict(req, fl))
    }

    /// `posix_lock_inode`: applies a POSIX or OFD request: blocks it, or merges, splits
    /// and trims the owner's locks. `flc_lock` held.
    #[allow(clippy::too_many_arguments)]
    pub fn posix_lock_inode(
        &mut self,
        mgr: &LockManager,
        mut req: FileLock,
        slot: &mut Slot,
        sleep: bool,
        wl: &mut WakeList,
        bg: &mut BlockedGuard<'_>,
        conflock: Option<&mut FileLock>,
    ) -> Attempt {
        debug_assert!(req.on_posix_list());
        if req.ty != LockType::Unlock {
            let conflict = self
                .posix
                .iter()
                .copied()
                .find(|&id| posix_locks_conflict(&req, &self.node(id).fl));
            if let Some(fl_id) = conflict {
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

        // The owner's locks are adjacent: find the first.
        let mut i = self
            .posix
            .iter()
            .position(|&id| posix_same_owner(&req, &self.node(id).fl))
            .unwrap_or(self.posix.len());
        // The record the request has become (`request = fl` in the kernel): its range
        // is written back from `req` at the end.
        let mut became: Option<NodeId> = None;
        let mut added = false;
        let mut left: Option<NodeId> = None;
        let mut right: Option<NodeId> = None;
        while i < self.posix.len() {
            let id = self.posix[i];
            let fl = self.node(id).fl;
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
                    self.delete_lock(true, i, wl, bg);
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
                        self.delete_lock(true, i, wl, bg);
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
                return Attempt::Done(Ok(()));
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
        tracing::trace!(target: "vfscale_locks::filelock", event = if lock_is_unlock(&req) { "unlock" } else { "lock" }, kind = ?req.kind, owner = ?req.owner, start = req.start, end = req.end);
        Attempt::Done(Ok(()))
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
            self.delete_lock(false, idx, wl, bg);
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

/// One inode's lock context (`struct file_lock_context`), to embed in the caller's inode.
///
/// # What protects what
///
/// | field | protected by |
/// |---|---|
/// | both lock lists, every record's type and range | `inner` (`flc_lock`) |
/// | the wait trees (`blocker`, `children`) | `inner` |
/// | a waiter's wake state | that waiter's `state` (leaf) |
/// | a waiter's detector link | that waiter's `link` (leaf), written under `inner` |
/// | the blocked hash | the manager's `blocked_lock`, taken under `inner` |
///
/// Aligned to 128 bytes (two cache lines, for adjacent-line prefetch) so that two
/// inodes' contexts never share a line: lock and unlock on different inodes write no
/// common cache line.
#[derive(Debug)]
#[repr(align(128))]
pub struct FileLockContext {
    pub(crate) mgr: Arc<LockManager>,
    key: InodeKey,
    me: Weak<FileLockContext>,
    /// `flc_lock`.
    pub(crate) inner: Mutex<Inner>,
}

impl FileLockContext {
    /// A context for inode `key`, in the lock system of `mgr`.
    pub fn new(mgr: &Arc<LockManager>, key: InodeKey) -> Arc<FileLockContext> {
        Arc::new_cyclic(|me| FileLockContext {
            mgr: mgr.clone(),
            key,
            me: me.clone(),
            inner: Mutex::new(Inner::with_line_sized_buffers()),
        })
    }

    /// The inode this context belongs to.
    pub fn key(&self) -> InodeKey {
        self.key
    }

    /// The manager this context belongs to.
    pub fn manager(&self) -> &Arc<LockManager> {
        &self.mgr
    }

    /// Counters of this inode.
    pub fn stats(&self) -> ContextStats {
        self.inner.lock().stats
    }

    /// Runs `f` with `flc_lock` (and the global lock, in that setting) held and the
    /// blocked-hash lock available on demand; wakes what `f` detached after dropping
    /// every lock.
    pub(crate) fn with_locked<R>(
        &self,
        f: impl FnOnce(&mut Inner, &LockManager, &mut WakeList, &mut BlockedGuard<'_>) -> R,
    ) -> R {
        let mut wl = WakeList::new();
        let r = {
            let _big = self.mgr.big_lock();
            let mut inner: MutexGuard<'_, Inner> = self.inner.lock();
            // Every `Inner` method runs with `flc_lock` held: `&mut Inner` only comes
            // from this guard.
            debug_assert!(self.inner.is_locked());
            let mut bg = BlockedGuard::new(&self.mgr);
            let r = f(&mut inner, &self.mgr, &mut wl, &mut bg);
            inner.run_handoff(&self.mgr, &mut wl, &mut bg);
            let holds_locks = !inner.posix.is_empty() || !inner.flock.is_empty();
            if holds_locks && !inner.listed {
                inner.listed = true;
                self.mgr.listing_register(self.me.clone());
            }
            r
        };
        wl.wake_all();
        r
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
