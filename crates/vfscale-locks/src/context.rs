//! `struct file_lock_context`: one inode's locks and wait trees, under that inode's lock.
//!
//! This file holds the context, its counters and what its lock protects ([`Inner`]);
//! the submodules hold what is done under that lock, one concept each: the record
//! store (`records.rs`), the wait trees (`wait_tree.rs`), fairness (`fairness.rs`),
//! POSIX/OFD requests (`posix.rs`, with the list and index updates in `posix_list.rs`
//! and `posix_tree.rs`) and flock requests (`flock.rs`).

use std::sync::{Arc, Weak};

use crate::chain::Chain;
use crate::index::{PosixTree, SearchCost};
use crate::lock::FileLock;
use crate::manager::{BlockedGuard, LockIndex, LockManager};
use crate::sync::{Mutex, MutexGuard};
use crate::wait_cell::{WaitCell, WakeList};
use crate::{Errno, InodeKey};

pub(crate) mod fairness;
mod flock;
mod posix;
mod posix_list;
mod posix_tree;
mod records;
mod wait_tree;

use fairness::{Clock, Turn};
pub(crate) use posix::posix_unlock_all;
pub(crate) use records::{Arena, Node, NodeId, WaitLinks, NIL};

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
    cost: SearchCost,
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
    /// Time for the hand-off (see `fairness.rs`).
    clock: Clock,
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

    pub fn waiter(&self, id: NodeId) -> Option<&crate::sync::Arc<WaitCell>> {
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
            lock_checks: self.cost.checks,
            index_nodes: self.cost.nodes,
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
                bytes += size_of::<WaitCell>() + 2 * size_of::<usize>();
            }
        }
        m.bytes = bytes;
        m
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
/// | a request's wake state and hand-off result | its wait cell's `wait` (leaf) |
/// | a request's detector link | its wait cell's `link` (leaf), written under `inner` |
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
