//! Overlap scans: the descent that finds the locks overlapping a range, with the
//! node counts done by AVX2 where the CPU has it (`avx2.rs`).

use super::*;

impl StartTree {
    /// Calls `f` with every entry overlapping `[qs, qe]` (write locks only if
    /// `writes_only`), in (start, id) order — and perhaps with one entry that starts at
    /// or before `qs` and ends before it (the one candidate of a leaf's usual way, whose
    /// end the scan does not test): `f` tests the overlap ([`Found::end`]).
    pub fn scan<'a>(
        &'a self,
        qs: i64,
        qe: i64,
        writes_only: bool,
        cost: &mut SearchCost,
        f: &mut dyn FnMut(Found<'a>),
    ) {
        if self.root != NO_NODE {
            let q = Query { qs, qe, writes_only };
            self.scan_in(self.root, self.height, q, cost, f);
        }
    }

    /// Scans below node `b` (height `h`): [`StartTree::scan_body`], with the AVX2
    /// counts of [`avx2`] where the CPU has AVX2 and POPCNT (detected once).
    #[inline]
    fn scan_in<'a>(
        &'a self,
        b: TreeNodeId,
        h: u32,
        q: Query,
        cost: &mut SearchCost,
        f: &mut dyn FnMut(Found<'a>),
    ) {
        if avx2::detected() {
            // SAFETY: the CPU has AVX2 and POPCNT, as detected.
            return unsafe { self.scan_avx2(b, h, q, cost, f) };
        }
        // SAFETY: the portable counts need nothing of the CPU.
        unsafe { self.scan_base(b, h, q, cost, f) }
    }

    /// [`StartTree::scan_body`] with the portable counts; out of line, so that
    /// [`StartTree::scan_in`] stays a test and a jump.
    ///
    /// # Safety
    ///
    /// None needed (`unsafe` only to share [`StartTree::scan_body`]'s signature).
    #[inline(never)]
    pub(super) unsafe fn scan_base<'a>(
        &'a self,
        b: TreeNodeId,
        h: u32,
        q: Query,
        cost: &mut SearchCost,
        f: &mut dyn FnMut(Found<'a>),
    ) {
        // SAFETY: without AVX2 the body uses only portable code.
        unsafe { self.scan_body::<false>(b, h, q, cost, f) }
    }

    /// [`StartTree::scan_body`] with AVX2 counts.
    ///
    /// # Safety
    ///
    /// The CPU must have AVX2 and POPCNT.
    #[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,popcnt"))]
    unsafe fn scan_avx2<'a>(
        &'a self,
        b: TreeNodeId,
        h: u32,
        q: Query,
        cost: &mut SearchCost,
        f: &mut dyn FnMut(Found<'a>),
    ) {
        // SAFETY: the caller's: the CPU has AVX2 and POPCNT.
        unsafe { self.scan_body::<true>(b, h, q, cost, f) }
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
        b: TreeNodeId,
        h: u32,
        q: Query,
        cost: &mut SearchCost,
        f: &mut dyn FnMut(Found<'a>),
    ) {
        let Query { qs, qe, writes_only } = q;
        let (mut b, mut h) = (b, h);
        while h > 0 {
            cost.nodes += 1;
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
                self.scan_in(br.child[i], h - 1, q, cost, f);
            }
            if m == 0 {
                return;
            }
            b = br.child[m.trailing_zeros() as usize];
            h -= 1;
        }
        cost.nodes += 1;
        let l = &self.leaves[b as usize];
        l.prefetch_ents();
        if l.inv != LEAF_NO_GUESS {
            let k = l.guess(qe);
            if (qe < l.start_after(k)) & l.sole_from(k, qs) {
                return l.report(k, writes_only, cost, f);
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
            return l.report(k, writes_only, cost, f);
        }
        let mut m = l.overlaps(qs, qe, writes_only);
        while m != 0 {
            let k = m.trailing_zeros() as usize;
            m &= m - 1;
            cost.checks += 1;
            f(Found { leaf: l, k });
        }
    }
}
