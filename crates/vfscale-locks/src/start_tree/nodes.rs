//! The two kinds of node, leaf and branch: their entries, the counts and guesses a
//! step down them takes, and their edits.

use super::*;

impl Leaf {
    pub(super) fn key(&self, k: usize) -> Key {
        (self.start[k], self.id[k])
    }
    pub(super) fn summary(&self) -> (i64, i64) {
        let (mut e, mut we) = (i64::MIN, i64::MIN);
        for k in 0..self.len as usize {
            e = e.max(self.entry[k].end);
            if self.wmask & (1 << k) != 0 {
                we = we.max(self.entry[k].end);
            }
        }
        (e, we)
    }
    pub(super) fn item(&self, k: usize) -> Item {
        Item::Leaf {
            start: self.start[k],
            end: self.entry[k].end,
            id: self.id[k],
            write: self.wmask & (1 << k) != 0,
            tag: self.entry[k].tag,
        }
    }
    pub(super) fn set(&mut self, k: usize, it: Item) {
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
        self.entry[k] = LeafEntry { end, tag };
        self.id[k] = id;
        self.wmask = (self.wmask & !(1 << k)) | ((write as u32) << k);
    }
    /// Inserts `it` at `pos`, shifting the entries after it (the leaf is not full).
    pub(super) fn insert(&mut self, pos: usize, it: Item) {
        let len = self.len as usize;
        debug_assert!(len < LEAF_CAP);
        self.start.copy_within(pos..len, pos + 1);
        self.entry.copy_within(pos..len, pos + 1);
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
    pub(super) fn refresh(&mut self, k: usize) {
        let on = k + 1 < self.len as usize && self.entry[k].end >= self.start[k + 1];
        self.spill = (self.spill & !(1 << k)) | ((on as u32) << k);
    }
    /// Recomputes `spill` and the guess's slope (after a bulk change).
    pub(super) fn fix_spill(&mut self) {
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
    pub(super) fn guess(&self, x: i64) -> usize {
        let d = x.wrapping_sub(self.start[0]) as u64;
        (((d as u128 * self.inv as u128) >> 32) as usize).min((self.len as usize).saturating_sub(1))
    }
    /// Whether entry `k`, the last one starting at or before a range `[qs, …]` ends, is
    /// the only candidate: it starts at or before `qs` and no entry before it spills
    /// over its own next start. Bitwise, not short-circuit: one predictable branch.
    #[inline(always)]
    pub(super) fn sole_from(&self, k: usize, qs: i64) -> bool {
        (self.start[k] <= qs) & (self.spill & ((1u32 << k) - 1) == 0)
    }
    /// Reports entry `k`, the only candidate, unless the scan wants write locks and it is
    /// not one. Not testing the entry's end: `f` does, with its tag.
    #[inline(always)]
    pub(super) fn report<'a>(
        &'a self,
        k: usize,
        writes_only: bool,
        cost: &mut SearchCost,
        f: &mut dyn FnMut(Found<'a>),
    ) {
        if !writes_only || self.wmask & (1 << k) != 0 {
            cost.checks += 1;
            f(Found { leaf: self, k });
        }
    }
    /// Starts fetching the entries' ends and tags (the lines of [`Leaf::entry`] before
    /// the one with `len`, which the guess reads anyway): the entry a scan reports is
    /// known only once the starts are read, and its line is then on its way, not a
    /// second miss after the leaf's.
    #[inline(always)]
    pub(super) fn prefetch_ents(&self) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let p = self.entry.as_ptr().cast::<i8>();
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
    pub(super) fn start_after(&self, k: usize) -> i64 {
        if k + 1 < LEAF_CAP {
            self.start[k + 1]
        } else {
            i64::MAX
        }
    }
    /// Entries with a key below `key`: where `key` goes (insert) or is (remove). A
    /// linear search: a count over every slot measured no faster here, where the
    /// conflict scan of the same call has just read the same starts.
    #[inline]
    pub(super) fn rank(&self, key: Key) -> usize {
        let n = self.len as usize;
        (0..n).find(|&k| self.key(k) >= key).unwrap_or(n)
    }
    /// Entries starting at or before `x`: a count over every slot, no data-dependent
    /// exit.
    #[inline(always)]
    pub(super) fn count_le(&self, x: i64) -> usize {
        debug_assert!(x >= 0, "offset {x}");
        let x1 = x.wrapping_add(1);
        let mut n = 0;
        for k in 0..LEAF_CAP {
            n += at_most(self.start[k], x1);
        }
        n.min(self.len as usize)
    }
    /// Bit `k`: entry `k` overlaps `[qs, qe]` (and is a write lock, if `writes_only`);
    /// one pass over every slot, no data-dependent branch. Out of line: the rare way.
    #[cold]
    #[inline(never)]
    pub(super) fn overlaps(&self, qs: i64, qe: i64, writes_only: bool) -> u32 {
        let mut m = 0u32;
        for k in 0..LEAF_CAP {
            m |= (((self.start[k] <= qe) & (self.entry[k].end >= qs)) as u32) << k;
        }
        let kind = if writes_only { self.wmask } else { u32::MAX };
        m & kind & ((1u32 << self.len) - 1)
    }
    /// Keeps the first `n` entries; the rest become padding.
    pub(super) fn truncate(&mut self, n: usize) {
        self.start[n..].fill(PAD_START);
        self.entry[n..].fill(PAD_ENTRY);
        self.len = n as u32;
        self.wmask &= (1u32 << n) - 1;
        self.fix_spill();
    }
    pub(super) fn remove(&mut self, pos: usize) {
        let len = self.len as usize;
        self.start.copy_within(pos + 1..len, pos);
        self.entry.copy_within(pos + 1..len, pos);
        self.id.copy_within(pos + 1..len, pos);
        let low = self.wmask & ((1u32 << pos) - 1);
        self.wmask = low | ((self.wmask >> 1) & !((1u32 << pos) - 1));
        let low = self.spill & ((1u32 << pos) - 1);
        self.spill = low | ((self.spill >> 1) & !((1u32 << pos) - 1));
        self.start[len - 1] = PAD_START;
        self.entry[len - 1] = PAD_ENTRY;
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
    pub(super) fn key(&self, i: usize) -> Key {
        (self.sep[i], self.sep_id[i])
    }
    pub(super) fn summary(&self) -> (i64, i64) {
        let n = self.len as usize;
        let e = self.max_end[..n].iter().copied().max().unwrap_or(i64::MIN);
        let we = self.max_wend[..n].iter().copied().max().unwrap_or(i64::MIN);
        (e, we)
    }
    /// The child whose key range holds `key`: counts the separators `sep[1..]` at
    /// or below `key`'s start over every slot (unused ones hold `i64::MAX`), with no
    /// data-dependent exit; only an equal start (rare) needs the ids.
    #[inline]
    pub(super) fn find(&self, key: Key) -> usize {
        let mut i = self.find_le(key.0);
        while i > 0 && self.key(i) > key {
            i -= 1;
        }
        i
    }
    /// The last child whose separator is at most `x` (child 0's bounds nothing): a
    /// count over every slot, no data-dependent exit.
    #[inline(always)]
    pub(super) fn find_le(&self, x: i64) -> usize {
        debug_assert!(x >= 0, "offset {x}");
        let x1 = x.wrapping_add(1);
        let mut i = 0;
        for j in 1..BRANCH_CAP {
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
    pub(super) fn overlaps(&self, qs: i64, qe: i64, writes_only: bool) -> u32 {
        let reach = if writes_only {
            &self.max_wend
        } else {
            &self.max_end
        };
        let mut m = (reach[0] >= qs) as u32;
        for j in 1..BRANCH_CAP {
            m |= (((self.sep[j] <= qe) & (reach[j] >= qs)) as u32) << j;
        }
        m & ((1u32 << self.len) - 1)
    }
    pub(super) fn item(&self, i: usize) -> Item {
        Item::Branch {
            sep: self.key(i),
            max_end: self.max_end[i],
            max_wend: self.max_wend[i],
            child: self.child[i],
        }
    }
    pub(super) fn set(&mut self, i: usize, it: Item) {
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
    pub(super) fn insert(&mut self, pos: usize, it: Item) {
        let len = self.len as usize;
        debug_assert!(len < BRANCH_CAP);
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
    pub(super) fn refresh(&mut self, i: usize) {
        let on = i + 1 < self.len as usize && self.max_end[i] >= self.sep[i + 1];
        self.spill = (self.spill & !(1 << i)) | ((on as u32) << i);
    }
    /// Recomputes `spill` and the guess's slope (after a change to the children or
    /// their separators).
    pub(super) fn fix_spill(&mut self) {
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
    pub(super) fn guess(&self, x: i64) -> usize {
        let d = x.wrapping_sub(self.base) as u64;
        (((d as u128 * self.inv as u128) >> 64) as usize).min(self.len as usize - 1)
    }
    /// Whether child `i`, the last one whose separator is at or before a range's end, is
    /// the only candidate: the range starts at or after its separator (child 0 bounds
    /// nothing) and no child before it spills over its own next separator. Bitwise, not
    /// short-circuit: `i == 0` is a data-dependent branch (taken at random, one step in
    /// 13), the whole test a predictable one.
    #[inline(always)]
    pub(super) fn sole_from(&self, i: usize, qs: i64) -> bool {
        ((i == 0) | (self.sep[i] <= qs)) & (self.spill & ((1u32 << i) - 1) == 0)
    }
    /// The separator after child `i` (`i64::MAX` past the last slot): a guess `i` for
    /// `qe` is right when `qe` is below it.
    #[inline(always)]
    pub(super) fn sep_after(&self, i: usize) -> i64 {
        if i + 1 < BRANCH_CAP {
            self.sep[i + 1]
        } else {
            i64::MAX
        }
    }
    pub(super) fn remove(&mut self, pos: usize) {
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
    pub(super) fn truncate(&mut self, n: usize) {
        self.sep[n..].fill(i64::MAX);
        self.max_end[n..].fill(i64::MIN);
        self.max_wend[n..].fill(i64::MIN);
        self.len = n as u32;
        self.fix_spill();
    }
}
