//! The by-start half of the index: a B+ tree over (`start`, id) of the granted POSIX and
//! OFD locks, augmented with the greatest `end` (over all locks and over write locks)
//! of every child subtree — an interval tree with wide nodes.
//!
//! Leaves hold up to [`LEAF_CAP`] entries and branches [`BRANCH_CAP`] children, in
//! arrays of their own (a leaf's starts together, ends with tags together, a branch's separators
//! together, ends together), apart from the lock records: a descent over 10,000 locks
//! touches three nodes, whose upper levels stay in cache. A leaf entry carries what a
//! conflict test and `F_GETLK` need of the lock (end, type, the owner's run key and the
//! reported pid: [`Tag`]), and a scan reports it as a [`Found`] (the leaf and slot), so
//! the arena record is read only by a caller that needs it (by [`Found::id`]).
//!
//! A step down a node has no data-dependent exit: it counts the starts (separators) at
//! or below the bound over all slots, unused ones padded (start `i64::MAX`, end
//! `i64::MIN`), so a random key's place costs no mispredicted branch. Where the CPU has
//! AVX2 (detected at run time), the count uses it (`avx2.rs`): a descent is a chain of
//! counts, each waiting for the one before, and the vector count is the shorter step.
//!
//! **The usual way.** A scan needs only the last counted entry (child) when the range
//! starts at or after its start and none before it spills over its successor's start;
//! each node keeps that as a bitmask (`spill`). Otherwise (overlapping locks, a long
//! range) it takes the exact mask of candidates, out of line so that the usual way keeps
//! its values in registers. Both give the same entries. The usual way reads no child's
//! greatest end (lines of their own) and does not test a leaf entry's end: a leaf
//! reports its one candidate, and the caller tests the overlap with the entry's end, on
//! the line of its tag. That line is prefetched as the leaf's starts are read, so it is
//! not a second dependent miss.
//!
//! **Interpolation.** A node whose keys (a leaf's starts, a branch's separators
//! `sep[1..]`) are evenly spaced, `step` bytes apart (`2 ≤ step < 2^14` in a leaf,
//! `< 2^24` in a branch: locks on fixed-size records, pages, hash chains, reader slots),
//! keeps the slope of the line through them (`inv`, about `2^32 / step` in a leaf, on
//! the start lines, `2^64 / step` in a branch, recomputed with `spill` whenever its keys
//! change); a step down it is then a subtract, a multiply and the child's id, and the
//! guess `g` is exact for every bound at or above the first key. The guess is still
//! checked (`sep[g] ≤ qs` and `qe < sep[g + 1]`, with the `spill` bits: exactly the
//! usual way's condition for child `g`), but as a branch the CPU predicts, so the next
//! node's lines are fetched before the check is done. A guess that fails (a bound below
//! the first key, a long range) takes the count. A node whose keys are not evenly
//! spaced keeps `inv` = [`NO_GUESS`] and counts: guessing there would cost a
//! mispredicted branch per node.
//!
//! Invariants (checked by `StartTree::check`):
//! * every leaf is at the same depth; every node but the root holds at least [`MIN_ENTRIES`]
//!   entries;
//! * a leaf's entries are sorted by (`start`, id); a branch's `sep[i]`, `i ≥ 1`, is a
//!   lower bound of every key in child `i` and above every key in child `i - 1`; a
//!   branch filed at `i ≥ 1` has its parent's `sep[i]` as its own `sep[0]` (child 0's
//!   `sep[0]` bounds nothing: a new least key goes down the leftmost path);
//! * a branch's `max_end[i]` and `max_wend[i]` are exactly the greatest end, and
//!   greatest write-lock end (`i64::MIN` if none), in child `i`;
//! * slots past `len` hold the padding; bit `k` of a node's `spill` is set exactly when
//!   entry (child) `k + 1` exists and `end[k]` (`max_end[k]`) reaches its start
//!   (`sep[k + 1]`).

use crate::context::NodeId;
use crate::index::SearchCost;

/// Entries per leaf: 15, so a leaf (starts, ends with tags, ids, header) is exactly
/// seven cache lines, aligned (16 would straddle lines).
pub(crate) const LEAF_CAP: usize = 15;
/// Children per branch: 31, so that 10,000 locks taken in file order need two branch
/// levels, not three; a branch is sixteen lines, of which a step reads six (the
/// children, the separators).
pub(crate) const BRANCH_CAP: usize = 31;
/// Least entries in a node other than the root: 2, so that an ascending run (locks
/// taken in file order, as lockmany and many databases do) leaves its branches 29/31
/// and its leaves 14/15 full (a leaf split by an append keeps all but one entry: the
/// new key joins that one), which saves memory per lock.
pub(crate) const MIN_ENTRIES: usize = 2;

/// Entries a node of height `h` holds at most.
fn capacity(h: u32) -> usize {
    if h == 0 {
        LEAF_CAP
    } else {
        BRANCH_CAP
    }
}

/// A node index: into `leaves` at height 0, into `branches` above.
type TreeNodeId = u32;
const NO_NODE: TreeNodeId = TreeNodeId::MAX;

type Key = (i64, NodeId);

const _: () = assert!(
    std::mem::size_of::<Branch>() == 1024
        && std::mem::offset_of!(Branch, sep) == 128
        && std::mem::offset_of!(Branch, spill) == 376
);

/// 15 entries and the header make exactly seven cache lines, aligned: the starts (two
/// lines, with the interpolation's slope and the spill bits), the ends with their tags
/// (16 bytes an entry, four to a line; the last line with the write bits and `len`),
/// the ids (one). A test's usual way reads the start lines, the line with `len` and the
/// entry's own line (four lines, three when the entry shares the last), and not the
/// ids; a caller that needs the record reads the id line too.
#[derive(Clone, Debug)]
#[repr(C, align(64))]
pub(crate) struct Leaf {
    start: [i64; LEAF_CAP],
    /// The slope of [`Leaf::guess`], times 2^32 (see [`slope`]; [`LEAF_NO_GUESS`] if
    /// the starts are not evenly spaced): 32 bits, so that it shares the start lines.
    inv: u32,
    /// Bit `k`: entry `k` reaches the next entry's start (`end[k] ≥ start[k + 1]`).
    /// With none of the bits below `k` set, no entry before `k` reaches `start[k]`:
    /// a range starting at or after `start[k]` can overlap only entry `k` among them.
    spill: u32,
    /// Each entry's end and [`Tag`], 16 bytes: four to a line, so a test reads one.
    entry: [LeafEntry; LEAF_CAP],
    /// Bit `k`: entry `k` is a write lock.
    wmask: u32,
    len: u32,
    _pad: [u32; 2],
    id: [NodeId; LEAF_CAP],
    _pad_id: u32,
}

/// What a leaf keeps of a lock beside its start and type, so that a conflict test and
/// `F_GETLK`'s report need no record: the run key of its owner (two granted locks have
/// the same one exactly when they have the same owner, see `index.rs`) and the pid
/// `F_GETLK` reports (`-1` for an OFD lock).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Tag {
    /// The owner's run key (`IndexLinks::seq`).
    pub seq: u32,
    /// `l_pid` as `F_GETLK` reports it.
    pub pid: i32,
}

/// An entry a scan reports: its leaf and slot, read only as far as the caller asks (a
/// test reads the start, end, type and tag; only a caller that needs the record reads
/// the id, on a line of its own).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Found<'a> {
    leaf: &'a Leaf,
    k: usize,
}

impl Found<'_> {
    /// The record.
    pub fn id(self) -> NodeId {
        self.leaf.id[self.k]
    }
    /// The first byte.
    pub fn start(self) -> i64 {
        self.leaf.start[self.k]
    }
    /// The last byte.
    pub fn end(self) -> i64 {
        self.leaf.entry[self.k].end
    }
    /// A write lock.
    pub fn write(self) -> bool {
        self.leaf.wmask & (1 << self.k) != 0
    }
    /// The run key and reported pid.
    pub fn tag(self) -> Tag {
        self.leaf.entry[self.k].tag
    }
}

/// A leaf entry's end and tag, side by side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
struct LeafEntry {
    end: i64,
    tag: Tag,
}

const _: () = assert!(
    std::mem::size_of::<Leaf>() == 448
        && std::mem::size_of::<LeafEntry>() == 16
        && std::mem::offset_of!(Leaf, entry) == 128
        && std::mem::offset_of!(Leaf, wmask) == 368
        && std::mem::offset_of!(Leaf, id) == 384
);

/// 31 children make exactly sixteen cache lines, aligned (the interpolation's slope
/// in the last). The first two lines are
/// `len` and the children: a descent reads `len` as it starts counting the separators
/// (the next four lines), so the line it takes the child from is already on its way —
/// not fetched only once the count is done.
#[derive(Clone, Debug)]
#[repr(C, align(64))]
struct Branch {
    len: u32,
    child: [TreeNodeId; BRANCH_CAP],
    sep: [i64; BRANCH_CAP],
    /// Bit `i`: child `i` reaches the next child's separator (`max_end[i] ≥
    /// sep[i + 1]`); as [`Leaf::spill`], for the children.
    spill: u32,
    max_end: [i64; BRANCH_CAP],
    max_wend: [i64; BRANCH_CAP],
    sep_id: [NodeId; BRANCH_CAP],
    /// The slope of [`Branch::guess`], times 2^64 (see [`slope`]; [`NO_GUESS`] if the
    /// separators are not evenly spaced).
    inv: u64,
    /// Where [`Branch::guess`] counts from: one step below `sep[1]`, where child 0's
    /// keys start in an evenly spaced tree (a key below it takes the count).
    base: i64,
}

/// One entry of a node, for merging and redistributing two siblings.
#[derive(Clone, Copy, Debug)]
enum Item {
    Leaf {
        start: i64,
        end: i64,
        id: NodeId,
        write: bool,
        tag: Tag,
    },
    Branch {
        sep: Key,
        max_end: i64,
        max_wend: i64,
        child: TreeNodeId,
    },
}

const EMPTY_LEAF: Leaf = Leaf {
    len: 0,
    wmask: 0,
    _pad: [0; 2],
    spill: 0,
    start: [PAD_START; LEAF_CAP],
    entry: [PAD_ENTRY; LEAF_CAP],
    inv: 0,
    id: [0; LEAF_CAP],
    _pad_id: 0,
};

/// An unused leaf slot: a start above every key's and an end below every range's, so a
/// pass over all [`LEAF_CAP`] slots counts and reports only the live ones.
const PAD_START: i64 = i64::MAX;
const PAD_END: i64 = i64::MIN;
/// An unused leaf slot's end and tag.
const PAD_ENTRY: LeafEntry = LeafEntry {
    end: PAD_END,
    tag: Tag { seq: 0, pid: 0 },
};

/// Unused branch slots hold separator `i64::MAX` and ends `i64::MIN` (see [`PAD_START`]).
const EMPTY_BRANCH: Branch = Branch {
    len: 0,
    spill: 0,
    sep: [i64::MAX; BRANCH_CAP],
    max_end: [i64::MIN; BRANCH_CAP],
    max_wend: [i64::MIN; BRANCH_CAP],
    sep_id: [0; BRANCH_CAP],
    child: [NO_NODE; BRANCH_CAP],
    inv: 0,
    base: 0,
};

/// A scan's range and kind.
#[derive(Clone, Copy, Debug)]
struct Query {
    qs: i64,
    qe: i64,
    writes_only: bool,
}

/// The tree. Empty: `root == NO_NODE`.
#[derive(Debug)]
pub(crate) struct StartTree {
    leaves: Vec<Leaf>,
    branches: Vec<Branch>,
    free_leaves: Vec<TreeNodeId>,
    free_branches: Vec<TreeNodeId>,
    root: TreeNodeId,
    /// Height of the root: 0 when it is a leaf.
    height: u32,
}

impl Default for StartTree {
    fn default() -> Self {
        StartTree {
            leaves: Vec::new(),
            branches: Vec::new(),
            free_leaves: Vec::new(),
            free_branches: Vec::new(),
            root: NO_NODE,
            height: 0,
        }
    }
}

/// 1 if `s ≤ x`, else 0, given `x1 = x.wrapping_add(1)`, for offsets (`0..=i64::MAX`,
/// which every start, separator and query bound is): the sign bit of `s - (x + 1)`
/// (`x = i64::MAX` wraps to `x1 = i64::MIN`, and every `s - x1` is then negative).
/// Summed over a node's slots it counts without a branch, and without the compiler
/// turning the count into a vector mask and a population count: a load, a subtract, a
/// logical shift and an add per two slots (the sign of `x - s`, shifted arithmetically,
/// took two more: x86-64 has no 64-bit vector arithmetic shift before AVX-512).
#[inline(always)]
fn at_most(s: i64, x1: i64) -> usize {
    debug_assert!(s >= 0, "offset {s}");
    (s.wrapping_sub(x1) as u64 >> 63) as usize
}

/// [`Leaf::inv`] or [`Branch::inv`] of a node whose keys (starts, separators) are the
/// first `n` of `s`: the slope of the line through them, times `one` (2^32 in a leaf,
/// 2^64 in a branch), if they are evenly spaced, `step` bytes apart with `2 ≤ step <
/// max_step`, so that the guess is exact for every bound at or above `s[0]`;
/// [`NO_GUESS`] otherwise (a guess that is often wrong would cost a mispredicted branch
/// per node on irregular locks: those nodes count, as all did before). 0 for one key
/// (the guess is 0).
///
/// The slope is `⌊one / step · (1 + 2^-40)⌋ + 1`: above `one / step`, so that a
/// multiple of the step is never rounded down below its place, and by less than
/// `one / (31 · step²)` (for `step < max_step`: 2^14 in a leaf of 15 entries, 2^24 in a
/// branch of 31 children), so that `step - 1` bytes past it are not rounded up to the
/// next. Computed in floating point (no 128-bit division on an insert).
fn slope(s: &[i64], n: usize, max_step: i64, one: f64) -> u64 {
    if n < 2 {
        return 0;
    }
    // Every step against the first, over all slots with the unused ones masked: no
    // division, no exit that depends on the keys or their number (an insert in the
    // middle of a run, or a leaf of 10 then 11 entries, would mispredict it).
    let step = s[1].wrapping_sub(s[0]);
    let mut uneven = !(2..max_step).contains(&step);
    for k in 1..s.len() {
        uneven |= (k < n) & (s[k].wrapping_sub(s[k - 1]) != step);
    }
    if uneven {
        return NO_GUESS;
    }
    (one / step as f64 * (1.0 + 1.0 / (1u64 << 40) as f64)) as u64 + 1
}

/// [`Branch::inv`] of a node whose keys are not evenly spaced: no guess, the count.
const NO_GUESS: u64 = u64::MAX;
/// [`Leaf::inv`] of a leaf whose starts are not evenly spaced (a real slope is at most
/// 2^31 + 1).
const LEAF_NO_GUESS: u32 = u32::MAX;

/// Grows `v` by an eighth at a time (as the record arena does), so a large index
/// wastes little on spare capacity.
fn push_slot<T>(v: &mut Vec<T>, x: T) -> TreeNodeId {
    if v.len() == v.capacity() {
        v.reserve_exact((v.len() / 8).max(2));
    }
    v.push(x);
    (v.len() - 1) as TreeNodeId
}

const EMPTY_ITEM: Item = Item::Leaf {
    start: 0,
    end: 0,
    id: 0,
    write: false,
    tag: Tag { seq: 0, pid: 0 },
};

mod nodes;
mod scan;

/// The counts of a step down a node, with AVX2 (see `avx2.rs`).
#[cfg(target_arch = "x86_64")]
mod avx2;

/// Elsewhere than x86-64: never detected, the portable counts.
#[cfg(not(target_arch = "x86_64"))]
mod avx2 {
    use super::{Branch, Leaf};

    pub(super) fn detected() -> bool {
        false
    }
    pub(super) unsafe fn count_le(l: &Leaf, x: i64) -> usize {
        l.count_le(x)
    }
    pub(super) unsafe fn find_le(br: &Branch, x: i64) -> usize {
        br.find_le(x)
    }
}

#[cfg(test)]
mod tests;

impl StartTree {
    fn new_leaf(&mut self) -> TreeNodeId {
        match self.free_leaves.pop() {
            Some(b) => {
                self.leaves[b as usize] = EMPTY_LEAF;
                b
            }
            None => push_slot(&mut self.leaves, EMPTY_LEAF),
        }
    }

    fn new_branch(&mut self) -> TreeNodeId {
        match self.free_branches.pop() {
            Some(b) => {
                self.branches[b as usize] = EMPTY_BRANCH;
                b
            }
            None => push_slot(&mut self.branches, EMPTY_BRANCH),
        }
    }

    fn len_of(&self, b: TreeNodeId, h: u32) -> usize {
        if h == 0 {
            self.leaves[b as usize].len as usize
        } else {
            self.branches[b as usize].len as usize
        }
    }

    fn summary_of(&self, b: TreeNodeId, h: u32) -> (i64, i64) {
        if h == 0 {
            self.leaves[b as usize].summary()
        } else {
            self.branches[b as usize].summary()
        }
    }

    fn item_of(&self, b: TreeNodeId, h: u32, k: usize) -> Item {
        if h == 0 {
            self.leaves[b as usize].item(k)
        } else {
            self.branches[b as usize].item(k)
        }
    }

    /// The separator to file node `b` under: its least key (a leaf) or its own `sep[0]`.
    fn lower_bound(&self, b: TreeNodeId, h: u32) -> Key {
        if h == 0 {
            self.leaves[b as usize].key(0)
        } else {
            self.branches[b as usize].key(0)
        }
    }

    /// Writes `items` into node `b` (of height `h`) as its whole content.
    fn fill(&mut self, b: TreeNodeId, h: u32, items: &[Item]) {
        if h == 0 {
            let l = &mut self.leaves[b as usize];
            l.wmask = 0;
            for (k, &it) in items.iter().enumerate() {
                l.set(k, it);
            }
            l.truncate(items.len());
        } else {
            let br = &mut self.branches[b as usize];
            for (k, &it) in items.iter().enumerate() {
                br.set(k, it);
            }
            br.truncate(items.len());
        }
    }

    fn free(&mut self, b: TreeNodeId, h: u32) {
        if h == 0 {
            self.free_leaves.push(b);
        } else {
            self.free_branches.push(b);
        }
    }

    /// Splits full child `i` of branch `p` (child height `h`) in two: in the middle, or,
    /// if `key` goes after all of it, leaving [`MIN_ENTRIES`] entries on the right, for a leaf
    /// one and the key, which the insert puts there next (so an ascending run fills its
    /// branches to `BRANCH_CAP - MIN_ENTRIES` and its leaves to `LEAF_CAP - 1`).
    fn split_child(&mut self, p: TreeNodeId, i: usize, h: u32, key: Key) {
        let c = self.branches[p as usize].child[i];
        let cap = capacity(h);
        let appending = if h == 0 {
            self.leaves[c as usize].key(cap - 1) < key
        } else {
            self.branches[c as usize].key(cap - 1) <= key
        };
        let mid = match (appending, h) {
            (true, 0) => cap - MIN_ENTRIES + 1,
            (true, _) => cap - MIN_ENTRIES,
            (false, _) => cap / 2,
        };
        let mut items = [EMPTY_ITEM; BRANCH_CAP];
        for (k, it) in items.iter_mut().enumerate().take(cap).skip(mid) {
            *it = self.item_of(c, h, k);
        }
        let r = if h == 0 {
            self.new_leaf()
        } else {
            self.new_branch()
        };
        self.fill(r, h, &items[mid..cap]);
        if h == 0 {
            self.leaves[c as usize].truncate(mid);
        } else {
            self.branches[c as usize].truncate(mid);
        }
        let (le, lwe) = self.summary_of(c, h);
        let (re, rwe) = self.summary_of(r, h);
        let sep = self.lower_bound(r, h);
        let pb = &mut self.branches[p as usize];
        pb.max_end[i] = le;
        pb.max_wend[i] = lwe;
        pb.insert(
            i + 1,
            Item::Branch {
                sep,
                max_end: re,
                max_wend: rwe,
                child: r,
            },
        );
    }

    /// Adds an entry.
    pub fn insert(&mut self, start: i64, end: i64, id: NodeId, write: bool, tag: Tag, cost: &mut SearchCost) {
        let key = (start, id);
        let item = Item::Leaf {
            start,
            end,
            id,
            write,
            tag,
        };
        if self.root == NO_NODE {
            self.root = self.new_leaf();
            self.height = 0;
        }
        if self.len_of(self.root, self.height) == capacity(self.height) {
            // A new root above the full one, which then splits under it.
            let (e, we) = self.summary_of(self.root, self.height);
            let nr = self.new_branch();
            self.branches[nr as usize].insert(
                0,
                Item::Branch {
                    sep: (i64::MIN, 0),
                    max_end: e,
                    max_wend: we,
                    child: self.root,
                },
            );
            self.root = nr;
            self.height += 1;
            self.split_child(nr, 0, self.height - 1, key);
        }
        let (mut b, mut h) = (self.root, self.height);
        while h > 0 {
            cost.nodes += 1;
            let mut i = self.branches[b as usize].find(key);
            let c = self.branches[b as usize].child[i];
            if self.len_of(c, h - 1) == capacity(h - 1) {
                self.split_child(b, i, h - 1, key);
                if self.branches[b as usize].key(i + 1) <= key {
                    i += 1;
                }
            }
            let br = &mut self.branches[b as usize];
            br.max_end[i] = br.max_end[i].max(end);
            if write {
                br.max_wend[i] = br.max_wend[i].max(end);
            }
            br.refresh(i);
            b = br.child[i];
            h -= 1;
        }
        cost.nodes += 1;
        let l = &mut self.leaves[b as usize];
        let pos = l.rank(key);
        l.insert(pos, item);
    }

    /// Takes out the entry (`start`, `id`).
    pub fn remove(&mut self, start: i64, id: NodeId, cost: &mut SearchCost) {
        let key = (start, id);
        assert!(self.root != NO_NODE, "record {id} is not in the index");
        self.remove_in(self.root, self.height, key, cost);
        let (r, h) = (self.root, self.height);
        if h > 0 && self.branches[r as usize].len == 1 {
            self.root = self.branches[r as usize].child[0];
            self.height -= 1;
            self.free(r, h);
        } else if h == 0 && self.leaves[r as usize].len == 0 {
            self.free(r, 0);
            self.root = NO_NODE;
        }
    }

    /// Removes `key` below node `b`; returns the removed entry's (end, write).
    fn remove_in(&mut self, b: TreeNodeId, h: u32, key: Key, cost: &mut SearchCost) -> (i64, bool) {
        cost.nodes += 1;
        if h == 0 {
            let l = &mut self.leaves[b as usize];
            let pos = l.rank(key);
            assert!(
                pos < l.len as usize && l.key(pos) == key,
                "record {} is not in the index",
                key.1
            );
            let gone = (l.entry[pos].end, l.wmask & (1 << pos) != 0);
            l.remove(pos);
            return gone;
        }
        let i = self.branches[b as usize].find(key);
        let c = self.branches[b as usize].child[i];
        let (end, write) = self.remove_in(c, h - 1, key, cost);
        let n = self.branches[b as usize].len as usize;
        let under = self.len_of(c, h - 1) < MIN_ENTRIES && n > 1;
        let br = &self.branches[b as usize];
        // The child's summary changes only if the entry gone was its greatest end.
        if !under && (end == br.max_end[i] || (write && end == br.max_wend[i])) {
            let (e, we) = self.summary_of(c, h - 1);
            let br = &mut self.branches[b as usize];
            br.max_end[i] = e;
            br.max_wend[i] = we;
            br.refresh(i);
        }
        if under {
            let j = if i + 1 < n { i } else { i - 1 };
            self.rebalance(b, j, h - 1);
        }
        (end, write)
    }

    /// Merges children `j` and `j + 1` of branch `p` (height `h`), or, if they do not
    /// fit in one node, shares their entries evenly between them.
    fn rebalance(&mut self, p: TreeNodeId, j: usize, h: u32) {
        let (a, c) = {
            let pb = &self.branches[p as usize];
            (pb.child[j], pb.child[j + 1])
        };
        let (na, nc) = (self.len_of(a, h), self.len_of(c, h));
        let mut items = [EMPTY_ITEM; 2 * BRANCH_CAP];
        for (k, it) in items.iter_mut().enumerate().take(na) {
            *it = self.item_of(a, h, k);
        }
        for k in 0..nc {
            items[na + k] = self.item_of(c, h, k);
        }
        let total = na + nc;
        if total <= capacity(h) {
            self.fill(a, h, &items[..total]);
            self.free(c, h);
            let (e, we) = self.summary_of(a, h);
            let pb = &mut self.branches[p as usize];
            pb.remove(j + 1);
            pb.max_end[j] = e;
            pb.max_wend[j] = we;
            pb.fix_spill();
        } else {
            let half = total / 2;
            self.fill(a, h, &items[..half]);
            self.fill(c, h, &items[half..total]);
            let (ae, awe) = self.summary_of(a, h);
            let (ce, cwe) = self.summary_of(c, h);
            let sep = self.lower_bound(c, h);
            let pb = &mut self.branches[p as usize];
            pb.max_end[j] = ae;
            pb.max_wend[j] = awe;
            pb.max_end[j + 1] = ce;
            pb.max_wend[j + 1] = cwe;
            (pb.sep[j + 1], pb.sep_id[j + 1]) = sep;
            pb.fix_spill();
        }
    }

    /// Replaces every entry's run key `s` by `f(s)` (when the run keys are renumbered:
    /// once per 2^32 runs started). Goes over every leaf, those on the free list too
    /// (their entries are cleared before reuse).
    pub fn renumber(&mut self, f: impl Fn(u32) -> u32) {
        for l in &mut self.leaves {
            for e in &mut l.entry[..l.len as usize] {
                e.tag.seq = f(e.tag.seq);
            }
        }
    }

    /// Bytes held by the tree's buffers, at their capacity.
    pub fn memory(&self) -> usize {
        use std::mem::size_of;
        self.leaves.capacity() * size_of::<Leaf>()
            + self.branches.capacity() * size_of::<Branch>()
            + (self.free_leaves.capacity() + self.free_branches.capacity()) * size_of::<TreeNodeId>()
    }

    /// Checks the invariants in the module docs; returns every entry as (start, end,
    /// id, write, tag), in key order (tests).
    #[cfg(test)]
    pub fn check(&self) -> Vec<(i64, i64, NodeId, bool, Tag)> {
        let mut out = Vec::new();
        if self.root != NO_NODE {
            self.check_in(self.root, self.height, true, (i64::MIN, 0), None, &mut out);
        }
        assert!(
            out.windows(2).all(|p| (p[0].0, p[0].2) < (p[1].0, p[1].2)),
            "keys sorted"
        );
        out
    }

    #[cfg(test)]
    fn check_in(
        &self,
        b: TreeNodeId,
        h: u32,
        root: bool,
        lo: Key,
        hi: Option<Key>,
        out: &mut Vec<(i64, i64, NodeId, bool, Tag)>,
    ) -> (i64, i64) {
        let n = self.len_of(b, h);
        assert!(
            n <= capacity(h) && (root || n >= MIN_ENTRIES),
            "node {b} at height {h} holds {n}"
        );
        assert!(n >= 1 || (root && h == 0), "empty node {b}");
        if h == 0 {
            let l = &self.leaves[b as usize];
            assert_eq!(l.wmask >> n, 0, "write bits past the end of leaf {b}");
            assert!(
                l.start[n..].iter().all(|&s| s == PAD_START) && l.entry[n..].iter().all(|&e| e == PAD_ENTRY),
                "padding of leaf {b}"
            );
            let mut fixed = l.clone();
            fixed.fix_spill();
            assert_eq!(l.spill, fixed.spill, "spill bits of leaf {b}");
            assert_eq!(l.inv, fixed.inv, "guess slope of leaf {b}");
            for k in 0..n {
                let key = l.key(k);
                assert!(
                    key >= lo && hi.is_none_or(|hi| key < hi),
                    "leaf key {key:?} out of range"
                );
                out.push((
                    l.start[k],
                    l.entry[k].end,
                    l.id[k],
                    l.wmask & (1 << k) != 0,
                    l.entry[k].tag,
                ));
            }
            return l.summary();
        }
        let br = &self.branches[b as usize];
        assert!(
            (n..BRANCH_CAP)
                .all(|i| br.sep[i] == i64::MAX && br.max_end[i] == i64::MIN && br.max_wend[i] == i64::MIN),
            "padding of branch {b}"
        );
        let mut fixed = br.clone();
        fixed.fix_spill();
        assert_eq!(br.spill, fixed.spill, "spill bits of branch {b}");
        assert_eq!(
            (br.inv, br.base),
            (fixed.inv, fixed.base),
            "guess slope of branch {b}"
        );
        let (mut e, mut we) = (i64::MIN, i64::MIN);
        for i in 0..n {
            let clo = if i == 0 { lo } else { br.key(i) };
            let chi = if i + 1 < n { Some(br.key(i + 1)) } else { hi };
            if i > 0 {
                assert!(br.key(i) > br.key(i - 1).max(lo), "separators of {b}");
                if h > 1 {
                    let c = &self.branches[br.child[i] as usize];
                    assert_eq!(c.key(0), br.key(i), "branch filed under its own first separator");
                }
            }
            let (ce, cwe) = self.check_in(br.child[i], h - 1, false, clo, chi, out);
            assert_eq!(
                (br.max_end[i], br.max_wend[i]),
                (ce, cwe),
                "augmentation of {b}[{i}]"
            );
            e = e.max(ce);
            we = we.max(cwe);
        }
        (e, we)
    }
}
