//! `struct file_lock_context`: one inode's locks and wait trees, under that inode's lock.

use std::sync::{Arc, Weak};

use crate::chain::Chain;
use crate::fair::{a_quantum_after, waited_a_quantum, Clock, Stamp};
use crate::index::{IndexLinks, PosixTree, Work};
use crate::lock::{
    family_conflict, lock_is_unlock, posix_locks_conflict, posix_same_owner, posix_test_locks_conflict,
    FileLock, LockKind, OwnerKey, Reported,
};
use crate::manager::{BlockedGuard, LockIndex, LockManager, WakeMode};
use crate::sync::{Mutex, MutexGuard};
use crate::waiter::{Link, Waiter, WakeList};
use crate::{Errno, InodeKey, LockType, OFFSET_MAX};

/// Index of a record in a context's arena.
pub(crate) type NodeId = u32;
/// No record (an empty tree link).
pub(crate) const NIL: NodeId = NodeId::MAX;

/// A record's part in a wait tree: present (boxed) only on a blocked request and on a
/// lock or request that others wait on, so a lock nobody waits for stays small.
#[derive(Debug, Default)]
pub(crate) struct WaitLinks {
    /// `flc_blocker`: the record this request waits on; `None` for a granted lock and
    /// for a request that was woken and has not tried again yet.
    pub blocker: Option<NodeId>,
    /// `flc_blocked_requests`, oldest first. Each conflicts with this record and with
    /// every record above it; siblings never conflict with each other.
    pub children: Vec<NodeId>,
    /// The wait cell, for a request; `None` for a granted lock.
    pub waiter: Option<crate::sync::Arc<Waiter>>,
    /// In the blocked hash (its blocker was a process-owned POSIX record when it was
    /// inserted, as `__locks_insert_block` decides).
    pub hashed: bool,
}

/// A granted lock or a blocked request, with its place, for a granted POSIX or OFD
/// lock under [`LockIndex::Tree`], in the index. Its part in a wait tree is in
/// [`Arena`]'s side table, so that the record is exactly one cache line: a conflict
/// check or `F_GETLK` reads one line per record.
///
/// `repr(C)`: the index links end where the record's range begins, so an overlap scan
/// reads one stretch of the node.
#[derive(Debug)]
#[repr(C, align(64))]
pub(crate) struct Node {
    pub ix: IndexLinks,
    pub fl: FileLock,
}

const _: () = assert!(std::mem::size_of::<Option<Node>>() == 64);

/// The records of one inode: slots reused through a free list. Grows by an eighth at a
/// time, so that an inode holding many locks wastes little on spare capacity. A
/// record's wait links (boxed, present only on a blocked request and on a record that
/// others wait on) sit in `waits`, indexed like `slots`: the rarely used part of a
/// record stays off its cache line. `waits` is made on the inode's first wait (until
/// then it is empty, and a lock costs 8 bytes less: at 1,000 OFD locks 128.1 -> 119.2 B
/// per lock); from then on it is as long as `slots`.
#[derive(Debug, Default)]
pub(crate) struct Arena {
    slots: Vec<Option<Node>>,
    /// Empty, or one entry per slot.
    waits: Vec<Option<Box<WaitLinks>>>,
    free: Vec<NodeId>,
}

impl Arena {
    pub fn node(&self, id: NodeId) -> &Node {
        self.slots[id as usize].as_ref().expect("live node")
    }

    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.slots[id as usize].as_mut().expect("live node")
    }

    fn wait(&self, id: NodeId) -> Option<&WaitLinks> {
        self.waits.get(id as usize).and_then(|w| w.as_deref())
    }

    /// `flc_blocker` of record `id`.
    pub fn blocker(&self, id: NodeId) -> Option<NodeId> {
        self.wait(id).and_then(|w| w.blocker)
    }

    /// The direct waiters of record `id`, oldest first.
    pub fn children(&self, id: NodeId) -> &[NodeId] {
        self.wait(id).map_or(&[], |w| &w.children)
    }

    /// The wait cell of request `id`; `None` for a granted lock.
    pub fn waiter(&self, id: NodeId) -> Option<&crate::sync::Arc<Waiter>> {
        self.wait(id).and_then(|w| w.waiter.as_ref())
    }

    /// The wait links of record `id`, made on first use.
    fn wait_mut(&mut self, id: NodeId) -> &mut WaitLinks {
        if self.waits.is_empty() {
            self.waits.reserve_exact(self.slots.capacity());
            self.waits.resize_with(self.slots.len(), || None);
        }
        self.waits[id as usize].get_or_insert_with(Default::default)
    }

    /// The wait links of record `id`, if it has any.
    fn wait_links(&mut self, id: NodeId) -> Option<&mut WaitLinks> {
        self.waits.get_mut(id as usize).and_then(|w| w.as_deref_mut())
    }

    fn take_children(&mut self, id: NodeId) -> Vec<NodeId> {
        self.wait_links(id)
            .map(|w| std::mem::take(&mut w.children))
            .unwrap_or_default()
    }

    /// Frees the wait links of record `id` once they hold nothing.
    fn shrink(&mut self, id: NodeId) {
        if let Some(w) = self.waits.get_mut(id as usize) {
            if w.as_ref()
                .is_some_and(|w| w.blocker.is_none() && w.children.is_empty() && w.waiter.is_none())
            {
                *w = None;
            }
        }
    }

    fn alloc(&mut self, fl: FileLock) -> NodeId {
        let n = Node {
            fl,
            ix: IndexLinks::default(),
        };
        match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = Some(n);
                id
            }
            None => {
                if self.slots.len() == self.slots.capacity() {
                    let more = (self.slots.len() / 8).max(4);
                    self.slots.reserve_exact(more);
                    if !self.waits.is_empty() {
                        self.waits.reserve_exact(self.slots.capacity() - self.waits.len());
                    }
                }
                let id = NodeId::try_from(self.slots.len())
                    .ok()
                    .filter(|&id| id != NIL)
                    .expect("fewer than 2^32 - 1 lock records on one inode");
                self.slots.push(Some(n));
                if !self.waits.is_empty() {
                    self.waits.push(None);
                }
                id
            }
        }
    }

    fn release(&mut self, id: NodeId) {
        self.slots[id as usize] = None;
        if let Some(w) = self.waits.get_mut(id as usize) {
            *w = None;
        }
        self.free.push(id);
    }
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
    /// Requests finished on a waiting owner's behalf (fair hand-offs: at most one per
    /// quantum, to the request that has waited longest).
    pub handoffs: u64,
    /// Wake-ups by the unlock of an owner in its turn, whose waiter was asked not to
    /// retry before the turn ends.
    pub held: u64,
    /// Lock records compared with a request while searching the POSIX/OFD locks for a
    /// conflict, for `F_GETLK`, or for the owner's locks to merge, split and trim. With
    /// [`LockIndex::List`] this is every list entry walked, as in Linux; with
    /// [`LockIndex::Tree`] only the locks overlapping (or, for the owner's own, touching)
    /// the request.
    pub lock_checks: u64,
    /// Index tree nodes visited (descents, overlap scans, rebalancing); 0 with
    /// [`LockIndex::List`].
    pub index_nodes: u64,
    /// Wait-tree records visited while blocking a request: children compared in the
    /// insert descent (a jump over a run of like waiters counts one), records on the
    /// path to the root, former waiters re-checked.
    pub wait_nodes: u64,
}

/// What one inode's lock state occupies in memory, from [`FileLockContext::memory`].
///
/// `bytes` counts the context itself and every buffer it owns at its capacity: the
/// record arena (granted locks and requests, each with its index links), the lists, the
/// side table of wait links (8 bytes a record, from the inode's first wait on), the wait
/// links of records in a wait tree and the wait cells of requests. It does not count the
/// allocator's own per-block overhead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContextMemory {
    /// Granted POSIX and OFD locks.
    pub posix_locks: usize,
    /// Granted flock locks.
    pub flock_locks: usize,
    /// Requests that are waiting.
    pub requests: usize,
    /// Bytes in use, as described above.
    pub bytes: usize,
}

impl ContextMemory {
    /// Bytes per granted lock (`bytes` over all granted locks; the context's own size
    /// is spread over them).
    pub fn bytes_per_lock(&self) -> f64 {
        self.bytes as f64 / (self.posix_locks + self.flock_locks).max(1) as f64
    }
}

/// Everything `flc_lock` protects.
#[derive(Debug, Default)]
pub(crate) struct Inner {
    pub arena: Arena,
    /// How the POSIX/OFD locks are found (from the manager's settings).
    index: LockIndex,
    /// `flc_flock`: granted flock locks, in the order they were granted.
    pub flock: Vec<NodeId>,
    /// `flc_posix` with [`LockIndex::List`]: granted POSIX and OFD locks; one owner's
    /// locks are adjacent and sorted by start, a new owner's go at the end.
    posix: Vec<NodeId>,
    /// The same locks with [`LockIndex::Tree`], indexed (see `index.rs`).
    pub(crate) tree: PosixTree,
    /// This context is on a listing shard.
    listed: bool,
    pub stats: ContextStats,
    work: Work,
    /// Requests woken and not yet tried again (possibly stale: see
    /// [`Inner::is_ready`]), the candidates for a hand-off.
    ready: Vec<NodeId>,
    /// When `ready` is next pruned of stale entries.
    ready_prune_at: usize,
    /// Something that was held or waited on changed in this critical section, so a
    /// waiter may be grantable now.
    freed: bool,
    /// Where the inode is in its hand-off quantum.
    turn: Turn,
    /// The run of like waiters the insert descent jumps over (see `chain.rs`).
    chain: Chain,
    /// Time for the hand-off (see `fair.rs`).
    clock: Clock,
}

/// Where an inode is in its fairness quantum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Turn {
    /// No hand-off yet: one may happen at any time.
    #[default]
    Open,
    /// This owner was just handed the lock: its turn starts when a lock next changes
    /// (typically its own first unlock, once it has woken up), so that its wake-up
    /// latency does not eat its quantum.
    Starting(OwnerKey),
    /// This owner's turn: no hand-off before the stamp.
    Until(Stamp, OwnerKey),
}

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
    fn with_line_sized_buffers(index: LockIndex) -> Inner {
        const IDS: usize = 128 / std::mem::size_of::<NodeId>();
        Inner {
            arena: Arena {
                slots: Vec::with_capacity(4),
                waits: Vec::new(),
                free: Vec::with_capacity(IDS),
            },
            index,
            flock: Vec::with_capacity(IDS),
            posix: if index == LockIndex::List {
                Vec::with_capacity(IDS)
            } else {
                Vec::new()
            },
            ..Inner::default()
        }
    }

    pub fn node(&self, id: NodeId) -> &Node {
        self.arena.node(id)
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.arena.node_mut(id)
    }

    pub fn blocker(&self, id: NodeId) -> Option<NodeId> {
        self.arena.blocker(id)
    }

    pub fn children(&self, id: NodeId) -> &[NodeId] {
        self.arena.children(id)
    }

    pub fn waiter(&self, id: NodeId) -> Option<&crate::sync::Arc<Waiter>> {
        self.arena.waiter(id)
    }

    fn wait_mut(&mut self, id: NodeId) -> &mut WaitLinks {
        self.arena.wait_mut(id)
    }

    fn alloc(&mut self, fl: FileLock) -> NodeId {
        self.arena.alloc(fl)
    }

    fn release(&mut self, id: NodeId) {
        debug_assert!(
            self.children(id).is_empty() && self.blocker(id).is_none() && !self.node(id).ix.indexed
        );
        self.chain.on_release(id);
        self.arena.release(id);
    }

    /// The counters, with the index's work folded in.
    pub fn stats(&self) -> ContextStats {
        ContextStats {
            lock_checks: self.work.checks,
            index_nodes: self.work.nodes,
            ..self.stats
        }
    }

    /// Whether any POSIX or OFD lock is held.
    pub fn posix_is_empty(&self) -> bool {
        match self.index {
            LockIndex::List => self.posix.is_empty(),
            LockIndex::Tree => self.tree.len() == 0,
        }
    }

    /// The granted POSIX and OFD locks in Linux's list order.
    pub fn posix_in_list_order(&self) -> Vec<NodeId> {
        match self.index {
            LockIndex::List => self.posix.clone(),
            LockIndex::Tree => self.tree.list_order(&self.arena),
        }
    }

    /// See [`ContextMemory`].
    fn memory(&self) -> ContextMemory {
        use std::mem::size_of;
        let mut m = ContextMemory {
            posix_locks: if self.index == LockIndex::List {
                self.posix.len()
            } else {
                self.tree.len()
            },
            flock_locks: self.flock.len(),
            ..ContextMemory::default()
        };
        // The context in its Arc (two reference counts before it, padded to its
        // alignment).
        let in_arc = std::alloc::Layout::new::<[usize; 2]>()
            .extend(std::alloc::Layout::new::<FileLockContext>())
            .map_or(size_of::<FileLockContext>(), |(l, _)| l.pad_to_align().size());
        let mut bytes = in_arc;
        bytes += self.arena.slots.capacity() * size_of::<Option<Node>>();
        bytes += self.arena.waits.capacity() * size_of::<Option<Box<WaitLinks>>>();
        bytes += self.tree.memory();
        bytes += (self.arena.free.capacity() + self.posix.capacity() + self.flock.capacity())
            * size_of::<NodeId>();
        for w in self.arena.waits.iter().flatten() {
            bytes += size_of::<WaitLinks>() + w.children.capacity() * size_of::<NodeId>();
            if w.waiter.is_some() {
                m.requests += 1;
                bytes += size_of::<Waiter>() + 2 * size_of::<usize>();
            }
        }
        m.bytes = bytes;
        m
    }

    /// The link the detector sees for a request whose blocker is `b`.
    fn link_to(&self, b: NodeId) -> Link {
        match self.waiter(b) {
            Some(w) => Link::Waiter(w.clone()),
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
            // unlocks in a herd wake nobody (0.0003 wake-ups per acquisition).
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

    /// When the turn of `owner` ends, if it has the current turn: a waiter it wakes by
    /// unlocking (it is about to lock again, in a herd) waits for the turn to end before
    /// it tries again, when the lock is handed to the oldest waiter, rather than
    /// catching the lock between the owner's unlock and its next lock and cutting its
    /// turn to one acquisition. Real time only: the model checkers do not model time.
    fn turn_end_for(&self, owner: OwnerKey) -> Option<std::time::Instant> {
        let end = match self.turn {
            Turn::Starting(o) if o == owner => a_quantum_after(self.clock.now()),
            Turn::Until(t, o) if o == owner && self.clock.now() < t => t,
            _ => return None,
        };
        crate::fair::real_time(end)
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
    fn wake_detached(&mut self, id: NodeId, wl: &mut WakeList) {
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
    /// waiter, is not (seed 003's herd would otherwise wake every waiter in turn).
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
        // against the new records above `wid`. The walk allocates nothing: in seed
        // 003's herd the subtree is a chain of every waiter, checked on each re-queue.
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
    fn posix_run_would_sleep(&mut self, n: NodeId, bg: &mut BlockedGuard<'_>) -> bool {
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
        let (stats, work) = (self.stats, self.work);
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
        (self.stats, self.work) = (stats, work);
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
    fn grant_record(&mut self, fl: FileLock, slot: &mut Slot, bg: &mut BlockedGuard<'_>) -> NodeId {
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
        let w = n.waiter.get_or_insert_with(|| Waiter::new(fl.owner, now)).clone();
        w.rearm();
        id
    }

    /// `locks_delete_lock_ctx` for a flock lock: removes `flock[idx]`, waking its waiters.
    fn flock_delete_lock(&mut self, idx: usize, wl: &mut WakeList, bg: &mut BlockedGuard<'_>) {
        let id = self.flock.remove(idx);
        self.wake_up_blocks(id, wl, bg);
        self.release(id);
    }

    /// `locks_delete_lock_ctx` for a POSIX or OFD lock with [`LockIndex::List`]: removes
    /// `posix[idx]`, waking its waiters.
    fn list_delete_lock(&mut self, idx: usize, wl: &mut WakeList, bg: &mut BlockedGuard<'_>) {
        let id = self.posix.remove(idx);
        self.wake_up_blocks(id, wl, bg);
        self.release(id);
    }

    /// `locks_delete_lock_ctx` for a POSIX or OFD lock with [`LockIndex::Tree`].
    fn tree_delete_lock(&mut self, id: NodeId, wl: &mut WakeList, bg: &mut BlockedGuard<'_>) {
        self.tree.remove(&mut self.arena, id, &mut self.work);
        self.wake_up_blocks(id, wl, bg);
        self.release(id);
    }

    /// Whether `id` is a request that was woken and has not tried again: a live record
    /// with a wait cell and no blocker. (Outside a critical section no request is
    /// detached without having been woken.)
    fn is_ready(&self, id: NodeId) -> bool {
        self.arena
            .slots
            .get(id as usize)
            .and_then(|n| n.as_ref())
            .is_some_and(|_| self.waiter(id).is_some() && self.blocker(id).is_none())
    }

    /// Drops stale and repeated entries from `ready`.
    fn prune_ready(&mut self) {
        let mut ready = std::mem::take(&mut self.ready);
        ready.sort_unstable();
        ready.dedup();
        ready.retain(|&id| self.is_ready(id));
        self.ready_prune_at = (2 * ready.len()).max(64);
        self.ready = ready;
    }

    /// Whether request `req` would be granted if it tried now (it conflicts with no
    /// granted lock), so that trying it cannot put it back to sleep.
    fn grantable_now(&mut self, req: &FileLock) -> bool {
        if req.kind == LockKind::Flock {
            !self
                .flock
                .iter()
                .any(|&id| family_conflict(req, &self.arena.node(id).fl))
        } else {
            self.posix_first_conflict(req).is_none()
        }
    }

    /// The fair hand-off, run last in every critical section that changed a lock.
    ///
    /// Barging keeps the lock busy: a woken request must run and retry, and the owner
    /// that just unlocked usually takes the lock again first (Linux lets it, and so does
    /// this library: it is where the throughput comes from). So that no waiter loses
    /// for ever, the inode works in turns of a [`QUANTUM`](crate::fair):
    ///
    /// * at most once per turn, at the first change after it ends, it hands the lock to
    ///   the request that has waited longest among those woken and not yet retried, if
    ///   it has waited a quantum, its owner waits in [`PendingLock::wait`] (a future or
    ///   a polled request is never finished behind its owner's back) and it can be
    ///   granted now: it is tried here, on its owner's behalf, exactly as its own retry
    ///   would be (one of the schedules Linux allows: the woken task runs first), and
    ///   its owner finds the result when it wakes;
    /// * that owner's turn starts at the next change (its first unlock, once it runs),
    ///   and a waiter its unlocks wake waits for the turn's end before it retries (see
    ///   `turn_end_for`), so the turn is not cut to one acquisition by the next waiter
    ///   catching the lock between its unlock and its next lock;
    /// * owners that barge in queue behind in the wait tree, which hands the lock on in
    ///   order: every waiter gets a turn within (waiters × quantum).
    ///
    /// The wait tree's rule stands: only requests that were woken (a set that can be
    /// granted together) are candidates, and only one is chosen. Replays drive their
    /// requests with `poll_complete`, so they never see a hand-off or a turn: their
    /// results do not depend on timing. `flc_lock` held.
    ///
    /// [`PendingLock::wait`]: crate::PendingLock::wait
    pub(crate) fn run_handoff(&mut self, mgr: &LockManager, wl: &mut WakeList, bg: &mut BlockedGuard<'_>) {
        if !std::mem::take(&mut self.freed) {
            return;
        }
        if let Turn::Starting(o) = self.turn {
            self.turn = Turn::Until(a_quantum_after(self.clock.now()), o);
            return;
        }
        if self.ready.is_empty() {
            return;
        }
        let now = self.clock.now();
        if matches!(self.turn, Turn::Until(t, _) if now < t) {
            return;
        }
        self.prune_ready();
        let mut oldest: Option<(Stamp, NodeId)> = None;
        for &id in &self.ready {
            let w = self.waiter(id).expect("a ready request");
            if waited_a_quantum(now, w.since) && oldest.is_none_or(|(t, _)| w.since < t) && w.blocking() {
                oldest = Some((w.since, id));
            }
        }
        let Some((_, id)) = oldest else { return };
        let req = self.node(id).fl;
        if !self.grantable_now(&req) {
            return;
        }
        let w = self.waiter(id).expect("a ready request").clone();
        let mut slot = Some(id);
        // Without sleeping: it cannot conflict, so this grants it.
        let a = if req.kind == LockKind::Flock {
            self.flock_lock_inode(mgr, req, &mut slot, false, wl, bg)
        } else {
            self.posix_lock_inode(mgr, req, &mut slot, false, wl, bg, None)
        };
        debug_assert_eq!(a, Attempt::Done(Ok(())), "a grantable request is granted");
        if a == Attempt::Done(Ok(())) {
            // A flock request whose open file already held that lock is done without
            // becoming a record: its record goes.
            if let Some(id) = slot.take() {
                self.delete_block(id, wl, bg);
            }
            w.finish(Ok(()));
            wl.push(w);
            self.stats.handoffs += 1;
            self.turn = Turn::Starting(req.owner);
            // What the grant itself changed (merging, say) is part of this section.
            self.freed = false;
        }
    }

    /// `posix_test_lock`: the first lock in list order that `req` conflicts with
    /// (`posix_test_locks_conflict`: for an `F_UNLCK` probe, the owner's own).
    pub fn posix_test_lock(&mut self, req: &FileLock) -> Option<Reported> {
        let found = match self.index {
            LockIndex::List => {
                let mut found = None;
                for &id in &self.posix {
                    self.work.checks += 1;
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
                let w = &mut self.work;
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
                let found = self.tree.first_conflict(&self.arena, req, &mut self.work);
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
                let w = &mut self.work;
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
    fn posix_first_conflict(&mut self, req: &FileLock) -> Option<NodeId> {
        match self.index {
            LockIndex::List => {
                for &id in &self.posix {
                    self.work.checks += 1;
                    if posix_locks_conflict(req, &self.arena.node(id).fl) {
                        return Some(id);
                    }
                }
                None
            }
            LockIndex::Tree => self
                .tree
                .first_conflict(&self.arena, req, &mut self.work)
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

    /// The second half of `posix_lock_inode` over Linux's list ([`LockIndex::List`]):
    /// walks the owner's locks, merging, splitting and trimming. `None` when the request
    /// was an unlock that changed nothing.
    fn posix_update_list(
        &mut self,
        mut req: FileLock,
        slot: &mut Slot,
        wl: &mut WakeList,
        bg: &mut BlockedGuard<'_>,
    ) -> Option<()> {
        // The owner's locks are adjacent: find the first.
        let mut i = 0;
        while i < self.posix.len() {
            self.work.checks += 1;
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
            self.work.checks += 1;
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

    /// The second half of `posix_lock_inode` with [`LockIndex::Tree`]: the same walk
    /// and the same changes in the same order as [`Inner::posix_update_list`], over the
    /// owner's run in the index. It starts at the first of the owner's locks the list
    /// walk would not skip (the walk skips every lock ending before `start - 1`), and a
    /// record whose range changes leaves the index before the change and comes back
    /// after it, with its run's list-order key.
    fn posix_update_tree(
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
            let (t, ar, w) = (&self.tree, &self.arena, &mut self.work);
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
            self.work.checks += 1;
            debug_assert!(posix_same_owner(&req, &fl));
            // The owner's next lock, looked up only when the walk goes on and before
            // `id` can leave the index.
            let next = |me: &mut Self| me.tree.owner_next(&me.arena, id, &mut me.work);
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
                    self.tree.remove(&mut self.arena, id, &mut self.work);
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
            self.tree.insert(&mut self.arena, new, k, &mut self.work);
        } else if let Some(b) = became {
            if self.node(b).ix.indexed {
                self.tree.remove(&mut self.arena, b, &mut self.work);
            }
            let n = self.node_mut(b);
            n.fl.start = req.start;
            n.fl.end = req.end;
            let k = run_key(&mut self.tree, &mut self.arena);
            self.tree.insert(&mut self.arena, b, k, &mut self.work);
        }
        if let Some(r) = right {
            let k = run_key(&mut self.tree, &mut self.arena);
            self.tree.remove(&mut self.arena, r, &mut self.work);
            if left == Some(r) {
                // The request splits one lock in two: the left part is a new record.
                let mut copy = self.node(r).fl;
                copy.end = req.start - 1;
                let l = self.alloc(copy);
                self.tree.insert(&mut self.arena, l, k, &mut self.work);
                left = None;
            }
            self.node_mut(r).fl.start = req.end + 1;
            self.tree.insert(&mut self.arena, r, k, &mut self.work);
            self.wake_up_blocks(r, wl, bg);
        }
        if let Some(l) = left {
            let k = run_key(&mut self.tree, &mut self.arena);
            self.tree.remove(&mut self.arena, l, &mut self.work);
            self.node_mut(l).fl.end = req.start - 1;
            self.tree.insert(&mut self.arena, l, k, &mut self.work);
            self.wake_up_blocks(l, wl, bg);
        }
        Some(())
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
            inner: Mutex::new(Inner::with_line_sized_buffers(mgr.settings().index)),
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
        self.inner.lock().stats()
    }

    /// What this inode's locks occupy in memory (see [`ContextMemory`]). Walks every
    /// record, under the inode's lock.
    ///
    /// ```
    /// use vfscale_locks::*;
    /// let mgr = LockManager::new();
    /// let inode = FileLockContext::new(&mgr, InodeKey::default());
    /// for i in 0..1000 {
    ///     let f = OpenFile::new(i, AccessMode::ReadWrite);
    ///     let mut fl = Flock::new(LockType::Write, 2 * i as i64, 1);
    ///     inode.fcntl(Process::new(1), f, FcntlCmd::OfdSetLk, &mut fl).unwrap();
    /// }
    /// let m = inode.memory();
    /// assert_eq!(m.posix_locks, 1000);
    /// assert!(m.bytes_per_lock() <= 128.0, "{m:?}");
    /// ```
    pub fn memory(&self) -> ContextMemory {
        self.inner.lock().memory()
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
            inner.clock.tick();
            let mut bg = BlockedGuard::new(&self.mgr);
            let r = f(&mut inner, &self.mgr, &mut wl, &mut bg);
            inner.run_handoff(&self.mgr, &mut wl, &mut bg);
            let holds_locks = !inner.posix_is_empty() || !inner.flock.is_empty();
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
