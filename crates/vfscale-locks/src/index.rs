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
//!   apart from the records
//!   (`start_index.rs`), augmented per child with the largest `end`, over all locks and
//!   over write locks only: an interval tree that finds the locks overlapping a range
//!   without visiting those that end before it (and, for a read request, without
//!   visiting read locks). Over 10,000 locks a descent touches 3 nodes (height 2), not
//!   14 records. A leaf keeps, beside each lock's start, its end, type, run key `seq`
//!   and the pid `F_GETLK` reports (`Tag`): a conflict search and `F_GETLK` read no
//!   record. Only a caller that needs the conflicting lock's record (a set that
//!   blocks, the wait trees) reads it, by the id the leaf also keeps.
//!
//! **Who is another owner**, without the records: two granted locks have the same owner
//! exactly when they have the same run key (below), so a lock conflicts only if its key
//! is not the requester's. The requester's key comes from the owner table (0 if it
//! holds nothing here: no run has key 0) — a probe the descent does not wait for — or,
//! for the same owner as the last search's, from a one-entry cache (`PosixTree::last`)
//! that follows the owner's run as it starts and ends and as keys are renumbered.
//!
//! Cost (cachegrind, `examples/lockmany_probe.rs`, one OFD owner setting and removing a
//! lock at a random free byte among H one-byte locks, and testing a held byte): a
//! set+unset pair 2,190 instructions and 0 L1 misses at H = 10, 3,130 and 6.0 at
//! 10,000 (one AVL by (owner, start) over all owners: 2,600 and 5,460; the AVL by start
//! before that: 3,486 and 8,565 with 30 misses); with 31-child branches 2,990 and 8.3;
//! a test 376 instructions at 10, 503 with 5.0 L1 misses at 10,000 (was 1,146 and 14;
//! with 15-child branches and no AVX2, 594 and 6.2): the B+ tree descent (a branch's
//! first six lines, a leaf's three) and the record (64 bytes, line-aligned). With
//! interpolation on evenly spaced keys: a test 375 and 456 instructions, 5.0 L1 misses
//! (a leaf's slope shares its start lines; a branch's is in its last line), a set+unset
//! pair 2,500 and 3,231. A node
//! step counts instead of searching, so the descent mispredicts no branch on a random
//! key (cachegrind's model: none per test at 10,000, was 5.75; with interpolation one,
//! the descent loop's exit, which that model's predictor, keeping no history, misses).
//! Answered from the leaf (no record read): a test 379 and 460 instructions, 4.5 L1
//! misses at 10,000; a set+unset pair 2,528 and 3,271.
//!
//! Time (`lockmany_probe HELD ratio`, least of 60 batches): a test ~21 ns at 10 held,
//! ~46-48 at 10,000 (~33 with the lines it reads in cache). A branch level of the descent
//! cost ~10 ns (a vector load, the count, the child's id: a chain of dependent steps)
//! and 10,000 locks need two: ~61 ns (~43 in cache), 2.6-2.7× the 10-held time. A node
//! whose keys are evenly spaced (lockmany's, and fixed-size records, pages, slots) is
//! stepped by interpolation instead, checked by a predicted branch (`start_index.rs`),
//! ~5 ns a level, so the test at 10,000 is ~2.3× its 10-held time here: what is left
//! is the two dependent misses of a random test (the leaf, then the record: ~15 ns,
//! with L1 TLB misses, in a working set of ~900 KB) and the two shorter levels. Nodes
//! with irregular keys count as before (~2.7×). The lab (`vfscale bench lockmany`,
//! means of 3 runs, load ~3, alternated with the counting build): test at 10,000 held
//! 50-54 ns, 2.25-2.51× its 10-held time (counting: 61-72 ns, 2.57-3.16×).
//!
//! The record was the second dependent miss: since the leaf answers (its entry's line
//! prefetched with the leaf's starts), a test at 10,000 held is ~40 ns in the probe
//! (10 held ~22, as before), 1.8× its 10-held time; in the lab (`--runs 5 --duration
//! 0.5`, load ~1.5, alternated with the build before) 40.0-43.2 ns, 1.65-1.79× (before:
//! 53.4-55.3 ns, 2.14-2.33×), at 10 held 24.0-25.2 ns either way; set+unset at 10,000
//! 254-268 ns (before 276-288). Memory per lock at 10,000 held: 111 B OFD, 103 B POSIX
//! (was 113 and 105: the tags take 120 bytes a leaf, 8.6 a lock; leaves filled to
//! 14/15 by an ascending run and the wait-link side table made on the first wait give
//! back 2.5 and 8.4).
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
use crate::start_index::{Found, StartTree, Tag};
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

/// Work counters of one index, kept under the inode lock with the context's stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Work {
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
    /// that tests or sets again finds its key without probing the owner table (~45
    /// instructions, and a frame the usual way does not need). At first process 0, which
    /// holds nothing.
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

/// One of the two trees: how its links, height and key are reached.
trait Side {
    fn kids(ix: &IndexLinks) -> [NodeId; 2];
    fn set_kids(ix: &mut IndexLinks, k: [NodeId; 2]);
    fn height(ix: &IndexLinks) -> u8;
    fn set_height(ix: &mut IndexLinks, h: u8);
    /// Whether `a`'s key is below `b`'s.
    fn less(ar: &Arena, a: NodeId, b: NodeId) -> bool;
}

struct ByOwner;

/// The key of a record in its owner's tree (all of one owner's records).
fn owner_key(fl: &FileLock, id: NodeId) -> (i64, NodeId) {
    (fl.start, id)
}

impl Side for ByOwner {
    fn kids(ix: &IndexLinks) -> [NodeId; 2] {
        ix.by_owner
    }
    fn set_kids(ix: &mut IndexLinks, k: [NodeId; 2]) {
        ix.by_owner = k;
    }
    fn height(ix: &IndexLinks) -> u8 {
        ix.h_owner
    }
    fn set_height(ix: &mut IndexLinks, h: u8) {
        ix.h_owner = h;
    }
    fn less(ar: &Arena, a: NodeId, b: NodeId) -> bool {
        owner_key(&ar.node(a).fl, a) < owner_key(&ar.node(b).fl, b)
    }
}

fn height<S: Side>(ar: &Arena, t: NodeId) -> i32 {
    if t == NIL {
        0
    } else {
        S::height(&ar.node(t).ix) as i32
    }
}

/// Recomputes `t`'s height and augmentation from its children.
fn update<S: Side>(ar: &mut Arena, t: NodeId) {
    let [l, r] = S::kids(&ar.node(t).ix);
    let h = 1 + height::<S>(ar, l).max(height::<S>(ar, r));
    S::set_height(&mut ar.node_mut(t).ix, h as u8);
}

fn rotate<S: Side>(ar: &mut Arena, t: NodeId, dir: usize) -> NodeId {
    // dir 1: rotate right (the left child rises); dir 0: rotate left.
    let up_side = 1 - dir;
    let mut tk = S::kids(&ar.node(t).ix);
    let u = tk[up_side];
    let mut uk = S::kids(&ar.node(u).ix);
    tk[up_side] = uk[dir];
    uk[dir] = t;
    S::set_kids(&mut ar.node_mut(t).ix, tk);
    S::set_kids(&mut ar.node_mut(u).ix, uk);
    update::<S>(ar, t);
    update::<S>(ar, u);
    u
}

fn rebalance<S: Side>(ar: &mut Arena, t: NodeId) -> NodeId {
    update::<S>(ar, t);
    let [l, r] = S::kids(&ar.node(t).ix);
    let bf = height::<S>(ar, l) - height::<S>(ar, r);
    if bf > 1 {
        let [ll, lr] = S::kids(&ar.node(l).ix);
        if height::<S>(ar, ll) < height::<S>(ar, lr) {
            let nl = rotate::<S>(ar, l, 0);
            let mut k = S::kids(&ar.node(t).ix);
            k[0] = nl;
            S::set_kids(&mut ar.node_mut(t).ix, k);
        }
        return rotate::<S>(ar, t, 1);
    }
    if bf < -1 {
        let [rl, rr] = S::kids(&ar.node(r).ix);
        if height::<S>(ar, rr) < height::<S>(ar, rl) {
            let nr = rotate::<S>(ar, r, 1);
            let mut k = S::kids(&ar.node(t).ix);
            k[1] = nr;
            S::set_kids(&mut ar.node_mut(t).ix, k);
        }
        return rotate::<S>(ar, t, 0);
    }
    t
}

fn set_kid<S: Side>(ar: &mut Arena, t: NodeId, side: usize, k: NodeId) {
    let mut kids = S::kids(&ar.node(t).ix);
    kids[side] = k;
    S::set_kids(&mut ar.node_mut(t).ix, kids);
}

/// Rebalances `t` after a change below it: (new subtree root, whether the subtree's
/// root or height changed). When nothing changed, the ancestors need no update either,
/// so the walk back up stops there.
fn fix<S: Side>(ar: &mut Arena, t: NodeId) -> (NodeId, bool) {
    let before = S::height(&ar.node(t).ix);
    let r = rebalance::<S>(ar, t);
    (r, r != t || S::height(&ar.node(r).ix) != before)
}

fn insert<S: Side>(ar: &mut Arena, t: NodeId, id: NodeId, w: &mut Work) -> (NodeId, bool) {
    if t == NIL {
        S::set_kids(&mut ar.node_mut(id).ix, [NIL; 2]);
        update::<S>(ar, id);
        return (id, true);
    }
    w.nodes += 1;
    let side = if S::less(ar, id, t) { 0 } else { 1 };
    let k = S::kids(&ar.node(t).ix)[side];
    let (nk, changed) = insert::<S>(ar, k, id, w);
    if !changed {
        return (t, false);
    }
    set_kid::<S>(ar, t, side, nk);
    fix::<S>(ar, t)
}

/// Takes the least node out of subtree `t`: (new subtree root, whether it changed as in
/// [`fix`], the node).
fn remove_min<S: Side>(ar: &mut Arena, t: NodeId, w: &mut Work) -> (NodeId, bool, NodeId) {
    w.nodes += 1;
    let [l, r] = S::kids(&ar.node(t).ix);
    if l == NIL {
        return (r, true, t);
    }
    let (nl, changed, m) = remove_min::<S>(ar, l, w);
    if !changed {
        return (t, false, m);
    }
    set_kid::<S>(ar, t, 0, nl);
    let (nt, changed) = fix::<S>(ar, t);
    (nt, changed, m)
}

fn remove<S: Side>(ar: &mut Arena, t: NodeId, id: NodeId, w: &mut Work) -> (NodeId, bool) {
    assert!(t != NIL, "record {id} is not in the index");
    w.nodes += 1;
    if t == id {
        let [l, r] = S::kids(&ar.node(t).ix);
        S::set_kids(&mut ar.node_mut(t).ix, [NIL; 2]);
        if l == NIL {
            return (r, true);
        }
        if r == NIL {
            return (l, true);
        }
        let (nr, _, m) = remove_min::<S>(ar, r, w);
        S::set_kids(&mut ar.node_mut(m).ix, [l, nr]);
        return (rebalance::<S>(ar, m), true);
    }
    let side = if S::less(ar, id, t) { 0 } else { 1 };
    let k = S::kids(&ar.node(t).ix)[side];
    let (nk, changed) = remove::<S>(ar, k, id, w);
    if !changed {
        return (t, false);
    }
    set_kid::<S>(ar, t, side, nk);
    fix::<S>(ar, t)
}

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
    fn owner_root(&self, ar: &Arena, owner: OwnerKey, w: &mut Work) -> Option<NodeId> {
        w.nodes += 1;
        self.owners
            .find(owner_hash(owner), |&r| ar.node(r).fl.owner == owner)
            .copied()
    }

    /// Adds granted lock `id` with list-order key `seq`.
    pub fn insert(&mut self, ar: &mut Arena, id: NodeId, seq: u32, w: &mut Work) {
        let ix = &mut ar.node_mut(id).ix;
        debug_assert!(!ix.indexed, "record {id} indexed twice");
        ix.indexed = true;
        ix.seq = seq;
        let owner = ar.node(id).fl.owner;
        let h = owner_hash(owner);
        w.nodes += 1;
        match self.owners.find_mut(h, |&r| ar.node(r).fl.owner == owner) {
            Some(root) => {
                debug_assert_eq!(ar.node(*root).ix.seq, seq, "one run, one key");
                *root = insert::<ByOwner>(ar, *root, id, w).0;
            }
            None => {
                let root = insert::<ByOwner>(ar, NIL, id, w).0;
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
            .insert(fl.start, fl.end, id, fl.ty == LockType::Write, tag, w);
        self.len += 1;
    }

    /// Takes lock `id` out of the trees.
    pub fn remove(&mut self, ar: &mut Arena, id: NodeId, w: &mut Work) {
        debug_assert!(ar.node(id).ix.indexed, "record {id} is not indexed");
        let owner = ar.node(id).fl.owner;
        w.nodes += 1;
        match self
            .owners
            .find_entry(owner_hash(owner), |&r| ar.node(r).fl.owner == owner)
        {
            Ok(mut e) => {
                let root = remove::<ByOwner>(ar, *e.get(), id, w).0;
                if root == NIL {
                    e.remove();
                    self.run_changed(owner, 0);
                } else {
                    *e.get_mut() = root;
                }
            }
            Err(_) => panic!("record {id}'s owner has no tree"),
        }
        self.by_start.remove(ar.node(id).fl.start, id, w);
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
        w: &mut Work,
    ) -> (Option<NodeId>, Option<NodeId>) {
        let key = (x, NodeId::MAX);
        let mut t = self.owner_root(ar, owner, w).unwrap_or(NIL);
        let (mut floor, mut after) = (None, None);
        while t != NIL {
            w.nodes += 1;
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
    pub fn owner_next(&self, ar: &Arena, id: NodeId, w: &mut Work) -> Option<NodeId> {
        let fl = &ar.node(id).fl;
        let key = owner_key(fl, id);
        // The least key above `id`'s: the leftmost of its right subtree, or else the
        // lowest ancestor it is left of (found descending from the root).
        let mut t = ar.node(id).ix.by_owner[1];
        if t != NIL {
            loop {
                w.nodes += 1;
                let l = ar.node(t).ix.by_owner[0];
                if l == NIL {
                    return Some(t);
                }
                t = l;
            }
        }
        let (mut t, mut best) = (self.owner_root(ar, fl.owner, w).unwrap_or(NIL), None);
        while t != NIL && t != id {
            w.nodes += 1;
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
    fn run_of(&self, ar: &Arena, owner: OwnerKey, w: &mut Work) -> u32 {
        let (kind, v, seq) = self.last.get();
        if (kind, v) == owner_bits(owner) {
            seq
        } else {
            self.look_up_run(ar, owner, w)
        }
    }

    /// [`PosixTree::run_of`] of an owner other than the last: a probe of the owner
    /// table. Out of line, so the usual way keeps a small frame.
    #[cold]
    #[inline(never)]
    fn look_up_run(&self, ar: &Arena, owner: OwnerKey, w: &mut Work) -> u32 {
        let seq = self.owner_root(ar, owner, w).map_or(0, |r| ar.node(r).ix.seq);
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
    pub fn first_conflict<'a>(&'a self, ar: &Arena, req: &FileLock, w: &mut Work) -> Option<Found<'a>> {
        let me = self.run_of(ar, req.owner, w);
        let write = req.ty == LockType::Write;
        let mut best: Option<Found<'a>> = None;
        // A read request (or an unlock) conflicts only with write locks: skip subtrees
        // without one.
        self.by_start.scan(req.start, req.end, !write, w, &mut |e| {
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
        /// In-order walk; returns the height of subtree `t`.
        fn walk<S: Side>(ar: &Arena, t: NodeId, out: &mut Vec<NodeId>) -> i32 {
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
            assert_eq!(self.owner_root(ar, owner, &mut Work::default()), Some(root));
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
        let root = self.owner_root(ar, owner, &mut Work::default());
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

#[cfg(test)]
mod tests {
    //! The index against Linux's list: random calls on one inode, replayed with both
    //! settings, must give the same results, the same listing in the same order (held
    //! locks in list order, waiters in tree order) and the same counters, and the trees
    //! must stay balanced, ordered and correctly augmented after every call.

    use std::collections::BTreeMap;
    use std::sync::Arc;

    use proptest::prelude::*;

    use crate::*;

    const PROCS: u32 = 5;
    const FILES: u64 = 8;

    #[derive(Clone, Debug)]
    enum Call {
        Fcntl {
            file: u64,
            cmd: FcntlCmd,
            ty: LockType,
            start: i64,
            len: i64,
            /// The calling thread of the file's process: its pid is the process's plus
            /// 100 per thread (tasks sharing one file table: one POSIX owner, several
            /// pids, each lock reporting its own).
            thread: u8,
        },
        Close(u64),
        LastClose(u64),
        Interrupt(u64),
    }

    fn call() -> impl Strategy<Value = Call> {
        call_over(FILES, 48, 1, 4)
    }

    /// A call by one of `files` open files on bytes below `bytes` (ranges may run past
    /// them); `closes` weighs closes and interrupts against 12 for `fcntl`, and `waits`
    /// the blocking commands against 8 for a set and 4 for a test.
    fn call_over(files: u64, bytes: i64, closes: u32, waits: u32) -> impl Strategy<Value = Call> {
        use FcntlCmd::*;
        let cmd = prop_oneof![
            8 => Just(SetLk),
            waits => Just(SetLkW),
            4 => Just(GetLk),
            8 => Just(OfdSetLk),
            waits => Just(OfdSetLkW),
            4 => Just(OfdGetLk),
        ];
        let ty = prop::sample::select(vec![
            LockType::Read,
            LockType::Write,
            LockType::Write,
            LockType::Unlock,
        ]);
        let len = prop_oneof![3 => 1i64..6, 1 => Just(0i64), 1 => -3i64..0, 1 => 6i64..30];
        prop_oneof![
            12 => (1..=files, cmd, ty, 0i64..bytes, len, 0u8..3).prop_map(|(file, cmd, ty, start, len, thread)| {
                Call::Fcntl {
                    file,
                    cmd,
                    ty,
                    start,
                    len,
                    thread,
                }
            }),
            closes => (1..=files).prop_map(Call::Close),
            closes => (1..=files).prop_map(Call::LastClose),
            closes => (1..=files).prop_map(Call::Interrupt),
        ]
    }

    /// File `f` is opened by process `f % PROCS + 1`.
    fn who(file: u64) -> (Process, OpenFile) {
        (
            Process::new((file % PROCS as u64) as u32 + 1),
            OpenFile::new(file, AccessMode::ReadWrite),
        )
    }

    struct Side {
        mgr: Arc<LockManager>,
        ctx: Arc<FileLockContext>,
        /// Pending requests by file.
        pending: BTreeMap<u64, PendingLock>,
    }

    impl Side {
        fn new(index: LockIndex) -> Side {
            let mgr = LockManager::with_settings(Settings {
                index,
                ..Settings::default()
            });
            let ctx = FileLockContext::new(
                &mgr,
                InodeKey {
                    major: 0,
                    minor: 1,
                    ino: 2,
                },
            );
            Side {
                mgr,
                ctx,
                pending: BTreeMap::new(),
            }
        }

        /// Applies `c`; returns what a caller would see, as text.
        fn apply(&mut self, c: &Call) -> String {
            let out = match *c {
                Call::Fcntl {
                    file,
                    cmd,
                    ty,
                    start,
                    len,
                    thread,
                } => {
                    if cmd.waits() && self.pending.contains_key(&file) {
                        return "skip".into();
                    }
                    // A process blocked in one call makes no other.
                    let (mut p, f) = who(file);
                    if !cmd.is_ofd() && self.pending.keys().any(|&g| who(g).0 == p) {
                        return "skip".into();
                    }
                    p.pid = Pid(p.pid.0 + 100 * thread as i32);
                    let mut fl = Flock::new(ty, start, len);
                    match self.ctx.fcntl_lock(p, f, cmd, &mut fl) {
                        Ok(Some(pl)) => {
                            self.pending.insert(file, pl);
                            "blocked".into()
                        }
                        Ok(None) if cmd.is_get() => format!("{fl:?}"),
                        r => format!("{:?}", r.map(|_| ())),
                    }
                }
                Call::Close(file) => {
                    let (p, _) = who(file);
                    if self.pending.keys().any(|&g| who(g).0 == p) {
                        return "skip".into();
                    }
                    self.ctx.posix_remove_owner(p);
                    "closed".into()
                }
                Call::LastClose(file) => {
                    if self.pending.contains_key(&file) {
                        return "skip".into();
                    }
                    self.ctx.file_remove(FileId(file));
                    "closed".into()
                }
                Call::Interrupt(file) => match self.pending.remove(&file) {
                    Some(p) => {
                        p.interrupter().interrupt();
                        format!("{:?}", p.wait())
                    }
                    None => "none".into(),
                },
            };
            // Settle: retry every woken request until none is left, in file order.
            let mut done = Vec::new();
            loop {
                let mut progressed = false;
                let files: Vec<u64> = self.pending.keys().copied().collect();
                for f in files {
                    if let Some(r) = self.pending.get_mut(&f).unwrap().poll_complete() {
                        self.pending.remove(&f);
                        done.push((f, r));
                        progressed = true;
                    }
                }
                if !progressed {
                    break;
                }
            }
            format!("{out} {done:?}")
        }

        fn check(&self) {
            let inner = self.ctx.inner.lock();
            inner.tree.check(&inner.arena);
        }
    }

    /// Replays `calls` with both settings: the same results, listing and counters, and
    /// the trees (leaf tags and the owner cache included) checked after every call.
    /// Returns how many times the run keys were renumbered.
    fn same_as_the_list(calls: &[Call]) -> Result<u32, TestCaseError> {
        let mut tree = Side::new(LockIndex::Tree);
        let mut list = Side::new(LockIndex::List);
        let next_seq = |s: &Side| s.ctx.inner.lock().tree.next_seq;
        let mut renumbered = 0;
        for (i, c) in calls.iter().enumerate() {
            let before = next_seq(&tree);
            let a = tree.apply(c);
            let b = list.apply(c);
            prop_assert_eq!(&a, &b, "call {} {:?}", i, c);
            tree.check();
            renumbered += u32::from(next_seq(&tree) < before);
            prop_assert_eq!(
                tree.mgr.proc_locks(),
                list.mgr.proc_locks(),
                "listing after call {} {:?}",
                i,
                c
            );
            let (st, sl) = (tree.ctx.stats(), list.ctx.stats());
            prop_assert_eq!(
                (st.grants, st.wakeups, st.blocks),
                (sl.grants, sl.wakeups, sl.blocks),
                "counters after call {} {:?}",
                i,
                c
            );
        }
        Ok(renumbered)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn the_index_gives_linuxs_list_results(calls in prop::collection::vec(call(), 1..120)) {
            same_as_the_list(&calls)?;
        }

        /// Many owners (40 open files; 5 processes, each calling from three pids) on 24
        /// bytes, closing often: runs start and end all the time, so the run keys are
        /// renumbered (every 40 runs in tests) several times a case, records, leaf tags
        /// and the cached owner's key alike; an owner's locks are upgraded, downgraded,
        /// split and merged, each keeping the pid Linux keeps.
        #[test]
        fn many_owners_coming_and_going_give_linuxs_list_results(
            calls in prop::collection::vec(call_over(40, 64, 3, 1), 1..400)
        ) {
            same_as_the_list(&calls)?;
        }
    }

    /// The churn above renumbers the run keys often (so that the proptest exercises it).
    #[test]
    fn churning_owners_renumber_the_run_keys() {
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let calls = prop::collection::vec(call_over(40, 64, 3, 1), 3000)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        let renumbered = same_as_the_list(&calls).unwrap();
        assert!(renumbered >= 15, "renumbered {renumbered} times");
    }

    /// Locks evenly spaced (the by-start tree's nodes step by interpolation), from 0 or
    /// ending at the greatest offset, spaced by bytes or by gigabytes, held by one to
    /// three owners; then tests, locks and unlocks on, beside and across them.
    fn evenly_spaced() -> impl Strategy<Value = (Vec<Call>, Vec<Call>)> {
        let step = prop_oneof![
            2i64..9,
            prop::sample::select(vec![
                4096i64,
                (1 << 14) - 1,
                1 << 14,
                (1 << 14) + 1,
                1 << 20,
                1 << 40
            ]),
        ];
        let n = prop_oneof![3 => 14i64..64, 1 => 404i64..440];
        let setup = (step, n, any::<bool>(), 1u64..=3, any::<bool>(), 0u8..3);
        setup.prop_flat_map(|(step, n, at_end, owners, ofd, fill)| {
            let n = n.min(i64::MAX / step);
            let base = if at_end { i64::MAX - (n - 1) * step } else { 0 };
            let held = (0..n)
                .map(|i| Call::Fcntl {
                    file: 1 + i as u64 % owners,
                    cmd: if ofd { FcntlCmd::OfdSetLk } else { FcntlCmd::SetLk },
                    ty: if i % 5 == 2 {
                        LockType::Read
                    } else {
                        LockType::Write
                    },
                    start: base + i * step,
                    len: [1, step / 2, step - 1][fill as usize],
                    thread: (i % 3) as u8,
                })
                .collect::<Vec<_>>();
            let cmd = prop::sample::select(vec![
                FcntlCmd::GetLk,
                FcntlCmd::OfdGetLk,
                FcntlCmd::GetLk,
                FcntlCmd::OfdGetLk,
                FcntlCmd::SetLk,
                FcntlCmd::OfdSetLk,
                FcntlCmd::SetLkW,
            ]);
            let ty = prop::sample::select(vec![LockType::Read, LockType::Write, LockType::Unlock]);
            let at = prop_oneof![0..n, Just(n - 1), Just(0)];
            let off = prop::sample::select(vec![0i64, 0, 1, -1, step - 1, step / 2]);
            let len = prop::sample::select(vec![1i64, 1, 0, step, step + 1, 3 * step, -1, 2]);
            let one = (1..=FILES, cmd, ty, at, off, len).prop_map(move |(file, cmd, ty, i, off, len)| {
                Call::Fcntl {
                    file,
                    cmd,
                    ty,
                    start: (base + i * step).saturating_add(off).max(0),
                    len,
                    thread: (i % 2) as u8,
                }
            });
            let calls = prop_oneof![
                20 => one,
                1 => (1..=FILES).prop_map(Call::Close),
                1 => (1..=FILES).prop_map(Call::Interrupt),
            ];
            (Just(held), prop::collection::vec(calls, 1..40))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 40, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn evenly_spaced_locks_give_linuxs_list_results((held, calls) in evenly_spaced()) {
            let mut tree = Side::new(LockIndex::Tree);
            let mut list = Side::new(LockIndex::List);
            for (i, c) in held.iter().chain(&calls).enumerate() {
                let a = tree.apply(c);
                let b = list.apply(c);
                prop_assert_eq!(&a, &b, "call {} {:?}", i, c);
                if i + 1 >= held.len() {
                    tree.check();
                    prop_assert_eq!(tree.mgr.proc_locks(), list.mgr.proc_locks(), "listing after call {} {:?}", i, c);
                }
            }
        }
    }

    /// Runs `f` on a context with each setting (then checks the trees); both must see
    /// the same. Returns what they saw.
    fn on_tree_and_list<T: PartialEq + std::fmt::Debug>(f: impl Fn(&Side) -> T) -> T {
        let [tree, list] = [LockIndex::Tree, LockIndex::List].map(|index| {
            let side = Side::new(index);
            let seen = f(&side);
            side.check();
            seen
        });
        assert_eq!(tree, list, "Tree against List");
        tree
    }

    /// `F_GETLK` is answered from the by-start tree's leaves: each lock's own pid (one
    /// owner, two pids: processes sharing a file table), `-1` for an OFD lock, the
    /// type and range, and nothing of the requester's own locks; as the list says.
    #[test]
    fn getlk_reports_each_locks_own_pid() {
        let f = |n| OpenFile::new(n, AccessMode::ReadWrite);
        let p = |owner, pid| Process {
            owner: OwnerId(owner),
            pid: Pid(pid),
        };
        let got = on_tree_and_list(|s| {
            let set = |who, file, cmd, ty, start, len| {
                let mut fl = Flock::new(ty, start, len);
                s.ctx.fcntl(who, f(file), cmd, &mut fl).unwrap();
            };
            set(p(1, 7), 1, FcntlCmd::SetLk, LockType::Write, 0, 10);
            set(p(1, 9), 1, FcntlCmd::SetLk, LockType::Read, 20, 10);
            set(p(2, 4), 2, FcntlCmd::OfdSetLk, LockType::Write, 40, 10);
            set(p(3, 5), 3, FcntlCmd::SetLk, LockType::Read, 25, 1);
            let mut out = Vec::new();
            for (who, file, cmd, ty, start) in [
                (p(5, 50), 5, FcntlCmd::GetLk, LockType::Write, 5),
                (p(5, 50), 5, FcntlCmd::GetLk, LockType::Write, 25),
                (p(5, 50), 5, FcntlCmd::OfdGetLk, LockType::Read, 0),
                (p(5, 50), 5, FcntlCmd::GetLk, LockType::Read, 45),
                (p(1, 11), 1, FcntlCmd::GetLk, LockType::Write, 0),
                (p(1, 11), 1, FcntlCmd::GetLk, LockType::Write, 25),
                (p(3, 5), 3, FcntlCmd::GetLk, LockType::Write, 0),
                (p(3, 5), 3, FcntlCmd::OfdGetLk, LockType::Unlock, 40),
                (p(3, 5), 2, FcntlCmd::OfdGetLk, LockType::Unlock, 40),
            ] {
                let mut fl = Flock::new(ty, start, 30);
                s.ctx.fcntl(who, f(file), cmd, &mut fl).unwrap();
                out.push((fl.l_type, fl.l_start, fl.l_len, fl.l_pid));
            }
            out
        });
        use LockType::*;
        assert_eq!(
            got,
            [
                (Write, 0, 10, 7),
                (Read, 20, 10, 9),
                (Write, 0, 10, 7),
                (Write, 40, 10, -1),
                (Read, 25, 1, 5),
                // The OFD lock's run started before process 3's.
                (Write, 40, 10, -1),
                (Write, 0, 10, 7),
                (Unlock, 40, 30, 0),
                (Write, 40, 10, -1),
            ]
        );
    }

    /// A POSIX owner's locks set from several pids (tasks sharing a file table) each
    /// report their own pid, as Linux keeps it: a lock extended by a merge keeps the pid
    /// of the lock it extends (`request = fl`), even over a lock of the other type, and
    /// the pieces of a split keep the split lock's; as the list says.
    #[test]
    fn merged_and_split_locks_report_the_pid_linux_keeps() {
        let f = OpenFile::new(1, AccessMode::ReadWrite);
        let p = |owner, pid| Process {
            owner: OwnerId(owner),
            pid: Pid(pid),
        };
        let seen = on_tree_and_list(|s| {
            let call = |pid, cmd, ty, start, len| {
                let mut fl = Flock::new(ty, start, len);
                let who = if cmd == FcntlCmd::GetLk {
                    p(2, 70)
                } else {
                    p(1, pid)
                };
                s.ctx.fcntl(who, f, cmd, &mut fl).unwrap();
                (fl.l_type, fl.l_start, fl.l_len, fl.l_pid)
            };
            use FcntlCmd::{GetLk, SetLk};
            use LockType::*;
            call(7, SetLk, Write, 0, 10);
            // Merged into [0, 19]: still pid 7's.
            call(9, SetLk, Write, 5, 15);
            // Split: [0, 4] W 7, [5, 9] R 11, [10, 19] W 7.
            call(11, SetLk, Read, 5, 5);
            // Extends pid 11's read lock: [5, 10] R 11, [11, 19] W 7.
            call(13, SetLk, Read, 10, 1);
            // Extends pid 7's [0, 4]: [0, 6] W 7, [7, 10] R 11.
            call(15, SetLk, Write, 3, 4);
            // Another process's F_GETLK of (type, start, len) and what it must find.
            let mut seen = Vec::new();
            let mut test = |q: (LockType, i64, i64), want| seen.push((call(0, GetLk, q.0, q.1, q.2), want));
            test((Write, 0, 30), (Write, 0, 7, 7));
            test((Write, 7, 2), (Read, 7, 4, 11));
            test((Read, 7, 4), (Unlock, 7, 4, 0));
            test((Read, 8, 5), (Write, 11, 9, 7));
            test((Write, 19, 5), (Write, 11, 9, 7));
            // Extends pid 11's [7, 10] R over [11, 19] W, which goes: [7, 26] R 11.
            call(17, SetLk, Read, 7, 20);
            test((Write, 0, 30), (Write, 0, 7, 7));
            test((Write, 12, 1), (Read, 7, 20, 11));
            seen
        });
        for (i, (got, want)) in seen.iter().enumerate() {
            assert_eq!(got, want, "test {i}");
        }
    }

    /// The owner cache follows a renumbering of its own run: the last owner to search
    /// holds locks when the keys are renumbered (the calls never leave it so — the owner
    /// starting a run has just searched, and holds none — but the cache must not depend
    /// on that), and its next test must still skip its own lock.
    #[test]
    fn the_cached_owner_follows_its_renumbered_run() {
        let mut side = Side::new(LockIndex::Tree);
        let ofd = |file, ty, start| Call::Fcntl {
            file,
            cmd: FcntlCmd::OfdSetLk,
            ty,
            start,
            len: 1,
            thread: 0,
        };
        let getlk = |file, start, len| Call::Fcntl {
            file,
            cmd: FcntlCmd::OfdGetLk,
            ty: LockType::Write,
            start,
            len,
            thread: 0,
        };
        // Runs 1..=30, one lock each at byte 2 * file; the first 20 end.
        for file in 1..=30 {
            side.apply(&ofd(file, LockType::Write, 2 * file as i64));
        }
        for file in 1..=20 {
            side.apply(&Call::LastClose(file));
        }
        // File 30 searches (the cache holds its key, 30), then the keys are renumbered:
        // its run is now the tenth.
        assert!(side.apply(&getlk(30, 60, 1)).contains("Unlock"));
        {
            let mut inner = side.ctx.inner.lock();
            let inner = &mut *inner;
            inner.tree.next_seq = super::SEQ_LIMIT;
            inner.tree.new_seq(&mut inner.arena);
            assert_eq!(inner.tree.last.get(), (1, 30, 10), "the cached owner's key");
            inner.tree.check(&inner.arena);
        }
        // Its own lock is still not a conflict, and file 21's (now key 1) is the first.
        assert!(side.apply(&getlk(30, 60, 1)).contains("Unlock"));
        assert!(side.apply(&getlk(30, 0, 0)).contains("l_start: 42"));
        side.check();
    }

    #[test]
    fn many_owners_many_ranges_stay_consistent() {
        // A denser run than the proptest: 2,000 calls over 64 owners on 200 bytes.
        let mut tree = Side::new(LockIndex::Tree);
        let mut list = Side::new(LockIndex::List);
        let mut x = 0x2545F4914F6CDD1Du64;
        for i in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let file = 1 + x % 64;
            let cmd = [
                FcntlCmd::SetLk,
                FcntlCmd::OfdSetLk,
                FcntlCmd::GetLk,
                FcntlCmd::OfdGetLk,
            ][(x >> 8) as usize % 4];
            let ty = [LockType::Read, LockType::Write, LockType::Unlock][(x >> 12) as usize % 3];
            let ty = if cmd == FcntlCmd::GetLk && ty == LockType::Unlock {
                LockType::Read
            } else {
                ty
            };
            let c = Call::Fcntl {
                file,
                cmd,
                ty,
                start: ((x >> 16) % 200) as i64,
                len: 1 + ((x >> 24) % 12) as i64,
                thread: ((x >> 40) % 3) as u8,
            };
            let (a, b) = (tree.apply(&c), list.apply(&c));
            assert_eq!(a, b, "call {i} {c:?}");
            if i % 50 == 0 {
                tree.check();
                assert_eq!(
                    tree.mgr.proc_locks(),
                    list.mgr.proc_locks(),
                    "listing after call {i}"
                );
            }
        }
        tree.check();
        assert_eq!(tree.mgr.proc_locks(), list.mgr.proc_locks());
        let (st, sl) = (tree.ctx.stats(), list.ctx.stats());
        assert!(
            st.lock_checks * 4 < sl.lock_checks,
            "the index examines fewer locks: {st:?} vs {sl:?}"
        );
    }
}
