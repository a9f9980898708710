//! What must be global: the blocked hash for deadlock detection, the listing shards, the
//! experiment settings, and the counters the lab reads.

// foldhash (hashbrown's default): SipHash on these integer keys showed up in a herd's
// profile (the blocked hash's lookups on every block and wake).
use hashbrown::HashMap;
use std::sync::{Arc, Weak};
use std::time::Instant;

use crate::context::FileLockContext;
use crate::lock::OwnerKey;
use crate::sync::{Arc as SyncArc, AtomicU64, Mutex, MutexGuard, Ordering};
use crate::wait_cell::{Link, WaitCell};
use crate::OwnerId;

/// A process-owned POSIX request that waits, and the owner it waits for: an edge of
/// the wait-for graph the deadlock detector walks (see
/// [`LockManager::posix_wait_edges`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PosixWaitEdge {
    /// The owner of the blocked request.
    pub waiter: OwnerId,
    /// The owner of the granted lock at the root of the request's wait tree.
    pub blocker: OwnerId,
    /// When the request first went to sleep.
    pub blocked_at: Instant,
    /// Which wait this is (the same as its [`PendingLock::wait_id`]): an owner with
    /// several threads can wait several times, and a detector that finds a cycle ends
    /// only the wait that closed it, as Linux refuses only the request that would.
    ///
    /// [`PendingLock::wait_id`]: crate::PendingLock::wait_id
    pub wait: PosixWaitId,
}

/// Names one waiting request: the address of its wait cell (which its
/// [`PendingLock`](crate::PendingLock) keeps alive while it waits) and when it first
/// went to sleep, so that a later wait whose cell took the same address is another id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PosixWaitId(usize, Instant);

impl PosixWaitId {
    pub(crate) fn of(cell: &WaitCell) -> PosixWaitId {
        PosixWaitId(cell as *const WaitCell as usize, cell.blocked_at)
    }
}

/// `MAX_DEADLK_ITERATIONS`: how far the deadlock detector follows a chain of owners.
///
/// As in Linux, the check is `if (i++ > MAX_DEADLK_ITERATIONS) return false;` before each
/// comparison, so a cycle is found when it closes within 11 hops (12 owners); a longer
/// cycle is not reported and the request waits.
pub const MAX_DEADLK_ITERATIONS: usize = 10;

/// How an unlock wakes the requests blocked on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WakeMode {
    /// The wait tree of fs/locks.c (NeilBrown's 2018 "locks: avoid thundering-herd
    /// wake-ups"): blocked requests form a tree in which siblings never conflict; an
    /// unlock wakes only the direct waiters of what changed.
    #[default]
    Tree,
    /// Before the wait tree: every request waits directly on the lock that blocks it and an
    /// unlock wakes them all (the thundering herd). For the lab's "base" runs.
    All,
}

/// Which lock protects an inode's lock lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ContextLock {
    /// The per-inode lock of Jeff Layton's 2013 "locks: scalability improvements for file locking":
    /// each inode's lists are protected by that inode's own lock.
    #[default]
    PerInode,
    /// Before the per-inode lock: one global lock (`file_lock_lock`) serializes every lock
    /// operation on every inode. For the lab's "base" runs.
    Global,
}

/// How an inode finds its POSIX and OFD locks. Results are the same either way (the
/// conformance tests replay every scenario with both); only the cost differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LockIndex {
    /// An index over each inode's locks (two balanced trees, one by owner and start,
    /// one an interval tree by start): set, unlock, conflict search and `F_GETLK` cost
    /// O(log n + k) in the n locks held, k being the locks the request overlaps.
    #[default]
    Tree,
    /// Linux's one list per inode: every call walks all of the inode's locks, O(n).
    /// For the lab's comparisons.
    List,
}

/// Experiment settings. Each switches only the mechanism one kernel change brought, so
/// the lab
/// can run "base" against "patched" in one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Settings {
    /// The wait tree or not (NeilBrown, 2018).
    pub wake: WakeMode,
    /// The per-inode lock or the global one (Jeff Layton, 2013).
    pub context_lock: ContextLock,
    /// This library's own setting: how each inode finds its POSIX and OFD locks.
    pub index: LockIndex,
}

/// Counters a run can read. None of them is written on a path that does not already
/// take the lock it counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ManagerStats {
    /// Acquisitions of the blocked-hash lock (only when a POSIX request blocks, leaves
    /// the hash, or a chain is checked for deadlock).
    pub blocked_lock_acquisitions: u64,
    /// Acquisitions of the one global lock of [`ContextLock::Global`].
    pub global_lock_acquisitions: u64,
    /// `EDEADLK` results.
    pub deadlocks: u64,
}

/// The blocked hash (`blocked_hash`): blocked requests whose blocker is a
/// process-owned POSIX lock, keyed by the request's owner, newest last.
#[derive(Debug, Default)]
pub(crate) struct BlockedHash {
    map: HashMap<OwnerKey, Vec<SyncArc<WaitCell>>>,
}

impl BlockedHash {
    pub fn insert(&mut self, w: &SyncArc<WaitCell>) {
        self.map.entry(w.owner).or_default().push(w.clone());
    }

    pub fn remove(&mut self, w: &SyncArc<WaitCell>) {
        if let Some(v) = self.map.get_mut(&w.owner) {
            v.retain(|x| !SyncArc::ptr_eq(x, w));
            if v.is_empty() {
                self.map.remove(&w.owner);
            }
        }
    }

    /// `what_owner_is_waiting_for`: the owner of the root of the newest blocked request
    /// of `owner` (the root is a granted lock, or a request just woken).
    fn what_owner_is_waiting_for(&self, owner: OwnerKey) -> Option<OwnerKey> {
        let mut cur = self.map.get(&owner)?.last()?.clone();
        loop {
            let link = cur.link.lock().clone();
            match link {
                Link::Detached => return Some(cur.owner),
                Link::Granted(o) => return Some(o),
                Link::Request(p) => cur = p,
            }
        }
    }

    /// `posix_locks_deadlock`: would `caller` waiting on a lock of `block_owner` close a
    /// cycle? Only process-owned requests are checked (callers ensure it).
    pub fn posix_locks_deadlock(&self, caller: OwnerKey, block_owner: OwnerKey) -> bool {
        let mut blocker = block_owner;
        let mut i = 0;
        while let Some(next) = self.what_owner_is_waiting_for(blocker) {
            if i > MAX_DEADLK_ITERATIONS {
                return false;
            }
            i += 1;
            if next == caller {
                return true;
            }
            blocker = next;
        }
        false
    }

    /// Whether [`BlockedHash::posix_locks_deadlock`]`(caller, block_owner)` is true for
    /// some `caller` with `is_caller(caller)`, in one walk: the owners the detector
    /// follows from `block_owner` do not depend on the caller (it only stops early on
    /// reaching it), so the callers it reports are exactly the owners on that walk.
    /// Returns the owners visited beside the answer (at most 11).
    pub fn posix_locks_deadlock_any(
        &self,
        block_owner: OwnerKey,
        is_caller: impl Fn(OwnerKey) -> bool,
    ) -> (bool, u64) {
        let mut blocker = block_owner;
        let mut i = 0;
        while let Some(next) = self.what_owner_is_waiting_for(blocker) {
            if i > MAX_DEADLK_ITERATIONS {
                return (false, i as u64);
            }
            i += 1;
            if is_caller(next) {
                return (true, i as u64);
            }
            blocker = next;
        }
        (false, i as u64)
    }

    /// Every blocked request's edge (see [`LockManager::posix_wait_edges`]).
    fn wait_edges(&self) -> Vec<PosixWaitEdge> {
        let mut out = Vec::new();
        for (owner, cells) in &self.map {
            let OwnerKey::Process(waiter) = *owner else {
                continue;
            };
            for cell in cells {
                // What `what_owner_is_waiting_for` follows, from this request rather
                // than from the owner's newest one.
                let mut cur = cell.clone();
                let root = loop {
                    let link = cur.link.lock().clone();
                    match link {
                        Link::Detached => break cur.owner,
                        Link::Granted(o) => break o,
                        Link::Request(p) => cur = p,
                    }
                };
                if let OwnerKey::Process(blocker) = root {
                    if blocker != waiter {
                        out.push(PosixWaitEdge {
                            waiter,
                            blocker,
                            blocked_at: cell.blocked_at,
                            wait: PosixWaitId::of(cell),
                        });
                    }
                }
            }
        }
        out
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.values().map(Vec::len).sum()
    }
}

/// The global side of the lock system: one per "kernel".
///
/// Lock order (outermost first): the global lock of [`ContextLock::Global`] → an inode's
/// `flc_lock` → `blocked_lock` → a listing shard → a wait cell's leaf locks.
#[derive(Debug)]
pub struct LockManager {
    settings: Settings,
    /// Protects nothing but serializes every operation under [`ContextLock::Global`].
    big_lock: Mutex<()>,
    /// `blocked_lock_lock`: protects the blocked hash.
    pub(crate) blocked: Mutex<BlockedHash>,
    /// The listing (`file_lock_list`), per CPU: each shard protects its list of contexts
    /// that have held a lock since the last listing pruned them.
    shards: Box<[Mutex<Vec<Weak<FileLockContext>>>]>,
    blocked_acq: AtomicU64,
    big_acq: AtomicU64,
    deadlocks: AtomicU64,
}

impl LockManager {
    /// A manager with the per-inode lock, the wait tree and the index
    /// ([`Settings::default`]).
    pub fn new() -> Arc<LockManager> {
        Self::with_settings(Settings::default())
    }

    /// A manager with the given experiment settings.
    pub fn with_settings(settings: Settings) -> Arc<LockManager> {
        let n = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .next_power_of_two();
        Arc::new(LockManager {
            settings,
            big_lock: Mutex::new(()),
            blocked: Mutex::new(BlockedHash::default()),
            shards: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
            blocked_acq: AtomicU64::new(0),
            big_acq: AtomicU64::new(0),
            deadlocks: AtomicU64::new(0),
        })
    }

    /// The settings this manager runs with.
    pub fn settings(&self) -> Settings {
        self.settings
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> ManagerStats {
        ManagerStats {
            blocked_lock_acquisitions: self.blocked_acq.load(Ordering::Relaxed),
            global_lock_acquisitions: self.big_acq.load(Ordering::Relaxed),
            deadlocks: self.deadlocks.load(Ordering::Relaxed),
        }
    }

    /// The wait-for graph the deadlock detector walks, as edges: for each blocked
    /// process-owned POSIX request, its owner and the owner of the granted lock its wait
    /// tree hangs under (`what_owner_is_waiting_for`, from that request), with when it
    /// first slept. A request just woken (out of its tree) has no edge. Takes
    /// `blocked_lock`, no inode lock: a caller that detects deadlocks across several
    /// managers (a cluster of servers) publishes these.
    ///
    /// ```
    /// use vfscale_locks::*;
    /// let mgr = LockManager::new();
    /// let inode = FileLockContext::new(&mgr, InodeKey::default());
    /// let f = OpenFile::new(1, AccessMode::ReadWrite);
    /// inode.fcntl(Process::new(1), f, FcntlCmd::SetLk, &mut Flock::new(LockType::Write, 0, 1)).unwrap();
    /// let p = inode.fcntl_lock(Process::new(2), f, FcntlCmd::SetLkW, &mut Flock::new(LockType::Write, 0, 1)).unwrap();
    /// let edges = mgr.posix_wait_edges();
    /// assert_eq!(edges.len(), 1);
    /// assert_eq!((edges[0].waiter, edges[0].blocker), (OwnerId(2), OwnerId(1)));
    /// drop(p); // gives up: the edge goes
    /// assert!(mgr.posix_wait_edges().is_empty());
    /// ```
    pub fn posix_wait_edges(&self) -> Vec<PosixWaitEdge> {
        self.lock_blocked().wait_edges()
    }

    /// Takes the global lock when the settings ask for it (`None` otherwise). Released
    /// when the returned guard drops, after the inode lock it encloses.
    pub(crate) fn big_lock(&self) -> Option<MutexGuard<'_, ()>> {
        if self.settings.context_lock == ContextLock::Global {
            self.big_acq.fetch_add(1, Ordering::Relaxed);
            Some(self.big_lock.lock())
        } else {
            None
        }
    }

    /// Takes `blocked_lock`. Callers hold an inode's `flc_lock` (lock order).
    pub(crate) fn lock_blocked(&self) -> MutexGuard<'_, BlockedHash> {
        self.blocked_acq.fetch_add(1, Ordering::Relaxed);
        self.blocked.lock()
    }

    pub(crate) fn count_deadlock(&self) {
        self.deadlocks.fetch_add(1, Ordering::Relaxed);
    }

    /// Puts a context on this CPU's listing shard. Called once per context, the first
    /// time it holds a lock, with its `flc_lock` held.
    pub(crate) fn listing_register(&self, ctx: Weak<FileLockContext>) {
        let shard = crate::sync::current_cpu() & (self.shards.len() - 1);
        self.shards[shard].lock().push(ctx);
    }

    /// Forgets the contexts dropped since they were listed: the listing keeps a weak
    /// reference to each context that ever held a lock, and with it the context's
    /// allocation, until a listing walks past it. A caller that drops contexts over
    /// time and never lists calls this now and then; returns how many it forgot.
    ///
    /// ```
    /// use vfscale_locks::*;
    /// let mgr = LockManager::new();
    /// let inode = FileLockContext::new(&mgr, InodeKey::default());
    /// let f = OpenFile::new(1, AccessMode::ReadWrite);
    /// inode.fcntl(Process::new(1), f, FcntlCmd::SetLk, &mut Flock::new(LockType::Write, 0, 1)).unwrap();
    /// assert_eq!(mgr.forget_dropped_contexts(), 0);
    /// drop(inode);
    /// assert_eq!(mgr.forget_dropped_contexts(), 1);
    /// ```
    pub fn forget_dropped_contexts(&self) -> usize {
        let mut n = 0;
        for shard in self.shards.iter() {
            let mut s = shard.lock();
            let before = s.len();
            s.retain(|w| w.strong_count() > 0);
            n += before - s.len();
        }
        n
    }

    /// Every live context that has held a lock, shard by shard; drops contexts that
    /// are gone. Touches each shard's lock once.
    pub(crate) fn listing_contexts(&self) -> Vec<Arc<FileLockContext>> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let mut s = shard.lock();
            s.retain(|w| match w.upgrade() {
                Some(c) => {
                    out.push(c);
                    true
                }
                None => false,
            });
        }
        out
    }
}

/// The blocked-hash lock, taken at most once per operation and only when needed.
pub(crate) struct BlockedGuard<'a> {
    mgr: &'a LockManager,
    guard: Option<MutexGuard<'a, BlockedHash>>,
}

impl<'a> BlockedGuard<'a> {
    pub fn new(mgr: &'a LockManager) -> Self {
        BlockedGuard { mgr, guard: None }
    }

    /// The hash, taking `blocked_lock` on first use.
    pub fn get(&mut self) -> &mut BlockedHash {
        let mgr = self.mgr;
        self.guard.get_or_insert_with(|| mgr.lock_blocked())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FileId, OwnerId};

    fn p(n: u64) -> OwnerKey {
        OwnerKey::Process(OwnerId(n))
    }

    fn waiting(h: &mut BlockedHash, who: u64, on: u64) {
        let w = WaitCell::new(p(who), crate::context::fairness::stamp_for_tests());
        w.set_link(Link::Granted(p(on)));
        h.insert(&w);
    }

    #[test]
    fn two_and_three_owner_cycles_are_found() {
        let mut h = BlockedHash::default();
        waiting(&mut h, 2, 1);
        // 1 asks for a lock held by 2, which waits for 1.
        assert!(h.posix_locks_deadlock(p(1), p(2)));
        waiting(&mut h, 3, 2);
        assert!(h.posix_locks_deadlock(p(1), p(3)));
        assert!(!h.posix_locks_deadlock(p(4), p(3)));
    }

    #[test]
    fn chain_longer_than_the_cap_is_not_reported() {
        // Owner k waits for owner k-1, for k in 2..=n; owner 1 then asks for n's lock.
        for (n, found) in [(12u64, true), (13, false)] {
            let mut h = BlockedHash::default();
            for k in 2..=n {
                waiting(&mut h, k, k - 1);
            }
            assert_eq!(h.posix_locks_deadlock(p(1), p(n)), found, "chain of {n} owners");
        }
    }

    #[test]
    fn wait_edges_follow_each_request_to_its_root_and_skip_file_owners() {
        let mut h = BlockedHash::default();
        // 2 waits on 1's lock; 3 waits under 2's request (so for 1 as well).
        let w2 = WaitCell::new(p(2), crate::context::fairness::stamp_for_tests());
        w2.set_link(Link::Granted(p(1)));
        h.insert(&w2);
        let w3 = WaitCell::new(p(3), crate::context::fairness::stamp_for_tests());
        w3.set_link(Link::Request(w2.clone()));
        h.insert(&w3);
        // A file-owned waiter and a just-woken request give no edge.
        let wf = WaitCell::new(
            OwnerKey::File(FileId(5)),
            crate::context::fairness::stamp_for_tests(),
        );
        wf.set_link(Link::Granted(p(1)));
        h.insert(&wf);
        let w4 = WaitCell::new(p(4), crate::context::fairness::stamp_for_tests());
        h.insert(&w4);
        let mut edges: Vec<(u64, u64)> = h.wait_edges().iter().map(|e| (e.waiter.0, e.blocker.0)).collect();
        edges.sort();
        assert_eq!(edges, vec![(2, 1), (3, 1)]);
    }

    #[test]
    fn file_owners_never_match_process_owners() {
        let mut h = BlockedHash::default();
        let w = WaitCell::new(
            OwnerKey::File(FileId(1)),
            crate::context::fairness::stamp_for_tests(),
        );
        w.set_link(Link::Granted(p(1)));
        h.insert(&w);
        assert!(!h.posix_locks_deadlock(p(1), OwnerKey::Process(OwnerId(7))));
        assert!(h.posix_locks_deadlock(p(1), OwnerKey::File(FileId(1))));
        h.remove(&w);
        assert_eq!(h.len(), 0);
    }
}
