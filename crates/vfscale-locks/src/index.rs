//! The index over an inode's POSIX and OFD locks ([`LockIndex::Tree`]): a table of
//! owners and a tree by start, so that set, unlock, conflict search and `F_GETLK` cost
//! O(log n + k) in the n locks held instead of Linux's O(n) list walk, with every result
//! unchanged.
//!
//! * **By owner**: a hash table (`hashbrown::HashTable` of record ids) from each owner
//!   holding a lock here to the root of that owner's own AVL tree by (`start`, id),
//!   threaded through the records of the inode's arena. An owner's locks are exactly
//!   the part of Linux's list that `posix_lock_inode` walks to merge, split and trim,
//!   so a set or unlock costs O(log k) in the k locks of its own owner, whatever the
//!   other owners hold (one probe for an owner holding nothing). A table entry is a
//!   record id (4 bytes and a control byte per bucket): the owner is read from the
//!   record.
//! * **By start** (`start`, id): a B+ tree (15-entry leaves, 31-child branches) kept
//!   apart from the records (`start_tree.rs`), augmented per child with the largest `end`,
//!   over all locks and over write locks only: an interval tree that finds the locks
//!   overlapping a range without visiting those that end before it (and, for a read
//!   request, without visiting read locks). Over 10,000 locks a descent touches 3 nodes
//!   (height 2), not 14 records. A leaf keeps, beside each lock's start, its end, type, run
//!   key `seq` and the pid `F_GETLK` reports (`Tag`): a conflict search and `F_GETLK` read
//!   no record. Only a caller that needs the conflicting lock's record (a set that blocks,
//!   the wait trees) reads it, by the id the leaf also keeps.
//!
//! **Who is another owner**, without the records: two granted locks have the same owner
//! exactly when they have the same run key (below), so a lock conflicts only if its key
//! is not the requester's. The requester's key comes from the owner table (0 if it
//! holds nothing here: no run has key 0) — a probe the descent does not wait for — or,
//! for the same owner as the last search's, from a one-entry cache (`PosixTree::last`)
//! that follows the owner's run as it starts and ends and as keys are renumbered.
//!
//! **Why it is fast.** A node step counts instead of searching, so a random key costs no
//! mispredicted branch; a node whose keys are evenly spaced (fixed-size records, pages,
//! slots) is stepped by interpolation, checked by a predicted branch (`start_tree.rs`);
//! and the leaf answers a conflict test and `F_GETLK` itself, so a test misses on the
//! leaf, not on the leaf and then the record. docs/benchmarks.md has the measurements.
//!
//! **Linux's list order** is kept as a key. In Linux an owner's locks are adjacent and
//! sorted by start, and an owner with no lock on the inode starts its run at the end of
//! the list; the run keeps its place while the owner holds at least one lock (a lock
//! that replaces another takes its place). So the list is sorted by (`seq`, `start`),
//! where `seq` numbers the owner's run in the order runs were started; every record
//! and its leaf entry carry its run's `seq` (32 bits, from 1; renumbered 1, 2, … in order
//! when 2^32 runs have been started, records, leaves and the cache alike). `F_GETLK`
//! reports, and a blocked request waits on, the conflicting lock with the least (`seq`,
//! `start`) — the first one Linux's walk meets; no two granted locks share both (one
//! owner's locks do not overlap).
//!
//! Both trees hold exactly the granted POSIX and OFD locks. A record's `owner`, `start`,
//! `end`, type and pid never change while it is in the trees: a caller that changes a
//! range removes the record first and inserts it again (its leaf entry is a copy).
//!
//! [`LockIndex::Tree`]: crate::LockIndex::Tree

use std::cell::Cell;

use crate::context::{Arena, NodeId, NIL};
use hashbrown::HashTable;

use crate::lock::{FileLock, OwnerKey};
use crate::start_tree::{Found, StartTree, Tag};
use crate::{FileId, LockType, OwnerId};

/// A record's place in the by-owner tree. Meaningful only while the record is indexed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IndexLinks {
    /// The list-order key of the owner's run (32 bits, so that the links and the key
    /// take 16 bytes; [`PosixTree::new_seq`] renumbers the runs when they run out).
    pub seq: u32,
    /// Children in the by-owner tree: left, right.
    by_owner: [NodeId; 2],
    /// AVL height in the by-owner tree.
    h_owner: u8,
    /// In the index.
    pub indexed: bool,
}

impl Default for IndexLinks {
    fn default() -> Self {
        IndexLinks {
            by_owner: [NIL; 2],
            h_owner: 0,
            indexed: false,
            seq: 0,
        }
    }
}

/// What the searches of one inode cost, counted rather than timed (reported as
/// [`ContextStats::lock_checks`](crate::ContextStats::lock_checks) and `index_nodes`);
/// kept under the inode lock with the context's stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SearchCost {
    /// Tree nodes visited (descents, scans, rebalancing paths).
    pub nodes: u64,
    /// Lock records tested against a request (Linux's list walk tests every lock).
    pub checks: u64,
}

/// The two indexes of one inode.
#[derive(Debug, Default)]
pub(crate) struct PosixTree {
    /// Each owner holding a lock here: the root of its own AVL tree by (`start`, id).
    /// An entry is only a record id (4 bytes and a control byte per bucket); its owner
    /// is read from the record.
    owners: HashTable<NodeId>,
    by_start: StartTree,
    len: usize,
    next_seq: u32,
    /// The last owner a conflict search looked up ([`owner_bits`]) and its run key (0:
    /// it holds no lock here), kept exact as runs start and end: a process or open file
    /// that tests or sets again finds its key without probing the owner table (a frame
    /// the usual way does not need). At first process 0, which holds nothing.
    last: Cell<(u64, u64, u32)>,
}

/// The greatest run key handed out before the runs are renumbered (small in unit tests,
/// so that the proptests renumber often: with 40, their churn of ~10 live runs
/// renumbered once per ~1,000 calls; with 16, once per ~150).
const SEQ_LIMIT: u32 = if cfg!(test) { 16 } else { u32::MAX - 1 };

/// A lock owner as two words: its kind (0 a process, 1 an open file) and number.
fn owner_bits(owner: OwnerKey) -> (u64, u64) {
    match owner {
        OwnerKey::Process(OwnerId(v)) => (0, v),
        OwnerKey::File(FileId(v)) => (1, v),
    }
}

/// A lock owner's hash: a multiply folded onto the low bits (which pick the bucket);
/// the high bits (the table's tag) are the product's own.
fn owner_hash(owner: OwnerKey) -> u64 {
    let (kind, v) = owner_bits(owner);
    let x = (v ^ (kind << 63)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 32)
}
mod owner_tree;
#[cfg(test)]
mod tests;

use owner_tree::{owner_key, ByOwner};

impl PosixTree {
    /// Locks in the trees.
    pub fn len(&self) -> usize {
        self.len
    }

    /// A fresh list-order key, for an owner starting a run: above every run's. When
    /// the keys run out (after 2^32 runs started on this inode), the live runs are
    /// renumbered 1, 2, … in their order first (O(n) once per 2^32 runs).
    pub fn new_seq(&mut self, ar: &mut Arena) -> u32 {
        if self.next_seq >= SEQ_LIMIT {
            let mut runs: Vec<(u32, NodeId)> = self.owners.iter().map(|&r| (ar.node(r).ix.seq, r)).collect();
            runs.sort_unstable();
            let mut stack = Vec::new();
            for (i, &(_, root)) in runs.iter().enumerate() {
                stack.push(root);
                while let Some(t) = stack.pop() {
                    let ix = &mut ar.node_mut(t).ix;
                    ix.seq = i as u32 + 1;
                    stack.extend(ix.by_owner.into_iter().filter(|&k| k != NIL));
                }
            }
            // The by-start tree's copies of the keys: old key -> its place in `runs`.
            let old: Vec<u32> = runs.iter().map(|r| r.0).collect();
            let renew = |s: u32| old.binary_search(&s).map_or(s, |i| i as u32 + 1);
            self.by_start.renumber(renew);
            let (kind, v, s) = self.last.get();
            self.last.set((kind, v, renew(s)));
            self.next_seq = runs.len() as u32;
        }
        self.next_seq += 1;
        self.next_seq
    }

    /// The root of `owner`'s tree, if it holds a lock here.
    fn owner_root(&self, ar: &Arena, owner: OwnerKey, cost: &mut SearchCost) -> Option<NodeId> {
        cost.nodes += 1;
        self.owners
            .find(owner_hash(owner), |&r| ar.node(r).fl.owner == owner)
            .copied()
    }

    /// Adds granted lock `id` with list-order key `seq`.
    pub fn insert(&mut self, ar: &mut Arena, id: NodeId, seq: u32, cost: &mut SearchCost) {
        let ix = &mut ar.node_mut(id).ix;
        debug_assert!(!ix.indexed, "record {id} indexed twice");
        ix.indexed = true;
        ix.seq = seq;
        let owner = ar.node(id).fl.owner;
        let h = owner_hash(owner);
        cost.nodes += 1;
        match self.owners.find_mut(h, |&r| ar.node(r).fl.owner == owner) {
            Some(root) => {
                debug_assert_eq!(ar.node(*root).ix.seq, seq, "one run, one key");
                *root = owner_tree::insert::<ByOwner>(ar, *root, id, cost).0;
            }
            None => {
                let root = owner_tree::insert::<ByOwner>(ar, NIL, id, cost).0;
                self.owners
                    .insert_unique(h, root, |&r| owner_hash(ar.node(r).fl.owner));
                self.run_changed(owner, seq);
            }
        }
        let fl = &ar.node(id).fl;
        let tag = Tag {
            seq,
            pid: fl.reported_pid(),
        };
        self.by_start
            .insert(fl.start, fl.end, id, fl.ty == LockType::Write, tag, cost);
        self.len += 1;
    }

    /// Takes lock `id` out of the trees.
    pub fn remove(&mut self, ar: &mut Arena, id: NodeId, cost: &mut SearchCost) {
        debug_assert!(ar.node(id).ix.indexed, "record {id} is not indexed");
        let owner = ar.node(id).fl.owner;
        cost.nodes += 1;
        match self
            .owners
            .find_entry(owner_hash(owner), |&r| ar.node(r).fl.owner == owner)
        {
            Ok(mut e) => {
                let root = owner_tree::remove::<ByOwner>(ar, *e.get(), id, cost).0;
                if root == NIL {
                    e.remove();
                    self.run_changed(owner, 0);
                } else {
                    *e.get_mut() = root;
                }
            }
            Err(_) => panic!("record {id}'s owner has no tree"),
        }
        self.by_start.remove(ar.node(id).fl.start, id, cost);
        ar.node_mut(id).ix.indexed = false;
        self.len -= 1;
    }

    /// In one descent, the locks of `owner` on either side of `x`: the one with the
    /// greatest start ≤ `x`, and the one after it (the least start > `x`). Equal to
    /// the owner's floor of `x` and, for the second, to `owner_next` of the first or, without a
    /// first, to the owner's lock with the least start ≥ `x`.
    pub fn owner_around(
        &self,
        ar: &Arena,
        owner: OwnerKey,
        x: i64,
        cost: &mut SearchCost,
    ) -> (Option<NodeId>, Option<NodeId>) {
        let key = (x, NodeId::MAX);
        let mut t = self.owner_root(ar, owner, cost).unwrap_or(NIL);
        let (mut floor, mut after) = (None, None);
        while t != NIL {
            cost.nodes += 1;
            let n = ar.node(t);
            if owner_key(&n.fl, t) <= key {
                floor = Some(t);
                t = n.ix.by_owner[1];
            } else {
                after = Some(t);
                t = n.ix.by_owner[0];
            }
        }
        (floor, after)
    }

    /// The next lock of the same owner after `id`, in start order.
    pub fn owner_next(&self, ar: &Arena, id: NodeId, cost: &mut SearchCost) -> Option<NodeId> {
        let fl = &ar.node(id).fl;
        let key = owner_key(fl, id);
        // The least key above `id`'s: the leftmost of its right subtree, or else the
        // lowest ancestor it is left of (found descending from the root).
        let mut t = ar.node(id).ix.by_owner[1];
        if t != NIL {
            loop {
                cost.nodes += 1;
                let l = ar.node(t).ix.by_owner[0];
                if l == NIL {
                    return Some(t);
                }
                t = l;
            }
        }
        let (mut t, mut best) = (self.owner_root(ar, fl.owner, cost).unwrap_or(NIL), None);
        while t != NIL && t != id {
            cost.nodes += 1;
            if owner_key(&ar.node(t).fl, t) > key {
                best = Some(t);
                t = ar.node(t).ix.by_owner[0];
            } else {
                t = ar.node(t).ix.by_owner[1];
            }
        }
        best
    }

    /// The run key of `owner`'s locks here; 0 (no run's) if it holds none.
    #[inline(always)]
    fn run_of(&self, ar: &Arena, owner: OwnerKey, cost: &mut SearchCost) -> u32 {
        let (kind, v, seq) = self.last.get();
        if (kind, v) == owner_bits(owner) {
            seq
        } else {
            self.look_up_run(ar, owner, cost)
        }
    }

    /// [`PosixTree::run_of`] of an owner other than the last: a probe of the owner
    /// table. Out of line, so the usual way keeps a small frame.
    #[cold]
    #[inline(never)]
    fn look_up_run(&self, ar: &Arena, owner: OwnerKey, cost: &mut SearchCost) -> u32 {
        let seq = self.owner_root(ar, owner, cost).map_or(0, |r| ar.node(r).ix.seq);
        let (kind, v) = owner_bits(owner);
        self.last.set((kind, v, seq));
        seq
    }

    /// `owner`'s run key is now `seq` (0: it holds no lock here): [`PosixTree::last`]
    /// follows.
    fn run_changed(&self, owner: OwnerKey, seq: u32) {
        let (kind, v, _) = self.last.get();
        if (kind, v) == owner_bits(owner) {
            self.last.set((kind, v, seq));
        }
    }

    /// The first lock in Linux's list order that `req` conflicts with
    /// (`posix_locks_conflict`), as the by-start tree's leaf has it: the test reads no
    /// record. Another owner is another run key (one per owner holding locks here, and
    /// the requester's, looked up in the owner table, is a probe the descent does not
    /// wait for); the first in list order is the least (run key, start), which no two
    /// locks share (one owner's locks do not overlap).
    pub fn first_conflict<'a>(
        &'a self,
        ar: &Arena,
        req: &FileLock,
        cost: &mut SearchCost,
    ) -> Option<Found<'a>> {
        let me = self.run_of(ar, req.owner, cost);
        let write = req.ty == LockType::Write;
        let mut best: Option<Found<'a>> = None;
        // A read request (or an unlock) conflicts only with write locks: skip subtrees
        // without one.
        self.by_start.scan(req.start, req.end, !write, cost, &mut |e| {
            // `posix_locks_conflict`: the scan reports locks that start at or before
            // the range's end and, to a request that does not write, only write locks;
            // what is left is another owner and the overlap (the scan may report one
            // lock ending before the range).
            debug_assert!(e.start() <= req.end && (write || e.write()));
            let conflict = (e.tag().seq != me) & (e.end() >= req.start);
            if conflict && best.is_none_or(|b| (e.tag().seq, e.start()) < (b.tag().seq, b.start())) {
                best = Some(e);
            }
        });
        best
    }

    /// Bytes held by the owner table and the by-start tree's nodes (the by-owner links
    /// are in the records).
    pub fn memory(&self) -> usize {
        self.owners.allocation_size() + self.by_start.memory()
    }

    /// Every lock, in Linux's list order: the owners' runs by `seq`, each in start order.
    pub fn list_order(&self, ar: &Arena) -> Vec<NodeId> {
        let mut runs: Vec<(u32, NodeId)> = self.owners.iter().map(|&r| (ar.node(r).ix.seq, r)).collect();
        runs.sort_unstable();
        let mut out = Vec::with_capacity(self.len);
        let mut stack = Vec::new();
        for (_, root) in runs {
            let mut t = root;
            while t != NIL || !stack.is_empty() {
                while t != NIL {
                    stack.push(t);
                    t = ar.node(t).ix.by_owner[0];
                }
                let n = stack.pop().expect("non-empty");
                out.push(n);
                t = ar.node(n).ix.by_owner[1];
            }
        }
        out
    }

    /// Checks the trees' shape, order, heights and augmentation (tests).
    #[cfg(test)]
    pub fn check(&self, ar: &Arena) {
        use owner_tree::ThreadedAvl;

        /// In-order walk; returns the height of subtree `t`.
        fn walk<S: ThreadedAvl>(ar: &Arena, t: NodeId, out: &mut Vec<NodeId>) -> i32 {
            if t == NIL {
                return 0;
            }
            let n = ar.node(t);
            let [l, r] = S::kids(&n.ix);
            let hl = walk::<S>(ar, l, out);
            out.push(t);
            let hr = walk::<S>(ar, r, out);
            assert!((hl - hr).abs() <= 1, "unbalanced at {t}");
            let h = 1 + hl.max(hr);
            assert_eq!(h, S::height(&n.ix) as i32, "height of {t}");
            h
        }
        // Each owner's tree: balanced, ordered by start, one owner and one run key,
        // found again by the owner's hash; no two owners share a run key.
        let mut a = Vec::new();
        let mut seqs = Vec::new();
        for &root in self.owners.iter() {
            let mut run = Vec::new();
            walk::<ByOwner>(ar, root, &mut run);
            assert!(!run.is_empty(), "an owner with an empty tree");
            assert!(run.windows(2).all(|p| ByOwner::less(ar, p[0], p[1])));
            let owner = ar.node(root).fl.owner;
            assert!(
                run.iter().all(|&id| ar.node(id).fl.owner == owner),
                "one owner per tree"
            );
            assert_eq!(self.owner_root(ar, owner, &mut SearchCost::default()), Some(root));
            seqs.push(ar.node(root).ix.seq);
            a.extend(run);
        }
        seqs.sort_unstable();
        assert!(seqs.windows(2).all(|p| p[0] < p[1]), "two runs share a key");
        let (kind, v, seq) = self.last.get();
        let owner = if kind == 0 {
            OwnerKey::Process(OwnerId(v))
        } else {
            OwnerKey::File(FileId(v))
        };
        let root = self.owner_root(ar, owner, &mut SearchCost::default());
        assert_eq!(
            root.map_or(0, |r| ar.node(r).ix.seq),
            seq,
            "the last owner's run key"
        );
        assert_eq!(a.len(), self.len);
        // The by-start tree holds the same records, with their ranges and types.
        let b = self.by_start.check();
        assert_eq!(b.len(), self.len);
        for &(start, end, id, write, tag) in &b {
            let n = ar.node(id);
            assert!(n.ix.indexed);
            let want = Tag {
                seq: n.ix.seq,
                pid: n.fl.reported_pid(),
            };
            assert_eq!(
                (n.fl.start, n.fl.end, n.fl.ty == LockType::Write, want),
                (start, end, write, tag),
                "by-start entry of {id}"
            );
        }
        let mut ids: Vec<NodeId> = b.iter().map(|e| e.2).collect();
        ids.sort_unstable();
        let mut owners = a.clone();
        owners.sort_unstable();
        assert_eq!(ids, owners, "both trees hold the same records");
        for p in a.windows(2) {
            let (x, y) = (ar.node(p[0]), ar.node(p[1]));
            if x.fl.owner == y.fl.owner {
                assert_eq!(x.ix.seq, y.ix.seq, "one run, one key");
                assert!(x.fl.end < y.fl.start, "one owner's locks overlap");
            }
        }
    }
}
