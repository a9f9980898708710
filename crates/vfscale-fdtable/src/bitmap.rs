//! Word bitmaps, as `include/linux/bitmap.h` uses them for `open_fds`, `close_on_exec`
//! and `full_fds_bits`. Plain words: every bitmap lives under the table lock.

/// Bits per bitmap word (`BITS_PER_LONG`).
pub(crate) const BITS: usize = 64;

/// Words needed for `bits` bits.
pub(crate) fn words_for(bits: usize) -> usize {
    bits.div_ceil(BITS)
}

/// Whether bit `i` is set.
pub(crate) fn test(b: &[u64], i: usize) -> bool {
    b.get(i / BITS).is_some_and(|w| w & (1u64 << (i % BITS)) != 0)
}

/// Sets bit `i`.
pub(crate) fn set(b: &mut [u64], i: usize) {
    b[i / BITS] |= 1u64 << (i % BITS);
}

/// Clears bit `i`.
pub(crate) fn clear(b: &mut [u64], i: usize) {
    b[i / BITS] &= !(1u64 << (i % BITS));
}

/// The first clear bit at or after `start` and below `size`, or `size` (`find_next_zero_bit`).
pub(crate) fn find_next_zero_bit(b: &[u64], size: usize, start: usize) -> usize {
    find_next(b, size, start, true)
}

/// The first set bit at or after `start` and below `size`, or `size` (`find_next_bit`).
pub(crate) fn find_next_bit(b: &[u64], size: usize, start: usize) -> usize {
    find_next(b, size, start, false)
}

fn find_next(b: &[u64], size: usize, start: usize, zero: bool) -> usize {
    let mut i = start;
    while i < size {
        let w = b.get(i / BITS).copied().unwrap_or(0);
        let w = if zero { !w } else { w };
        let masked = w & (!0u64 << (i % BITS));
        if masked != 0 {
            let bit = (i / BITS) * BITS + masked.trailing_zeros() as usize;
            return bit.min(size);
        }
        i = (i / BITS + 1) * BITS;
    }
    size
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_bits() {
        let mut b = vec![0u64; 3];
        assert_eq!(find_next_bit(&b, 150, 0), 150);
        assert_eq!(find_next_zero_bit(&b, 150, 7), 7);
        set(&mut b, 70);
        set(&mut b, 129);
        assert_eq!(find_next_bit(&b, 150, 0), 70);
        assert_eq!(find_next_bit(&b, 150, 71), 129);
        assert_eq!(find_next_bit(&b, 129, 71), 129);
        b[0] = !0;
        assert_eq!(find_next_zero_bit(&b, 150, 0), 64);
        assert!(test(&b, 63) && test(&b, 70) && !test(&b, 71) && !test(&b, 999));
        clear(&mut b, 70);
        assert!(!test(&b, 70));
    }
}
