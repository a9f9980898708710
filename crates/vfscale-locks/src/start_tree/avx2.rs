//! A node's count with AVX2: four slots per signed compare (any bound, and the root's
//! `i64::MIN` separator, compare as they are), four compares' results packed into one
//! byte mask (two pack steps and a `movemask`) and counted (`popcnt`). A shorter chain
//! than the portable sum's reduction across the vector (a descent is a chain of such
//! counts, each waiting for the one before), and fewer instructions. The same counts as
//! [`Leaf::count_le`] and [`Branch::find_le`].

use std::arch::x86_64::*;

use super::{Branch, Leaf, BRANCH_CAP, LEAF_CAP};

const _: () = assert!(LEAF_CAP == 15 && BRANCH_CAP == 31);

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
    let n = LEAF_CAP - unsafe { above_in(&l.start, x, false) };
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
    let i = BRANCH_CAP - 1 - above;
    if x == i64::MAX {
        return clamp_to(i, br.len as usize - 1);
    }
    i
}
