//! The by-start half of the index: a B+ tree over (`start`, id) of the granted POSIX and
//! OFD locks, augmented with the greatest `end` (over all locks and over write locks)
//! of every child subtree — an interval tree with wide nodes.
//!
//! Leaves hold up to [`CAP`] entries and branches [`BCAP`] children, in arrays of their
//! own (a leaf's starts together, ends with tags together, a branch's separators
//! together, ends together), apart from the lock records: a descent over 10,000 locks
//! touches three nodes, whose upper levels stay in cache. A leaf entry carries what a
//! conflict test and `F_GETLK` need of the lock (end, type, the owner's run key and the
//! reported pid: [`Tag`]), and a scan reports it as a [`Found`] (the leaf and slot), so
//! the arena record is read only by a caller that needs it (by [`Found::id`]).
//!
//! A step down a node has no data-dependent exit: it counts the starts (separators) at
//! or below the bound over all slots, unused ones padded (start `i64::MAX`, end
//! `i64::MIN`), so a random key's place costs no mispredicted branch. Where the CPU has
//! AVX2 (detected at run time), a scan counts with it: four signed compares a vector,
//! packed to one mask and counted with `popcnt` — a shorter step than the portable
//! sum, since a descent is a chain of counts each waiting for the one before (lockmany's
//! test ~7 ns faster than with the compiler's vectorized sum, at 10 held and at
//! 10,000). A scan then needs
//! only the last counted entry (child) when the range starts at or after its start and
//! none before it spills over its successor's start — each node keeps that as a bitmask
//! (`spill`); otherwise (overlapping locks, a long range) it takes the exact mask of
//! candidates. Both give the same entries; the fast way is the usual one for small
//! ranges among disjoint locks (lockmany's test at 10,000 held: 693 -> 594
//! instructions, 5.8 -> 5.6 L1 misses, 5.75 -> 1.5 mispredicts in cachegrind's model,
//! ~72 -> ~47 ns); the exact mask is out of line, so the usual way keeps its values in
//! registers. The usual way reads no child's greatest end (lines of their own) and does
//! not test a leaf entry's end: a leaf reports its one candidate, and the caller tests
//! the overlap with the entry's end, on the line of its tag. That line is prefetched as
//! the leaf's starts are read (the entry is known only once they are): it is not a
//! second dependent miss, which the record read after the leaf was (lockmany's test at
//! 10,000 held ~46 -> ~40 ns).
//!
//! **Interpolation.** A descent is a chain of such counts, each waiting for the one
//! before (a vector load, compares, a mask, `popcnt`, then the child's id: ~10 ns a
//! branch level here). A node whose keys (a leaf's starts, a branch's separators
//! `sep[1..]`) are evenly spaced, `step` bytes apart (`2 ≤ step < 2^14` in a leaf,
//! `< 2^24` in a branch: locks on fixed-size records, pages, hash chains, reader slots,
//! lockmany's bytes `2i`), keeps the slope of the line through them (`inv`, about
//! `2^32 / step` in a leaf, on the start lines, `2^64 / step` in a branch, recomputed
//! with `spill` whenever its keys change); a step down it is then a subtract, a
//! multiply and the child's id, and the count is not needed: the guess `g` is exact
//! for every bound at or above the first key. The guess is still checked (`sep[g] ≤ qs` and
//! `qe < sep[g + 1]`, with the `spill` bits, which is exactly the usual way's condition
//! for child `g`), but as a branch the CPU predicts, so the next node's lines are
//! fetched before the check is done: the check leaves the dependent chain. A guess that
//! fails (a bound below the first key, a long range) takes the count. A node whose keys
//! are not evenly spaced keeps `inv` = [`NO_GUESS`] and counts, as before: guessing
//! there would cost a mispredicted branch per node (an interpolation on irregular keys
//! measured ~4 ns slower at 10 held). lockmany's test at 10,000 held: ~61 -> ~46-48 ns
//! (probe minima), ~43 -> ~33 with its lines in cache (`LOCKMANY_SPREAD=8`); 511 -> 456
//! instructions, L1 misses 5.0 either way; a set+unset pair +230-280 instructions (the
//! evenness check on each leaf change).
//!
//! Invariants (checked by [`StartTree::check`]):
//! * every leaf is at the same depth; every node but the root holds at least [`MIN`]
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
use crate::index::Work;

/// Entries per node: 15, so a leaf (starts, ends with tags, ids, header) is exactly seven
/// cache lines, aligned (16 entries made a 328-byte leaf of starts, ends and ids
/// straddling lines; at 10,000 locks the test's L1 misses went from 8.0 to 6.7).
pub(crate) const CAP: usize = 15;
/// Children per branch: 31, so that 10,000 locks taken in file order need two branch
/// levels, not three (29^2 leaves of 14); a branch is sixteen lines, of which a step
/// reads six (the children, the separators).
pub(crate) const BCAP: usize = 31;
/// Least entries in a node other than the root: 2, so that an ascending run (locks
/// taken in file order, as lockmany and many databases do) leaves its branches 29/31
/// and its leaves 14/15 full (a leaf split by an append keeps all but one entry: the
/// new key joins that one). With 3 and 12/15: at 10,000 locks 8% more leaves, memory
/// per lock 117.4 -> 113.6 B with 320-byte leaves at 13/15; with the tags (448-byte
/// leaves) 14/15 instead of 13/15 saves 2.5 B per lock.
pub(crate) const MIN: usize = 2;

/// Entries a node of height `h` holds at most.
fn cap(h: u32) -> usize {
    if h == 0 {
        CAP
    } else {
        BCAP
    }
}

/// A node index: into `leaves` at height 0, into `branches` above.
type BId = u32;
const NONE: BId = BId::MAX;

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
    start: [i64; CAP],
    /// The slope of [`Leaf::guess`], times 2^32 (see [`slope`]; [`LEAF_NO_GUESS`] if
    /// the starts are not evenly spaced): 32 bits, so that it shares the start lines.
    inv: u32,
    /// Bit `k`: entry `k` reaches the next entry's start (`end[k] ≥ start[k + 1]`).
    /// With none of the bits below `k` set, no entry before `k` reaches `start[k]`:
    /// a range starting at or after `start[k]` can overlap only entry `k` among them.
    spill: u32,
    /// Each entry's end and [`Tag`], 16 bytes: four to a line, so a test reads one.
    ent: [Ent; CAP],
    /// Bit `k`: entry `k` is a write lock.
    wmask: u32,
    len: u32,
    _pad: [u32; 2],
    id: [NodeId; CAP],
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
        self.leaf.ent[self.k].end
    }
    /// A write lock.
    pub fn write(self) -> bool {
        self.leaf.wmask & (1 << self.k) != 0
    }
    /// The run key and reported pid.
    pub fn tag(self) -> Tag {
        self.leaf.ent[self.k].tag
    }
}

/// A leaf entry's end and tag, side by side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
struct Ent {
    end: i64,
    tag: Tag,
}

const _: () = assert!(
    std::mem::size_of::<Leaf>() == 448
        && std::mem::size_of::<Ent>() == 16
        && std::mem::offset_of!(Leaf, ent) == 128
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
    child: [BId; BCAP],
    sep: [i64; BCAP],
    /// Bit `i`: child `i` reaches the next child's separator (`max_end[i] ≥
    /// sep[i + 1]`); as [`Leaf::spill`], for the children.
    spill: u32,
    max_end: [i64; BCAP],
    max_wend: [i64; BCAP],
    sep_id: [NodeId; BCAP],
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
        child: BId,
    },
}

const EMPTY_LEAF: Leaf = Leaf {
    len: 0,
    wmask: 0,
    _pad: [0; 2],
    spill: 0,
    start: [PAD_START; CAP],
    ent: [PAD_ENT; CAP],
    inv: 0,
    id: [0; CAP],
    _pad_id: 0,
};

/// An unused leaf slot: a start above every key's and an end below every range's, so a
/// pass over all [`CAP`] slots counts and reports only the live ones.
const PAD_START: i64 = i64::MAX;
const PAD_END: i64 = i64::MIN;
/// An unused leaf slot's end and tag.
const PAD_ENT: Ent = Ent {
    end: PAD_END,
    tag: Tag { seq: 0, pid: 0 },
};

/// Unused branch slots hold separator `i64::MAX` and ends `i64::MIN` (see [`PAD_START`]).
const EMPTY_BRANCH: Branch = Branch {
    len: 0,
    spill: 0,
    sep: [i64::MAX; BCAP],
    max_end: [i64::MIN; BCAP],
    max_wend: [i64::MIN; BCAP],
    sep_id: [0; BCAP],
    child: [NONE; BCAP],
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

/// The tree. Empty: `root == NONE`.
#[derive(Debug)]
pub(crate) struct StartTree {
    leaves: Vec<Leaf>,
    branches: Vec<Branch>,
    free_leaves: Vec<BId>,
    free_branches: Vec<BId>,
    root: BId,
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
            root: NONE,
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
fn push_slot<T>(v: &mut Vec<T>, x: T) -> BId {
    if v.len() == v.capacity() {
        v.reserve_exact((v.len() / 8).max(2));
    }
    v.push(x);
    (v.len() - 1) as BId
}

impl Leaf {
    fn key(&self, k: usize) -> Key {
        (self.start[k], self.id[k])
    }
    fn summary(&self) -> (i64, i64) {
        let (mut e, mut we) = (i64::MIN, i64::MIN);
        for k in 0..self.len as usize {
            e = e.max(self.ent[k].end);
            if self.wmask & (1 << k) != 0 {
                we = we.max(self.ent[k].end);
            }
        }
        (e, we)
    }
    fn item(&self, k: usize) -> Item {
        Item::Leaf {
            start: self.start[k],
            end: self.ent[k].end,
            id: self.id[k],
            write: self.wmask & (1 << k) != 0,
            tag: self.ent[k].tag,
        }
    }
    fn set(&mut self, k: usize, it: Item) {
        let Item::Leaf {
            start,
            end,
            id,
            write,
            tag,
        } = it
        else {
            unreachable!("a branch entry in a leaf")
        };
        self.start[k] = start;
        self.ent[k] = Ent { end, tag };
        self.id[k] = id;
        self.wmask = (self.wmask & !(1 << k)) | ((write as u32) << k);
    }
    /// Inserts `it` at `pos`, shifting the entries after it (the leaf is not full).
    fn insert(&mut self, pos: usize, it: Item) {
        let len = self.len as usize;
        debug_assert!(len < CAP);
        self.start.copy_within(pos..len, pos + 1);
        self.ent.copy_within(pos..len, pos + 1);
        self.id.copy_within(pos..len, pos + 1);
        let low = self.wmask & ((1u32 << pos) - 1);
        self.wmask = low | ((self.wmask & !((1u32 << pos) - 1)) << 1);
        let low = self.spill & ((1u32 << pos) - 1);
        self.spill = low | ((self.spill & !((1u32 << pos) - 1)) << 1);
        self.len += 1;
        self.set(pos, it);
        if pos > 0 {
            self.refresh(pos - 1);
        }
        self.refresh(pos);
        self.fix_guess();
    }
    /// Recomputes bit `k` of `spill`.
    #[inline]
    fn refresh(&mut self, k: usize) {
        let on = k + 1 < self.len as usize && self.ent[k].end >= self.start[k + 1];
        self.spill = (self.spill & !(1 << k)) | ((on as u32) << k);
    }
    /// Recomputes `spill` and the guess's slope (after a bulk change).
    fn fix_spill(&mut self) {
        self.spill = 0;
        for k in 0..self.len as usize {
            self.refresh(k);
        }
        self.fix_guess();
    }
    /// Recomputes [`Leaf::inv`] (after a change to the starts).
    fn fix_guess(&mut self) {
        self.inv = match slope(&self.start, self.len as usize, 1 << 14, 4_294_967_296.0) {
            NO_GUESS => LEAF_NO_GUESS,
            v => v as u32,
        };
    }
    /// Where interpolation puts `x` among the starts: the entry `k` with `start[k] ≤ x
    /// < start[k + 1]` when the starts are evenly spaced (a guess otherwise, or if `x`
    /// is below `start[0]`); at most `len - 1`.
    #[inline(always)]
    fn guess(&self, x: i64) -> usize {
        let d = x.wrapping_sub(self.start[0]) as u64;
        (((d as u128 * self.inv as u128) >> 32) as usize).min((self.len as usize).saturating_sub(1))
    }
    /// Whether entry `k`, the last one starting at or before a range `[qs, …]` ends, is
    /// the only candidate: it starts at or before `qs` and no entry before it spills
    /// over its own next start. Bitwise, not short-circuit: one predictable branch.
    #[inline(always)]
    fn sole_from(&self, k: usize, qs: i64) -> bool {
        (self.start[k] <= qs) & (self.spill & ((1u32 << k) - 1) == 0)
    }
    /// Reports entry `k`, the only candidate, unless the scan wants write locks and it is
    /// not one. Not testing the entry's end: `f` does, with its tag.
    #[inline(always)]
    fn report<'a>(&'a self, k: usize, writes_only: bool, w: &mut Work, f: &mut dyn FnMut(Found<'a>)) {
        if !writes_only || self.wmask & (1 << k) != 0 {
            w.checks += 1;
            f(Found { leaf: self, k });
        }
    }
    /// Starts fetching the entries' ends and tags (the lines of [`Leaf::ent`] before
    /// the one with `len`, which the guess reads anyway): the entry a scan reports is
    /// known only once the starts are read, and its line is then on its way, not a
    /// second miss after the leaf's.
    #[inline(always)]
    fn prefetch_ents(&self) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let p = self.ent.as_ptr().cast::<i8>();
            for line in 0..3 {
                // SAFETY: a prefetch reads nothing and faults on nothing; the address
                // is inside the leaf.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * line)) };
            }
        }
    }
    /// The start after entry `k` (`i64::MAX` past the last slot): a guess `k` for `qe`
    /// is right when `qe` is below it.
    #[inline(always)]
    fn start_after(&self, k: usize) -> i64 {
        if k + 1 < CAP {
            self.start[k + 1]
        } else {
            i64::MAX
        }
    }
    /// Entries with a key below `key`: where `key` goes (insert) or is (remove). A
    /// linear search: a count over every slot measured no faster here, where the
    /// conflict scan of the same call has just read the same starts.
    #[inline]
    fn rank(&self, key: Key) -> usize {
        let n = self.len as usize;
        (0..n).find(|&k| self.key(k) >= key).unwrap_or(n)
    }
    /// Entries starting at or before `x`: a count over every slot, no data-dependent
    /// exit.
    #[inline(always)]
    fn count_le(&self, x: i64) -> usize {
        debug_assert!(x >= 0, "offset {x}");
        let x1 = x.wrapping_add(1);
        let mut n = 0;
        for k in 0..CAP {
            n += at_most(self.start[k], x1);
        }
        n.min(self.len as usize)
    }
    /// Bit `k`: entry `k` overlaps `[qs, qe]` (and is a write lock, if `writes_only`);
    /// one pass over every slot, no data-dependent branch. Out of line: the rare way.
    #[cold]
    #[inline(never)]
    fn overlaps(&self, qs: i64, qe: i64, writes_only: bool) -> u32 {
        let mut m = 0u32;
        for k in 0..CAP {
            m |= (((self.start[k] <= qe) & (self.ent[k].end >= qs)) as u32) << k;
        }
        let kind = if writes_only { self.wmask } else { u32::MAX };
        m & kind & ((1u32 << self.len) - 1)
    }
    /// Keeps the first `n` entries; the rest become padding.
    fn truncate(&mut self, n: usize) {
        self.start[n..].fill(PAD_START);
        self.ent[n..].fill(PAD_ENT);
        self.len = n as u32;
        self.wmask &= (1u32 << n) - 1;
        self.fix_spill();
    }
    fn remove(&mut self, pos: usize) {
        let len = self.len as usize;
        self.start.copy_within(pos + 1..len, pos);
        self.ent.copy_within(pos + 1..len, pos);
        self.id.copy_within(pos + 1..len, pos);
        let low = self.wmask & ((1u32 << pos) - 1);
        self.wmask = low | ((self.wmask >> 1) & !((1u32 << pos) - 1));
        let low = self.spill & ((1u32 << pos) - 1);
        self.spill = low | ((self.spill >> 1) & !((1u32 << pos) - 1));
        self.start[len - 1] = PAD_START;
        self.ent[len - 1] = PAD_ENT;
        self.len -= 1;
        self.wmask &= (1u32 << self.len) - 1;
        self.spill &= (1u32 << self.len) - 1;
        if pos > 0 {
            self.refresh(pos - 1);
        }
        self.fix_guess();
    }
}

impl Branch {
    fn key(&self, i: usize) -> Key {
        (self.sep[i], self.sep_id[i])
    }
    fn summary(&self) -> (i64, i64) {
        let n = self.len as usize;
        let e = self.max_end[..n].iter().copied().max().unwrap_or(i64::MIN);
        let we = self.max_wend[..n].iter().copied().max().unwrap_or(i64::MIN);
        (e, we)
    }
    /// The child whose key range holds `key`: counts the separators `sep[1..]` at
    /// or below `key`'s start over every slot (unused ones hold `i64::MAX`), with no
    /// data-dependent exit; only an equal start (rare) needs the ids.
    #[inline]
    fn find(&self, key: Key) -> usize {
        let mut i = self.find_le(key.0);
        while i > 0 && self.key(i) > key {
            i -= 1;
        }
        i
    }
    /// The last child whose separator is at most `x` (child 0's bounds nothing): a
    /// count over every slot, no data-dependent exit.
    #[inline(always)]
    fn find_le(&self, x: i64) -> usize {
        debug_assert!(x >= 0, "offset {x}");
        let x1 = x.wrapping_add(1);
        let mut i = 0;
        for j in 1..BCAP {
            i += at_most(self.sep[j], x1);
        }
        i.min(self.len as usize - 1)
    }
    /// Bit `i`: child `i` may hold an entry overlapping `[qs, qe]` — its separator is
    /// at most `qe` (child 0's always is) and its greatest end (write-lock end, if
    /// `writes_only`) at least `qs`. One pass over every slot, no data-dependent branch;
    /// a small range usually leaves a single bit.
    /// Out of line: the rare way (overlapping locks, a long range), kept from the
    /// descent's registers.
    #[cold]
    #[inline(never)]
    #[allow(clippy::needless_range_loop)]
    fn overlaps(&self, qs: i64, qe: i64, writes_only: bool) -> u32 {
        let reach = if writes_only {
            &self.max_wend
        } else {
            &self.max_end
        };
        let mut m = (reach[0] >= qs) as u32;
        for j in 1..BCAP {
            m |= (((self.sep[j] <= qe) & (reach[j] >= qs)) as u32) << j;
        }
        m & ((1u32 << self.len) - 1)
    }
    fn item(&self, i: usize) -> Item {
        Item::Branch {
            sep: self.key(i),
            max_end: self.max_end[i],
            max_wend: self.max_wend[i],
            child: self.child[i],
        }
    }
    fn set(&mut self, i: usize, it: Item) {
        let Item::Branch {
            sep,
            max_end,
            max_wend,
            child,
        } = it
        else {
            unreachable!("a leaf entry in a branch")
        };
        (self.sep[i], self.sep_id[i]) = sep;
        self.max_end[i] = max_end;
        self.max_wend[i] = max_wend;
        self.child[i] = child;
    }
    fn insert(&mut self, pos: usize, it: Item) {
        let len = self.len as usize;
        debug_assert!(len < BCAP);
        self.sep.copy_within(pos..len, pos + 1);
        self.sep_id.copy_within(pos..len, pos + 1);
        self.max_end.copy_within(pos..len, pos + 1);
        self.max_wend.copy_within(pos..len, pos + 1);
        self.child.copy_within(pos..len, pos + 1);
        self.len += 1;
        self.set(pos, it);
        self.fix_spill();
    }
    /// Recomputes bit `i` of `spill`.
    #[inline]
    fn refresh(&mut self, i: usize) {
        let on = i + 1 < self.len as usize && self.max_end[i] >= self.sep[i + 1];
        self.spill = (self.spill & !(1 << i)) | ((on as u32) << i);
    }
    /// Recomputes `spill` and the guess's slope (after a change to the children or
    /// their separators).
    fn fix_spill(&mut self) {
        self.spill = 0;
        for i in 0..self.len as usize {
            self.refresh(i);
        }
        let inv = slope(
            &self.sep[1..],
            (self.len as usize).saturating_sub(1),
            1 << 24,
            18_446_744_073_709_551_616.0,
        );
        let step = self.sep[2].wrapping_sub(self.sep[1]);
        (self.inv, self.base) = match self.len {
            0 | 1 => (0, 0),
            // One separator: any step does; 2^62 puts every key (at least 0) at or above
            // the base.
            2 => (4, self.sep[1].wrapping_sub(1 << 62)),
            _ if inv == NO_GUESS => (NO_GUESS, 0),
            _ => (inv, self.sep[1].wrapping_sub(step)),
        };
    }
    /// Where interpolation puts `x` among the children: the child `i` with `sep[i] ≤
    /// x < sep[i + 1]` when the separators `sep[1..len]` are evenly spaced and `x` is
    /// at or above `base` (a guess otherwise); at most `len - 1`. Counting from one
    /// step below `sep[1]` needs no `+ 1` and no test of the sign (two steps fewer in
    /// the descent's chain).
    #[inline(always)]
    fn guess(&self, x: i64) -> usize {
        let d = x.wrapping_sub(self.base) as u64;
        (((d as u128 * self.inv as u128) >> 64) as usize).min(self.len as usize - 1)
    }
    /// Whether child `i`, the last one whose separator is at or before a range's end, is
    /// the only candidate: the range starts at or after its separator (child 0 bounds
    /// nothing) and no child before it spills over its own next separator. Bitwise, not
    /// short-circuit: `i == 0` is a data-dependent branch (taken at random, one step in
    /// 13), the whole test a predictable one.
    #[inline(always)]
    fn sole_from(&self, i: usize, qs: i64) -> bool {
        ((i == 0) | (self.sep[i] <= qs)) & (self.spill & ((1u32 << i) - 1) == 0)
    }
    /// The separator after child `i` (`i64::MAX` past the last slot): a guess `i` for
    /// `qe` is right when `qe` is below it.
    #[inline(always)]
    fn sep_after(&self, i: usize) -> i64 {
        if i + 1 < BCAP {
            self.sep[i + 1]
        } else {
            i64::MAX
        }
    }
    fn remove(&mut self, pos: usize) {
        let len = self.len as usize;
        self.sep.copy_within(pos + 1..len, pos);
        self.sep_id.copy_within(pos + 1..len, pos);
        self.max_end.copy_within(pos + 1..len, pos);
        self.max_wend.copy_within(pos + 1..len, pos);
        self.child.copy_within(pos + 1..len, pos);
        self.sep[len - 1] = i64::MAX;
        self.max_end[len - 1] = i64::MIN;
        self.max_wend[len - 1] = i64::MIN;
        self.len -= 1;
        self.fix_spill();
    }
    /// Keeps the first `n` children; the rest become padding.
    fn truncate(&mut self, n: usize) {
        self.sep[n..].fill(i64::MAX);
        self.max_end[n..].fill(i64::MIN);
        self.max_wend[n..].fill(i64::MIN);
        self.len = n as u32;
        self.fix_spill();
    }
}

impl StartTree {
    fn new_leaf(&mut self) -> BId {
        match self.free_leaves.pop() {
            Some(b) => {
                self.leaves[b as usize] = EMPTY_LEAF;
                b
            }
            None => push_slot(&mut self.leaves, EMPTY_LEAF),
        }
    }

    fn new_branch(&mut self) -> BId {
        match self.free_branches.pop() {
            Some(b) => {
                self.branches[b as usize] = EMPTY_BRANCH;
                b
            }
            None => push_slot(&mut self.branches, EMPTY_BRANCH),
        }
    }

    fn len_of(&self, b: BId, h: u32) -> usize {
        if h == 0 {
            self.leaves[b as usize].len as usize
        } else {
            self.branches[b as usize].len as usize
        }
    }

    fn summary_of(&self, b: BId, h: u32) -> (i64, i64) {
        if h == 0 {
            self.leaves[b as usize].summary()
        } else {
            self.branches[b as usize].summary()
        }
    }

    fn item_of(&self, b: BId, h: u32, k: usize) -> Item {
        if h == 0 {
            self.leaves[b as usize].item(k)
        } else {
            self.branches[b as usize].item(k)
        }
    }

    /// The separator to file node `b` under: its least key (a leaf) or its own `sep[0]`.
    fn lower_bound(&self, b: BId, h: u32) -> Key {
        if h == 0 {
            self.leaves[b as usize].key(0)
        } else {
            self.branches[b as usize].key(0)
        }
    }

    /// Writes `items` into node `b` (of height `h`) as its whole content.
    fn fill(&mut self, b: BId, h: u32, items: &[Item]) {
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

    fn free(&mut self, b: BId, h: u32) {
        if h == 0 {
            self.free_leaves.push(b);
        } else {
            self.free_branches.push(b);
        }
    }

    /// Splits full child `i` of branch `p` (child height `h`) in two: in the middle, or,
    /// if `key` goes after all of it, leaving [`MIN`] entries on the right, for a leaf
    /// one and the key, which the insert puts there next (so an ascending run fills its
    /// branches to `BCAP - MIN` and its leaves to `CAP - 1`).
    fn split_child(&mut self, p: BId, i: usize, h: u32, key: Key) {
        let c = self.branches[p as usize].child[i];
        let cap = cap(h);
        let appending = if h == 0 {
            self.leaves[c as usize].key(cap - 1) < key
        } else {
            self.branches[c as usize].key(cap - 1) <= key
        };
        let mid = match (appending, h) {
            (true, 0) => cap - MIN + 1,
            (true, _) => cap - MIN,
            (false, _) => cap / 2,
        };
        let mut items = [EMPTY_ITEM; BCAP];
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
    pub fn insert(&mut self, start: i64, end: i64, id: NodeId, write: bool, tag: Tag, w: &mut Work) {
        let key = (start, id);
        let item = Item::Leaf {
            start,
            end,
            id,
            write,
            tag,
        };
        if self.root == NONE {
            self.root = self.new_leaf();
            self.height = 0;
        }
        if self.len_of(self.root, self.height) == cap(self.height) {
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
            w.nodes += 1;
            let mut i = self.branches[b as usize].find(key);
            let c = self.branches[b as usize].child[i];
            if self.len_of(c, h - 1) == cap(h - 1) {
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
        w.nodes += 1;
        let l = &mut self.leaves[b as usize];
        let pos = l.rank(key);
        l.insert(pos, item);
    }

    /// Takes out the entry (`start`, `id`).
    pub fn remove(&mut self, start: i64, id: NodeId, w: &mut Work) {
        let key = (start, id);
        assert!(self.root != NONE, "record {id} is not in the index");
        self.remove_in(self.root, self.height, key, w);
        let (r, h) = (self.root, self.height);
        if h > 0 && self.branches[r as usize].len == 1 {
            self.root = self.branches[r as usize].child[0];
            self.height -= 1;
            self.free(r, h);
        } else if h == 0 && self.leaves[r as usize].len == 0 {
            self.free(r, 0);
            self.root = NONE;
        }
    }

    /// Removes `key` below node `b`; returns the removed entry's (end, write).
    fn remove_in(&mut self, b: BId, h: u32, key: Key, w: &mut Work) -> (i64, bool) {
        w.nodes += 1;
        if h == 0 {
            let l = &mut self.leaves[b as usize];
            let pos = l.rank(key);
            assert!(
                pos < l.len as usize && l.key(pos) == key,
                "record {} is not in the index",
                key.1
            );
            let gone = (l.ent[pos].end, l.wmask & (1 << pos) != 0);
            l.remove(pos);
            return gone;
        }
        let i = self.branches[b as usize].find(key);
        let c = self.branches[b as usize].child[i];
        let (end, write) = self.remove_in(c, h - 1, key, w);
        let n = self.branches[b as usize].len as usize;
        let under = self.len_of(c, h - 1) < MIN && n > 1;
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
    fn rebalance(&mut self, p: BId, j: usize, h: u32) {
        let (a, c) = {
            let pb = &self.branches[p as usize];
            (pb.child[j], pb.child[j + 1])
        };
        let (na, nc) = (self.len_of(a, h), self.len_of(c, h));
        let mut items = [EMPTY_ITEM; 2 * BCAP];
        for (k, it) in items.iter_mut().enumerate().take(na) {
            *it = self.item_of(a, h, k);
        }
        for k in 0..nc {
            items[na + k] = self.item_of(c, h, k);
        }
        let total = na + nc;
        if total <= cap(h) {
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

    /// Calls `f` with every entry overlapping `[qs, qe]` (write locks only if
    /// `writes_only`), in (start, id) order — and perhaps with one entry that starts at
    /// or before `qs` and ends before it (the one candidate of a leaf's usual way, whose
    /// end the scan does not test): `f` tests the overlap ([`Found::end`]).
    pub fn scan<'a>(
        &'a self,
        qs: i64,
        qe: i64,
        writes_only: bool,
        w: &mut Work,
        f: &mut dyn FnMut(Found<'a>),
    ) {
        if self.root != NONE {
            let q = Query { qs, qe, writes_only };
            self.scan_in(self.root, self.height, q, w, f);
        }
    }

    /// Scans below node `b` (height `h`): [`StartTree::scan_body`], with the AVX2
    /// counts of [`avx2`] where the CPU has AVX2 and POPCNT (detected once).
    #[inline]
    fn scan_in<'a>(&'a self, b: BId, h: u32, q: Query, w: &mut Work, f: &mut dyn FnMut(Found<'a>)) {
        if avx2::detected() {
            // SAFETY: the CPU has AVX2 and POPCNT, as detected.
            return unsafe { self.scan_avx2(b, h, q, w, f) };
        }
        // SAFETY: the portable counts need nothing of the CPU.
        unsafe { self.scan_base(b, h, q, w, f) }
    }

    /// [`StartTree::scan_body`] with the portable counts; out of line, so that
    /// [`StartTree::scan_in`] stays a test and a jump.
    ///
    /// # Safety
    ///
    /// None needed (`unsafe` only to share [`StartTree::scan_body`]'s signature).
    #[inline(never)]
    unsafe fn scan_base<'a>(&'a self, b: BId, h: u32, q: Query, w: &mut Work, f: &mut dyn FnMut(Found<'a>)) {
        // SAFETY: without AVX2 the body uses only portable code.
        unsafe { self.scan_body::<false>(b, h, q, w, f) }
    }

    /// [`StartTree::scan_body`] with AVX2 counts.
    ///
    /// # Safety
    ///
    /// The CPU must have AVX2 and POPCNT.
    #[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,popcnt"))]
    unsafe fn scan_avx2<'a>(&'a self, b: BId, h: u32, q: Query, w: &mut Work, f: &mut dyn FnMut(Found<'a>)) {
        // SAFETY: the caller's: the CPU has AVX2 and POPCNT.
        unsafe { self.scan_body::<true>(b, h, q, w, f) }
    }

    /// Scans below node `b` (height `h`): descends while a single child may overlap
    /// (the usual case for a small range, a loop with no data-dependent exit), recursing
    /// only into the earlier of several candidates.
    ///
    /// # Safety
    ///
    /// With `AVX2`, the CPU must have AVX2 and POPCNT.
    #[inline(always)]
    unsafe fn scan_body<'a, const AVX2: bool>(
        &'a self,
        b: BId,
        h: u32,
        q: Query,
        w: &mut Work,
        f: &mut dyn FnMut(Found<'a>),
    ) {
        let Query { qs, qe, writes_only } = q;
        let (mut b, mut h) = (b, h);
        while h > 0 {
            w.nodes += 1;
            let br = &self.branches[b as usize];
            if br.inv != NO_GUESS {
                let g = br.guess(qe);
                if (qe < br.sep_after(g)) & br.sole_from(g, qs) {
                    b = br.child[g];
                    h -= 1;
                    continue;
                }
            }
            // The last child with a separator ≤ qe: if the range starts at or after its
            // separator and no child before it spills over its own next separator, it
            // is the only candidate.
            let i = if AVX2 {
                // SAFETY: the caller's (AVX2 only where the CPU has it).
                unsafe { avx2::find_le(br, qe) }
            } else {
                br.find_le(qe)
            };
            if br.sole_from(i, qs) {
                // Not checking the child's greatest end (another line of the node):
                // a child that ends before the range is one path more, its leaf
                // reports nothing.
                b = br.child[i];
                h -= 1;
                continue;
            }
            let mut m = br.overlaps(qs, qe, writes_only);
            while m & m.wrapping_sub(1) != 0 {
                let i = m.trailing_zeros() as usize;
                m &= m - 1;
                self.scan_in(br.child[i], h - 1, q, w, f);
            }
            if m == 0 {
                return;
            }
            b = br.child[m.trailing_zeros() as usize];
            h -= 1;
        }
        w.nodes += 1;
        let l = &self.leaves[b as usize];
        l.prefetch_ents();
        if l.inv != LEAF_NO_GUESS {
            let k = l.guess(qe);
            if (qe < l.start_after(k)) & l.sole_from(k, qs) {
                return l.report(k, writes_only, w, f);
            }
        }
        // As in a branch: the last entry starting at or before qe is usually the only
        // candidate.
        let p = if AVX2 {
            // SAFETY: the caller's (AVX2 only where the CPU has it).
            unsafe { avx2::count_le(l, qe) }
        } else {
            l.count_le(qe)
        };
        if p == 0 {
            return;
        }
        let k = p - 1;
        if l.sole_from(k, qs) {
            return l.report(k, writes_only, w, f);
        }
        let mut m = l.overlaps(qs, qe, writes_only);
        while m != 0 {
            let k = m.trailing_zeros() as usize;
            m &= m - 1;
            w.checks += 1;
            f(Found { leaf: l, k });
        }
    }

    /// Replaces every entry's run key `s` by `f(s)` (when the run keys are renumbered:
    /// once per 2^32 runs started). Goes over every leaf, those on the free list too
    /// (their entries are cleared before reuse).
    pub fn renumber(&mut self, f: impl Fn(u32) -> u32) {
        for l in &mut self.leaves {
            for e in &mut l.ent[..l.len as usize] {
                e.tag.seq = f(e.tag.seq);
            }
        }
    }

    /// Bytes held by the tree's buffers, at their capacity.
    pub fn memory(&self) -> usize {
        use std::mem::size_of;
        self.leaves.capacity() * size_of::<Leaf>()
            + self.branches.capacity() * size_of::<Branch>()
            + (self.free_leaves.capacity() + self.free_branches.capacity()) * size_of::<BId>()
    }

    /// Checks the invariants in the module docs; returns every entry as (start, end,
    /// id, write, tag), in key order (tests).
    #[cfg(test)]
    pub fn check(&self) -> Vec<(i64, i64, NodeId, bool, Tag)> {
        let mut out = Vec::new();
        if self.root != NONE {
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
        b: BId,
        h: u32,
        root: bool,
        lo: Key,
        hi: Option<Key>,
        out: &mut Vec<(i64, i64, NodeId, bool, Tag)>,
    ) -> (i64, i64) {
        let n = self.len_of(b, h);
        assert!(
            n <= cap(h) && (root || n >= MIN),
            "node {b} at height {h} holds {n}"
        );
        assert!(n >= 1 || (root && h == 0), "empty node {b}");
        if h == 0 {
            let l = &self.leaves[b as usize];
            assert_eq!(l.wmask >> n, 0, "write bits past the end of leaf {b}");
            assert!(
                l.start[n..].iter().all(|&s| s == PAD_START) && l.ent[n..].iter().all(|&e| e == PAD_ENT),
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
                    l.ent[k].end,
                    l.id[k],
                    l.wmask & (1 << k) != 0,
                    l.ent[k].tag,
                ));
            }
            return l.summary();
        }
        let br = &self.branches[b as usize];
        assert!(
            (n..BCAP)
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

/// A node's count with AVX2: four slots per signed compare (any bound, and the root's
/// `i64::MIN` separator, compare as they are), four compares' results packed into one
/// byte mask (two pack steps and a `movemask`) and counted (`popcnt`). A shorter chain
/// than the portable sum's reduction across the vector (a descent is a chain of such
/// counts, each waiting for the one before), and fewer instructions. The same counts as
/// [`Leaf::count_le`] and [`Branch::find_le`].
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{Branch, Leaf, BCAP, CAP};

    const _: () = assert!(CAP == 15 && BCAP == 31);

    /// Whether the CPU has AVX2 and POPCNT (std detects once and caches: a load and a
    /// test of its feature word each).
    #[inline]
    pub(super) fn detected() -> bool {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("popcnt")
    }

    /// Lanes: `p[j] > x` (broadcast in `x`), all ones or zero.
    ///
    /// # Safety
    ///
    /// `p[0..4]` must be readable.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn above(p: *const i64, x: __m256i) -> __m256i {
        // SAFETY: the caller's; an unaligned load.
        _mm256_cmpgt_epi64(unsafe { _mm256_loadu_si256(p.cast()) }, x)
    }

    /// The lanes set in four compare results: each 64-bit lane becomes two bytes of
    /// the packed mask (the order does not matter to a count).
    #[target_feature(enable = "avx2,popcnt")]
    #[inline]
    fn count4(a: __m256i, b: __m256i, c: __m256i, d: __m256i) -> usize {
        let ab = _mm256_packs_epi32(a, b);
        let cd = _mm256_packs_epi32(c, d);
        (_mm256_movemask_epi8(_mm256_packs_epi16(ab, cd)) as u32).count_ones() as usize / 2
    }

    /// All lanes but the first: a load of slots `n - 4..n` that overlaps the one
    /// before counts slot `n - 4` once; a branch's first load leaves out `sep[0]`.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn but_first() -> __m256i {
        _mm256_set_epi64x(-1, -1, -1, 0)
    }

    /// The slots of `s` (`N` = 15 or 31) above `x`, leaving out `s[0]` if `skip_first`:
    /// `N / 4` loads of four slots, and one of the last four (its first lane, counted
    /// by the load before, left out), packed four by four.
    ///
    /// # Safety
    ///
    /// The CPU must have AVX2 and POPCNT.
    #[target_feature(enable = "avx2,popcnt")]
    #[inline]
    unsafe fn above_in<const N: usize>(s: &[i64; N], x: i64, skip_first: bool) -> usize {
        const { assert!(N % 4 == 3 && N < 32) };
        let xv = _mm256_set1_epi64x(x);
        let p = s.as_ptr();
        let mut v = [_mm256_setzero_si256(); 8];
        for (k, v) in v.iter_mut().enumerate().take(N / 4) {
            // SAFETY: slots 4k..4k + 4 of the N.
            *v = unsafe { above(p.add(4 * k), xv) };
        }
        // SAFETY: slots N - 4..N.
        v[N / 4] = _mm256_and_si256(unsafe { above(p.add(N - 4), xv) }, but_first());
        if skip_first {
            v[0] = _mm256_and_si256(v[0], but_first());
        }
        let mut n = count4(v[0], v[1], v[2], v[3]);
        if N > 16 {
            n += count4(v[4], v[5], v[6], v[7]);
        }
        n
    }

    /// [`Leaf::count_le`]: the entries starting at or before `x`.
    ///
    /// # Safety
    ///
    /// The CPU must have AVX2 and POPCNT.
    #[target_feature(enable = "avx2,popcnt")]
    #[inline]
    pub(super) unsafe fn count_le(l: &Leaf, x: i64) -> usize {
        // SAFETY: the caller's.
        let n = CAP - unsafe { above_in(&l.start, x, false) };
        if x == i64::MAX {
            return clamp_to(n, l.len as usize);
        }
        n
    }

    /// `n.min(len)`: a count that took padding for entries, which only `i64::MAX`, the
    /// greatest bound, can be (a padded slot holds it too). Any other bound counts no
    /// padding, so the usual way skips this step of the chain (a predictable branch
    /// instead of a compare-and-move on the count).
    #[cold]
    #[inline(never)]
    fn clamp_to(n: usize, len: usize) -> usize {
        n.min(len)
    }

    /// [`Branch::find_le`]: the last child whose separator is at most `x`: the
    /// separators `sep[1..]` at most `x`, no more than `len - 1` unless `x` is
    /// `i64::MAX` (see [`clamp_to`]).
    ///
    /// # Safety
    ///
    /// The CPU must have AVX2 and POPCNT.
    #[target_feature(enable = "avx2,popcnt")]
    #[inline]
    pub(super) unsafe fn find_le(br: &Branch, x: i64) -> usize {
        // SAFETY: the caller's.
        let above = unsafe { above_in(&br.sep, x, true) };
        let i = BCAP - 1 - above;
        if x == i64::MAX {
            return clamp_to(i, br.len as usize - 1);
        }
        i
    }
}

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

const EMPTY_ITEM: Item = Item::Leaf {
    start: 0,
    end: 0,
    id: 0,
    write: false,
    tag: Tag { seq: 0, pid: 0 },
};

#[cfg(test)]
mod tests {
    //! The tree against a plain sorted set: random inserts and removals (ascending runs,
    //! descending runs and random keys, growing to thousands of entries and shrinking
    //! back to none), with the invariants checked and random overlap scans compared.

    use std::collections::BTreeMap;

    use super::*;

    /// The tag the tests give entry `id` (checked wherever an entry is reported).
    fn tag(id: NodeId) -> Tag {
        Tag {
            seq: id ^ 0x5a5a,
            pid: !(id as i32),
        }
    }

    /// The entries a scan reports, candidates included. The portable scan reports
    /// exactly what the one `scan` dispatched to does (the AVX2 one, on a CPU with it).
    fn scan_raw(t: &StartTree, qs: i64, qe: i64, wo: bool) -> Vec<NodeId> {
        let mut got = Vec::new();
        t.scan(qs, qe, wo, &mut Work::default(), &mut |e| {
            assert_eq!(e.tag(), tag(e.id()), "the tag of {}", e.id());
            got.push(e.id())
        });
        let mut portable = Vec::new();
        if t.root != NONE {
            let q = Query {
                qs,
                qe,
                writes_only: wo,
            };
            // SAFETY: the portable body needs nothing of the CPU.
            unsafe {
                t.scan_base(t.root, t.height, q, &mut Work::default(), &mut |e| {
                    portable.push(e.id())
                })
            };
        }
        assert_eq!(got, portable, "portable scan [{qs}, {qe}] writes {wo}");
        got
    }

    /// The entries a scan reports, less those `f` finds not to overlap (by `ends`).
    fn scan_all(t: &StartTree, qs: i64, qe: i64, wo: bool, ends: &BTreeMap<NodeId, i64>) -> Vec<NodeId> {
        let mut got = scan_raw(t, qs, qe, wo);
        got.retain(|id| ends[id] >= qs);
        got
    }

    #[test]
    fn matches_a_sorted_set_through_growth_and_shrinkage() {
        let mut t = StartTree::default();
        let mut model: BTreeMap<(i64, NodeId), (i64, bool)> = BTreeMap::new();
        let mut x = 0x2545F4914F6CDD1Du64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut next_id: NodeId = 0;
        let w = &mut Work::default();
        for phase in 0..8u64 {
            let target = [3000, 0, 500, 2000, 10, 4000, 0, 100][phase as usize];
            let mut steps = 0;
            while model.len() != target && steps < 20_000 {
                steps += 1;
                let grow = model.len() < target;
                if grow {
                    let start = match phase % 3 {
                        _ if rnd() % 200 == 0 => i64::MAX - (rnd() % 3) as i64,
                        // Evenly spaced runs (guessed) as well as irregular keys.
                        0 => 2 * next_id as i64,
                        1 => 1_000_000 - 3 * next_id as i64,
                        _ => (rnd() % 5000) as i64,
                    };
                    let end = if rnd() % 100 == 0 {
                        i64::MAX // to the end of the file
                    } else {
                        start.saturating_add((rnd() % 4) as i64 * if rnd() % 50 == 0 { 1000 } else { 1 })
                    };
                    let write = rnd() % 3 != 0;
                    t.insert(start, end, next_id, write, tag(next_id), w);
                    model.insert((start, next_id), (end, write));
                    next_id += 1;
                } else {
                    let k = (rnd() % model.len() as u64) as usize;
                    let key = *model.keys().nth(k).unwrap();
                    t.remove(key.0, key.1, w);
                    model.remove(&key);
                }
                if steps % 97 == 0 || model.len() == target {
                    let all = t.check();
                    let want: Vec<_> = model
                        .iter()
                        .map(|(&(s, id), &(e, wr))| (s, e, id, wr, tag(id)))
                        .collect();
                    assert_eq!(all, want, "phase {phase} step {steps}");
                    for _ in 0..4 {
                        let qs = (rnd() % 6000) as i64;
                        let qe = match rnd() % 10 {
                            0 => i64::MAX,
                            1 => qs,
                            _ => qs + (rnd() % 20) as i64,
                        };
                        let wo = rnd() % 2 == 0;
                        let want: Vec<NodeId> = model
                            .iter()
                            .filter(|(&(s, _), &(e, wr))| s <= qe && e >= qs && (!wo || wr))
                            .map(|(&(_, id), _)| id)
                            .collect();
                        let ends = model.iter().map(|(&(_, id), &(e, _))| (id, e)).collect();
                        assert_eq!(
                            scan_all(&t, qs, qe, wo, &ends),
                            want,
                            "scan [{qs}, {qe}] writes {wo}"
                        );
                    }
                }
            }
            assert_eq!(model.len(), target);
        }
        assert!(t.height <= 3);
    }

    #[test]
    fn an_ascending_run_fills_its_leaves() {
        let mut t = StartTree::default();
        let w = &mut Work::default();
        for i in 0..10_000u32 {
            t.insert(2 * i as i64, 2 * i as i64, i, true, tag(i), w);
        }
        t.check();
        let per = t.memory() as f64 / 10_000.0;
        // 448-byte leaves 14/15 full, an eighth of spare capacity, the branches: 37.8.
        assert!(per < 39.0, "{per} bytes per entry");
        let live = t.leaves.len() - t.free_leaves.len();
        assert_eq!(live, 10_000usize.div_ceil(14), "leaves of 14");
        assert_eq!(t.height, 2, "three levels: 29^2 leaves of 14 > 10,000");
    }

    /// Evenly spaced starts (lockmany's, a table of fixed-size records) are guessed
    /// exactly at every node: the count is never needed. Irregular ones are not guessed.
    #[test]
    fn evenly_spaced_starts_are_guessed_exactly() {
        // Up to 16,000 bytes apart (a leaf guesses below 2^14): the root's separators
        // are then 406 steps (29 leaves of 14) apart, below 2^24.
        for step in [2i64, 3, 4096, 16_000] {
            let mut t = StartTree::default();
            let w = &mut Work::default();
            for i in 0..10_000u32 {
                t.insert(step * i as i64, step * i as i64, i, true, tag(i), w);
            }
            for q in (0..10_000 * step)
                .step_by(step as usize / 2 + 1)
                .chain([i64::MAX - 1])
            {
                let (mut b, mut h) = (t.root, t.height);
                while h > 0 {
                    let br = &t.branches[b as usize];
                    assert_ne!(br.inv, NO_GUESS, "branch at height {h}");
                    let i = br.find_le(q);
                    assert_eq!(br.guess(q), i, "branch guess for {q}, step {step}");
                    b = br.child[i];
                    h -= 1;
                }
                let l = &t.leaves[b as usize];
                assert_ne!(l.inv, LEAF_NO_GUESS, "leaf");
                assert_eq!(l.guess(q) + 1, l.count_le(q), "leaf guess for {q}, step {step}");
            }
        }
        // A leaf of one-byte write locks at `starts`, inserted in order.
        let leaf = |starts: &[i64]| {
            let mut l = EMPTY_LEAF;
            for (k, &s) in starts.iter().enumerate() {
                let id = k as NodeId;
                l.insert(
                    k,
                    Item::Leaf {
                        start: s,
                        end: s,
                        id,
                        write: true,
                        tag: tag(id),
                    },
                );
            }
            l
        };
        let mut l = leaf(&[0, 2, 4, 7]);
        assert_eq!(l.inv, LEAF_NO_GUESS, "irregular starts");
        l.remove(3);
        assert_ne!(l.inv, LEAF_NO_GUESS, "0, 2, 4");
        assert_eq!((l.guess(0), l.guess(1), l.guess(2), l.guess(5)), (0, 0, 1, 2));
        let mut br = EMPTY_BRANCH;
        for (i, sep) in [(i64::MIN, 0), (100, 0)].into_iter().enumerate() {
            let (max_end, max_wend, child) = (0, 0, i as BId);
            br.insert(
                i,
                Item::Branch {
                    sep,
                    max_end,
                    max_wend,
                    child,
                },
            );
        }
        let g: Vec<usize> = [0, 99, 100, 101, i64::MAX].iter().map(|&x| br.guess(x)).collect();
        assert_eq!(g, [0, 0, 1, 1, 1], "one separator");
        let l = leaf(&[0, 1 << 14, 2 << 14]);
        assert_eq!(l.inv, LEAF_NO_GUESS, "2^14 apart: too far for 32 bits");
    }

    /// The same tree with every slope cleared: every step counts.
    fn counted(t: &StartTree) -> StartTree {
        let mut c = StartTree {
            leaves: t.leaves.clone(),
            branches: t.branches.clone(),
            root: t.root,
            height: t.height,
            ..StartTree::default()
        };
        c.leaves.iter_mut().for_each(|l| l.inv = LEAF_NO_GUESS);
        c.branches.iter_mut().for_each(|b| b.inv = NO_GUESS);
        c
    }

    /// What a scan reports, candidates included: dispatched (AVX2 where the CPU has
    /// it), portable, and counted (`c`, every slope cleared) give the same entries in
    /// the same order.
    fn reported(t: &StartTree, c: &StartTree, qs: i64, qe: i64, wo: bool) -> Vec<NodeId> {
        let ways = [t, c].map(|t| scan_raw(t, qs, qe, wo));
        assert_eq!(
            ways[0], ways[1],
            "guessed vs counted scan [{qs}, {qe}] writes {wo}"
        );
        let [got, _] = ways;
        got
    }

    /// Down the path of bound `x` (the counted one), every node with a slope guesses
    /// `x`'s place exactly once `x` is at or above where it counts from (a branch's
    /// base, a leaf's first start): the slope's error bound holds for every step the
    /// node takes.
    fn guesses_exact(t: &StartTree, x: i64) {
        if t.root == NONE {
            return;
        }
        let (mut b, mut h) = (t.root, t.height);
        while h > 0 {
            let br = &t.branches[b as usize];
            let i = br.find_le(x);
            if br.inv != NO_GUESS && x >= br.base {
                assert_eq!(br.guess(x), i, "branch guess for {x}: {br:?}");
            }
            b = br.child[i];
            h -= 1;
        }
        let l = &t.leaves[b as usize];
        if l.inv != LEAF_NO_GUESS && x >= l.start[0] {
            assert_eq!(l.guess(x) + 1, l.count_le(x), "leaf guess for {x}: {l:?}");
        }
    }

    /// The model's entries as (start, id) -> (end, write).
    type Model = BTreeMap<(i64, NodeId), (i64, bool)>;

    /// Checks `t` against `model` and scans it at `probes` (each with qs ≤ qe), read and
    /// write, guessed against counted, against the model.
    fn check_scans(t: &StartTree, model: &Model, probes: &[(i64, i64)]) {
        let all = t.check();
        let want: Vec<_> = model
            .iter()
            .map(|(&(s, id), &(e, wr))| (s, e, id, wr, tag(id)))
            .collect();
        assert_eq!(all, want);
        for &(_, qe) in probes {
            guesses_exact(t, qe);
        }
        let c = counted(t);
        let ends: BTreeMap<NodeId, i64> = model.iter().map(|(&(_, id), &(e, _))| (id, e)).collect();
        for &(qs, qe) in probes {
            for wo in [false, true] {
                let mut got = reported(t, &c, qs, qe, wo);
                got.retain(|id| ends[id] >= qs);
                let want: Vec<NodeId> = model
                    .iter()
                    .filter(|(&(s, _), &(e, wr))| s <= qe && e >= qs && (!wo || wr))
                    .map(|(&(_, id), _)| id)
                    .collect();
                assert_eq!(got, want, "scan [{qs}, {qe}] writes {wo}");
            }
        }
    }

    /// Probes around some of the evenly spaced keys `base + i·step`, `i < n` (the first
    /// and last 24, and 16 between), and `extra`: on a key, one byte either side, the
    /// last byte before the next, a whole step, several steps, to the end of the file,
    /// and the greatest offset.
    fn probes_around(base: i64, step: i64, n: i64, extra: &[i64]) -> Vec<(i64, i64)> {
        let mut keys: Vec<i64> = (0..n)
            .filter(|&i| i < 24 || i >= n - 24 || i % (n / 16 + 1) == 0)
            .map(|i| base + i * step)
            .collect();
        keys.extend_from_slice(extra);
        let mut p = vec![
            (0, 0),
            (0, i64::MAX),
            (i64::MAX, i64::MAX),
            (i64::MAX - 1, i64::MAX - 1),
        ];
        for k in keys {
            for (a, b) in [
                (0, 0),
                (-1, -1),
                (1, 1),
                (0, step - 1),
                (1, step - 1),
                (step - 1, step - 1),
                (-1, step),
                (0, step),
                (0, step.saturating_mul(3)),
                (1, step.saturating_mul(2).saturating_add(1)),
            ] {
                let qs = k.saturating_add(a).max(0);
                let qe = k.saturating_add(b).max(qs);
                p.push((qs, qe));
            }
            p.push((k, i64::MAX));
        }
        p
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 32,
            failure_persistence: None,
            ..Default::default()
        })]

        /// Evenly spaced keys of every spacing the guess takes and just past it (2^14 in
        /// a leaf; 2^24 in a branch, whose separators are 13 leaf entries apart in an
        /// ascending run), from 0 or ending at the greatest offset, inserted in any
        /// order; then changes of one lock (removals, a key one byte off, a key twice):
        /// the tree checks out (the slopes recomputed), and every scan gives the model's
        /// entries, guessed or counted, portable or AVX2.
        #[test]
        fn evenly_spaced_keys_scan_as_counted(
            step in proptest::prop_oneof![
                2i64..40,
                proptest::sample::select(vec![
                    (1i64 << 14) - 1, 1 << 14, (1 << 14) + 1,
                    (1 << 15) - 1, 1_290_555, 1_290_556, (1 << 24) / 31, (1 << 24) / 31 + 1,
                    (1 << 24) - 1, 1 << 24, 1 << 30, 1 << 40, 1 << 61, 1 << 62,
                ]),
                2i64..(1 << 25),
            ],
            n in proptest::prop_oneof![3 => 1i64..40, 1 => 400i64..460],
            at_end in proptest::bool::ANY,
            slack in 0i64..3,
            order in 0u8..3,
            lens in proptest::collection::vec(proptest::sample::select(vec![1i64, 1, 1, 2, 0, -1, -2, i64::MAX]), 1..8),
            changes in proptest::collection::vec((0u8..5, proptest::num::u64::ANY), 0..6),
        ) {
            let n = n.min((i64::MAX - slack) / step + 1);
            // The last key at the greatest offset (less `slack`), or the first at `slack`.
            let base = if at_end { i64::MAX - slack - (n - 1) * step } else { slack };
            let mut t = StartTree::default();
            let mut model = Model::new();
            let w = &mut Work::default();
            let mut idx: Vec<i64> = (0..n).collect();
            match order {
                0 => {}
                1 => idx.reverse(),
                _ => {
                    let mut x = 0x9E3779B97F4A7C15u64 ^ n as u64;
                    for i in (1..idx.len()).rev() {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        idx.swap(i, (x % (i as u64 + 1)) as usize);
                    }
                }
            }
            let mut next_id: NodeId = 0;
            let mut add = |t: &mut StartTree, model: &mut Model, start: i64, len: i64| {
                // len 0: one byte short of the next key; -1/-2: reaching it, or past it
                // (spilling); MAX: to the end of the file.
                let end = match len {
                    0 => start.saturating_add(step - 1),
                    -1 => start.saturating_add(step),
                    -2 => start.saturating_add(step.saturating_mul(2).saturating_add(1)),
                    l => start.saturating_add(l - 1),
                };
                let write = next_id % 3 != 1;
                t.insert(start, end, next_id, write, tag(next_id), w);
                model.insert((start, next_id), (end, write));
                next_id += 1;
            };
            for (j, &i) in idx.iter().enumerate() {
                add(&mut t, &mut model, base + i * step, lens[j % lens.len()]);
            }
            let probe = probes_around(base, step, n, &[]);
            check_scans(&t, &model, &probe);
            let mut extra = Vec::new();
            for (what, r) in changes {
                let keys: Vec<(i64, NodeId)> = model.keys().copied().collect();
                let (s, id) = keys[(r % keys.len() as u64) as usize];
                match what {
                    0 | 1 => {
                        t.remove(s, id, &mut Work::default());
                        model.remove(&(s, id));
                    }
                    2 => add(&mut t, &mut model, s.saturating_add(1), 1),
                    3 => add(&mut t, &mut model, s, 1),
                    _ => add(&mut t, &mut model, (s - 1).max(0), 2),
                }
                extra.push(s);
                if model.is_empty() {
                    break;
                }
            }
            check_scans(&t, &model, &probes_around(base, step, n, &extra));
        }

        /// The guess's check alone decides: with every node's slope and base replaced by
        /// arbitrary values (wrong, off by one, huge, zero), every scan still reports
        /// exactly what the counted descent does.
        #[test]
        fn any_slope_is_caught_by_the_check(
            step in proptest::prop_oneof![2i64..9, proptest::strategy::Just(1i64 << 14), proptest::strategy::Just(1i64 << 40)],
            n in proptest::prop_oneof![2i64..30, 390i64..440],
            at_end in proptest::bool::ANY,
            forge in proptest::collection::vec((0u8..6, proptest::num::u64::ANY), 1..64),
            qs in proptest::collection::vec((0i64..500, 0i64..40), 1..20),
        ) {
            let n = n.min(i64::MAX / step);
            let base = if at_end { i64::MAX - (n - 1) * step } else { 0 };
            let mut t = StartTree::default();
            let w = &mut Work::default();
            for i in 0..n {
                let s = base + i * step;
                let end = if i % 7 == 3 { s.saturating_add(step) } else { s };
                t.insert(s, end, i as NodeId, i % 2 == 0, tag(i as NodeId), w);
            }
            let c = counted(&t);
            let mut f = counted(&t);
            let mut it = forge.iter().cycle();
            let mut value = |good: u64| {
                let &(how, r) = it.next().unwrap();
                match how {
                    0 => good,
                    1 => good.wrapping_add(1 + r % 3),
                    2 => good.wrapping_sub(1 + r % 3),
                    3 => r,
                    4 => 0,
                    _ => u64::MAX - 1 - r % 3,
                }
            };
            for (l, g) in f.leaves.iter_mut().zip(&t.leaves) {
                l.inv = value(g.inv as u64) as u32;
            }
            for (b, g) in f.branches.iter_mut().zip(&t.branches) {
                b.inv = value(g.inv);
                b.base = value(g.base as u64) as i64;
            }
            for &(k, d) in &qs {
                let k = (k * n / 500).min(n - 1);
                let s = base + k * step;
                for (a, b) in [(0, d), (d, d), (-d, 0), (1, step - 1), (0, i64::MAX)] {
                    let lo = s.saturating_add(a).max(0);
                    let hi = s.saturating_add(b).max(lo);
                    for wo in [false, true] {
                        let want = reported(&t, &c, lo, hi, wo);
                        let got = reported(&f, &c, lo, hi, wo);
                        proptest::prop_assert_eq!(got, want, "forged scan [{}, {}] writes {}", lo, hi, wo);
                    }
                }
            }
        }
    }
}
